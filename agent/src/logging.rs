//! Logging through `tracing` to stderr, as text or JSON lines; `RUST_LOG` filters (default
//! `info`). Records the kernel programs write with aya-log arrive through the `log` bridge.
//! [`crate::telemetry`] installs this layer beside the trace exporter's. [`RateLimit`] keeps a
//! line that can come at request rate (a refused admission) from costing more than the request.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, Layer, registry::LookupSpan};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log's flag, for the commands that run (`run`, `webhook`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// The log's lines on stderr: text, or JSON objects (what the DaemonSet and the Deployment use).
    #[arg(long, env = "HUGEPAGE_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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

/// At most `per_second` lines each second; the others are counted, and the next line let through
/// says how many were left out.
#[derive(Debug)]
pub struct RateLimit {
    per_second: u32,
    /// The second (of CLOCK_MONOTONIC) being counted.
    second: AtomicU64,
    used: AtomicU32,
    suppressed: AtomicU64,
}

impl RateLimit {
    pub const fn new(per_second: u32) -> Self {
        RateLimit {
            per_second,
            second: AtomicU64::new(0),
            used: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last line)` when this line may be written, `None` when not.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(crate::numa::map::monotonic_now().as_secs())
    }

    fn allow_at(&self, second: u64) -> Option<u64> {
        let counted = self.second.load(Ordering::Relaxed);
        if counted != second
            && self
                .second
                .compare_exchange(counted, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) < self.per_second {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_limit_are_counted_and_reported_by_the_next_one_written() {
        let limit = RateLimit::new(2);
        assert_eq!(limit.allow_at(7), Some(0));
        assert_eq!(limit.allow_at(7), Some(0));
        assert_eq!(limit.allow_at(7), None);
        assert_eq!(limit.allow_at(7), None);
        assert_eq!(limit.allow_at(8), Some(2));
        assert_eq!(limit.allow_at(8), Some(0));
        assert_eq!(limit.allow_at(8), None);
        assert_eq!(limit.allow_at(9), Some(1));
    }
}
