//! `POST /v1/admit`: both body forms, validated, then verified on the requested NUMA nodes (all
//! nodes until topology hints select them). The logic is [`admit`], a plain function of the
//! state and the raw request; the handler only extracts and maps.
//!
//! Each admission is a span ([`span`]) with the pod, sizes, NUMA nodes, bytes, result and
//! reason as attributes, and its steps as children: `hint` (choosing the NUMA nodes),
//! `verification` (the fresh sysfs read) and `reservation`. It also counts in the metrics.

use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::field::Empty;

use super::{AppState, error::ApiError};
use crate::{
    admission::{
        request::{self, Hugepages, PodSpec, ResourceList},
        reservations::{self, Released, Reservation},
        verify::{Verdict, VerifyError},
    },
    numa::NumaNode,
    psi::condition::NodeCondition,
};

/// Largest body accepted.
pub const BODY_LIMIT: usize = 1 << 20;

/// Who is asking (echoed in the answer and the log).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
}

/// The short form.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ShortForm {
    #[serde(default)]
    pod: PodRef,
    containers: Vec<ShortContainer>,
    numa_nodes: Option<Vec<u32>>,
    topology_policy: Option<String>,
    scope: Option<String>,
}

/// A container of the short form (its `name`, if given, is not needed for the check).
#[derive(Debug, Deserialize)]
struct ShortContainer {
    #[serde(default)]
    resources: ResourceList,
}

/// A whole `v1.Pod` (only what admission reads; other fields are ignored, as Kubernetes objects
/// carry many).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodForm {
    #[serde(default)]
    metadata: Metadata,
    spec: PodSpec,
    #[serde(default)]
    status: Status,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    qos_class: Option<String>,
}

/// The answer: the verdict and who it is for.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    #[serde(flatten)]
    pub verdict: Verdict,
    pub pod: PodRef,
}

const POLICIES: [&str; 4] = ["none", "best-effort", "restricted", "single-numa-node"];
const SCOPES: [&str; 2] = ["container", "pod"];

/// The span of one admission, its attributes recorded by [`admit`]. Debug level: it reaches the
/// trace exporter, and the log only at `RUST_LOG=debug`.
pub fn span() -> tracing::Span {
    tracing::debug_span!(
        "admission",
        otel.kind = "server",
        k8s.pod.name = Empty,
        k8s.namespace.name = Empty,
        k8s.pod.uid = Empty,
        hugepage.sizes = Empty,
        hugepage.numa_nodes = Empty,
        hugepage.requested_bytes = Empty,
        hugepage.available_bytes = Empty,
        admission.result = Empty,
        admission.reason = Empty,
        admission.message = Empty,
    )
}

/// The steps of an admission, each a child span of it.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Choosing the NUMA nodes (topology hints will do it here).
    Hint,
    /// KEP-5759's fresh sysfs read.
    Verification,
    /// Subtracting other pods' reservations and reserving for this one.
    Reservation,
}

impl Step {
    fn span(self) -> tracing::Span {
        match self {
            Step::Hint => {
                tracing::debug_span!("hint", hugepage.numa_nodes = Empty, hint.source = Empty)
            }
            Step::Verification => tracing::debug_span!("verification"),
            Step::Reservation => tracing::debug_span!("reservation", reservation.id = Empty),
        }
    }
}

