//! The wire format of a kube-scheduler extender, as `k8s.io/kube-scheduler/extender/v1`
//! (`types.go`) declares it: `ExtenderArgs` in (`pod`, `nodes`, `nodenames`),
//! `ExtenderFilterResult` (`nodes`, `nodenames`, `failedNodes`, `failedAndUnresolvableNodes`,
//! `error`) and `HostPriorityList` (`host`, `score`) out. The JSON tags are mixed case there
//! (`nodenames` all lower case, `failedNodes` camel case) and are kept exactly.
//!
//! The `v1.Pod` and the `Node` objects are kept as the text they came in ([`RawValue`]): the
//! answer gives the scheduler back the very objects it sent, and [`super::node`] and
//! [`super::pod`] read the few fields the webhook needs from that text, so what a call holds
//! is its body and a copy of these parts, never a tree of JSON values, which takes up to
//! sixteen times the bytes of its text (`[0,0,…]`) (#38). The lists are bounded for the same
//! reason: at most [`MAX_CANDIDATES`] node names or objects.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::kube::json::AtMost;

/// The highest score an extender gives (`MaxExtenderPriority`); the lowest is 0.
pub const MAX_PRIORITY: i64 = 10;

/// The most candidate nodes one call may name: above any cluster's nodes (Kubernetes supports
/// 5,000, the largest managed clusters 65,000), and it bounds what the lists take in memory
/// whatever their entries' size.
pub const MAX_CANDIDATES: usize = 100_000;

/// What the scheduler sends to `filter` and `prioritize`.
#[derive(Debug, Default, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled, as sent.
    #[serde(default)]
    pub pod: Option<Box<RawValue>>,
    /// The candidate nodes, whole (the scheduler's `nodeCacheCapable: false`).
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// The candidate nodes' names (`nodeCacheCapable: true`).
    #[serde(default, rename = "nodenames", deserialize_with = "optional_bounded")]
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList`: its items as sent, and its `apiVersion`, `kind` and `metadata` (kept, to
/// answer with them).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "null_is_empty")]
    pub items: Vec<Box<RawValue>>,
}

/// Go writes an empty slice as `null`; at most [`MAX_CANDIDATES`] items.
fn null_is_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    optional_bounded(d).map(Option::unwrap_or_default)
}

/// `null`, or a list of at most [`MAX_CANDIDATES`] entries.
fn optional_bounded<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    Option::<AtMost<T, MAX_CANDIDATES>>::deserialize(d).map(|l| l.map(|l| l.0))
}

/// Node name → why the pod cannot go there.
pub type FailedNodes = BTreeMap<String, String>;

/// The answer to `filter`, in the form the arguments came in.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExtenderFilterResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "nodenames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "failedNodes", skip_serializing_if = "BTreeMap::is_empty")]
    pub failed_nodes: FailedNodes,
    /// Nodes where preemption would not help either.
    #[serde(
        rename = "failedAndUnresolvableNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodes,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl ExtenderFilterResult {
    /// An answer that fails the whole call with `error`.
    pub fn failed(error: impl Into<String>) -> ExtenderFilterResult {
        ExtenderFilterResult {
            error: error.into(),
            ..ExtenderFilterResult::default()
        }
    }
}

/// One node's score in the answer to `prioritize` (a `HostPriorityList` is a list of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}
