//! What a pod asks of hugepages, per page size, from either body form of `POST /v1/admit` (and
//! `check --request`): the short form, or a whole Kubernetes `v1.Pod`.
//!
//! Kubernetes' rules apply: a `hugepages-<size>` resource names any page size; hugepages cannot be
//! overcommitted, so a request must equal its limit (a limit alone is the request); the amount is
//! a whole multiple of the page size. The pod's need is the kubelet's: app containers and
//! restartable init containers (sidecars) run together and add up, each ordinary init container
//! runs alone beside the sidecars started before it, the larger of the two wins, pod overhead is
//! added, and pod-level resources (`spec.resources`) replace the sum for the sizes they name.
//! Errors name the field at fault, as the API reports them. A field's path is passed down as
//! something to display (`format_args!`), written out only when an error names it: every
//! admission walks every resource of the pod, and formatting each path up front cost more than
//! the checks.

use std::{collections::BTreeMap, fmt::Display};

use serde::Deserialize;

use super::json;
use crate::{
    host::PageSize,
    quantity::{self, QuantityError},
};

const PREFIX: &str = "hugepages-";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct RequestError {
    /// JSON path of the value at fault, e.g. `spec.containers[0].resources.limits.hugepages-2Mi`.
    pub field: String,
    pub detail: String,
}

fn error(field: impl Display, detail: impl Into<String>) -> RequestError {
    RequestError {
        field: field.to_string(),
        detail: detail.into(),
    }
}

/// The pod's total of `resource` does not fit in 64 bits of bytes: `field` carried it over.
pub fn overflow(field: impl Display, resource: &str) -> RequestError {
    error(
        field,
        format!("the pod's total of {resource} overflows 64 bits of bytes"),
    )
}

/// Bytes of hugepages per page size. Sizes requested as 0 are left out.
pub type Hugepages = BTreeMap<PageSize, u64>;

/// A quantity as JSON carries it: a string (`"4Gi"`) or a plain number of bytes.
#[derive(Debug, Clone)]
pub enum QuantityValue {
    Text(String),
    /// A whole number of bytes (`4194304`, or `4194304.0` and `4.194304e6`: JSON numbers).
    Number(u64),
}

