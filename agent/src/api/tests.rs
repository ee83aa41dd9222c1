//! The API's routes called in process (`tower::ServiceExt::oneshot`, no socket) over a fake
//! sysfs tree and a real reservation store in a temporary directory: each route's answer, its
//! problem documents, and what it changed in the store and its file.

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::{
    admission::{
        reservations::Store,
        verify::{Gate, Mode, OnSysfsError},
    },
    kubeletconfig::{
        live::{KubeletView, view},
        settings::{self, Layer, MemoryManagerPolicy, Sourced},
    },
    numa::map::{MapWriter, Source},
    psi::monitor::{Monitor, PsiConfig},
    sysfs::{HostFs, fake},
    telemetry::connections::Cut,
};

/// Pod UIDs as the API server writes them (RFC 4122 text).
const POD_1: &str = "00000000-0000-4000-8000-000000000001";
const POD_2: &str = "00000000-0000-4000-8000-000000000002";
const POD_B: &str = "0000000b-0000-4000-8000-00000000000b";
const POD_C: &str = "0000000c-0000-4000-8000-00000000000c";

/// The kubelet's settings with these two policies set by flags, on `host`'s NUMA nodes.
fn kubelet_view(
    host: &HostFs,
    policy: crate::topologymanager::Policy,
    memory_manager: MemoryManagerPolicy,
) -> KubeletView {
    let flags = Layer {
        policy: Some(Sourced {
            value: policy,
            source: settings::Source::Flag("--topology-policy"),
        }),
        memory_manager_policy: Some(Sourced {
            value: memory_manager,
            source: settings::Source::Flag("--memory-manager-policy"),
        }),
        ..Layer::default()
    };
    let nodes = crate::sysfs::topology::read(host).expect("topology");
    view(&[&flags], &nodes, "flags").expect("kubelet settings")
}

/// Two nodes with 2 GiB of free 2 MiB pages each (Story 2 after Job C took 4 of 8 GiB).
fn state() -> (tempfile::TempDir, AppState) {
    let (dir, state, _writer) = state_and_map_writer();
    (dir, state)
}

/// [`state`], and the writer of its map.
fn state_and_map_writer() -> (tempfile::TempDir, AppState, MapWriter) {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |path: &str, value: &str| fake::write(dir.path(), path, value);
    w("/sys/devices/system/node/online", "0-1\n");
    for node in 0..2 {
        let n = format!("/sys/devices/system/node/node{node}");
        w(
            &format!("{n}/cpulist"),
            if node == 0 { "0\n" } else { "1\n" },
        );
        w(
            &format!("{n}/distance"),
            if node == 0 { "10 20\n" } else { "20 10\n" },
        );
        w(
            &format!("{n}/meminfo"),
            &format!("Node {node} MemTotal:       16777216 kB\nNode {node} MemFree: 1 kB\n"),
        );
        for (file, v) in [
            ("nr_hugepages", "2048\n"),
            ("free_hugepages", "1024\n"),
            ("surplus_hugepages", "0\n"),
        ] {
            w(&format!("{n}/hugepages/hugepages-2048kB/{file}"), v);
        }
    }
    for (file, v) in [
        ("nr_hugepages", "4096\n"),
        ("free_hugepages", "2048\n"),
        ("resv_hugepages", "0\n"),
        ("surplus_hugepages", "0\n"),
    ] {
        w(
            &format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"),
            v,
        );
    }
    let host = HostFs::new(dir.path());
    let (writer, map) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
    let (_monitor, psi) = Monitor::new(host.clone(), PSI);
    let verifier = Arc::new(Verifier::new(host.clone()).expect("verifier"));
    let kubelet = kubelet_view(
        &host,
        crate::topologymanager::Policy::SingleNumaNode,
        MemoryManagerPolicy::Static,
    );
    let view = loader(&host, dir.path().join("memory_manager_state"))
        .load(&map.load())
        .expect("memory manager state");
    let metrics = Arc::new(crate::telemetry::metrics::Metrics::new(
        &[PageSize(2 << 20)],
        &[crate::host::NumaNode(0), crate::host::NumaNode(1)],
        Arc::default(),
    ));
    let reservations = Arc::new(std::sync::Mutex::new(
        Store::open(
            &dir.path().join("state"),
            std::time::Duration::from_secs(30),
        )
        .expect("store")
        .0,
    ));
    let memory_manager = Arc::new(ArcSwap::from_pointee(view));
    let kubelet = Arc::new(ArcSwap::from_pointee(kubelet));
    // The hub's first state only: tests of the watch run its publisher themselves.
    let (watch, _publisher) = super::watch::Hub::new(
        super::watch::Inputs {
            map: map.clone(),
            reservations: reservations.clone(),
            kubelet: kubelet.clone(),
            memory_manager: memory_manager.clone(),
            mode: Mode::Kep,
            psi: psi.clone(),
            reject_under_pressure: false,
        },
        super::watch::WatchLimits::DEFAULT,
        metrics.watch.clone(),
    );
    let state = AppState {
        map,
        verifier,
        settings: Settings {
            gate: Gate::On,
            mode: Mode::Kep,
            on_sysfs_error: OnSysfsError::Admit,
        },
        readiness: Readiness::default(),
        psi,
        reject_under_pressure: false,
        faults: crate::consumers::FaultBook::default(),
        reservations,
        host,
        memory_manager,
        kubelet,
        bodies: Arc::new(super::budget::BodyBudget::new(
            crate::api::server::Limits::DEFAULT.body_budget,
            metrics.api_connections.clone(),
        )),
        max_containers: admit::DEFAULT_MAX_CONTAINERS as usize,
        heavy: lane::Lane::start().expect("the heavy lane"),
        watch,
        metrics,
        held: Default::default(),
    };
    (dir, state, writer)
}

