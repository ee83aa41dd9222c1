//! `POST /v1/admit`: both body forms, validated, then verified on the requested NUMA nodes or,
//! without `numaNodes`, on those the kubelet's hints and Topology Manager policy select. The
//! logic is [`admit`], a plain function of the state and the raw request; the handler only
//! extracts and maps.
//!
//! [`admit`] decides; a reservation it made is written by
//! [`reservations::persist`](super::reservations::persist) before the answer goes out; then
//! [`conclude`] counts the admission in the metrics, puts the verdict on its span and logs it.
//!
//! Each admission is a span ([`span`]) with the pod, sizes, NUMA nodes, bytes, result and
//! reason as attributes, and its steps as children: `hint` (choosing the NUMA nodes),
//! `verification` (the fresh sysfs read) and `reservation`.

use std::time::{Instant, SystemTime};

use tracing::field::Empty;

use serde::{Deserialize, Serialize};

use super::{AppState, error::ApiError, reservations::Pending};
use crate::{
    admission::{
        plan::{self, Plan, PlanError},
        reservations,
        verify::{Gate, Settings, Verdict, VerifyError, pressure_message, refuse_under_pressure},
    },
    host::{NumaNode, PageSize},
    kube::{
        identifiers, json,
        pod::{
            self, Container, Hugepages, ObjectMeta, Pod, PodHugepages, PodSpec, PodStatus,
            Requirements, ResourceList,
        },
    },
    logging::RateLimit,
    memorymanager::{
        hints::{HintError, Scope},
        selection::{Basis, Selection},
    },
    topologymanager::Policy,
};

/// Refusal log lines per second at most.
pub const REFUSALS_PER_SECOND: u32 = 20;
static REFUSAL_LINES: RateLimit = RateLimit::new(REFUSALS_PER_SECOND);

/// Largest body accepted.
pub const BODY_LIMIT: usize = 1 << 20;

/// `--max-containers`: the most containers (app and init together) a pod in a request may have.
/// Real pods have a handful, a few dozen with sidecars at the most, and the API server sets no
/// limit of its own (only the object's size: etcd's 1.5 MiB); 256 is ten times the largest pods
/// seen, and such a pod's admission costs about a millisecond of one thread. Without a bound, a
/// 1 MiB body holds 300,000 containers.
pub const DEFAULT_MAX_CONTAINERS: u32 = 256;

/// Who is asking (echoed in the answer and the log). Each identifier is checked
/// ([`identifiers`]) before anything is done under it; empty means not given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    #[serde(default, deserialize_with = "json::or_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "json::or_default")]
    pub name: String,
    #[serde(default, deserialize_with = "json::or_default")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
}

/// The short form.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ShortForm {
    #[serde(default, deserialize_with = "json::object_or_default")]
    pod: PodRef,
    #[serde(deserialize_with = "json::objects")]
    containers: Vec<ShortContainer>,
    numa_nodes: Option<Vec<u32>>,
    topology_policy: Option<String>,
    scope: Option<String>,
}

/// A container of the short form: its resources are requests and limits at once.
#[derive(Debug, Deserialize)]
struct ShortContainer {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "json::or_default")]
    resources: ResourceList,
}

/// The answer: the verdict, who it is for, and how its NUMA nodes were selected.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    #[serde(flatten)]
    pub verdict: Verdict,
    pub pod: PodRef,
    /// The kubelet's selection (hints, merged hint, allocation), when the request named no nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
    /// A dry run ([`Run::Dry`]): shown only when true.
    #[serde(rename = "dryRun", skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// Whether an admission is real or a dry run (`POST /v1/admit?dryRun=true`). A dry run is the
/// same verification and NUMA selection, on the same state (other pods' reservations
/// subtracted), but it reserves nothing, writes nothing, and is not counted in the verification
/// or admission metrics (those count what the kubelet would admit): a scheduler extender asks
/// every candidate node for every pod, and only the node chosen admits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    Real,
    Dry,
}

impl Run {
    /// The `dryRun` query parameter: absent or `false` is a real admission, `true` a dry run;
    /// anything else is refused naming the parameter.
    pub fn from_query(query: Option<&str>) -> Result<Run, ApiError> {
        let mut run = Run::Real;
        for pair in query.unwrap_or("").split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key != "dryRun" {
                continue;
            }
            run = match value {
                "true" => Run::Dry,
                "false" => Run::Real,
                other => {
                    return Err(ApiError::invalid(
                        "dryRun",
                        format!("{} is not true or false", identifiers::Shown::new(other)),
                    ));
                }
            };
        }
        Ok(run)
    }
}

