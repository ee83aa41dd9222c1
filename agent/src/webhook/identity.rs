//! How the webhook verifies the agent it dials (`--agent-identity`). `shared`: every agent
//! presents a certificate for the one name [`SERVER_NAME`] (one Secret on every node), so a key
//! taken from any node answers for all of them. `per-node`: the agent of node `N` must present a
//! certificate for `N.`[`SERVER_NAME`], the name of the node the webhook meant to reach, so a
//! key taken from one node answers for that node only (`deploy/` ships no issuer for such
//! certificates: docs/security.md says why and how to issue them). The name is also the `host`
//! of the requests, and the connection pool is keyed by it ([`super::pool`]): a connection verified for one node never serves another.

use rustls_pki_types::ServerName;

use crate::tls::SERVER_NAME;

/// The `--agent-identity` choices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentIdentity {
    /// Every agent by the one name `node.hugepage-agent.internal`.
    #[default]
    Shared,
    /// The agent of node N by `N.node.hugepage-agent.internal`.
    PerNode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node:?}: {name:?} is not a DNS name to verify its agent by")]
pub struct IdentityError {
    node: String,
    name: String,
}

impl AgentIdentity {
    /// The name the agent of `node` must present a certificate for.
    pub fn name(self, node: &str) -> Result<ServerName<'static>, IdentityError> {
        let name = match self {
            AgentIdentity::Shared => SERVER_NAME.to_owned(),
            AgentIdentity::PerNode => format!("{node}.{SERVER_NAME}"),
        };
        // A node's name is a DNS subdomain, but one of 220 characters or more makes a name
        // longer than DNS allows: that node's agent cannot be verified.
        ServerName::try_from(name.clone()).map_err(|_| IdentityError {
            node: node.to_owned(),
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_names_every_node_alike_and_per_node_names_each() {
        let shared = AgentIdentity::Shared;
        assert_eq!(
            shared.name("a").expect("valid"),
            shared.name("b").expect("valid")
        );
        let a = AgentIdentity::PerNode.name("node-a.zone1").expect("valid");
        assert_eq!(a.to_str(), "node-a.zone1.node.hugepage-agent.internal");
        let long =
            "n".repeat(60) + "." + &"n".repeat(60) + "." + &"n".repeat(60) + "." + &"n".repeat(60);
        assert!(AgentIdentity::PerNode.name(&long).is_err());
        assert!(AgentIdentity::Shared.name(&long).is_ok());
    }
}