/// Read straight from the JSON value (an untagged enum would first copy every value into a
/// buffer of its own to try each variant on it: a pod carries several quantities per container).
impl<'de> Deserialize<'de> for QuantityValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::IntoDeserializer;
        struct Quantity;
        impl serde::de::Visitor<'_> for Quantity {
            type Value = QuantityValue;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quantity: a string such as \"4Gi\", or a whole number of bytes")
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<QuantityValue, E> {
                Ok(QuantityValue::Number(n))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<QuantityValue, E> {
                json::whole_number(n.into_deserializer()).map(QuantityValue::Number)
            }

            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<QuantityValue, E> {
                json::whole_number(n.into_deserializer()).map(QuantityValue::Number)
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<QuantityValue, E> {
                Ok(QuantityValue::Text(text.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<QuantityValue, E> {
                Ok(QuantityValue::Text(text))
            }
        }
        deserializer.deserialize_any(Quantity)
    }
}

impl QuantityValue {
    fn bytes(&self) -> Result<u64, QuantityError> {
        match self {
            QuantityValue::Text(text) => quantity::parse_bytes(text),
            QuantityValue::Number(n) => Ok(*n),
        }
    }
}

/// A resource list: name → quantity.
pub type ResourceList = BTreeMap<String, QuantityValue>;

/// What the agent makes of a resource a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceUse {
    /// `hugepages-<size>`: placed by NUMA selection and verified against `free_hugepages`.
    Hugepages(PageSize),
    /// `memory`: placed by NUMA selection (the Memory Manager hints over it), never verified
    /// (KEP-5759 verifies hugepages only).
    Memory,
    /// Any other resource (`cpu`, `ephemeral-storage`, extended resources): the Memory Manager
    /// does not place it, so neither selection nor verification reads it.
    Ignored,
}

/// How `name` is used, after checking that it is a Kubernetes resource name (a qualified name:
/// an optional DNS subdomain prefix and `/`, then 1 to 63 alphanumerics, `-`, `_` or `.`,
/// beginning and ending alphanumeric), as the API server checks it.
pub fn resource_use(name: &str, field: impl Display) -> Result<ResourceUse, RequestError> {
    if !is_qualified_name(name) {
        return Err(error(
            field,
            format!(
                "{name:?} is not a resource name (an optional DNS subdomain and '/', then up to 63 letters, digits, '-', '_' or '.')"
            ),
        ));
    }
    Ok(match page_size(name, &field)? {
        Some(size) => ResourceUse::Hugepages(size),
        None if name == "memory" => ResourceUse::Memory,
        None => ResourceUse::Ignored,
    })
}

fn is_qualified_name(name: &str) -> bool {
    let (prefix, local) = match name.rsplit_once('/') {
        Some((prefix, local)) => (Some(prefix), local),
        None => (None, name),
    };
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let local_ok = !local.is_empty()
        && local.len() <= 63
        && local.starts_with(alnum)
        && local.ends_with(alnum)
        && local
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    local_ok && prefix_ok
}

/// The page size named by a resource, `None` for resources that are not hugepages.
pub fn page_size(name: &str, field: impl Display) -> Result<Option<PageSize>, RequestError> {
    let Some(size) = name.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let bytes = quantity::parse_bytes(size)
        .map_err(|e| error(&field, format!("{name} does not name a page size: {e}")))?;
    if !bytes.is_power_of_two() || bytes < 4096 {
        return Err(error(
            field,
            format!("{name} does not name a page size (a power of two of at least 4Ki)"),
        ));
    }
    Ok(Some(PageSize(bytes)))
}

/// The hugepages of one resource list in which requests equal limits (the short form).
pub fn from_list(list: &ResourceList, field: impl Display) -> Result<Hugepages, RequestError> {
    let mut pages = Hugepages::new();
    for (name, value) in list {
        if let ResourceUse::Hugepages(size) = resource_use(name, format_args!("{field}.{name}"))? {
            let bytes = amount(size, value, format_args!("{field}.{name}"))?;
            if bytes > 0 {
                pages.insert(size, bytes);
            }
        }
    }
    Ok(pages)
}

fn amount(size: PageSize, value: &QuantityValue, field: impl Display) -> Result<u64, RequestError> {
    let bytes = value.bytes().map_err(|e| error(&field, e.to_string()))?;
    if bytes % size.0 != 0 {
        return Err(error(
            field,
            format!(
                "{} is not a whole multiple of the page size {size}",
                quantity::format_binary(bytes)
            ),
        ));
    }
    Ok(bytes)
}

/// `requests` and `limits` of a container or pod, as a `v1.ResourceRequirements`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Requirements {
    #[serde(default, deserialize_with = "json::or_default")]
    pub requests: ResourceList,
    #[serde(default, deserialize_with = "json::or_default")]
    pub limits: ResourceList,
}

impl Requirements {
    /// Hugepages of these requirements: the limit (requests must equal it).
    pub fn hugepages(&self, field: impl Display + Copy) -> Result<Hugepages, RequestError> {
        let mut pages = Hugepages::new();
        for (name, limit) in &self.limits {
            let ResourceUse::Hugepages(size) =
                resource_use(name, format_args!("{field}.limits.{name}"))?
            else {
                continue;
            };
            let bytes = amount(size, limit, format_args!("{field}.limits.{name}"))?;
            if let Some(request) = self.requests.get(name) {
                let requested = amount(size, request, format_args!("{field}.requests.{name}"))?;
                if requested != bytes {
                    return Err(error(
                        format_args!("{field}.requests.{name}"),
                        format!(
                            "must equal the limit {} (hugepages cannot be overcommitted)",
                            quantity::format_binary(bytes)
                        ),
                    ));
                }
            }
            if bytes > 0 {
                pages.insert(size, bytes);
            }
        }
        for name in self.requests.keys() {
            let at = format_args!("{field}.requests.{name}");
            if matches!(resource_use(name, at)?, ResourceUse::Hugepages(_))
                && !self.limits.contains_key(name)
            {
                return Err(error(at, "hugepages need a limit equal to the request"));
            }
        }
        Ok(pages)
    }
}