/// An admission decided, not yet counted or logged ([`conclude`]).
pub struct Decided {
    pub answer: Answer,
    /// Whether the admission's trace is sampled (its span takes the verdict's attributes).
    pub sampled: bool,
    /// The reservation the admission made, still to be written.
    pub pending: Option<Pending>,
}

/// A request, validated: who, what, and where (given, or to be selected with what policy).
pub struct Parsed {
    pub pod_ref: PodRef,
    pub pod: Pod,
    /// The pod's hugepages, per container and in all.
    pub pages: PodHugepages,
    pub nodes: Option<Vec<NumaNode>>,
    pub policy: Option<Policy>,
    pub scope: Option<Scope>,
}

impl Parsed {
    /// The pod's containers, app and init: what the work of its admission grows with.
    pub fn containers(&self) -> usize {
        self.pod.spec.containers.len() + self.pod.spec.init_containers.len()
    }
}

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
    /// Choosing the NUMA nodes: the kubelet's hints, merge and allocation.
    Hint,
    /// KEP-5759's fresh sysfs read.
    Verification,
    /// Subtracting other pods' reservations and reserving for this one.
    Reservation,
}

impl Step {
    /// The step's span; none for a trace the sampler dropped (children and attributes would
    /// cost every admission and never be exported).
    fn span(self, sampled: bool) -> tracing::Span {
        if !sampled {
            return tracing::Span::none();
        }
        match self {
            Step::Hint => {
                tracing::debug_span!("hint", hugepage.numa_nodes = Empty, hint.source = Empty)
            }
            Step::Verification => tracing::debug_span!("verification"),
            Step::Reservation => tracing::debug_span!("reservation", reservation.id = Empty),
        }
    }
}

/// Parses either body form; a pod of more than `max_containers` containers (app and init) is
/// refused before any of them is checked.
pub fn parse(
    content_type: Option<&str>,
    body: &[u8],
    max_containers: usize,
) -> Result<Parsed, ApiError> {
    let json = content_type.is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json {
        return Err(ApiError::unsupported_media(content_type));
    }
    // A first pass that skips every value (no allocation) tells the two forms apart.
    let json::Object(shape) =
        serde_json::from_slice::<json::Object<Shape>>(body).map_err(json_error)?;
    if shape.spec.0 {
        from_pod(body, max_containers)
    } else {
        from_short(body, max_containers)
    }
}

/// Refuses NUMA nodes this machine does not have, as the verification does (`POST /v1/hints`
/// reads the same body and refuses the same nodes).
pub fn known_nodes(state: &AppState, nodes: &[NumaNode]) -> Result<(), ApiError> {
    let known = state.verifier.nodes();
    match nodes.iter().find(|n| !known.contains(n)) {
        None => Ok(()),
        Some(bad) => Err(ApiError::invalid(
            "numaNodes",
            VerifyError::UnknownNode {
                node: bad.0,
                known: known.iter().map(|n| n.0).collect(),
            }
            .to_string(),
        )),
    }
}

/// A pod of `count` containers is refused (413) above `max`, naming `field`.
fn within(count: usize, max: usize, field: &str) -> Result<(), ApiError> {
    if count > max {
        return Err(ApiError::too_many_containers(field, count, max));
    }
    Ok(())
}

/// Where to verify: the request's nodes, or the kubelet's selection on the live state.
fn placement(state: &AppState, parsed: &Parsed, sampled: bool) -> Result<(Plan, bool), ApiError> {
    let hint = Step::Hint.span(sampled).entered();
    let (plan, selected) = select(state, parsed)?;
    if sampled {
        let nodes: Vec<NumaNode> = plan.groups.keys().flatten().copied().collect();
        hint.record("hugepage.numa_nodes", node_list(&nodes).as_str());
        let source = match (selected, &plan.selection.reason) {
            (false, _) => "request",
            (true, None) if plan.selection.basis == Basis::NodeWide => "memory manager policy None",
            (true, None) => "kubelet hints and topology policy",
            (true, Some(reason)) => reason,
        };
        hint.record("hint.source", source);
    }
    Ok((plan, selected))
}

