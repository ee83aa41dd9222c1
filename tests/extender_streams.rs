//! The extender answering from the agents' streams (`GET /v1/hugepages?watch=true`), on the real
//! kernel: a real agent on this host with its probes loaded (faults move its map) behind mTLS,
//! the real webhook keeping its stream, a real hugepage pool and a toucher faulting real pages.
//! The API server is the stand-in of `apiserver.rs` (no kube-apiserver installs here); it serves
//! the Node and the pod as the real one's documents.
//!
//! What must hold: a node whose stream is fresh is judged from it, without an agent call, and
//! pages a real process takes drop it from the next filter with the KEP's message; a stream cut
//! off (the agent stopped) makes the node stale within `--stream-fresh-within` and the next filter
//! asks the agent directly; a binding the agent refuses on its fresh sysfs reads while the
//! table still has the node fit (pages gone with no fault to prompt the map: the pool shrunk) is
//! counted; under the Memory Manager's `Static` policy the webhook selects the node the kubelet
//! would pick on the streamed `kubeletSelection` and answers as the agent does, without a call.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use hugepage_agent::quantity::format_binary;
use hugepage_agent_tests::{
    Agent, HugepagePool, Toucher, agent_bin,
    apiserver::StandInApiServer,
    cluster::{
        self, Pki, args, binding_review, call, metrics, node, pod, sample, start_agent, validate,
        webhook_with,
    },
    free_port, host_lock, read_u64, require_root,
};
use serde_json::Value;

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const NODE0_2M: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const MI2: u64 = 2 << 20;

/// The kubelet's Memory Manager and Topology Manager policies of a node that does not pin
/// memory, and of one that pins it to single NUMA nodes.
const NODE_WIDE: [&str; 2] = ["None", "none"];
const PINNED: [&str; 2] = ["Static", "single-numa-node"];

/// This host's agent on `ip`:`port` (see [`cluster::pinned_host_agent_command`]) under the
/// kubelet's `policies`, with `extra`.
fn real_agent(pki: &Pki, ip: Ipv4Addr, port: u16, policies: [&str; 2], extra: &[&str]) -> Agent {
    let cmd = cluster::pinned_host_agent_command(&agent_bin(), pki, policies, extra);
    start_agent(cmd, ip, port, |l| l["source"] == "ebpf+sysfs")
}

/// This host's agent, the stand-in API server holding its Node `real`, and the webhook keeping
/// the agent's stream, fresh.
struct Streamed {
    pki: Pki,
    api: StandInApiServer,
    agent: Agent,
    webhook: Agent,
    nodes: Vec<Value>,
}

/// [`Streamed`] with the agent on 127.0.0.`last` sending heartbeats every `heartbeat`, and the
/// webhook's flags `extra`.
fn streamed(last: u8, heartbeat: &str, extra: &[&str]) -> Streamed {
    streamed_under(last, heartbeat, (NODE_WIDE, "32Mi"), extra)
}

/// [`streamed`] with the kubelet's `policies` on the agent's node and its Node's allocatable
/// 2 MiB hugepages `allocatable`.
fn streamed_under(
    last: u8,
    heartbeat: &str,
    (policies, allocatable): ([&str; 2], &str),
    extra: &[&str],
) -> Streamed {
    let pki = Pki::new();
    let port = free_port();
    let ip = Ipv4Addr::new(127, 0, 0, last);
    let agent = real_agent(&pki, ip, port, policies, &["--watch-heartbeat", heartbeat]);
    let api = StandInApiServer::start();
    let nodes = vec![node("real", ip, allocatable)];
    api.put_node(nodes[0].clone());
    let webhook = webhook(&pki, &api, port, extra);
    until(&pki, &webhook, FRESH, 1.0, Duration::from_secs(10));
    Streamed {
        pki,
        api,
        agent,
        webhook,
        nodes,
    }
}

/// One node `real` (this host) in the stand-in API server, the webhook with `extra`, ready.
fn webhook(pki: &Pki, api: &StandInApiServer, port: u16, extra: &[&str]) -> Agent {
    let w = webhook_with(&agent_bin(), pki, api, port, ["ignore", "2s"], &[], extra);
    cluster::wait_ready(pki, &w, Duration::from_secs(20));
    w
}

