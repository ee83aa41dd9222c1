//! `GET /v1/hugepages?watch=true` in process: the query's parameters, the state per node and size
//! with the reservations, and the stream itself: its snapshot, a new state after an admission
//! reserves, heartbeats, a resume, the selection's inputs read again (unchanged: no new state),
//! the watchers' limit and a watch's end. (On the real kernel,
//! with faults, over a socket: `tests/watch.rs`.)

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use axum::body::Body;

use super::*;
use crate::api::watch::{Hub, Inputs, Resume, WatchLimits};

#[test]
fn the_query_says_watch_and_where_to_resume_and_bad_values_are_named() {
    assert_eq!(Resume::from_query(None), Ok(Resume::default()));
    let resume = Resume::from_query(Some("watch=true&epoch=abc&generation=7&other=x"));
    assert_eq!(
        resume,
        Ok(Resume {
            watch: true,
            epoch: Some("abc".into()),
            generation: Some(7),
        })
    );
    assert!(
        !Resume::from_query(Some("watch=false"))
            .expect("false")
            .watch
    );
    let bad = Resume::from_query(Some("watch=yes")).expect_err("yes");
    assert_eq!(bad.field.as_deref(), Some("watch"));
    let bad = Resume::from_query(Some("watch=true&generation=-1")).expect_err("-1");
    assert_eq!(bad.field.as_deref(), Some("generation"));
}

/// The hub of `state`'s inputs with `limits`, its publisher running on this runtime.
fn running_hub(state: &AppState, limits: WatchLimits) -> Hub {
    let (hub, publisher) = hub(state, limits);
    tokio::spawn(publisher);
    hub
}

/// The hub of `state`'s inputs with `limits`, and its publisher, not running yet.
fn hub(state: &AppState, limits: WatchLimits) -> (Hub, impl Future<Output = ()> + use<>) {
    Hub::new(
        Inputs {
            map: state.map.clone(),
            reservations: state.reservations.clone(),
            kubelet: state.kubelet.clone(),
            memory_manager: state.memory_manager.clone(),
            mode: state.settings.mode,
            psi: state.psi.clone(),
            reject_under_pressure: state.reject_under_pressure,
        },
        limits,
        state.metrics.watch.clone(),
    )
}

/// The probes attach (the map's source changes) a moment before a watcher connects, while the
/// hub's publisher has not yet followed: the watcher's first state is the map as it is then,
/// not the one before.
#[tokio::test]
async fn a_watcher_that_connects_as_the_map_changes_starts_from_the_map_as_it_is() {
    let (_dir, state, mut writer) = super::state_and_map_writer();
    let (hub, publisher) = hub(&state, LIMITS);
    writer.set_source(crate::numa::map::Source::EbpfSysfs);
    assert_eq!(hub.current().state.source, crate::numa::map::Source::Sysfs);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        publisher.await;
    });
    let first = hub.caught_up().await;
    assert_eq!(first.state.source, crate::numa::map::Source::EbpfSysfs);
}

/// A watch's body, read line by line.
struct Lines {
    body: Body,
    pending: String,
}

impl Lines {
    /// The next event that is not a heartbeat; panics past `within`.
    async fn next_state(&mut self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self.next(left).await.expect("the stream goes on");
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }

    /// The next event, or `None` when the stream ended; panics past `within`.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        loop {
            if let Some((line, rest)) = self.pending.split_once('\n') {
                let event = serde_json::from_str(line).expect("a JSON event");
                self.pending = rest.to_owned();
                return Some(event);
            }
            let frame = tokio::time::timeout(within, self.body.frame())
                .await
                .expect("an event in time");
            match frame {
                None => return None,
                Some(frame) => {
                    let frame = frame.expect("a frame");
                    if let Some(data) = frame.data_ref() {
                        self.pending
                            .push_str(std::str::from_utf8(data).expect("UTF-8"));
                    }
                }
            }
        }
    }
}

