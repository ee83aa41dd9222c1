//! Hugepages held by nothing that runs, on four nodes (#37): a file of a hugetlbfs mount whose
//! 3 pages this process bound to node 2 and then kept nothing of, a file of one 1 GiB page
//! bound to node 3 the same way, and a SysV segment of 2 pages bound to node 3, touched and
//! detached. `/v1/consumers` names each file held by nothing that runs with its pages on its
//! node (asked of the kernel through the agent's own mapping), and the segment held by nothing
//! that runs with no node (nothing attaches it): known by its `rss` where the kernel shows a
//! hugetlb segment's there (not 6.1 or 6.12), else by the accounts, the pages in use that
//! nothing else explains adding up to its `rss` alone; failing both, named among the candidates
//! of what stays unexplained (the check says which).

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

pub fn orphans(lock: &HostLock, agent: &Agent) -> CheckResult {
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
    let seg_bytes = SEGMENT_PAGES * sysfs::SIZE_2M;
    let segment_seen = match holders.iter().find(|h| h["shmid"] == segment.id) {
        Some(s) => {
            let known_by = s["knownBy"].as_str().unwrap_or("");
            if !["rss", "accounting"].contains(&known_by)
                || s["heldBytes"] != seg_bytes
                || s["heldByNothingThatRuns"] != true
                || s["nodesFrom"] != "unknown"
            {
                return Err(format!(
                    "the segment: expected {seg_bytes} bytes held by nothing that runs, known by its rss or the accounts, node unknown: {s}"
                ));
            }
            format!(
                "segment {} known by its {}, {seg_bytes} bytes held by nothing that runs, node not known",
                segment.id,
                if known_by == "rss" { "rss" } else { "accounts" }
            )
        }
        None => {
            let unexplained = holders
                .iter()
                .find(|h| h["kind"] == "unexplained" && h["pageSizeBytes"] == sysfs::SIZE_2M)
                .ok_or_else(|| {
                    format!("the segment is neither a holder nor unexplained: {body}")
                })?;
            let candidate = unexplained["candidateShmids"]
                .as_array()
                .is_some_and(|ids| ids.iter().any(|id| id == segment.id));
            let bytes = unexplained["heldBytes"].as_u64().unwrap_or(0);
            if !candidate || bytes < seg_bytes {
                return Err(format!(
                    "the segment: expected at least {seg_bytes} unexplained bytes naming shmid {}: {unexplained}",
                    segment.id
                ));
            }
            format!(
                "segment {}: this kernel's rss does not show its backing; {bytes} bytes unexplained naming it as a candidate",
                segment.id
            )
        }
    };
    Ok(format!(
        "file {path}: {want} bytes held by nothing that runs, all on node {FILE_NODE} (queried); \
         a 1 GiB file's page on node {SEGMENT_NODE}; {segment_seen}"
    ))
}
