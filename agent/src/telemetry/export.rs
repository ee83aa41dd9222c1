//! The span queue between the agent and the OTLP exporter: a [`SpanProcessor`] whose `on_end`
//! only tries to put the finished span in a bounded queue (a full queue drops the span and
//! counts it), and one thread of its own that batches the queue and exports each batch with a
//! deadline (a failed or late export drops the batch and counts it). Nothing the collector does
//! can make a caller wait: the queue's lock is held only to push a span or to swap the queue
//! out, and the network I/O runs on that thread's own runtime, not the agent's.
//!
//! The export thread is woken once per full batch, or when the schedule delay passes, never per
//! span: at tens of thousands of spans a second a wake-up per span (an eventfd write and a
//! context switch each) cost as much as the admissions themselves.
//!
//! Sizes and delays follow the standard variables (`OTEL_BSP_MAX_QUEUE_SIZE`,
//! `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_EXPORT_TIMEOUT`).
//! Shutdown drains the queue into final exports, bounded by the export timeout.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc as std_mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use opentelemetry::Context;
use opentelemetry_sdk::{
    error::{OTelSdkError, OTelSdkResult},
    trace::{Span, SpanData, SpanExporter, SpanProcessor},
};
use tokio::sync::{Notify, mpsc};
use tracing::{info, warn};

use super::encode::{Encoder, Kind};

/// The finished spans waiting for the export thread, and its wake-up.
#[derive(Debug, Default)]
struct Queue {
    spans: Mutex<Vec<SpanData>>,
    full_batch: Notify,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{var} {value:?}: expected a whole number above 0")]
    Setting { var: &'static str, value: String },
    #[error("starting the span export thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("building the OTLP span exporter: {0}")]
    Build(String),
}

/// What the queue did with the spans it was given.
#[derive(Debug, Default)]
pub struct ExportStats {
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
}

impl ExportStats {
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full.load(Ordering::Relaxed)
            + self.dropped_export_failed.load(Ordering::Relaxed)
    }

    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// `hugepage_agent_trace_spans_exported_total`, `hugepage_agent_trace_spans_dropped_total`.
    pub fn encode(&self, e: &mut Encoder) {
        const EX: &str = "hugepage_agent_trace_spans_exported_total";
        e.family(EX, Kind::Counter, "Spans the OTLP collector accepted.");
        e.sample(EX, &[], self.exported() as f64);
        const DR: &str = "hugepage_agent_trace_spans_dropped_total";
        e.family(
            DR,
            Kind::Counter,
            "Spans dropped: the export queue was full, or their export failed or timed out.",
        );
        for (reason, n) in [
            ("queue_full", &self.dropped_queue_full),
            ("export_failed", &self.dropped_export_failed),
        ] {
            e.sample(DR, &[("reason", reason)], n.load(Ordering::Relaxed) as f64);
        }
    }
}

/// Queue and batch sizes, delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
    pub timeout: Duration,
}

impl QueueSettings {
    /// From the `OTEL_BSP_*` variables, with the specification's defaults.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<QueueSettings, ExportError> {
        let number = |var: &'static str, default: u64| match get(var) {
            None => Ok(default),
            Some(value) => match value.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(ExportError::Setting { var, value }),
            },
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)? as usize;
        Ok(QueueSettings {
            max_queue,
            max_batch: (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)? as usize).min(max_queue),
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
            timeout: Duration::from_millis(number("OTEL_BSP_EXPORT_TIMEOUT", 30000)?),
        })
    }
}

enum Control {
    Flush(std_mpsc::SyncSender<()>),
    Shutdown(std_mpsc::SyncSender<()>),
}

/// The processor the tracer provider feeds.
#[derive(Debug)]
pub struct QueueProcessor {
    queue: Arc<Queue>,
    max_queue: usize,
    max_batch: usize,
    control: mpsc::UnboundedSender<Control>,
    stats: Arc<ExportStats>,
    timeout: Duration,
    worker: Mutex<Option<JoinHandle<()>>>,
    shut_down: AtomicBool,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Flush(_) => "Flush",
            Control::Shutdown(_) => "Shutdown",
        })
    }
}

