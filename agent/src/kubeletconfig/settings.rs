//! The kubelet settings that decide NUMA selection, each with its value and where that value
//! came from. A [`Layer`] is what one place sets (the configuration files merged, the kubelet's
//! command line, the agent's flags); [`KubeletSettings::resolve`] lays them over the kubelet's own
//! defaults in order, a later layer replacing a field an earlier one set (feature gates gate by
//! gate, as the kubelet merges `--feature-gates` over its file). Values are checked as they are
//! read, an error naming the field. Pure.

use std::collections::BTreeMap;
use std::{fmt, path::PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::{
    kube::pod,
    kubelet::features::FeatureGates,
    memorymanager::{hints::Scope, machine::ReservedMemory},
    quantity,
    topologymanager::{
        NumaInfo, Policy, PolicyOptions,
        manager::{self, StartError},
    },
};

/// The `KubeletConfiguration` fields read, as the file spells them.
pub const FIELDS: [&str; 8] = [
    POLICY,
    SCOPE,
    OPTIONS,
    MEMORY_MANAGER_POLICY,
    RESERVED_MEMORY,
    SYSTEM_RESERVED,
    KUBE_RESERVED,
    FEATURE_GATES,
];
const POLICY: &str = "topologyManagerPolicy";
const SCOPE: &str = "topologyManagerScope";
const OPTIONS: &str = "topologyManagerPolicyOptions";
const MEMORY_MANAGER_POLICY: &str = "memoryManagerPolicy";
const RESERVED_MEMORY: &str = "reservedMemory";
const SYSTEM_RESERVED: &str = "systemReserved";
const KUBE_RESERVED: &str = "kubeReserved";
const FEATURE_GATES: &str = "featureGates";

/// The kubelet's gate for KEP-5759's verification.
pub const VERIFICATION_GATE: &str = "MemoryManagerHugepagesVerification";
/// The feature gates this agent mirrors; the kubelet's others are ignored.
pub const MIRRORED_GATES: [&str; 3] = [
    VERIFICATION_GATE,
    "PodLevelResources",
    "PodLevelResourceManagers",
];

/// Why the verification gate is on when nothing sets it (the kubelet's alpha default is off).
pub const VERIFICATION_DEFAULT_WHY: &str =
    "agent default: verifying is this agent's purpose; the kubelet's alpha gate defaults to off";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct LayerError {
    pub field: String,
    pub detail: String,
}

fn bad(field: impl Into<String>, detail: impl Into<String>) -> LayerError {
    LayerError {
        field: field.into(),
        detail: detail.into(),
    }
}

/// The Memory Manager's policy (`--memory-manager-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MemoryManagerPolicy {
    /// The kubelet's default: nothing is pinned, no hints, KEP-5759 does not apply.
    None,
    /// NUMA-aligned allocation for Guaranteed pods.
    Static,
}

impl MemoryManagerPolicy {
    pub fn name(self) -> &'static str {
        match self {
            MemoryManagerPolicy::None => "None",
            MemoryManagerPolicy::Static => "Static",
        }
    }
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Nothing set it: the kubelet's default.
    KubeletDefault,
    /// Nothing set it, and this agent's default differs from the kubelet's (the reason).
    AgentDefault(&'static str),
    /// The kubelet's configuration file (a host path).
    File(PathBuf),
    /// A drop-in file of the kubelet's configuration directory (a host path).
    DropIn(PathBuf),
    /// The running kubelet's command line.
    KubeletCmdline { pid: u32 },
    /// One of this agent's flags, which override the kubelet's.
    Flag(&'static str),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::KubeletDefault => f.write_str("kubelet default"),
            Source::AgentDefault(why) => f.write_str(why),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::DropIn(path) => write!(f, "drop-in {}", path.display()),
            Source::KubeletCmdline { pid } => write!(f, "kubelet command line (pid {pid})"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    pub value: T,
    pub source: Source,
}

fn sourced<T>(value: T, source: &Source) -> Sourced<T> {
    Sourced {
        value,
        source: source.clone(),
    }
}

/// What one place sets; `None` where it sets nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    pub policy: Option<Sourced<Policy>>,
    pub scope: Option<Sourced<Scope>>,
    pub options: Option<Sourced<BTreeMap<String, String>>>,
    pub memory_manager_policy: Option<Sourced<MemoryManagerPolicy>>,
    pub reserved_memory: Option<Sourced<ReservedMemory>>,
    pub system_reserved: Option<Sourced<BTreeMap<String, String>>>,
    pub kube_reserved: Option<Sourced<BTreeMap<String, String>>>,
    /// The mirrored gates it sets.
    pub gates: BTreeMap<&'static str, Sourced<bool>>,
}

/// `none`, `best-effort`, `restricted` or `single-numa-node`.
pub fn parse_policy(field: &str, text: &str) -> Result<Policy, LayerError> {
    text.parse()
        .map_err(|_| bad(field, format!("{text:?} is not one of {:?}", Policy::NAMES)))
}

/// `container` or `pod`.
pub fn parse_scope(field: &str, text: &str) -> Result<Scope, LayerError> {
    text.parse().map_err(|e: String| bad(field, e))
}

/// `None` or `Static`, spelled as the kubelet spells them.
pub fn parse_memory_manager_policy(
    field: &str,
    text: &str,
) -> Result<MemoryManagerPolicy, LayerError> {
    match text {
        "None" => Ok(MemoryManagerPolicy::None),
        "Static" => Ok(MemoryManagerPolicy::Static),
        other => Err(bad(field, format!("{other:?} is not None or Static"))),
    }
}

/// Topology Manager policy options given to the agent itself, checked as the kubelet reads them:
/// a flag of the agent's own that does not read stops it.
pub fn check_options(field: &str, options: &BTreeMap<String, String>) -> Result<(), LayerError> {
    PolicyOptions::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v)))
        .map(|_| ())
        .map_err(|e| bad(field, e.to_string()))
}

