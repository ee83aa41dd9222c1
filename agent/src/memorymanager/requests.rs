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

#[cfg(test)]
thread_local! {
    /// How many times this thread computed a QoS class: the tests count work with it.
    pub static QOS_COMPUTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Kubernetes' `ComputePodQOS`: Guaranteed when every container (or, with `PodLevelResources`,
/// the pod-level resources) limits CPU and memory and the requests, where given, equal the
/// limits; BestEffort when nothing asks for CPU or memory; Burstable otherwise.
fn compute_qos_class(pod: &Pod, gates: FeatureGates) -> Result<QosClass, RequestError> {
    #[cfg(test)]
    QOS_COMPUTED.with(|n| n.set(n.get() + 1));
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
                let total = into.entry(name).or_default();
                *total = total.checked_add(amount).ok_or_else(|| RequestError {
                    field: field.to_string(),
                    detail: format!(
                        "the pod's total of {name} is beyond what the agent can add up"
                    ),
                })?;
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

/// Each container's requests ([`container_requests`]), init containers first, read once for a
/// pod that is selected on many states (the webhook's table: every candidate node): what depends
/// on the pod alone is not read again for each. A container's error stays with it, an error only
/// where a selection reads that container's requests. Empty (the default), each container's
/// requests are read where a selection needs them.
#[derive(Debug, Clone, Default)]
pub struct ContainerRequests(Vec<Result<Requested, RequestError>>);

impl ContainerRequests {
    pub fn of(pod: &Pod) -> ContainerRequests {
        let all = pod.spec.init_containers.iter().chain(&pod.spec.containers);
        ContainerRequests(
            all.map(|c| container_requests(c, format_args!("container {:?}", c.name)))
                .collect(),
        )
    }

    /// The requests of the container at `index` (init containers first), if read.
    pub fn get(&self, index: usize) -> Option<&Result<Requested, RequestError>> {
        self.0.get(index)
    }
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
    if !has_exclusive(pod, container, gates, field)? {
        return Ok(Requested::new());
    }
    container_requests(container, field)
}

/// Whether the Memory Manager gives a container its requests exclusively ([`exclusive_requests`]),
/// rather than running it in the pod's shared pool.
pub fn has_exclusive(
    pod: &Pod,
    container: &Container,
    gates: FeatureGates,
    field: impl Display + Copy,
) -> Result<bool, RequestError> {
    Ok(!(gates.pod_level_resource_managers
        && pod_level_set(pod)
        && !container_guaranteed_like(container, field)?))
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
/// instead. A total beyond 64 bits of bytes is an error naming the resource, at the container
/// that carried it over.
pub fn pod_requests(pod: &Pod, gates: FeatureGates) -> Result<Requested, RequestError> {
    if gates.pod_level_resource_managers
        && pod_level_set(pod)
        && let Some(pod_level) = &pod.spec.resources
    {
        let mut requested = list_requests(&pod_level.requests, "spec.resources.requests")?;
        requested.retain(|_, bytes| *bytes > 0);
        return Ok(requested);
    }
    // Read in the kubelet's order (init containers first): the first bad value is the one named.
    let init = pod.spec.init_containers.iter().enumerate();
    let init: Vec<Requested> = init
        .map(|(i, c)| exclusive_requests(pod, c, gates, format_args!("spec.initContainers[{i}]")))
        .collect::<Result<_, _>>()?;
    let mut apps = Requested::new();
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let field = format_args!("spec.containers[{i}]");
        let at = format_args!("{field}.resources.requests");
        for (name, bytes) in exclusive_requests(pod, c, gates, field)? {
            add(&mut apps, name, bytes, at)?;
        }
    }
    let mut long_running = apps.clone();
    let mut sidecars = Requested::new();
    let mut init_peak = Requested::new();
    for ((i, c), own) in pod.spec.init_containers.iter().enumerate().zip(init) {
        let at = format_args!("spec.initContainers[{i}].resources.requests");
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        for (name, bytes) in own {
            if sidecar {
                add(&mut long_running, name.clone(), bytes, at)?;
                add(&mut sidecars, name, bytes, at)?;
            } else {
                let before = sidecars.get(&name).copied().unwrap_or(0);
                let alone = before
                    .checked_add(bytes)
                    .ok_or_else(|| pod::overflow(at, &name))?;
                let peak = init_peak.entry(name).or_default();
                *peak = (*peak).max(alone);
            }
        }
    }
    Ok(apps
        .into_keys()
        .map(|name| {
            let running = long_running.get(&name).copied().unwrap_or(0);
            let init = init_peak.get(&name).copied().unwrap_or(0);
            (name, running.max(init))
        })
        .collect())
}

/// `into[name] += bytes`; a total beyond 64 bits of bytes is an error naming the resource and
/// `field`, the value that carried it over.
pub fn add(
    into: &mut Requested,
    name: String,
    bytes: u64,
    field: impl Display,
) -> Result<(), RequestError> {
    let before = into.get(&name).copied().unwrap_or(0);
    let total = before
        .checked_add(bytes)
        .ok_or_else(|| pod::overflow(&field, &name))?;
    into.insert(name, total);
    Ok(())
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

    /// The requests read once are each container's, init containers first, and a value that
    /// does not read is that container's error alone, naming it as a selection names it.
    #[test]
    fn container_requests_read_once_are_each_containers_own() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"memory": "1Gi", "hugepages-2048Ki": "4Mi"}}},
                {"name": "b", "resources": {"requests": {"memory": "lots"}}},
            ],
            "initContainers": [{"name": "init", "resources": {"requests": {"memory": "2Mi"}}}],
        }}));
        let read = ContainerRequests::of(&p);
        let each = |i: usize| read.get(i).cloned();
        assert_eq!(
            each(0),
            Some(Ok(Requested::from([("memory".into(), 2 << 20)])))
        );
        assert_eq!(
            each(1),
            Some(Ok(Requested::from([
                ("hugepages-2Mi".into(), 4 << 20),
                ("memory".into(), 1 << 30)
            ])))
        );
        let direct = container_requests(&p.spec.containers[1], "container \"b\"");
        assert_eq!(each(2), Some(direct));
        assert!(
            matches!(each(2), Some(Err(e)) if e.field == "container \"b\".resources.requests.memory")
        );
        assert_eq!(each(3), None);
    }

    /// A Guaranteed pod of `n` containers asking `memory` each, and 1 CPU.
    fn wide(n: usize, memory: &str) -> Pod {
        let list = serde_json::json!({"cpu": "1", "memory": memory});
        let containers: Vec<serde_json::Value> = (0..n)
            .map(|i| serde_json::json!({"name": format!("c-{i}"), "resources": {"requests": list, "limits": list}}))
            .collect();
        pod(serde_json::json!({"spec": {"containers": containers}}))
    }

    /// Bug (#23): the pod's requests were summed with `+`, which wraps in a release build (a
    /// panic in a debug one). A total beyond 64 bits of bytes names the resource.
    #[test]
    fn pod_requests_that_overflow_64_bits_name_the_resource() {
        let gates = FeatureGates::default();
        assert_eq!(
            pod_requests(&wide(2, "8000Pi"), gates).map(|r| r["memory"]),
            Ok(16000 << 50)
        );
        let err = pod_requests(&wide(3, "8000Pi"), gates).expect_err("beyond 64 bits");
        assert_eq!(err.field, "spec.containers[2].resources.requests");
        assert_eq!(
            err.detail,
            "the pod's total of memory overflows 64 bits of bytes"
        );
        let memory = |m: &str| serde_json::json!({"requests": {"memory": m}});
        let sidecars = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a", "resources": memory("8000Pi")}],
            "initContainers": [
                {"name": "s1", "restartPolicy": "Always", "resources": memory("8000Pi")},
                {"name": "s2", "restartPolicy": "Always", "resources": memory("8000Pi")},
            ],
        }}));
        let err = pod_requests(&sidecars, gates).expect_err("app and sidecars beyond 64 bits");
        assert_eq!(err.field, "spec.initContainers[1].resources.requests");
        // An ordinary init container runs beside the sidecars started before it.
        let beside = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a", "resources": memory("1Mi")}],
            "initContainers": [
                {"name": "s1", "restartPolicy": "Always", "resources": memory("8000Pi")},
                {"name": "s2", "restartPolicy": "Always", "resources": memory("8000Pi")},
                {"name": "i", "resources": memory("8000Pi")},
            ],
        }}));
        let err = pod_requests(&beside, gates).expect_err("init beside sidecars beyond 64 bits");
        assert_eq!(err.field, "spec.initContainers[2].resources.requests");
        assert_eq!(
            err.detail,
            "the pod's total of memory overflows 64 bits of bytes"
        );
    }

    /// Bug (#23): the QoS class summed CPU and memory of every container with `+` on 128 bits,
    /// which wraps in a release build; a total beyond them is an error naming the resource.
    #[test]
    fn a_qos_total_that_overflows_names_the_resource() {
        let cores = "100000000000000000000000000000";
        let list = serde_json::json!({"cpu": cores, "memory": "1Gi"});
        let container = serde_json::json!({"resources": {"requests": list, "limits": list}});
        let p = pod(serde_json::json!({"spec": {"containers": [container, container]}}));
        assert_eq!(
            qos_class(&p, FeatureGates::default()),
            Ok(QosClass::Guaranteed)
        );
        let p = pod(
            serde_json::json!({"spec": {"containers": [container, container, container, container]}}),
        );
        let err = qos_class(&p, FeatureGates::default()).expect_err("beyond 128 bits");
        assert_eq!(err.field, "spec.containers[3].resources.requests");
        assert_eq!(
            err.detail,
            "the pod's total of cpu is beyond what the agent can add up"
        );
    }
}
