//! The webhook's HTTP routes: `POST /scheduler/filter`, `POST /scheduler/prioritize`,
//! `POST /admission/validate`, `POST /admission/mutate` (an `AdmissionReview` that cannot be
//! read is a 400 naming why),
//! `GET /metrics`, `GET /healthz`, `GET /readyz` (503 until the Node cache, and under `--agent-identity per-pod` the agents'
//! pods, have synced). Handlers
//! read the body and hand it to [`super::scheduler`], [`super::admission`] or
//! [`super::mutate`], and count the call;
//! a body that is not `ExtenderArgs` JSON is a 400 whose JSON names the problem in `error` (the
//! field both extender answers use for a failed call). Each scheduler and admission call is a
//! server span continuing the caller's trace ([`super::trace::continued`]). Query parameters are
//! ignored (the kube-apiserver appends `?timeout=`).
//!
//! Every body is read by [`crate::api::body::read`] within its endpoint's limit (413 by its
//! `Content-Length` before reading, or as soon as it is longer: [`ADMISSION_REVIEW_LIMIT`],
//! `--extender-body-limit`), charged to `--body-budget` (503 with `Retry-After` when there is no
//! room), within `--body-read-timeout` (408); the charge is held until the answer is built.

use axum::{
    Json, Router,
    body::Body,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{MethodRouter, get, post},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{
    admission,
    metrics::Endpoint,
    mutate,
    review::{self, AdmissionRequest, AdmissionReview},
    scheduler, skew, trace,
};
use crate::{
    api::{
        body::{self, BodyError},
        budget::Charge,
    },
    telemetry::encode::Format,
};

pub use super::context::Context;

/// How many nodes outside the version-skew policy `/readyz` names.
const SKEWED_SHOWN: usize = 20;

/// What a scheduler call's body is when it does not parse.
const EXTENDER_ARGS: &str = "ExtenderArgs JSON";

/// The largest `AdmissionReview` read. The API server reads at most 3 MiB of a request's body
/// (`MaxRequestBodyBytes`, `k8s.io/apiserver/pkg/server/config.go`; etcd's own limit is
/// 1.5 MiB), and a review of a `CREATE` carries that one object, written again as JSON, with the
/// request's names and user: twice the object's limit leaves room for both.
pub const ADMISSION_REVIEW_LIMIT: usize = 6 << 20;

/// One of the webhook's endpoints: what it is, who calls it, what it answers, and its handler.
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// Who calls it.
    pub caller: &'static str,
    /// What it does and answers.
    pub summary: &'static str,
    handler: fn() -> MethodRouter<Context>,
}

/// Every endpoint the webhook serves: the router is built from this list, and the reference
/// (`docs/reference/http-api.md`) is written from it.
pub const ROUTES: [Route; 7] = [
    Route {
        method: "POST",
        path: "/scheduler/filter",
        caller: "kube-scheduler (the extender's filterVerb)",
        summary: "ExtenderArgs (`nodenames` or `nodes` form) in, ExtenderFilterResult out: the candidates whose agents admit a dry run of the pod stay; the others go to failedNodes with the agent's message (or to failedAndUnresolvableNodes when their allocatable hugepages are too few). A pod without hugepages keeps every node without any agent call. 400 with `error` for a body that is not ExtenderArgs; 413, 408, 503 (with Retry-After) for a body over --extender-body-limit, too slow, or without room in --body-budget.",
        handler: || post(filter),
    },
    Route {
        method: "POST",
        path: "/scheduler/prioritize",
        caller: "kube-scheduler (the extender's prioritizeVerb)",
        summary: "ExtenderArgs in, HostPriorityList out: 6 to 10 for a node that fits the pod on one NUMA node, 1 to 5 on several, 0 for one that does not fit or whose agent did not answer. Refusals as for filter.",
        handler: || post(prioritize),
    },
    Route {
        method: "POST",
        path: "/admission/validate",
        caller: "kube-apiserver (the ValidatingWebhookConfiguration)",
        summary: "AdmissionReview of a pods/binding CREATE (or a pod created with spec.nodeName) in, AdmissionReview out: the bound node's agent admits the pod for real (and reserves its hugepages by UID), or a dry run when the review is one; a refusal denies with the agent's reason and message (403). An agent that does not answer within --agent-timeout: --failure-policy decides (ignore: allowed with a warning; fail: denied, 500). 400 with `error` for a body that is not an AdmissionReview; 413 over 6 MiB, 408, 503 as for filter.",
        handler: || post(validate),
    },
    Route {
        method: "POST",
        path: "/admission/mutate",
        caller: "kube-apiserver (the MutatingWebhookConfiguration of component scheduler-by-default-webhook)",
        summary: "AdmissionReview of a pod CREATE in, AdmissionReview out, always allowed: a pod that asks for hugepages, names no scheduler (absent or default-scheduler) and no node gets the JSON patch setting spec.schedulerName to --scheduler-name; any other request is allowed unchanged (one that cannot be read with a warning). 400 with `error` for a body that is not an AdmissionReview; 413 over 6 MiB, 408, 503 as for filter.",
        handler: || post(mutate),
    },
    Route {
        method: "GET",
        path: "/metrics",
        caller: "Prometheus",
        summary: "The webhook's metrics (docs/reference/metrics.md), Prometheus text or OpenMetrics by Accept.",
        handler: || get(metrics),
    },
    Route {
        method: "GET",
        path: "/healthz",
        caller: "the kubelet (liveness)",
        summary: "200 `{\"status\":\"ok\"}` while the process serves.",
        handler: || get(healthz),
    },
    Route {
        method: "GET",
        path: "/readyz",
        caller: "the kubelet (readiness)",
        summary: "200 once the Node cache has synced (before, `nodenames` calls could not be answered) and, under `--agent-identity per-pod`, the agents' pods have been listed (before, no agent could be verified); 503 with `why` until then. A ready answer names agents outside the version-skew policy (another major or minor version than the webhook's, or none): `agentsOutsideVersionSkew` (their count), `skewedAgents` (up to 20 `{node, agentVersion}`), `webhookVersion`.",
        handler: || get(readyz),
    },
];

