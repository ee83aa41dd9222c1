//! The webhook's HTTP routes: `POST /scheduler/filter`, `POST /scheduler/prioritize`,
//! `POST /admission/validate` (an `AdmissionReview` that cannot be read is a 400 naming why),
//! `GET /metrics`, `GET /healthz`, `GET /readyz` (503 until the Node cache has synced). Handlers
//! read the body and hand it to [`super::scheduler`] or [`super::admission`], and count the call; a body that is not `ExtenderArgs` JSON is a 400
//! whose JSON names the problem in `error` (the field both extender answers use for a failed
//! call). Each scheduler and admission call is a server span continuing the caller's trace
//! ([`super::trace::continued`]). Query parameters are ignored (the kube-apiserver appends
//! `?timeout=`).

use axum::{
    Json, Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::json;

use super::{
    admission,
    extender::ExtenderArgs,
    metrics::Endpoint,
    review::{self, AdmissionReview},
    scheduler, trace,
};
use crate::telemetry::encode::Format;

pub use super::context::Context;

/// The largest `ExtenderArgs`: a thousand whole `Node` objects take a few megabytes.
pub const BODY_LIMIT: usize = 64 << 20;

pub fn router(context: Context) -> Router {
    Router::new()
        .route("/scheduler/filter", post(filter))
        .route("/scheduler/prioritize", post(prioritize))
        .route("/admission/validate", post(validate))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(context)
}

/// The body as `ExtenderArgs`, or why it is not.
fn args(body: &[u8]) -> Result<ExtenderArgs, String> {
    serde_json::from_slice(body).map_err(|e| format!("the body is not ExtenderArgs JSON: {e}"))
}

/// A failed call: 400 with the reason in `error`.
fn refused(error: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response()
}

async fn filter(State(context): State<Context>, headers: HeaderMap, body: Bytes) -> Response {
    let args = match args(&body) {
        Ok(args) => args,
        Err(error) => {
            context.metrics.call(Endpoint::Filter, false);
            return refused(error);
        }
    };
    let span = tracing::debug_span!("extender filter", otel.kind = "server");
    let result = trace::continued(span, &headers, scheduler::filter(&context, args)).await;
    context
        .metrics
        .call(Endpoint::Filter, result.error.is_empty());
    Json(result).into_response()
}

async fn prioritize(State(context): State<Context>, headers: HeaderMap, body: Bytes) -> Response {
    let span = tracing::debug_span!("extender prioritize", otel.kind = "server");
    let answer = match args(&body) {
        Ok(args) => trace::continued(span, &headers, scheduler::prioritize(&context, args)).await,
        Err(error) => Err(error),
    };
    context.metrics.call(Endpoint::Prioritize, answer.is_ok());
    match answer {
        Ok(list) => Json(list).into_response(),
        Err(error) => refused(error),
    }
}

async fn validate(State(context): State<Context>, headers: HeaderMap, body: Bytes) -> Response {
    let review: AdmissionReview = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => {
            context.metrics.call(Endpoint::Validate, false);
            return refused(format!("the body is not an AdmissionReview: {e}"));
        }
    };
    let request = match review.request {
        Some(request)
            if review.api_version == review::API_VERSION && review.kind == review::KIND =>
        {
            request
        }
        Some(_) => {
            context.metrics.call(Endpoint::Validate, false);
            return refused(format!(
                "the body is a {} {}, not an {} {}",
                review.api_version,
                review.kind,
                review::API_VERSION,
                review::KIND
            ));
        }
        None => {
            context.metrics.call(Endpoint::Validate, false);
            return refused("the AdmissionReview has no request".to_owned());
        }
    };
    let span = tracing::debug_span!("admission validate", otel.kind = "server");
    let (response, verdict) =
        trace::continued(span, &headers, admission::validate(&context, request)).await;
    context.metrics.call(Endpoint::Validate, true);
    context.metrics.admission(verdict);
    Json(response.into_review()).into_response()
}

async fn metrics(State(context): State<Context>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let body = context.metrics.render(format);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Ready once the Node cache has synced: before, `nodenames` calls could not be answered.
async fn readyz(State(context): State<Context>) -> Response {
    if context.nodes.is_synced() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        let why = "the Node cache has not synced yet";
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not ready", "why": why})),
        )
            .into_response()
    }
}
