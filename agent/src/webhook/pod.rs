//! The pod the scheduler sends, read once per call: its hugepages by the kubelet's rules
//! ([`crate::kube::pod::pod_hugepages`]), its containers' requests as the Memory Manager reads
//! them ([`ContainerRequests`]), and the body of the dry run every agent is asked,
//! built once: the `v1.Pod` cut to what the agent reads (metadata's namespace, name and uid;
//! the containers' and init containers' names, resources and restart policies; overhead and
//! pod-level resources; the QoS class), so a pod's images, environment and managed fields are
//! not sent a thousand times.

use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{
    kube::pod::{Hugepages, Pod, PodHugepages, pod_hugepages},
    memorymanager::requests::ContainerRequests,
};

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
    /// Its UID (its own reservation is not counted against it).
    pub uid: String,
    /// The pod as the agent reads it, and its hugepages per container and in all ([`Self::need`]):
    /// what the kubelet's NUMA selection takes when the webhook runs it on a streamed state.
    pub pod: Pod,
    pub pages: PodHugepages,
    /// Its containers' requests as the Memory Manager reads them, read once for every node.
    pub requests: ContainerRequests,
    /// The `POST /v1/admit?dryRun=true` body.
    pub body: Bytes,
}

impl PodRequest {
    /// The pod's hugepages need per page size; empty when it asks for none.
    pub fn need(&self) -> &Hugepages {
        &self.pages.total
    }
}

/// Reads the scheduler's pod from its text.
pub fn read(pod: Option<&RawValue>) -> Result<PodRequest, PodError> {
    let text = pod.ok_or(PodError::Missing)?.get();
    let unreadable = |e: serde_json::Error| PodError::Unreadable(e.to_string());
    let parsed: Pod = serde_json::from_str(text).map_err(unreadable)?;
    let pages = pod_hugepages(&parsed.spec).map_err(|e| PodError::Unreadable(e.to_string()))?;
    let for_agent: ForAgent<'_> = serde_json::from_str(text).map_err(unreadable)?;
    let body = serde_json::to_vec(&for_agent).map_err(unreadable)?;
    Ok(PodRequest {
        name: format!("{}/{}", parsed.metadata.namespace, parsed.metadata.name),
        uid: parsed.metadata.uid.clone(),
        requests: ContainerRequests::of(&parsed),
        pod: parsed,
        pages,
        body: Bytes::from(body),
    })
}

/// A field's value as it was sent.
type Raw<'a> = Option<&'a RawValue>;

/// The fields of a pod the agent reads, and no others, borrowed from the pod's text: what a
/// field of another shape holds is passed on for the agent to judge. A field left out is left
/// out; the lists and objects of `spec` are written `null` when absent.
#[derive(Deserialize, Serialize)]
struct ForAgent<'a> {
    #[serde(borrow, default)]
    metadata: Picked<Meta<'a>>,
    #[serde(borrow, default)]
    spec: Picked<Spec<'a>>,
    #[serde(borrow, default)]
    status: Picked<Status<'a>>,
}

/// An object's fields of interest, or none when it is not an object.
#[derive(Serialize)]
#[serde(transparent)]
struct Picked<T>(T);

impl<T: Default> Default for Picked<T> {
    fn default() -> Picked<T> {
        Picked(T::default())
    }
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Picked<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Picked<T>, D::Error> {
        let raw = <&RawValue>::deserialize(d)?;
        Ok(Picked(serde_json::from_str(raw.get()).unwrap_or_default()))
    }
}

#[derive(Default, Deserialize, Serialize)]
struct Meta<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    namespace: Raw<'a>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    name: Raw<'a>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    uid: Raw<'a>,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    #[serde(borrow, default)]
    containers: Option<Vec<Picked<ContainerForAgent<'a>>>>,
    #[serde(borrow, default)]
    init_containers: Option<Vec<Picked<ContainerForAgent<'a>>>>,
    #[serde(borrow, default)]
    overhead: Raw<'a>,
    #[serde(borrow, default)]
    resources: Raw<'a>,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerForAgent<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    name: Raw<'a>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    resources: Raw<'a>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    restart_policy: Raw<'a>,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Status<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    qos_class: Raw<'a>,
}
