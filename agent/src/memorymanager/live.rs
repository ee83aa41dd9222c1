//! The Memory Manager state the running agent selects NUMA nodes with: the kubelet's checkpoint
//! when there is one (re-read whenever the file changes; a corrupt or mismatched file is refused
//! whole, said once in the log and in the view, and the agent falls back), else the state the
//! kubelet would start from, built from sysfs, node meminfo and the kubelet's reserved memory.
//! [`LiveState`] keeps it current for the running agent (published through an atomic pointer
//! that admissions read) and says how far it is from the kernel: the discrepancy per node and
//! size, for the gauge.
//!
//! A state that cannot be built at all (the kubelet's reserved memory more than a node has, or
//! on a resource it does not have: the kubelet itself would not start with it) leaves the agent
//! running with an empty state that says why ([`MemoryManagerView::unusable`]): NUMA selection
//! is refused saying so, and everything else goes on (#40).

use std::{os::unix::fs::MetadataExt, path::PathBuf, sync::Arc, time::SystemTime};

use arc_swap::ArcSwap;
use serde::Serialize;
use tracing::{info, warn};

use super::{
    checkpoint::{self, Verification},
    discrepancy::{self, Discrepancy},
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
    /// Why there is no state to select with, when none could be built (the state is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
    /// Per NUMA node: each resource's table and the node's group (`cells`).
    #[serde(rename = "machineState", serialize_with = "machine_state")]
    pub state: MemoryManagerState,
    #[serde(serialize_with = "rfc3339")]
    pub loaded_at: SystemTime,
}

impl MemoryManagerView {
    /// Nothing, when the state can be selected with; else why not.
    pub fn usable(&self) -> Result<(), String> {
        match &self.unusable {
            None => Ok(()),
            Some(why) => Err(format!("the Memory Manager's state: {why}")),
        }
    }
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

    /// An empty state that says why none could be built (`err`).
    fn unusable(&self, err: &machine::MachineError) -> MemoryManagerView {
        MemoryManagerView {
            source: StateSource::Sysfs,
            checkpoint_path: self.path.clone(),
            checkpoint_error: None,
            unusable: Some(err.to_string()),
            state: MemoryManagerState::default(),
            loaded_at: SystemTime::now(),
        }
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
                        unusable: None,
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
            unusable: None,
            state: MemoryManagerState {
                policy_name: "Static".into(),
                machine_state,
                ..MemoryManagerState::default()
            },
            loaded_at: SystemTime::now(),
        })
    }
}

/// The view the running agent selects with, kept current: re-read when the checkpoint changes,
/// and on every reconcile while it is built from the pools (it follows them).
pub struct LiveState {
    loader: StateLoader,
    view: Arc<ArcSwap<MemoryManagerView>>,
}

impl LiveState {
    /// Loads the first view (logged); one that cannot be built is an empty one saying why.
    pub fn load(mut loader: StateLoader, snapshot: &Snapshot) -> LiveState {
        let view = loader
            .load(snapshot)
            .unwrap_or_else(|err| loader.unusable(&err));
        log_view(&view);
        LiveState {
            loader,
            view: Arc::new(ArcSwap::from_pointee(view)),
        }
    }

    /// The published view, for the readers (admission, hints, the discrepancy endpoint).
    pub fn reader(&self) -> Arc<ArcSwap<MemoryManagerView>> {
        self.view.clone()
    }

    /// New reserved memory (the kubelet's settings changed): the view is read again if it differs.
    pub fn set_reserved(&mut self, reserved: &ReservedMemory, snapshot: &Snapshot) {
        if &self.loader.reserved != reserved {
            self.loader.reserved = reserved.clone();
            self.reload(snapshot);
        }
    }

    /// Whether the checkpoint file changed since the last load.
    pub fn checkpoint_changed(&self) -> bool {
        self.loader.changed()
    }

    /// Whether the view follows the pools (no usable checkpoint): reconciles reload it.
    pub fn follows_pools(&self) -> bool {
        self.view.load().source == StateSource::Sysfs
    }

    /// Re-reads the view; a failure keeps the last good one (logged), or replaces an unusable
    /// one with why now. A change of source or of the checkpoint's verdict is logged, and every
    /// checkpoint read.
    pub fn reload(&mut self, snapshot: &Snapshot) {
        let before = self.view.load();
        match self.loader.load(snapshot) {
            Ok(view) => {
                if view.source != before.source
                    || view.checkpoint_error != before.checkpoint_error
                    || view.unusable != before.unusable
                    || view.source == StateSource::Checkpoint
                {
                    log_view(&view);
                }
                self.view.store(Arc::new(view));
            }
            Err(err) if before.unusable.is_some() => {
                let view = self.loader.unusable(&err);
                if view.unusable != before.unusable {
                    log_view(&view);
                }
                self.view.store(Arc::new(view));
            }
            Err(err) => warn!("re-reading the Memory Manager state: {err}; keeping the last one"),
        }
    }

