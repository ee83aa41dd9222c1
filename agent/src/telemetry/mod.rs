//! Telemetry: the log, OpenTelemetry traces over OTLP ([`traces`], through the bounded queue of
//! [`export`]), and the Prometheus metrics served at `GET /metrics` ([`metrics`] for what events
//! update, [`scrape`] for what is read when scraped, [`connections`] for what the listeners' limits did, [`watch`] for the map's watchers,
//! [`encode`] for the text formats).
//!
//! [`init`] installs one `tracing` subscriber with two layers, each with its own filter: the log
//! (`RUST_LOG`, events and, at debug level, span context) and, when traces are on, the
//! OpenTelemetry layer, which takes only this crate's spans. The agent's spans are at debug
//! level, so with the default log level they cost the log nothing and reach only the exporter.
//! [`Telemetry::shutdown`] flushes the spans still queued; `main` calls it after the agent stops.

pub mod connections;
pub mod encode;
pub mod export;
pub mod metrics;
pub mod scrape;
pub mod traces;
pub mod watch;

use std::{sync::Arc, time::Duration};

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{Layer, filter::filter_fn, layer::SubscriberExt, util::SubscriberInitExt};

use crate::logging::{self, LogFormat};
use export::{ExportError, ExportStats};
use traces::TraceConfig;

/// How long the final flush may take at shutdown.
const FLUSH: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OpenTelemetry: {0}")]
    Export(#[from] ExportError),
}

/// What `main` keeps: the exporter's counters, and the provider to flush at the end.
#[derive(Debug)]
pub struct Telemetry {
    pub export_stats: Arc<ExportStats>,
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn traces_on(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still queued (bounded by a few seconds) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            match provider.shutdown_with_timeout(FLUSH) {
                Ok(()) => tracing::info!(
                    exported = self.export_stats.exported(),
                    dropped = self.export_stats.dropped(),
                    "spans flushed"
                ),
                Err(err) => tracing::warn!("flushing spans: {err}"),
            }
        }
    }
}

/// Installs the global subscriber (a second call leaves the first in place) and starts the
/// trace exporter when `traces` asks for one.
pub fn init(format: LogFormat, traces: &TraceConfig) -> Result<Telemetry, TelemetryError> {
    let export_stats = Arc::new(ExportStats::default());
    let started = traces::start(traces, export_stats.clone())?;
    let (provider, otel) = match started {
        Some((provider, tracer)) => {
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                // Only the attributes the agent sets: code location, thread and target would
                // double what each span carries and costs to export.
                .with_tracked_inactivity(false)
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_context_activation(false)
                .with_filter(filter_fn(|meta| {
                    meta.is_span() && meta.target().starts_with("hugepage_agent")
                }));
            (Some(provider), Some(layer))
        }
        None => (None, None),
    };
    let _already_set = tracing_subscriber::registry()
        .with(logging::layer(format))
        .with(otel)
        .try_init();
    if let Some(protocol) = traces.protocol.filter(|_| provider.is_some()) {
        tracing::info!(
            ?protocol,
            queue = traces.queue.max_queue,
            "exporting traces over OTLP"
        );
    }
    Ok(Telemetry {
        export_stats,
        provider,
    })
}
