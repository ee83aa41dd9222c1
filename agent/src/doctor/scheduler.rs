//! The extenders of kube-scheduler's configuration file (`KubeSchedulerConfiguration`, the file
//! its `--config` names), called from where the doctor runs as kube-scheduler calls them: the
//! `urlPrefix`'s host resolved by this machine's resolver, TLS verified by `tlsConfig`'s
//! `caFile`/`caData` and `serverName` (else the host), its client certificate
//! (`certFile`/`keyFile` or `certData`/`keyData`) presented, and a `filterVerb` call of a pod
//! without hugepages, which the webhook answers without asking an agent. The `urlPrefix`'s scheme
//! decides whether TLS is used; `enableHTTPS` without a CA turns verification off
//! (`pkg/scheduler/extender.go`, `makeTransport`), so the doctor refuses both. Field names are the Go
//! types' (`k8s.io/kube-scheduler/config/v1` `Extender`, `ExtenderTLSConfig`); the `…Data` fields
//! are `[]byte`, base64 in the file.

use std::{path::Path, sync::Arc, time::Duration};

use base64::Engine;
use hyper::Uri;
use rustls_pki_types::ServerName;
use serde::Deserialize;

use super::{
    finding::{Check, Finding},
    probe::{self, ProbeError},
};
use crate::{flags::parse_duration, tls::read_file, webhook::http1::Post};

/// kube-scheduler's `httpTimeout` when the file gives none.
const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest configuration file read.
const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("--scheduler-config {path}: {detail}")]
    File { path: String, detail: String },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Configuration {
    kind: Option<String>,
    #[serde(default)]
    extenders: Vec<Extender>,
}

/// One extender as the file has it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Extender {
    pub url_prefix: String,
    pub filter_verb: Option<String>,
    #[serde(rename = "enableHTTPS", default)]
    pub enable_https: bool,
    /// A Go duration (`5s`); kube-scheduler's default is 5 s.
    pub http_timeout: Option<String>,
    pub tls_config: Option<TlsConfig>,
    #[serde(default)]
    pub ignorable: bool,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    #[serde(default)]
    pub insecure: bool,
    pub server_name: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub ca_file: Option<String>,
    pub cert_data: Option<String>,
    pub key_data: Option<String>,
    pub ca_data: Option<String>,
}

/// The extenders of the configuration file at `path`.
pub fn read(path: &Path) -> Result<Vec<Extender>, SchedulerError> {
    let failed = |detail: String| SchedulerError::File {
        path: path.display().to_string(),
        detail,
    };
    let text = read_bounded(path).map_err(failed)?;
    parse(&text).map_err(failed)
}

/// The extenders of a configuration's text; a file of another kind is refused.
pub fn parse(text: &str) -> Result<Vec<Extender>, String> {
    let config: Configuration = serde_norway::from_str(text)
        .map_err(|e| format!("not a KubeSchedulerConfiguration: {e}"))?;
    match config.kind.as_deref() {
        Some("KubeSchedulerConfiguration") => Ok(config.extenders),
        other => Err(format!(
            "kind is {other:?}, not \"KubeSchedulerConfiguration\""
        )),
    }
}

/// A file's text, at most [`MAX_FILE`] bytes.
fn read_bounded(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!("over {MAX_FILE} bytes"));
    }
    Ok(text)
}

/// Where an extender is called and how it is verified, as kube-scheduler would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub host: String,
    pub port: u16,
    /// The name the certificate must carry.
    pub name: String,
    /// The path of the filter call.
    pub filter: String,
}

/// The plan of `extender`, or what in it kube-scheduler could not use with the webhook.
pub fn plan(extender: &Extender) -> Result<Plan, String> {
    let uri: Uri = extender
        .url_prefix
        .parse()
        .map_err(|e| format!("urlPrefix is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") => {
            return Err(
                "kube-scheduler would call it over plain HTTP (the urlPrefix's scheme decides; enableHTTPS only sets the TLS client up); the webhook serves HTTPS only"
                    .into(),
            );
        }
        other => return Err(format!("urlPrefix's scheme is {other:?}, not https")),
    }
    let host = uri
        .host()
        .ok_or("urlPrefix has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let tls = extender.tls_config.clone().unwrap_or_default();
    let name = tls
        .server_name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| host.clone());
    let verb = extender
        .filter_verb
        .as_deref()
        .ok_or("no filterVerb: kube-scheduler never asks the webhook which nodes fit")?;
    Ok(Plan {
        port: uri.port_u16().unwrap_or(443),
        filter: format!("{}/{verb}", uri.path().trim_end_matches('/')),
        host,
        name,
    })
}

