//! The HTTP API (axum): `POST /v1/admit`, `GET /v1/hugepages`, `GET /v1/consumers`,
//! `GET /v1/reservations`, `DELETE /v1/reservations/{id}`,
//! `GET /v1/conditions`, `GET /v1/events`, `POST /v1/hints`, `GET /v1/discrepancy`,
//! `GET /v1/kubelet`, `GET /metrics`,
//! `/healthz`, `/readyz`, `/openapi.json`. [`router`] builds it from an [`AppState`] so tests drive it without a socket;
//! handlers extract, call a plain function, and map the result; errors are [`error::ApiError`].
//! [`metrics_router`] is the plain listener's (`--metrics-listen`): `/metrics`, `/healthz` and
//! `/readyz` only, for kubelet probes and Prometheus, which present no client certificate;
//! everything else there is 404. [`server`] runs the listeners, [`tls`] secures the API's.

pub mod admit;
pub mod authz;
pub mod body;
pub mod budget;
pub mod error;
pub mod flags;
pub mod held;
pub mod lane;
pub mod openapi;
pub mod reservations;
pub mod server;
pub mod topology;
pub mod watch;

use std::{
    sync::{Arc, Mutex, OnceLock},
    time::SystemTime,
};

use axum::{
    Json, Router,
    body::Body,
    extract::State,
    extract::{Path, path::ErrorKind, rejection::PathRejection},
    http::{HeaderMap, Uri, header},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use serde::Serialize;
use tracing::Instrument;

use crate::{
    admission::{
        reservations::Store,
        verify::{Settings, Verifier},
    },
    consumers::{self, Consumer, FaultBook},
    holders::Holders,
    host::PageSize,
    kubeletconfig::live::KubeletView,
    memorymanager::live::MemoryManagerView,
    numa::map::{MapReader, Snapshot},
    psi::monitor::PsiReader,
    sysfs::{HostFs, hugepages},
    telemetry::{encode::Format, metrics::Metrics, scrape},
};
use arc_swap::ArcSwap;
use error::ApiError;

/// Released once: the first map exists and the probes are attached, refused, or off.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<OnceLock<String>>);

impl Readiness {
    /// Marks the agent ready; `probes` says what became of the eBPF probes.
    pub fn release(&self, probes: impl Into<String>) {
        let _first = self.0.set(probes.into());
    }

    pub fn probes(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// What every handler may read.
#[derive(Debug, Clone)]
pub struct AppState {
    pub map: MapReader,
    pub verifier: Arc<Verifier>,
    pub settings: Settings,
    pub readiness: Readiness,
    pub psi: PsiReader,
    /// Hugetlb faults per cgroup, kept by the run loop.
    pub faults: FaultBook,
    /// Admitted pods' hugepages until they start; admission holds the lock from verification
    /// to reservation, so two admissions cannot both be granted the same pages.
    pub reservations: Arc<Mutex<Store>>,
    /// The host, for reads the handlers make fresh (`/v1/consumers`).
    pub host: HostFs,
    /// Refuse hugepage pods while a *MemoryContentionPressure condition is True.
    pub reject_under_pressure: bool,
    /// What `GET /metrics` shows besides the map, PSI and reservations.
    pub metrics: Arc<Metrics>,
    /// The kubelet Memory Manager's state, kept current by the run loop.
    pub memory_manager: Arc<ArcSwap<MemoryManagerView>>,
    /// The node's kubelet settings (policies, options, scope, reserved memory, feature gates)
    /// with the machine's NUMA nodes under them, kept current by the run loop.
    pub kubelet: Arc<ArcSwap<KubeletView>>,
    /// `--max-containers`: the most containers a pod in a request may have.
    pub max_containers: usize,
    /// Where requests with large bodies or pods are worked out, off the API threads.
    pub heavy: lane::Lane,
    /// What the API's request bodies may hold at once (`--body-budget`).
    pub bodies: Arc<budget::BodyBudget>,
    /// The map watch's states and watchers (`GET /v1/hugepages?watch=true`).
    pub watch: watch::Hub,
    /// The latest walk of the hugepages' holders, for `GET /metrics`, and the probes' book of
    /// files and segments between walks, which the run loop keeps.
    pub held: held::LatestWalk,
}

impl AppState {
    /// Why the node's kubelet would not start with its settings on this machine (its Topology
    /// Manager's refusal, or reserved memory the Memory Manager cannot hold), when so.
    pub fn kubelet_refusal(&self) -> Option<String> {
        let kubelet = self.kubelet.load();
        kubelet
            .refusal
            .clone()
            .or_else(|| self.memory_manager.load().usable().err())
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/admit", post(admit_handler))
        .route("/v1/hints", post(hints_handler))
        .route("/v1/discrepancy", get(discrepancy_handler))
        .route("/v1/kubelet", get(kubelet_handler))
        .route("/v1/hugepages", get(hugepages))
        .route("/v1/consumers", get(consumers_handler))
        .route("/v1/reservations", get(reservations_list))
        .route("/v1/reservations/{id}", delete(reservation_delete))
        .route("/v1/conditions", get(conditions))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi_handler))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(authz::authorize))
        .with_state(state)
}

/// The plain metrics listener's routes: `/metrics`, `/healthz`, `/readyz`, and 404 for the rest
/// (`/v1` is never served here).
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// A request body ([`body::read`], in turns, charged to the budget) and its content type, or
/// the problem with the body (413 over the limit, 408 past `--body-read-timeout`, 503 with no
/// room in `--body-budget`).
async fn request_body<'h>(
    state: &AppState,
    headers: &'h HeaderMap,
    body: Body,
) -> Result<(Option<&'h str>, body::Received), ApiError> {
    let body = body::read(
        body,
        body::declared(headers),
        admit::BODY_LIMIT,
        &state.bodies,
    )
    .await
    .map_err(|e| match e {
        body::BodyError::TooLarge { limit } => ApiError::too_large(limit),
        body::BodyError::Read(detail) => ApiError::bad_json(detail),
        body::BodyError::TimedOut(limit) => ApiError::body_timeout(limit),
        body::BodyError::Busy(exhausted) => ApiError::busy(&exhausted),
    })?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    Ok((content_type, body))
}

