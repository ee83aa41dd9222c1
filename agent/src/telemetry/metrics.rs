//! The counters and histograms the agent updates as things happen: verifications (KEP-5759's
//! three metrics and its proposed discrepancy gauge), admissions, reservations, hugetlb faults,
//! cgroup events, the probes' own counters, the delay from an eBPF event to the map, and the API
//! listener's TLS (handshakes refused, files reloaded), and the listeners' connections and
//! limits ([`super::connections`]).
//!
//! Label values are bounded: page sizes and NUMA nodes are those of the host when the agent
//! started (a size a request names that the host lacks is `other`), results and reasons are
//! fixed sets, and no label carries a pod. Every series the host can have exists from the start
//! at zero, so a query sees it before its first event. Gauges read at scrape time (pools, PSI,
//! conditions) are in [`super::scrape`]; this module stops at what only events can tell.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{
    connections::{self, ConnectionStats},
    encode::{Encoder, HistogramValue, Kind},
    export::ExportStats,
    watch::WatchStats,
};
use crate::{
    admission::{reservations::Released, verify::Verdict},
    host::{NumaNode, PageSize},
    numa::map::Snapshot,
    probes::{events::CgroupChange, live::Losses},
    tls::{Refusal, TlsStats},
};

/// KEP-5759's buckets (1 ms to 100 ms) with finer ones below 1 ms, where this agent's
/// verifications fall (a few microseconds).
pub const VERIFICATION_BUCKETS: [f64; 12] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
];
/// From an eBPF event to the map that shows it: a 2 ms coalescing delay, then follow-up
/// re-reads up to half a second later.
pub const EVENT_TO_MAP_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The label of a page size outside the host's.
const OTHER: &str = "other";
/// The reasons an admission can be refused for, as `POST /v1/admit` names them.
const REASONS: [&str; 3] = [
    crate::admission::verify::REASON,
    crate::admission::verify::REASON_UNREADABLE,
    crate::admission::verify::REASON_PRESSURE,
];
const CGROUP_CHANGES: [&str; 4] = ["mkdir", "rmdir", "attach_task", "release"];
const RESERVATION_ENDS: [&str; 4] = ["faulted", "pod_removed", "expired", "deleted"];

/// A histogram of durations with fixed buckets; observing never locks.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, observations in it and not in a lower one; the last slot is above every bound.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let slot = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Cumulative counts, as the exposition wants them.
    pub fn value(&self) -> HistogramValue {
        let mut running = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(&b, c)| {
                running += c.load(Ordering::Relaxed);
                (b, running)
            })
            .collect();
        let count = running + self.counts[self.bounds.len()].load(Ordering::Relaxed);
        HistogramValue {
            buckets,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            count,
        }
    }
}

/// Counters keyed by label values (a small, bounded map).
#[derive(Debug, Default)]
struct Family<K: Ord>(Mutex<BTreeMap<K, u64>>);

impl<K: Ord + Clone> Family<K> {
    fn with(keys: impl IntoIterator<Item = K>) -> Family<K> {
        Family(Mutex::new(keys.into_iter().map(|k| (k, 0)).collect()))
    }

    fn add(&self, key: K, n: u64) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(key).or_default() += n;
        }
    }

    fn values(&self) -> Vec<(K, u64)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }
}

