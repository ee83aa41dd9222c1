//! `cargo xtask bench freshness`: how soon a hugetlb fault on this host's real kernel is known,
//! to the agent's map and to a watcher of the map (`GET /v1/hugepages?watch=true`).
//!
//! A real agent with its probes (the reconcile hourly, so that every change comes from a fault),
//! a real 2 MiB pool, and `--touchers` `toucher` processes one after the other, each faulting one
//! page and holding it (a toucher that let go would give its page back unseen until the
//! reconcile). One page each: the kernel zeroes a page after it takes it from the pool, and on a
//! VM the first touch of memory new to the guest makes that take milliseconds, so a second page's
//! fault would come late and be timed as the agent's delay. Two delays:
//!
//! * **fault → map**: the `fault_to_map_us` of every `hugepage pool changed` line a fault
//!   prompted, from the probe's event (stamped by the kernel, CLOCK_MONOTONIC) to the map's
//!   snapshot that shows the page taken;
//! * **fault → watcher**: from the toucher's CLOCK_MONOTONIC just before its first touch to the
//!   moment a thread reading the watch (over loopback TCP, as the webhook reads it) has the state
//!   that shows its page taken;
//! * **fault → the webhook's filter**: then, with a new agent behind mTLS, the real webhook
//!   keeping its stream (the API server is the stand-in of `apiserver.rs`), and `--filters`
//!   touchers one after the other: a client polls `POST /scheduler/filter` back to back over one
//!   kept-alive HTTPS connection for a pod that asks every free page of the node, and the delay
//!   runs from the toucher's first touch to the first answer that drops the node.
//!
//! `--map-thread-priority P` runs both agents with that flag (their map thread under SCHED_FIFO
//! at priority P).
//!
//! `freshness --agent PATH [--touchers N] [--filters N] [--map-thread-priority P]` (defaults
//! 500, 200, none).

use std::{
    net::Ipv4Addr,
    path::Path,
    sync::{Barrier, mpsc},
    time::{Duration, Instant},
};

use hugepage_agent::quantity::format_binary;
use hugepage_agent_tests::{
    BenchFlags, HostLock, HugepagePool, Percentiles, Toucher,
    apiserver::StandInApiServer,
    clock_ns,
    cluster::{self, Pki},
    free_port, host_lock, probed_agent, read_u64, require_root,
    watcher::Watch,
};
use serde_json::Value;

const USAGE: &str = "freshness --agent PATH [--touchers N] [--filters N] [--map-thread-priority P]";
const MI2: u64 = 2 << 20;
const FREE: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages";
const FRESH: &str = "hugepage_agent_webhook_streams{state=\"fresh\"}";
/// Pages each toucher faults.
const PAGES: u64 = 1;

fn main() {
    require_root();
    let flags = BenchFlags::parse(
        USAGE,
        &[
            "--agent",
            "--touchers",
            "--filters",
            "--map-thread-priority",
        ],
    );
    let agent_path = flags.path("--agent");
    let touchers = flags.number("--touchers", 500);
    let filters = flags.number("--filters", 200);
    let priority = flags.optional_number("--map-thread-priority");
    let mut extra = vec!["--watch-heartbeat".to_owned(), "1s".to_owned()];
    if let Some(p) = priority {
        extra.extend(["--map-thread-priority".to_owned(), p.to_string()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let toucher = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("toucher")))
        .filter(|path| path.exists())
        .unwrap_or_else(|| panic!("the toucher binary is not beside this one"));

    let lock = host_lock();
    let pool = HugepagePool::reserve(&lock, touchers * PAGES + 4);
    let mut agent = probed_agent(&agent_path, &extra);
    let (seen, first_free) = follow(agent.port);

    let mut held = Vec::new();
    let mut to_watcher = Vec::new();
    for i in 1..=touchers {
        let t = Toucher::run(&toucher.display().to_string(), None, PAGES as usize, 0);
        let want = first_free - i * PAGES;
        let deadline = Instant::now() + Duration::from_secs(5);
        let at = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, free) = seen
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the watcher never saw free {want} (toucher {i})"));
            if free <= want {
                break at;
            }
        };
        to_watcher.push(Duration::from_nanos(at.saturating_sub(t.first_touch_ns)));
        held.push(t);
    }
    let changed = agent.lines_with("hugepage pool changed");
    let prompted: Vec<(u64, u64)> = changed
        .iter()
        .filter_map(|l| Some((l["fault_to_map_us"].as_u64()?, l["repeats"].as_u64()?)))
        .collect();
    let mut to_map: Vec<Duration> = prompted
        .iter()
        .map(|&(us, _)| Duration::from_micros(us))
        .collect();
    let repeated = prompted.iter().filter(|&&(_, r)| r > 0).count();
    let late: Vec<(u64, u64)> = prompted
        .iter()
        .copied()
        .filter(|&(us, _)| us > 1000)
        .collect();
    let policy = priority.map_or_else(|| "default".to_owned(), |p| format!("SCHED_FIFO {p}"));
    println!(
        "{touchers} touchers of {PAGES} 2 MiB page each, one after the other, on this host's kernel; the map thread's policy: {policy}"
    );
    println!(
        "fault -> agent's map      {}  ({} prompted re-reads that saw a change)",
        Percentiles::of(&mut to_map),
        to_map.len()
    );
    println!(
        "fault -> watcher's state  {}  (first touch to the state that shows it)",
        Percentiles::of(&mut to_watcher)
    );
    println!(
        "re-reads repeated before the page was seen taken: {repeated} of {}; over 1 ms (µs, repeats): {late:?}",
        prompted.len()
    );
    drop(held);
    drop(agent);
    drop(pool);

    let mut to_filter = through_webhook(&agent_path, &toucher, &lock, filters, &extra);
    println!(
        "fault -> webhook's filter {}  (first touch to the first filter that drops the node)",
        Percentiles::of(&mut to_filter)
    );
}