/// What a request's work leaves to free (the parsed pod, the selection): on the heavy lane it is
/// freed after the answer is on its way (freeing a large pod costs a tenth of its admission).
type Leftover = Box<dyn Send>;

/// A request's work: its result, and what is left to free.
type Work<T> = fn(&AppState, &admit::Parsed) -> Result<(T, Leftover), ApiError>;

/// Parses a request's body and does `work` with it: on the API thread for a typical request, on
/// the heavy lane ([`lane`]) for a large body (parsed there too) or a pod of many containers.
async fn offload<T: Send + 'static>(
    state: &AppState,
    span: &tracing::Span,
    content_type: Option<&str>,
    body: body::Received,
    work: Work<T>,
) -> Result<T, ApiError> {
    let max = state.max_containers;
    if body.len() > lane::HEAVY_BODY {
        let content_type = content_type.map(str::to_owned);
        let job = move |state: &AppState| -> (Result<T, ApiError>, Leftover) {
            let (body, _charge) = body.join();
            match admit::parse(content_type.as_deref(), &body, max) {
                Ok(parsed) => done(work(state, &parsed), parsed),
                Err(e) => (Err(e), Box::new(body)),
            }
        };
        return on_lane(state, span, job).await;
    }
    let (body, charge) = body.join();
    let parsed = span.in_scope(|| admit::parse(content_type, &body, max))?;
    if parsed.containers() > lane::HEAVY_CONTAINERS {
        let job = move |state: &AppState| {
            let _charge = charge;
            done(work(state, &parsed), parsed)
        };
        return on_lane(state, span, job).await;
    }
    span.in_scope(|| work(state, &parsed)).map(|(out, _)| out)
}

/// The result of work on `parsed`, and everything left to free.
fn done<T>(
    worked: Result<(T, Leftover), ApiError>,
    parsed: admit::Parsed,
) -> (Result<T, ApiError>, Leftover) {
    match worked {
        Ok((out, left)) => (Ok(out), Box::new((parsed, left))),
        Err(e) => (Err(e), Box::new(parsed)),
    }
}

/// Runs `job` on the heavy lane, in `span`; what it leaves is freed there after it answers.
async fn on_lane<T: Send + 'static>(
    state: &AppState,
    span: &tracing::Span,
    job: impl FnOnce(&AppState) -> (Result<T, ApiError>, Leftover) + Send + 'static,
) -> Result<T, ApiError> {
    let (inner, span) = (state.clone(), span.clone());
    let ran = state.heavy.run(move || span.in_scope(|| job(&inner))).await;
    ran.map_err(|e| ApiError::internal(e.to_string()))?
}

/// Room in an answer per container: its placement, hints and merged hint.
const ANSWER_PER_CONTAINER: usize = 384;

/// An admission decided, and its answer as JSON; the selection is left to free.
fn decide(
    state: &AppState,
    parsed: &admit::Parsed,
) -> Result<((admit::Decided, Vec<u8>), Leftover), ApiError> {
    decide_as(state, parsed, admit::Run::Real)
}

