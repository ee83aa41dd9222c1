//! `--verification-mode strict` on several nodes, against what the kernel then does. This
//! process maps 6 pages of 2 MiB with `MAP_HUGETLB` and binds them to node 2 (`mbind`) without
//! touching them: the kernel reserves them (the system-wide `resv_hugepages` rises by 6) while
//! every node's `free_hugepages` stays as it was. The agent's answers for every single node and
//! for the pairs [0,1] and [0,2] show `free` (what `kep` counts) and `unreserved` (what `strict`
//! counts: the whole reservation subtracted from the selected nodes' sum). Then the mapping is
//! touched, and the kernel shows where the reservation really goes: node 2's free pages fall by
//! exactly 6, the others do not move.
//!
//! What the docs claim (docs/concepts/verification.md) ("exact on one node, conservative on more") must then hold in figures:
//! where the reservation faults (node 2, and any selection that holds it), `unreserved` before the
//! touch equals `free` after it, exactly; on every selection without node 2, `unreserved` is
//! below what stays available by the whole reservation (conservative, never above). Kep admits
//! all of node 2's free pages while the reservation is pending, strict refuses them with the
//! KEP's message and its smaller number, and admits what is left.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::{CheckResult, Guest, admit, sysfs};

const MI: u64 = 1 << 20;
/// Pages the mapping reserves, and the node it is bound to.
const RESERVED: u64 = 6;
const NODE: u32 = 2;
/// The selections asked about: every node alone, a pair with node 2 and one without.
const SELECTIONS: [&[u32]; 6] = [&[0], &[1], &[2], &[3], &[0, 1], &[0, 2]];

pub fn multi_node(guest: &Guest, port: u16) -> CheckResult {
    let free_before = free_per_node()?;
    let resv_before = resv_2m()?;
    if resv_before != 0 {
        return Err(format!(
            "resv_hugepages is {resv_before} before the mapping, expected 0"
        ));
    }
    let mut mapping = Mapping::reserve(RESERVED as usize, NODE)?;
    let resv = resv_2m()?;
    let free_reserved = free_per_node()?;
    if resv != RESERVED || free_reserved != free_before {
        return Err(format!(
            "after mapping {RESERVED} pages untouched: resv_hugepages {resv}, free {free_reserved:?}, \
             expected resv {RESERVED} and free unchanged {free_before:?}"
        ));
    }
    // What the agent answers while the reservation is pending.
    let mut answers = BTreeMap::new();
    for nodes in SELECTIONS {
        answers.insert(nodes, free_and_unreserved(port, nodes)?);
    }
    // Kep against strict, on node 2's free pages.
    let all_of_node = free_before[&NODE] * 2;
    let strict_available = (free_before[&NODE] - RESERVED) * 2;
    let message = format!(
        "insufficient hugepages-2Mi on NUMA node(s) [{NODE}]: requested {all_of_node}Mi, \
         available {strict_available}Mi"
    );
    expect_check(guest, "kep", all_of_node, None)?;
    expect_check(guest, "strict", all_of_node, Some(&message))?;
    expect_check(guest, "strict", strict_available, None)?;
    // Where the reservation really goes.
    mapping.touch();
    let free_after = free_per_node()?;
    let resv_after = resv_2m()?;
    let mut want_after = free_before.clone();
    if let Some(free) = want_after.get_mut(&NODE) {
        *free -= RESERVED;
    }
    if free_after != want_after || resv_after != 0 {
        return Err(format!(
            "after touching the mapping: free {free_after:?} resv {resv_after}, expected free \
             {want_after:?} (node {NODE} down by {RESERVED}) and resv 0"
        ));
    }
    let mut exact = Vec::new();
    let mut conservative = Vec::new();
    for (nodes, (free, unreserved)) in &answers {
        let sum = |pools: &BTreeMap<u32, u64>| -> u64 {
            nodes
                .iter()
                .map(|n| pools.get(n).copied().unwrap_or(0))
                .sum::<u64>()
                * 2
                * MI
        };
        let (before, after) = (sum(&free_before), sum(&free_after));
        let shown = format!("{nodes:?}").replace(' ', "");
        if *free != before || *unreserved != before.saturating_sub(RESERVED * 2 * MI) {
            return Err(format!(
                "{shown}: the agent answered free {} unreserved {}, expected free {} and \
                 unreserved {} (sysfs minus resv_hugepages {RESERVED})",
                free / MI,
                unreserved / MI,
                before / MI,
                before.saturating_sub(RESERVED * 2 * MI) / MI
            ));
        }
        if nodes.contains(&NODE) {
            if *unreserved != after {
                return Err(format!(
                    "{shown} holds the reservation's node: strict said {}Mi, but {}Mi stayed \
                     free once it faulted: not exact",
                    unreserved / MI,
                    after / MI
                ));
            }
            exact.push(format!("{shown} {}Mi", unreserved / MI));
        } else {
            if *unreserved > after {
                return Err(format!(
                    "{shown}: strict said {}Mi, above the {}Mi that stayed free: not conservative",
                    unreserved / MI,
                    after / MI
                ));
            }
            conservative.push(format!("{shown} {}Mi of {}Mi", unreserved / MI, after / MI));
        }
    }
    // Faulted, nothing is reserved: both numbers are the kernel's free pages again.
    let (free2, unreserved2) = free_and_unreserved(port, &[NODE])?;
    if (free2, unreserved2) != (free_after[&NODE] * 2 * MI, free_after[&NODE] * 2 * MI) {
        return Err(format!(
            "after the touch the agent answers free {} unreserved {} on [{NODE}], expected both {}",
            free2 / MI,
            unreserved2 / MI,
            free_after[&NODE] * 2
        ));
    }
    drop(mapping);
    Ok(format!(
        "{RESERVED} pages mapped untouched, bound to node {NODE}: resv_hugepages 0 -> {resv}, every \
         node's free unchanged; strict subtracts all {}Mi from each selection's free (kep admits \
         [{NODE}]'s {all_of_node}Mi, strict refuses with \"{message}\", admits \
         {strict_available}Mi); touched, node {NODE} free {} -> {} pages, others unchanged: exact \
         where it faulted (unreserved = free after: {}), conservative by {}Mi elsewhere \
         (unreserved of still free: {})",
        RESERVED * 2,
        free_before[&NODE],
        free_after[&NODE],
        exact.join(", "),
        RESERVED * 2,
        conservative.join(", ")
    ))
}

