//! Telemetry checked by real peers: a running agent's `/metrics` through `promtool check
//! metrics` and a real Prometheus that scrapes it and answers every query of the Grafana
//! dashboard; its admission spans received by a real OTLP receiver over gRPC and over HTTP,
//! with their attributes, children and the parent a `traceparent` header named; with the
//! receiver gone, admission unchanged and the drop counter rising; spans flushed at shutdown.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, HugepagePool, MemoryPressure, TestCgroup, Toucher, agent_bin, fresh_state_dir,
    host_lock, kubelet_checkpoint,
    peers::{OtlpReceiver, Prometheus, get, metric_sum, promtool, request, workspace},
};
use serde_json::Value;

const REJECTED: &str = r#"{"pod":{"namespace":"team-a","name":"dpdk-0","uid":"11111111-2222-3333-4444-555555555555"},"containers":[{"name":"app","resources":{"hugepages-2Mi":"512Gi"}}]}"#;
const FITS: &str = r#"{"pod":{"namespace":"team-a","name":"dpdk-1","uid":"66666666-2222-3333-4444-555555555555"},"containers":[{"name":"app","resources":{"hugepages-2Mi":"2Mi"}}],"numaNodes":[0]}"#;
const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A fresh state directory (removed when the guard drops) and its path as an argument.
fn state_dir() -> (tempfile::TempDir, String) {
    let dir = fresh_state_dir(0);
    let path = dir.path().display().to_string();
    (dir, path)
}

fn agent(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.args(args);
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd
}

fn admit(port: u16, body: &str, traceparent: Option<&str>) -> Value {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(tp) = traceparent {
        headers.push(("traceparent", tp));
    }
    let (status, answer) = request(port, "POST", "/v1/admit", &headers, body);
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("JSON answer")
}

/// A kubelet checkpoint (as the newest kubelet writes it) for node 0 believing `free_2m` bytes
/// of 2 MiB pages free.
fn free_2m_checkpoint(free_2m: u64) -> Vec<u8> {
    let table = |bytes: u64| serde_json::json!({"total": bytes, "systemReserved": 0, "allocatable": bytes, "reserved": 0, "free": bytes});
    kubelet_checkpoint(serde_json::json!({"0": {
        "numberOfAssignments": 0, "cells": [0],
        "memoryMap": {"memory": table(1 << 30), "hugepages-2Mi": table(free_2m)}}}))
}

/// Every query of the dashboard, with Grafana's variables as a scrape of every node and size
/// would see them.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(workspace().join("dashboards/hugepage-agent.json"))
        .expect("read the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            let expr = expr
                .replace("$node", ".*")
                .replace("$size", ".*")
                .replace("$__rate_interval", "1m");
            queries.push((panel["title"].as_str().unwrap_or("").to_owned(), expr));
        }
    }
    assert!(queries.len() >= 20, "{} queries", queries.len());
    queries
}