fn select(state: &AppState, parsed: &Parsed) -> Result<(Plan, bool), ApiError> {
    let all = state.verifier.nodes();
    let kubelet = state.kubelet.load();
    let unselected = |nodes: &[NumaNode], basis| {
        let plan = Plan::unselected(nodes, &parsed.pages.total, basis);
        (plan, basis == Basis::NodeWide)
    };
    if let Some(nodes) = &parsed.nodes {
        return Ok(unselected(nodes, Basis::Request));
    }
    if !kubelet.pins_memory() {
        return Ok(unselected(&all, Basis::NodeWide));
    }
    let view = state.memory_manager.load();
    let config = kubelet
        .topology(parsed.policy, parsed.scope)
        .and_then(|config| view.usable().map(|()| config))
        .map_err(ApiError::no_selection)?;
    let topology = config.topology();
    let plan = plan::plan(&view.state, &parsed.pod, &parsed.pages, topology, &all).map_err(
        |e| match e {
            PlanError::Hints(HintError::Request(e)) | PlanError::Request(e) => field_error(e),
            PlanError::Hints(e @ HintError::TooManyNodes { .. }) => {
                ApiError::no_selection(e.to_string())
            }
            PlanError::Hints(e) => ApiError::internal(e.to_string()),
        },
    )?;
    Ok((plan, true))
}

/// The reason of a refusal past `--namespace-reservation-limit`.
const NAMESPACE_LIMIT: &str = "NamespaceReservationLimit";

/// Bytes of `size` in the node's pools (every NUMA node's `nr_hugepages` of the map).
fn pool_bytes(nodes: &[crate::numa::map::NodeView], size: PageSize) -> u64 {
    nodes
        .iter()
        .flat_map(|n| &n.sizes)
        .filter(|s| s.page_size_bytes == size.0)
        .map(|s| s.total.saturating_mul(s.page_size_bytes))
        .sum()
}

/// Verifies one admission request ([`parse`]d), and reserves what it admits for a named pod
/// unless it is a dry run.
pub fn admit(state: &AppState, parsed: &Parsed, run: Run) -> Result<Decided, ApiError> {
    let span = tracing::Span::current();
    let sampled = crate::telemetry::traces::is_sampled(&span);
    if sampled {
        span.record("k8s.pod.name", parsed.pod_ref.name.as_str());
        span.record("k8s.namespace.name", parsed.pod_ref.namespace.as_str());
        span.record("k8s.pod.uid", parsed.pod_ref.uid.as_str());
    }
    let (plan, selected) = placement(state, parsed, sampled)?;
    let settings = Settings {
        gate: if state.kubelet.load().settings.verification() {
            Gate::On
        } else {
            Gate::Off
        },
        ..state.settings
    };
    // Held from the fresh read to the reservation: no other admission sees the pages in between.
    let mut store = state
        .reservations
        .lock()
        .map_err(|_| ApiError::internal("the reservation store is poisoned"))?;
    let now = SystemTime::now();
    let started = Instant::now();
    let verification = Step::Verification.span(sampled).entered();
    let verdict = plan::verdict(&plan, settings.mode, |pages, nodes| {
        state
            .verifier
            .verify(pages, nodes, settings)
            .map_err(|e| match e {
                VerifyError::UnknownNode { .. } => ApiError::invalid("numaNodes", e.to_string()),
                VerifyError::NoNodes => {
                    ApiError::invalid("numaNodes", "must name at least one NUMA node")
                }
            })
    });
    drop(verification);
    let took = started.elapsed();
    let mut verdict = verdict?;
    let reservation = Step::Reservation.span(sampled).entered();
    reservations::apply(&mut verdict, &store, &parsed.pod_ref.uid, now);
    if run == Run::Real {
        state.metrics.verification(&verdict, took);
    }
    if state.reject_under_pressure && !parsed.pages.is_empty() {
        let message = state.psi.load().memory_pressure().map(pressure_message);
        refuse_under_pressure(&mut verdict, message.as_deref());
    }
    let pod = parsed.pod_ref.clone();
    let mut pending = None;
    if run == Run::Real && verdict.allowed && !pod.uid.is_empty() && !verdict.checks.is_empty() {
        if let Some(held) = store.other_owner(&pod.uid, &pod.namespace, &pod.name) {
            return Err(ApiError::reservation_conflict(format!(
                "pod UID {} is reserved for {}/{} (reservation {}), not for {}/{}: a reservation is never replaced by one for another namespace or name",
                pod.uid, held.namespace, held.name, held.id, pod.namespace, pod.name
            )));
        }
        let snapshot = state.map.load();
        let pool = |size: PageSize| pool_bytes(&snapshot.nodes, size);
        if let Some(why) = store.over_namespace_limit(&verdict, &pod.namespace, &pod.uid, pool, now)
        {
            verdict.allowed = false;
            verdict.reason = Some(NAMESPACE_LIMIT);
            verdict.message = Some(why);
        }
    }
    if run == Run::Real && verdict.allowed && !pod.uid.is_empty() && !verdict.checks.is_empty() {
        let (made, replaced, snapshot) =
            store.reserve(&verdict, &pod.uid, &pod.namespace, &pod.name, now);
        reservation.record("reservation.id", made.id.as_str());
        pending = Some(Pending {
            id: made.id.clone(),
            replaced,
            snapshot,
        });
        verdict.reservation = Some(made);
    }
    drop(store);
    drop(reservation);
    Ok(Decided {
        answer: Answer {
            verdict,
            pod,
            selection: selected.then_some(plan.selection),
            dry_run: run == Run::Dry,
        },
        sampled,
        pending,
    })
}

