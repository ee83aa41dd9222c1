//! The hugetlbfs programs (`raw_tracepoint/hugetlbfs_*`, newer than 6.12): loaded and
//! attached where the kernel has the tracepoints with the prototypes their programs read
//! ([`super::offsets::HUGETLBFS_TRACEPOINTS`]), else left out with the reason, which the agent
//! logs: the walk of the mounts then is the only book of files. A kernel that refuses one of them
//! gets none (each one loaded is unloaded again), so the book never sees half of what happens.

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
    programs::RawTracePoint,
};
use hugepage_agent_common::hugetlbfs::EVENTS_MAP;

use super::{ProbeError, attach_err, load_err, map_err, offsets::HUGETLBFS_TRACEPOINTS, program};

/// The category the attach error names (raw tracepoints are attached by name alone).
const CATEGORY: &str = "hugetlbfs";

/// Loads the programs into the verifier (nothing attached yet).
pub fn load(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    for (name, _) in HUGETLBFS_TRACEPOINTS {
        let loaded =
            program::<RawTracePoint>(ebpf, name).and_then(|p| p.load().map_err(load_err(name)));
        if let Err(err) = loaded {
            unload(ebpf);
            return Err(err);
        }
    }
    Ok(())
}

/// Attaches every program and hands out their ring buffer; on a refusal nothing stays attached.
pub fn attach(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>, ProbeError> {
    let attached = (|| {
        for (name, _) in HUGETLBFS_TRACEPOINTS {
            program::<RawTracePoint>(ebpf, name)?
                .attach(name)
                .map_err(attach_err((name, CATEGORY, name)))?;
        }
        let map = ebpf.take_map(EVENTS_MAP).ok_or(ProbeError::Missing {
            kind: "map",
            name: EVENTS_MAP,
        })?;
        RingBuf::try_from(map).map_err(map_err(EVENTS_MAP))
    })();
    if attached.is_err() {
        unload(ebpf);
    }
    attached
}

/// Unloads (and so detaches) whatever of them is loaded.
fn unload(ebpf: &mut Ebpf) {
    for (name, _) in HUGETLBFS_TRACEPOINTS {
        if let Ok(p) = program::<RawTracePoint>(ebpf, name) {
            // Unloading one that never loaded says so; there is nothing else to undo.
            let _ = p.unload();
        }
    }
}
