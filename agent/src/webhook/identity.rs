//! How the webhook verifies the agent it dials (`--agent-identity`). `shared`: every agent
//! presents a certificate for the one name [`SERVER_NAME`] (one Secret on every node), so a key
//! taken from any node answers for all of them. `per-node`: the agent of node `N` must present a
//! certificate for `N.`[`SERVER_NAME`], the name of the node the webhook meant to reach (`deploy/`
//! ships no issuer for such certificates: docs/security.md says why). `per-pod`: the agent of
//! node `N` must present a certificate for `<pod>.<namespace>.`[`POD_DOMAIN`], where `<pod>` is
//! the agent's pod that the API server has bound to `N` ([`super::agent_pods`]), so that a key
//! taken from one node answers for that node only where the issuer gives a pod's name to that
//! pod alone (`deploy/` ships none: docs/security.md says why cert-manager's csi-driver is not
//! one). `kubelet`: the agent of node `N` serves with `N`'s kubelet serving certificate, and
//! must present one whose subject is `N`'s ([`crate::tls::kubelet`]): the cluster issues it, to
//! node `N` alone. The name is also the `host` of the requests, and the connection pool is keyed by it
//! ([`super::pool`]): a connection verified for one node never serves another.

use rustls_pki_types::ServerName;

use super::{agent_pods::AgentPods, agent_tls::AgentCertificates};
use crate::{
    flags::FlagError,
    kube::identifiers::{label_key, label_value, namespace},
    tls::{SERVER_NAME, kubelet},
};

/// The domain under which `per-pod` names each agent's pod.
pub const POD_DOMAIN: &str = "pod.hugepage-agent.internal";

/// The `--agent-identity` choices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentIdentity {
    /// Every agent by the one name `node.hugepage-agent.internal`.
    #[default]
    Shared,
    /// The agent of node N by `N.node.hugepage-agent.internal`.
    PerNode,
    /// The agent of node N by `<pod>.<namespace>.pod.hugepage-agent.internal`, its pod on N.
    PerPod,
    /// The agent of node N by N's kubelet serving certificate (`CN=system:node:N`).
    Kubelet,
}

impl AgentIdentity {
    /// What an agent's certificate is checked for under this identity.
    pub fn certificates(self) -> AgentCertificates {
        match self {
            AgentIdentity::Kubelet => AgentCertificates::Kubelet,
            AgentIdentity::Shared | AgentIdentity::PerNode | AgentIdentity::PerPod => {
                AgentCertificates::Named
            }
        }
    }
}

/// The default of `--agent-selector`: the DaemonSet's pods.
pub const AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=hugepage-agent,app.kubernetes.io/component=agent";

/// How agents are verified: the webhook's flags, which `doctor` takes too.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct IdentityArgs {
    /// What each agent's server certificate must be: shared (for node.hugepage-agent.internal,
    /// one certificate on every node), per-node (for <node-name>.node.hugepage-agent.internal,
    /// the node dialled), per-pod (for <pod>.<namespace>.pod.hugepage-agent.internal, <pod> being
    /// the agent's pod that the API server has on the node dialled, listed and watched in
    /// --agent-namespace by --agent-selector) or kubelet (the kubelet serving certificate of the
    /// node dialled: subject CN=system:node:<node-name>, O=system:nodes, chaining to
    /// --agent-ca-file, the kubelet-serving signer's CA; the component kubelet-serving-identity).
    /// deploy/ ships no issuer for per-node or per-pod: see docs/security.md.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_IDENTITY", value_enum, default_value_t = AgentIdentity::Shared)]
    pub agent_identity: AgentIdentity,
    /// Under --agent-identity per-pod: the namespace of the agents' pods.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_NAMESPACE",
        default_value = "hugepage-agent",
        value_name = "NAMESPACE"
    )]
    pub agent_namespace: String,
    /// Under --agent-identity per-pod: the label selector of the agents' pods in
    /// --agent-namespace (only equality, as `key=value,…`).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_SELECTOR",
        default_value = AGENT_SELECTOR,
        value_name = "SELECTOR"
    )]
    pub agent_selector: String,
}