/// Every metric updated by events.
#[derive(Debug)]
pub struct Metrics {
    sizes: Vec<PageSize>,
    nodes: Vec<NumaNode>,
    /// (result, hugepage_size)
    verifications: Family<(&'static str, String)>,
    /// (hugepage_size, numa_node)
    failures: Family<(String, u32)>,
    latency: Histogram,
    /// (hugepage_size, numa_node) → bytes the Memory Manager believes free minus what the
    /// kernel has free.
    discrepancy: Mutex<BTreeMap<(String, u32), i64>>,
    /// (result, reason)
    admissions: Family<(&'static str, &'static str)>,
    /// (numa_node, hugepage_size)
    faults: Family<(u32, String)>,
    cgroup_events: Family<&'static str>,
    reservations_made: AtomicU64,
    reservations_ended: Family<&'static str>,
    probes: Mutex<Losses>,
    event_to_map: Histogram,
    /// The trace exporter's queue: spans exported and dropped.
    pub traces: Arc<ExportStats>,
    /// The API listener's TLS: handshakes refused, files reloaded.
    pub tls: Arc<TlsStats>,
    /// The API listener's connections and limits (`listener="api"`).
    pub api_connections: Arc<ConnectionStats>,
    /// The metrics listener's (`listener="metrics"`).
    pub metrics_connections: Arc<ConnectionStats>,
    /// The map watch's watchers and events.
    pub watch: Arc<WatchStats>,
}

impl Metrics {
    /// The metrics of a host with these page sizes and NUMA nodes.
    /// The metrics of the host the map's first snapshot shows: its nodes and page sizes.
    pub fn for_host(s: &Snapshot, traces: Arc<ExportStats>) -> Metrics {
        let nodes: Vec<_> = s.nodes.iter().map(|n| n.info.node).collect();
        let sizes: std::collections::BTreeSet<PageSize> = s
            .global
            .iter()
            .map(|g| g.pool.size)
            .chain(
                s.nodes
                    .iter()
                    .flat_map(|n| n.sizes.iter().map(|p| PageSize(p.page_size_bytes))),
            )
            .collect();
        let sizes: Vec<PageSize> = sizes.into_iter().collect();
        Metrics::new(&sizes, &nodes, traces)
    }

    pub fn new(sizes: &[PageSize], nodes: &[NumaNode], traces: Arc<ExportStats>) -> Metrics {
        let labels: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
        let per_size_node = || {
            labels
                .iter()
                .flat_map(|s| nodes.iter().map(move |n| (s.clone(), n.0)))
                .collect::<Vec<_>>()
        };
        Metrics {
            sizes: sizes.to_vec(),
            nodes: nodes.to_vec(),
            verifications: Family::with(
                ["success", "failure"]
                    .into_iter()
                    .flat_map(|r| labels.iter().map(move |s| (r, s.clone()))),
            ),
            failures: Family::with(per_size_node()),
            latency: Histogram::new(&VERIFICATION_BUCKETS),
            discrepancy: Mutex::default(),
            admissions: Family::with(
                std::iter::once(("admitted", "")).chain(REASONS.map(|r| ("rejected", r))),
            ),
            faults: Family::with(per_size_node().into_iter().map(|(s, n)| (n, s))),
            cgroup_events: Family::with(CGROUP_CHANGES),
            reservations_made: AtomicU64::new(0),
            reservations_ended: Family::with(RESERVATION_ENDS),
            probes: Mutex::default(),
            event_to_map: Histogram::new(&EVENT_TO_MAP_BUCKETS),
            traces,
            tls: Arc::default(),
            api_connections: Arc::default(),
            metrics_connections: Arc::default(),
            watch: Arc::default(),
        }
    }

    fn size_label(&self, size: PageSize) -> String {
        if self.sizes.contains(&size) {
            size.to_string()
        } else {
            OTHER.to_owned()
        }
    }

    /// One verification: its duration, and per page size checked its result; each refused size
    /// counts a failure on every node it was checked on.
    pub fn verification(&self, verdict: &Verdict, took: Duration) {
        if verdict.checks.is_empty() {
            return;
        }
        self.latency.observe(took);
        for check in &verdict.checks {
            let size = self.size_label(check.page_size);
            let result = if check.ok { "success" } else { "failure" };
            self.verifications.add((result, size.clone()), 1);
            if !check.ok {
                for node in &check.numa_nodes {
                    self.failures.add((size.clone(), node.0), 1);
                }
            }
        }
    }

