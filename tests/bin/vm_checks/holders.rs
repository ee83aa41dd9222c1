//! Hugepages held by nothing that runs, on four nodes (#37): a file of a hugetlbfs mount whose
//! 3 pages this process bound to node 2 and then kept nothing of, a file of one 1 GiB page
//! bound to node 3 the same way, and a SysV segment of 2 pages bound to node 3, touched and
//! detached. `/v1/consumers` names each file held by nothing that runs with its pages on its
//! node (asked of the kernel through the agent's own mapping), and the segment held by nothing
//! that runs with no node (nothing attaches it), known to be hugepages' by the faults the
//! shared agent's probes saw taken in it. The probes' book names this process as the one that
//! faulted the file's pages, and, on kernels with the hugetlbfs tracepoints (newer than 6.12),
//! as the one that made the file; on 6.1 nobody is named as its maker (the check says which).
//! The shared agent loaded the task iterators of the holders' walk (#45): the kernel's verifier
//! took both programs.

use hugepage_agent_tests::{
    Agent, HostLock, http,
    hugetlbfs::{Mounted, Segment, left_behind},
};
use serde_json::Value;

use crate::{CheckResult, sysfs};

const FILE_PAGES: u64 = 3;
const FILE_NODE: usize = 2;
const SEGMENT_PAGES: u64 = 2;
const SEGMENT_NODE: usize = 3;

pub fn orphans(lock: &HostLock, agent: &mut Agent) -> CheckResult {
    let mount = Mounted::new(lock, "pagesize=2M", None);
    let file = mount.path("rtemap_0");
    left_behind(&file, FILE_PAGES, sysfs::SIZE_2M, Some(FILE_NODE));
    let gigantic = Mounted::new(lock, "pagesize=1G", None);
    let one_gig = gigantic.path("rtemap_1g");
    left_behind(&one_gig, 1, sysfs::SIZE_1G, Some(SEGMENT_NODE));
    let mut segment = Segment::touched(SEGMENT_PAGES, SEGMENT_PAGES, Some(SEGMENT_NODE));
    segment.detach();
    let (status, body) = http(agent.port, "GET", "/v1/consumers", None, "");
    if status != 200 {
        return Err(format!("GET /v1/consumers: {status} {body}"));
    }
    let answer: Value = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}"))?;
    let holders = answer["holders"].as_array().cloned().unwrap_or_default();
    let path = file.to_string_lossy().into_owned();
    let f = holders
        .iter()
        .find(|h| h["path"] == path.as_str())
        .ok_or_else(|| format!("{path} is not among the holders: {body}"))?;
    let want = FILE_PAGES * sysfs::SIZE_2M;
    let on_node = f["perNode"][FILE_NODE.to_string()].as_u64();
    if f["heldByNothingThatRuns"] != true
        || f["heldBytes"] != want
        || f["nodesFrom"] != "queried"
        || on_node != Some(want)
        || f["perNode"].as_object().map(|n| n.len()) != Some(1)
    {
        return Err(format!(
            "the file: expected {want} bytes held by nothing that runs, all on node {FILE_NODE} (queried): {f}"
        ));
    }
    let path_1g = one_gig.to_string_lossy().into_owned();
    let g = holders
        .iter()
        .find(|h| h["path"] == path_1g.as_str())
        .ok_or_else(|| format!("{path_1g} is not among the holders: {body}"))?;
    if g["heldByNothingThatRuns"] != true
        || g["heldBytes"] != sysfs::SIZE_1G
        || g["pageSizeBytes"] != sysfs::SIZE_1G
        || g["perNode"][SEGMENT_NODE.to_string()] != sysfs::SIZE_1G
    {
        return Err(format!(
            "the 1 GiB file: expected its page held by nothing that runs on node {SEGMENT_NODE}: {g}"
        ));
    }
    let me = std::process::id();
    let seen = &f["probes"];
    if seen["faults"] != FILE_PAGES || seen["firstFaultBy"]["pid"] != me {
        return Err(format!(
            "the file: expected the probes to have seen this process ({me}) take its {FILE_PAGES} faults: {f}"
        ));
    }
    let tracepoints = hugepage_agent_tests::kernel_has_hugetlbfs_tracepoints()
        .map_err(|e| format!("kernel BTF: {e}"))?;
    let maker = seen["madeBy"]["pid"].as_u64();
    let made = match (tracepoints, maker) {
        (true, Some(pid)) if pid == u64::from(me) => "made by this process (hugetlbfs_alloc_inode)",
        (false, None) => "no maker named (this kernel has no hugetlbfs tracepoints)",
        _ => {
            return Err(format!(
                "the file: hugetlbfs tracepoints {tracepoints}, expected its maker named exactly where they are: {f}"
            ));
        }
    };
    let seg_bytes = SEGMENT_PAGES * sysfs::SIZE_2M;
    let s = holders
        .iter()
        .find(|h| h["shmid"] == segment.id)
        .ok_or_else(|| format!("segment {} is not among the holders: {body}", segment.id))?;
    if s["knownBy"] != "faults"
        || s["heldBytes"] != seg_bytes
        || s["heldByNothingThatRuns"] != true
        || s["nodesFrom"] != "unknown"
        || s["probes"]["firstFaultBy"]["pid"] != me
    {
        return Err(format!(
            "the segment: expected {seg_bytes} bytes held by nothing that runs, known by the faults this process took in it, node unknown: {s}"
        ));
    }
    // The task iterators (#45): this kernel's verifier took them, or the check says why not.
    if agent
        .lines_with("task iterators loaded (the holders' walk reads every process with them)")
        .is_empty()
    {
        let why =
            agent.lines_with("task iterators not loaded: the holders' walk reads /proc alone");
        return Err(format!(
            "the task iterators did not load on this kernel: {why:?}"
        ));
    }
    Ok(format!(
        "file {path}: {want} bytes held by nothing that runs, all on node {FILE_NODE} (queried), \
         its {FILE_PAGES} faults seen, {made}; a 1 GiB file's page on node {SEGMENT_NODE}; \
         segment {} known by its faults, {seg_bytes} bytes held by nothing that runs, node not \
         known; the task iterators loaded",
        segment.id
    ))
}
