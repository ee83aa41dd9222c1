//! The webhooks of the ValidatingWebhookConfiguration, called as kube-apiserver calls them: a
//! webhook's Service read from the API and dialled at its ClusterIP and port (kube-apiserver's
//! default service resolution), its certificate verified by the webhook's `caBundle` and the
//! Service's DNS name `<name>.<namespace>.svc` (or a `url`'s host), then `GET /healthz`. An empty
//! `caBundle` (cert-manager's CA injector has not run), a CA that does not verify, a Service
//! without a ClusterIP or without the port, and an address that does not answer each get their
//! own finding.

use std::{sync::Arc, time::Duration};

use hyper::Uri;
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingWebhook, ValidatingWebhookConfiguration},
    core::v1::Service,
};
use kube::{Api, Client};
use rustls_pki_types::ServerName;

use super::{
    finding::{Check, Finding},
    probe::{self, ProbeError},
};
use crate::webhook::http1::Post;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhooksError {
    #[error("clientConfig has neither service nor url")]
    NoTarget,
    #[error("clientConfig.url {url:?}: {detail}")]
    Url { url: String, detail: String },
    #[error("service {namespace}/{name}: {detail}")]
    Service {
        namespace: String,
        name: String,
        detail: String,
    },
}

/// Where one webhook is called: the host to resolve (or the address), the port, the name its
/// certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub name: String,
}

/// Checks each webhook of the configuration `name`.
pub async fn check(client: &Client, name: &str, within: Duration) -> Vec<Finding> {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let read = tokio::time::timeout(within, configurations.get_opt(name)).await;
    let Ok(read) = read else {
        return vec![Finding::wrong(
            Check::Webhook,
            name,
            format!("reading the ValidatingWebhookConfiguration: no answer within {within:?}"),
        )];
    };
    let configuration = match read {
        Ok(Some(c)) => c,
        Ok(None) => {
            return vec![Finding::wrong(
                Check::Webhook,
                name,
                "no ValidatingWebhookConfiguration of this name: no binding is verified (install a manifest with the webhook, or give --webhook-configuration)",
            )];
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return vec![Finding::unchecked(
                Check::Webhook,
                name,
                format!(
                    "this account may not read the ValidatingWebhookConfiguration ({}): run the doctor with an administrator's kubeconfig for this check",
                    status.message
                ),
            )];
        }
        Err(e) => {
            return vec![Finding::wrong(
                Check::Webhook,
                name,
                format!("reading the ValidatingWebhookConfiguration: {e}"),
            )];
        }
    };
    let mut findings = Vec::new();
    for webhook in configuration.webhooks.iter().flatten() {
        let detail = one(client, webhook, within).await;
        // admissionregistration.k8s.io/v1 defaults failurePolicy to Fail.
        let fails_open = webhook.failure_policy.as_deref() == Some("Ignore");
        findings.push(match detail {
            Ok(detail) => Finding::ok(Check::Webhook, &webhook.name, detail),
            Err(detail) if fails_open => Finding::wrong(
                Check::Webhook,
                &webhook.name,
                format!("{detail}; failurePolicy Ignore, so kube-apiserver admits what it sends unverified"),
            ),
            Err(detail) => Finding::wrong(
                Check::Webhook,
                &webhook.name,
                format!("{detail}; failurePolicy Fail, so kube-apiserver refuses what it sends"),
            ),
        });
    }
    if findings.is_empty() {
        findings.push(Finding::wrong(
            Check::Webhook,
            name,
            "the ValidatingWebhookConfiguration has no webhooks",
        ));
    }
    findings
}

/// One webhook called, or what is wrong.
async fn one(
    client: &Client,
    webhook: &ValidatingWebhook,
    within: Duration,
) -> Result<String, String> {
    let ca = webhook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .filter(|b| !b.is_empty())
        .ok_or("clientConfig.caBundle is empty: kube-apiserver cannot verify the webhook (cert-manager's CA injector fills it from the annotation cert-manager.io/inject-ca-from; is cert-manager running?)")?;
    let config =
        probe::client_config("clientConfig.caBundle", &ca, None).map_err(|e| e.to_string())?;
    let target = target(client, webhook, within)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(target.name.clone())
        .map_err(|_| format!("{:?} is not a name to verify a certificate by", target.name))?;
    let addr = probe::resolve(&target.host, target.port, within)
        .await
        .map_err(|e| e.to_string())?;
    let request = Post {
        method: "GET",
        target: "/healthz",
        host: &target.name,
        headers: &[],
        body: &[],
    };
    let answered = match probe::call(Arc::new(config), addr, name, &request, within).await {
        // The handshake completed from our side, the certificate verified; then the webhook
        // ended it for want of a client certificate, which kube-apiserver presents.
        Err(ProbeError::Answer { detail, .. }) if detail.contains("CertificateRequired") => {
            return Ok(format!(
                "{addr} verifies by the caBundle as {:?}, and asks callers for a client certificate (component webhook-client-auth), which kube-apiserver presents from its AdmissionConfiguration",
                target.name
            ));
        }
        other => other,
    };
    answered.map_err(|e| match e {
            ProbeError::Handshake { .. } => format!(
                "{e}: the caBundle does not verify the certificate the webhook serves for {:?} (a caBundle of another CA, or a certificate without that name)",
                target.name
            ),
            ProbeError::Connect { .. } | ProbeError::Timeout { .. } => format!(
                "{e} (kube-apiserver dials the Service's ClusterIP; are the webhook's pods ready, and is the doctor run where the ClusterIP is routed, e.g. on a node?)"
            ),
            other => other.to_string(),
        })?;
    Ok(format!(
        "{addr} answers; the caBundle verifies its certificate as {:?}",
        target.name
    ))
}

