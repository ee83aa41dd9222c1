//! `GET /v1/hugepages?watch=true`: the map as a stream, for the webhook to keep a table per node
//! without asking every agent for every pod. One hub ([`Hub`]) follows what the extender decides
//! on, per NUMA node and page size: the kernel's free pages, the bytes the agent holds in
//! reservations, what remains unreserved; and a marker that the NUMA selection's inputs (the
//! kubelet's settings, the Memory Manager's state) changed. It publishes a new state, under the
//! next generation, only when that content changed: on the map's snapshots (prompted by hugetlb
//! faults and the reconcile), on each change of the reservations, and every second for what time
//! alone changes (a reservation that expires, a view the run loop replaced).
//!
//! A watcher gets newline-delimited JSON events (`application/x-ndjson`; Kubernetes watches send
//! the same kind of stream as `application/json;stream=watch`, which generic clients and
//! checkers take for one JSON document): `SNAPSHOT` (the state now) first, `MODIFIED` with each new
//! state, and `BOOKMARK` (no state) every `heartbeat` while nothing changes. Every event names
//! the hub's `epoch` (new with each start of the agent), the `generation` and the agent's
//! version (`agentVersion`). A watcher that
//! resumes with the `epoch` and `generation` it last saw gets no snapshot when nothing changed
//! since; any other resume gets the state now as a `SNAPSHOT` (generations are not kept). A
//! watcher is sent the latest state only, never a queue: a slow one skips states, and holds no
//! more than one event. At most `max_watchers` at once (more: 503 with `Retry-After`); each
//! watch ends after `max_duration`, jittered up to twice that, so that watchers come back with a
//! resume at different times rather than together.

use std::{
    future::Future,
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use axum::{
    body::{Body, Bytes},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use futures_util::stream;
use serde::{Deserialize, Serialize};
use tokio::{
    sync::watch,
    time::{Instant, MissedTickBehavior},
};

use super::error::ApiError;
use crate::{
    admission::{
        reservations::{Reservation, Store},
        verify::{Gate, Mode, pressure_message},
    },
    host::PageSize,
    kube::identifiers,
    kubeletconfig::live::KubeletView,
    memorymanager::{live::MemoryManagerView, streamed::KubeletSelection},
    numa::map::{MapReader, Snapshot, Source},
    psi::monitor::PsiReader,
    telemetry::watch::{EVENT_KINDS, WatchStats},
};

/// How often the hub looks again at what only time changes.
const TICK: Duration = Duration::from_secs(1);
/// How long a new watcher waits at most for the published state to catch up with the map.
const CATCH_UP: Duration = Duration::from_millis(100);
/// The content type of a stream of events: one JSON document a line.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// The watch's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Watchers at once (`--max-watchers`).
    pub max_watchers: usize,
    /// A `BOOKMARK` after this long without a change (`--watch-heartbeat`).
    pub heartbeat: Duration,
    /// A watch ends after this long, jittered up to twice it (`--watch-max-duration`).
    pub max_duration: Duration,
}

impl WatchLimits {
    pub const DEFAULT: WatchLimits = WatchLimits {
        max_watchers: 32,
        heartbeat: Duration::from_secs(5),
        max_duration: Duration::from_secs(300),
    };
}

/// One page size on one NUMA node, as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeState {
    pub page_size_bytes: u64,
    pub total: u64,
    pub free: u64,
    /// Bytes the agent holds in reservations that may draw from this node.
    pub reserved_by_agent: u64,
    /// Free bytes not held by a reservation: what an admission here may take.
    pub unreserved_bytes: u64,
    /// The pool's files could not be read: these are the last good figures.
    pub stale: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub node: u32,
    pub sizes: Vec<SizeState>,
}

/// One page size system-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemSize {
    pub page_size_bytes: u64,
    /// `resv_hugepages`: pages promised to mappings and not faulted yet (what strict mode
    /// subtracts from the free pages of the selected nodes).
    pub reserved: u64,
}

