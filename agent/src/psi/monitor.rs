//! The running PSI evaluation: reads every pressure file of both scopes, feeds the KEP logic,
//! and publishes the conditions, the readings and a bounded list of recent events behind an
//! atomic pointer (readers never wait).
//!
//! It wakes on a slow periodic tick (`--psi-interval`) and at once when a kernel trigger on a
//! memory or io file fires; because the kernel updates the averages every 2 s, a trigger also
//! schedules one more evaluation 2 s later. Where triggers cannot be armed it says so once and
//! relies on the tick. Triggers are armed at start; a scope that appears later (the kubelet
//! creating kubepods after the agent) is found on a tick and read on the tick.
//!
//! Every condition transition is also a span (`psi condition transition`) for the trace backend.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{
    PsiError, Resource, Scope,
    condition::{Event, EventType, NodeCondition, Status, Tracker},
    parse::Pressure,
    source::{self, Scopes},
    trigger::Trigger,
};
use crate::sysfs::HostFs;

/// Events kept for `GET /v1/events`.
pub const EVENTS_KEPT: usize = 256;
/// The kernel recomputes the averages this often.
const AVERAGING: Duration = Duration::from_secs(2);

/// Thresholds and pace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsiConfig {
    /// Percent of wall time stalled on memory (avg10/avg60 of `some`).
    pub memory_threshold: f64,
    pub io_threshold: f64,
    pub interval: Duration,
}

impl PsiConfig {
    /// The threshold of a resource that has conditions.
    pub fn threshold(&self, resource: Resource) -> Option<f64> {
        match resource {
            Resource::Memory => Some(self.memory_threshold),
            Resource::Io => Some(self.io_threshold),
            Resource::Cpu => None,
        }
    }
}

/// One pressure file as last read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reading {
    pub scope: Scope,
    pub resource: Resource,
    pub file: String,
    #[serde(flatten)]
    pub pressure: Pressure,
}

/// A trigger and whether it is armed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerState {
    pub file: String,
    pub armed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What the API shows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PsiView {
    pub conditions: Vec<NodeCondition>,
    pub readings: Vec<Reading>,
    pub scopes: Scopes,
    pub triggers: Vec<TriggerState>,
    #[serde(skip)]
    pub events: VecDeque<Event>,
}

impl PsiView {
    /// The first *MemoryContentionPressure condition that is True, for admission.
    pub fn memory_pressure(&self) -> Option<&NodeCondition> {
        self.conditions
            .iter()
            .find(|c| c.status == Status::True && c.kind.ends_with("MemoryContentionPressure"))
    }
}

/// A handle the API clones and loads from.
#[derive(Debug, Clone)]
pub struct PsiReader(Arc<ArcSwap<PsiView>>);

impl PsiReader {
    pub fn load(&self) -> Arc<PsiView> {
        self.0.load_full()
    }
}

/// The evaluation and its state; the only writer of the view.
#[derive(Debug)]
pub struct Monitor {
    host: HostFs,
    config: PsiConfig,
    scopes: Scopes,
    tracker: Tracker,
    readings: Vec<Reading>,
    events: VecDeque<Event>,
    triggers: Vec<TriggerState>,
    shared: Arc<ArcSwap<PsiView>>,
}

impl Monitor {
    /// Locates the files and publishes a first view (every condition Unknown until evaluated).
    pub fn new(host: HostFs, config: PsiConfig) -> (Monitor, PsiReader) {
        let scopes = Scopes::locate(&host);
        let tracker = Tracker::new(SystemTime::now());
        let shared = Arc::new(ArcSwap::from_pointee(PsiView {
            conditions: tracker.conditions(),
            readings: Vec::new(),
            scopes: scopes.clone(),
            triggers: Vec::new(),
            events: VecDeque::new(),
        }));
        let monitor = Monitor {
            host,
            config,
            scopes,
            tracker,
            readings: Vec::new(),
            events: VecDeque::new(),
            triggers: Vec::new(),
            shared: shared.clone(),
        };
        (monitor, PsiReader(shared))
    }