impl IdentityArgs {
    /// The flags, checked: the namespace a namespace's name, the selector `key=value` pairs.
    pub fn checked(self) -> Result<IdentityArgs, FlagError> {
        namespace(&self.agent_namespace).map_err(|e| FlagError::Name {
            flag: "--agent-namespace",
            value: self.agent_namespace.clone(),
            reason: e.to_string(),
        })?;
        for pair in self.agent_selector.split(',') {
            let refused = |reason: String| FlagError::Name {
                flag: "--agent-selector",
                value: self.agent_selector.clone(),
                reason,
            };
            let Some((key, value)) = pair.split_once('=') else {
                return Err(refused(format!(
                    "{pair:?} is not key=value (a selector of such pairs separated by ',')"
                )));
            };
            label_key(key)
                .and_then(|()| label_value(value))
                .map_err(|e| refused(e.to_string()))?;
        }
        Ok(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("node {node:?}: {name:?} is not a DNS name to verify its agent by")]
    NotDns { node: String, name: String },
    #[error("node {node:?}: no name to verify its agent by (--agent-identity per-pod): {why}")]
    NoPod { node: String, why: String },
}

/// The names agents are verified by: `--agent-identity`, with the agents' pods under `per-pod`.
#[derive(Debug, Clone)]
pub enum Names {
    Shared,
    PerNode,
    PerPod(AgentPods),
    Kubelet,
}

impl Names {
    /// The name the agent of `node` must present a certificate for.
    pub fn name(&self, node: &str) -> Result<ServerName<'static>, IdentityError> {
        let name = match self {
            Names::Shared => SERVER_NAME.to_owned(),
            Names::PerNode => format!("{node}.{SERVER_NAME}"),
            Names::PerPod(pods) => {
                let pod = pods.on(node).map_err(|why| IdentityError::NoPod {
                    node: node.to_owned(),
                    why,
                })?;
                format!("{pod}.{}.{POD_DOMAIN}", pods.namespace())
            }
            Names::Kubelet => kubelet::server_name(node),
        };
        // A node's or a pod's name is a DNS subdomain, but one long enough makes a name longer
        // than DNS allows: that node's agent cannot be verified.
        ServerName::try_from(name.clone()).map_err(|_| IdentityError::NotDns {
            node: node.to_owned(),
            name,
        })
    }

    /// Whether a node's name can change while the webhook runs (`per-pod`: the node's agent pod
    /// is replaced), so that a long-lived connection must check it again.
    pub fn may_change(&self) -> bool {
        matches!(self, Names::PerPod(_))
    }

    /// Why no agent can be verified yet (`per-pod` before the pods are listed), if so.
    pub fn unready(&self) -> Option<&'static str> {
        match self {
            Names::PerPod(pods) if !pods.is_synced() => {
                Some("the agents' pods (--agent-identity per-pod) have not been listed yet")
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_names_every_node_alike_and_per_node_names_each() {
        let shared = Names::Shared;
        assert_eq!(
            shared.name("a").expect("valid"),
            shared.name("b").expect("valid")
        );
        let a = Names::PerNode.name("node-a.zone1").expect("valid");
        assert_eq!(a.to_str(), "node-a.zone1.node.hugepage-agent.internal");
        let long =
            "n".repeat(60) + "." + &"n".repeat(60) + "." + &"n".repeat(60) + "." + &"n".repeat(60);
        assert!(Names::PerNode.name(&long).is_err());
        assert!(Names::Shared.name(&long).is_ok());
    }

    #[test]
    fn per_pod_names_the_pod_on_the_node_and_no_pod_is_no_name() {
        let pods = AgentPods::placed("hugepage-agent", &[("hugepage-agent-x7k2p", "node-a")]);
        let names = Names::PerPod(pods);
        let a = names.name("node-a").expect("a pod");
        assert_eq!(
            a.to_str(),
            "hugepage-agent-x7k2p.hugepage-agent.pod.hugepage-agent.internal"
        );
        assert!(matches!(
            names.name("node-b"),
            Err(IdentityError::NoPod { .. })
        ));
        assert_eq!(names.unready(), None);
    }

    fn args(namespace: &str, selector: &str) -> IdentityArgs {
        IdentityArgs {
            agent_identity: AgentIdentity::PerPod,
            agent_namespace: namespace.to_owned(),
            agent_selector: selector.to_owned(),
        }
    }

    #[test]
    fn the_namespace_and_selector_flags_are_checked() {
        assert!(args("hugepage-agent", AGENT_SELECTOR).checked().is_ok());
        assert!(args("ops-2", "app=agent").checked().is_ok());
        assert!(
            args("ops", "example.com/Tier=a_b.c,empty=")
                .checked()
                .is_ok()
        );
        for (namespace, selector, flag) in [
            ("", "a=b", "--agent-namespace"),
            ("Caps", "a=b", "--agent-namespace"),
            ("-x", "a=b", "--agent-namespace"),
            (&"n".repeat(64), "a=b", "--agent-namespace"),
            ("ns", "", "--agent-selector"),
            ("ns", "a", "--agent-selector"),
            ("ns", "a=b=c", "--agent-selector"),
            ("ns", "a=b c", "--agent-selector"),
            ("ns", "a!=b", "--agent-selector"),
            ("ns", "a=b,", "--agent-selector"),
            ("ns", "a=-b", "--agent-selector"),
            ("ns", "Bad_Prefix/a=b", "--agent-selector"),
            ("ns", &format!("a={}", "v".repeat(64)), "--agent-selector"),
        ] {
            let err = args(namespace, selector).checked().expect_err(selector);
            assert!(err.to_string().starts_with(flag), "{err}");
        }
    }
}