/// How the agent picks the NUMA nodes a pod's hugepages are verified on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NumaSelection {
    /// The kubelet's Memory Manager policy is `None`: every node of the machine, whatever the
    /// pod (what a watcher can decide from the state alone).
    NodeWide,
    /// The policy is `Static`: the kubelet's hints and Topology Manager policy select the nodes
    /// (a watcher asks the agent).
    Kubelet,
}

/// What the extender decides on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchState {
    pub source: Source,
    pub nodes: Vec<NodeState>,
    pub system: Vec<SystemSize>,
    /// The reservations in force, which admissions subtract where they meet the selected nodes.
    pub reservations: Vec<Reservation>,
    /// The verification's gate (the kubelet's or `--verification`) and mode (`--mode`).
    pub gate: Gate,
    pub mode: Mode,
    pub numa_selection: NumaSelection,
    /// While the agent refuses every hugepage admission under memory contention pressure
    /// (`--reject-under-pressure`), what it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_refusal: Option<String>,
    /// Counts the changes of the NUMA selection's inputs (the kubelet's settings, the Memory
    /// Manager's state) since the agent started: a different value means they changed.
    pub selection_inputs: u64,
    /// Under `kubelet` selection, the inputs themselves: what a watcher selects the nodes with as
    /// the kubelet would. Absent when the agent cannot select either (the kubelet's settings or
    /// the Memory Manager's state refused): then it is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_selection: Option<Arc<KubeletSelection>>,
}

/// What a state says besides the map and the reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    pub gate: Gate,
    pub mode: Mode,
    pub numa_selection: NumaSelection,
    pub pressure_refusal: Option<String>,
    pub selection_inputs: u64,
    pub kubelet_selection: Option<Arc<KubeletSelection>>,
}

/// The state of `snapshot` with the reservations of `store` in force at `now`.
pub fn state(
    snapshot: &Snapshot,
    store: &Store,
    settings: StateSettings,
    now: SystemTime,
) -> WatchState {
    let nodes = snapshot
        .nodes
        .iter()
        .map(|node| NodeState {
            node: node.info.node.0,
            sizes: node
                .sizes
                .iter()
                .map(|size| {
                    let reserved =
                        store.held(PageSize(size.page_size_bytes), &[node.info.node], "", now);
                    let free_bytes = size.free.saturating_mul(size.page_size_bytes);
                    SizeState {
                        page_size_bytes: size.page_size_bytes,
                        total: size.total,
                        free: size.free,
                        reserved_by_agent: reserved,
                        unreserved_bytes: free_bytes.saturating_sub(reserved),
                        stale: size.stale.is_some(),
                    }
                })
                .collect(),
        })
        .collect();
    WatchState {
        source: snapshot.source,
        nodes,
        system: snapshot
            .global
            .iter()
            .map(|g| SystemSize {
                page_size_bytes: g.pool.size.0,
                reserved: g.pool.reserved,
            })
            .collect(),
        reservations: store.in_force(now).cloned().collect(),
        gate: settings.gate,
        mode: settings.mode,
        numa_selection: settings.numa_selection,
        pressure_refusal: settings.pressure_refusal,
        selection_inputs: settings.selection_inputs,
        kubelet_selection: settings.kubelet_selection,
    }
}

/// A state the hub published.
#[derive(Debug, Clone)]
pub struct Published {
    pub generation: u64,
    pub state: Arc<WatchState>,
    /// The generation of the map snapshot the state was read from (or found equal to).
    pub map_generation: u64,
}

/// One event of the stream.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub epoch: &'a str,
    pub generation: u64,
    /// The agent's version, on every event: the webhook checks it against its own
    /// (docs/install/release.md, versions).
    pub agent_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<&'a WatchState>,
}

/// A watch's query: `watch=true`, and where it resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resume {
    pub watch: bool,
    pub epoch: Option<String>,
    pub generation: Option<u64>,
}