/// Adds `amount` of `name` (`memory` or `hugepages-<size>`) on `node` to `reserved`.
pub fn reserve(
    reserved: &mut ReservedMemory,
    field: &str,
    node: usize,
    name: &str,
    amount: &str,
) -> Result<(), LayerError> {
    let resource = if name == "memory" {
        name.to_owned()
    } else {
        match pod::page_size(name, field) {
            Ok(Some(size)) => format!("hugepages-{}", quantity::format_binary(size.0)),
            _ => {
                return Err(bad(
                    field,
                    format!("unknown memory type {name:?}: memory or hugepages-<size>"),
                ));
            }
        }
    };
    let bytes = quantity::parse_bytes(amount).map_err(|e| bad(field, e.to_string()))?;
    let total = reserved
        .entry(node)
        .or_default()
        .entry(resource)
        .or_default();
    *total = total.checked_add(bytes).ok_or_else(|| {
        bad(
            field,
            format!("{name} reserved on NUMA node {node} adds up to more than 2^64-1 bytes"),
        )
    })?;
    Ok(())
}

/// `name=true|false` pairs (`--feature-gates`): the mirrored gates among them.
pub fn parse_gates(field: &str, text: &str) -> Result<BTreeMap<&'static str, bool>, LayerError> {
    let mut gates = BTreeMap::new();
    for (name, value) in key_values(field, text)? {
        let on = match value.to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => return Err(bad(field, format!("{name}={value}: not true or false"))),
        };
        if let Some(known) = MIRRORED_GATES.iter().find(|g| **g == name) {
            gates.insert(*known, on);
        }
    }
    Ok(gates)
}

/// `k=v,k2=v2` (the kubelet's map flags), empty pairs skipped.
pub fn key_values(field: &str, text: &str) -> Result<BTreeMap<String, String>, LayerError> {
    let mut map = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(field, format!("{pair:?} is not name=value")))?;
        map.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(map)
}

fn string<'v>(field: &str, value: &'v Value) -> Result<&'v str, LayerError> {
    value.as_str().ok_or_else(|| {
        bad(
            field,
            format!("expected a string, found {}", type_of(value)),
        )
    })
}

/// The JSON name of a value's type, for messages.
pub fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn as_object<'v>(field: &str, value: &'v Value) -> Result<&'v Map<String, Value>, LayerError> {
    value.as_object().ok_or_else(|| {
        bad(
            field,
            format!("expected an object, found {}", type_of(value)),
        )
    })
}

fn string_map(field: &str, value: &Value) -> Result<BTreeMap<String, String>, LayerError> {
    as_object(field, value)?
        .iter()
        .map(|(k, v)| Ok((k.clone(), string(&format!("{field}.{k}"), v)?.to_owned())))
        .collect()
}

/// `reservedMemory`: `[{numaNode: 0, limits: {memory: 1Gi, hugepages-2Mi: 2Gi}}]`.
fn reserved_memory(value: &Value) -> Result<ReservedMemory, LayerError> {
    let list = value.as_array().ok_or_else(|| {
        bad(
            RESERVED_MEMORY,
            format!("expected a list, found {}", type_of(value)),
        )
    })?;
    let mut reserved = ReservedMemory::new();
    for (i, entry) in list.iter().enumerate() {
        let at = format!("{RESERVED_MEMORY}[{i}]");
        let entry = as_object(&at, entry)?;
        let node_field = format!("{at}.numaNode");
        let node = entry
            .get("numaNode")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad(&node_field, "expected a NUMA node number"))?;
        let limits_field = format!("{at}.limits");
        let limits = as_object(&limits_field, entry.get("limits").unwrap_or(&Value::Null))?;
        for (name, amount) in limits {
            let field = format!("{limits_field}.{name}");
            let amount = match amount {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(bad(
                        field,
                        format!("expected a quantity, found {}", type_of(other)),
                    ));
                }
            };
            reserve(&mut reserved, &field, node, name, &amount)?;
        }
    }
    Ok(reserved)
}