/// Validates and verifies one admission request.
pub fn admit(
    state: &AppState,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Answer, ApiError> {
    let json = content_type.is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json {
        return Err(ApiError::unsupported_media(content_type));
    }
    // A first pass that skips every value (no allocation) tells the two forms apart.
    let shape: Shape = serde_json::from_slice(body).map_err(json_error)?;
    let (pod, request, nodes) = if shape.spec.is_some() {
        from_pod(body)?
    } else {
        from_short(body)?
    };
    let span = tracing::Span::current();
    // A trace the sampler dropped gets no children and no attributes: they would cost every
    // admission and never be exported.
    let sampled = crate::telemetry::traces::is_sampled(&span);
    let step = |step: Step| {
        if sampled {
            step.span()
        } else {
            tracing::Span::none()
        }
    };
    if sampled {
        span.record("k8s.pod.name", pod.name.as_str());
        span.record("k8s.namespace.name", pod.namespace.as_str());
        span.record("k8s.pod.uid", pod.uid.as_str());
    }
    let nodes = {
        let hint = step(Step::Hint).entered();
        let (nodes, source) = match nodes {
            Some(nodes) => (nodes, "request"),
            None => (state.verifier.nodes(), "all nodes"),
        };
        if sampled {
            hint.record("hugepage.numa_nodes", node_list(&nodes).as_str());
            hint.record("hint.source", source);
        }
        nodes
    };
    // Held from the fresh read to the reservation: no other admission sees the pages in between.
    let mut store = state
        .reservations
        .lock()
        .map_err(|_| ApiError::internal("the reservation store is poisoned"))?;
    let now = SystemTime::now();
    let started = Instant::now();
    let verified = step(Step::Verification)
        .in_scope(|| state.verifier.verify(&request, &nodes, state.settings));
    let took = started.elapsed();
    let mut verdict = verified.map_err(|e| match e {
        VerifyError::UnknownNode { .. } => ApiError::invalid("numaNodes", e.to_string()),
        VerifyError::NoNodes => ApiError::invalid("numaNodes", "must name at least one NUMA node"),
    })?;
    let reservation = step(Step::Reservation).entered();
    reservations::apply(&mut verdict, &store, &pod.uid, now);
    state.metrics.verification(&verdict, took);
    if state.reject_under_pressure && !request.is_empty() {
        refuse_under_pressure(&mut verdict, state.psi.load().memory_pressure());
    }
    if verdict.allowed && !pod.uid.is_empty() && !verdict.checks.is_empty() {
        let made = store
            .reserve(&verdict, &pod.uid, &pod.namespace, &pod.name, now)
            .map_err(|e| ApiError::internal(format!("the reservation could not be saved: {e}")))?;
        reservation.record("reservation.id", made.id.as_str());
        verdict.reservation = Some(made);
    }
    drop(store);
    drop(reservation);
    state.metrics.admission(&verdict);
    if sampled {
        record_verdict(&span, &verdict);
    }
    tracing::info!(
        pod = %format_args!("{}/{}", pod.namespace, pod.name),
        uid = %pod.uid,
        allowed = verdict.allowed,
        message = verdict.message.as_deref().unwrap_or(""),
        "admission"
    );
    Ok(Answer { verdict, pod })
}

/// `DELETE /v1/reservations/{id}`: the removed reservation, or 404.
pub fn delete_reservation(state: &AppState, id: &str) -> Result<Reservation, ApiError> {
    let mut store = state
        .reservations
        .lock()
        .map_err(|_| ApiError::internal("the reservation store is poisoned"))?;
    let removed = store
        .release(|r| (r.id == id).then_some(Released::Deleted))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let (found, _) = removed
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::no_reservation(id))?;
    state.metrics.reservation_ended(Released::Deleted);
    tracing::info!(id = %found.id, pod_uid = %found.pod_uid, "reservation deleted");
    Ok(found)
}