/// The plain metrics listener's routes (`--metrics-listen`): `/metrics`, `/healthz`, `/readyz`
/// only, the same handlers; anything else 404.
pub fn metrics_router(context: Context) -> Router {
    ROUTES
        .iter()
        .filter(|r| r.method == "GET")
        .fold(Router::new(), |router, r| {
            router.route(r.path, (r.handler)())
        })
        .with_state(context)
}

pub fn router(context: Context) -> Router {
    ROUTES
        .iter()
        .fold(Router::new(), |router, r| {
            router.route(r.path, (r.handler)())
        })
        .with_state(context)
}

/// A body larger than this is joined and parsed on a blocking thread, not the listener's: an
/// `ExtenderArgs` of megabytes takes milliseconds to parse, which every other call on the same
/// listener thread would wait for.
const HEAVY_BODY: usize = 64 << 10;

/// The body of a request as `T` (named `what` when it is not one), at most `limit` bytes, and
/// its charge of the budget; or the answer saying why it was not read: 413, 408, 503 with
/// `Retry-After`, or 400, each with `error`.
async fn read<T>(
    context: &Context,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    what: &'static str,
) -> Result<(T, Charge), Response>
where
    T: DeserializeOwned + Send + 'static,
{
    let received = match body::read(body, body::declared(headers), limit, &context.bodies).await {
        Ok(received) => received,
        Err(e) => return Err(unread(&e)),
    };
    let heavy = received.len() > HEAVY_BODY;
    let parse = move || {
        let (bytes, charge) = received.join();
        let parsed =
            serde_json::from_slice::<T>(&bytes).map_err(|e| format!("the body is not {what}: {e}"));
        parsed.map(|value| (value, charge))
    };
    let parsed = if heavy {
        tokio::task::spawn_blocking(parse)
            .await
            .unwrap_or_else(|e| Err(format!("parsing the body failed: {e}")))
    } else {
        parse()
    };
    parsed.map_err(refused)
}