/// The delays from each of `filters` touchers' first touch to the webhook's first filter answer
/// that drops the node; the agent runs with `extra`.
fn through_webhook(
    agent: &Path,
    toucher: &Path,
    lock: &HostLock,
    filters: u64,
    extra: &[&str],
) -> Vec<Duration> {
    let _pool = HugepagePool::reserve(lock, filters * PAGES + 4);
    let pki = Pki::new();
    let port = free_port();
    let ip = Ipv4Addr::new(127, 0, 0, 2);
    let cmd = cluster::host_agent_command(agent, &pki, extra);
    let _agent = cluster::start_agent(cmd, ip, port, |l| l["source"] == "ebpf+sysfs");
    let api = StandInApiServer::start();
    let node = cluster::node("real", ip, "64Gi");
    api.put_node(node.clone());
    let webhook = cluster::webhook_with(agent, &pki, &api, port, ["ignore", "2s"], &[], &[]);
    cluster::wait_ready(&pki, &webhook, Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster::sample(&cluster::metrics(&pki, &webhook), FRESH) != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "the agent's stream never turned fresh"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut held = Vec::new();
    let mut delays = Vec::new();
    for _ in 0..filters {
        let free = read_u64(FREE);
        let pod = cluster::pod(Some(&format_binary(free * MI2)));
        let body = cluster::args(pod, std::slice::from_ref(&node)).to_string();
        let ready = Barrier::new(2);
        let dropped = std::thread::scope(|scope| {
            let poller = scope.spawn(|| {
                let mut connection = cluster::connection(&pki, webhook.port);
                let mut kept = || {
                    let answer = connection
                        .request("POST", "/scheduler/filter", Some("application/json"), &body)
                        .expect("an answer to the filter");
                    let answer: Value = serde_json::from_str(&answer.body).expect("JSON");
                    answer["nodes"]["items"]
                        .as_array()
                        .is_some_and(|i| !i.is_empty())
                };
                assert!(kept(), "the node fits before the toucher");
                ready.wait();
                let deadline = Instant::now() + Duration::from_secs(5);
                while kept() {
                    assert!(Instant::now() < deadline, "the node was never dropped");
                }
                clock_ns(libc::CLOCK_MONOTONIC)
            });
            ready.wait();
            held.push(Toucher::run(
                &toucher.display().to_string(),
                None,
                PAGES as usize,
                0,
            ));
            poller.join().expect("the poller")
        });
        let touched = held.last().map_or(0, |t| t.first_touch_ns);
        delays.push(Duration::from_nanos(dropped.saturating_sub(touched)));
    }
    delays
}

/// A thread that reads the watch and sends each state's CLOCK_MONOTONIC arrival time and node
/// 0's free 2 MiB pages; and the free pages of the first state.
fn follow(port: u16) -> (mpsc::Receiver<(u64, u64)>, u64) {
    let mut watch = Watch::open(port, "watch=true");
    assert_eq!(watch.status, 200, "the watch was refused");
    let first = watch.next_state(Duration::from_secs(5));
    let first_free = free(&first);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Some(event) = watch.next(Duration::from_secs(30)) {
            if event["type"] == "BOOKMARK" {
                continue;
            }
            if tx
                .send((clock_ns(libc::CLOCK_MONOTONIC), free(&event)))
                .is_err()
            {
                return;
            }
        }
    });
    (rx, first_free)
}

/// Node 0's free 2 MiB pages in a state event.
fn free(event: &Value) -> u64 {
    event["object"]["nodes"][0]["sizes"]
        .as_array()
        .and_then(|sizes| sizes.iter().find(|s| s["pageSizeBytes"] == MI2))
        .and_then(|s| s["free"].as_u64())
        .unwrap_or_else(|| panic!("no 2 MiB size on node 0 in {event}"))
}
