//! `POST /v1/hints` (the kubelet's hints and selection for a request on the live Memory Manager
//! state) and `GET /v1/discrepancy` (that state against the kernel, per node and size, with who
//! holds what it does not track). Plain functions of the state; the handlers only map.

use serde::Serialize;

use super::{
    AppState,
    admit::{self, Parsed},
    error::ApiError,
};
use crate::{
    consumers::Consumer,
    holders::Holders,
    kube::pod::RequestError,
    memorymanager::{
        discrepancy::{self, Discrepancy},
        hints::{self, HintError, Hints, PodFacts},
        live::MemoryManagerView,
        selection::{self, Basis, Selection},
    },
};

/// One container's hints.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerHints {
    pub name: String,
    pub hints: Hints,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HintsAnswer {
    /// The pod's hints (pod scope); `null` when the kubelet gives none (not Guaranteed).
    pub hints: Hints,
    /// Each container's hints (container scope), init containers first.
    pub containers: Vec<ContainerHints>,
    /// The selection under the configured (or requested) policy and scope.
    pub selection: Selection,
    #[serde(flatten)]
    pub state: MemoryManagerView,
}

fn request_error(e: RequestError) -> ApiError {
    ApiError::invalid(e.field, e.detail)
}

fn hint_error(e: HintError) -> ApiError {
    match e {
        HintError::Request(e) => request_error(e),
        e @ HintError::TooManyNodes { .. } => ApiError::no_selection(e.to_string()),
        other => ApiError::internal(other.to_string()),
    }
}

/// `POST /v1/hints` for a request ([`admit::parse`]d). The body is read and refused exactly as
/// `POST /v1/admit` reads and refuses it (`numaNodes` included: it must name nodes of this
/// machine, although the hints are the kubelet's for every node).
pub fn hints(state: &AppState, parsed: &Parsed) -> Result<HintsAnswer, ApiError> {
    if let Some(nodes) = &parsed.nodes {
        admit::known_nodes(state, nodes)?;
    }
    let view = state.memory_manager.load();
    let kubelet = state.kubelet.load();
    let pod = &parsed.pod;
    if !kubelet.pins_memory() {
        // The None policy gives no hints: the kubelet pins nothing.
        let containers = pod.spec.init_containers.iter().chain(&pod.spec.containers);
        return Ok(HintsAnswer {
            hints: None,
            containers: containers
                .map(|c| ContainerHints {
                    name: c.name.clone(),
                    hints: None,
                })
                .collect(),
            selection: Selection::unselected(Basis::NodeWide),
            state: (**view).clone(),
        });
    }
    let config = kubelet
        .topology(parsed.policy, parsed.scope)
        .and_then(|config| view.usable().map(|()| config))
        .map_err(ApiError::no_selection)?;
    let gates = config.gates;
    let pod_hints = hints::pod_hints(&view.state, pod, gates).map_err(hint_error)?;
    let facts = PodFacts::of(pod, gates).map_err(request_error)?;
    let all = pod.spec.init_containers.iter().chain(&pod.spec.containers);
    let mut containers = Vec::with_capacity(all.clone().count());
    for c in all {
        containers.push(ContainerHints {
            name: c.name.clone(),
            hints: hints::container_hints(&view.state, pod, &facts, c).map_err(hint_error)?,
        });
    }
    let selection = selection::select(&view.state, pod, config.topology()).map_err(hint_error)?;
    Ok(HintsAnswer {
        hints: pod_hints,
        containers,
        selection,
        state: (**view).clone(),
    })
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscrepancyAnswer {
    #[serde(flatten)]
    pub state: MemoryManagerView,
    /// Why there is nothing to compare, when there is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub nodes: Vec<Discrepancy>,
}

/// `GET /v1/discrepancy`; `consumers` from the cgroup inventory explain it when available.
pub fn discrepancy(
    state: &AppState,
    consumers: Option<&[Consumer]>,
    held: Option<&Holders>,
) -> DiscrepancyAnswer {
    let view = state.memory_manager.load();
    let snapshot = state.map.load();
    if view.source != crate::memorymanager::live::StateSource::Checkpoint {
        return DiscrepancyAnswer {
            note: Some(format!(
                "no usable kubelet Memory Manager checkpoint at {}: without the static policy's state there is no bookkeeping to compare with the kernel",
                view.checkpoint_path.display()
            )),
            state: (**view).clone(),
            nodes: Vec::new(),
        };
    }
    DiscrepancyAnswer {
        nodes: discrepancy::compute(&view.state, &snapshot, consumers, held),
        state: (**view).clone(),
        note: None,
    }
}