/// The verdict's attributes on the admission span: sums over the sizes checked.
fn record_verdict(span: &tracing::Span, verdict: &Verdict) {
    let sizes: Vec<&str> = verdict.checks.iter().map(|c| c.resource.as_str()).collect();
    span.record("hugepage.sizes", sizes.join(",").as_str());
    span.record(
        "hugepage.numa_nodes",
        node_list(&verdict.numa_nodes).as_str(),
    );
    // As i64: OpenTelemetry has no unsigned integers (a u64 would arrive as a string).
    let sum = |f: fn(&crate::admission::verify::Check) -> u64| {
        let total = verdict.checks.iter().map(f).fold(0u64, u64::saturating_add);
        i64::try_from(total).unwrap_or(i64::MAX)
    };
    span.record("hugepage.requested_bytes", sum(|c| c.requested_bytes));
    span.record("hugepage.available_bytes", sum(|c| c.available_bytes));
    span.record(
        "admission.result",
        if verdict.allowed {
            "admitted"
        } else {
            "rejected"
        },
    );
    span.record("admission.reason", verdict.reason.unwrap_or(""));
    span.record(
        "admission.message",
        verdict.message.as_deref().unwrap_or(""),
    );
}

/// `0,1`
fn node_list(nodes: &[NumaNode]) -> String {
    let names: Vec<String> = nodes.iter().map(|n| n.0.to_string()).collect();
    names.join(",")
}

/// The reason of a refusal under memory contention pressure.
pub const REASON_PRESSURE: &str = "NodeUnderMemoryContentionPressure";

/// `--reject-under-pressure`: a hugepage request is refused while a memory condition is True;
/// the checks still show what the kernel had.
fn refuse_under_pressure(verdict: &mut Verdict, true_condition: Option<&NodeCondition>) {
    let Some(c) = true_condition else {
        return;
    };
    verdict.allowed = false;
    verdict.reason = Some(REASON_PRESSURE);
    verdict.message = Some(format!(
        "node under memory contention pressure (--reject-under-pressure): {} is True: {}",
        c.kind, c.message
    ));
}

type Parsed = (PodRef, Hugepages, Option<Vec<NumaNode>>);

/// Which form a body is: a `v1.Pod` has a `spec`.
#[derive(Deserialize)]
struct Shape {
    #[serde(default)]
    spec: Option<serde::de::IgnoredAny>,
}

/// Invalid JSON is 400 `invalid-json`; valid JSON of the wrong shape names the field.
fn json_error(e: serde_json::Error) -> ApiError {
    match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid(".", e.to_string()),
        _ => ApiError::bad_json(e.to_string()),
    }
}

fn deserialize<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::invalid(field, inner.to_string()),
            _ => ApiError::bad_json(inner.to_string()),
        }
    })
}

fn from_short(body: &[u8]) -> Result<Parsed, ApiError> {
    let form: ShortForm = deserialize(body)?;
    if let Some(p) = form
        .topology_policy
        .as_deref()
        .filter(|p| !POLICIES.contains(p))
    {
        return Err(ApiError::invalid(
            "topologyPolicy",
            format!("{p:?} is not one of {POLICIES:?}"),
        ));
    }
    if let Some(s) = form.scope.as_deref().filter(|s| !SCOPES.contains(s)) {
        return Err(ApiError::invalid(
            "scope",
            format!("{s:?} is not one of {SCOPES:?}"),
        ));
    }
    let mut total = Hugepages::new();
    for (i, c) in form.containers.iter().enumerate() {
        let pages = request::from_list(&c.resources, &format!("containers[{i}].resources"))
            .map_err(field_error)?;
        for (size, bytes) in pages {
            let slot = total.entry(size).or_default();
            *slot = slot.saturating_add(bytes);
        }
    }
    let nodes = form
        .numa_nodes
        .map(|n| n.into_iter().map(NumaNode).collect());
    Ok((form.pod, total, nodes))
}

fn from_pod(body: &[u8]) -> Result<Parsed, ApiError> {
    let form: PodForm = deserialize(body)?;
    let request = request::pod_hugepages(&form.spec).map_err(field_error)?;
    let pod = PodRef {
        namespace: form.metadata.namespace,
        name: form.metadata.name,
        uid: form.metadata.uid,
        qos_class: form.status.qos_class,
    };
    Ok((pod, request, None))
}

fn field_error(e: request::RequestError) -> ApiError {
    ApiError::invalid(e.field, e.detail)
}
