//! What the webhook reads of a `Node` object: its name, where its agent listens (the first
//! address of type `InternalIP` in `status.addresses`, with `--agent-port`), and its allocatable
//! hugepages per page size (`status.allocatable`, as the kubelet reports its pools). Nothing else
//! of the object is read; a field of another shape is treated as absent and said so, never
//! guessed.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use crate::kube::pod::{self, Hugepages, ResourceList};

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

/// Reads `nodes.items[index]`; the agent listens on `port` at the node's first `InternalIP`.
pub fn candidate(index: usize, node: &Value, port: u16) -> Result<Candidate, NodeError> {
    let name = node
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or(NodeError::NoName { index })?
        .to_owned();
    Ok(Candidate {
        agent: internal_ip(node).map(|ip| SocketAddr::new(ip, port)),
        allocatable: allocatable(node),
        name,
    })
}

/// The first `InternalIP` of `status.addresses`.
fn internal_ip(node: &Value) -> Result<IpAddr, String> {
    let first = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
        .ok_or_else(|| "the Node has no InternalIP in status.addresses".to_owned())?;
    let text = first.get("address").and_then(Value::as_str).unwrap_or("");
    text.parse()
        .map_err(|_| format!("the Node's InternalIP {text:?} is not an IP address"))
}

/// The hugepages of `status.allocatable`, when it is there and reads as a resource list.
fn allocatable(node: &Value) -> Option<Hugepages> {
    let list = node.pointer("/status/allocatable")?;
    let list: ResourceList = serde_json::from_value(list.clone()).ok()?;
    let hugepages: ResourceList = list
        .into_iter()
        .filter(|(name, _)| name.starts_with("hugepages-"))
        .collect();
    pod::from_list(&hugepages, "status.allocatable").ok()
}

#[cfg(test)]
mod tests;