#[test]
fn a_real_prometheus_scrapes_the_agent_and_every_dashboard_query_returns_data() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let (_state, dir) = state_dir();
    // A kubelet Memory Manager checkpoint, so that the discrepancy gauge has series.
    let checkpoint = std::path::Path::new(&dir).join("memory_manager_state");
    std::fs::write(&checkpoint, free_2m_checkpoint(4 * (2 << 20))).expect("checkpoint");
    let checkpoint = checkpoint.display().to_string();
    let mut running = Agent::start(agent(
        &[
            "run",
            "--ebpf",
            "auto",
            "--state-dir",
            &dir,
            "--reconcile-interval",
            "1s",
            "--kubelet-state",
            &checkpoint,
        ],
        &[("OTEL_TRACES_EXPORTER", "none")],
    ));
    running.wait_for("agent running", Duration::from_secs(30), |_| true);
    let port = running.port;
    let rejected = admit(port, REJECTED, None);
    assert_eq!(rejected["allowed"], false, "{rejected}");
    let admitted = admit(port, FITS, None);
    assert_eq!(admitted["allowed"], true, "{admitted}");

    let (status, exposition) = get(port, "/metrics");
    assert_eq!(status, 200);
    let (ok, lint) = promtool(&["check", "metrics"], &exposition);
    assert!(
        ok && lint.trim().is_empty(),
        "promtool check metrics: {lint}\n{exposition}"
    );
    assert_eq!(
        metric_sum(
            &exposition,
            "memory_manager_hugepages_verification_failures_total"
        ),
        1.0,
        "one node checked, one failure:\n{exposition}"
    );

    let prometheus = Prometheus::start(&format!("127.0.0.1:{port}"), &[("node", "test-node")]);
    // Three scrapes at least, so that rates over the dashboard's windows exist.
    prometheus.wait_for_data(
        "count_over_time(hugepage_agent_build_info[1m]) >= 3",
        Duration::from_secs(30),
    );
    let up = prometheus.query(r#"up{job="hugepage-agent"}"#);
    assert_eq!(up["result"][0]["value"][1], "1", "{up}");
    let failures = prometheus.query(
        r#"sum(memory_manager_hugepages_verification_failures_total{node="test-node",hugepage_size="2Mi"})"#,
    );
    assert_eq!(failures["result"][0]["value"][1], "1", "{failures}");

    let mut empty = Vec::new();
    for (title, expr) in dashboard_queries() {
        let data = prometheus.query(&expr);
        let has_data = data["result"].as_array().is_some_and(|r| !r.is_empty());
        if !has_data {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );
    for variable in [
        "hugepage_agent_build_info",
        "hugepage_agent_hugepages_pool_pages",
    ] {
        let data = prometheus.query(variable);
        let result = data["result"].as_array().expect("result");
        assert!(!result.is_empty(), "{variable}");
        assert!(
            result.iter().all(|s| s["metric"]["node"] == "test-node"
                && (variable != "hugepage_agent_hugepages_pool_pages"
                    || s["metric"]["hugepage_size"].is_string())),
            "the dashboard's variables read node and hugepage_size from {variable}: {data}"
        );
    }
    let (status, log) = running.terminate();
    assert!(status.success(), "{status:?}: {log:#?}");
}

/// Starts an agent exporting to `receiver` over `protocol`, with the given batching delay.
fn traced_agent(receiver: &OtlpReceiver, protocol: &str, delay_ms: &str, dir: &str) -> Agent {
    let endpoint = match protocol {
        "grpc" => format!("http://127.0.0.1:{}", receiver.grpc),
        _ => format!("http://127.0.0.1:{}", receiver.http),
    };
    let mut running = Agent::start(agent(
        &["run", "--ebpf", "off", "--state-dir", dir],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-tenant=hugepages,authorization=Bearer%20t0ken",
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", delay_ms),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16"),
            ("NODE_NAME", "test-node"),
        ],
    ));
    running.wait_for("agent running", Duration::from_secs(30), |_| true);
    running
}