async fn watch(state: &AppState, query: &str) -> (StatusCode, String, Lines) {
    let uri = format!("/v1/hugepages?{query}");
    let (status, ctype, body) = respond(state, "GET", &uri, None, Body::empty()).await;
    let lines = Lines {
        body,
        pending: String::new(),
    };
    (status, ctype, lines)
}

const SECOND: Duration = Duration::from_secs(1);
const LIMITS: WatchLimits = WatchLimits {
    max_watchers: 4,
    heartbeat: Duration::from_millis(300),
    max_duration: Duration::from_secs(60),
};

#[tokio::test]
async fn a_watch_gets_the_state_then_each_new_one_and_heartbeats_between() {
    let (_d, mut state) = state();
    state.watch = running_hub(&state, LIMITS);
    let (status, ctype, mut lines) = watch(&state, "watch=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ctype, "application/x-ndjson");
    let first = lines.next(SECOND).await.expect("a snapshot");
    assert_eq!(first["type"], "SNAPSHOT", "{first}");
    let epoch = first["epoch"].as_str().expect("an epoch").to_owned();
    let generation = first["generation"].as_u64().expect("a generation");
    let node0 = &first["object"]["nodes"][0]["sizes"][0];
    assert_eq!(node0["pageSizeBytes"], 2 << 20);
    assert_eq!(node0["free"], 1024);
    assert_eq!(node0["reservedByAgent"], 0);
    assert_eq!(node0["unreservedBytes"], 1024u64 * (2 << 20));
    assert_eq!(first["object"]["source"], "sysfs");
    // The kubelet pins memory here (Static, single-numa-node): what selects the nodes travels.
    assert_eq!(first["object"]["numaSelection"], "kubelet");
    let selection = &first["object"]["kubeletSelection"];
    assert_eq!(selection["topologyManagerPolicy"], "single-numa-node");
    assert_eq!(selection["topologyManagerScope"], "container");
    assert_eq!(
        selection["numaDistances"],
        json!({"0": [10, 20], "1": [20, 10]})
    );
    let table = &selection["machineState"]["1"]["memoryMap"]["hugepages-2Mi"];
    assert_eq!(table["allocatable"], 2048u64 * (2 << 20), "{selection}");
    assert_eq!(table["free"], 2048u64 * (2 << 20), "{selection}");

    // Nothing changes: a heartbeat, with the generation and no state.
    let beat = lines.next(SECOND).await.expect("a bookmark");
    assert_eq!(beat["type"], "BOOKMARK", "{beat}");
    assert_eq!(beat["generation"], generation);
    assert!(beat["object"].is_null());

    // An admission reserves 6 MiB on node 0: a new state says so, at once.
    let (status, _, answer) = admit(&state, short("6Mi", Some(json!([0])))).await;
    assert_eq!((status, &answer["allowed"]), (StatusCode::OK, &json!(true)));
    let changed = lines.next(SECOND).await.expect("a new state");
    assert_eq!(changed["type"], "MODIFIED", "{changed}");
    assert_eq!(changed["epoch"], epoch.as_str());
    assert!(changed["generation"].as_u64() > Some(generation));
    let node0 = &changed["object"]["nodes"][0]["sizes"][0];
    assert_eq!(node0["reservedByAgent"], 6u64 << 20);
    assert_eq!(node0["unreservedBytes"], 1024u64 * (2 << 20) - (6 << 20));
    assert_eq!(
        changed["object"]["nodes"][1]["sizes"][0]["reservedByAgent"],
        0
    );

    // A client that resumes where it was is sent no snapshot; one from another epoch is.
    let current = changed["generation"].as_u64().expect("a generation");
    let (_, _, mut resumed) = watch(
        &state,
        &format!("watch=true&epoch={epoch}&generation={current}"),
    )
    .await;
    let next = resumed.next(SECOND).await.expect("an event");
    assert_eq!(next["type"], "BOOKMARK", "{next}");
    let (_, _, mut stranger) = watch(&state, "watch=true&epoch=0&generation=1").await;
    let next = stranger.next(SECOND).await.expect("an event");
    assert_eq!(next["type"], "SNAPSHOT", "{next}");

    let text = scrape(&state, None).await.1;
    assert_eq!(
        sample(&text, "hugepage_agent_watchers"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "hugepage_agent_watch_events_total{type=\"SNAPSHOT\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "hugepage_agent_watch_states_total"),
        Some(1.0)
    );
}

#[tokio::test]
async fn the_selection_inputs_read_again_unchanged_are_no_new_state_and_changed_they_are() {
    let (_d, mut state) = state();
    state.watch = running_hub(&state, LIMITS);
    let (_, _, mut lines) = watch(&state, "watch=true").await;
    let first = lines.next(SECOND).await.expect("a snapshot");
    let generation = first["generation"].as_u64().expect("a generation");
    let inputs = first["object"]["selectionInputs"]
        .as_u64()
        .expect("selectionInputs");
    assert!(first["object"]["kubeletSelection"].is_object(), "{first}");
    // A heartbeat first: the hub's publisher has run and read the views.
    let beat = lines.next(SECOND).await.expect("a heartbeat");
    assert_eq!(beat["type"], "BOOKMARK", "{beat}");

    // Each reconcile reads both views again and replaces them, most often with the same content.
    // (The views replaced are kept alive: the new ones are elsewhere in memory.)
    let replaced = (state.kubelet.load_full(), state.memory_manager.load_full());
    state.kubelet.store(Arc::new((*replaced.0).clone()));
    let view = (*replaced.1).clone();
    state.memory_manager.store(Arc::new(MemoryManagerView {
        loaded_at: SystemTime::now(),
        ..view.clone()
    }));
    // Past the hub's tick (1 s): heartbeats only, each with the generation of the snapshot.
    let quiet = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < quiet {
        let beat = lines.next(SECOND).await.expect("an event");
        assert_eq!(beat["type"], "BOOKMARK", "{beat}");
        assert_eq!(beat["generation"], generation, "{beat}");
    }

    // The Memory Manager's state becomes unusable: a new state, without what selects.
    state.memory_manager.store(Arc::new(MemoryManagerView {
        unusable: Some("its checkpoint names no NUMA node".to_owned()),
        ..view
    }));
    let changed = lines.next_state(2 * SECOND).await;
    assert_eq!(changed["type"], "MODIFIED", "{changed}");
    assert_eq!(
        changed["object"]["selectionInputs"],
        inputs + 1,
        "{changed}"
    );
    assert!(changed["object"]["kubeletSelection"].is_null(), "{changed}");
    drop(replaced);
}

#[tokio::test]
async fn watchers_beyond_the_limit_are_refused_and_a_watch_ends_after_its_time() {
    let (_d, mut state) = state();
    let limits = WatchLimits {
        max_watchers: 1,
        heartbeat: Duration::from_millis(100),
        max_duration: Duration::from_millis(300),
    };
    state.watch = running_hub(&state, limits);
    let (status, _, mut only) = watch(&state, "watch=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        only.next(SECOND).await.expect("a snapshot")["type"],
        "SNAPSHOT"
    );
    let (status, ctype, _) = watch(&state, "watch=true").await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "application/problem+json")
    );
    let text = scrape(&state, None).await.1;
    assert_eq!(
        sample(&text, "hugepage_agent_watches_refused_total"),
        Some(1.0)
    );
    // Between 300 and 600 ms (jittered) the watch ends; its slot is free again.
    let mut events = 0;
    while only.next(SECOND).await.is_some() {
        events += 1;
        assert!(events < 10, "the watch did not end");
    }
    drop(only);
    let (status, _, _) = watch(&state, "watch=true").await;
    assert_eq!(status, StatusCode::OK);
    // A bad parameter is a problem naming it, and opens no watch.
    let (status, ctype, _) = watch(&state, "watch=maybe").await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::BAD_REQUEST, "application/problem+json")
    );
}