/// Every node's free 2 MiB pages, from sysfs.
fn free_per_node() -> Result<BTreeMap<u32, u64>, String> {
    sysfs::nodes()?
        .into_iter()
        .map(|n| sysfs::node_pool(n, sysfs::SIZE_2M).map(|p| (n, p.free)))
        .collect()
}

/// The system-wide `resv_hugepages` of 2 MiB pages.
fn resv_2m() -> Result<u64, String> {
    sysfs::global_pools()?
        .get(&sysfs::SIZE_2M)
        .map(|(_, resv)| *resv)
        .ok_or_else(|| "no 2 MiB pool in /sys/kernel/mm/hugepages".to_owned())
}

/// (free, unreserved) bytes the running agent answers for one 2 MiB page on `nodes`
/// (`POST /v1/admit`, no pod UID: nothing is reserved by the agent).
fn free_and_unreserved(port: u16, nodes: &[u32]) -> Result<(u64, u64), String> {
    let body = json!({
        "pod": {"namespace": "vm-test", "name": "strict", "qosClass": "Guaranteed"},
        "containers": [{"name": "c", "resources": {"hugepages-2Mi": "2Mi", "memory": "64Mi"}}],
        "numaNodes": nodes,
    });
    let answer = admit::post(port, &format!("2Mi on {nodes:?}"), &body)?;
    let check = &answer["checks"][0];
    match (
        check["freeBytes"].as_u64(),
        check["unreservedBytes"].as_u64(),
    ) {
        (Some(free), Some(unreserved)) if check["numaNodes"] == json!(nodes) => {
            Ok((free, unreserved))
        }
        _ => Err(format!(
            "POST /v1/admit on {nodes:?}: no free and unreserved bytes for those nodes: {answer}"
        )),
    }
}

/// `hugepage-agent check --verification-mode MODE --numa 2` of `mi` MiB of 2 MiB pages: refused
/// with `message` (exit 1), or admitted (exit 0).
fn expect_check(guest: &Guest, mode: &str, mi: u64, message: Option<&str>) -> CheckResult {
    let out = guest
        .agent()
        .args(["check", "--verification-mode", mode, "--json"])
        .args(["--numa", &NODE.to_string()])
        .args(["--request", &format!("hugepages-2Mi={mi}Mi")])
        .output()
        .map_err(|e| format!("running check: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let verdict: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let ok = match message {
        Some(m) => out.status.code() == Some(1) && verdict["message"] == m,
        None => out.status.code() == Some(0) && verdict["allowed"] == true,
    } && verdict["mode"] == mode;
    if !ok {
        return Err(format!(
            "check --verification-mode {mode} {mi}Mi on [{NODE}]: {} {verdict} {stderr}, \
             expected {}",
            out.status,
            message.unwrap_or("admitted")
        ));
    }
    Ok(String::new())
}

/// A private `MAP_HUGETLB` mapping of 2 MiB pages bound to one node, untouched until
/// [`Mapping::touch`]; unmapped when dropped.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn reserve(pages: usize, node: u32) -> Result<Mapping, String> {
        let len = pages * (2 << 20);
        // SAFETY: anonymous private mapping; no file, no fixed address.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {pages} 2 MiB pages: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mapping = Mapping { addr, len };
        hugepage_agent_tests::mbind::bind(addr as usize, len, node as usize)?;
        Ok(mapping)
    }

    /// Writes one byte in each page: the reserved pages are faulted in, from the bound node.
    fn touch(&mut self) {
        let base = self.addr.cast::<u8>();
        for offset in (0..self.len).step_by(2 << 20) {
            // SAFETY: inside the mapping, which is readable and writable.
            unsafe { base.add(offset).write_volatile(1) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}