/// The body of the filter call: a pod without hugepages and no node, which the webhook answers
/// at once.
const FILTER_ARGS: &str = r#"{"pod":{"metadata":{"name":"hugepage-agent-doctor","namespace":"default","uid":"00000000-0000-4000-8000-00000000d0c7"},"spec":{"containers":[{"name":"doctor"}]}},"nodenames":[]}"#;

/// Calls every extender of the file at `path`: one finding each.
pub async fn check(path: &Path, within: Duration) -> Vec<Finding> {
    let extenders = match read(path) {
        Ok(extenders) => extenders,
        Err(e) => return vec![Finding::wrong(Check::Extender, "-", e.to_string())],
    };
    if extenders.is_empty() {
        return vec![Finding::wrong(
            Check::Extender,
            "-",
            format!(
                "{} has no extenders: kube-scheduler never calls the webhook",
                path.display()
            ),
        )];
    }
    let mut findings = Vec::new();
    for extender in &extenders {
        let subject = extender.url_prefix.clone();
        let finding = match call(extender, within).await {
            Ok(detail) => Finding::ok(Check::Extender, subject, detail),
            Err(detail) if extender.ignorable => Finding::wrong(
                Check::Extender,
                subject,
                format!(
                    "{detail}; ignorable: true, so kube-scheduler goes on without it, silently"
                ),
            ),
            Err(detail) => Finding::wrong(
                Check::Extender,
                subject,
                format!("{detail}; ignorable: false, so no pod is scheduled while it fails"),
            ),
        };
        findings.push(finding);
    }
    findings
}

/// The call kube-scheduler makes, or what stops it.
async fn call(extender: &Extender, within: Duration) -> Result<String, String> {
    let plan = plan(extender)?;
    let tls = extender.tls_config.clone().unwrap_or_default();
    if tls.insecure {
        return Err("tlsConfig.insecure is true: kube-scheduler does not verify the webhook's certificate, and anything answering at that address is believed".into());
    }
    let ca = material(&tls.ca_data, &tls.ca_file, "caData", "tlsConfig.caFile")?.ok_or(
        if extender.enable_https {
            "no tlsConfig.caFile or caData: with enableHTTPS and no CA, kube-scheduler does not verify the webhook's certificate at all (pkg/scheduler/extender.go, makeTransport)"
        } else {
            "no tlsConfig.caFile or caData: kube-scheduler would verify the webhook by the host's CAs, which do not include the webhook's CA"
        },
    )?;
    let cert = material(
        &tls.cert_data,
        &tls.cert_file,
        "certData",
        "tlsConfig.certFile",
    )?;
    let key = material(&tls.key_data, &tls.key_file, "keyData", "tlsConfig.keyFile")?;
    let client = match (&cert, &key) {
        (Some(c), Some(k)) => Some((c.as_slice(), k.as_slice())),
        (None, None) => None,
        _ => {
            return Err(
                "tlsConfig has a client certificate without its key, or a key without its certificate: kube-scheduler does not start with it"
                    .into(),
            );
        }
    };
    // kube-scheduler gives up after httpTimeout: a slower answer is no answer to it.
    let within = match extender.http_timeout.as_deref() {
        Some(text) => parse_duration(text)
            .map_err(|e| format!("httpTimeout {text:?}: {e}"))?
            .min(within),
        None => DEFAULT_HTTP_TIMEOUT.min(within),
    };
    let config = probe::client_config("tlsConfig's CA", &ca, client).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(plan.name.clone())
        .map_err(|_| format!("{:?} is not a name to verify a certificate by", plan.name))?;
    let addr = probe::resolve(&plan.host, plan.port, within)
        .await
        .map_err(|e| match e {
            ProbeError::Resolve { .. } => format!(
                "{e}. kube-scheduler on kubeadm runs in the host's network with the host's resolver, which does not know Service names: give the Service a fixed ClusterIP and put that in urlPrefix, keeping tlsConfig.serverName (component webhook-fixed-clusterip)"
            ),
            other => other.to_string(),
        })?;
    let request = Post {
        method: "POST",
        target: &plan.filter,
        host: &plan.name,
        headers: &[],
        body: FILTER_ARGS.as_bytes(),
    };
    probe::call(Arc::new(config), addr, name, &request, within)
        .await
        .map_err(|e| match e {
            ProbeError::Handshake { .. } => format!(
                "{e} (is tlsConfig's CA the one of the webhook's serving certificate, and does that certificate name {:?}?)",
                plan.name
            ),
            other => other.to_string(),
        })?;
    Ok(format!(
        "{} resolves to {addr}; the certificate verifies as {:?}; POST {} answered 200",
        plan.host, plan.name, plan.filter
    ))
}

