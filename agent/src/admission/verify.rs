//! KEP-5759's verification: for each requested page size, read `free_hugepages` fresh for the
//! selected NUMA nodes (never a cached value), sum, compare; reject with the KEP's exact message.
//!
//! Reads go through descriptors kept open and read with `pread` from offset 0 (sysfs regenerates
//! the value on every read), so a check costs microseconds. A size a node does not have counts
//! as 0 there. An unreadable file follows `--on-sysfs-error`: `admit` (the KEP's graceful
//! degradation, noted in the answer and counted) or `reject`.
//!
//! `strict` mode goes further than the KEP: `free_hugepages` still counts pages reserved by a
//! mapping that has not touched them. The kernel keeps that reservation as one system-wide count
//! (`resv_hugepages`), and a later fault may take its pages from any node, so strict subtracts the
//! whole of it from the selected nodes' free pages: exact when the selection holds the nodes the
//! reserved pages will fault on (always, on a machine of one node), conservative by the part that
//! faults elsewhere when it does not, never above what stays available (`cargo xtask vm-test`'s
//! `strict-mode-multi-node` measures both on four nodes). Every answer reports both numbers.

use std::{
    collections::HashMap,
    fs::File,
    io,
    os::unix::fs::FileExt,
    sync::{
        RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::kube::pod::Hugepages;
use crate::{
    host::{NumaNode, PageSize},
    psi::condition::NodeCondition,
    quantity::format_binary,
    sysfs::{HostFs, SysfsError, hugepages::numa_nodes},
};

/// The event reason of a rejection, as the kubelet records it.
pub const REASON: &str = "FailedHugepagesVerification";
/// The reason when sysfs could not be read and `--on-sysfs-error reject` is set.
pub const REASON_UNREADABLE: &str = "HugepagesVerificationUnavailable";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// KEP-5759: available = free_hugepages.
    Kep,
    /// Also subtract pages reserved by mappings but not yet faulted.
    Strict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnSysfsError {
    Admit,
    Reject,
}

/// The `MemoryManagerHugepagesVerification` gate: the kubelet's, or `--verification`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gate {
    On,
    /// Requests are admitted without reading sysfs, and the answer says so.
    Off,
}

/// How requests are verified: the gate, the mode, and what an unreadable file means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub gate: Gate,
    pub mode: Mode,
    pub on_sysfs_error: OnSysfsError,
}

/// The message of an answer given with the gate off.
pub const GATE_OFF: &str = "hugepages verification is off (the MemoryManagerHugepagesVerification gate; GET /v1/kubelet says who set it): admitted without reading sysfs";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("NUMA node {node} does not exist on this host (nodes: {known:?})")]
    UnknownNode { node: u32, known: Vec<u32> },
    #[error("no NUMA nodes selected")]
    NoNodes,
}

/// One page size checked on the selected nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub resource: String,
    /// The page size `resource` names.
    #[serde(skip)]
    pub page_size: PageSize,
    pub numa_nodes: Vec<NumaNode>,
    pub requested_bytes: u64,
    /// What the selected mode counts as available.
    pub available_bytes: u64,
    /// `free_hugepages` summed over the selected nodes (the KEP's number).
    pub free_bytes: u64,
    /// Free minus pages reserved but not yet faulted (the strict number).
    pub unreserved_bytes: u64,
    /// Held by this agent's reservations for other pods admitted but not started yet; already
    /// subtracted from `available_bytes`.
    pub reserved_by_agent_bytes: u64,
    pub ok: bool,
    /// Why this size was not verified (a sysfs file could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unverified: Option<String>,
}

/// The answer for a whole request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub numa_nodes: Vec<NumaNode>,
    pub mode: Mode,
    pub checks: Vec<Check>,
    /// The reservation this admission made (admitted requests with a pod UID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<ReservationRef>,
}

/// Reads `free_hugepages` and `resv_hugepages` fresh, through descriptors it keeps open.
#[derive(Debug)]
pub struct Verifier {
    host: HostFs,
    /// Nodes with `node<N>` directories; empty on a machine without them (then node 0 stands for
    /// the whole machine, read from `/sys/kernel/mm/hugepages`).
    nodes: Vec<NumaNode>,
    files: RwLock<HashMap<Counter, File>>,
    sysfs_errors: AtomicU64,
}

impl Verifier {
    pub fn new(host: HostFs) -> Result<Verifier, SysfsError> {
        let nodes = numa_nodes(&host)?;
        Ok(Verifier {
            host,
            nodes,
            files: RwLock::default(),
            sysfs_errors: AtomicU64::new(0),
        })
    }

