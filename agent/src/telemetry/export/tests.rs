use std::time::Instant;

use opentelemetry::trace::{Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::*;

/// What the test exporter does with a batch.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Accept,
    Fail,
    Hang,
}

#[derive(Debug)]
struct TestExporter {
    behaviour: Behaviour,
    names: Arc<Mutex<Vec<String>>>,
}

impl SpanExporter for TestExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match self.behaviour {
            Behaviour::Accept => {
                if let Ok(mut names) = self.names.lock() {
                    names.extend(batch.into_iter().map(|s| s.name.into_owned()));
                }
                Ok(())
            }
            Behaviour::Fail => Err(OTelSdkError::InternalFailure("collector down".into())),
            Behaviour::Hang => std::future::pending().await,
        }
    }
}

fn provider(
    behaviour: Behaviour,
    settings: QueueSettings,
) -> (SdkTracerProvider, Arc<ExportStats>, Arc<Mutex<Vec<String>>>) {
    let stats = Arc::new(ExportStats::default());
    let names = Arc::new(Mutex::new(Vec::new()));
    let exporter_names = names.clone();
    let processor = QueueProcessor::start(
        move || {
            Ok(TestExporter {
                behaviour,
                names: exporter_names,
            })
        },
        settings,
        stats.clone(),
    )
    .expect("start");
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    (provider, stats, names)
}

fn settings(max_queue: usize, delay_ms: u64, timeout_ms: u64) -> QueueSettings {
    QueueSettings {
        max_queue,
        max_batch: max_queue.min(4),
        delay: Duration::from_millis(delay_ms),
        timeout: Duration::from_millis(timeout_ms),
    }
}

#[test]
fn shutdown_exports_every_queued_span_in_batches() {
    let (provider, stats, names) = provider(Behaviour::Accept, settings(64, 60_000, 5_000));
    let tracer = provider.tracer("test");
    for i in 0..10 {
        tracer.in_span(format!("span {i}"), |_| {});
    }
    provider
        .shutdown_with_timeout(Duration::from_secs(5))
        .expect("shutdown");
    assert_eq!(stats.exported(), 10);
    assert_eq!(names.lock().expect("names").len(), 10);
    assert_eq!(stats.dropped(), 0);
}

#[test]
fn a_failing_collector_drops_and_counts() {
    let (provider, stats, _) = provider(Behaviour::Fail, settings(64, 10, 1_000));
    let tracer = provider.tracer("test");
    for i in 0..6 {
        tracer.in_span(format!("span {i}"), |_| {});
    }
    provider.force_flush().expect("flush");
    assert_eq!(stats.dropped_export_failed.load(Ordering::Relaxed), 6);
    assert_eq!(stats.exported(), 0);
}

#[test]
fn a_hanging_collector_never_blocks_the_caller_and_a_full_queue_counts_drops() {
    let (provider, stats, _) = provider(Behaviour::Hang, settings(2, 1, 300));
    let tracer = provider.tracer("test");
    let started = Instant::now();
    for i in 0..200 {
        tracer.in_span(format!("span {i}"), |_| {});
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(250),
        "ending 200 spans took {took:?}"
    );
    let full = stats.dropped_queue_full.load(Ordering::Relaxed);
    assert!(full >= 190, "{full} dropped for a full queue");
    // The hung export is abandoned at its deadline and its batch counted as dropped.
    std::thread::sleep(Duration::from_millis(600));
    assert!(stats.dropped_export_failed.load(Ordering::Relaxed) >= 1);
    provider
        .shutdown_with_timeout(Duration::from_secs(3))
        .expect("shutdown within the deadlines");
    assert_eq!(
        stats.dropped() + stats.exported(),
        200,
        "every span accounted for"
    );
}

#[test]
fn queue_settings_come_from_the_standard_variables() {
    let none = QueueSettings::from_env(|_| None).expect("defaults");
    assert_eq!(
        none,
        QueueSettings {
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_millis(5000),
            timeout: Duration::from_millis(30000),
        }
    );
    let some = QueueSettings::from_env(|v| match v {
        "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100".into()),
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("512".into()),
        "OTEL_BSP_SCHEDULE_DELAY" => Some("200".into()),
        _ => None,
    })
    .expect("valid");
    assert_eq!(
        (some.max_queue, some.max_batch, some.delay),
        (100, 100, Duration::from_millis(200))
    );
    let err = QueueSettings::from_env(|v| (v == "OTEL_BSP_MAX_QUEUE_SIZE").then(|| "0".into()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "OTEL_BSP_MAX_QUEUE_SIZE \"0\": expected a whole number above 0"
    );
}