    /// Reads every file, applies the logic, publishes; returns the new events.
    pub fn evaluate(&mut self, now: SystemTime) -> Vec<Event> {
        if self.scopes.all().iter().any(|s| s.unavailable.is_some()) {
            self.scopes = Scopes::locate(&self.host);
        }
        let mut events = Vec::new();
        let mut readings = Vec::new();
        for files in self.scopes.clone().all() {
            if let Some(why) = &files.unavailable {
                events.extend(self.tracker.unavailable(files.scope, why, now));
                continue;
            }
            for resource in Resource::ALL {
                let Some(file) = files.file(resource) else {
                    continue;
                };
                match source::read(&self.host, &file) {
                    Ok(pressure) => {
                        if let Some(threshold) = self.config.threshold(resource) {
                            events.extend(self.tracker.observe(
                                files.scope,
                                resource,
                                &pressure.some,
                                threshold,
                                &file,
                                now,
                            ));
                        }
                        readings.push(Reading {
                            scope: files.scope,
                            resource,
                            file,
                            pressure,
                        });
                    }
                    // The cpu file is only reported; memory and io decide conditions.
                    Err(err) if resource == Resource::Cpu => warn!("{err}"),
                    Err(err) => {
                        events.extend(self.tracker.unavailable(files.scope, &err.to_string(), now));
                    }
                }
            }
        }
        self.readings = readings;
        for event in &events {
            log_event(event);
            transition_span(event);
            if self.events.len() == EVENTS_KEPT {
                self.events.pop_front();
            }
            self.events.push_back(event.clone());
        }
        self.publish();
        events
    }

    fn publish(&self) {
        let conditions = self.tracker.conditions();
        self.shared.store(Arc::new(PsiView {
            conditions,
            readings: self.readings.clone(),
            scopes: self.scopes.clone(),
            triggers: self.triggers.clone(),
            events: self.events.clone(),
        }));
    }

    /// Arms a trigger on every available memory and io file; the rest fall back to the tick.
    fn arm_triggers(&mut self) -> Vec<Trigger> {
        let mut armed = Vec::new();
        for files in self.scopes.all() {
            for resource in [Resource::Memory, Resource::Io] {
                let (Some(file), Some(threshold)) =
                    (files.file(resource), self.config.threshold(resource))
                else {
                    continue;
                };
                match Trigger::arm(&self.host, &file, threshold) {
                    Ok(t) => {
                        self.triggers.push(TriggerState {
                            file,
                            armed: true,
                            why: None,
                        });
                        armed.push(t);
                    }
                    Err(err) => {
                        let message = format!(
                            "PSI trigger unavailable, {file} is read every {:?} only: {err}",
                            self.config.interval
                        );
                        // A read-only mount is how the DaemonSet ships: said, not warned of.
                        if matches!(err, PsiError::ReadOnlyMount { .. }) {
                            info!("{message}");
                        } else {
                            warn!("{message}");
                        }
                        self.triggers.push(TriggerState {
                            file,
                            armed: false,
                            why: Some(err.to_string()),
                        });
                    }
                }
            }
        }
        armed
    }

