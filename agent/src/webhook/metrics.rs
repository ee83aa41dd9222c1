//! The webhook's own metrics, served at `GET /metrics` (Prometheus text, OpenMetrics when asked):
//! calls by endpoint and result, admission requests by verdict, pod creations given the second
//! scheduler or not, candidate nodes by how they were
//! judged, the Node cache's size and watch errors, the nodes kept (fail-open) or filtered out (fail-closed) because their agent did not answer, and the
//! latency of the agent calls that completed (a call abandoned at the deadline is counted as a
//! node without an answer, not timed); the agents' streams (fresh and stale, ended), the
//! candidates judged from their table and the bindings that table had wrong; the reservations
//! released unconfirmed ([`super::confirm`]); the reloads of its
//! TLS files, served and agent client ones; its listener's connections and what its limits cut; and the trace exporter's spans
//! exported and dropped. Every series exists from the start
//! at zero; no label carries a pod or a node.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{FailurePolicy, mutate::Judged};
use crate::{
    telemetry::{
        connections::{self, ConnectionStats},
        encode::{Encoder, Format, Kind},
        export::ExportStats,
        metrics::Histogram,
    },
    tls::{Refusal, TlsStats},
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
    Validate,
    Mutate,
}

const ENDPOINTS: [&str; 4] = ["filter", "prioritize", "validate", "mutate"];
/// Per [`super::mutate::Judged`], in its order.
const ASSIGNMENTS: [&str; 3] = ["assigned", "untouched", "unreadable"];
/// Per [`Verdict`], in its order.
const VERDICTS: [&str; 6] = [
    "allowed",
    "denied",
    "not_checked",
    "fail_open",
    "fail_closed",
    "invalid",
];
const RESULTS: [&str; 2] = ["answered", "error"];
const JUDGED: [&str; 5] = ["fit", "misfit", "unresolvable", "no_answer", "unknown"];

/// How a candidate node was judged, as `hugepage_agent_webhook_nodes_total{judged}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Fit,
    Misfit,
    Unresolvable,
    NoAnswer,
    /// Not in the Node cache.
    Unknown,
}

/// How an admission request was answered, as
/// `hugepage_agent_webhook_admissions_total{verdict}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The agent admitted (and reserved, unless a dry run).
    Allowed,
    /// The agent refused.
    Denied,
    /// Nothing to check: not a binding or placed pod, or no hugepages.
    NotChecked,
    /// Not verified and allowed (`--failure-policy ignore`).
    FailOpen,
    /// Not verified and denied (`--failure-policy fail`).
    FailClosed,
    /// The request could not be read.
    Invalid,
}

/// Why a reservation was released ([`super::confirm`]), per `hugepage_agent_webhook_unconfirmed_reservations_total`'s
/// `reason`, in [`UNCONFIRMED`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unconfirmed {
    /// The pod is not bound to any node.
    NotBound,
    /// The pod is bound to another node.
    BoundElsewhere,
    /// The API has no such pod.
    Gone,
    /// The pod of that name has another UID.
    UidChanged,
    /// The pod could not be read.
    Unreadable,
    /// The same pod was reserved on another node since.
    Moved,
}

pub const UNCONFIRMED: [&str; 6] = [
    "not_bound",
    "bound_elsewhere",
    "gone",
    "uid_changed",
    "unreadable",
    "moved",
];