/// The bytes of a `…Data` field (base64) or of the file a `…File` field names; `None` when
/// neither is set.
fn material(
    data: &Option<String>,
    file: &Option<String>,
    data_field: &str,
    file_field: &'static str,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(data) = data.as_deref().filter(|d| !d.is_empty()) {
        return base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(Some)
            .map_err(|e| format!("tlsConfig.{data_field} is not base64: {e}"));
    }
    match file.as_deref().filter(|f| !f.is_empty()) {
        Some(path) => read_file(file_field, Path::new(path))
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str =
        include_str!("../../../deploy/components/webhook/scheduler-extender.yaml");

    #[test]
    fn the_shipped_file_plans_a_call_to_the_fixed_cluster_ip_verified_by_the_service_name() {
        let extenders = parse(SHIPPED).expect("the shipped file");
        assert_eq!(extenders.len(), 1);
        let plan = plan(&extenders[0]).expect("a plan");
        assert_eq!(
            plan,
            Plan {
                host: "10.96.0.250".into(),
                port: 443,
                name: "hugepage-agent-webhook.hugepage-agent.svc".into(),
                filter: "/scheduler/filter".into(),
            }
        );
        assert!(extenders[0].ignorable);
    }

    #[tokio::test]
    async fn tls_material_kube_scheduler_would_refuse_or_not_check_is_named() {
        let one = |tls: &str, https: bool| {
            let text = format!(
                "kind: KubeSchedulerConfiguration\nextenders:\n- urlPrefix: https://127.0.0.1:9\n  filterVerb: f\n  enableHTTPS: {https}\n  tlsConfig: {tls}\n"
            );
            parse(&text).expect("parses").remove(0)
        };
        let within = Duration::from_secs(1);
        let none = call(&one("{}", true), within).await.expect_err("no CA");
        assert!(
            none.contains("does not verify the webhook's certificate at all"),
            "{none}"
        );
        let system = call(&one("{}", false), within).await.expect_err("no CA");
        assert!(system.contains("by the host's CAs"), "{system}");
        let half = call(&one("{caData: Zm9v, certData: Zm9v}", true), within)
            .await
            .expect_err("a certificate without its key");
        assert!(half.contains("without its key"), "{half}");
        let garbled = call(&one("{caData: \"not base64!\"}", true), within)
            .await
            .expect_err("not base64");
        assert!(
            garbled.contains("tlsConfig.caData is not base64"),
            "{garbled}"
        );
    }

    #[test]
    fn what_kube_scheduler_could_not_use_is_named() {
        let one = |yaml: &str| {
            let text = format!("kind: KubeSchedulerConfiguration\nextenders:\n{yaml}");
            plan(&parse(&text).expect("parses")[0]).expect_err("refused")
        };
        assert!(
            one("- urlPrefix: http://10.0.0.1:443\n  filterVerb: f\n  enableHTTPS: true\n")
                .contains("plain HTTP")
        );
        assert!(one("- urlPrefix: https://10.0.0.1\n").contains("no filterVerb"));
        assert!(one("- urlPrefix: ftp://x\n  filterVerb: f\n").contains("scheme"));
        let v6 = parse(
            "kind: KubeSchedulerConfiguration\nextenders:\n- urlPrefix: https://[fd00::1]:8443/x/\n  filterVerb: filter\n",
        )
        .expect("parses");
        let plan = plan(&v6[0]).expect("a plan");
        assert_eq!((plan.host.as_str(), plan.port), ("fd00::1", 8443));
        assert_eq!(plan.filter, "/x/filter");
        assert!(parse("kind: KubeletConfiguration\n").is_err());
    }
}
