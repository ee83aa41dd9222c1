//! `cargo xtask bench extender`: the scheduler extender's `POST /scheduler/filter` over N
//! candidate nodes, in both forms of `ExtenderArgs`: `nodenames` (the scheduler's
//! `nodeCacheCapable: true`, the Nodes taken from the webhook's synced cache) and `nodes`
//! (`nodeCacheCapable: false`, every `Node` object in the body).
//!
//! Everything is real but the API server: the release `hugepage-agent webhook` over HTTPS,
//! calling real agents over mTLS (`--failure-policy fail`, so that an agent that does not
//! answer within `--agent-timeout 2s` shows as a failed node instead of passing unseen), its
//! Node cache kept by list+watch from the stand-in API server holding as many Nodes as the
//! largest N. The Nodes' `InternalIP`s are spread over `127.0.0.0/8`; one release agent listening
//! on `0.0.0.0` (`--ebpf off` over a generated host tree of two NUMA nodes, 4 GiB of 2 MiB pages
//! free on each; `--api-threads`, default 2: the machine's two vCPUs) answers every one of them,
//! so a thousand nodes' agents are one process here. The pod asks 2 GiB of 2 MiB pages, which
//! every node's allocatable holds, so every node's agent is asked, and every one admits it.
//!
//! The load is `--connections` clients (default 1, as kube-scheduler's one scheduling cycle at
//! a time, and 4, as several schedulers or profiles at once), each over one HTTPS connection kept
//! alive (HTTP/1.1, `TCP_NODELAY` as Go's clients), sending the next request when the last is
//! answered. Each cell (form, N, connections) warms every connection with one request, then
//! runs `--seconds` (default 5) or `--requests` requests in all; `--rounds` (default 3) repeat
//! all cells. Every answer is checked: one that does not keep all N nodes is counted and its
//! first failed node's message printed. It prints each cell as it ends, then per cell over all
//! rounds: requests, p50, p99 (and the rounds' p99s), requests/s, the webhook's and the agent's
//! CPU per request, the webhook's open descriptors and VmRSS at the cell's end and its VmHWM,
//! and whether the targets are met: p99 ≤ 20 ms at 100 nodes, ≤ 150 ms at 1,000, and the
//! webhook's peak RSS ≤ 50 MB at 1,000. Each cell has a webhook of its own, started and its
//! cache synced before the cell's first request and stopped after its last, so that its memory
//! is that cell's: what an earlier cell allocated and the allocator kept is not counted again.
//!
//! A thousand nodes may mean a thousand connections to the agent at once per call: the soft
//! limit of open files is raised (`setrlimit`) before the agent and the webhook start, which
//! inherit it, when it is below what the largest cell may need.
//!
//! **`--mode streamed`**: the webhook answers from the agents' streams (`GET
//! /v1/hugepages?watch=true`, one per Node) instead of asking them. The one agent is then this
//! host's, with its probes (a streamed state is used only where faults move the map), the
//! kubelet's Memory Manager policy `None` (the state alone decides), `--max-watchers` and
//! `--max-connections` above the largest N, over a real pool of 1,100 2 MiB pages (2.2 GiB, released at the end); each
//! webhook holds a stream to every Node of the largest N, and a cell starts once all are fresh.
//! Every candidate must be answered from the table: a cell prints the agent calls the webhook
//! made (0 expected) and its table answers per request. What one agent process for all the Nodes
//! does not show: thousands of agents' own connection state and their CPU are one process's
//! here, and the loopback network has no latency. Targets: p99 ≤ 5 ms at 1,000 nodes and ≤ 20 ms
//! at 5,000, the webhook's peak RSS ≤ 100 MB at 5,000. In streamed mode, `--memory-manager
//! static` runs the agent as on a node whose kubelet pins memory (`Static`, `single-numa-node`):
//! every candidate is then selected in the webhook as the kubelet would, on the streamed
//! `kubeletSelection`, before its hugepages are counted.
//!
//! `extender-load --agent PATH [--mode asked|streamed] [--memory-manager none|static] [--nodes
//! N,N,...] [--connections C,C,...] [--rounds R] [--seconds S | --requests N] [--api-threads T]`
//! (defaults asked; none; 10,100,1000 asked, 100,1000,5000 streamed; 1,4; 3; 5 s; 2).

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::{
        Barrier,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, BenchFlags, Footprint, HugepagePool, Percentiles,
    apiserver::StandInApiServer,
    cluster::{self, Pki, host_tree, node, pod},
    cpu_ns, free_port, host_lock, raise_open_files,
};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

