//! Every node's agent, called as the webhook calls it: the Nodes listed from the API, each node
//! with allocatable hugepages dialled at its first `InternalIP` and the agents' port, verified by
//! the agents' CA and the name `--agent-identity` gives the node (under `per-pod`, from the
//! agents' pods listed once), the client certificate
//! presented, and a dry-run admission (`POST /v1/admit?dryRun=true`) of a pod without hugepages,
//! which reserves nothing. Nodes without hugepages are counted, not called: the webhook never
//! asks their agents either. At most [`AT_ONCE`] calls are in flight.

use std::{sync::Arc, time::Duration};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};
use rustls::ClientConfig;

use super::{
    finding::{Check, Finding},
    probe::{self, ProbeError},
};
use crate::{
    tls::Material,
    webhook::{
        agent_pods::{AgentPods, AgentPodsError},
        agents::{ClientFiles, Reply},
        http1::Post,
        identity::{AgentIdentity, IdentityArgs, Names},
        node::{Candidate, of_node},
    },
};

/// How many Nodes one list call asks for.
const PAGE: u32 = 500;

/// How many agents are called at once.
const AT_ONCE: usize = 32;

/// The dry run's pod: no hugepages, so every agent that answers admits it.
const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"hugepage-agent-doctor","namespace":"default","uid":"00000000-0000-4000-8000-00000000d0c7"},"spec":{"containers":[{"name":"doctor"}]}}"#;

#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error("listing the Nodes: {0}")]
    List(String),
}

/// How the agents are called.
pub struct Calling {
    pub port: u16,
    pub identity: Names,
    pub within: Duration,
}

/// The names agents are verified by, as the webhook's flags `args` give them: under `per-pod`,
/// from the agents' pods listed once, each page within `within`.
pub async fn names(
    client: &Client,
    args: &IdentityArgs,
    within: Duration,
) -> Result<Names, AgentPodsError> {
    Ok(match args.agent_identity {
        AgentIdentity::Shared => Names::Shared,
        AgentIdentity::PerNode => Names::PerNode,
        AgentIdentity::Kubelet => Names::Kubelet,
        AgentIdentity::PerPod => {
            let (namespace, selector) = (&args.agent_namespace, &args.agent_selector);
            let pods = AgentPods::listed(client.clone(), namespace, selector, within).await?;
            Names::PerPod(pods)
        }
    })
}

/// Calls the agent of every node with hugepages; one finding per node, and one for those without.
pub async fn check(client: &Client, files: &ClientFiles, calling: &Calling) -> Vec<Finding> {
    let config = match files.read().and_then(|contents| files.build(&contents)) {
        Ok(config) => Arc::new(config),
        Err(e) => return vec![Finding::wrong(Check::Agent, "-", e.to_string())],
    };
    let candidates = match candidates(client, calling.port, calling.within).await {
        Ok(candidates) => candidates,
        Err(e) => return vec![Finding::wrong(Check::Agent, "-", e.to_string())],
    };
    let (with, without): (Vec<Candidate>, Vec<Candidate>) =
        candidates.into_iter().partition(has_hugepages);
    let mut findings: Vec<Finding> = stream::iter(with)
        .map(|candidate| {
            let config = config.clone();
            async move {
                let detail = call(config, &candidate, calling).await;
                match detail {
                    Ok(detail) => Finding::ok(Check::Agent, candidate.name, detail),
                    Err(detail) => Finding::wrong(
                        Check::Agent,
                        candidate.name,
                        format!("{detail}; the webhook fails open for this node (its answers are \"unverified\")"),
                    ),
                }
            }
        })
        .buffered(AT_ONCE)
        .collect()
        .await;
    if findings.is_empty() {
        findings.push(Finding::unchecked(
            Check::Agent,
            "-",
            "no Node has allocatable hugepages: no agent is asked",
        ));
    }
    if !without.is_empty() {
        findings.push(Finding::ok(
            Check::Agent,
            format!("{} node(s) without hugepages", without.len()),
            "not called: the webhook never asks them",
        ));
    }
    findings
}

/// Every Node, as the webhook reads it: listed [`PAGE`] at a time, each page within `within`.
async fn candidates(
    client: &Client,
    port: u16,
    within: Duration,
) -> Result<Vec<Candidate>, AgentsError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut candidates = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = tokio::time::timeout(within, nodes.list(&params))
            .await
            .map_err(|_| AgentsError::List(format!("no answer within {within:?}")))?
            .map_err(|e| AgentsError::List(e.to_string()))?;
        candidates.extend(page.items.iter().filter_map(|node| {
            let name = node.metadata.name.clone()?;
            Some(of_node(name, node, port))
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(candidates),
        }
    }
}

/// Whether a node has any allocatable hugepages.
fn has_hugepages(candidate: &Candidate) -> bool {
    candidate
        .allocatable
        .as_ref()
        .is_some_and(|h| h.values().any(|bytes| *bytes > 0))
}

/// The dry run on one node's agent, or what stops it.
async fn call(
    config: Arc<ClientConfig>,
    candidate: &Candidate,
    calling: &Calling,
) -> Result<String, String> {
    let addr = candidate.agent.clone()?;
    let name = calling
        .identity
        .name(&candidate.name)
        .map_err(|e| e.to_string())?;
    let host = name.to_str().into_owned();
    let request = Post {
        method: "POST",
        target: "/v1/admit?dryRun=true",
        host: &host,
        headers: &[],
        body: POD.as_bytes(),
    };
    let body = probe::call(config, addr, name, &request, calling.within)
        .await
        .map_err(|e| match e {
            ProbeError::Handshake { .. } => format!(
                "{e} (is --agent-ca-file the agents' CA, and does the agent's certificate name {host:?}?)"
            ),
            ProbeError::Connect { .. } | ProbeError::Timeout { .. } => format!(
                "{e} (is the agent's pod running on the node, and does a NetworkPolicy or firewall let the webhook reach port {}?)",
                addr.port()
            ),
            other => other.to_string(),
        })?;
    let reply: Reply = serde_json::from_slice(&body)
        .map_err(|e| format!("the answer at {addr} is not a verdict: {e}"))?;
    if !reply.allowed {
        return Err(format!(
            "the agent at {addr} refused a pod without hugepages: {}",
            reply.message.unwrap_or_default()
        ));
    }
    Ok(format!(
        "the agent at {addr} answers as {host:?} and admits a dry run"
    ))
}