/// Where kube-apiserver calls `webhook`.
async fn target(
    client: &Client,
    webhook: &ValidatingWebhook,
    within: Duration,
) -> Result<Target, WebhooksError> {
    let config = &webhook.client_config;
    if let Some(url) = &config.url {
        return of_url(url);
    }
    let reference = config.service.as_ref().ok_or(WebhooksError::NoTarget)?;
    let failed = |detail: String| WebhooksError::Service {
        namespace: reference.namespace.clone(),
        name: reference.name.clone(),
        detail,
    };
    let services: Api<Service> = Api::namespaced(client.clone(), &reference.namespace);
    let service = tokio::time::timeout(within, services.get_opt(&reference.name))
        .await
        .map_err(|_| failed(format!("reading it: no answer within {within:?}")))?
        .map_err(|e| failed(format!("reading it: {e}")))?
        .ok_or_else(|| failed("no such Service".into()))?;
    of_service(&service, reference.port.unwrap_or(443)).map_err(failed)
}

/// A `url` clientConfig's target.
pub fn of_url(url: &str) -> Result<Target, WebhooksError> {
    let failed = |detail: &str| WebhooksError::Url {
        url: url.to_owned(),
        detail: detail.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|_| failed("not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(failed("kube-apiserver calls webhooks over https only"));
    }
    let host = uri
        .host()
        .ok_or_else(|| failed("no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok(Target {
        port: uri.port_u16().unwrap_or(443),
        name: host.clone(),
        host,
    })
}

/// The target of a Service on `port`: its ClusterIP, the port, its DNS name.
pub fn of_service(service: &Service, port: i32) -> Result<Target, String> {
    let meta = &service.metadata;
    let (name, namespace) = (
        meta.name.clone().unwrap_or_default(),
        meta.namespace.clone().unwrap_or_default(),
    );
    let spec = service.spec.as_ref().ok_or("the Service has no spec")?;
    let name = format!("{name}.{namespace}.svc");
    let tcp = u16::try_from(port).map_err(|_| format!("port {port} is not a TCP port"))?;
    // kube-apiserver's service resolver dials an ExternalName Service at its name, and any
    // other at its ClusterIP, on the port clientConfig names.
    if spec.type_.as_deref() == Some("ExternalName") {
        let host = spec
            .external_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or("the ExternalName Service has no externalName")?;
        return Ok(Target {
            host,
            port: tcp,
            name,
        });
    }
    let ip = spec
        .cluster_ip
        .clone()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or("the Service is headless (clusterIP None): kube-apiserver cannot dial it")?;
    if !spec.ports.iter().flatten().any(|p| p.port == port) {
        return Err(format!(
            "the Service has no port {port}, the one clientConfig.service.port names"
        ));
    }
    Ok(Target {
        host: ip,
        port: tcp,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(cluster_ip: &str, ports: &[i32]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hugepage-agent-webhook", "namespace": "hugepage-agent"},
            "spec": {"clusterIP": cluster_ip, "ports": ports.iter().map(|p| serde_json::json!({"port": p})).collect::<Vec<_>>()},
        }))
        .expect("a Service")
    }

    #[test]
    fn a_service_is_dialled_at_its_cluster_ip_and_verified_by_its_dns_name() {
        assert_eq!(
            of_service(&service("10.96.0.250", &[443]), 443),
            Ok(Target {
                host: "10.96.0.250".into(),
                port: 443,
                name: "hugepage-agent-webhook.hugepage-agent.svc".into(),
            })
        );
        assert!(
            of_service(&service("None", &[443]), 443)
                .expect_err("headless")
                .contains("headless")
        );
        assert!(
            of_service(&service("10.96.0.250", &[8443]), 443)
                .expect_err("another port")
                .contains("no port 443")
        );
    }

    #[test]
    fn an_external_name_service_is_dialled_at_its_name() {
        let external: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hugepage-agent-webhook", "namespace": "hugepage-agent"},
            "spec": {"type": "ExternalName", "externalName": "webhook.example.internal"},
        }))
        .expect("a Service");
        assert_eq!(
            of_service(&external, 443),
            Ok(Target {
                host: "webhook.example.internal".into(),
                port: 443,
                name: "hugepage-agent-webhook.hugepage-agent.svc".into(),
            })
        );
    }

    #[test]
    fn a_url_is_dialled_at_its_host() {
        assert_eq!(
            of_url("https://[fd00::2]:8443/admission/validate"),
            Ok(Target {
                host: "fd00::2".into(),
                port: 8443,
                name: "fd00::2".into(),
            })
        );
        assert!(of_url("http://webhook.example/x").is_err());
    }
}
