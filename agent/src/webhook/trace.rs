//! The W3C trace context through the webhook, so that one trace spans the caller (kube-scheduler
//! or kube-apiserver), the webhook and the agents.
//!
//! A call's span ([`continued`]) has the incoming `traceparent`/`tracestate` as its parent, and
//! the incoming context is also the current OpenTelemetry context while the call runs. Each agent
//! call is a child span ([`agent_call`]) and its request carries [`outgoing`]: that span's
//! context when traces are exported (the agent's span is then its child), else the caller's
//! context as it came (traces off here: the agent's spans still continue the caller's trace).
//! Work spawned for a call takes both along ([`carried`]). Spans and their export are
//! [`crate::telemetry`]'s, set up as the agent's.

use std::{future::Future, net::SocketAddr};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::{
    Context,
    context::FutureExt as _,
    propagation::{Injector, TextMapPropagator},
    trace::TraceContextExt,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::{Instrument, Span, field::Empty};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::telemetry::traces;

/// Runs `work` in `span` (a server span), continuing the trace `headers` name, if any.
pub async fn continued<F: Future>(span: Span, headers: &HeaderMap, work: F) -> F::Output {
    let remote = traces::remote_context(headers).unwrap_or_default();
    // Fails only when traces are off: the span is then not exported, and `remote` is forwarded.
    let _ = span.set_parent(remote.clone());
    work.instrument(span).with_context(remote).await
}

/// `work`, to be spawned, in the current span and trace context.
pub fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    work.instrument(Span::current()).with_current_context()
}

/// The span of one call to the agent at `addr` (a client span, child of the current one).
pub fn agent_call(addr: SocketAddr, path: &'static str, dry_run: bool) -> Span {
    tracing::debug_span!(
        "agent call",
        otel.kind = "client",
        otel.status_code = Empty,
        server.address = %addr.ip(),
        server.port = addr.port(),
        url.path = path,
        hugepage.dry_run = dry_run,
        http.response.status_code = Empty,
        admission.allowed = Empty,
        error.message = Empty,
    )
}

/// The `traceparent` (and `tracestate`) headers of a request made in `span`.
pub fn outgoing(span: &Span) -> HeaderMap {
    let own = span.context();
    let cx = if own.span().span_context().is_valid() {
        own
    } else {
        Context::current()
    };
    let mut headers = Carrier(HeaderMap::new());
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    headers.0
}

struct Carrier(HeaderMap);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[tokio::test]
    async fn without_traces_the_callers_context_is_forwarded_as_it_came() {
        let mut incoming = HeaderMap::new();
        incoming.insert("traceparent", HeaderValue::from_static(TRACEPARENT));
        incoming.insert("tracestate", HeaderValue::from_static("vendor=x"));
        let span = tracing::debug_span!("call");
        let sent = continued(span, &incoming, async {
            let call = carried(async {
                outgoing(&agent_call(
                    "127.0.0.2:9820".parse().expect("an address"),
                    "/v1/admit",
                    true,
                ))
            });
            tokio::spawn(call).await.expect("the spawned call")
        })
        .await;
        assert_eq!(sent.get("traceparent").expect("forwarded"), TRACEPARENT);
        assert_eq!(sent.get("tracestate").expect("forwarded"), "vendor=x");
        let none = continued(tracing::debug_span!("call"), &HeaderMap::new(), async {
            outgoing(&Span::current())
        })
        .await;
        assert!(none.is_empty(), "no context, no header: {none:?}");
    }
}