/// The answer to a body that could not be read.
fn unread(e: &BodyError) -> Response {
    let status = match e {
        BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        BodyError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
        BodyError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        BodyError::Read(_) => StatusCode::BAD_REQUEST,
    };
    let mut answer = (status, Json(json!({ "error": e.to_string() }))).into_response();
    if let BodyError::Busy(exhausted) = e {
        let seconds = exhausted.retry_after.as_secs().max(1);
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    answer
}

/// A failed call: 400 with the reason in `error`.
fn refused(error: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response()
}

async fn filter(State(context): State<Context>, headers: HeaderMap, body: Body) -> Response {
    let limit = context.extender_body_limit;
    let (args, _charge) = match read(&context, &headers, body, limit, EXTENDER_ARGS).await {
        Ok(read) => read,
        Err(answer) => {
            context.metrics.call(Endpoint::Filter, false);
            return answer;
        }
    };
    let span = tracing::debug_span!("extender filter", otel.kind = "server");
    let result = trace::continued(span, &headers, scheduler::filter(&context, args)).await;
    context
        .metrics
        .call(Endpoint::Filter, result.error.is_empty());
    Json(result).into_response()
}

async fn prioritize(State(context): State<Context>, headers: HeaderMap, body: Body) -> Response {
    let limit = context.extender_body_limit;
    let (args, _charge) = match read(&context, &headers, body, limit, EXTENDER_ARGS).await {
        Ok(read) => read,
        Err(answer) => {
            context.metrics.call(Endpoint::Prioritize, false);
            return answer;
        }
    };
    let span = tracing::debug_span!("extender prioritize", otel.kind = "server");
    let answer = trace::continued(span, &headers, scheduler::prioritize(&context, args)).await;
    context.metrics.call(Endpoint::Prioritize, answer.is_ok());
    match answer {
        Ok(list) => Json(list).into_response(),
        Err(error) => refused(error),
    }
}

/// The request of an `AdmissionReview` body (its charge of the budget held until the answer is
/// built), or the 400, 408, 413 or 503 saying why there is none; the call is counted as failed
/// for `endpoint` then.
async fn review_request(
    context: &Context,
    headers: &HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Result<(AdmissionRequest, Charge), Response> {
    let limit = ADMISSION_REVIEW_LIMIT;
    let read = read::<AdmissionReview>(context, headers, body, limit, "an AdmissionReview");
    let failed = |answer: Response| {
        context.metrics.call(endpoint, false);
        answer
    };
    let (review, charge) = read.await.map_err(failed)?;
    match review.request {
        Some(request)
            if review.api_version == review::API_VERSION && review.kind == review::KIND =>
        {
            Ok((request, charge))
        }
        Some(_) => Err(failed(refused(format!(
            "the body is a {} {}, not an {} {}",
            review.api_version,
            review.kind,
            review::API_VERSION,
            review::KIND
        )))),
        None => Err(failed(refused(
            "the AdmissionReview has no request".to_owned(),
        ))),
    }
}

async fn validate(State(context): State<Context>, headers: HeaderMap, body: Body) -> Response {
    let (request, _charge) =
        match review_request(&context, &headers, body, Endpoint::Validate).await {
            Ok(read) => read,
            Err(answer) => return answer,
        };
    let span = tracing::debug_span!("admission validate", otel.kind = "server");
    let (response, verdict) =
        trace::continued(span, &headers, admission::validate(&context, request)).await;
    context.metrics.call(Endpoint::Validate, true);
    context.metrics.admission(verdict);
    Json(response.into_review()).into_response()
}

async fn mutate(State(context): State<Context>, headers: HeaderMap, body: Body) -> Response {
    let (request, _charge) = match review_request(&context, &headers, body, Endpoint::Mutate).await
    {
        Ok(read) => read,
        Err(answer) => return answer,
    };
    let judged = mutate::judge(&request, &context.scheduler_name);
    match &judged {
        mutate::Judged::Assigned(_) => tracing::info!(
            namespace = request.namespace,
            scheduler = %context.scheduler_name,
            "a pod with hugepages given the scheduler"
        ),
        mutate::Judged::Unreadable(why) => {
            tracing::warn!(namespace = request.namespace, "scheduler not chosen: {why}");
        }
        mutate::Judged::Untouched(_) => {}
    }
    context.metrics.call(Endpoint::Mutate, true);
    context.metrics.assignment(&judged);
    Json(mutate::answer(request.uid, &judged).into_review()).into_response()
}

async fn metrics(State(context): State<Context>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let body = context.metrics.render(format);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Ready once the Node cache has synced (before, `nodenames` calls could not be answered) and,
/// under `per-pod`, the agents' pods have been listed (before, no agent could be verified). A
/// ready answer names the nodes whose agents are outside the version-skew policy (at most
/// [`SKEWED_SHOWN`] of them, with their count): they are still followed, so readiness does not
/// depend on them.
async fn readyz(State(context): State<Context>) -> Response {
    let unready = if context.nodes.is_synced() {
        context.client.identity().unready()
    } else {
        Some("the Node cache has not synced yet")
    };
    if let Some(why) = unready {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not ready", "why": why})),
        )
            .into_response();
    }
    let Some(table) = &context.table else {
        return Json(json!({"status": "ok"})).into_response();
    };
    let (outside, skewed) = table.skewed(SKEWED_SHOWN);
    if outside == 0 {
        return Json(json!({"status": "ok"})).into_response();
    }
    let nodes: Vec<Value> = skewed
        .into_iter()
        .map(|s| json!({"node": s.node, "agentVersion": s.version}))
        .collect();
    Json(json!({
        "status": "ok",
        "webhookVersion": skew::OURS,
        "agentsOutsideVersionSkew": outside,
        "skewedAgents": nodes,
    }))
    .into_response()
}
