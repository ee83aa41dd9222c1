//! `GET /metrics`: what is read when Prometheus scrapes — the hugepage pools of the latest map
//! snapshot, the agent's reservations, PSI averages and node conditions, probe state, build
//! info, the kubelet settings in use — followed by the event-driven families of
//! [`super::metrics`]. Every label value comes from the host (nodes, sizes, the kubelet's
//! settings), PSI's fixed sets, or the condition types; none from a request.

use std::{collections::BTreeMap, time::SystemTime};

use super::{
    encode::{Encoder, Format, Kind},
    metrics::Metrics,
};
use crate::{
    admission::reservations::Reservation,
    holders::Holders,
    host::PageSize,
    kubeletconfig::settings::Row,
    numa::map::{Snapshot, Stale},
    psi::{condition::Status, monitor::PsiView},
};

/// What a scrape reads besides the metrics.
#[derive(Debug)]
pub struct Sources<'a> {
    pub snapshot: &'a Snapshot,
    /// The reservations, copied out of the store.
    pub reservations: &'a [Reservation],
    pub psi: &'a PsiView,
    /// What became of the eBPF probes (`attached`, `off …`, `refused …`); `None` while starting.
    pub probes: Option<&'a str>,
    /// Sysfs reads that failed during verification.
    pub verification_sysfs_errors: u64,
    /// The node's kubelet settings in use: name → value and source.
    pub kubelet: &'a BTreeMap<String, Row>,
    /// Whether the kubelet would not start with them on this machine.
    pub kubelet_refused: bool,
    /// The latest walk of the hugepages' holders, when one could be made.
    pub holders: Option<&'a Holders>,
}