const USAGE: &str = "extender-load --agent PATH [--mode asked|streamed] [--memory-manager none|static] [--nodes N,N,...] [--connections C,C,...] [--rounds R] [--seconds S | --requests N] [--api-threads T]";

/// The targets of one mode: p99 by number of candidate nodes, and the webhook's peak memory (KiB,
/// [`Footprint`] prints MB) at a number of nodes.
struct Targets {
    p99: &'static [(usize, Duration)],
    peak_kib: u64,
    peak_at: usize,
}

/// Asking every agent (issue #21).
const ASKED: Targets = Targets {
    p99: &[
        (100, Duration::from_millis(20)),
        (1000, Duration::from_millis(150)),
    ],
    peak_kib: 50 * 1024,
    peak_at: 1000,
};

/// Answering from the streams (issue #39).
const STREAMED: Targets = Targets {
    p99: &[
        (1000, Duration::from_millis(5)),
        (5000, Duration::from_millis(20)),
    ],
    peak_kib: 100 * 1024,
    peak_at: 5000,
};

/// 2 MiB pages of the real pool in streamed mode: the pod's 2 GiB and room.
const STREAMED_POOL: u64 = 1100;

struct Args {
    agent: PathBuf,
    streamed: bool,
    /// The streamed agent's kubelet policies (Memory Manager, Topology Manager).
    policies: [&'static str; 2],
    nodes: Vec<usize>,
    connections: Vec<usize>,
    rounds: usize,
    length: Length,
    api_threads: u64,
}

/// How long one cell runs.
#[derive(Clone, Copy)]
enum Length {
    Seconds(Duration),
    Requests(usize),
}

fn parse_args() -> Args {
    let flags = BenchFlags::parse(
        USAGE,
        &[
            "--agent",
            "--mode",
            "--memory-manager",
            "--nodes",
            "--connections",
            "--rounds",
            "--seconds",
            "--requests",
            "--api-threads",
        ],
    );
    let list = |name, default: &[u64]| -> Vec<usize> {
        flags
            .numbers(name, default)
            .into_iter()
            .map(|n| n as usize)
            .collect()
    };
    let length = match flags.optional_number("--requests") {
        Some(n) => Length::Requests(n as usize),
        None => Length::Seconds(Duration::from_secs(flags.number("--seconds", 5))),
    };
    let streamed = flags.choice("--mode", &["asked", "streamed"]) == "streamed";
    let nodes: &[u64] = if streamed {
        &[100, 1000, 5000]
    } else {
        &[10, 100, 1000]
    };
    let policies = match flags.choice("--memory-manager", &["none", "static"]) {
        "static" => ["Static", "single-numa-node"],
        _ => ["None", "none"],
    };
    Args {
        agent: flags.path("--agent"),
        streamed,
        policies,
        nodes: list("--nodes", nodes),
        connections: list("--connections", &[1, 4]),
        rounds: flags.number("--rounds", 3) as usize,
        length,
        api_threads: flags.number("--api-threads", 2),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Form {
    NodeNames,
    Nodes,
}

impl Form {
    fn label(self) -> &'static str {
        match self {
            Form::NodeNames => "nodenames",
            Form::Nodes => "nodes",
        }
    }
}

/// The `i`th of `of` addresses spread evenly over `127.0.0.0/8` (never `.0.0.0` nor the
/// broadcast address).
fn spread(i: usize, of: usize) -> Ipv4Addr {
    let stride = ((1u32 << 24) - 2) / of.max(1) as u32;
    Ipv4Addr::from(0x7f00_0000 | (1 + i as u32 * stride))
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// The parts of an `ExtenderFilterResult` the bench checks.
#[derive(Deserialize)]
struct Filtered {
    #[serde(default)]
    nodenames: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    nodes: Option<Items>,
    #[serde(default, rename = "failedNodes")]
    failed: HashMap<String, String>,
    #[serde(default, rename = "failedAndUnresolvableNodes")]
    unresolvable: HashMap<String, String>,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct Items {
    items: Vec<IgnoredAny>,
}

/// Why an answer is not every one of `n` nodes kept, or `None` when it is.
fn short_of(status: u16, body: &str, n: usize) -> Option<String> {
    if status != 200 {
        return Some(format!("HTTP {status}: {}", &body[..body.len().min(300)]));
    }
    let filtered: Filtered = match serde_json::from_str(body) {
        Ok(f) => f,
        Err(e) => return Some(format!("not an ExtenderFilterResult: {e}")),
    };
    let kept = match (&filtered.nodenames, &filtered.nodes) {
        (Some(names), _) => names.len(),
        (None, Some(list)) => list.items.len(),
        (None, None) => 0,
    };
    if kept == n && filtered.error.is_empty() {
        return None;
    }
    let example = filtered
        .failed
        .iter()
        .chain(&filtered.unresolvable)
        .next()
        .map(|(node, why)| format!("; {node}: {why}"))
        .unwrap_or_default();
    Some(format!(
        "{kept} of {n} nodes kept, {} failed{example}{}",
        filtered.failed.len() + filtered.unresolvable.len(),
        filtered.error
    ))
}

/// What a cell needs: the binary, the certificates, the stand-in API server, and the agent.
struct Bench<'a> {
    bin: &'a Path,
    pki: &'a Pki,
    api: &'a StandInApiServer,
    agent_port: u16,
    agent: u32,
    /// In streamed mode, the streams a webhook must have fresh before a cell starts.
    streams: Option<usize>,
}

impl Bench<'_> {
    /// A new webhook, its Node cache synced; how long the sync took.
    fn webhook(&self) -> (Agent, Duration) {
        let webhook = cluster::webhook(
            self.bin,
            self.pki,
            self.api,
            self.agent_port,
            "fail",
            "2s",
            &[],
        );
        let started = Instant::now();
        cluster::wait_ready(self.pki, &webhook, Duration::from_secs(60));
        if let Some(streams) = self.streams {
            let deadline = Instant::now() + Duration::from_secs(120);
            while self.sample(&webhook, FRESH) < streams as f64 {
                assert!(
                    Instant::now() < deadline,
                    "{streams} streams not fresh within 2 minutes: {}",
                    self.sample(&webhook, FRESH)
                );
                thread::sleep(Duration::from_millis(100));
            }
        }
        (webhook, started.elapsed())
    }

    /// A series of the webhook's metrics (0 when absent).
    fn sample(&self, webhook: &Agent, series: &str) -> f64 {
        cluster::sample(&cluster::metrics(self.pki, webhook), series).unwrap_or(0.0)
    }

    /// `connections` clients sending `body` (the filter for `n` nodes) for `length` to a new
    /// webhook: one round of a cell.
    fn run(&self, body: &str, n: usize, connections: usize, length: Length) -> Cell {
        let barrier = Barrier::new(connections + 1);
        let claimed = AtomicUsize::new(0);
        let (process, _) = self.webhook();
        let (webhook, agent, port) = (process.pid(), self.agent, process.port);
        let before = (self.sample(&process, CALLS), self.sample(&process, TABLE));
        thread::scope(|scope| {
            let clients: Vec<_> = (0..connections)
                .map(|_| {
                    let (barrier, claimed) = (&barrier, &claimed);
                    scope.spawn(move || self.client(port, body, n, barrier, claimed, length))
                })
                .collect();
            barrier.wait();
            let started = Instant::now();
            let cpu = (cpu_ns(webhook), cpu_ns(agent));
            let mut cell = Cell::default();
            for client in clients {
                let (samples, shorts) = client.join().expect("a load client");
                cell.samples.extend(samples);
                cell.short += shorts.len();
                cell.first_short = cell.first_short.or(shorts.into_iter().next());
            }
            cell.wall = started.elapsed();
            cell.webhook_cpu = Duration::from_nanos(cpu_ns(webhook).saturating_sub(cpu.0));
            cell.agent_cpu = Duration::from_nanos(cpu_ns(agent).saturating_sub(cpu.1));
            if !cell.samples.is_empty() {
                cell.round_p99s = vec![Percentiles::of(&mut cell.samples).p99];
            }
            cell.descriptors = descriptors(webhook);
            let memory = Footprint::of(webhook);
            (cell.rss_kib, cell.peak_kib) = (memory.rss_kib, memory.peak_rss_kib);
            cell.agent_calls = self.sample(&process, CALLS) - before.0;
            cell.table_answers = self.sample(&process, TABLE) - before.1;
            cell.warmups = connections;
            cell
        })
    }

    /// One client: a kept-alive connection, one call to warm it, then calls until the cell
    /// ends. Its calls' times and the reasons of its short answers.
    fn client(
        &self,
        port: u16,
        body: &str,
        n: usize,
        barrier: &Barrier,
        claimed: &AtomicUsize,
        length: Length,
    ) -> (Vec<Duration>, Vec<String>) {
        let mut connection = cluster::connection(self.pki, port);
        let mut call = || {
            let answer = connection
                .request("POST", "/scheduler/filter", Some("application/json"), body)
                .expect("an answer to the filter");
            short_of(answer.status, &answer.body, n)
        };
        let warm = call();
        barrier.wait();
        let started = Instant::now();
        let mut samples = Vec::new();
        let mut shorts: Vec<String> = warm.into_iter().collect();
        loop {
            let more = match length {
                Length::Seconds(s) => started.elapsed() < s,
                Length::Requests(total) => claimed.fetch_add(1, Ordering::SeqCst) < total,
            };
            if !more {
                return (samples, shorts);
            }
            let sent = Instant::now();
            let short = call();
            samples.push(sent.elapsed());
            shorts.extend(short);
        }
    }
}

/// The webhook's open file descriptors (its connections among them).
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// `/proc/loadavg`'s three averages.
fn load() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What one cell (form, N, connections) gathered: in one round, or over all of them.
#[derive(Default)]
struct Cell {
    samples: Vec<Duration>,
    round_p99s: Vec<Duration>,
    wall: Duration,
    webhook_cpu: Duration,
    agent_cpu: Duration,
    short: usize,
    first_short: Option<String>,
    /// The webhook's open descriptors at the end.
    descriptors: usize,
    /// The webhook's VmRSS at the end, and its VmHWM (the webhook served this cell only; the
    /// highest of the rounds).
    rss_kib: u64,
    peak_kib: u64,
    /// The webhook's agent calls and the candidates it judged from its table.
    agent_calls: f64,
    table_answers: f64,
    /// Each client's call before the cell (its table answers are counted too).
    warmups: usize,
}

impl Cell {
    /// Adds a later round of the same cell.
    fn merge(&mut self, later: Cell) {
        self.samples.extend(later.samples);
        self.round_p99s.extend(later.round_p99s);
        self.wall += later.wall;
        self.webhook_cpu += later.webhook_cpu;
        self.agent_cpu += later.agent_cpu;
        self.short += later.short;
        self.first_short = self.first_short.take().or(later.first_short);
        self.descriptors = later.descriptors;
        self.rss_kib = later.rss_kib;
        self.peak_kib = self.peak_kib.max(later.peak_kib);
        self.agent_calls += later.agent_calls;
        self.table_answers += later.table_answers;
        self.warmups += later.warmups;
    }
}

/// The cell against `targets` at `n` nodes (none: `-`).
fn verdict(targets: &Targets, n: usize, p99: Duration, peak_kib: u64) -> String {
    let mut verdicts = Vec::new();
    if let Some((_, target)) = targets.p99.iter().find(|(at, _)| *at == n) {
        let met = if p99 <= *target { "met" } else { "missed" };
        verdicts.push(format!("p99 <= {} ms {met}", target.as_millis()));
    }
    if n == targets.peak_at {
        let met = if peak_kib <= targets.peak_kib {
            "met"
        } else {
            "missed"
        };
        verdicts.push(format!("peak <= {} MB {met}", targets.peak_kib / 1024));
    }
    if verdicts.is_empty() {
        "-".to_owned()
    } else {
        verdicts.join(", ")
    }
}

/// One line of figures for a cell: requests, latency, throughput, CPU, descriptors, memory,
/// targets, and the answers that did not keep every node.
fn line(targets: &Targets, form: Form, n: usize, connections: usize, cell: &mut Cell) -> String {
    let count = cell.samples.len();
    if count == 0 {
        return format!(
            "{:<9} {n:>5} {connections:>5}  no request completed",
            form.label()
        );
    }
    let p = Percentiles::of(&mut cell.samples);
    let per_request = |d: Duration| ms(d) / count as f64;
    let (low, high) = (
        cell.round_p99s.iter().min().copied().unwrap_or_default(),
        cell.round_p99s.iter().max().copied().unwrap_or_default(),
    );
    format!(
        "{:<9} {n:>5} {connections:>5} {count:>6} {:>8.2} {:>8.2} ({:>7.2} to {:>7.2}) {:>8.1} {:>8.2} {:>8.2} {:>5} {:>6.1} {:>6.1} {:>6.0} {:>7.1}  {}{}",
        form.label(),
        ms(p.median),
        ms(p.p99),
        ms(low),
        ms(high),
        count as f64 / cell.wall.as_secs_f64(),
        per_request(cell.webhook_cpu),
        per_request(cell.agent_cpu),
        cell.descriptors,
        cell.rss_kib as f64 / 1024.0,
        cell.peak_kib as f64 / 1024.0,
        cell.agent_calls,
        cell.table_answers / (count + cell.warmups) as f64,
        verdict(targets, n, p.p99, cell.peak_kib),
        if cell.short > 0 {
            format!(
                "  {} short answers: {}",
                cell.short,
                cell.first_short.as_deref().unwrap_or("")
            )
        } else {
            String::new()
        }
    )
}

const HEADER: &str = "\
form      nodes conns   reqs   p50 ms   p99 ms (rounds' p99 ms)        req/s  webhook   agent   fds RSS MB   peak  calls table/req  targets
                                                                      CPU ms per request";

const FRESH: &str = "hugepage_agent_webhook_streams{state=\"fresh\"}";
const CALLS: &str = "hugepage_agent_webhook_agent_call_seconds_count";
const TABLE: &str = "hugepage_agent_webhook_table_answers_total";

fn main() {
    let args = parse_args();
    let largest = args.nodes.iter().copied().max().unwrap_or(0);
    let most = args.connections.iter().copied().max().unwrap_or(1);
    println!("load average at the start: {}", load());
    println!("{}", raise_open_files((largest * most) as u64 + 1024));

    let pki = Pki::new();
    let tree = host_tree(2048);
    let port = free_port();
    let threads = args.api_threads.to_string();
    let targets = if args.streamed { &STREAMED } else { &ASKED };
    let lock = args.streamed.then(host_lock);
    let _pool = lock
        .as_ref()
        .map(|lock| HugepagePool::reserve(lock, STREAMED_POOL));
    let cmd = if args.streamed {
        let extra = cluster::watched_by(largest, &threads);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        cluster::pinned_host_agent_command(&args.agent, &pki, args.policies, &extra)
    } else {
        let mut cmd = cluster::tree_agent_command(&args.agent, &pki, tree.path(), &[]);
        cmd.args(["--api-threads", &threads]);
        cmd
    };
    let agent = cluster::start_agent(cmd, Ipv4Addr::UNSPECIFIED, port, |_| true);
    let api = StandInApiServer::start();
    let nodes: Vec<_> = (0..largest)
        .map(|i| node(&node_name(i), spread(i, largest), "8Gi"))
        .collect();
    for n in &nodes {
        api.put_node(n.clone());
    }
    let bench = Bench {
        bin: &args.agent,
        pki: &pki,
        api: &api,
        agent_port: port,
        agent: agent.pid(),
        streams: args.streamed.then_some(largest),
    };
    let (webhook, synced) = bench.webhook();
    println!(
        "one agent on 0.0.0.0:{port} (--api-threads {threads}) answers {largest} Nodes' InternalIPs {} to {}; a webhook's cache syncs them from the stand-in API server in {:.0} ms, and it then holds VmRSS {:.1} MB before any request",
        spread(0, largest),
        spread(largest.saturating_sub(1), largest),
        ms(synced),
        Footprint::of(webhook.pid()).rss_kib as f64 / 1024.0
    );
    drop(webhook);

    let pod = pod(Some("2Gi"));
    let body = |form: Form, n: usize| match form {
        Form::NodeNames => {
            let names: Vec<String> = (0..n).map(node_name).collect();
            json!({"pod": pod, "nodenames": names}).to_string()
        }
        Form::Nodes => cluster::args(pod.clone(), &nodes[..n]).to_string(),
    };
    let mut cells: HashMap<(Form, usize, usize), Cell> = HashMap::new();
    let order: Vec<(Form, usize, usize)> = args
        .nodes
        .iter()
        .flat_map(|&n| {
            args.connections
                .iter()
                .flat_map(move |&c| [Form::NodeNames, Form::Nodes].map(|form| (form, n, c)))
        })
        .collect();
    let bodies: HashMap<(Form, usize), String> = order
        .iter()
        .map(|&(form, n, _)| ((form, n), body(form, n)))
        .collect();
    for round in 1..=args.rounds {
        println!(
            "round {round} of {} (load {}):\n{HEADER}",
            args.rounds,
            load()
        );
        for &key in &order {
            let (form, n, connections) = key;
            let mut this = bench.run(&bodies[&(form, n)], n, connections, args.length);
            println!("{}", line(targets, form, n, connections, &mut this));
            cells.entry(key).or_default().merge(this);
        }
    }

    println!(
        "\nall {} rounds, requests pooled (load at the end {}):\n{HEADER}",
        args.rounds,
        load()
    );
    for key in &order {
        if let Some(cell) = cells.get_mut(key) {
            println!("{}", line(targets, key.0, key.1, key.2, cell));
        }
    }
}