    /// The NUMA nodes a request may name.
    pub fn nodes(&self) -> Vec<NumaNode> {
        if self.nodes.is_empty() {
            vec![NumaNode(0)]
        } else {
            self.nodes.clone()
        }
    }

    /// How many sysfs reads have failed during verification.
    pub fn sysfs_errors(&self) -> u64 {
        self.sysfs_errors.load(Ordering::Relaxed)
    }

    /// Verifies `request` on `nodes` (sorted and deduplicated here).
    pub fn verify(
        &self,
        request: &Hugepages,
        nodes: &[NumaNode],
        settings: Settings,
    ) -> Result<Verdict, VerifyError> {
        let mut nodes = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        if nodes.is_empty() {
            return Err(VerifyError::NoNodes);
        }
        let known = self.nodes();
        if let Some(bad) = nodes.iter().find(|n| !known.contains(n)) {
            return Err(VerifyError::UnknownNode {
                node: bad.0,
                known: known.iter().map(|n| n.0).collect(),
            });
        }
        Ok(judge(request, nodes, settings, |size, nodes| {
            self.available(size, nodes).inspect_err(|err| {
                self.sysfs_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(resource = %size.resource_name(), "hugepages not verified: {err}");
            })
        }))
    }

    /// (free, free minus reservations) in bytes over `nodes`.
    fn available(&self, size: PageSize, nodes: &[NumaNode]) -> Result<(u64, u64), SysfsError> {
        let mut free_pages = 0u64;
        for &node in nodes {
            free_pages += self.read(Counter::Free(node, size))?;
        }
        let reserved = self.read(Counter::Reserved(size))?;
        Ok(free_and_unreserved(size, free_pages, reserved))
    }

    /// Reads a counter with `pread` on a kept descriptor (opened on first use, dropped on error).
    /// A counter whose size directory does not exist (a size this node lacks) reads as 0.
    fn read(&self, counter: Counter) -> Result<u64, SysfsError> {
        let mut buf = [0u8; 24];
        let cached = self
            .files
            .read()
            .ok()
            .and_then(|files| files.get(&counter).map(|f| f.read_at(&mut buf, 0)));
        let n = match cached {
            Some(Ok(n)) => n,
            other => {
                if other.is_some()
                    && let Ok(mut files) = self.files.write()
                {
                    files.remove(&counter);
                }
                let (dir, file) = counter.location(self.nodes.is_empty());
                let path = self.host.path(format!("{dir}/{file}"));
                let opened = File::open(&path).and_then(|f| f.read_at(&mut buf, 0).map(|n| (f, n)));
                match opened {
                    Ok((f, n)) => {
                        if let Ok(mut files) = self.files.write() {
                            files.insert(counter, f);
                        }
                        n
                    }
                    Err(source)
                        if source.kind() == io::ErrorKind::NotFound && !self.host.exists(&dir) =>
                    {
                        return Ok(0);
                    }
                    Err(source) => return Err(SysfsError::Read { path, source }),
                }
            }
        };
        parse_counter(&buf[..n]).ok_or_else(|| {
            let (dir, file) = counter.location(self.nodes.is_empty());
            SysfsError::Malformed {
                path: self.host.path(format!("{dir}/{file}")),
                expected: "an unsigned integer",
                found: String::from_utf8_lossy(&buf[..n]).into_owned(),
            }
        })
    }
}