impl QueueProcessor {
    /// Starts the export thread; `build` makes the exporter there, inside that thread's runtime
    /// (the gRPC client needs one), and its error is returned here.
    pub fn start<E, B>(
        build: B,
        settings: QueueSettings,
        stats: Arc<ExportStats>,
    ) -> Result<QueueProcessor, ExportError>
    where
        E: SpanExporter + 'static,
        B: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let queue = Arc::new(Queue::default());
        let worker_queue = queue.clone();
        let (control, control_rx) = mpsc::unbounded_channel();
        let (built_tx, built_rx) = std_mpsc::sync_channel::<Result<(), String>>(1);
        let worker_stats = stats.clone();
        let worker = std::thread::Builder::new()
            .name("otlp-export".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(err) => {
                        let _ = built_tx.send(Err(format!("its runtime: {err}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let exporter = match build() {
                        Ok(exporter) => exporter,
                        Err(err) => {
                            let _ = built_tx.send(Err(err));
                            return;
                        }
                    };
                    let _ = built_tx.send(Ok(()));
                    Worker {
                        exporter,
                        settings,
                        stats: worker_stats,
                        failing: false,
                    }
                    .run(&worker_queue, control_rx)
                    .await;
                });
            })
            .map_err(ExportError::Thread)?;
        match built_rx.recv() {
            Ok(Ok(())) => Ok(QueueProcessor {
                queue,
                max_queue: settings.max_queue,
                max_batch: settings.max_batch,
                control,
                stats,
                timeout: settings.timeout,
                worker: Mutex::new(Some(worker)),
                shut_down: AtomicBool::new(false),
            }),
            Ok(Err(err)) => Err(ExportError::Build(err)),
            Err(_) => Err(ExportError::Build("the export thread ended".to_owned())),
        }
    }

    /// Sends `make(reply)` to the worker and waits up to `timeout` for the reply.
    fn ask(
        &self,
        make: fn(std_mpsc::SyncSender<()>) -> Control,
        timeout: Duration,
    ) -> OTelSdkResult {
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.control
            .send(make(tx))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        rx.recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let Ok(mut spans) = self.queue.spans.lock() else {
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if spans.len() >= self.max_queue {
            drop(spans);
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        spans.push(span);
        let batch_ready = spans.len() == self.max_batch;
        drop(spans);
        if batch_ready {
            self.queue.full_batch.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, self.timeout)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        self.ask(Control::Shutdown, timeout)?;
        if let Some(worker) = self.worker.lock().ok().and_then(|mut w| w.take()) {
            let _ = worker.join();
        }
        Ok(())
    }
}

/// The export thread's side.
struct Worker<E> {
    exporter: E,
    settings: QueueSettings,
    stats: Arc<ExportStats>,
    /// The last export failed (failures are logged when they start and when they end).
    failing: bool,
}

impl<E: SpanExporter> Worker<E> {
    async fn run(mut self, queue: &Queue, mut control: mpsc::UnboundedReceiver<Control>) {
        loop {
            let due = tokio::time::Instant::now() + self.settings.delay;
            tokio::select! {
                biased;
                message = control.recv() => {
                    self.export_queued(queue).await;
                    match message {
                        Some(Control::Flush(reply)) => {
                            let _ = reply.send(());
                        }
                        Some(Control::Shutdown(reply)) => {
                            let _ = self.exporter.shutdown();
                            let _ = reply.send(());
                            return;
                        }
                        None => return,
                    }
                    continue;
                }
                () = queue.full_batch.notified() => {}
                () = tokio::time::sleep_until(due) => {}
            }
            self.export_queued(queue).await;
        }
    }

    /// Takes everything queued and exports it, batch by batch.
    async fn export_queued(&mut self, queue: &Queue) {
        loop {
            let spans = match queue.spans.lock() {
                Ok(mut spans) if !spans.is_empty() => {
                    std::mem::replace(&mut *spans, Vec::with_capacity(self.settings.max_batch))
                }
                _ => return,
            };
            let mut spans = spans.into_iter().peekable();
            while spans.peek().is_some() {
                let mut batch: Vec<SpanData> =
                    spans.by_ref().take(self.settings.max_batch).collect();
                self.export(&mut batch).await;
            }
        }
    }

    async fn export(&mut self, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let outcome = tokio::time::timeout(
            self.settings.timeout,
            self.exporter.export(std::mem::take(batch)),
        )
        .await;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(err.to_string()),
            Err(_) => Some(format!("no answer within {:?}", self.settings.timeout)),
        };
        match failure {
            None => {
                self.stats.exported.fetch_add(n, Ordering::Relaxed);
                if std::mem::take(&mut self.failing) {
                    info!("span export works again");
                }
            }
            Some(why) => {
                self.stats
                    .dropped_export_failed
                    .fetch_add(n, Ordering::Relaxed);
                if !std::mem::replace(&mut self.failing, true) {
                    warn!(
                        spans = n,
                        "span export failed, spans are dropped and counted until it works: {why}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
