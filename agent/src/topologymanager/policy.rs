//! The Topology Manager's vocabulary: its policies (`--topology-manager-policy`), their options
//! (`--topology-manager-policy-options`, read as the kubelet's `NewPolicyOptions` reads them), and
//! the topology hints its providers give. What the words mean in a merge is [`super::merge`]'s;
//! when the kubelet accepts them on a machine, [`super::manager`]'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bitmask::NumaMask;

/// NUMA nodes the kubelet's Topology Manager accepts unless `max-allowable-numa-nodes` says more.
pub const DEFAULT_MAX_NUMA_NODES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "unknown topology policy {0:?}: one of none, best-effort, restricted, single-numa-node"
    )]
    UnknownPolicy(String),
    #[error(
        "unknown topology policy option {0:?}: prefer-closest-numa-nodes and max-allowable-numa-nodes are known"
    )]
    UnknownOption(String),
    #[error("policy option {option}: {detail}")]
    BadOption { option: String, detail: String },
}

/// A hint: a set of NUMA nodes (`None`: no preference, any node) and whether it is preferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyHint {
    #[serde(rename = "numaNodes")]
    pub affinity: Option<NumaMask>,
    pub preferred: bool,
}

/// What one provider returned: `None` is a nil map (no preference at all); per resource, `None`
/// is a nil list (no preference for it) and an empty list means it fits nowhere.
pub type ProviderHints = Option<BTreeMap<String, Option<Vec<TopologyHint>>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    pub const NAMES: [&'static str; 4] = ["none", "best-effort", "restricted", "single-numa-node"];

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Policy::None),
            "best-effort" => Ok(Policy::BestEffort),
            "restricted" => Ok(Policy::Restricted),
            "single-numa-node" => Ok(Policy::SingleNumaNode),
            other => Err(PolicyError::UnknownPolicy(other.to_string())),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `--topology-manager-policy-options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyOptions {
    pub prefer_closest_numa_nodes: bool,
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            prefer_closest_numa_nodes: false,
            max_allowable_numa_nodes: DEFAULT_MAX_NUMA_NODES,
        }
    }
}

/// An option's value as the kubelet's string: a JSON string as it is, any other value as JSON
/// writes it (`true`, `16`).
pub fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl PolicyOptions {
    /// From `name → value` pairs; values are JSON booleans/numbers or the kubelet's strings.
    pub fn from_map(map: &BTreeMap<String, serde_json::Value>) -> Result<Self, PolicyError> {
        PolicyOptions::from_pairs(map.iter().map(|(name, value)| (name.as_str(), text(value))))
    }

    /// From `name`, `value` pairs as the kubelet's flag and file spell them, as the kubelet's
    /// `NewPolicyOptions` reads them: an unknown name or a value that does not read is an error.
    pub fn from_pairs<'a, T: AsRef<str>>(
        pairs: impl IntoIterator<Item = (&'a str, T)>,
    ) -> Result<Self, PolicyError> {
        let mut options = PolicyOptions::default();
        for (name, value) in pairs {
            let text = value.as_ref();
            let bad = |detail: String| PolicyError::BadOption {
                option: name.to_owned(),
                detail,
            };
            match name {
                "prefer-closest-numa-nodes" => {
                    options.prefer_closest_numa_nodes = text
                        .parse()
                        .map_err(|_| bad(format!("{text:?} is not true or false")))?;
                }
                "max-allowable-numa-nodes" => {
                    let max: usize = text
                        .parse()
                        .map_err(|_| bad(format!("{text:?} is not a whole number")))?;
                    if max < DEFAULT_MAX_NUMA_NODES {
                        return Err(bad(format!(
                            "{max} is less than the default {DEFAULT_MAX_NUMA_NODES}"
                        )));
                    }
                    options.max_allowable_numa_nodes = max;
                }
                other => return Err(PolicyError::UnknownOption(other.to_string())),
            }
        }
        Ok(options)
    }
}