/// A container of a `v1.Pod`: what the rules need of it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "json::or_default")]
    pub name: String,
    #[serde(default, deserialize_with = "json::object_or_default")]
    pub resources: Requirements,
    /// `Always` on an init container makes it a sidecar.
    #[serde(default)]
    pub restart_policy: Option<String>,
}

/// The parts of a `v1.PodSpec` the rules read.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "json::objects_or_default")]
    pub containers: Vec<Container>,
    #[serde(default, deserialize_with = "json::objects_or_default")]
    pub init_containers: Vec<Container>,
    #[serde(default, deserialize_with = "json::or_default")]
    pub overhead: ResourceList,
    /// Pod-level resources (the `PodLevelResources` feature).
    #[serde(default, deserialize_with = "json::optional_object")]
    pub resources: Option<Requirements>,
}

/// A whole `v1.Pod`: what admission and hints read of it (Kubernetes objects carry many more
/// fields; they are ignored).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default, deserialize_with = "json::object_or_default")]
    pub metadata: ObjectMeta,
    #[serde(deserialize_with = "json::object")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "json::object_or_default")]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectMeta {
    #[serde(default, deserialize_with = "json::or_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "json::or_default")]
    pub name: String,
    #[serde(default, deserialize_with = "json::or_default")]
    pub uid: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `Guaranteed`, `Burstable` or `BestEffort`, when the API server has set it.
    #[serde(default)]
    pub qos_class: Option<String>,
}

/// A pod's hugepages: each app container's own, and the pod's need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodHugepages {
    /// Each app container's hugepages, in `spec.containers` order.
    pub containers: Vec<Hugepages>,
    /// The pod's need, by the kubelet's rules (see the module documentation).
    pub total: Hugepages,
}

impl PodHugepages {
    /// Whether the pod asks for no hugepages at all.
    pub fn is_empty(&self) -> bool {
        self.total.is_empty()
    }
}

/// The pod's hugepages, each container's and the pod's need, by the kubelet's rules. A total
/// beyond 64 bits of bytes is an error naming the resource, at the value that carried it over.
pub fn pod_hugepages(spec: &PodSpec) -> Result<PodHugepages, RequestError> {
    let mut running = Hugepages::new();
    let mut containers = Vec::with_capacity(spec.containers.len());
    for (i, c) in spec.containers.iter().enumerate() {
        let field = format_args!("spec.containers[{i}].resources");
        let own = c.resources.hugepages(field)?;
        add(&mut running, &own, field)?;
        containers.push(own);
    }
    let mut sidecars = Hugepages::new();
    let mut init_peak = Hugepages::new();
    for (i, c) in spec.init_containers.iter().enumerate() {
        let field = format_args!("spec.initContainers[{i}].resources");
        let own = c.resources.hugepages(field)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut running, &own, field)?;
            add(&mut sidecars, &own, field)?;
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut with_sidecars = sidecars.clone();
            add(&mut with_sidecars, &own, field)?;
            max_into(&mut init_peak, &with_sidecars);
        }
    }
    max_into(&mut running, &init_peak);
    add(
        &mut running,
        &from_list(&spec.overhead, "spec.overhead")?,
        "spec.overhead",
    )?;
    if let Some(pod_level) = &spec.resources {
        for (size, bytes) in pod_level.hugepages("spec.resources")? {
            running.insert(size, bytes);
        }
    }
    running.retain(|_, bytes| *bytes > 0);
    Ok(PodHugepages {
        containers,
        total: running,
    })
}

/// Adds `more` to `into`, size by size; a sum beyond 64 bits of bytes is an error naming the
/// size's resource and `field`, the value that carried it over (never a saturated figure).
pub fn add(
    into: &mut Hugepages,
    more: &Hugepages,
    field: impl Display,
) -> Result<(), RequestError> {
    for (&size, &bytes) in more {
        let slot = into.entry(size).or_default();
        *slot = slot
            .checked_add(bytes)
            .ok_or_else(|| overflow(&field, &size.resource_name()))?;
    }
    Ok(())
}

fn max_into(into: &mut Hugepages, other: &Hugepages) {
    for (&size, &bytes) in other {
        let slot = into.entry(size).or_default();
        *slot = (*slot).max(bytes);
    }
}

#[cfg(test)]
mod tests;
