//! The pod the scheduler sends, read once per call: its hugepages by the kubelet's rules
//! ([`crate::kube::pod::pod_hugepages`]), and the body of the dry run every agent is asked,
//! built once: the `v1.Pod` cut to what the agent reads (metadata's namespace, name and uid;
//! the containers' and init containers' names, resources and restart policies; overhead and
//! pod-level resources; the QoS class), so a pod's images, environment and managed fields are
//! not sent a thousand times.

use hyper::body::Bytes;
use serde_json::{Map, Value, json};

use crate::kube::pod::{Hugepages, Pod, pod_hugepages};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("the ExtenderArgs have no pod")]
    Missing,
    #[error("pod: {0}")]
    Unreadable(String),
}

/// The pod of one scheduler call.
#[derive(Debug, Clone)]
pub struct PodRequest {
    /// `namespace/name`, for the log.
    pub name: String,
    /// The pod's hugepages need per page size; empty when it asks for none.
    pub need: Hugepages,
    /// The `POST /v1/admit?dryRun=true` body.
    pub body: Bytes,
}

/// Reads the scheduler's pod.
pub fn read(pod: Option<&Value>) -> Result<PodRequest, PodError> {
    let value = pod.ok_or(PodError::Missing)?;
    let parsed: Pod =
        serde_json::from_value(value.clone()).map_err(|e| PodError::Unreadable(e.to_string()))?;
    let need = pod_hugepages(&parsed.spec)
        .map_err(|e| PodError::Unreadable(e.to_string()))?
        .total;
    let body = serde_json::to_vec(&for_agent(value)).unwrap_or_default();
    Ok(PodRequest {
        name: format!("{}/{}", parsed.metadata.namespace, parsed.metadata.name),
        need,
        body: Bytes::from(body),
    })
}

/// The fields of `pod` the agent reads, and no others.
fn for_agent(pod: &Value) -> Value {
    let pick = |from: Option<&Value>, keys: &[&str]| -> Value {
        let mut out = Map::new();
        for key in keys {
            if let Some(v) = from.and_then(|f| f.get(*key)) {
                out.insert((*key).to_owned(), v.clone());
            }
        }
        Value::Object(out)
    };
    let containers = |key: &str| -> Value {
        match pod
            .pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
        {
            Some(list) => list
                .iter()
                .map(|c| pick(Some(c), &["name", "resources", "restartPolicy"]))
                .collect(),
            None => Value::Null,
        }
    };
    let spec = pod.get("spec");
    json!({
        "metadata": pick(pod.get("metadata"), &["namespace", "name", "uid"]),
        "spec": {
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
            "overhead": spec.and_then(|s| s.get("overhead")).cloned().unwrap_or(Value::Null),
            "resources": spec.and_then(|s| s.get("resources")).cloned().unwrap_or(Value::Null),
        },
        "status": pick(pod.get("status"), &["qosClass"]),
    })
}
