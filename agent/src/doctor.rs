//! `hugepage-agent doctor`: the path from kube-scheduler and kube-apiserver to every node's agent
//! tested end to end, from where it runs, and what is wrong said plainly, so that a webhook that
//! fails open is seen on the first day rather than found in a pod that died. It reads the
//! cluster ([`crate::webhook::kubeapi`]: `--kubeconfig`, else in-cluster), calls each webhook of
//! the ValidatingWebhookConfiguration as kube-apiserver does ([`webhooks`]), each extender of
//! kube-scheduler's configuration file as kube-scheduler does ([`scheduler`]), and every node's
//! agent as the webhook does ([`agents`]), each call through [`probe`]. It changes nothing: the
//! calls are a health check, a filter of a pod without hugepages and dry runs. Its findings
//! ([`finding`]) print as lines or JSON; the exit code is 0 when nothing is wrong, 1 otherwise.

pub mod agents;
pub mod finding;
pub mod flags;
pub mod probe;
pub mod scheduler;
pub mod webhooks;

use finding::{Check, Finding};
use flags::Settings;

use crate::webhook::kubeapi;

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("the doctor's runtime cannot start: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Every check `settings` asks for, in order: the Kubernetes API, the webhooks, the extenders,
/// the agents.
pub fn run(settings: &Settings) -> Result<Vec<Finding>, DoctorError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DoctorError::Runtime)?;
    Ok(runtime.block_on(checks(settings)))
}

async fn checks(settings: &Settings) -> Vec<Finding> {
    let mut findings = Vec::new();
    let client = match kubeapi::client(settings.kubeconfig.as_deref()).await {
        Ok(client) => match tokio::time::timeout(settings.timeout, client.apiserver_version())
            .await
            .map_err(|_| format!("no answer within {:?}", settings.timeout))
            .and_then(|answer| answer.map_err(|e| e.to_string()))
        {
            Ok(version) => {
                findings.push(Finding::ok(
                    Check::KubernetesApi,
                    "version",
                    format!("the API server answers: {}", version.git_version),
                ));
                Some(client)
            }
            Err(e) => {
                findings.push(Finding::wrong(
                    Check::KubernetesApi,
                    "version",
                    format!("the API server does not answer: {e}"),
                ));
                None
            }
        },
        Err(e) => {
            findings.push(Finding::wrong(
                Check::KubernetesApi,
                "client",
                e.to_string(),
            ));
            None
        }
    };
    match &client {
        Some(client) => findings.extend(
            webhooks::check(client, &settings.webhook_configuration, settings.timeout).await,
        ),
        None => findings.push(Finding::unchecked(
            Check::Webhook,
            &settings.webhook_configuration,
            "the Kubernetes API is not reachable (above)",
        )),
    }
    match &settings.scheduler_config {
        Some(path) => findings.extend(scheduler::check(path, settings.timeout).await),
        None => findings.push(Finding::unchecked(
            Check::Extender,
            "-",
            "no --scheduler-config: give kube-scheduler's configuration file, where kube-scheduler runs",
        )),
    }
    match (&client, &settings.agent_tls) {
        (Some(client), Some(files)) => match agents::names(client, &settings.agent_identity, settings.timeout).await {
            Ok(identity) => {
                let calling = agents::Calling {
                    port: settings.agent_port,
                    identity,
                    within: settings.timeout,
                };
                findings.extend(agents::check(client, files, &calling).await);
            }
            Err(e) => findings.push(Finding::wrong(Check::Agent, "-", e.to_string())),
        },
        (None, _) => findings.push(Finding::unchecked(
            Check::Agent,
            "-",
            "the Kubernetes API is not reachable (above)",
        )),
        (_, None) => findings.push(Finding::unchecked(
            Check::Agent,
            "-",
            "no --agent-ca-file, --agent-client-cert-file and --agent-client-key-file: give the webhook's, e.g. in the webhook's pod: kubectl -n hugepage-agent exec deploy/hugepage-agent-webhook -- /hugepage-agent doctor --agent-ca-file=/etc/hugepage-agent/agent-client/ca.crt --agent-client-cert-file=/etc/hugepage-agent/agent-client/tls.crt --agent-client-key-file=/etc/hugepage-agent/agent-client/tls.key",
        )),
    }
    findings
}
