//! What the Memory Manager sees of a pod: its QoS class (from `status.qosClass`, else computed as
//! Kubernetes computes it) and the memory and hugepages each container — or, in pod scope, the
//! pod — requests, by the kubelet's rules. Hugepage resource names are canonical
//! (`hugepages-2048Ki` is `hugepages-2Mi`), as the machine state names them. Field paths are
//! written out only when an error names them, as in [`request`].

use std::{collections::BTreeMap, fmt::Display};

use crate::{
    kube::pod::{self, Container, Pod, QuantityValue, RequestError, ResourceList},
    kubelet::features::FeatureGates,
    quantity,
};

/// Resource name → bytes.
pub type Requested = BTreeMap<String, u64>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The pod's QoS class: `status.qosClass` when set, else computed.
pub fn qos_class(pod: &Pod, gates: FeatureGates) -> Result<QosClass, RequestError> {
    match pod.status.qos_class.as_deref() {
        Some("Guaranteed") => Ok(QosClass::Guaranteed),
        Some("Burstable") => Ok(QosClass::Burstable),
        Some("BestEffort") => Ok(QosClass::BestEffort),
        Some("") | None => compute_qos_class(pod, gates),
        Some(other) => Err(RequestError {
            field: "status.qosClass".into(),
            detail: format!("{other:?} is not Guaranteed, Burstable or BestEffort"),
        }),
    }
}