impl Layer {
    /// The fields of a `KubeletConfiguration` object, each checked; the sources are
    /// [`Source::KubeletDefault`] until [`Layer::set_sources`] names them.
    pub fn from_object(object: &Map<String, Value>) -> Result<Layer, LayerError> {
        let at = Source::KubeletDefault;
        let get = |field: &str| object.get(field).filter(|v| !v.is_null());
        let mut layer = Layer::default();
        if let Some(v) = get(POLICY) {
            layer.policy = Some(sourced(parse_policy(POLICY, string(POLICY, v)?)?, &at));
        }
        if let Some(v) = get(SCOPE) {
            layer.scope = Some(sourced(parse_scope(SCOPE, string(SCOPE, v)?)?, &at));
        }
        if let Some(v) = get(OPTIONS) {
            // Read as the Topology Manager reads them, when it does: not under `none`
            // (`topologymanager::manager`).
            layer.options = Some(sourced(string_map(OPTIONS, v)?, &at));
        }
        if let Some(v) = get(MEMORY_MANAGER_POLICY) {
            let text = string(MEMORY_MANAGER_POLICY, v)?;
            let policy = parse_memory_manager_policy(MEMORY_MANAGER_POLICY, text)?;
            layer.memory_manager_policy = Some(sourced(policy, &at));
        }
        if let Some(v) = get(RESERVED_MEMORY) {
            layer.reserved_memory = Some(sourced(reserved_memory(v)?, &at));
        }
        if let Some(v) = get(SYSTEM_RESERVED) {
            layer.system_reserved = Some(sourced(string_map(SYSTEM_RESERVED, v)?, &at));
        }
        if let Some(v) = get(KUBE_RESERVED) {
            layer.kube_reserved = Some(sourced(string_map(KUBE_RESERVED, v)?, &at));
        }
        if let Some(v) = get(FEATURE_GATES) {
            for (name, value) in as_object(FEATURE_GATES, v)? {
                let field = format!("{FEATURE_GATES}.{name}");
                let on = value.as_bool().ok_or_else(|| {
                    bad(
                        &field,
                        format!("expected a boolean, found {}", type_of(value)),
                    )
                })?;
                if let Some(known) = MIRRORED_GATES.iter().find(|g| **g == name) {
                    layer.gates.insert(*known, sourced(on, &at));
                }
            }
        }
        Ok(layer)
    }

    /// Names each field's source: `sources` maps a `KubeletConfiguration` field to it.
    pub fn set_sources(&mut self, sources: &BTreeMap<&'static str, Source>) {
        let of = |field: &str| {
            sources
                .get(field)
                .cloned()
                .unwrap_or(Source::KubeletDefault)
        };
        macro_rules! name {
            ($($slot:ident = $field:expr),*) => {
                $(if let Some(s) = &mut self.$slot { s.source = of($field); })*
            };
        }
        name!(
            policy = POLICY,
            scope = SCOPE,
            options = OPTIONS,
            memory_manager_policy = MEMORY_MANAGER_POLICY,
            reserved_memory = RESERVED_MEMORY,
            system_reserved = SYSTEM_RESERVED,
            kube_reserved = KUBE_RESERVED
        );
        for gate in self.gates.values_mut() {
            gate.source = of(FEATURE_GATES);
        }
    }
}

/// Every setting in use, each with its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletSettings {
    pub policy: Sourced<Policy>,
    pub scope: Sourced<Scope>,
    pub options: Sourced<BTreeMap<String, String>>,
    pub memory_manager_policy: Sourced<MemoryManagerPolicy>,
    pub reserved_memory: Sourced<ReservedMemory>,
    pub system_reserved: Sourced<BTreeMap<String, String>>,
    pub kube_reserved: Sourced<BTreeMap<String, String>>,
    /// Every mirrored gate.
    pub gates: BTreeMap<&'static str, Sourced<bool>>,
}

/// One setting as shown: the log line, `GET /v1/kubelet` and the info metric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub value: String,
    pub source: String,
}