fn loader(
    host: &HostFs,
    checkpoint: std::path::PathBuf,
) -> crate::memorymanager::live::StateLoader {
    crate::memorymanager::live::StateLoader::new(host.clone(), checkpoint, Default::default())
}

const PSI: PsiConfig = PsiConfig {
    memory_threshold: 10.0,
    io_threshold: 25.0,
    interval: std::time::Duration::from_secs(5),
};

/// Writes `memory` as the system memory pressure file and evaluates it into `state`.
fn with_memory_pressure(dir: &tempfile::TempDir, state: &mut AppState, memory: &str) {
    let quiet = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    fake::write(dir.path(), "/proc/pressure/memory", memory);
    fake::write(dir.path(), "/proc/pressure/io", quiet);
    fake::write(dir.path(), "/proc/pressure/cpu", quiet);
    let (mut monitor, psi) = Monitor::new(HostFs::new(dir.path()), PSI);
    monitor.evaluate(std::time::SystemTime::now());
    state.psi = psi;
}

/// The router's answer to one request: its status, content type and body, unread.
async fn respond(
    state: &AppState,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: impl Into<Body>,
) -> (StatusCode, String, Body) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = content_type {
        req = req.header("content-type", t);
    }
    let response = router(state.clone())
        .oneshot(req.body(body.into()).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let ctype = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, ctype, response.into_body())
}