    /// One answer of `POST /v1/admit`.
    pub fn admission(&self, verdict: &Verdict) {
        let key = if verdict.allowed {
            ("admitted", "")
        } else {
            let reason = verdict.reason.unwrap_or_default();
            (
                "rejected",
                REASONS.into_iter().find(|r| *r == reason).unwrap_or(OTHER),
            )
        };
        self.admissions.add(key, 1);
        if verdict.reservation.is_some() {
            self.reservations_made.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A reservation ended.
    pub fn reservation_ended(&self, why: Released) {
        self.reservations_ended.add(
            match why {
                Released::Faulted => "faulted",
                Released::PodRemoved => "pod_removed",
                Released::Expired => "expired",
                Released::Deleted => "deleted",
            },
            1,
        );
    }

    /// A hugetlb fault on `node` (the node of the CPU that took it) of `size` (unknown: `other`).
    pub fn fault(&self, node: u32, size: Option<PageSize>) {
        let node = if self.nodes.iter().any(|n| n.0 == node) {
            node
        } else {
            u32::MAX
        };
        let size = size.map_or_else(|| OTHER.to_owned(), |s| self.size_label(s));
        self.faults.add((node, size), 1);
    }

    pub fn cgroup_event(&self, change: CgroupChange) {
        self.cgroup_events.add(
            match change {
                CgroupChange::Mkdir => "mkdir",
                CgroupChange::Rmdir => "rmdir",
                CgroupChange::AttachTask { .. } => "attach_task",
                CgroupChange::Release => "release",
            },
            1,
        );
    }

    /// The probes' counters as just read from the kernel.
    pub fn set_probe_losses(&self, totals: Losses) {
        if let Ok(mut p) = self.probes.lock() {
            *p = totals;
        }
    }

    /// A map refresh an eBPF event prompted was published `delay` after the event.
    pub fn event_to_map(&self, delay: Duration) {
        self.event_to_map.observe(delay);
    }

    /// `memory_manager_hugepages_discrepancy_bytes{hugepage_size,numa_node}`: what the kubelet
    /// Memory Manager believes free minus what the kernel has free, in bytes (negative when
    /// the kernel has more). Replaces the value of that size and node.
    pub fn set_discrepancy(&self, size: PageSize, node: NumaNode, bytes: i64) {
        let key = (self.size_label(size), node.0);
        if let Ok(mut d) = self.discrepancy.lock() {
            d.insert(key, bytes);
        }
    }

    /// Forgets every discrepancy (the checkpoint is gone or unreadable: no value is better
    /// than a stale one).
    pub fn clear_discrepancy(&self) {
        if let Ok(mut d) = self.discrepancy.lock() {
            d.clear();
        }
    }

    /// Writes every family of this module.
    pub fn encode(&self, e: &mut Encoder) {
        const VT: &str = "memory_manager_hugepages_verification_total";
        e.family(
            VT,
            Kind::Counter,
            "Hugepages verifications performed, per page size checked (KEP-5759).",
        );
        for ((result, size), n) in self.verifications.values() {
            e.sample(
                VT,
                &[("result", result), ("hugepage_size", &size)],
                n as f64,
            );
        }
        const VF: &str = "memory_manager_hugepages_verification_failures_total";
        e.family(VF, Kind::Counter, "Verifications that found too few free hugepages, per page size and NUMA node checked (KEP-5759).");
        for ((size, node), n) in self.failures.values() {
            e.sample(
                VF,
                &[("hugepage_size", &size), ("numa_node", &node.to_string())],
                n as f64,
            );
        }
        const VL: &str = "memory_manager_hugepages_verification_latency_seconds";
        e.family(
            VL,
            Kind::Histogram,
            "Time spent performing hugepages verification (KEP-5759), fresh sysfs reads included.",
        );
        e.histogram(VL, &[], &self.latency.value());
        const DB: &str = "memory_manager_hugepages_discrepancy_bytes";
        e.family(DB, Kind::Gauge, "Free hugepage bytes the kubelet Memory Manager believes in minus those the kernel reports, per page size and NUMA node.");
        if let Ok(d) = self.discrepancy.lock() {
            for ((size, node), bytes) in d.iter() {
                e.sample(
                    DB,
                    &[("hugepage_size", size), ("numa_node", &node.to_string())],
                    *bytes as f64,
                );
            }
        }
        const AD: &str = "hugepage_agent_admissions_total";
        e.family(
            AD,
            Kind::Counter,
            "Answers of POST /v1/admit, by result and the reason of a rejection.",
        );
        for ((result, reason), n) in self.admissions.values() {
            e.sample(AD, &[("result", result), ("reason", reason)], n as f64);
        }
        const RM: &str = "hugepage_agent_reservations_made_total";
        e.family(RM, Kind::Counter, "Reservations made by admissions.");
        e.sample(
            RM,
            &[],
            self.reservations_made.load(Ordering::Relaxed) as f64,
        );
        const RE: &str = "hugepage_agent_reservations_ended_total";
        e.family(RE, Kind::Counter, "Reservations ended, by why.");
        for (why, n) in self.reservations_ended.values() {
            e.sample(RE, &[("reason", why)], n as f64);
        }
        const HF: &str = "hugepage_agent_hugetlb_faults_total";
        e.family(HF, Kind::Counter, "Hugetlb page faults seen by the eBPF probe (retries folded), by the NUMA node of the faulting CPU and page size.");
        for ((node, size), n) in self.faults.values() {
            let node = if node == u32::MAX {
                OTHER.to_owned()
            } else {
                node.to_string()
            };
            e.sample(
                HF,
                &[("numa_node", &node), ("hugepage_size", &size)],
                n as f64,
            );
        }
        const CE: &str = "hugepage_agent_cgroup_events_total";
        e.family(
            CE,
            Kind::Counter,
            "Cgroup events seen by the eBPF probes, every hierarchy.",
        );
        for (change, n) in self.cgroup_events.values() {
            e.sample(CE, &[("event", change)], n as f64);
        }
        let probes = self.probes.lock().map(|p| *p).unwrap_or_default();
        const LOST: &str = "hugepage_agent_ring_buffer_lost_events_total";
        e.family(
            LOST,
            Kind::Counter,
            "Events the eBPF programs could not write because their ring buffer was full.",
        );
        e.sample(
            LOST,
            &[("ring_buffer", "hugetlb_faults")],
            probes.hugetlb_faults_lost as f64,
        );
        e.sample(
            LOST,
            &[("ring_buffer", "cgroup_events")],
            probes.cgroup_events_lost as f64,
        );
        e.sample(
            LOST,
            &[("ring_buffer", "hugetlbfs_events")],
            probes.hugetlbfs_events_lost as f64,
        );
        const BUSY: &str = "hugepage_agent_find_vma_busy_total";
        e.family(BUSY, Kind::Counter, "Faults bpf_find_vma could not inspect because the mmap lock was held (possibly missed; sysfs covers them).");
        e.sample(BUSY, &[], probes.find_vma_busy as f64);
        const EM: &str = "hugepage_agent_event_to_map_seconds";
        e.family(
            EM,
            Kind::Histogram,
            "Delay from a hugetlb fault seen by eBPF to the map snapshot that shows its effect.",
        );
        e.histogram(EM, &[], &self.event_to_map.value());
        self.traces.encode(e);
        encode_tls(&self.tls, e);
        let listeners = [
            ("api", &*self.api_connections),
            ("metrics", &*self.metrics_connections),
        ];
        connections::encode("hugepage_agent", &listeners, e);
        self.watch.encode(e);
    }
}

#[cfg(test)]
mod tests;

/// The TLS listener's refused handshakes and reloads.
fn encode_tls(tls: &TlsStats, e: &mut Encoder) {
    const HF: &str = "hugepage_agent_tls_handshake_failures_total";
    e.family(
        HF,
        Kind::Counter,
        "TLS handshakes of the API listener that failed, by why (client certificates refused among them).",
    );
    for why in Refusal::ALL {
        e.sample(HF, &[("reason", why.label())], tls.refusals(why) as f64);
    }
    const RL: &str = "hugepage_agent_tls_reloads_total";
    e.family(
        RL,
        Kind::Counter,
        "Changed TLS files: loaded (reloaded), or refused and the previous material kept (rejected).",
    );
    for (result, n) in [("reloaded", tls.reloads()), ("rejected", tls.rejections())] {
        e.sample(RL, &[("result", result)], n as f64);
    }
    const EX: &str = "hugepage_agent_tls_certificate_expiry_timestamp_seconds";
    e.family(
        EX,
        Kind::Gauge,
        "When the certificates in use expire (notAfter, seconds since the epoch): the served leaf (serving) and the earliest of the client CA file (client_ca); updated on every reload.",
    );
    for (certificate, at) in tls.expiry.all() {
        e.sample(EX, &[("certificate", certificate)], at as f64);
    }
}