/// Counts an answered admission in the metrics, records its verdict on the current (admission)
/// span when sampled, and logs it.
pub fn conclude(state: &AppState, answer: &Answer, sampled: bool) {
    let (verdict, pod) = (&answer.verdict, &answer.pod);
    if sampled {
        record_verdict(&tracing::Span::current(), verdict);
    }
    if answer.dry_run {
        tracing::debug!(pod = %format_args!("{}/{}", pod.namespace, pod.name), allowed = verdict.allowed, "dry run");
        return;
    }
    state.metrics.admission(verdict);
    // Refusals are what an operator looks for: logged, at most REFUSALS_PER_SECOND a second
    // (every one is counted in the metrics). Admissions are logged at debug. At 20,000
    // requests/s a line each costs more than the verification.
    if verdict.allowed {
        tracing::debug!(pod = %format_args!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "admitted");
    } else if let Some(left_out) = REFUSAL_LINES.allow() {
        tracing::info!(
            pod = %format_args!("{}/{}", pod.namespace, pod.name),
            uid = %pod.uid,
            reason = verdict.reason.unwrap_or(""),
            message = verdict.message.as_deref().unwrap_or(""),
            refusals_not_logged = left_out,
            "admission refused"
        );
    }
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

/// Which form a body is: a `v1.Pod` has a `spec` (even `"spec": null`, which is then refused as
/// the pod's, not as an unknown field of the short form).
#[derive(Deserialize)]
struct Shape {
    #[serde(default)]
    spec: Present,
}

/// Whether a field is there, whatever its value (`null` included).
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Present, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// Invalid JSON is 400 `invalid-json`; valid JSON of the wrong shape names the field.
fn json_error(e: serde_json::Error) -> ApiError {
    match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid(".", e.to_string()),
        _ => ApiError::bad_json(e.to_string()),
    }
}

/// Deserializes `body`; on failure, deserializes it again tracking the path, to name the field at
/// fault (tracking the path of every value cost a tenth of an admission).
fn deserialize<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if let Ok(json::Object(value)) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let read: Result<json::Object<T>, _> = serde_path_to_error::deserialize(&mut de);
    read.map(|o| o.0).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::invalid(field, inner.to_string()),
            _ => ApiError::bad_json(inner.to_string()),
        }
    })
}

fn from_short(body: &[u8], max_containers: usize) -> Result<Parsed, ApiError> {
    let form: ShortForm = deserialize(body)?;
    let (namespace, name, uid) = (&form.pod.namespace, &form.pod.name, &form.pod.uid);
    check_pod_identity("pod", namespace, name, uid)?;
    check_qos_class("pod.qosClass", form.pod.qos_class.as_deref())?;
    if form.numa_nodes.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::invalid(
            "numaNodes",
            "must name at least one NUMA node (leave it out to have them selected)",
        ));
    }
    within(form.containers.len(), max_containers, "containers")?;
    let policy = form
        .topology_policy
        .as_deref()
        .map(|p| {
            p.parse::<Policy>().map_err(|_| {
                ApiError::invalid(
                    "topologyPolicy",
                    format!("{p:?} is not one of {:?}", Policy::NAMES),
                )
            })
        })
        .transpose()?;
    let scope = form
        .scope
        .as_deref()
        .map(|s| {
            s.parse::<Scope>().map_err(|_| {
                ApiError::invalid(
                    "scope",
                    format!("{s:?} is not one of [\"container\", \"pod\"]"),
                )
            })
        })
        .transpose()?;
    let mut total = Hugepages::new();
    let mut containers = Vec::with_capacity(form.containers.len());
    let mut each = Vec::with_capacity(form.containers.len());
    for (i, c) in form.containers.into_iter().enumerate() {
        let field = format_args!("containers[{i}].resources");
        let pages = pod::from_list(&c.resources, field).map_err(field_error)?;
        pod::add(&mut total, &pages, field).map_err(field_error)?;
        each.push(pages);
        containers.push(Container {
            name: given(c.name).unwrap_or_else(|| format!("container-{i}")),
            resources: Requirements {
                requests: c.resources.clone(),
                limits: c.resources,
            },
            restart_policy: None,
        });
    }
    check_container_names(&[("containers", containers.as_slice())])?;
    let nodes = form
        .numa_nodes
        .map(|n| n.into_iter().map(NumaNode).collect());
    let pod = Pod {
        metadata: ObjectMeta {
            namespace: form.pod.namespace.clone(),
            name: form.pod.name.clone(),
            uid: form.pod.uid.clone(),
        },
        spec: PodSpec {
            containers,
            ..PodSpec::default()
        },
        status: PodStatus {
            qos_class: form.pod.qos_class.clone(),
        },
    };
    Ok(Parsed {
        pod_ref: form.pod,
        pod,
        pages: PodHugepages {
            containers: each,
            total,
        },
        nodes,
        policy,
        scope,
    })
}