async fn send(
    state: &AppState,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: impl Into<Body>,
) -> (StatusCode, String, Value) {
    let (status, ctype, body) = respond(state, method, uri, content_type, body).await;
    let bytes = body.collect().await.expect("body").to_bytes();
    (
        status,
        ctype,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn admit(state: &AppState, body: Value) -> (StatusCode, String, Value) {
    post(state, "/v1/admit", &body).await
}

/// `POST` of a JSON `body` to `path`.
async fn post(state: &AppState, path: &str, body: &Value) -> (StatusCode, String, Value) {
    send(
        state,
        "POST",
        path,
        Some("application/json"),
        body.to_string(),
    )
    .await
}

fn short(hugepages: &str, nodes: Option<Value>) -> Value {
    let mut body = json!({
        "pod": {"namespace": "batch", "name": "job-b", "uid": POD_1, "qosClass": "Guaranteed"},
        "containers": [{"name": "main", "resources": {"hugepages-2Mi": hugepages, "memory": "1Gi"}}],
    });
    if let Some(n) = nodes {
        body["numaNodes"] = n;
    }
    body
}

#[tokio::test]
async fn story_2_is_rejected_with_the_kep_message() {
    let (_d, state) = state();
    let (status, _, answer) = admit(&state, short("6Gi", Some(json!([0, 1])))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["allowed"], false);
    assert_eq!(answer["reason"], "FailedHugepagesVerification");
    assert_eq!(
        answer["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 6Gi, available 4Gi"
    );
    assert_eq!(answer["checks"][0]["requestedBytes"], 6u64 << 30);
    assert_eq!(answer["checks"][0]["availableBytes"], 4u64 << 30);
    assert_eq!(answer["pod"]["name"], "job-b");
}

#[tokio::test]
async fn without_nodes_the_kubelets_selection_picks_them_and_the_os_is_checked_there() {
    let (_d, state) = state();
    // The Memory Manager (state from sysfs: 4Gi of 2Mi pages per node) puts 3Gi on node 0 under
    // single-numa-node; the kernel has 2Gi free there: KEP-5759 rejects on node 0 only.
    let (_, _, answer) = admit(&state, short("3Gi", None)).await;
    assert_eq!(answer["allowed"], false);
    assert_eq!(
        answer["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 3Gi, available 2Gi"
    );
    assert_eq!(
        answer["selection"]["placements"][0]["allocated"],
        json!([0])
    );
    assert_eq!(
        answer["selection"]["placements"][0]["merged"],
        json!({"numaNodes": [0], "preferred": true, "admit": true})
    );
    // 2Gi fits node 0.
    let (_, _, answer) = admit(&state, short("2Gi", None)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["numaNodes"], json!([0]));
    // A Burstable pod gets no hints: any node may serve it, so all are checked (2Gi of the 4Gi
    // free are held for the pod just admitted).
    let mut burstable = short("2Gi", None);
    burstable["pod"]["qosClass"] = json!("Burstable");
    burstable["pod"]["uid"] = json!(POD_2);
    let (_, _, answer) = admit(&state, burstable).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["numaNodes"], json!([0, 1]));
    assert!(answer.get("message").is_none());
    // A request the policy cannot place is the kubelet's TopologyAffinityError.
    let (_, _, answer) = admit(&state, short("6Gi", None)).await;
    assert_eq!(answer["allowed"], false);
    assert_eq!(answer["reason"], "TopologyAffinityError");
    assert_eq!(
        answer["message"],
        "Resources cannot be allocated with Topology locality"
    );
}

#[tokio::test]
async fn under_memory_manager_policy_none_a_guaranteed_pod_is_verified_on_every_node() {
    let (_d, state) = state();
    let none = kubelet_view(
        &state.host,
        crate::topologymanager::Policy::SingleNumaNode,
        MemoryManagerPolicy::None,
    );
    state.kubelet.store(Arc::new(none));
    // 3Gi fits nowhere under single-numa-node with the static policy; under None the kubelet
    // pins nothing and the 4Gi free on both nodes together serve it.
    let (_, _, answer) = admit(&state, short("3Gi", None)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["numaNodes"], json!([0, 1]));
    assert_eq!(answer["selection"]["basis"], "node-wide", "{answer}");
    assert!(
        answer["selection"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("Memory Manager policy is None")),
        "{answer}"
    );
    assert_eq!(answer["selection"]["placements"], json!([]));
    let (_, _, hints) = post(&state, "/v1/hints", &short("3Gi", None)).await;
    assert_eq!(hints["hints"], Value::Null, "{hints}");
    assert_eq!(hints["selection"]["basis"], "node-wide");
}

#[tokio::test]
async fn the_kubelet_settings_in_use_are_served_with_their_sources_and_as_a_metric() {
    let (_d, state) = state();
    let (status, _, answer) = send(&state, "GET", "/v1/kubelet", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["origin"], "flags");
    let policy = &answer["settings"]["topologyManagerPolicy"];
    assert_eq!(policy["value"], "single-numa-node");
    assert_eq!(policy["source"], "flag --topology-policy");
    let scope = &answer["settings"]["topologyManagerScope"];
    assert_eq!(
        (scope["value"].as_str(), scope["source"].as_str()),
        (Some("container"), Some("kubelet default"))
    );
    let gate = &answer["settings"]["featureGates.MemoryManagerHugepagesVerification"];
    assert_eq!(gate["value"], "true");
    assert!(
        gate["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("agent default")),
        "{gate}"
    );
    let response = router(state.clone())
        .oneshot(
            Request::builder()
                .uri("/metrics")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.lines().any(|l| l
            == "hugepage_agent_kubelet_setting_info{setting=\"memoryManagerPolicy\",value=\"Static\",source=\"flag --memory-manager-policy\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn hints_for_a_request_on_the_live_state() {
    let (_d, state) = state();
    let (status, _, answer) = post(&state, "/v1/hints", &short("3Gi", None)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let single = |n: u64| json!({"numaNodes": [n], "preferred": true});
    let both = json!({"numaNodes": [0, 1], "preferred": false});
    let expected = json!([single(0), single(1), both]);
    assert_eq!(answer["hints"]["hugepages-2Mi"], expected);
    assert_eq!(answer["hints"]["memory"], expected);
    assert_eq!(answer["containers"][0]["name"], "main");
    assert_eq!(answer["source"], "sysfs");
    assert_eq!(answer["selection"]["admit"], true);
}

#[tokio::test]
async fn discrepancy_needs_a_checkpoint_and_then_compares_it_with_the_kernel() {
    let (dir, state) = state();
    let (_, _, answer) = send(&state, "GET", "/v1/discrepancy", None, String::new()).await;
    assert_eq!(answer["nodes"], json!([]));
    assert!(
        answer["note"]
            .as_str()
            .unwrap()
            .contains("no usable kubelet Memory Manager checkpoint")
    );
    // The kubelet believes all 4Gi of node 0 are free; the kernel has 2Gi.
    let table = |free: u64| json!({"total": 4u64 << 30, "systemReserved": 0, "allocatable": 4u64 << 30, "reserved": (4u64 << 30) - free, "free": free});
    let checkpoint = json!({"policyName": "Static", "machineState": {
        "0": {"numberOfAssignments": 0, "memoryMap": {"hugepages-2Mi": table(4 << 30)}, "cells": [0]},
        "1": {"numberOfAssignments": 0, "memoryMap": {"hugepages-2Mi": table(2 << 30)}, "cells": [1]}
    }});
    let path = dir.path().join("memory_manager_state");
    std::fs::write(&path, checkpoint.to_string()).expect("checkpoint");
    let view = loader(&state.host, path)
        .load(&state.map.load())
        .expect("load");
    state.memory_manager.store(Arc::new(view));
    let (_, _, answer) = send(&state, "GET", "/v1/discrepancy", None, String::new()).await;
    assert_eq!(answer["source"], "checkpoint");
    assert_eq!(
        answer["machineState"]["0"]["memoryMap"]["hugepages-2Mi"]["free"],
        4u64 << 30
    );
    assert_eq!(answer["machineState"]["1"]["cells"], json!([1]));
    assert_eq!(answer["nodes"][0]["discrepancyBytes"], 2u64 << 30);
    assert_eq!(answer["nodes"][1]["discrepancyBytes"], 0);
    assert!(
        answer["nodes"][0]["explanation"]
            .as_str()
            .unwrap()
            .starts_with("the Memory Manager believes 2Gi more is free than the kernel has"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_whole_pod_is_read_by_the_kubelet_rules() {
    let (_d, state) = state();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "net", "name": "dpdk", "uid": POD_2},
        "spec": {
            "initContainers": [{"name": "init", "resources": {"limits": {"hugepages-2Mi": "5Gi"}}}],
            "containers": [{"name": "app", "image": "x", "resources": {"limits": {"hugepages-2Mi": "1Gi", "cpu": "2"}}}]
        },
        "status": {"qosClass": "Guaranteed"}
    });
    let (status, _, answer) = admit(&state, pod).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 5Gi, available 4Gi"
    );
    assert_eq!(answer["pod"]["qosClass"], "Guaranteed");
}

#[tokio::test]
async fn bad_input_is_problem_json_naming_the_field_and_changes_nothing() {
    let (_d, state) = state();
    let before = state.map.load().generation;
    let cases = [
        (short("1G", None), "containers[0].resources.hugepages-2Mi"),
        (short("2Gi", Some(json!([0, 9]))), "numaNodes"),
        (short("2Gi", Some(json!([]))), "numaNodes"),
        (short("2Gi", Some(json!("all"))), "numaNodes"),
        (
            json!({"containers": [], "topologyPolicy": "closest"}),
            "topologyPolicy",
        ),
        (json!({"containers": [], "scope": "node"}), "scope"),
        (json!({"containers": [], "extra": 1}), "."),
        (
            json!({"spec": {"containers": [{"resources": {"requests": {"hugepages-2Mi": "2Gi"}}}]}}),
            "spec.containers[0].resources.requests.hugepages-2Mi",
        ),
    ];
    for (body, field) in cases {
        let (status, ctype, problem) = admit(&state, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(ctype, "application/problem+json");
        assert_eq!(problem["status"], 400);
        assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
        if field != "." {
            assert_eq!(problem["field"], field, "{body}: {problem}");
        }
    }
    assert_eq!(state.map.load().generation, before);
    assert_eq!(state.verifier.sysfs_errors(), 0);
}

#[tokio::test]
async fn the_api_takes_resource_names_as_check_does_memory_placed_others_ignored_bad_names_refused()
{
    let (_d, state) = state();
    let mut body = short("2Gi", None);
    body["containers"][0]["resources"]["cpu"] = json!("500m");
    body["containers"][0]["resources"]["example.com/nic"] = json!("1");
    let (status, _, answer) = admit(&state, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["allowed"], true, "{answer}");
    let memory = &answer["selection"]["placements"][0]["hints"]["memory"];
    assert!(memory.is_array(), "memory is placed: {answer}");
    let mut bad = short("2Gi", None);
    bad["containers"][0]["resources"]["bad name"] = json!("1");
    let (status, _, problem) = admit(&state, bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "containers[0].resources.bad name");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"bad name\" is not a resource name")),
        "{problem}"
    );
}

#[tokio::test]
async fn transport_errors_are_400_413_415() {
    let (_d, state) = state();
    let (status, ctype, problem) = send(
        &state,
        "POST",
        "/v1/admit",
        Some("application/json"),
        "{not json",
    )
    .await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::BAD_REQUEST, "application/problem+json")
    );
    assert_eq!(problem["type"], "invalid-json");
    let (status, _, problem) = send(
        &state,
        "POST",
        "/v1/admit",
        Some("text/plain"),
        short("2Gi", None).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("text/plain"))
    );
    let (status, _, _) = send(
        &state,
        "POST",
        "/v1/admit",
        None,
        short("2Gi", None).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = format!(
        "{{\"containers\":[],\"pad\":\"{}\"}}",
        "x".repeat(admit::BODY_LIMIT)
    );
    let (status, _, problem) =
        send(&state, "POST", "/v1/admit", Some("application/json"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{problem}");
    let (status, _, _) = send(
        &state,
        "POST",
        "/v1/admit",
        Some("application/json; charset=utf-8"),
        short("2Gi", None).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn hugepages_health_readiness_and_unknown_paths() {
    let (_d, state) = state();
    let (status, _, map) = send(&state, "GET", "/v1/hugepages", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(map["nodes"][1]["sizes"][0]["free"], 1024);
    assert_eq!(map["source"], "sysfs");
    assert_eq!(
        send(&state, "GET", "/healthz", None, Body::empty()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&state, "GET", "/readyz", None, Body::empty()).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    state.readiness.release("off (--ebpf off)");
    let (status, _, ready) = send(&state, "GET", "/readyz", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ready["probes"], "off (--ebpf off)");
    let (status, ctype, _) = send(&state, "GET", "/v2/nothing", None, Body::empty()).await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::NOT_FOUND, "application/problem+json")
    );
    let (status, ctype, _) = send(&state, "GET", "/v1/admit", None, Body::empty()).await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, "application/problem+json")
    );
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let (_d, state) = state();
    let (status, _, doc) = send(&state, "GET", "/openapi.json", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/v1/admit",
        "/v1/hints",
        "/v1/discrepancy",
        "/v1/kubelet",
        "/v1/hugepages",
        "/v1/consumers",
        "/v1/reservations",
        "/v1/conditions",
        "/v1/events",
        "/metrics",
        "/healthz",
        "/readyz",
        "/openapi.json",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
    for code in ["200", "400", "413", "415"] {
        assert!(
            doc["paths"]["/v1/admit"]["post"]["responses"]
                .get(code)
                .is_some(),
            "{code}"
        );
    }
}

#[tokio::test]
async fn conditions_and_events_are_served_in_node_condition_shape() {
    let (dir, mut state) = state();
    with_memory_pressure(
        &dir,
        &mut state,
        "some avg10=35.00 avg60=20.00 avg300=4.00 total=123\nfull avg10=1.00 avg60=1.00 avg300=0.00 total=9\n",
    );
    let (status, _, body) = send(&state, "GET", "/v1/conditions", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let c = &body["conditions"][0];
    assert_eq!(
        (&c["type"], &c["status"]),
        (&json!("SystemMemoryContentionPressure"), &json!("True"))
    );
    assert_eq!(c["reason"], "HighMemoryContentionPressure");
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("avg10=35.00% avg60=20.00%")),
        "{c}"
    );
    assert!(
        c["lastTransitionTime"].is_string() && c["lastHeartbeatTime"].is_string(),
        "{c}"
    );
    let kubepods = &body["scopes"]["kubepods"];
    assert!(
        kubepods["unavailable"].is_string(),
        "the fake host has no cgroup v2: {kubepods}"
    );
    let (_, _, events) = send(&state, "GET", "/v1/events", None, "").await;
    let reasons: Vec<&str> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(&"NodeHasSystemMemoryContentionPressure"),
        "{events}"
    );
}

#[tokio::test]
async fn reject_under_pressure_refuses_hugepage_pods_only_while_memory_is_true() {
    let (dir, mut state) = state();
    state.reject_under_pressure = true;
    let high = "some avg10=35.00 avg60=20.00 avg300=4.00 total=123\n";
    with_memory_pressure(&dir, &mut state, high);
    let (_, _, answer) = admit(&state, short("2Mi", Some(json!([0])))).await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["reason"], "NodeUnderMemoryContentionPressure");
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("SystemMemoryContentionPressure is True")),
        "{answer}"
    );
    assert_eq!(
        answer["checks"][0]["ok"], true,
        "the kernel had the pages: {answer}"
    );

    with_memory_pressure(
        &dir,
        &mut state,
        "some avg10=1.00 avg60=2.00 avg300=4.00 total=124\n",
    );
    let (_, _, answer) = admit(&state, short("2Mi", Some(json!([0])))).await;
    assert_eq!(answer["allowed"], true, "{answer}");

    state.reject_under_pressure = false;
    with_memory_pressure(&dir, &mut state, high);
    let (_, _, answer) = admit(&state, short("2Mi", Some(json!([0])))).await;
    assert_eq!(
        answer["allowed"], true,
        "without the option pressure does not refuse: {answer}"
    );
}

