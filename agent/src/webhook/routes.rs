//! The webhook's HTTP routes: `POST /scheduler/filter`, `POST /scheduler/prioritize`,
//! `GET /healthz`, `GET /readyz`. Handlers read the body and hand it to [`super::scheduler`]; a
//! body that is not `ExtenderArgs` JSON is a 400 whose JSON names the problem in `error` (the
//! field both extender answers use for a failed call).

use axum::{
    Json, Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::json;

use super::{extender::ExtenderArgs, scheduler};

pub use scheduler::Context;

/// The largest `ExtenderArgs`: a thousand whole `Node` objects take a few megabytes.
pub const BODY_LIMIT: usize = 64 << 20;

pub fn router(context: Context) -> Router {
    Router::new()
        .route("/scheduler/filter", post(filter))
        .route("/scheduler/prioritize", post(prioritize))
        .route("/healthz", get(healthz))
        .route("/readyz", get(healthz))
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

async fn filter(State(context): State<Context>, body: Bytes) -> Response {
    match args(&body) {
        Ok(args) => Json(scheduler::filter(&context, args).await).into_response(),
        Err(error) => refused(error),
    }
}

async fn prioritize(State(context): State<Context>, body: Bytes) -> Response {
    let args = match args(&body) {
        Ok(args) => args,
        Err(error) => return refused(error),
    };
    match scheduler::prioritize(&context, args).await {
        Ok(list) => Json(list).into_response(),
        Err(error) => refused(error),
    }
}

async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}