impl Resume {
    /// `watch` (`true` or `false`), `epoch` and `generation` (a whole number) from a query;
    /// anything else of theirs is refused naming the parameter, other parameters are ignored.
    pub fn from_query(query: Option<&str>) -> Result<Resume, ApiError> {
        let mut resume = Resume::default();
        for pair in query.unwrap_or("").split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let shown = || identifiers::Shown::new(value);
            match key {
                "watch" => {
                    resume.watch = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(ApiError::invalid(
                                "watch",
                                format!("{} is not true or false", shown()),
                            ));
                        }
                    }
                }
                "epoch" => resume.epoch = Some(value.to_owned()),
                "generation" => {
                    let generation = value.parse().map_err(|_| {
                        ApiError::invalid(
                            "generation",
                            format!("{} is not a generation (a whole number)", shown()),
                        )
                    })?;
                    resume.generation = Some(generation);
                }
                _ => {}
            }
        }
        Ok(resume)
    }

    /// Whether a watcher resuming so already has `published` from the hub of `epoch`.
    pub fn is_current(&self, epoch: &str, published: &Published) -> bool {
        self.epoch.as_deref() == Some(epoch) && self.generation == Some(published.generation)
    }
}

/// The publisher of states, and what every watch shares.
#[derive(Debug, Clone)]
pub struct Hub {
    epoch: Arc<str>,
    published: watch::Receiver<Published>,
    /// The map, whose generation a new watcher's first state must have caught up with.
    map: MapReader,
    limits: WatchLimits,
    pub stats: Arc<WatchStats>,
}

/// What the hub reads to make a state.
pub struct Inputs {
    pub map: MapReader,
    pub reservations: Arc<Mutex<Store>>,
    pub kubelet: Arc<ArcSwap<KubeletView>>,
    pub memory_manager: Arc<ArcSwap<MemoryManagerView>>,
    /// `--mode` (the gate is the kubelet's, or `--verification`).
    pub mode: Mode,
    pub psi: PsiReader,
    /// `--reject-under-pressure`.
    pub reject_under_pressure: bool,
}

impl Inputs {
    /// The settings a state carries now, with the selection inputs `selection` followed.
    fn settings(&self, selection: &Selection) -> StateSettings {
        let kubelet = self.kubelet.load();
        StateSettings {
            gate: if kubelet.settings.verification() {
                Gate::On
            } else {
                Gate::Off
            },
            mode: self.mode,
            numa_selection: if kubelet.pins_memory() {
                NumaSelection::Kubelet
            } else {
                NumaSelection::NodeWide
            },
            kubelet_selection: selection.inputs.clone(),
            pressure_refusal: self
                .reject_under_pressure
                .then(|| self.psi.load().memory_pressure().map(pressure_message))
                .flatten(),
            selection_inputs: selection.changes,
        }
    }

    /// What selects the nodes as the kubelet would, when it pins memory and the agent can select.
    fn kubelet_selection(&self) -> Option<Arc<KubeletSelection>> {
        let kubelet = self.kubelet.load();
        if !kubelet.pins_memory() {
            return None;
        }
        let view = self.memory_manager.load();
        let config = kubelet.topology(None, None).ok()?;
        view.usable().ok()?;
        Some(Arc::new(KubeletSelection::of(&config, &view.state)))
    }
}

/// The NUMA selection's inputs as the hub last read them: built again only when the run loop
/// replaced the kubelet's view or the Memory Manager's with different content (it replaces them
/// at each reconcile, most often with the same).
struct Selection {
    views: Views,
    /// How many times they changed since the agent started.
    changes: u64,
    inputs: Option<Arc<KubeletSelection>>,
}

impl Selection {
    fn of(inputs: &Inputs) -> Selection {
        Selection {
            views: Views::of(inputs),
            changes: 0,
            inputs: inputs.kubelet_selection(),
        }
    }

    /// Reads the inputs again if the views' content changed.
    fn follow(&mut self, inputs: &Inputs) {
        let now = Views::of(inputs);
        if now.same_as(&self.views) {
            return;
        }
        let changed = !now.select_as(&self.views);
        self.views = now;
        if changed {
            self.changes += 1;
            self.inputs = inputs.kubelet_selection();
        }
    }
}