#[derive(Debug)]
pub struct Metrics {
    /// Per endpoint, per result.
    calls: [[AtomicU64; 2]; 4],
    /// Pod creations judged by `/admission/mutate`, per [`ASSIGNMENTS`].
    assignments: [AtomicU64; 3],
    /// Admission requests per [`VERDICTS`].
    admissions: [AtomicU64; 6],
    /// Per [`JUDGED`].
    nodes: [AtomicU64; 5],
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    agent_calls: Histogram,
    /// Nodes in the Node cache.
    cached_nodes: AtomicU64,
    /// Failed list or watch calls of the Node cache.
    watch_errors: AtomicU64,
    /// Failed list or watch calls of the agents' pods (`--agent-identity per-pod`).
    pod_watch_errors: AtomicU64,
    /// The agents' streams: fresh and stale now, ended so far.
    streams: [AtomicU64; 2],
    /// Agents outside the version-skew policy now.
    outside_skew: AtomicU64,
    stream_ends: AtomicU64,
    /// Candidates judged from the table, without an agent call.
    table_answers: AtomicU64,
    /// Bindings the agent refused while the table had the node fit.
    table_disagreements: AtomicU64,
    /// Reservations released unconfirmed, per [`UNCONFIRMED`].
    unconfirmed: [AtomicU64; UNCONFIRMED.len()],
    /// The served files' reloads (`--tls-cert-file`, `--tls-private-key-file`).
    pub tls: Arc<TlsStats>,
    /// The agent client files' reloads (`--agent-ca-file`, `--agent-client-*-file`).
    pub agent_tls: Arc<TlsStats>,
    /// The listener's connections and limits (`listener="webhook"`).
    pub connections: Arc<ConnectionStats>,
    /// The plain metrics listener's (`--metrics-listen`, `listener="metrics"`).
    pub metrics_connections: Arc<ConnectionStats>,
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
            assignments: Default::default(),
            admissions: Default::default(),
            nodes: Default::default(),
            fail_open: AtomicU64::new(0),
            fail_closed: AtomicU64::new(0),
            agent_calls: Histogram::new(&AGENT_CALL_BUCKETS),
            cached_nodes: AtomicU64::new(0),
            watch_errors: AtomicU64::new(0),
            pod_watch_errors: AtomicU64::new(0),
            streams: Default::default(),
            outside_skew: AtomicU64::new(0),
            stream_ends: AtomicU64::new(0),
            table_answers: AtomicU64::new(0),
            table_disagreements: AtomicU64::new(0),
            unconfirmed: Default::default(),
            tls: Arc::default(),
            agent_tls: Arc::default(),
            connections: Arc::default(),
            metrics_connections: Arc::default(),
            traces,
        }
    }

    /// A scheduler call answered (or failed with an `error`).
    pub fn call(&self, endpoint: Endpoint, answered: bool) {
        let e = endpoint as usize;
        self.calls[e][usize::from(!answered)].fetch_add(1, Ordering::Relaxed);
    }

    /// An admission request answered.
    pub fn admission(&self, verdict: Verdict) {
        self.admissions[verdict as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A pod creation judged by `/admission/mutate`.
    pub fn assignment(&self, judged: &Judged) {
        let i = match judged {
            Judged::Assigned(_) => 0,
            Judged::Untouched(_) => 1,
            Judged::Unreadable(_) => 2,
        };
        self.assignments[i].fetch_add(1, Ordering::Relaxed);
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

    /// The Node cache holds `nodes` Nodes.
    pub fn node_list(&self, nodes: usize) {
        self.cached_nodes.store(nodes as u64, Ordering::Relaxed);
    }

    /// A list or watch call of the Node cache failed (it is retried).
    pub fn node_watch_error(&self) {
        self.watch_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A list or watch call of the agents' pods failed (it is retried).
    pub fn agent_pod_watch_error(&self) {
        self.pod_watch_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The agents' streams now: fresh, stale, and outside the version-skew policy.
    pub fn streams(&self, fresh: usize, stale: usize, outside_skew: usize) {
        self.streams[0].store(fresh as u64, Ordering::Relaxed);
        self.streams[1].store(stale as u64, Ordering::Relaxed);
        self.outside_skew
            .store(outside_skew as u64, Ordering::Relaxed);
    }

    /// An agent's stream ended (it is connected again after a back-off).
    pub fn stream_ended(&self) {
        self.stream_ends.fetch_add(1, Ordering::Relaxed);
    }

    /// `count` candidates of one call judged from the table.
    pub fn table_answers(&self, count: usize) {
        self.table_answers
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    /// A binding the agent refused while the table had its node fit.
    pub fn table_disagreement(&self) {
        self.table_disagreements.fetch_add(1, Ordering::Relaxed);
    }

    /// A reservation released because the API did not confirm it, and why.
    pub fn unconfirmed(&self, why: Unconfirmed) {
        self.unconfirmed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition.
    pub fn render(&self, format: Format) -> String {
        let mut e = Encoder::new(format);
        const CALLS: &str = "hugepage_agent_webhook_calls_total";
        e.family(CALLS, Kind::Counter, "Calls, per endpoint (the extender's filter and prioritize, the admission webhooks' validate and mutate) and result (error: the answer carried an error or was a 400).");
        for (endpoint, per) in ENDPOINTS.iter().zip(&self.calls) {
            for (result, n) in RESULTS.iter().zip(per) {
                let labels = [("endpoint", *endpoint), ("result", *result)];
                e.sample(CALLS, &labels, n.load(Ordering::Relaxed) as f64);
            }
        }
        const ADMISSIONS: &str = "hugepage_agent_webhook_admissions_total";
        e.family(ADMISSIONS, Kind::Counter, "Admission requests (bindings, pods created on a node) by verdict: allowed or denied by the node's agent, not_checked (nothing to verify), fail_open or fail_closed (not verified: --failure-policy), invalid (unreadable).");
        for (verdict, n) in VERDICTS.iter().zip(&self.admissions) {
            e.sample(
                ADMISSIONS,
                &[("verdict", verdict)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
        const ASSIGNED: &str = "hugepage_agent_webhook_scheduler_assignments_total";
        e.family(ASSIGNED, Kind::Counter, "Pod creations judged by /admission/mutate (component scheduler-by-default-webhook): assigned (given --scheduler-name), untouched (names a scheduler or a node, asks for no hugepages, or not a pod creation), unreadable (left as it was, with a warning).");
        for (result, n) in ASSIGNMENTS.iter().zip(&self.assignments) {
            e.sample(
                ASSIGNED,
                &[("result", result)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
        const NODES: &str = "hugepage_agent_webhook_nodes_total";
        e.family(NODES, Kind::Counter, "Candidate nodes judged, by how: the agent's dry run fit or misfit, unresolvable by the Node's allocatable hugepages, no answer from the agent, or unknown (a name not in the Node cache).");
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
        const CACHED: &str = "hugepage_agent_webhook_cached_nodes";
        e.family(
            CACHED,
            Kind::Gauge,
            "Nodes in the webhook's Node cache (list+watch of the API server's Nodes).",
        );
        e.sample(
            CACHED,
            &[],
            self.cached_nodes.load(Ordering::Relaxed) as f64,
        );
        const WATCH: &str = "hugepage_agent_webhook_node_watch_errors_total";
        e.family(
            WATCH,
            Kind::Counter,
            "Failed list or watch calls of the Node cache, each retried with backoff (a 410 Gone is one, followed by a new list).",
        );
        e.sample(WATCH, &[], self.watch_errors.load(Ordering::Relaxed) as f64);
        const POD_WATCH: &str = "hugepage_agent_webhook_agent_pod_watch_errors_total";
        e.family(
            POD_WATCH,
            Kind::Counter,
            "Failed list or watch calls of the agents' pods (--agent-identity per-pod), each retried with backoff; never counted under the other identities.",
        );
        let pod_watch_errors = self.pod_watch_errors.load(Ordering::Relaxed);
        e.sample(POD_WATCH, &[], pod_watch_errors as f64);
        const STREAMS: &str = "hugepage_agent_webhook_streams";
        e.family(STREAMS, Kind::Gauge, "The agents' map streams (GET /v1/hugepages?watch=true), one per node with a known address: fresh (heard within --stream-fresh-within) or stale (not heard within it, ended, or not connected yet).");
        for (state, n) in ["fresh", "stale"].iter().zip(&self.streams) {
            e.sample(
                STREAMS,
                &[("state", state)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
        const SKEW: &str = "hugepage_agent_webhook_agents_outside_version_skew";
        e.family(SKEW, Kind::Gauge, "Agents whose stream names a version of another major or minor than the webhook's, or none (an agent older than the field): outside the version-skew policy, still followed and asked. /readyz names their nodes.");
        e.sample(SKEW, &[], self.outside_skew.load(Ordering::Relaxed) as f64);
        const ENDS: &str = "hugepage_agent_webhook_stream_ends_total";
        e.family(ENDS, Kind::Counter, "Agents' streams that ended (the agent restarted, the connection broke or fell silent, the agent refused the watch) and were connected again after a back-off.");
        e.sample(ENDS, &[], self.stream_ends.load(Ordering::Relaxed) as f64);
        const TABLE: &str = "hugepage_agent_webhook_table_answers_total";
        e.family(TABLE, Kind::Counter, "Candidate nodes of filter and prioritize judged from the streamed table, without an agent call (also counted in hugepage_agent_webhook_nodes_total).");
        e.sample(
            TABLE,
            &[],
            self.table_answers.load(Ordering::Relaxed) as f64,
        );
        const DISAGREE: &str = "hugepage_agent_webhook_table_disagreements_total";
        e.family(DISAGREE, Kind::Counter, "Bindings the node's agent refused on its fresh sysfs reads while the streamed table had the node fit: the table was behind the kernel.");
        e.sample(
            DISAGREE,
            &[],
            self.table_disagreements.load(Ordering::Relaxed) as f64,
        );
        const UNCONFIRMED_TOTAL: &str = "hugepage_agent_webhook_unconfirmed_reservations_total";
        e.family(UNCONFIRMED_TOTAL, Kind::Counter, "Reservations a binding made that the API did not confirm within --reservation-confirm-within, released on the agent, by reason: not_bound (the pod is not bound), bound_elsewhere (bound to another node), gone (no such pod), uid_changed (the name is another pod now), unreadable (the pod could not be read), moved (the same pod reserved on another node since: released at once).");
        for (reason, n) in UNCONFIRMED.iter().zip(&self.unconfirmed) {
            e.sample(
                UNCONFIRMED_TOTAL,
                &[("reason", reason)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
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
        const FAILURES: &str = "hugepage_agent_webhook_tls_handshake_failures_total";
        e.family(
            FAILURES,
            Kind::Counter,
            "TLS handshakes of the webhook's listener that failed, by why (client certificates refused, and name_not_allowed: a certificate of --client-ca-file with none of --client-names, closed after the handshake).",
        );
        for why in Refusal::ALL {
            let n = self.tls.refusals(why);
            e.sample(FAILURES, &[("reason", why.label())], n as f64);
        }
        const EXPIRY: &str = "hugepage_agent_webhook_tls_certificate_expiry_timestamp_seconds";
        e.family(EXPIRY, Kind::Gauge, "When the certificates in use expire (notAfter, seconds since the epoch): the served leaf (serving), the earliest of the callers' CA file (client_ca), the client certificate presented to the agents (agent_client) and the earliest of the agents' CA file (agent_ca); updated on every reload.");
        for stats in [&self.tls, &self.agent_tls] {
            for (certificate, at) in stats.expiry.all() {
                e.sample(EXPIRY, &[("certificate", certificate)], at as f64);
            }
        }
        let listener = [
            ("webhook", &*self.connections),
            ("metrics", &*self.metrics_connections),
        ];
        connections::encode("hugepage_agent_webhook", &listener, &mut e);
        self.traces.encode(&mut e);
        e.finish()
    }
}

#[cfg(test)]
mod tests;