    /// Evaluates until `stop` changes: on the tick, and at once when a trigger fires.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let triggers = self.arm_triggers();
        let (fired_tx, mut fired) = mpsc::channel::<(String, Instant)>(16);
        let mut waiters = Vec::new();
        for trigger in triggers {
            let tx = fired_tx.clone();
            waiters.push(tokio::spawn(async move {
                loop {
                    match trigger.fired().await {
                        Ok(()) => {
                            if tx
                                .send((trigger.file.clone(), Instant::now()))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Err(err) => {
                            warn!("{err}; its trigger is dropped");
                            return;
                        }
                    }
                }
            }));
        }
        self.publish();
        let mut tick = tokio::time::interval(self.config.interval);
        let mut again: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = tick.tick() => {
                    self.evaluate(SystemTime::now());
                }
                Some((file, at)) = fired.recv() => {
                    self.evaluate(SystemTime::now());
                    info!(file, trigger_to_evaluation_us = at.elapsed().as_micros() as u64, "PSI trigger fired");
                    again = Some(tokio::time::Instant::now() + AVERAGING);
                }
                () = sleep_until(again), if again.is_some() => {
                    again = None;
                    self.evaluate(SystemTime::now());
                }
            }
        }
        for w in waiters {
            w.abort();
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// A span for an event that is a condition transition (to True, to False, or to Unknown).
fn transition_span(e: &Event) {
    let status = if e.reason == "PressureUnavailable" {
        "Unknown"
    } else if e.reason.starts_with("NodeHasNo") {
        "False"
    } else if e.reason.starts_with("NodeHas") {
        "True"
    } else {
        return;
    };
    let scope = e.scope.to_string();
    let resource = e.resource.to_string();
    let _span = tracing::debug_span!(
        "psi condition transition",
        psi.condition = super::condition::condition_type(e.scope, e.resource).as_str(),
        psi.status = status,
        psi.reason = e.reason.as_str(),
        psi.scope = scope.as_str(),
        psi.resource = resource.as_str(),
        psi.message = e.message.as_str(),
    )
    .entered();
}

fn log_event(e: &Event) {
    match e.kind {
        EventType::Warning => {
            warn!(reason = %e.reason, scope = %e.scope, resource = %e.resource, "{}", e.message)
        }
        EventType::Normal => {
            info!(reason = %e.reason, scope = %e.scope, resource = %e.resource, "{}", e.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake;

    const CONFIG: PsiConfig = PsiConfig {
        memory_threshold: 10.0,
        io_threshold: 10.0,
        interval: Duration::from_secs(5),
    };
    const QUIET: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const HIGH: &str = "some avg10=40.00 avg60=30.00 avg300=5.00 total=99\nfull avg10=1.00 avg60=1.00 avg300=0.00 total=9\n";

    #[test]
    fn both_scopes_are_read_and_a_kubepods_memory_condition_is_published() {
        let (dir, host) = fake::tree(&[
            ("/proc/pressure/memory", QUIET),
            ("/proc/pressure/io", QUIET),
            (
                "/proc/pressure/cpu",
                "some avg10=50.00 avg60=50.00 avg300=50.00 total=1\n",
            ),
            ("/sys/fs/cgroup/cgroup.controllers", "memory io\n"),
            ("/sys/fs/cgroup/kubepods.slice/memory.pressure", HIGH),
            ("/sys/fs/cgroup/kubepods.slice/io.pressure", QUIET),
            ("/sys/fs/cgroup/kubepods.slice/cpu.pressure", QUIET),
        ]);
        let (mut monitor, reader) = Monitor::new(host, CONFIG);
        let events = monitor.evaluate(SystemTime::now());
        assert_eq!(
            events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            [
                "HighMemoryContentionPressure",
                "NodeHasKubepodsMemoryContentionPressure"
            ]
        );
        let view = reader.load();
        assert_eq!(view.readings.len(), 6, "3 resources x 2 scopes");
        let status = |kind: &str| {
            view.conditions
                .iter()
                .find(|c| c.kind == kind)
                .map(|c| c.status)
        };
        assert_eq!(
            status("KubepodsMemoryContentionPressure"),
            Some(Status::True)
        );
        assert_eq!(
            status("SystemMemoryContentionPressure"),
            Some(Status::False)
        );
        assert!(
            view.conditions.iter().all(|c| !c.kind.contains("Cpu")),
            "cpu is reported, not a condition"
        );
        assert_eq!(
            view.memory_pressure().map(|c| c.kind.as_str()),
            Some("KubepodsMemoryContentionPressure")
        );
        assert_eq!(view.events.len(), 2);

        // The kubepods cgroup disappears: its conditions become Unknown, the system's stay.
        std::fs::remove_file(
            dir.path()
                .join("sys/fs/cgroup/kubepods.slice/memory.pressure"),
        )
        .expect("remove");
        monitor.evaluate(SystemTime::now());
        let view = reader.load();
        let c = view
            .conditions
            .iter()
            .find(|c| c.kind == "KubepodsMemoryContentionPressure")
            .expect("listed");
        assert_eq!(c.status, Status::Unknown);
        assert!(
            c.message.contains("kubepods.slice/memory.pressure"),
            "{}",
            c.message
        );
        assert!(view.memory_pressure().is_none());
    }

    /// Issue #14: over a copied host tree (ordinary files) the monitor armed its triggers by
    /// writing into the tree's pressure files, could not parse them afterwards, and kept every
    /// condition Unknown on a tree whose memory pressure was avg10=60, avg60=55 over 30.
    #[tokio::test]
    async fn over_a_copied_host_tree_no_trigger_is_armed_and_the_files_are_read_unchanged() {
        const HIGHER: &str = "some avg10=60.00 avg60=55.00 avg300=20.00 total=123456\nfull avg10=1.00 avg60=1.00 avg300=0.50 total=789\n";
        let files = [
            ("/proc/pressure/memory", HIGHER),
            ("/proc/pressure/io", QUIET),
            ("/proc/pressure/cpu", QUIET),
            ("/sys/fs/cgroup/cgroup.controllers", "memory io\n"),
            ("/sys/fs/cgroup/kubepods.slice/memory.pressure", QUIET),
            ("/sys/fs/cgroup/kubepods.slice/io.pressure", QUIET),
            ("/sys/fs/cgroup/kubepods.slice/cpu.pressure", QUIET),
        ];
        let (dir, host) = fake::tree(&files);
        let config = PsiConfig {
            memory_threshold: 30.0,
            ..CONFIG
        };
        let (mut monitor, reader) = Monitor::new(host, config);
        assert!(monitor.arm_triggers().is_empty(), "a trigger was armed");
        monitor.evaluate(SystemTime::now());
        for (file, content) in files {
            let path = dir.path().join(file.trim_start_matches('/'));
            assert_eq!(
                std::fs::read_to_string(&path).expect("read back"),
                content,
                "{file} changed"
            );
        }
        let view = reader.load();
        assert_eq!(view.triggers.len(), 4, "memory and io of both scopes");
        for t in &view.triggers {
            assert!(!t.armed, "{t:?}");
            assert!(
                t.why
                    .as_deref()
                    .is_some_and(|w| w.contains("not a kernel pressure file")),
                "{t:?}"
            );
        }
        let status = |kind: &str| {
            view.conditions
                .iter()
                .find(|c| c.kind == kind)
                .map(|c| c.status)
        };
        assert_eq!(
            status("SystemMemoryContentionPressure"),
            Some(Status::True),
            "{:?}",
            view.conditions
        );
        for kind in [
            "SystemDiskContentionPressure",
            "KubepodsMemoryContentionPressure",
            "KubepodsDiskContentionPressure",
        ] {
            assert_eq!(status(kind), Some(Status::False), "{kind}");
        }
    }

    #[test]
    fn events_are_bounded() {
        let (dir, host) = fake::tree(&[
            ("/proc/pressure/memory", QUIET),
            ("/proc/pressure/io", QUIET),
            ("/proc/pressure/cpu", QUIET),
        ]);
        let (mut monitor, reader) = Monitor::new(host, CONFIG);
        let file = dir.path().join("proc/pressure/memory");
        for i in 0..(EVENTS_KEPT + 10) {
            std::fs::write(&file, if i % 2 == 0 { HIGH } else { QUIET }).expect("write");
            monitor.evaluate(SystemTime::now());
        }
        assert_eq!(reader.load().events.len(), EVENTS_KEPT);
    }
}
