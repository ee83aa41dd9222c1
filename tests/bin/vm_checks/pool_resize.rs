//! A pool resized at runtime, as an operator or a node's tuning does: node 1's 2 MiB pool grows
//! from its boot size by a write to `node1/hugepages/hugepages-2048kB/nr_hugepages`. The kernel's
//! count moves on node 1 alone; admission, which reads sysfs at each request, sees the new pages
//! at once (exactly what node 1 now has is admitted, one page more refused with the KEP's
//! message); the agent's map follows by its periodic re-read (no fault prompts it). The pool is
//! put back to its boot size on every way out of the check. Its pods have no UID, so they reserve
//! nothing; it runs before any check that reserves on node 1 (Story 2 reserves on `[0,1]`).

use std::time::{Duration, Instant};

use hugepage_agent_tests::{HostLock, HugepagePool};
use serde_json::{Value, json};

use crate::{CheckResult, admit, sysfs};

const NODE: u32 = 1;
const GROWN_BY: u64 = 4;

/// The node's 2 MiB `nr_hugepages` file.
fn nr_file() -> String {
    format!("/sys/devices/system/node/node{NODE}/hugepages/hugepages-2048kB/nr_hugepages")
}

pub fn node1_grows(lock: &HostLock, port: u16, reconcile: Duration) -> CheckResult {
    let before = sysfs::node_pools()?;
    let boot = sysfs::node_pool(NODE, sysfs::SIZE_2M)?;
    let pool = HugepagePool::reserve_in(lock, &nr_file(), boot.total + GROWN_BY);
    let written = Instant::now();
    let grown = sysfs::node_pool(NODE, sysfs::SIZE_2M)?;
    if (grown.total, grown.free) != (boot.total + GROWN_BY, boot.free + GROWN_BY) {
        return Err(format!(
            "node {NODE} after the write: {grown:?}, expected {GROWN_BY} more than {boot:?}"
        ));
    }
    let mut after = sysfs::node_pools()?;
    after.insert((NODE, sysfs::SIZE_2M), boot);
    if after != before {
        return Err(format!("another pool moved: {after:?} against {before:?}"));
    }
    let free_mi = grown.free * 2;
    let message = format!(
        "insufficient hugepages-2Mi on NUMA node(s) [{NODE}]: requested {}Mi, available {free_mi}Mi",
        free_mi + 2
    );
    expect(port, "resized-exact", free_mi, None)?;
    expect(port, "resized-over", free_mi + 2, Some(&message))?;
    let seen = map_shows(port, grown.total, reconcile + Duration::from_secs(10))?;
    let seen_after = seen.duration_since(written);
    drop(pool);
    let back = sysfs::node_pool(NODE, sysfs::SIZE_2M)?;
    if back.total != boot.total {
        return Err(format!("node {NODE} not put back: {back:?}, boot {boot:?}"));
    }
    Ok(format!(
        "node {NODE}'s 2 MiB pool {} -> {} pages by a runtime write (free {} -> {}), no other pool \
         moved; /v1/admit on [{NODE}] admits {free_mi}Mi at once and refuses {}Mi with the KEP's \
         message; the map showed {} pages {:.1} s after the write (re-read every {} s); put back to {}",
        boot.total,
        grown.total,
        boot.free,
        grown.free,
        free_mi + 2,
        grown.total,
        seen_after.as_secs_f64(),
        reconcile.as_secs(),
        back.total
    ))
}

fn expect(port: u16, name: &str, mi: u64, message: Option<&str>) -> CheckResult {
    let body = json!({
        "pod": {"namespace": "vm-test", "name": name, "qosClass": "Guaranteed"},
        "containers": [{"name": "c", "resources": {"hugepages-2Mi": format!("{mi}Mi"), "memory": "64Mi"}}],
        "numaNodes": [NODE],
    });
    let answer = admit::post(port, &format!("{name} on [{NODE}]"), &body)?;
    let ok = match message {
        Some(m) => answer["allowed"] == false && answer["message"] == m,
        None => answer["allowed"] == true,
    };
    if ok {
        Ok(String::new())
    } else {
        Err(format!(
            "POST /v1/admit {mi}Mi on [{NODE}]: {answer}, expected {}",
            message.unwrap_or("allowed")
        ))
    }
}

/// When `/v1/hugepages` first shows node 1's 2 MiB pool at `total` pages, within `within`.
fn map_shows(port: u16, total: u64, within: Duration) -> Result<Instant, String> {
    let deadline = Instant::now() + within;
    loop {
        let (status, body) = hugepage_agent_tests::http(port, "GET", "/v1/hugepages", None, "");
        let map: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let shown = map["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["node"] == NODE)
            .flat_map(|n| n["sizes"].as_array().into_iter().flatten())
            .find(|s| s["pageSizeBytes"] == sysfs::SIZE_2M)
            .and_then(|s| s["total"].as_u64());
        if shown == Some(total) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the map did not show node {NODE}'s pool at {total} within {} s: GET /v1/hugepages {status}, shown {shown:?}",
                within.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