/// [`decide`] as a dry run: nothing reserved, nothing written.
fn decide_dry(
    state: &AppState,
    parsed: &admit::Parsed,
) -> Result<((admit::Decided, Vec<u8>), Leftover), ApiError> {
    decide_as(state, parsed, admit::Run::Dry)
}

fn decide_as(
    state: &AppState,
    parsed: &admit::Parsed,
    run: admit::Run,
) -> Result<((admit::Decided, Vec<u8>), Leftover), ApiError> {
    let mut decided = admit::admit(state, parsed, run)?;
    let room = ANSWER_CAPACITY + ANSWER_PER_CONTAINER * parsed.containers();
    let body = encode(&decided.answer, room)?;
    let selection = decided.answer.selection.take();
    Ok(((decided, body), Box::new(selection)))
}

/// The kubelet's hints for a request, as JSON; the answer is left to free.
fn hints(state: &AppState, parsed: &admit::Parsed) -> Result<(Vec<u8>, Leftover), ApiError> {
    let answer = topology::hints(state, parsed)?;
    let room = ANSWER_CAPACITY + 2 * ANSWER_PER_CONTAINER * parsed.containers();
    Ok((encode(&answer, room)?, Box::new(answer)))
}

async fn admit_handler(
    State(state): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let work: Work<_> = match admit::Run::from_query(uri.query()) {
        Ok(admit::Run::Real) => decide,
        Ok(admit::Run::Dry) => decide_dry,
        Err(problem) => return problem.into_response(),
    };
    let (content_type, body) = match request_body(&state, &headers, body).await {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let span = admit::span();
    crate::telemetry::traces::with_remote_parent(&span, &headers);
    let (decided, answer) = match offload(&state, &span, content_type, body, work).await {
        Ok(decided) => decided,
        Err(e) => return e.into_response(),
    };
    if let Some(pending) = decided.pending
        && let Err(e) = reservations::persist(&state, pending)
            .instrument(span.clone())
            .await
    {
        return e.into_response();
    }
    span.in_scope(|| admit::conclude(&state, &decided.answer, decided.sampled));
    ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
}

/// Room for an admission's answer (about 1 KiB with two sizes and a selection).
const ANSWER_CAPACITY: usize = 2048;

/// `value` as JSON, serialized into a buffer of `room` bytes, which holds it at once (axum's
/// `Json` starts at 128 bytes and grows, copying an admission's answer three times).
fn encode(value: &impl Serialize, room: usize) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::with_capacity(room);
    serde_json::to_writer(&mut body, value)
        .map_err(|e| ApiError::internal(format!("encoding the answer: {e}")))?;
    Ok(body)
}

async fn hugepages(State(state): State<AppState>, uri: Uri) -> Response {
    match watch::Resume::from_query(uri.query()) {
        Err(problem) => return problem.into_response(),
        Ok(resume) if resume.watch => return watch::serve(&state.watch, &resume).await,
        Ok(_) => {}
    }
    let snapshot = state.map.load();
    let Ok(store) = state.reservations.lock() else {
        return ApiError::internal("the reservation store is poisoned").into_response();
    };
    Json(with_reserved_by_agent(&snapshot, &store)).into_response()
}

/// The snapshot with `reservedByAgent` (bytes) on each node and size: the reservations that may
/// draw from that node (a reservation over several nodes counts on each of them).
fn with_reserved_by_agent(snapshot: &Snapshot, store: &Store) -> serde_json::Value {
    let mut value = serde_json::to_value(snapshot).unwrap_or_default();
    for (n, node) in snapshot.nodes.iter().enumerate() {
        for (i, size) in node.sizes.iter().enumerate() {
            let held = store.held(
                PageSize(size.page_size_bytes),
                &[node.info.node],
                "",
                SystemTime::now(),
            );
            value["nodes"][n]["sizes"][i]["reservedByAgent"] = serde_json::json!(held);
        }
    }
    value
}

