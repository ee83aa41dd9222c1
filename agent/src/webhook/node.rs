//! What the webhook reads of a `Node` object: its name, where its agent listens (the first
//! address of type `InternalIP` in `status.addresses`, with `--agent-port`), and its allocatable
//! hugepages per page size (`status.allocatable`, as the kubelet reports its pools), read from
//! the Nodes of the webhook's cache ([`super::cache`]), which the API server's watch fills.
//! Nothing else of the object is read. A field that is missing or of another shape is said so,
//! never guessed. Of a Node a caller sent (the `nodes` form of `ExtenderArgs`) only its name is
//! read ([`name_of`]): its addresses are the caller's to write, never dialled.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Node;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::kube::pod::{self, Hugepages, QuantityValue, ResourceList};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("nodes.items[{index}]: no metadata.name")]
    NoName { index: usize },
}

/// A candidate node, as far as the webhook needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Where its agent listens, or why it is not known.
    pub agent: Result<SocketAddr, String>,
    /// Its allocatable hugepages per page size (a size it does not list has none); `None` when
    /// the object has no `status.allocatable` to read.
    pub allocatable: Option<Hugepages>,
}

/// An object's `metadata.name`, when it is a string; nothing else of the object is kept.
#[derive(Deserialize)]
struct Named {
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
}

/// The `metadata.name` of an object's text, if it has a string there that is not empty.
pub fn name_of(object: &RawValue) -> Option<String> {
    let named: Named = serde_json::from_str(object.get()).ok()?;
    named.metadata?.name.filter(|n| !n.is_empty())
}

/// The candidate `name` is, from its `Node`; the agent listens on `port`.
pub fn of_node(name: String, node: &Node, port: u16) -> Candidate {
    Candidate {
        agent: internal_ip(node).map(|ip| SocketAddr::new(ip, port)),
        allocatable: allocatable(node),
        name,
    }
}

/// The first `InternalIP` of `status.addresses`.
fn internal_ip(node: &Node) -> Result<IpAddr, String> {
    let first = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .ok_or_else(|| "the Node has no InternalIP in status.addresses".to_owned())?;
    first.address.parse().map_err(|_| {
        format!(
            "the Node's InternalIP {:?} is not an IP address",
            first.address
        )
    })
}

/// The hugepages of `status.allocatable`, when it is there and reads as a resource list.
fn allocatable(node: &Node) -> Option<Hugepages> {
    let list = node.status.as_ref()?.allocatable.as_ref()?;
    let hugepages: ResourceList = list
        .iter()
        .filter(|(name, _)| name.starts_with("hugepages-"))
        .map(|(name, q)| (name.clone(), QuantityValue::Text(q.0.clone())))
        .collect();
    pod::from_list(&hugepages, "status.allocatable").ok()
}

#[cfg(test)]
mod tests;
