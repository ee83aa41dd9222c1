//! The webhook's own metrics, served at `GET /metrics` (Prometheus text, OpenMetrics when asked):
//! scheduler calls by endpoint and result, candidate nodes by how they were judged, the nodes
//! kept (fail-open) or filtered out (fail-closed) because their agent did not answer, and the
//! latency of the agent calls that completed (a call abandoned at the deadline is counted as a
//! node without an answer, not timed); the reloads of its TLS files, served and agent client
//! ones; and the trace exporter's spans exported and dropped. Every series exists from the start
//! at zero; no label carries a pod or a node.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::FailurePolicy;
use crate::{
    telemetry::{
        encode::{Encoder, Format, Kind},
        export::ExportStats,
        metrics::Histogram,
    },
    tls::TlsStats,
};

/// From a connection on the same network to an agent that waits on nothing: milliseconds, up
/// to the deadline's seconds.
pub const AGENT_CALL_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A scheduler call's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Filter,
    Prioritize,
}

const ENDPOINTS: [&str; 2] = ["filter", "prioritize"];
const RESULTS: [&str; 2] = ["answered", "error"];
const JUDGED: [&str; 4] = ["fit", "misfit", "unresolvable", "no_answer"];

/// How a candidate node was judged, as `hugepage_agent_webhook_nodes_total{judged}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Fit,
    Misfit,
    Unresolvable,
    NoAnswer,
}

#[derive(Debug)]
pub struct Metrics {
    /// Per endpoint, per result.
    calls: [[AtomicU64; 2]; 2],
    /// Per [`JUDGED`].
    nodes: [AtomicU64; 4],
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    agent_calls: Histogram,
    /// The served files' reloads (`--tls-cert-file`, `--tls-private-key-file`).
    pub tls: Arc<TlsStats>,
    /// The agent client files' reloads (`--agent-ca-file`, `--agent-client-*-file`).
    pub agent_tls: Arc<TlsStats>,
    traces: Arc<ExportStats>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(Arc::default())
    }
}

impl Metrics {
    /// Counting from zero; `traces` are the trace exporter's counters.
    pub fn new(traces: Arc<ExportStats>) -> Metrics {
        Metrics {
            calls: Default::default(),
            nodes: Default::default(),
            fail_open: AtomicU64::new(0),
            fail_closed: AtomicU64::new(0),
            agent_calls: Histogram::new(&AGENT_CALL_BUCKETS),
            tls: Arc::default(),
            agent_tls: Arc::default(),
            traces,
        }
    }

    /// A scheduler call answered (or failed with an `error`).
    pub fn call(&self, endpoint: Endpoint, answered: bool) {
        let e = endpoint as usize;
        self.calls[e][usize::from(!answered)].fetch_add(1, Ordering::Relaxed);
    }

    /// One candidate judged.
    pub fn node(&self, outcome: Outcome) {
        self.nodes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `count` nodes of a filter call kept or filtered out by `policy` for want of an answer.
    pub fn unanswered(&self, policy: FailurePolicy, count: usize) {
        let counter = match policy {
            FailurePolicy::Ignore => &self.fail_open,
            FailurePolicy::Fail => &self.fail_closed,
        };
        counter.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// An agent call that completed (answered or failed) after `took`.
    pub fn agent_call(&self, took: Duration) {
        self.agent_calls.observe(took);
    }

    /// The exposition.
    pub fn render(&self, format: Format) -> String {
        let mut e = Encoder::new(format);
        const CALLS: &str = "hugepage_agent_webhook_calls_total";
        e.family(CALLS, Kind::Counter, "Scheduler extender calls, per endpoint and result (error: the answer carried an error or was a 400).");
        for (endpoint, per) in ENDPOINTS.iter().zip(&self.calls) {
            for (result, n) in RESULTS.iter().zip(per) {
                let labels = [("endpoint", *endpoint), ("result", *result)];
                e.sample(CALLS, &labels, n.load(Ordering::Relaxed) as f64);
            }
        }
        const NODES: &str = "hugepage_agent_webhook_nodes_total";
        e.family(NODES, Kind::Counter, "Candidate nodes judged, by how: the agent's dry run fit or misfit, unresolvable by the Node's allocatable hugepages, or no answer from the agent.");
        for (judged, n) in JUDGED.iter().zip(&self.nodes) {
            e.sample(
                NODES,
                &[("judged", judged)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
        const OPEN: &str = "hugepage_agent_webhook_fail_open_total";
        e.family(OPEN, Kind::Counter, "Nodes kept by a filter call although their agent did not answer (--failure-policy ignore).");
        e.sample(OPEN, &[], self.fail_open.load(Ordering::Relaxed) as f64);
        const CLOSED: &str = "hugepage_agent_webhook_fail_closed_total";
        e.family(
            CLOSED,
            Kind::Counter,
            "Nodes filtered out because their agent did not answer (--failure-policy fail).",
        );
        e.sample(CLOSED, &[], self.fail_closed.load(Ordering::Relaxed) as f64);
        const LATENCY: &str = "hugepage_agent_webhook_agent_call_seconds";
        e.family(
            LATENCY,
            Kind::Histogram,
            "Agent dry-run calls that completed, connection and TLS handshake included.",
        );
        e.histogram(LATENCY, &[], &self.agent_calls.value());
        const RELOADS: &str = "hugepage_agent_webhook_tls_reloads_total";
        e.family(RELOADS, Kind::Counter, "Changed TLS files, served or the agent client's: loaded (reloaded), or refused and the previous material kept (rejected).");
        for (files, stats) in [("serving", &self.tls), ("agent_client", &self.agent_tls)] {
            for (result, n) in [
                ("reloaded", stats.reloads()),
                ("rejected", stats.rejections()),
            ] {
                let labels = [("files", files), ("result", result)];
                e.sample(RELOADS, &labels, n as f64);
            }
        }
        self.traces.encode(&mut e);
        e.finish()
    }
}

#[cfg(test)]
mod tests;