/// The views the selection was last read from.
struct Views {
    kubelet: Arc<KubeletView>,
    memory_manager: Arc<MemoryManagerView>,
}

impl Views {
    fn of(inputs: &Inputs) -> Views {
        Views {
            kubelet: inputs.kubelet.load_full(),
            memory_manager: inputs.memory_manager.load_full(),
        }
    }

    /// Whether these are the very views of `other` (neither was replaced).
    fn same_as(&self, other: &Views) -> bool {
        Arc::ptr_eq(&self.kubelet, &other.kubelet)
            && Arc::ptr_eq(&self.memory_manager, &other.memory_manager)
    }

    /// Whether these views select as `other`'s do: the same settings, verdicts and state (when
    /// they were read and from where aside).
    fn select_as(&self, other: &Views) -> bool {
        let (k, was) = (&self.kubelet, &other.kubelet);
        let (m, had) = (&self.memory_manager, &other.memory_manager);
        k.settings == was.settings
            && k.refusal == was.refusal
            && m.unusable == had.unusable
            && m.state == had.state
    }
}

impl Hub {
    /// The hub of `inputs` with its first state, and the task that publishes the next ones
    /// (for the caller to spawn on its runtime; until then the first state stays).
    pub fn new(
        inputs: Inputs,
        limits: WatchLimits,
        stats: Arc<WatchStats>,
    ) -> (Hub, impl Future<Output = ()> + Send + 'static) {
        let epoch: Arc<str> = Arc::from(epoch_now().as_str());
        let (first, map_generation) = read(&inputs, &Selection::of(&inputs));
        let (tx, rx) = watch::channel(Published {
            generation: 1,
            state: Arc::new(first),
            map_generation,
        });
        let hub = Hub {
            epoch,
            published: rx,
            map: inputs.map.clone(),
            limits,
            stats: Arc::clone(&stats),
        };
        (hub, publish(inputs, tx, stats))
    }

    /// The state published last.
    pub fn current(&self) -> Published {
        self.published.borrow().clone()
    }

    /// The state published last, once it is read from the map as it is now (waited for at most
    /// [`CATCH_UP`]): the publishing task follows the map a moment behind, and a watcher that
    /// connects in that moment (just after the probes attached, say) must not start from the
    /// map before.
    pub async fn caught_up(&self) -> Published {
        let map_generation = self.map.load().generation;
        let mut published = self.published.clone();
        let wait = published.wait_for(|p| p.map_generation >= map_generation);
        // A publisher that is gone or slow leaves the latest state, as before.
        let _ = tokio::time::timeout(CATCH_UP, wait).await;
        self.current()
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }
}

/// Publishes each new state of `inputs` until the hub and every watch are gone.
async fn publish(inputs: Inputs, tx: watch::Sender<Published>, stats: Arc<WatchStats>) {
    let map_published = inputs.map.published();
    let reservations_changed = match inputs.reservations.lock() {
        Ok(store) => store.changed(),
        Err(poisoned) => poisoned.into_inner().changed(),
    };
    let mut selection = Selection::of(&inputs);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = map_published.notified() => {}
            () = reservations_changed.notified() => {}
            _ = tick.tick() => {}
            () = tx.closed() => return,
        }
        selection.follow(&inputs);
        let (next, map_generation) = read(&inputs, &selection);
        tx.send_if_modified(|current| {
            if *current.state == next {
                // The same state, read from a newer map: not news, but caught up.
                current.map_generation = map_generation;
                return false;
            }
            *current = Published {
                generation: current.generation + 1,
                state: Arc::new(next),
                map_generation,
            };
            stats.published.fetch_add(1, Ordering::Relaxed);
            true
        });
    }
}