/// A series' value in the webhook's metrics (0 when absent).
fn value(pki: &Pki, webhook: &Agent, series: &str) -> f64 {
    sample(&metrics(pki, webhook), series).unwrap_or(0.0)
}

/// Waits until `series` is `want`.
fn until(pki: &Pki, webhook: &Agent, series: &str, want: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = value(pki, webhook, series);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{series} is {now}, not {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const FRESH: &str = "hugepage_agent_webhook_streams{state=\"fresh\"}";
const TABLE: &str = "hugepage_agent_webhook_table_answers_total";
const SKEW: &str = "hugepage_agent_webhook_agents_outside_version_skew";
const CALLS: &str = "hugepage_agent_webhook_agent_call_seconds_count";

/// `filter` of a pod asking for `pages` 2 MiB pages on `real`: the answer.
fn filter(pki: &Pki, webhook: &Agent, nodes: &[Value], pages: u64) -> Value {
    let pod = pod(Some(&format_binary(pages * MI2)));
    let (status, answer) = call(pki, webhook, "/scheduler/filter", &args(pod, nodes));
    assert_eq!(status, 200, "{answer}");
    answer
}

fn kept(answer: &Value) -> usize {
    answer["nodes"]["items"].as_array().map_or(0, Vec::len)
}

#[test]
fn pages_a_real_process_takes_drop_the_node_from_the_next_filter_without_an_agent_call() {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 16);
    let Streamed {
        pki,
        api: _api,
        agent: _agent,
        webhook,
        nodes,
    } = streamed(2, "1s", &[]);

    let free = read_u64(&format!("{NODE0_2M}/free_hugepages"));
    let (calls, table) = (value(&pki, &webhook, CALLS), value(&pki, &webhook, TABLE));
    let fits = filter(&pki, &webhook, &nodes, free);
    assert_eq!(kept(&fits), 1, "{fits}");
    assert_eq!(
        value(&pki, &webhook, TABLE),
        table + 1.0,
        "judged from the table"
    );

    let taken = Toucher::run(TOUCHER, None, 2, 0);
    let started = Instant::now();
    let refused = loop {
        let answer = filter(&pki, &webhook, &nodes, free);
        if kept(&answer) == 0 {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the node was kept 2 s after its pages were taken: {answer}"
        );
    };
    eprintln!(
        "the filter dropped the node {:?} after the toucher returned",
        started.elapsed()
    );
    let expected = format!(
        "insufficient hugepages-2Mi on NUMA node(s) [0]: requested {}, available {}",
        format_binary(free * MI2),
        format_binary((free - 2) * MI2)
    );
    assert_eq!(
        refused["failedNodes"]["real"],
        expected.as_str(),
        "{refused}"
    );
    assert_eq!(
        value(&pki, &webhook, CALLS),
        calls,
        "no agent was called: every answer came from the stream"
    );
    drop(taken);
}

#[test]
fn a_stream_cut_off_makes_its_node_stale_within_the_bound_and_the_next_filter_asks_the_agent() {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let Streamed {
        pki,
        api: _api,
        agent,
        webhook,
        nodes,
    } = streamed(3, "200ms", &["--stream-fresh-within", "1s"]);
    // The agent names its version on every event, the webhook's own: within the skew policy.
    assert_eq!(sample(&metrics(&pki, &webhook), SKEW), Some(0.0));
    let calls = value(&pki, &webhook, CALLS);
    filter(&pki, &webhook, &nodes, 1);
    assert_eq!(
        value(&pki, &webhook, CALLS),
        calls,
        "answered from the stream"
    );

    // The agent stops: its stream falls silent, as a broken connection does.
    let stopped = Stopped::new(agent.pid());
    let cut = Instant::now();
    until(&pki, &webhook, FRESH, 0.0, Duration::from_secs(5));
    eprintln!(
        "the node turned stale {:?} after its agent stopped",
        cut.elapsed()
    );
    assert!(
        cut.elapsed() >= Duration::from_millis(800),
        "not before the bound"
    );
    drop(stopped);
    let table = value(&pki, &webhook, TABLE);
    let answer = filter(&pki, &webhook, &nodes, 1);
    assert_eq!(kept(&answer), 1, "{answer}");
    assert_eq!(value(&pki, &webhook, TABLE), table, "not from the table");
    assert_eq!(
        value(&pki, &webhook, CALLS),
        calls + 1.0,
        "the agent was asked"
    );
}

#[test]
fn a_binding_the_agent_refuses_while_the_table_has_the_node_fit_is_counted() {
    require_root();
    let lock = host_lock();
    let pool = HugepagePool::reserve(&lock, 16);
    let Streamed {
        pki,
        api,
        agent: _agent,
        webhook,
        nodes,
    } = streamed(4, "1s", &[]);
    let free = read_u64(&format!("{NODE0_2M}/free_hugepages"));
    let need = pod(Some(&format_binary(free * MI2)));
    api.put_pod(need.clone());
    assert_eq!(kept(&filter(&pki, &webhook, &nodes, free)), 1);

    // Pages gone with no fault to prompt the map: the pool shrunk by two (the reconcile is
    // hourly). The table still has them; the agent's fresh read does not.
    let total = read_u64(POOL);
    std::fs::write(POOL, (total - 2).to_string()).expect("shrink the pool");
    let disagreements = "hugepage_agent_webhook_table_disagreements_total";
    let before = value(&pki, &webhook, disagreements);
    let response = validate(&pki, &webhook, &binding_review(&need, "real", true));
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(value(&pki, &webhook, disagreements), before + 1.0);
    drop(pool);
}

#[test]
fn under_the_static_policy_the_webhook_selects_as_the_kubelet_and_answers_as_the_agent_without_a_call()
 {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 16);
    let Streamed {
        pki,
        api,
        agent,
        webhook,
        nodes,
    } = streamed_under(5, "1s", (PINNED, "1Gi"), &[]);
    // The same calls answered by the agent: a webhook without streams beside it.
    let asking = self::webhook(&pki, &api, agent.port, &["--agent-streams", "false"]);
    let total = read_u64(&format!("{NODE0_2M}/nr_hugepages"));
    let free = read_u64(&format!("{NODE0_2M}/free_hugepages"));
    let taken = Toucher::run(TOUCHER, None, 2, 0);
    let started = Instant::now();
    while kept(&filter(&pki, &webhook, &nodes, free)) == 1 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the table still fits every free page 2 s after two were taken"
        );
    }
    // The Memory Manager counts only what it assigned: every page of the pool is free to it. The
    // kernel has two fewer, which the stream shows.
    let cases = [
        (free - 2, "fits on node 0, the node single-numa-node picks"),
        (
            free,
            "the Memory Manager has the pages, the kernel does not: KEP-5759's refusal",
        ),
        (
            total + 1,
            "no NUMA node has the pages: the Memory Manager's Allocate refuses",
        ),
    ];
    let mut answers = Vec::new();
    for (pages, what) in cases {
        let (calls, table) = (value(&pki, &webhook, CALLS), value(&pki, &webhook, TABLE));
        let streamed = filter(&pki, &webhook, &nodes, pages);
        assert_eq!(
            value(&pki, &webhook, TABLE),
            table + 1.0,
            "{what}: from the table"
        );
        assert_eq!(value(&pki, &webhook, CALLS), calls, "{what}: no agent call");
        let asked = filter(&pki, &asking, &nodes, pages);
        assert_eq!(
            (kept(&streamed), &streamed["failedNodes"]),
            (kept(&asked), &asked["failedNodes"]),
            "{what}: the table's answer is the agent's"
        );
        answers.push(streamed);
    }
    assert_eq!(kept(&answers[0]), 1, "{}", answers[0]);
    let expected = format!(
        "insufficient hugepages-2Mi on NUMA node(s) [0]: requested {}, available {}",
        format_binary(free * MI2),
        format_binary((free - 2) * MI2)
    );
    assert_eq!(answers[1]["failedNodes"]["real"], expected.as_str());
    // The kubelet's own words: on one NUMA node no hint fits, the merge keeps the default
    // affinity, and the static policy's Allocate finds no node with the memory.
    assert_eq!(
        answers[2]["failedNodes"]["real"],
        "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
    );
    drop(taken);
}

/// An agent stopped (SIGSTOP) until dropped (SIGCONT).
struct Stopped(i32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        let pid = pid as i32;
        // SAFETY: a signal to a child of this test.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