impl KubeletSettings {
    /// `layers` over the kubelet's defaults, in order.
    pub fn resolve(layers: &[&Layer]) -> KubeletSettings {
        let default = Source::KubeletDefault;
        let mut s = KubeletSettings {
            policy: sourced(Policy::None, &default),
            scope: sourced(Scope::Container, &default),
            options: sourced(BTreeMap::new(), &default),
            memory_manager_policy: sourced(MemoryManagerPolicy::None, &default),
            reserved_memory: sourced(ReservedMemory::new(), &default),
            system_reserved: sourced(BTreeMap::new(), &default),
            kube_reserved: sourced(BTreeMap::new(), &default),
            gates: MIRRORED_GATES
                .iter()
                .map(|&g| (g, sourced(false, &default)))
                .collect(),
        };
        s.gates.insert(
            VERIFICATION_GATE,
            sourced(true, &Source::AgentDefault(VERIFICATION_DEFAULT_WHY)),
        );
        for layer in layers {
            macro_rules! over {
                ($($slot:ident),*) => {
                    $(if let Some(v) = &layer.$slot { s.$slot = v.clone(); })*
                };
            }
            over!(
                policy,
                scope,
                options,
                memory_manager_policy,
                reserved_memory,
                system_reserved,
                kube_reserved
            );
            for (gate, v) in &layer.gates {
                s.gates.insert(gate, v.clone());
            }
        }
        s
    }

    fn gate(&self, name: &str) -> bool {
        self.gates.get(name).is_some_and(|g| g.value)
    }

    /// Whether KEP-5759's verification is on.
    pub fn verification(&self) -> bool {
        self.gate(VERIFICATION_GATE)
    }

    /// The mirrored feature gates NUMA selection reads.
    pub fn feature_gates(&self) -> FeatureGates {
        FeatureGates {
            pod_level_resources: self.gate("PodLevelResources"),
            pod_level_resource_managers: self.gate("PodLevelResourceManagers"),
        }
    }

    /// Whether the kubelet's Topology Manager starts with these settings on `machine`
    /// ([`manager::start`]) under `policy` (the settings' own, or a request's): the options in
    /// effect, or why it does not.
    pub fn start(&self, policy: Policy, machine: &NumaInfo) -> Result<PolicyOptions, StartError> {
        let options = self.options.value.iter();
        manager::start(policy, options.map(|(k, v)| (k.as_str(), v)), machine)
    }

    /// Every setting by its `KubeletConfiguration` name (gates as `featureGates.<Name>`).
    pub fn rows(&self) -> BTreeMap<String, Row> {
        let row = |value: String, source: &Source| Row {
            value,
            source: source.to_string(),
        };
        let scope = match self.scope.value {
            Scope::Container => "container",
            Scope::Pod => "pod",
        };
        let mut rows = BTreeMap::from([
            (
                POLICY.to_owned(),
                row(self.policy.value.to_string(), &self.policy.source),
            ),
            (SCOPE.to_owned(), row(scope.to_owned(), &self.scope.source)),
            (
                OPTIONS.to_owned(),
                row(pairs(&self.options.value), &self.options.source),
            ),
            (
                MEMORY_MANAGER_POLICY.to_owned(),
                row(
                    self.memory_manager_policy.value.name().to_owned(),
                    &self.memory_manager_policy.source,
                ),
            ),
            (
                RESERVED_MEMORY.to_owned(),
                row(
                    reserved_text(&self.reserved_memory.value),
                    &self.reserved_memory.source,
                ),
            ),
            (
                SYSTEM_RESERVED.to_owned(),
                row(
                    pairs(&self.system_reserved.value),
                    &self.system_reserved.source,
                ),
            ),
            (
                KUBE_RESERVED.to_owned(),
                row(pairs(&self.kube_reserved.value), &self.kube_reserved.source),
            ),
        ]);
        for (gate, v) in &self.gates {
            rows.insert(
                format!("{FEATURE_GATES}.{gate}"),
                row(v.value.to_string(), &v.source),
            );
        }
        rows
    }
}

/// `k=v,k2=v2`.
fn pairs(map: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
    items.join(",")
}

/// The kubelet's `--reserved-memory` syntax: `0:memory=1Gi,hugepages-2Mi=2Gi;1:memory=1Gi`.
fn reserved_text(reserved: &ReservedMemory) -> String {
    let nodes: Vec<String> = reserved
        .iter()
        .map(|(node, limits)| {
            let limits: Vec<String> = limits
                .iter()
                .map(|(name, bytes)| format!("{name}={}", quantity::format_binary(*bytes)))
                .collect();
            format!("{node}:{}", limits.join(","))
        })
        .collect();
    nodes.join(";")
}

#[cfg(test)]
mod tests;
