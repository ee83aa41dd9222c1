//! Which caller may change state. With a client CA every request carries its connection's
//! [`Caller`] ([`super::server`]); a caller whose certificate has none of the names of
//! `--admit-client-names` (the webhook's client certificate by default) may only read: a real
//! admission (`POST /v1/admit` without `dryRun=true`) or a release
//! (`DELETE /v1/reservations/{id}`) is answered 403, naming the certificate's names and what
//! they may do, before the handler runs, so nothing is reserved, released or written. Reads,
//! dry runs and `POST /v1/hints` are anyone's of the CA. Without a client CA there is no caller
//! and nothing is checked.

use axum::{
    extract::Request,
    http::{Method, Uri},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::{admit::Run, error::ApiError, server::Caller};

/// The middleware: a caller that may not change state is refused a request that would.
pub async fn authorize(request: Request, next: Next) -> Response {
    if let Some(caller) = request.extensions().get::<Caller>()
        && !caller.may_change
        && changes_state(request.method(), request.uri())
    {
        return ApiError::forbidden(&caller.names.joined()).into_response();
    }
    next.run(request).await
}

/// Whether a request would reserve or release: a real admission, or a reservation's deletion.
/// A `dryRun` that is not `true` or `false` counts as real (the handler would refuse it anyway).
pub fn changes_state(method: &Method, uri: &Uri) -> bool {
    match (method, uri.path()) {
        (&Method::POST, "/v1/admit") => !matches!(Run::from_query(uri.query()), Ok(Run::Dry)),
        (&Method::DELETE, path) => path.starts_with("/v1/reservations/"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().expect("a URI")
    }

    #[test]
    fn real_admissions_and_releases_change_state_dry_runs_and_reads_do_not() {
        assert!(changes_state(&Method::POST, &uri("/v1/admit")));
        assert!(changes_state(&Method::POST, &uri("/v1/admit?dryRun=false")));
        assert!(changes_state(&Method::POST, &uri("/v1/admit?dryRun=maybe")));
        assert!(changes_state(&Method::DELETE, &uri("/v1/reservations/abc")));
        assert!(!changes_state(&Method::POST, &uri("/v1/admit?dryRun=true")));
        assert!(!changes_state(&Method::POST, &uri("/v1/hints")));
        assert!(!changes_state(&Method::GET, &uri("/v1/reservations")));
        assert!(!changes_state(&Method::GET, &uri("/v1/hugepages")));
    }
}