async fn hints_handler(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (content_type, body) = match request_body(&state, &headers, body).await {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let span = tracing::Span::none();
    match offload(&state, &span, content_type, body, hints).await {
        Ok(answer) => ([(header::CONTENT_TYPE, "application/json")], answer).into_response(),
        Err(err) => err.into_response(),
    }
}

/// What `GET /v1/consumers` and `GET /v1/discrepancy` read fresh: the cgroups charged with
/// pages (or why they could not be read) and the holders, kept as the scrapes' latest walk.
/// Walks the cgroup tree and the host's mounts and processes: call it off the runtime's workers.
fn inventory(state: &AppState) -> Result<(Result<Vec<Consumer>, String>, Holders), String> {
    let pools = hugepages::read_table(&state.host).map_err(|e| e.to_string())?;
    let list = consumers::list(&state.host, &pools, &state.faults).map_err(|e| e.to_string());
    let held = state.held.walk(&state.host, &pools);
    Ok((list, Holders::clone(&held)))
}

async fn discrepancy_handler(State(state): State<AppState>) -> Response {
    let inventory_state = state.clone();
    let (consumers, held) =
        match tokio::task::spawn_blocking(move || inventory(&inventory_state)).await {
            Ok(Ok((list, held))) => (list.ok(), Some(held)),
            _ => (None, None),
        };
    Json(topology::discrepancy(
        &state,
        consumers.as_deref(),
        held.as_ref(),
    ))
    .into_response()
}

async fn kubelet_handler(State(state): State<AppState>) -> Response {
    let mut answer = state.kubelet.load().answer();
    answer.refusal = state.kubelet_refusal();
    Json(answer).into_response()
}

async fn consumers_handler(State(state): State<AppState>) -> Response {
    match tokio::task::spawn_blocking(move || inventory(&state)).await {
        Ok(Ok((Ok(list), held))) => Json(consumers::Answer::new(list, held)).into_response(),
        Ok(Ok((Err(err), _)) | Err(err)) => ApiError::internal(err).into_response(),
        Err(err) => ApiError::internal(format!("the walk failed: {err}")).into_response(),
    }
}

async fn reservations_list(State(state): State<AppState>) -> Response {
    match state.reservations.lock() {
        Ok(store) => Json(serde_json::json!({ "reservations": store.list() })).into_response(),
        Err(_) => ApiError::internal("the reservation store is poisoned").into_response(),
    }
}

async fn reservation_delete(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    uri: axum::http::Uri,
) -> Response {
    // An id that is not UTF-8 once percent-decoded (`%ff`) is no reservation's: 404 naming it
    // as sent, not axum's plain-text rejection. Any other rejection is the route's own fault.
    let id = match id {
        Ok(Path(id)) => id,
        Err(PathRejection::FailedToDeserializePathParams(e))
            if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) =>
        {
            let sent = uri.path().rsplit('/').next().unwrap_or_default();
            return ApiError::no_reservation(sent).into_response();
        }
        Err(other) => {
            return ApiError::internal(format!("the reservation id in the path: {other}"))
                .into_response();
        }
    };
    match reservations::delete(&state, &id).await {
        Ok(removed) => Json(removed).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn conditions(State(state): State<AppState>) -> Response {
    Json(&*state.psi.load()).into_response()
}

async fn events(State(state): State<AppState>) -> Response {
    let view = state.psi.load();
    Json(serde_json::json!({ "events": view.events })).into_response()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ready<'a> {
    ready: bool,
    source: crate::numa::map::Source,
    generation: u64,
    probes: &'a str,
    /// Why the kubelet would not start with its settings on this machine, when so: the agent is
    /// ready all the same, without the kubelet's NUMA selection.
    #[serde(skip_serializing_if = "Option::is_none")]
    kubelet: Option<String>,
}

async fn metrics_handler(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    // Copied out so that admissions never wait for a scrape.
    let Ok(reservations) = state.reservations.lock().map(|s| s.list()) else {
        return ApiError::internal("the reservation store is poisoned").into_response();
    };
    let kubelet = state.kubelet.load();
    let refused = state.kubelet_refusal().is_some();
    let held = state.held.fresh(&state.host).await;
    let sources = scrape::Sources {
        holders: held.as_deref(),
        snapshot: &state.map.load(),
        reservations: &reservations,
        psi: &state.psi.load(),
        probes: state.readiness.probes(),
        verification_sysfs_errors: state.verifier.sysfs_errors(),
        kubelet: &kubelet.rows(),
        kubelet_refused: refused,
    };
    let body = scrape::render(format, &state.metrics, &sources);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

async fn healthz() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let snapshot = state.map.load();
    match state.readiness.probes() {
        Some(probes) => Json(Ready {
            ready: true,
            source: snapshot.source,
            generation: snapshot.generation,
            probes,
            kubelet: state.kubelet_refusal(),
        })
        .into_response(),
        None => ApiError::unavailable("starting: the probes are not attached or refused yet")
            .into_response(),
    }
}

async fn openapi_handler(State(state): State<AppState>) -> Response {
    Json(openapi::document(&state.verifier.nodes())).into_response()
}

async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(uri.path()).into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::method_not_allowed().into_response()
}

#[cfg(test)]
mod tests;