/// The state now, from the inputs, and the generation of the map snapshot it was read from; the
/// settings are read before the reservations' lock, which admissions hold, is taken.
fn read(inputs: &Inputs, selection: &Selection) -> (WatchState, u64) {
    let settings = inputs.settings(selection);
    let snapshot = inputs.map.load();
    let store = match inputs.reservations.lock() {
        Ok(store) => store,
        Err(poisoned) => poisoned.into_inner(),
    };
    let state = state(&snapshot, &store, settings, SystemTime::now());
    (state, snapshot.generation)
}

/// A new epoch: the start's wall-clock time in microseconds, in hex.
fn epoch_now() -> String {
    let micros = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    format!("{micros:x}")
}

/// One event as a line of the stream.
fn line(kind: &'static str, epoch: &str, published: &Published, with_state: bool) -> Bytes {
    let event = Event {
        kind,
        epoch,
        generation: published.generation,
        agent_version: env!("CARGO_PKG_VERSION"),
        object: with_state.then_some(&*published.state),
    };
    let mut text = serde_json::to_vec(&event).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

/// Counts a watcher while it lives.
struct Slot(Arc<WatchStats>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a watch's stream carries between events.
struct Watching {
    hub: Hub,
    sent: Option<u64>,
    first: bool,
    ends: Instant,
    _slot: Slot,
}

/// A jittered end for a watch starting now: between `max` and twice `max`.
fn jittered_end(max: Duration) -> Instant {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let extra = max.mul_f64(f64::from(nanos % 1000) / 1000.0);
    Instant::now() + max + extra
}

/// The response to a watch resuming as `resume`: the stream, or 503 when the watchers are many.
pub async fn serve(hub: &Hub, resume: &Resume) -> Response {
    let stats = Arc::clone(&hub.stats);
    let taken = stats.watchers.fetch_add(1, Ordering::Relaxed);
    let slot = Slot(Arc::clone(&stats));
    if taken >= hub.limits.max_watchers {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        drop(slot);
        let mut e = ApiError::unavailable(format!(
            "{} watchers already (--max-watchers): try again later",
            hub.limits.max_watchers
        ));
        e.retry_after = Some(1);
        return e.into_response();
    }
    let current = hub.caught_up().await;
    let sent = resume
        .is_current(hub.epoch(), &current)
        .then_some(current.generation);
    let watching = Watching {
        hub: hub.clone(),
        sent,
        first: sent.is_none(),
        ends: jittered_end(hub.limits.max_duration),
        _slot: slot,
    };
    let events = stream::unfold(watching, next_event);
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

/// The next line of a watch, or its end.
async fn next_event(
    mut w: Watching,
) -> Option<(Result<Bytes, std::convert::Infallible>, Watching)> {
    let epoch = Arc::clone(&w.hub.epoch);
    if w.first {
        w.first = false;
        let current = w.hub.current();
        w.sent = Some(current.generation);
        return Some((Ok(emit(&w.hub, 0, &epoch, &current, true)), w));
    }
    loop {
        if Instant::now() >= w.ends {
            return None;
        }
        let deadline = (Instant::now() + w.hub.limits.heartbeat).min(w.ends);
        let waited = tokio::time::timeout_at(deadline, w.hub.published.changed()).await;
        match waited {
            Ok(Err(_)) => return None,
            Ok(Ok(())) => {
                let current = w.hub.published.borrow_and_update().clone();
                if w.sent == Some(current.generation) {
                    continue;
                }
                w.sent = Some(current.generation);
                return Some((Ok(emit(&w.hub, 1, &epoch, &current, true)), w));
            }
            Err(_) if Instant::now() >= w.ends => return None,
            Err(_) => {
                let current = w.hub.current();
                return Some((Ok(emit(&w.hub, 2, &epoch, &current, false)), w));
            }
        }
    }
}

/// Counts and writes event `kind` (an index of [`EVENT_KINDS`]).
fn emit(hub: &Hub, kind: usize, epoch: &str, published: &Published, with_state: bool) -> Bytes {
    hub.stats.events[kind].fetch_add(1, Ordering::Relaxed);
    line(EVENT_KINDS[kind], epoch, published, with_state)
}