/// Kubernetes' `ComputePodQOS`: Guaranteed when every container (or, with `PodLevelResources`,
/// the pod-level resources) limits CPU and memory and the requests, where given, equal the
/// limits; BestEffort when nothing asks for CPU or memory; Burstable otherwise.
fn compute_qos_class(pod: &Pod, gates: FeatureGates) -> Result<QosClass, RequestError> {
    let mut requests: BTreeMap<&str, u128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, u128> = BTreeMap::new();
    let mut guaranteed = true;
    let sum = |into: &mut BTreeMap<&'static str, u128>,
               list: &ResourceList,
               field: &dyn Display|
     -> Result<Vec<&'static str>, RequestError> {
        let mut found = Vec::new();
        for name in ["cpu", "memory"] {
            let Some(value) = list.get(name) else {
                continue;
            };
            let amount = nanos(value, format_args!("{field}.{name}"))?;
            if amount > 0 {
                *into.entry(name).or_default() += amount;
                found.push(name);
            }
        }
        Ok(found)
    };
    match (&pod.spec.resources, gates.pod_level_resources) {
        (Some(pod_level), true) => {
            sum(
                &mut requests,
                &pod_level.requests,
                &"spec.resources.requests",
            )?;
            if !pod_level.limits.is_empty() {
                let found = sum(&mut limits, &pod_level.limits, &"spec.resources.limits")?;
                guaranteed &= found.len() == 2;
            }
        }
        _ => {
            let all = pod.spec.containers.iter().enumerate();
            let init = pod.spec.init_containers.iter().enumerate();
            let each = (all.map(|(i, c)| ("containers", i, c)))
                .chain(init.map(|(i, c)| ("initContainers", i, c)));
            for (kind, i, c) in each {
                sum(
                    &mut requests,
                    &c.resources.requests,
                    &format_args!("spec.{kind}[{i}].resources.requests"),
                )?;
                let found = sum(
                    &mut limits,
                    &c.resources.limits,
                    &format_args!("spec.{kind}[{i}].resources.limits"),
                )?;
                guaranteed &= found.len() == 2;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return Ok(QosClass::BestEffort);
    }
    guaranteed &= requests
        .iter()
        .all(|(name, amount)| limits.get(name) == Some(amount));
    if guaranteed && requests.len() == limits.len() {
        Ok(QosClass::Guaranteed)
    } else {
        Ok(QosClass::Burstable)
    }
}

fn nanos(value: &QuantityValue, field: impl Display) -> Result<u128, RequestError> {
    let parsed = match value {
        QuantityValue::Text(text) => quantity::parse_nanos(text),
        QuantityValue::Number(n) => Ok(u128::from(*n) * 1_000_000_000),
    };
    parsed.map_err(|e| RequestError {
        field: field.to_string(),
        detail: e.to_string(),
    })
}

/// The memory and hugepages a container requests (its `requests`; the kubelet's admitted
/// values). A quantity that is not a whole number of bytes is an error, as the kubelet's
/// `AsInt64` refuses it.
pub fn container_requests(
    container: &Container,
    field: impl Display,
) -> Result<Requested, RequestError> {
    list_requests(
        &container.resources.requests,
        format_args!("{field}.resources.requests"),
    )
}

/// What the Memory Manager gives a container exclusively: nothing when the pod's pod-level
/// resources are managed (`PodLevelResourceManagers`) and the container is not itself
/// Guaranteed-like (it then runs in the pod's shared pool), else its requests.
pub fn exclusive_requests(
    pod: &Pod,
    container: &Container,
    gates: FeatureGates,
    field: impl Display + Copy,
) -> Result<Requested, RequestError> {
    if gates.pod_level_resource_managers
        && pod_level_set(pod)
        && !container_guaranteed_like(container, field)?
    {
        return Ok(Requested::new());
    }
    container_requests(container, field)
}

/// `IsPodLevelResourcesSet`: pod-level requests or limits of CPU, memory or hugepages.
pub fn pod_level_set(pod: &Pod) -> bool {
    pod.spec.resources.as_ref().is_some_and(|r| {
        r.requests
            .keys()
            .chain(r.limits.keys())
            .any(|name| name == "cpu" || name == "memory" || name.starts_with("hugepages-"))
    })
}

/// `IsContainerEquivalentQOSGuaranteed`: CPU and memory requested, non-zero, equal to limits.
fn container_guaranteed_like(
    container: &Container,
    field: impl Display + Copy,
) -> Result<bool, RequestError> {
    let r = &container.resources;
    for name in ["cpu", "memory"] {
        let request = r.requests.get(name).map(|v| nanos(v, field)).transpose()?;
        let limit = r.limits.get(name).map(|v| nanos(v, field)).transpose()?;
        match (request, limit) {
            (Some(req), Some(lim)) if req > 0 && req == lim => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

fn list_requests(list: &ResourceList, field: impl Display) -> Result<Requested, RequestError> {
    let mut requested = Requested::new();
    for (name, value) in list {
        let at = format_args!("{field}.{name}");
        let resource = if name == "memory" {
            name.clone()
        } else if let Some(size) = pod::page_size(name, at)? {
            size.resource_name()
        } else {
            continue;
        };
        let amount = nanos(value, at)?;
        if amount % 1_000_000_000 != 0 {
            return Err(RequestError {
                field: at.to_string(),
                detail: "is not a whole number of bytes".into(),
            });
        }
        let bytes = u64::try_from(amount / 1_000_000_000).map_err(|_| RequestError {
            field: at.to_string(),
            detail: "is too large".into(),
        })?;
        requested.insert(resource, bytes);
    }
    Ok(requested)
}

/// The pod's requests in pod scope: sidecars (restartable init containers) run with the app
/// containers and add up; each other init container runs alone beside the sidecars started before
/// it; the larger wins. As in the kubelet, only resources the app containers request are counted.
/// With `PodLevelResourceManagers` and pod-level resources set, the pod-level requests stand
/// instead.
pub fn pod_requests(pod: &Pod, gates: FeatureGates) -> Result<Requested, RequestError> {
    if gates.pod_level_resource_managers
        && pod_level_set(pod)
        && let Some(pod_level) = &pod.spec.resources
    {
        let mut requested = list_requests(&pod_level.requests, "spec.resources.requests")?;
        requested.retain(|_, bytes| *bytes > 0);
        return Ok(requested);
    }
    let mut init_peak = Requested::new();
    let mut sidecars = Requested::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        let field = format_args!("spec.initContainers[{i}]");
        for (name, bytes) in exclusive_requests(pod, c, gates, field)? {
            let running = sidecars.entry(name.clone()).or_default();
            if c.restart_policy.as_deref() == Some("Always") {
                *running += bytes;
            } else {
                let alone = *running + bytes;
                let peak = init_peak.entry(name).or_default();
                *peak = (*peak).max(alone);
            }
        }
    }
    let mut apps = Requested::new();
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let field = format_args!("spec.containers[{i}]");
        for (name, bytes) in exclusive_requests(pod, c, gates, field)? {
            *apps.entry(name).or_default() += bytes;
        }
    }
    Ok(apps
        .into_iter()
        .map(|(name, bytes)| {
            let long_running = bytes + sidecars.get(&name).copied().unwrap_or(0);
            let init = init_peak.get(&name).copied().unwrap_or(0);
            (name, long_running.max(init))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    #[test]
    fn a_bad_value_in_an_init_container_names_that_init_container() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "init", "resources": {"requests": {"memory": "lots"}}}],
        }}));
        let err = qos_class(&p, FeatureGates::default()).expect_err("not a quantity");
        assert_eq!(
            err.field,
            "spec.initContainers[0].resources.requests.memory"
        );
    }

    #[test]
    fn qos_is_computed_over_app_and_init_containers() {
        let guaranteed = serde_json::json!({"cpu": "1", "memory": "1Gi"});
        let p = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a", "resources": {"requests": guaranteed, "limits": guaranteed}}],
            "initContainers": [{"name": "init", "resources": {"requests": {"memory": "1Gi"}}}],
        }}));
        assert_eq!(
            qos_class(&p, FeatureGates::default()),
            Ok(QosClass::Burstable)
        );
        let p = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a", "resources": {"requests": guaranteed, "limits": guaranteed}}],
        }}));
        assert_eq!(
            qos_class(&p, FeatureGates::default()),
            Ok(QosClass::Guaranteed)
        );
    }
}