/// KEP-5759's comparison for `request` on `nodes` (sorted, deduplicated and known), with what
/// `available` gives for each page size over them: (free, free minus the pages reserved but not
/// faulted) in bytes, or why it cannot say. The agent gives fresh sysfs reads ([`Verifier`]); the
/// webhook, the state an agent streamed: one comparison, one message, for both.
pub fn judge<E: std::fmt::Display>(
    request: &Hugepages,
    nodes: Vec<NumaNode>,
    settings: Settings,
    mut available: impl FnMut(PageSize, &[NumaNode]) -> Result<(u64, u64), E>,
) -> Verdict {
    let Settings {
        gate,
        mode,
        on_sysfs_error: on_error,
    } = settings;
    let mut verdict = Verdict {
        allowed: true,
        reason: None,
        message: None,
        numa_nodes: nodes.clone(),
        mode,
        checks: Vec::new(),
        reservation: None,
    };
    if gate == Gate::Off {
        verdict.message = Some(GATE_OFF.to_owned());
        return verdict;
    }
    for (&size, &requested) in request {
        let check = match available(size, &nodes) {
            Ok((free, unreserved)) => {
                let available = if mode == Mode::Kep { free } else { unreserved };
                Check {
                    resource: size.resource_name(),
                    page_size: size,
                    numa_nodes: nodes.clone(),
                    requested_bytes: requested,
                    available_bytes: available,
                    free_bytes: free,
                    unreserved_bytes: unreserved,
                    reserved_by_agent_bytes: 0,
                    ok: available >= requested,
                    unverified: None,
                }
            }
            Err(err) => {
                let ok = on_error == OnSysfsError::Admit;
                if !ok && verdict.allowed {
                    verdict.allowed = false;
                    verdict.reason = Some(REASON_UNREADABLE);
                    verdict.message = Some(format!(
                        "cannot verify {} on NUMA node(s) {}: {err}",
                        size.resource_name(),
                        list(&nodes)
                    ));
                }
                Check {
                    resource: size.resource_name(),
                    page_size: size,
                    numa_nodes: nodes.clone(),
                    requested_bytes: requested,
                    available_bytes: 0,
                    free_bytes: 0,
                    unreserved_bytes: 0,
                    reserved_by_agent_bytes: 0,
                    ok,
                    unverified: Some(err.to_string()),
                }
            }
        };
        if !check.ok && verdict.allowed {
            verdict.allowed = false;
            verdict.reason = Some(REASON);
            verdict.message = Some(message(&check));
        }
        verdict.checks.push(check);
    }
    verdict
}

/// (free, free minus `reserved` system-wide pages) in bytes of `free_pages` pages of `size`: the
/// kernel keeps the reservation as one count, so strict subtracts all of it.
pub fn free_and_unreserved(size: PageSize, free_pages: u64, reserved: u64) -> (u64, u64) {
    let unreserved = free_pages - reserved.min(free_pages);
    (
        free_pages.saturating_mul(size.0),
        unreserved.saturating_mul(size.0),
    )
}

/// A sysfs counter the verification reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Counter {
    /// `free_hugepages` of one node (of the whole machine when it has no node directories).
    Free(NumaNode, PageSize),
    /// The system-wide `resv_hugepages`.
    Reserved(PageSize),
}

impl Counter {
    /// (directory, file name) on the host.
    fn location(self, no_node_dirs: bool) -> (String, &'static str) {
        match self {
            Counter::Free(_, size) if no_node_dirs => (
                format!("/sys/kernel/mm/hugepages/{}", size.dir_name()),
                "free_hugepages",
            ),
            Counter::Free(node, size) => (
                format!(
                    "/sys/devices/system/node/node{}/hugepages/{}",
                    node.0,
                    size.dir_name()
                ),
                "free_hugepages",
            ),
            Counter::Reserved(size) => (
                format!("/sys/kernel/mm/hugepages/{}", size.dir_name()),
                "resv_hugepages",
            ),
        }
    }
}

/// A decimal counter as sysfs prints it (`"1024\n"`), without allocating.
fn parse_counter(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// `[0,1]`, as the KEP prints node lists.
fn list(nodes: &[NumaNode]) -> String {
    let inner: Vec<String> = nodes.iter().map(|n| n.0.to_string()).collect();
    format!("[{}]", inner.join(","))
}

/// `insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 6Gi, available 4Gi`
pub fn message(check: &Check) -> String {
    format!(
        "insufficient {} on NUMA node(s) {}: requested {}, available {}",
        check.resource,
        list(&check.numa_nodes),
        format_binary(check.requested_bytes),
        format_binary(check.available_bytes)
    )
}

#[cfg(test)]
mod tests;

/// What an answer says of the reservation its admission made (the store holds the rest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationRef {
    pub id: String,
    #[serde(serialize_with = "rfc3339")]
    pub expires_at: SystemTime,
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string())
}

/// The reason of a refusal under memory contention pressure.
pub const REASON_PRESSURE: &str = "NodeUnderMemoryContentionPressure";

/// Why admissions are refused while `condition` is True (`--reject-under-pressure`).
pub fn pressure_message(condition: &NodeCondition) -> String {
    format!(
        "node under memory contention pressure (--reject-under-pressure): {} is True: {}",
        condition.kind, condition.message
    )
}

/// Refuses `verdict` for memory contention pressure, with `message` ([`pressure_message`]),
/// when there is one.
pub fn refuse_under_pressure(verdict: &mut Verdict, message: Option<&str>) {
    let Some(message) = message else {
        return;
    };
    verdict.allowed = false;
    verdict.reason = Some(REASON_PRESSURE);
    verdict.message = Some(message.to_owned());
}