    /// The checkpoint's free bytes against the kernel's, per node and size; `None` without a
    /// usable checkpoint (the state built from the pools has no discrepancy to show).
    pub fn discrepancy(&self, snapshot: &Snapshot) -> Option<Vec<Discrepancy>> {
        let view = self.view.load();
        (view.source == StateSource::Checkpoint)
            .then(|| discrepancy::compute(&view.state, snapshot, None, None))
    }
}

fn log_view(view: &MemoryManagerView) {
    if let Some(why) = &view.unusable {
        warn!(
            "the Memory Manager's state cannot be built: {why}; the agent goes on, and admissions that need the kubelet's NUMA selection are refused saying so"
        );
        return;
    }
    match (&view.source, &view.checkpoint_error) {
        (StateSource::Checkpoint, _) => info!(
            path = %view.checkpoint_path.display(),
            nodes = view.state.machine_state.len(),
            pods = view.state.entries.len(),
            "Memory Manager state read from the kubelet's checkpoint"
        ),
        (StateSource::Sysfs, Some(err)) => warn!(
            "the kubelet's checkpoint is refused: {err}; NUMA selection uses the state built from sysfs"
        ),
        (StateSource::Sysfs, None) => info!(
            path = %view.checkpoint_path.display(),
            "no kubelet Memory Manager checkpoint: NUMA selection uses the state built from sysfs and the kubelet's reserved memory"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        memorymanager::{checkpoint::to_kubelet_json, testing},
        numa::map::{MapWriter, Source},
        sysfs::fake,
    };

    /// One node with 8 free 2 MiB pages of 8, and 16 GiB of memory.
    fn host() -> (tempfile::TempDir, HostFs, Arc<Snapshot>) {
        let pool = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";
        let (dir, host) = fake::tree(&[
            ("/sys/devices/system/node/online", "0\n"),
            ("/sys/devices/system/node/node0/cpulist", "0\n"),
            ("/sys/devices/system/node/node0/distance", "10\n"),
            (
                "/sys/devices/system/node/node0/meminfo",
                "Node 0 MemTotal:       16777216 kB\n",
            ),
            (&format!("{pool}/nr_hugepages"), "8\n"),
            (&format!("{pool}/free_hugepages"), "8\n"),
            (&format!("{pool}/surplus_hugepages"), "0\n"),
        ]);
        let (writer, _) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
        let snapshot = writer.current();
        (dir, host, snapshot)
    }

    #[test]
    fn without_a_checkpoint_the_view_follows_the_pools_and_shows_no_discrepancy() {
        let (dir, host, snapshot) = host();
        let path = dir.path().join("memory_manager_state");
        let live = LiveState::load(
            StateLoader::new(host, path, ReservedMemory::default()),
            &snapshot,
        );
        assert!(live.follows_pools());
        assert!(!live.checkpoint_changed());
        assert!(live.discrepancy(&snapshot).is_none());
    }

    #[test]
    fn a_checkpoint_that_appears_is_noticed_read_and_compared_with_the_kernel() {
        let (dir, host, snapshot) = host();
        let path = dir.path().join("memory_manager_state");
        let mut live = LiveState::load(
            StateLoader::new(host, path.clone(), ReservedMemory::default()),
            &snapshot,
        );
        let reader = live.reader();
        // The kubelet believes 10 pages are free where the kernel has 8.
        let state = testing::state(vec![(
            0,
            testing::node(&[("hugepages-2Mi", 10 << 21, 10 << 21)], &[0], 0),
        )]);
        std::fs::write(&path, to_kubelet_json(&state)).expect("checkpoint");
        assert!(live.checkpoint_changed());
        live.reload(&snapshot);
        assert_eq!(reader.load().source, StateSource::Checkpoint);
        assert!(!live.follows_pools());
        let d = live
            .discrepancy(&snapshot)
            .expect("a checkpoint to compare");
        let two_mi = d
            .iter()
            .find(|d| d.resource == "hugepages-2Mi")
            .expect("2Mi");
        assert_eq!(two_mi.discrepancy_bytes, 2 << 21);
    }

    /// Bug (#40): reserved memory beyond what a node has stopped the agent at start.
    #[test]
    fn reserved_memory_the_machine_cannot_hold_is_an_unusable_state_until_it_can() {
        let (dir, host, snapshot) = host();
        let path = dir.path().join("memory_manager_state");
        let too_much = ReservedMemory::from([(0, BTreeMap::from([("memory".into(), 1 << 40)]))]);
        let mut live = LiveState::load(StateLoader::new(host, path, too_much), &snapshot);
        let reader = live.reader();
        let view = reader.load();
        assert_eq!(
            view.unusable.as_deref(),
            Some(
                "the kubelet's reserved memory reserves 1Ti of memory on NUMA node 0, more than its 16368Mi"
            )
        );
        assert!(view.state.machine_state.is_empty());
        live.set_reserved(&ReservedMemory::default(), &snapshot);
        let view = reader.load();
        assert_eq!(view.unusable, None);
        assert_eq!(view.state.machine_state.len(), 1);
    }
}
