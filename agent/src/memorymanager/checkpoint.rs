//! The kubelet's Memory Manager checkpoint (interim reader: parses the state; the checksum
//! verification lands with the checkpoint module proper).

use std::path::Path;

use serde::Deserialize;

use super::state::{ContainerAssignments, MachineState, MemoryManagerState, PodAssignments};
use crate::kubelet::features::FeatureGates;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {detail}")]
    Json { path: String, detail: String },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawState {
    #[serde(default)]
    policy_name: String,
    machine_state: MachineState,
    #[serde(default)]
    entries: ContainerAssignments,
    #[serde(default)]
    pod_entries: PodAssignments,
}

/// Parses a checkpoint or a hand-written state.
pub fn parse(
    path: &Path,
    bytes: &[u8],
    _gates: FeatureGates,
) -> Result<MemoryManagerState, CheckpointError> {
    let raw: RawState = serde_json::from_slice(bytes).map_err(|e| CheckpointError::Json {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok(MemoryManagerState {
        policy_name: raw.policy_name,
        machine_state: raw.machine_state,
        entries: raw.entries,
        pod_entries: raw.pod_entries,
    })
}
