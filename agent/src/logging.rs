//! Logging through `tracing` to stderr, as text or JSON lines; `RUST_LOG` filters (default
//! `info`). Records the kernel programs write with aya-log arrive through the `log` bridge.
//! [`crate::telemetry`] installs this layer beside the trace exporter's.

use clap::ValueEnum;
use tracing_subscriber::{EnvFilter, Layer, registry::LookupSpan};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log layer, filtered by `RUST_LOG`.
pub fn layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_filter(filter).boxed(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_filter(filter)
            .boxed(),
    }
}