/// The admission span of `trace_id` and its children, checked against what the agent answered.
fn check_admission_trace(receiver: &mut OtlpReceiver, transport: &str, answer: &Value) {
    let admission = receiver.wait_span(Duration::from_secs(20), |s| {
        s["name"] == "admission" && s["trace_id"] == TRACE_ID
    });
    assert_eq!(admission["transport"], transport, "{admission:#}");
    // OTEL_EXPORTER_OTLP_HEADERS, percent-decoded, on every export request.
    assert_eq!(
        admission["headers"]["x-tenant"], "hugepages",
        "{admission:#}"
    );
    assert_eq!(
        admission["headers"]["authorization"], "Bearer t0ken",
        "{admission:#}"
    );
    assert_eq!(admission["parent_span_id"], PARENT_ID, "{admission:#}");
    assert_eq!(admission["kind"], 2, "SPAN_KIND_SERVER: {admission:#}");
    let a = &admission["attributes"];
    for (key, want) in [
        ("k8s.pod.name", Value::from("dpdk-0")),
        ("k8s.namespace.name", Value::from("team-a")),
        (
            "k8s.pod.uid",
            Value::from("11111111-2222-3333-4444-555555555555"),
        ),
        ("hugepage.sizes", Value::from("hugepages-2Mi")),
        ("hugepage.numa_nodes", Value::from("0")),
        ("hugepage.requested_bytes", Value::from(512i64 << 30)),
        (
            "hugepage.available_bytes",
            answer["checks"][0]["availableBytes"].clone(),
        ),
        ("admission.result", Value::from("rejected")),
        (
            "admission.reason",
            Value::from("FailedHugepagesVerification"),
        ),
        ("admission.message", answer["message"].clone()),
    ] {
        // OTLP carries 64-bit integers as strings in JSON mappings; the receiver keeps ints.
        assert_eq!(a[key], want, "{key} in {admission:#}");
    }
    let r = &admission["resource"];
    assert_eq!(r["service.name"], "hugepage-agent", "{r}");
    assert_eq!(r["k8s.node.name"], "test-node", "{r}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(r["host.name"], host.trim(), "{r}");
    let id = admission["span_id"].clone();
    for child in ["hint", "verification", "reservation"] {
        let span = receiver.wait_span(Duration::from_secs(10), |s| {
            s["name"] == child && s["trace_id"] == TRACE_ID
        });
        assert_eq!(span["parent_span_id"], id, "{child}: {span:#}");
    }
}

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

#[test]
fn over_grpc_spans_arrive_and_a_stalled_or_dead_collector_only_raises_the_drop_counter() {
    let mut receiver = OtlpReceiver::start();
    let (_state, dir) = state_dir();
    let running = traced_agent(&receiver, "grpc", "100", &dir);
    let port = running.port;
    let answer = admit(port, REJECTED, Some(&traceparent()));
    check_admission_trace(&mut receiver, "grpc", &answer);

    // A pod of its own trace: no traceparent, no parent.
    admit(port, FITS, None);
    let own = receiver.wait_span(Duration::from_secs(10), |s| {
        s["name"] == "admission" && s["attributes"]["k8s.pod.name"] == "dpdk-1"
    });
    assert_eq!(own["parent_span_id"], "", "{own:#}");
    assert_ne!(own["trace_id"], TRACE_ID);

    let latency = |n: usize| {
        let mut took: Vec<Duration> = (0..n)
            .map(|_| {
                let start = Instant::now();
                admit(port, REJECTED, None);
                start.elapsed()
            })
            .collect();
        took.sort();
        took[n / 2]
    };
    let dropped_since = |before: f64, why: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, exposition) = get(port, "/metrics");
            let dropped = metric_sum(&exposition, "hugepage_agent_trace_spans_dropped_total");
            if dropped > before {
                return dropped;
            }
            assert!(
                Instant::now() < deadline,
                "the drop counter did not rise with the collector {why}"
            );
            // Keep spans coming, so the queue (64) fills behind the stuck export.
            admit(port, REJECTED, None);
        }
    };
    let up = latency(200);

    // A collector that stalls: its process stopped, its sockets open. The kernel still accepts
    // and buffers; the export waits for its time-out (OTEL_EXPORTER_OTLP_TIMEOUT, 1 s) while
    // spans queue behind it and the queue drops what does not fit. The Drop of the receiver
    // kills it, stopped or not.
    let send = |sig| {
        let pid = libc::pid_t::try_from(receiver.pid()).expect("pid");
        // SAFETY: a signal to our own child, which is still ours to wait for.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig}");
    };
    send(libc::SIGSTOP);
    let stalled = latency(200);
    let dropped = dropped_since(0.0, "stalled");
    send(libc::SIGCONT);

    receiver.stop();
    let down = latency(200);
    dropped_since(dropped, "down");
    for (why, median) in [("stalled", stalled), ("down", down)] {
        assert!(
            median < up * 2 + Duration::from_millis(2),
            "median admission {up:?} with the collector up, {median:?} with it {why}"
        );
    }
    let (status, log) = running.terminate();
    assert!(status.success(), "{status:?}: {log:#?}");
}

#[test]
fn over_http_the_admission_span_arrives_and_shutdown_flushes_what_is_queued() {
    let mut receiver = OtlpReceiver::start();
    let (_state, dir) = state_dir();
    // A batching delay far beyond the test: only the shutdown flush can deliver the spans.
    let running = traced_agent(&receiver, "http/protobuf", "600000", &dir);
    let answer = admit(running.port, REJECTED, Some(&traceparent()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        receiver.seen.is_empty(),
        "nothing exported before shutdown: {:#?}",
        receiver.seen
    );
    let (status, log) = running.terminate();
    assert!(status.success(), "{status:?}: {log:#?}");
    check_admission_trace(&mut receiver, "http", &answer);
    assert!(
        log.iter().any(|l| l["message"] == "spans flushed"),
        "{log:#?}"
    );
}

#[test]
fn otel_traces_exporter_none_exports_nothing_and_a_bad_protocol_names_the_variable() {
    let mut receiver = OtlpReceiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let (_state, dir) = state_dir();
    let mut running = Agent::start(agent(
        &["run", "--ebpf", "off", "--state-dir", &dir],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    ));
    running.wait_for("agent running", Duration::from_secs(30), |_| true);
    admit(running.port, REJECTED, Some(&traceparent()));
    let (status, _) = running.terminate();
    assert!(status.success());
    let got = receiver.collect(Duration::from_secs(1));
    assert!(got.is_empty(), "{got:#?}");

    let out = agent(
        &["run", "--ebpf", "off", "--state-dir", &dir],
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
    )
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("OTEL_EXPORTER_OTLP_PROTOCOL \"http/json\": expected grpc or http/protobuf"),
        "{stderr}"
    );
}

