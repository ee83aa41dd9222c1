//! The API's one error type: what the client reads is an RFC 9457 problem document
//! (`application/problem+json`) with a clear `detail` and, for bad input, the `field` at fault.

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;

use super::budget::Exhausted;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    pub status: StatusCode,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    #[serde(rename = "status")]
    pub status_code: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Seconds the client should wait before trying again (`Retry-After`).
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            title,
            status_code: status.as_u16(),
            detail: detail.into(),
            field: None,
            retry_after: None,
        }
    }

    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid request",
            detail,
        );
        e.field = Some(field.into());
        e
    }

    pub fn bad_json(detail: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid-json",
            "Body is not valid JSON",
            detail,
        )
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Body too large",
            format!("the body is larger than {limit} bytes"),
        )
    }

    /// A body that did not arrive within `--body-read-timeout`.
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Body too slow",
            format!("the body did not arrive within {limit:?} (--body-read-timeout)"),
        )
    }

    /// A body that found no room in the listener's `--body-budget` in time: 503, try again
    /// after the wait the refusal names.
    pub fn busy(exhausted: &Exhausted) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "body-budget-full",
            "Too many request bodies at once",
            exhausted.to_string(),
        );
        e.retry_after = Some(exhausted.retry_after.as_secs().max(1));
        e
    }

    /// A pod of more containers than `--max-containers` allows.
    pub fn too_many_containers(field: &str, count: usize, max: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-many-containers",
            "Too many containers",
            format!(
                "the pod has {count} containers (app and init); this agent takes at most {max} (--max-containers)"
            ),
        );
        e.field = Some(field.to_owned());
        e
    }

    pub fn unsupported_media(found: Option<&str>) -> ApiError {
        let detail = match found {
            Some(t) => format!("content type {t:?} is not supported: send application/json"),
            None => "no content type: send application/json".to_owned(),
        };
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            detail,
        )
    }

    /// A client certificate whose `names` are not among `--admit-client-names`, asking to
    /// change state.
    pub fn forbidden(names: &str) -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Not allowed to change state",
            format!(
                "the client certificate's names ({names}) are not in the agent's --admit-client-names: it may read (GET routes, POST /v1/hints, POST /v1/admit?dryRun=true) but not admit for real or release a reservation; nothing was changed"
            ),
        )
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "Not found",
            format!("no endpoint at {path}; see /openapi.json"),
        )
    }

    pub fn no_reservation(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no-such-reservation",
            "No such reservation",
            format!("no reservation {id:?}: it ended or never existed; see GET /v1/reservations"),
        )
    }

    /// A reservation of the pod's UID is held for another namespace or name: it is never
    /// replaced by this one (`detail` names both).
    pub fn reservation_conflict(detail: String) -> ApiError {
        ApiError::new(
            StatusCode::CONFLICT,
            "reservation-conflict",
            "The pod's UID is reserved under another name",
            detail,
        )
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this endpoint does not take that method; see /openapi.json",
        )
    }

    pub fn internal(detail: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "host-read-failed",
            "Reading the host failed",
            detail,
        )
    }

    /// The agent's own state (its reservations file) could not be written: a disk fault on this
    /// node, not a verdict on the request (the webhook's failure policy decides).
    pub fn state_write_failed(detail: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "state-write-failed",
            "Saving the agent's state failed",
            detail,
        )
    }

    /// NUMA selection as the node's kubelet would make it, when there is none (`why`): the
    /// kubelet would not start with its settings on this machine, or the machine has more NUMA
    /// nodes than the agent works the Memory Manager's hints out on.
    pub fn no_selection(why: String) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no-kubelet-selection",
            "No NUMA selection as the kubelet would make it",
            format!(
                "{why}: there is no NUMA selection to verify (GET /v1/kubelet); give numaNodes to verify NUMA nodes of your choosing"
            ),
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Not ready",
            detail,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        response
    }
}
