//! The wire format of a kube-scheduler extender, as `k8s.io/kube-scheduler/extender/v1`
//! (`types.go`) declares it: `ExtenderArgs` in (`pod`, `nodes`, `nodenames`),
//! `ExtenderFilterResult` (`nodes`, `nodenames`, `failedNodes`, `failedAndUnresolvableNodes`,
//! `error`) and `HostPriorityList` (`host`, `score`) out. The JSON tags are mixed case there
//! (`nodenames` all lower case, `failedNodes` camel case) and are kept exactly. A `v1.Pod` and
//! the `Node` objects are kept as JSON: the answer gives the scheduler back the very objects it
//! sent, and [`super::node`] and [`super::pod`] read the few fields the webhook needs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The highest score an extender gives (`MaxExtenderPriority`); the lowest is 0.
pub const MAX_PRIORITY: i64 = 10;

/// What the scheduler sends to `filter` and `prioritize`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(default)]
    pub pod: Option<Value>,
    /// The candidate nodes, whole (the scheduler's `nodeCacheCapable: false`).
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// The candidate nodes' names (`nodeCacheCapable: true`).
    #[serde(default, rename = "nodenames")]
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList`: its items, and whatever else it carried (kept as sent).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default, deserialize_with = "null_is_empty")]
    pub items: Vec<Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Go writes an empty slice as `null`.
fn null_is_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    Ok(Option::<Vec<Value>>::deserialize(d)?.unwrap_or_default())
}

/// Node name → why the pod cannot go there.
pub type FailedNodes = BTreeMap<String, String>;

/// The answer to `filter`, in the form the arguments came in.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
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
