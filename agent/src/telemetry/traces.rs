//! OpenTelemetry traces over OTLP, configured by the standard variables alone:
//!
//! * `OTEL_TRACES_EXPORTER`: `otlp` or `none`; unset, traces are exported when an OTLP endpoint
//!   is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and
//!   off otherwise; `OTEL_SDK_DISABLED=true` turns them off.
//! * `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `grpc` or `http/protobuf` (the default); endpoint,
//!   headers, timeout and compression are read by the exporter from their `OTEL_EXPORTER_OTLP_*`
//!   variables; the sampler from `OTEL_TRACES_SAMPLER[_ARG]`; the queue from `OTEL_BSP_*`.
//! * The resource: `service.name` (`OTEL_SERVICE_NAME`, else `hugepage-agent`),
//!   `service.version`, `host.name`, `k8s.node.name` from `NODE_NAME` (the DaemonSet passes
//!   `spec.nodeName`), then `OTEL_RESOURCE_ATTRIBUTES`, which wins.
//!
//! Spans come from `tracing` through `tracing-opentelemetry`. Incoming W3C `traceparent` headers
//! become the parent of the span they start ([`with_remote_parent`]).

use std::sync::Arc;

use axum::http::HeaderMap;
use opentelemetry::{
    KeyValue,
    propagation::{Extractor, TextMapPropagator},
    trace::TracerProvider as _,
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    resource::{EnvResourceDetector, TelemetryResourceDetector},
    trace::{SdkTracerProvider, SpanExporter as _, Tracer},
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::export::{ExportError, ExportStats, QueueProcessor, QueueSettings};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TracesError {
    #[error("{var} {value:?}: expected otlp or none")]
    Exporter { var: &'static str, value: String },
    #[error("{var} {value:?}: expected grpc or http/protobuf")]
    Protocol { var: &'static str, value: String },
    #[error("{0}")]
    Queue(String),
}

/// How spans leave the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// The trace settings read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// `None`: traces are off.
    pub protocol: Option<Protocol>,
    pub queue: QueueSettings,
    pub service_name: String,
    /// `k8s.node.name`, when the node is known.
    pub node_name: Option<String>,
}

impl TraceConfig {
    pub fn from_env() -> Result<TraceConfig, TracesError> {
        TraceConfig::from_vars(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
    }

    /// From any source of variables (`get` returns a set, non-empty value).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<TraceConfig, TracesError> {
        let queue = QueueSettings::from_env(&get).map_err(|e| TracesError::Queue(e.to_string()))?;
        let disabled =
            get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .is_some();
        let on = match get("OTEL_TRACES_EXPORTER") {
            None => endpoint,
            Some(v) if v.trim() == "otlp" => true,
            Some(v) if v.trim() == "none" => false,
            Some(value) => {
                return Err(TracesError::Exporter {
                    var: "OTEL_TRACES_EXPORTER",
                    value,
                });
            }
        };
        let (var, value) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(v)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                get("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        let protocol = match value.as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(_) => {
                return Err(TracesError::Protocol {
                    var,
                    value: value.unwrap_or_default(),
                });
            }
        };
        Ok(TraceConfig {
            protocol: (on && !disabled).then_some(protocol),
            queue,
            service_name: get("OTEL_SERVICE_NAME").unwrap_or_else(|| "hugepage-agent".to_owned()),
            node_name: get("NODE_NAME"),
        })
    }

    /// Traces off (commands other than `run`).
    pub fn off() -> TraceConfig {
        TraceConfig {
            protocol: None,
            queue: QueueSettings {
                max_queue: 1,
                max_batch: 1,
                delay: std::time::Duration::from_secs(1),
                timeout: std::time::Duration::from_secs(1),
            },
            service_name: "hugepage-agent".to_owned(),
            node_name: None,
        }
    }

    /// The resource every span carries.
    pub fn resource(&self) -> Resource {
        let mut ours = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
        if let Some(host) = host_name() {
            ours.push(KeyValue::new("host.name", host));
        }
        if let Some(node) = &self.node_name {
            ours.push(KeyValue::new("k8s.node.name", node.clone()));
        }
        Resource::builder_empty()
            .with_service_name(self.service_name.clone())
            .with_attributes(ours)
            .with_detector(Box::new(TelemetryResourceDetector))
            .with_detector(Box::new(EnvResourceDetector::new()))
            .with_service_name(self.service_name.clone())
            .build()
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`).
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Starts the export thread and the provider; `Ok(None)` when traces are off.
pub fn start(
    config: &TraceConfig,
    stats: Arc<ExportStats>,
) -> Result<Option<(SdkTracerProvider, Tracer)>, ExportError> {
    let Some(protocol) = config.protocol else {
        return Ok(None);
    };
    let resource = config.resource();
    let exporter_resource = resource.clone();
    let build = move || {
        let built = match protocol {
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build(),
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build(),
        };
        built
            .map(|mut exporter| {
                exporter.set_resource(&exporter_resource);
                exporter
            })
            .map_err(|e| e.to_string())
    };
    let processor = QueueProcessor::start(build, config.queue, stats)?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("hugepage-agent");
    Ok(Some((provider, tracer)))
}

/// Makes the W3C trace context in `headers` (`traceparent`, `tracestate`), if any, the parent of
/// `span`. Without a valid `traceparent` the span starts a trace of its own.
pub fn with_remote_parent(span: &tracing::Span, headers: &HeaderMap) {
    if let Some(cx) = remote_context(headers) {
        // Fails only when no OpenTelemetry layer is installed (traces off): nothing to attach to.
        let _ = span.set_parent(cx);
    }
}

/// The W3C trace context in `headers` (`traceparent`, `tracestate`), when there is a
/// `traceparent` (one that is not valid makes a context without a span).
pub fn remote_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    headers
        .contains_key("traceparent")
        .then(|| TraceContextPropagator::new().extract(&Headers(headers)))
}

/// Whether `span` is part of a sampled trace. A span of a trace the sampler dropped (or any span
/// while traces are off) will never be exported: its children and attributes need not be built.
pub fn is_sampled(span: &tracing::Span) -> bool {
    use opentelemetry::trace::TraceContextExt;
    !span.is_disabled() && span.context().span().span_context().is_sampled()
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests;
