//! The Memory Manager state the running agent selects NUMA nodes with: the kubelet's checkpoint
//! when there is one (re-read whenever the file changes; a corrupt or mismatched file is refused
//! whole, said once in the log and in the view, and the agent falls back), else the state the
//! kubelet would start from, built from sysfs, node meminfo and `--reserved-memory`.

use std::{os::unix::fs::MetadataExt, path::PathBuf, time::SystemTime};

use serde::Serialize;

use super::{
    checkpoint::{self, Verification},
    machine::{self, ReservedMemory},
    state::MemoryManagerState,
};
use crate::{numa::map::Snapshot, sysfs::HostFs};

/// Where the state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateSource {
    Checkpoint,
    Sysfs,
}

/// The state and where it came from.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryManagerView {
    pub source: StateSource,
    pub checkpoint_path: PathBuf,
    /// Why the checkpoint was not used, when it exists but was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_error: Option<String>,
    /// Per NUMA node: each resource's table and the node's group (`cells`).
    #[serde(rename = "machineState", serialize_with = "machine_state")]
    pub state: MemoryManagerState,
    #[serde(serialize_with = "rfc3339")]
    pub loaded_at: SystemTime,
}

fn machine_state<S: serde::Serializer>(
    state: &MemoryManagerState,
    s: S,
) -> Result<S::Ok, S::Error> {
    state.machine_state.serialize(s)
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string())
}

/// Identity of the checkpoint file's content as far as `stat` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

/// Loads the view and notices when the checkpoint changes.
#[derive(Debug)]
pub struct StateLoader {
    host: HostFs,
    path: PathBuf,
    reserved: ReservedMemory,
    /// The checkpoint as last read (`None`: absent).
    stamp: Option<Option<Stamp>>,
}

impl StateLoader {
    pub fn new(host: HostFs, path: PathBuf, reserved: ReservedMemory) -> Self {
        StateLoader {
            host,
            path,
            reserved,
            stamp: None,
        }
    }

    fn stamp(&self) -> Option<Stamp> {
        let meta = std::fs::metadata(&self.path).ok()?;
        Some(Stamp {
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }

    /// Whether the checkpoint file changed (appeared, went, or was rewritten) since the last load.
    pub fn changed(&self) -> bool {
        self.stamp != Some(self.stamp())
    }

    /// Reads the state afresh: the checkpoint if present and sound, else the state built from the
    /// host (pools from `snapshot`). Errors are those of the host reads or `--reserved-memory`.
    pub fn load(
        &mut self,
        snapshot: &Snapshot,
    ) -> Result<MemoryManagerView, machine::MachineError> {
        let stamp = self.stamp();
        self.stamp = Some(stamp);
        let mut checkpoint_error = None;
        if stamp.is_some() {
            match std::fs::read(&self.path)
                .map_err(|e| format!("{}: {e}", self.path.display()))
                .and_then(|bytes| {
                    checkpoint::parse(&self.path, &bytes, Verification::Kubelet)
                        .map_err(|e| e.to_string())
                }) {
                Ok(state) => {
                    return Ok(MemoryManagerView {
                        source: StateSource::Checkpoint,
                        checkpoint_path: self.path.clone(),
                        checkpoint_error: None,
                        state,
                        loaded_at: SystemTime::now(),
                    });
                }
                Err(e) => checkpoint_error = Some(e),
            }
        }
        let nodes = machine::read_nodes(&self.host, snapshot)?;
        let machine_state = machine::initial_state(&nodes, &self.reserved)?;
        Ok(MemoryManagerView {
            source: StateSource::Sysfs,
            checkpoint_path: self.path.clone(),
            checkpoint_error,
            state: MemoryManagerState {
                policy_name: "Static".into(),
                machine_state,
                ..MemoryManagerState::default()
            },
            loaded_at: SystemTime::now(),
        })
    }
}