fn with_uid(mut body: Value, uid: &str) -> Value {
    body["pod"]["uid"] = json!(uid);
    body
}

#[tokio::test]
async fn story_2_an_admitted_pod_reserves_and_the_next_sees_less_until_it_is_deleted() {
    let (_d, state) = state();
    // 4 GiB free on nodes 0 and 1. B takes 3 GiB: admitted, reserved.
    let (_, _, b) = admit(&state, with_uid(short("3Gi", Some(json!([0, 1]))), POD_B)).await;
    assert_eq!(b["allowed"], true, "{b}");
    let id = b["reservation"]["id"]
        .as_str()
        .expect("a reservation")
        .to_owned();
    assert!(b["reservation"]["expiresAt"].is_string(), "{b}");
    // C asks 2 GiB: the kernel still has 4 free, but 3 are B's.
    let (_, _, c) = admit(&state, with_uid(short("2Gi", Some(json!([0, 1]))), POD_C)).await;
    assert_eq!(c["allowed"], false, "{c}");
    assert_eq!(
        c["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 2Gi, available 1Gi"
    );
    assert_eq!(c["checks"][0]["reservedByAgentBytes"], 3u64 << 30);
    assert!(
        c.get("reservation").is_none(),
        "a rejection reserves nothing: {c}"
    );
    let (_, _, listed) = send(&state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(
        listed["reservations"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    assert_eq!(listed["reservations"][0]["podUid"], POD_B);
    let (_, _, map) = send(&state, "GET", "/v1/hugepages", None, "").await;
    for node in 0..2 {
        assert_eq!(
            map["nodes"][node]["sizes"][0]["reservedByAgent"],
            3u64 << 30,
            "B's reservation may draw on either node: {map}"
        );
    }

    let path = format!("/v1/reservations/{id}");
    let (status, _, removed) = send(&state, "DELETE", &path, None, "").await;
    assert_eq!((status, &removed["id"]), (StatusCode::OK, &json!(id)));
    let (status, ctype, problem) = send(&state, "DELETE", &path, None, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(ctype, "application/problem+json");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no reservation")),
        "{problem}"
    );
    let (_, _, c) = admit(&state, with_uid(short("2Gi", Some(json!([0, 1]))), POD_C)).await;
    assert_eq!(c["allowed"], true, "{c}");
}

/// Found by the `admit_live` fuzz target: an id that is not UTF-8 once percent-decoded was
/// refused by axum's extractor in plain text, not as a problem document.
#[tokio::test]
async fn deleting_an_id_that_is_not_utf8_is_a_404_problem_naming_it() {
    let (_dir, state) = state();
    let (status, ctype, problem) =
        send(&state, "DELETE", "/v1/reservations/ab%ff%fe", None, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(ctype, "application/problem+json");
    assert_eq!(problem["type"], "no-such-reservation", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("no reservation \"ab%ff%fe\"")),
        "{problem}"
    );
}

#[tokio::test]
async fn a_reservation_is_in_the_file_when_the_admission_is_answered() {
    let (dir, state) = state();
    let (_, _, b) = admit(&state, with_uid(short("3Gi", Some(json!([0, 1]))), POD_B)).await;
    assert_eq!(b["allowed"], true, "{b}");
    let (on_disk, _) = Store::open(
        &dir.path().join("state"),
        std::time::Duration::from_secs(30),
    )
    .expect("the file reads back");
    let ids: Vec<String> = on_disk.list().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, [b["reservation"]["id"].as_str().unwrap_or("-")]);
}

#[tokio::test]
async fn an_admission_whose_reservation_cannot_be_written_fails_and_holds_nothing() {
    let (dir, state) = state();
    std::fs::remove_dir_all(dir.path().join("state")).expect("the state directory goes away");
    let (status, ctype, problem) =
        admit(&state, with_uid(short("3Gi", Some(json!([0, 1]))), POD_B)).await;
    assert_eq!(
        (status, ctype.as_str()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/problem+json"
        )
    );
    assert_eq!(problem["type"], "state-write-failed", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("the reservation could not be saved")
                && d.contains("reservations.json")),
        "{problem}"
    );
    let (_, _, listed) = send(&state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(listed["reservations"], json!([]), "taken back");
    // Nothing is held: with the directory back, another pod gets all 4 GiB.
    std::fs::create_dir_all(dir.path().join("state")).expect("mkdir");
    let (_, _, c) = admit(&state, with_uid(short("4Gi", Some(json!([0, 1]))), POD_C)).await;
    assert_eq!(c["allowed"], true, "{c}");
    let (_, exposition) = scrape(&state, None).await;
    assert_eq!(
        sample(
            &exposition,
            r#"hugepage_agent_admissions_total{result="admitted"}"#
        ),
        Some(1.0),
        "the failed admission is not counted as admitted"
    );
}

#[tokio::test]
async fn the_memory_of_a_pod_the_memory_manager_does_not_manage_is_not_read() {
    let (_d, state) = state();
    // 1.5 bytes of memory: the kubelet refuses it for a Guaranteed pod's allocation, and never
    // reads it for a Burstable one.
    let mut body = short("2Gi", None);
    body["containers"][0]["resources"]["memory"] = json!("1500m");
    body["pod"]["qosClass"] = json!("Burstable");
    let (status, _, answer) = admit(&state, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["allowed"], true, "{answer}");
    body["pod"]["qosClass"] = json!("Guaranteed");
    let (status, _, problem) = admit(&state, body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("whole number of bytes")),
        "{problem}"
    );
}

#[tokio::test]
async fn a_request_without_a_pod_uid_reserves_nothing() {
    let (_d, state) = state();
    let (_, _, answer) = admit(&state, with_uid(short("2Gi", Some(json!([0]))), "")).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(answer.get("reservation").is_none(), "{answer}");
}

/// Every series the metrics show of admissions, verifications and reservations.
fn admission_series(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            l.starts_with("memory_manager_hugepages_verification")
                || l.starts_with("hugepage_agent_admissions_total")
                || l.starts_with("hugepage_agent_reservation")
                || l.starts_with("hugepage_agent_reserved_by_agent_bytes")
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_dry_run_verifies_and_selects_but_reserves_writes_and_counts_nothing() {
    let (dir, state) = state();
    let (_, before) = scrape(&state, None).await;
    // Admitted by the kernel, with a pod UID: a real admission would reserve.
    let (status, _, fit) = post(
        &state,
        "/v1/admit?dryRun=true",
        &with_uid(short("2Gi", None), POD_B),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{fit}");
    assert_eq!(
        (&fit["allowed"], &fit["dryRun"]),
        (&json!(true), &json!(true)),
        "{fit}"
    );
    assert_eq!(
        fit["numaNodes"],
        json!([0]),
        "selected as the kubelet would: {fit}"
    );
    assert!(fit["selection"].is_object(), "{fit}");
    assert!(fit.get("reservation").is_none(), "{fit}");
    // Refused: the KEP message, as a real admission gets it.
    let (_, _, misfit) = post(
        &state,
        "/v1/admit?dryRun=true",
        &short("6Gi", Some(json!([0, 1]))),
    )
    .await;
    assert_eq!(misfit["allowed"], false, "{misfit}");
    assert_eq!(
        misfit["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 6Gi, available 4Gi"
    );
    let (_, _, listed) = send(&state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(listed["reservations"], json!([]), "nothing reserved");
    assert!(
        !dir.path().join("state/reservations.json").exists(),
        "nothing written"
    );
    let (_, after) = scrape(&state, None).await;
    assert_eq!(
        admission_series(&after),
        admission_series(&before),
        "nothing counted"
    );
    // The same request for real reserves: the dry run was the only difference.
    let (_, _, real) = admit(&state, with_uid(short("2Gi", None), POD_B)).await;
    assert!(real["reservation"]["id"].is_string(), "{real}");
    assert!(real.get("dryRun").is_none(), "{real}");
}

#[tokio::test]
async fn a_dry_run_sees_other_pods_reservations_and_leaves_its_own_in_place() {
    let (_d, state) = state();
    let (_, _, b) = admit(&state, with_uid(short("3Gi", Some(json!([0, 1]))), POD_B)).await;
    let id = b["reservation"]["id"].clone();
    let (_, _, c) = post(
        &state,
        "/v1/admit?dryRun=true",
        &with_uid(short("2Gi", Some(json!([0, 1]))), POD_C),
    )
    .await;
    assert_eq!(c["allowed"], false, "{c}");
    assert_eq!(
        c["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 2Gi, available 1Gi"
    );
    // B asks again as a dry run: its own reservation is not subtracted, nor replaced.
    let (_, _, again) = post(
        &state,
        "/v1/admit?dryRun=true&other=1",
        &with_uid(short("3Gi", Some(json!([0, 1]))), POD_B),
    )
    .await;
    assert_eq!(again["allowed"], true, "{again}");
    let (_, _, listed) = send(&state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(listed["reservations"][0]["id"], id, "{listed}");
    assert_eq!(listed["reservations"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn dry_run_is_true_or_false_and_false_is_a_real_admission() {
    let (_d, state) = state();
    for bad in ["1", "yes", "", "TRUE"] {
        let (status, ctype, problem) = post(
            &state,
            &format!("/v1/admit?dryRun={bad}"),
            &with_uid(short("1Gi", Some(json!([0]))), POD_B),
        )
        .await;
        assert_eq!(
            (status, ctype.as_str(), &problem["field"]),
            (
                StatusCode::BAD_REQUEST,
                "application/problem+json",
                &json!("dryRun")
            ),
            "{bad:?}: {problem}"
        );
    }
    let (_, _, listed) = send(&state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(
        listed["reservations"],
        json!([]),
        "a refused request does nothing"
    );
    let (_, _, real) = post(
        &state,
        "/v1/admit?dryRun=false",
        &with_uid(short("1Gi", Some(json!([0]))), POD_B),
    )
    .await;
    assert!(real["reservation"]["id"].is_string(), "{real}");
}

/// The value of the sample `series` (name and labels exactly as written) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(state: &AppState, accept: Option<&str>) -> (String, String) {
    let mut req = Request::builder().uri("/metrics");
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let response = router(state.clone())
        .oneshot(req.body(Body::empty()).expect("request"))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let ctype = response.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (ctype, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

#[tokio::test]
async fn metrics_count_verifications_rejections_per_node_and_show_the_pools() {
    let (_d, state) = state();
    let (_, before) = scrape(&state, None).await;
    assert_eq!(
        sample(
            &before,
            r#"memory_manager_hugepages_verification_failures_total{hugepage_size="2Mi",numa_node="1"}"#
        ),
        Some(0.0),
        "every series exists from the start:\n{before}"
    );
    admit(&state, short("6Gi", Some(json!([0, 1])))).await;
    admit(&state, with_uid(short("1Gi", Some(json!([1]))), POD_2)).await;
    let (ctype, text) = scrape(&state, None).await;
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    for (series, value) in [
        (
            r#"memory_manager_hugepages_verification_total{result="failure",hugepage_size="2Mi"}"#,
            1.0,
        ),
        (
            r#"memory_manager_hugepages_verification_total{result="success",hugepage_size="2Mi"}"#,
            1.0,
        ),
        (
            r#"memory_manager_hugepages_verification_failures_total{hugepage_size="2Mi",numa_node="0"}"#,
            1.0,
        ),
        (
            r#"memory_manager_hugepages_verification_failures_total{hugepage_size="2Mi",numa_node="1"}"#,
            1.0,
        ),
        (
            "memory_manager_hugepages_verification_latency_seconds_count",
            2.0,
        ),
        (
            r#"hugepage_agent_admissions_total{result="rejected",reason="FailedHugepagesVerification"}"#,
            1.0,
        ),
        (r#"hugepage_agent_admissions_total{result="admitted"}"#, 1.0),
        ("hugepage_agent_reservations_made_total", 1.0),
        ("hugepage_agent_reservations", 1.0),
        (
            r#"hugepage_agent_reserved_by_agent_bytes{numa_node="1",hugepage_size="2Mi"}"#,
            1073741824.0,
        ),
        (
            r#"hugepage_agent_reserved_by_agent_bytes{numa_node="0",hugepage_size="2Mi"}"#,
            0.0,
        ),
        (
            r#"hugepage_agent_hugepages_pool_pages{numa_node="0",hugepage_size="2Mi"}"#,
            2048.0,
        ),
        (
            r#"hugepage_agent_hugepages_free_pages{numa_node="1",hugepage_size="2Mi"}"#,
            1024.0,
        ),
        ("hugepage_agent_probes_attached", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    let (ctype, open) = scrape(&state, Some("application/openmetrics-text; version=1.0.0")).await;
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(open.ends_with("# EOF\n"));
    assert!(open.contains("# TYPE memory_manager_hugepages_verification counter\n"));
}

mod bodies;
mod watch;

/// `n` containers named `c-0`…, each with `resources`: the short form's list, or a `v1.Pod`'s
/// requirements.
fn containers(n: usize, resources: &Value) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"name": format!("c-{i}"), "resources": resources}))
        .collect()
}

/// Bug (#23): four containers of 8000Pi each were answered as a verdict, "requested
/// 18446744073709551615": a saturated sum printed raw. A total beyond 64 bits of bytes is a 400
/// naming the resource, in both forms and in `/v1/hints`, and nothing is reserved.
#[tokio::test]
async fn four_containers_of_8000pi_are_a_400_naming_the_resource_never_a_saturated_figure() {
    let (_d, state) = state();
    let list = json!({"hugepages-2Mi": "8000Pi"});
    let short = json!({"pod": {"namespace": "ns", "name": "big", "uid": POD_B},
                       "containers": containers(4, &list)});
    let pod = json!({"metadata": {"namespace": "ns", "name": "big", "uid": POD_B},
                     "spec": {"containers": containers(4, &json!({"requests": list, "limits": list}))}});
    for path in ["/v1/admit", "/v1/hints"] {
        for (body, field) in [
            (&short, "containers[2].resources"),
            (&pod, "spec.containers[2].resources"),
        ] {
            let (status, ctype, problem) = post(&state, path, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {problem}");
            assert_eq!(ctype, "application/problem+json");
            assert_eq!(problem["field"], field, "{path}: {problem}");
            assert_eq!(
                problem["detail"], "the pod's total of hugepages-2Mi overflows 64 bits of bytes",
                "{path}: {problem}"
            );
            assert!(!problem.to_string().contains("18446744073709551615"));
        }
    }
    assert!(state.reservations.lock().expect("store").list().is_empty());
}

/// Bug (#38): the bytes of all request bodies together were not bounded. A body that finds no
/// room in `--body-budget` within its wait is 503 with `Retry-After`, counted, and changes
/// nothing; the budget is whole again after it.
#[tokio::test]
async fn a_body_with_no_room_in_the_budget_is_503_with_retry_after_and_gives_its_bytes_back() {
    let (_d, mut state) = state();
    let stats = state.metrics.api_connections.clone();
    state.bodies = Arc::new(super::budget::BodyBudget::new(1024, stats.clone()));
    let body = short("2Mi", Some(json!([0]))).to_string();
    let padded = format!("{body:<2048}");
    let request = Request::builder()
        .method("POST")
        .uri("/v1/admit")
        .header("content-type", "application/json")
        .body(Body::from(padded))
        .expect("request");
    let response = router(state.clone())
        .oneshot(request)
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let problem: Value = serde_json::from_slice(
        &response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes(),
    )
    .expect("a problem");
    assert_eq!(problem["type"], "body-budget-full");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("--body-budget")),
        "{problem}"
    );
    assert_eq!(stats.cuts(Cut::BodyBudget), 1);
    assert_eq!(stats.body_held(), 0);
    assert!(state.reservations.lock().expect("store").list().is_empty());
    let (status, _, answer) = post(&state, "/v1/admit", &json!({"containers": []})).await;
    assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
}

/// Bug (#23): nothing bounded the work one request could cause. A pod of more containers (app
/// and init) than `--max-containers` (default 256) is 413, naming the limit and the flag, before
/// any of its containers is checked; at the limit it is served.
#[tokio::test]
async fn more_containers_than_max_containers_is_413_naming_the_limit_and_the_flag() {
    let (_d, state) = state();
    let list = json!({"hugepages-2Mi": "2Mi"});
    let short = |n: usize| json!({"pod": {"name": "wide"}, "containers": containers(n, &list)});
    let requirements = json!({"limits": list});
    let pod = |apps: usize, init: usize| {
        let mut init_containers = containers(init, &requirements);
        for (i, c) in init_containers.iter_mut().enumerate() {
            c["name"] = json!(format!("init-{i}"));
        }
        json!({"metadata": {"name": "wide"},
               "spec": {"containers": containers(apps, &requirements), "initContainers": init_containers}})
    };
    for path in ["/v1/admit", "/v1/hints"] {
        for (body, field) in [
            (short(257), "containers"),
            (pod(200, 57), "spec.containers"),
        ] {
            let (status, ctype, problem) = post(&state, path, &body).await;
            let head: String = problem.to_string().chars().take(300).collect();
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {head}");
            assert_eq!(ctype, "application/problem+json");
            assert_eq!(problem["type"], "too-many-containers");
            assert_eq!(problem["field"], field);
            assert_eq!(
                problem["detail"],
                "the pod has 257 containers (app and init); this agent takes at most 256 (--max-containers)",
                "{path}: {problem}"
            );
        }
        for body in [short(256), pod(200, 56)] {
            let (status, _, answer) = post(&state, path, &body).await;
            assert_eq!(status, StatusCode::OK, "{path}: {answer}");
        }
    }
}

/// Bug (#23): `POST /v1/hints` computed the pod's QoS class once for each container, and each
/// time over every container: the work of one request grew with the square of the pod. It is
/// computed a fixed number of times, whatever the number of containers.
#[tokio::test]
async fn hints_compute_the_qos_class_a_fixed_number_of_times_whatever_the_pod_size() {
    let (_d, state) = state();
    let list = json!({"cpu": "1", "memory": "16Mi", "hugepages-2Mi": "2Mi"});
    let requirements = json!({"requests": list, "limits": list});
    let mut computed = Vec::new();
    // Up to lane::HEAVY_CONTAINERS: on this thread, whose count this is.
    for n in [1, 4, 8] {
        let pod = json!({"metadata": {"name": "wide"},
                         "spec": {"containers": containers(n, &requirements)}});
        crate::memorymanager::requests::QOS_COMPUTED.with(|c| c.set(0));
        let (status, _, answer) = post(&state, "/v1/hints", &pod).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["containers"].as_array().map(Vec::len), Some(n));
        computed.push(crate::memorymanager::requests::QOS_COMPUTED.with(std::cell::Cell::get));
    }
    assert!(computed[0] > 0, "{computed:?}");
    assert_eq!(computed, vec![computed[0]; 3]);
}

/// Bug (#23): every admission ran on the API thread, so one large request held up every other
/// request for as long as it took. A request with a large body or a pod of many containers is
/// worked out on the heavy lane; a typical one is answered while the lane is busy.
#[tokio::test]
async fn a_large_request_waits_for_the_heavy_lane_and_a_typical_one_does_not() {
    let (_d, state) = state();
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let lane = state.heavy.clone();
    let busy = tokio::spawn(async move { lane.run(move || (hold.recv(), ())).await });
    let request = |body: Value| {
        let state = state.clone();
        tokio::spawn(async move { admit(&state, body).await })
    };
    let list = json!({"hugepages-2Mi": "2Mi"});
    // No pod UID: nothing to reserve, so no file to write on a blocking thread either.
    let typical = request(json!({"pod": {"name": "typical"}, "containers": containers(1, &list)}));
    let many = request(json!({"pod": {"name": "many"}, "containers": containers(9, &list)}));
    let padding = "x".repeat(lane::HEAVY_BODY);
    let large = request(
        json!({"metadata": {"name": "large", "annotations": {"pad": padding}},
                               "spec": {"containers": containers(1, &json!({"limits": list}))}}),
    );
    // Every task runs as far as it can: the typical request to its answer, the others to the lane.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(typical.is_finished(), "a typical request waits for nothing");
    assert!(!many.is_finished(), "nine containers wait for the lane");
    assert!(
        !large.is_finished(),
        "a body over 16 KiB waits for the lane"
    );
    release.send(()).expect("the lane is held");
    busy.await.expect("joined").expect("ran").expect("released");
    for done in [typical, many, large] {
        let (status, _, answer) = done.await.expect("answered");
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
}

#[test]
fn the_openapi_document_names_every_value_of_the_holders_enums() {
    use crate::holders::{Kind, NodesFrom, SegmentKnownBy};

    let doc = super::openapi::document(&[crate::host::NumaNode(0)]);
    let schema = &doc["components"]["schemas"]["Holder"]["properties"];
    let named = |field: &str, value: serde_json::Value| {
        assert!(
            schema[field]["enum"]
                .as_array()
                .is_some_and(|e| e.contains(&value)),
            "{field}: {value} not in {}",
            schema[field]
        );
    };
    for kind in [
        Kind::HugetlbfsFile,
        Kind::SysvSegment,
        Kind::Memfd,
        Kind::Unexplained,
    ] {
        named("kind", serde_json::json!(kind));
    }
    for from in [
        NodesFrom::Mappings,
        NodesFrom::SomeMappings,
        NodesFrom::Queried,
        NodesFrom::Unknown,
    ] {
        named("nodesFrom", serde_json::json!(from));
    }
    for by in [
        SegmentKnownBy::Mapping,
        SegmentKnownBy::Faults,
        SegmentKnownBy::Rss,
        SegmentKnownBy::Accounting,
    ] {
        named("knownBy", serde_json::json!(by));
    }
}