/// The whole exposition.
pub fn render(format: Format, metrics: &Metrics, s: &Sources<'_>) -> String {
    let mut e = Encoder::new(format);
    const BUILD: &str = "hugepage_agent_build_info";
    e.family(BUILD, Kind::Gauge, "Always 1: the agent's version.");
    e.sample(BUILD, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    pools(&mut e, s);
    reservations(&mut e, s);
    const ATTACHED: &str = "hugepage_agent_probes_attached";
    e.family(ATTACHED, Kind::Gauge, "1 while the eBPF probes are attached; 0 when they are off or refused (the map then comes from sysfs polling) or not attached yet.");
    e.sample(
        ATTACHED,
        &[],
        f64::from(u8::from(s.probes == Some("attached"))),
    );
    const SYSFS: &str = "hugepage_agent_verification_sysfs_errors_total";
    e.family(
        SYSFS,
        Kind::Counter,
        "Sysfs reads that failed during verification (--on-sysfs-error decides the answer).",
    );
    e.sample(SYSFS, &[], s.verification_sysfs_errors as f64);
    const KUBELET: &str = "hugepage_agent_kubelet_setting_info";
    e.family(KUBELET, Kind::Gauge, "Always 1: each kubelet setting the agent selects NUMA nodes with, its value, and where it came from (kubelet command line, file, drop-in, flag, default).");
    for (setting, row) in s.kubelet {
        e.sample(
            KUBELET,
            &[
                ("setting", setting),
                ("value", &row.value),
                ("source", &row.source),
            ],
            1.0,
        );
    }
    const REFUSED: &str = "hugepage_agent_kubelet_settings_refused";
    e.family(REFUSED, Kind::Gauge, "1 while the kubelet would not start with the settings above on this machine (its Topology Manager refuses them: GET /v1/kubelet says why); the agent then verifies only requests that name their NUMA nodes. 0 otherwise.");
    e.sample(REFUSED, &[], f64::from(u8::from(s.kubelet_refused)));
    psi(&mut e, s.psi);
    holders(&mut e, s.holders);
    metrics.encode(&mut e);
    e.finish()
}

fn pools(e: &mut Encoder, s: &Sources<'_>) {
    let now = SystemTime::now();
    let stale_for = |mark: &Option<Stale>| {
        mark.as_ref().map_or(0.0, |m| {
            now.duration_since(m.since).map_or(0.0, |d| d.as_secs_f64())
        })
    };
    let rows: Vec<(String, String, [u64; 3], f64)> = s
        .snapshot
        .nodes
        .iter()
        .flat_map(|n| {
            n.sizes.iter().map(move |p| {
                (
                    n.info.node.0.to_string(),
                    PageSize(p.page_size_bytes).to_string(),
                    [p.total, p.free, p.surplus],
                    stale_for(&p.stale),
                )
            })
        })
        .collect();
    for (i, (name, help)) in [
        ("hugepage_agent_hugepages_pool_pages", "Hugepages in the pool (nr_hugepages), per NUMA node and page size."),
        ("hugepage_agent_hugepages_free_pages", "Free hugepages (free_hugepages, pages reserved by mappings but untouched included), per NUMA node and page size."),
        ("hugepage_agent_hugepages_surplus_pages", "Surplus hugepages (surplus_hugepages), per NUMA node and page size."),
    ]
    .into_iter()
    .enumerate()
    {
        e.family(name, Kind::Gauge, help);
        for (node, size, values, _) in &rows {
            e.sample(name, &[("numa_node", node), ("hugepage_size", size)], values[i] as f64);
        }
    }
    const STALE: &str = "hugepage_agent_hugepages_stale_seconds";
    e.family(STALE, Kind::Gauge, "How long a pool's figures above have been its last good ones because its sysfs files cannot be read (GET /v1/hugepages says why); 0 while they read.");
    for (node, size, _, stale) in &rows {
        e.sample(
            STALE,
            &[("numa_node", node), ("hugepage_size", size)],
            *stale,
        );
    }
    const RESV: &str = "hugepage_agent_hugepages_reserved_pages";
    e.family(RESV, Kind::Gauge, "Hugepages reserved by mappings but not yet faulted (resv_hugepages; the kernel keeps it system-wide only), per page size.");
    for g in &s.snapshot.global {
        e.sample(
            RESV,
            &[("hugepage_size", &g.pool.size.to_string())],
            g.pool.reserved as f64,
        );
    }
    const RESV_STALE: &str = "hugepage_agent_hugepages_reserved_stale_seconds";
    e.family(RESV_STALE, Kind::Gauge, "How long the system-wide figures of a page size (reserved pages above) have been the last good ones because their sysfs files cannot be read; 0 while they read.");
    for g in &s.snapshot.global {
        e.sample(
            RESV_STALE,
            &[("hugepage_size", &g.pool.size.to_string())],
            stale_for(&g.stale),
        );
    }
    const UPDATED: &str = "hugepage_agent_map_updated_timestamp_seconds";
    e.family(
        UPDATED,
        Kind::Gauge,
        "When the hugepage map was last read from sysfs (Unix time).",
    );
    let at = s
        .snapshot
        .updated_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    e.sample(UPDATED, &[("source", &s.snapshot.source.to_string())], at);
}

fn reservations(e: &mut Encoder, s: &Sources<'_>) {
    let now = SystemTime::now();
    const HELD: &str = "hugepage_agent_reserved_by_agent_bytes";
    e.family(HELD, Kind::Gauge, "Bytes held by the agent's reservations for admitted pods that have not faulted their pages yet, per NUMA node they may draw from and page size.");
    for n in &s.snapshot.nodes {
        for p in &n.sizes {
            let size = PageSize(p.page_size_bytes);
            let held: u64 = s
                .reservations
                .iter()
                .filter(|r| r.expires_at > now && r.numa_nodes.contains(&n.info.node))
                .filter_map(|r| r.bytes.get(&size))
                .sum();
            e.sample(
                HELD,
                &[
                    ("numa_node", &n.info.node.0.to_string()),
                    ("hugepage_size", &size.to_string()),
                ],
                held as f64,
            );
        }
    }
    const ACTIVE: &str = "hugepage_agent_reservations";
    e.family(ACTIVE, Kind::Gauge, "Reservations in force.");
    let active = s.reservations.iter().filter(|r| r.expires_at > now).count();
    e.sample(ACTIVE, &[], active as f64);
}

fn psi(e: &mut Encoder, view: &PsiView) {
    const RATIO: &str = "hugepage_agent_psi_stall_ratio";
    e.family(RATIO, Kind::Gauge, "Share of wall time tasks stalled (PSI avg10/avg60/avg300 as a ratio), per scope, resource and line (some, full).");
    const TOTAL: &str = "hugepage_agent_psi_stall_seconds_total";
    let mut totals = Vec::new();
    for r in &view.readings {
        let (scope, resource) = (r.scope.to_string(), r.resource.to_string());
        for (line, values) in std::iter::once(("some", &r.pressure.some))
            .chain(r.pressure.full.as_ref().map(|f| ("full", f)))
        {
            for (window, avg) in [
                ("10s", values.avg10),
                ("60s", values.avg60),
                ("300s", values.avg300),
            ] {
                e.sample(
                    RATIO,
                    &[
                        ("scope", &scope),
                        ("resource", &resource),
                        ("line", line),
                        ("window", window),
                    ],
                    avg / 100.0,
                );
            }
            totals.push((scope.clone(), resource.clone(), line, values.total));
        }
    }
    e.family(
        TOTAL,
        Kind::Counter,
        "Total time tasks stalled (PSI total), per scope, resource and line.",
    );
    for (scope, resource, line, micros) in totals {
        e.sample(
            TOTAL,
            &[("scope", &scope), ("resource", &resource), ("line", line)],
            micros as f64 / 1e6,
        );
    }
    const CONDITION: &str = "hugepage_agent_node_condition";
    e.family(
        CONDITION,
        Kind::Gauge,
        "PSI node conditions (KEP-5394): 1 for the condition's current status, 0 for the others.",
    );
    for c in &view.conditions {
        for (status, name) in [
            (Status::True, "True"),
            (Status::False, "False"),
            (Status::Unknown, "Unknown"),
        ] {
            e.sample(
                CONDITION,
                &[("condition", &c.kind), ("status", name)],
                f64::from(u8::from(c.status == status)),
            );
        }
    }
}

/// The holders' families: bytes held by nothing that runs per size and node, bytes per kind of
/// holder, and how many parts of the host the walk could not read.
fn holders(e: &mut Encoder, held: Option<&Holders>) {
    const NOTHING: &str = "hugepage_agent_hugepages_held_by_nothing_that_runs_bytes";
    e.family(NOTHING, Kind::Gauge, "Bytes of hugepages that hugetlbfs files and SysV segments hold while no process maps them, holds them open or attaches them (GET /v1/consumers names each), per page size and NUMA node; numa_node=\"unknown\" for the pages no process maps, whose node the kernel does not show.");
    const HELD: &str = "hugepage_agent_hugepages_held_bytes";
    e.family(HELD, Kind::Gauge, "Bytes of hugepages in use per page size and holder: private (running processes' private mappings), shared_anonymous, files (hugetlbfs), segments (SysV), memfds, and unexplained (in use, explained by none of these).");
    const UNREAD: &str = "hugepage_agent_hugepage_holders_unread";
    e.family(UNREAD, Kind::Gauge, "Parts of the host the walk of the holders could not read (the host's mounts, a mount, other processes' mappings without CAP_SYS_PTRACE or the task iterators, the nodes of the pages the iterators told, /proc/sysvipc/shm; GET /v1/consumers says which): what they hold may be counted as unexplained. 0 when it read everything.");
    let Some(held) = held else {
        return;
    };
    for a in &held.accounts {
        let size = PageSize(a.page_size_bytes).to_string();
        let placed: u64 = a.held_by_nothing_that_runs_per_node.values().sum();
        for (node, bytes) in &a.held_by_nothing_that_runs_per_node {
            let node = node.0.to_string();
            e.sample(
                NOTHING,
                &[("hugepage_size", &size), ("numa_node", &node)],
                *bytes as f64,
            );
        }
        let unknown = a.held_by_nothing_that_runs_bytes.saturating_sub(placed);
        e.sample(
            NOTHING,
            &[("hugepage_size", &size), ("numa_node", "unknown")],
            unknown as f64,
        );
        for (holder, bytes) in [
            ("private", a.private_bytes),
            ("shared_anonymous", a.shared_anonymous_bytes),
            ("files", a.files_bytes),
            ("segments", a.segments_bytes),
            ("memfds", a.memfds_bytes),
            ("unexplained", a.unexplained_bytes),
        ] {
            e.sample(
                HELD,
                &[("hugepage_size", &size), ("holder", holder)],
                bytes as f64,
            );
        }
    }
    e.sample(UNREAD, &[], held.unread.len() as f64);
}