fn from_pod(body: &[u8], max_containers: usize) -> Result<Parsed, ApiError> {
    let mut pod: Pod = deserialize(body)?;
    let count = pod.spec.containers.len() + pod.spec.init_containers.len();
    within(count, max_containers, "spec.containers")?;
    let meta = &pod.metadata;
    check_pod_identity("metadata", &meta.namespace, &meta.name, &meta.uid)?;
    check_qos_class("status.qosClass", pod.status.qos_class.as_deref())?;
    name_unnamed(&mut pod.spec.init_containers, "init-container");
    name_unnamed(&mut pod.spec.containers, "container");
    check_container_names(&[
        ("spec.initContainers", pod.spec.init_containers.as_slice()),
        ("spec.containers", pod.spec.containers.as_slice()),
    ])?;
    let pages = pod::pod_hugepages(&pod.spec).map_err(field_error)?;
    let pod_ref = PodRef {
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        qos_class: pod.status.qos_class.clone(),
    };
    Ok(Parsed {
        pod_ref,
        pod,
        pages,
        nodes: None,
        policy: None,
        scope: None,
    })
}

fn field_error(e: pod::RequestError) -> ApiError {
    ApiError::invalid(e.field, e.detail)
}

/// A string field as given: `None` when absent or empty (Kubernetes' `omitempty`: `""` is unset).
fn given(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// The pod's namespace, name and UID at `{at}.namespace` … `{at}.uid`, each checked as the API
/// server checks it when given. Each may be left out (or empty): the short form may name no pod,
/// and a webhook called before the API server names the pod sees neither its name (with
/// `generateName`) nor its UID; without a UID nothing is reserved.
fn check_pod_identity(at: &str, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
    type Rule = fn(&str) -> Result<(), identifiers::IdentifierError>;
    let rules: [(&str, &str, Rule); 3] = [
        ("namespace", namespace, identifiers::namespace),
        ("name", name, identifiers::pod_name),
        ("uid", uid, identifiers::pod_uid),
    ];
    for (field, value, rule) in rules {
        if !value.is_empty() {
            rule(value).map_err(|e| ApiError::invalid(format!("{at}.{field}"), e.to_string()))?;
        }
    }
    Ok(())
}

/// A QoS class, when given, is one of Kubernetes' three (empty: not given, computed).
fn check_qos_class(field: &str, class: Option<&str>) -> Result<(), ApiError> {
    match class {
        None | Some("" | "Guaranteed" | "Burstable" | "BestEffort") => Ok(()),
        Some(other) => Err(ApiError::invalid(
            field,
            format!(
                "{} is not Guaranteed, Burstable or BestEffort",
                identifiers::Shown::new(other)
            ),
        )),
    }
}

/// Containers of a `v1.Pod` without a name (absent or empty) are named `{prefix}-<index>`, as the
/// short form names its own.
fn name_unnamed(containers: &mut [Container], prefix: &str) {
    for (i, c) in containers.iter_mut().enumerate() {
        if c.name.is_empty() {
            c.name = format!("{prefix}-{i}");
        }
    }
}

/// Every container's name is a DNS-1123 label, and no two containers of the pod (init containers
/// included) share one, as the API server requires: the Memory Manager's state and the NUMA
/// selection find a container by its name.
fn check_container_names(lists: &[(&'static str, &[Container])]) -> Result<(), ApiError> {
    let count = lists.iter().map(|(_, list)| list.len()).sum();
    let mut seen = identifiers::Unique::with_capacity(count);
    for &(list, containers) in lists {
        for (index, c) in containers.iter().enumerate() {
            let place = identifiers::Place { list, index };
            identifiers::container_name(&c.name)
                .and_then(|()| seen.insert(&c.name, place))
                .map_err(|e| ApiError::invalid(place.to_string(), e.to_string()))?;
        }
    }
    Ok(())
}
