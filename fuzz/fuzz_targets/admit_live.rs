//! A request that is refused changes nothing, against the agent's live state: the API's real
//! router (`api::router`) called in process (`tower::ServiceExt::oneshot`, no socket), with a
//! real reservation store whose file is in a directory of `/dev/shm` and a fake sysfs tree of
//! two NUMA nodes with 2 MiB pages (as `api/tests.rs` builds it), which already holds one
//! reservation of another pod. The first byte picks the route (`POST /v1/admit` real, dry run
//! or with a query from the input, `POST /v1/hints`, `DELETE /v1/reservations/{id}` of the held
//! reservation or of an id from the input, a `GET`, or any method on a path from the input),
//! the second the content type; a path, query or id from the input is the text up to the first
//! newline, and the body what follows. Asserted:
//! * a refusal (4xx/5xx) is a problem document that names what it refused (the path, the
//!   reservation, the content type, the field, the limit, the held pod's UID and name when a
//!   real admission names that UID under another name) and leaves the store's reservations
//!   and the file's bytes exactly as they were;
//! * an admission that reserved (a real one, allowed, with a pod UID) adds exactly the
//!   reservation its answer names, for its pod, taking the place of that pod's earlier one, and
//!   the file then holds exactly the store's reservations; a deletion removes exactly the one
//!   deleted; any other answer changes nothing.
//!
//! The runtime, the tree, the state and the router are built once (a router per run cost more
//! than the request); a run that changed the store puts the file back and reopens the store
//! from it.
#![no_main]

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use axum::{
    body::Body,
    http::{Method, Request},
};
use http_body_util::BodyExt;
use hugepage_agent::{
    admission::{
        reservations::{self, Reservation, Store},
        verify::{Gate, Mode, OnSysfsError, Settings, Verifier},
    },
    api::{
        AppState, Readiness, admit,
        budget::BodyBudget,
        lane::Lane,
        router,
        server::Limits,
        watch::{Hub, Inputs, WatchLimits},
    },
    consumers::FaultBook,
    host::{NumaNode, PageSize},
    kubeletconfig::{
        live::view,
        settings::{Layer, MemoryManagerPolicy, Source as SettingSource, Sourced},
    },
    memorymanager::live::StateLoader,
    numa::map::{MapWriter, Source},
    psi::monitor::{Monitor, PsiConfig},
    sysfs::HostFs,
    telemetry::metrics::Metrics,
    topologymanager::Policy,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

const HELD_POD: &str = "0000000b-0000-4000-8000-00000000000b";
const HELD_ID: &str = "1700000000000000-1";
const TTL: Duration = Duration::from_secs(30);
const TYPES: [Option<&str>; 4] = [
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("text/plain"),
    None,
];
const GETS: [&str; 8] = [
    "/v1/hugepages",
    "/v1/reservations",
    "/v1/kubelet",
    "/v1/conditions",
    "/v1/events",
    "/v1/discrepancy",
    "/healthz",
    "/readyz",
];
const METHODS: [Method; 4] = [Method::GET, Method::POST, Method::DELETE, Method::PUT];

struct Live {
    runtime: tokio::runtime::Runtime,
    state: AppState,
    router: axum::Router,
    /// The store's directory and its file as it starts.
    store_dir: PathBuf,
    file: PathBuf,
    first: Vec<u8>,
}

fn write(root: &Path, path: &str, content: &str) {
    let full = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(full.parent().expect("a parent")).expect("mkdir");
    fs::write(full, content).expect("write");
}

/// The scratch directory, for its removal at exit.
static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

unsafe extern "C" {
    /// libc's: libFuzzer ends a run with `exit`, which runs these (statics are never dropped).
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn remove_scratch() {
    if let Some(dir) = SCRATCH.get() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A directory of this process under `/dev/shm` (the store fsyncs each write: in memory that
/// costs nothing), removed when the process exits, and those a killed process left removed.
fn scratch() -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    const PREFIX: &str = "hugepage-agent-fuzz-admit-live-";
    for entry in fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix(PREFIX)
            && !Path::new("/proc").join(pid).exists()
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    let dir = base.join(format!("{PREFIX}{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("the scratch directory");
    SCRATCH.get_or_init(|| dir.clone());
    // SAFETY: registers a function that takes and returns nothing; it runs once, at exit.
    let registered = unsafe { atexit(remove_scratch) };
    assert_eq!(registered, 0, "atexit");
    dir
}

/// Two nodes with 2 GiB of free 2 MiB pages each, as `api/tests.rs` has them.
fn tree(root: &Path) {
    write(root, "/sys/devices/system/node/online", "0-1\n");
    for node in 0..2 {
        let n = format!("/sys/devices/system/node/node{node}");
        write(root, &format!("{n}/cpulist"), &format!("{node}\n"));
        let distance = if node == 0 { "10 20\n" } else { "20 10\n" };
        write(root, &format!("{n}/distance"), distance);
        write(
            root,
            &format!("{n}/meminfo"),
            &format!("Node {node} MemTotal:       16777216 kB\nNode {node} MemFree: 1 kB\n"),
        );
        for (file, v) in [
            ("nr_hugepages", "2048\n"),
            ("free_hugepages", "1024\n"),
            ("surplus_hugepages", "0\n"),
        ] {
            write(root, &format!("{n}/hugepages/hugepages-2048kB/{file}"), v);
        }
    }
    for (file, v) in [
        ("nr_hugepages", "4096\n"),
        ("free_hugepages", "2048\n"),
        ("resv_hugepages", "0\n"),
        ("surplus_hugepages", "0\n"),
    ] {
        write(
            root,
            &format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"),
            v,
        );
    }
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let dir = scratch();
        tree(&dir);
        let store_dir = dir.join("state");
        fs::create_dir_all(&store_dir).expect("the state directory");
        let now = SystemTime::now();
        let held = Reservation {
            id: HELD_ID.to_owned(),
            pod_uid: HELD_POD.to_owned(),
            namespace: "batch".to_owned(),
            name: "job-b".to_owned(),
            numa_nodes: vec![NumaNode(0)],
            bytes: BTreeMap::from([(PageSize(2 << 20), 1 << 30)]),
            created_at: now,
            expires_at: now + Duration::from_secs(10 * 365 * 86_400),
        };
        let file = store_dir.join("reservations.json");
        let first = reservations::file_text(&[&held]);
        fs::write(&file, &first).expect("the reservations file");
        let host = HostFs::new(&dir);
        let (writer, map) = MapWriter::new(host.clone(), Source::Sysfs).expect("the map");
        drop(writer);
        let psi_config = PsiConfig {
            memory_threshold: 10.0,
            io_threshold: 25.0,
            interval: Duration::from_secs(5),
        };
        let (_monitor, psi) = Monitor::new(host.clone(), psi_config);
        let flags = Layer {
            policy: Some(Sourced {
                value: Policy::SingleNumaNode,
                source: SettingSource::Flag("--topology-policy"),
            }),
            memory_manager_policy: Some(Sourced {
                value: MemoryManagerPolicy::Static,
                source: SettingSource::Flag("--memory-manager-policy"),
            }),
            ..Layer::default()
        };
        let nodes = hugepage_agent::sysfs::topology::read(&host).expect("the topology");
        let kubelet = view(&[&flags], &nodes, "flags").expect("the kubelet's settings");
        let memory_manager = StateLoader::new(
            host.clone(),
            dir.join("memory_manager_state"),
            Default::default(),
        )
        .load(&map.load())
        .expect("the memory manager's state");
        let (store, warning) = Store::open(&store_dir, TTL).expect("the store");
        assert!(warning.is_none(), "{warning:?}");
        let reservations = Arc::new(Mutex::new(store));
        let memory_manager = Arc::new(ArcSwap::from_pointee(memory_manager));
        let kubelet = Arc::new(ArcSwap::from_pointee(kubelet));
        let metrics = Arc::new(Metrics::new(
            &[PageSize(2 << 20)],
            &[NumaNode(0), NumaNode(1)],
            Arc::default(),
        ));
        // The watch's first state only: this target fuzzes the admission.
        let (watch, _publisher) = Hub::new(
            Inputs {
                map: map.clone(),
                reservations: reservations.clone(),
                kubelet: kubelet.clone(),
                memory_manager: memory_manager.clone(),
                mode: Mode::Kep,
                psi: psi.clone(),
                reject_under_pressure: false,
            },
            WatchLimits::DEFAULT,
            metrics.watch.clone(),
        );
        let state = AppState {
            map,
            verifier: Arc::new(Verifier::new(host.clone()).expect("the verifier")),
            settings: Settings {
                gate: Gate::On,
                mode: Mode::Kep,
                on_sysfs_error: OnSysfsError::Admit,
            },
            readiness: Readiness::default(),
            psi,
            faults: FaultBook::default(),
            reservations,
            host,
            reject_under_pressure: false,
            metrics,
            memory_manager,
            kubelet,
            max_containers: admit::DEFAULT_MAX_CONTAINERS as usize,
            heavy: Lane::start().expect("the heavy lane"),
            bodies: Arc::new(BodyBudget::new(Limits::DEFAULT.body_budget, Arc::default())),
            watch,
            held: Default::default(),
        };
        state.readiness.release("off");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        Live {
            runtime,
            router: router(state.clone()),
            state,
            store_dir,
            file,
            first,
        }
    })
}

/// The store's reservations by id.
fn reservations(live: &Live) -> BTreeMap<String, Reservation> {
    let store = live.state.reservations.lock().expect("the store's lock");
    store
        .list()
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect()
}

/// What the input asks.
struct Ask {
    method: Method,
    uri: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    /// An admission that may reserve; a deletion of this id.
    real_admission: bool,
    deletes: Option<String>,
}

fn ask(data: &[u8]) -> Option<Ask> {
    let (&route, rest) = data.split_first()?;
    let (&kind, rest) = rest.split_first()?;
    let content_type = TYPES[usize::from(kind & 3)];
    let line = |rest: &[u8]| -> (String, Vec<u8>) {
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let text = String::from_utf8_lossy(&rest[..end]).into_owned();
        (text, rest.get(end + 1..).unwrap_or_default().to_vec())
    };
    let post = |uri: String, body: Vec<u8>, real: bool| Ask {
        method: Method::POST,
        uri,
        content_type,
        body,
        real_admission: real,
        deletes: None,
    };
    Some(match route % 8 {
        0 => post("/v1/admit".to_owned(), rest.to_vec(), true),
        1 => post("/v1/admit?dryRun=true".to_owned(), rest.to_vec(), false),
        2 => {
            let (query, body) = line(rest);
            post(format!("/v1/admit?{query}"), body, true)
        }
        3 => post("/v1/hints".to_owned(), rest.to_vec(), false),
        4 | 5 => {
            let (id, body) = if route % 8 == 4 {
                (HELD_ID.to_owned(), rest.to_vec())
            } else {
                line(rest)
            };
            Ask {
                method: Method::DELETE,
                uri: format!("/v1/reservations/{id}"),
                content_type,
                body,
                real_admission: false,
                deletes: Some(id),
            }
        }
        6 => Ask {
            method: Method::GET,
            uri: GETS[usize::from(kind >> 2) % GETS.len()].to_owned(),
            content_type,
            body: rest.to_vec(),
            real_admission: false,
            deletes: None,
        },
        _ => {
            let (path, body) = line(rest);
            Ask {
                method: METHODS[usize::from(kind >> 2) % METHODS.len()].clone(),
                real_admission: false,
                deletes: None,
                uri: path,
                content_type,
                body,
            }
        }
    })
}

/// A refusal names what it refused.
fn check_problem(ask: &Ask, request_path: &str, status: u16, content_type: &str, body: &[u8]) {
    assert_eq!(content_type, "application/problem+json", "a refusal's type");
    let problem: Value = serde_json::from_slice(body).expect("a problem document is JSON");
    assert_eq!(problem["status"], status, "{problem}");
    let detail = problem["detail"].as_str().expect("a detail");
    assert!(!detail.trim().is_empty(), "an empty detail: {problem}");
    assert!(
        problem["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{problem}"
    );
    let field = problem
        .get("field")
        .map(|f| f.as_str().expect("a field is text"));
    match problem["type"].as_str().expect("a type") {
        "not-found" => assert!(detail.contains(request_path), "{problem}: not the path"),
        "no-such-reservation" => assert!(
            detail.starts_with("no reservation \""),
            "{problem}: not the reservation"
        ),
        "unsupported-media-type" => match ask.content_type {
            Some(t) => assert!(detail.contains(&format!("{t:?}")), "{problem}"),
            None => assert!(detail.starts_with("no content type"), "{problem}"),
        },
        "invalid-request" => {
            let field = field.expect("an invalid request names its field");
            // Empty only when the key at fault is the empty one (`{"": …}`).
            let empty_key = ask.body.windows(2).any(|w| w == b"\"\"");
            assert!(!field.is_empty() || empty_key, "an empty field: {problem}");
        }
        "too-many-containers" => {
            assert!(field.is_some(), "{problem}: no field");
            assert!(detail.contains("--max-containers"), "{problem}");
        }
        "body-too-large" => assert!(
            detail.contains(&admit::BODY_LIMIT.to_string()),
            "{problem}: not the limit"
        ),
        "no-kubelet-selection" => assert!(detail.contains("GET /v1/kubelet"), "{problem}"),
        // Only the held pod's UID is reserved: a real admission of it under another name.
        "reservation-conflict" => {
            assert!(ask.real_admission, "{problem}: not a real admission");
            assert!(
                detail.starts_with(&format!(
                    "pod UID {HELD_POD} is reserved for batch/job-b (reservation {HELD_ID})"
                )),
                "{problem}: not the held reservation"
            );
        }
        "body-budget-full" => assert!(detail.contains("--body-budget"), "{problem}"),
        "invalid-json" | "method-not-allowed" | "host-read-failed" | "unavailable" => {}
        other => panic!("a problem of an unknown type {other:?}: {problem}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(ask) = ask(data) else {
        return;
    };
    let mut request = Request::builder().method(ask.method.clone()).uri(&ask.uri);
    if let Some(t) = ask.content_type {
        request = request.header("content-type", t);
    }
    let Ok(request) = request.body(Body::from(ask.body.clone())) else {
        return;
    };
    let request_path = request.uri().path().to_owned();
    let live = live();
    let before = reservations(live);
    let file_before = fs::read(&live.file).expect("the reservations file");
    let (status, content_type, body) = live.runtime.block_on(async {
        let response = live
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("an answer");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response.into_body().collect().await.expect("the body");
        (status, content_type, body.to_bytes().to_vec())
    });
    let after = reservations(live);
    let file_after = fs::read(&live.file).expect("the reservations file");
    let changed = after != before || file_after != file_before;
    if status >= 400 {
        check_problem(&ask, &request_path, status, &content_type, &body);
        assert!(!changed, "refused ({status}) but the reservations changed");
    } else {
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let made = answer["reservation"]["id"]
            .as_str()
            .filter(|_| ask.real_admission);
        let mut expected = before.clone();
        if let Some(id) = made {
            let uid = answer["pod"]["uid"].as_str().expect("the pod's UID");
            assert!(!uid.is_empty(), "a reservation for no pod");
            expected.retain(|_, r| r.pod_uid != uid);
            let new = after.get(id).expect("the reservation the answer names");
            assert_eq!(new.pod_uid, uid, "the reservation is another pod's");
            expected.insert(id.to_owned(), new.clone());
        } else if let Some(id) = &ask.deletes {
            let removed = expected
                .remove(id.as_str())
                .expect("a deleted reservation that was there");
            assert_eq!(answer["id"], removed.id.as_str(), "{answer}");
        }
        assert_eq!(after, expected, "{status} {answer}");
        // The file keeps times to the millisecond: compared as written.
        let in_file = reservations::parse(&file_after).expect("the store's file loads");
        let written = |list: Vec<&Reservation>| serde_json::to_value(list).expect("JSON");
        assert_eq!(
            written(in_file.iter().collect()),
            written(after.values().collect()),
            "the file and the store differ"
        );
        if !changed {
            assert_eq!(file_after, file_before);
        }
    }
    if changed {
        fs::write(&live.file, &live.first).expect("putting the file back");
        let (store, _) = Store::open(&live.store_dir, TTL).expect("the store, reopened");
        *live.state.reservations.lock().expect("the store's lock") = store;
    }
});
