use std::sync::Mutex;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{SpanData, SpanExporter},
};
use tracing_subscriber::layer::SubscriberExt;

use super::*;

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[test]
fn the_standard_variables_choose_exporter_and_protocol() {
    let protocol = |pairs: &[(&str, &str)]| TraceConfig::from_vars(vars(pairs)).map(|c| c.protocol);
    assert_eq!(protocol(&[]), Ok(None), "no endpoint, no exporter");
    assert_eq!(
        protocol(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]),
        Ok(Some(Protocol::HttpProtobuf))
    );
    assert_eq!(
        protocol(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        ]),
        Ok(Some(Protocol::Grpc))
    );
    assert_eq!(
        protocol(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]),
        Ok(Some(Protocol::Grpc)),
        "the traces variable wins"
    );
    assert_eq!(
        protocol(&[
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
        ]),
        Ok(None)
    );
    assert_eq!(
        protocol(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "otlp")
        ]),
        Ok(None)
    );
    assert_eq!(
        protocol(&[("OTEL_TRACES_EXPORTER", "jaeger")])
            .unwrap_err()
            .to_string(),
        "OTEL_TRACES_EXPORTER \"jaeger\": expected otlp or none"
    );
    assert_eq!(
        protocol(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        ])
        .unwrap_err()
        .to_string(),
        "OTEL_EXPORTER_OTLP_PROTOCOL \"http/json\": expected grpc or http/protobuf"
    );
}

#[test]
fn the_resource_names_the_service_host_and_node() {
    let config = TraceConfig::from_vars(vars(&[("NODE_NAME", "worker-3")])).expect("valid");
    let resource = config.resource();
    let get = |k: &'static str| {
        resource
            .get(&opentelemetry::Key::from_static_str(k))
            .map(|v| v.to_string())
    };
    assert_eq!(get("service.name").as_deref(), Some("hugepage-agent"));
    assert_eq!(get("k8s.node.name").as_deref(), Some("worker-3"));
    assert_eq!(get("host.name"), host_name());
    assert!(get("host.name").is_some());
    let named = TraceConfig::from_vars(vars(&[("OTEL_SERVICE_NAME", "hp")])).expect("valid");
    assert_eq!(
        named
            .resource()
            .get(&opentelemetry::Key::from_static_str("service.name"))
            .map(|v| v.to_string())
            .as_deref(),
        Some("hp")
    );
}

#[derive(Debug)]
struct Capture(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Capture {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if let Ok(mut all) = self.0.lock() {
            all.extend(batch);
        }
        Ok(())
    }
}

#[test]
fn a_traceparent_header_becomes_the_parent_and_children_nest() {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let exported = spans.clone();
    let processor = QueueProcessor::start(
        move || Ok(Capture(exported)),
        QueueSettings::from_env(|_| None).expect("defaults"),
        Arc::default(),
    )
    .expect("start");
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let mut headers = HeaderMap::new();
    headers.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .expect("header"),
    );
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("admission");
        with_remote_parent(&span, &headers);
        span.in_scope(|| {
            let _child = tracing::info_span!("verification").entered();
        });
        let orphan = tracing::info_span!("admission");
        with_remote_parent(&orphan, &HeaderMap::new());
        drop(orphan);
    });
    provider.shutdown().expect("shutdown");
    let spans = spans.lock().expect("spans");
    let find = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let admissions = find("admission");
    assert_eq!(admissions.len(), 2);
    let parented = admissions
        .iter()
        .find(|s| s.parent_span_id != SpanId::INVALID)
        .expect("the admission with a traceparent");
    assert_eq!(
        parented.span_context.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex")
    );
    assert_eq!(
        parented.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").expect("hex")
    );
    let child = find("verification");
    assert_eq!(child.len(), 1);
    assert_eq!(child[0].parent_span_id, parented.span_context.span_id());
    assert_eq!(
        child[0].span_context.trace_id(),
        parented.span_context.trace_id()
    );
    let orphan = admissions
        .iter()
        .find(|s| s.parent_span_id == SpanId::INVALID)
        .expect("the admission without one");
    assert_ne!(
        orphan.span_context.trace_id(),
        parented.span_context.trace_id()
    );
}

#[test]
fn is_sampled_follows_the_sampler_and_is_false_without_traces() {
    use opentelemetry_sdk::trace::Sampler;
    assert!(!is_sampled(&tracing::info_span!("no subscriber")));
    for (sampler, want) in [(Sampler::AlwaysOn, true), (Sampler::AlwaysOff, false)] {
        let provider = SdkTracerProvider::builder().with_sampler(sampler).build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            assert_eq!(is_sampled(&tracing::info_span!("admission")), want);
        });
    }
}