#[test]
fn a_map_refresh_an_ebpf_fault_prompted_and_a_psi_transition_are_spans() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let mut receiver = OtlpReceiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let (_state, dir) = state_dir();
    let mut running = Agent::start(agent(
        &[
            "run",
            "--ebpf",
            "on",
            "--state-dir",
            &dir,
            "--psi-memory-threshold",
            "0.01",
            "--psi-interval",
            "500ms",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    ));
    running.wait_for("agent running", Duration::from_secs(30), |l| {
        l["source"] == "ebpf+sysfs"
    });
    let cgroup = TestCgroup::create(&lock, "telemetry");
    let before = std::time::SystemTime::now();
    let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 4, 0);
    let refresh = receiver.wait_span(Duration::from_secs(20), |s| {
        s["name"] == "map refresh"
            && s["attributes"]["hugepage_agent.pools_changed"].as_i64() > Some(0)
    });
    let a = &refresh["attributes"];
    assert_eq!(
        a["hugepage_agent.trigger"], "ebpf hugetlb fault",
        "{refresh:#}"
    );
    assert_eq!(a["hugepage_agent.page_sizes"], "2Mi", "{refresh:#}");
    assert!(
        a["hugepage_agent.event.monotonic_ns"].as_i64() > Some(0),
        "{refresh:#}"
    );
    assert!(
        a["hugepage_agent.event_to_map_us"].as_i64() > Some(0),
        "{refresh:#}"
    );
    // The event's wall-clock time: after the toucher started, before the refresh began.
    let event = a["hugepage_agent.event.time"].as_str().expect("event time");
    let event = humantime::parse_rfc3339(event).expect("RFC 3339");
    let started = std::time::UNIX_EPOCH
        + Duration::from_nanos(refresh["start_unix_nano"].as_u64().expect("start"));
    assert!(
        event + Duration::from_millis(5) >= before && event <= started,
        "{event:?} not between {before:?} and {started:?}"
    );
    drop(toucher);
    drop(cgroup);

    let _pressure = MemoryPressure::start(&lock, "telemetry-psi");
    let transition = receiver.wait_span(Duration::from_secs(60), |s| {
        s["name"] == "psi condition transition" && s["attributes"]["psi.status"] == "True"
    });
    let a = &transition["attributes"];
    assert!(
        a["psi.condition"]
            .as_str()
            .is_some_and(|c| c.ends_with("MemoryContentionPressure")),
        "{transition:#}"
    );
    assert_eq!(a["psi.resource"], "memory", "{transition:#}");
    assert!(
        a["psi.reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("NodeHas")),
        "{transition:#}"
    );
    let (status, log) = running.terminate();
    assert!(status.success(), "{status:?}: {log:#?}");
}

#[test]
fn otel_traces_sampler_is_honoured_and_parent_based_follows_the_webhooks_decision() {
    let mut receiver = OtlpReceiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let (_state, dir) = state_dir();
    let mut running = Agent::start(agent(
        &["run", "--ebpf", "off", "--state-dir", &dir],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_off"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    ));
    running.wait_for("agent running", Duration::from_secs(30), |_| true);
    // A root admission is not sampled; one whose caller sampled its trace is.
    admit(running.port, FITS, None);
    admit(running.port, REJECTED, Some(&traceparent()));
    let (status, _) = running.terminate();
    assert!(status.success());
    let got = receiver.collect(Duration::from_secs(1));
    let admissions: Vec<&Value> = got.iter().filter(|s| s["name"] == "admission").collect();
    assert_eq!(admissions.len(), 1, "{got:#?}");
    assert_eq!(admissions[0]["trace_id"], TRACE_ID);
    assert_eq!(admissions[0]["attributes"]["k8s.pod.name"], "dpdk-0");
    assert_eq!(
        got.len(),
        4,
        "the sampled admission and its three steps: {got:#?}"
    );
}
