//! `cargo xtask bench admit-size`: what one admission costs as the pod grows, and what one
//! client's largest bodies cost everyone else.
//!
//! Starts the release agent with `--ebpf off` over a generated host tree (two NUMA nodes of
//! 32 GiB of 2 MiB pages and 128 GiB of memory each, under `$TMPDIR`; nothing of this host is
//! read or changed, no cgroup, no hugepage pool, no lock), as on a node whose kubelet pins memory
//! (`--memory-manager-policy Static --topology-policy single-numa-node`: every admission takes
//! the kubelet's hints and selection), then:
//!
//! * **Size sweep**: `POST /v1/admit` with pods of 10, 100, 1,000, 2,000 and 4,000 containers
//!   (`--sizes`), one request at a time over one connection, `--repetitions` times each after a
//!   warm-up, in both forms: the short form with `hugepages-2Mi: 2Mi` per container, and a whole
//!   `v1.Pod`, Guaranteed, with cpu, memory and hugepages per container; and `POST /v1/hints`
//!   with the `v1.Pod`. It prints the median client time per size, per container, and the ratio
//!   time(4,000) / time(100) (targets: 4,000 containers within 20 ms, the ratio within 50). This
//!   agent runs with `--max-containers` at the largest size.
//! * **A typical pod**: one container, short form and `v1.Pod`, `--requests` times: median, p99.
//! * **A noisy neighbour**: an agent with the default flags. A well-behaved client sends the
//!   typical pod every `--interval-us` (`--requests` in all, timed from the send), in windows that
//!   alternate between alone and while another client loops the largest bodies the agent
//!   accepts: a `v1.Pod` with the default `--max-containers` of Guaranteed containers, padded
//!   with environment variables to just under the body limit; and the same containers in the
//!   short form's fewest bytes. Alternating lets both halves see the same machine (this one is
//!   shared). It prints both p99s and their ratio (target: within 2), the other client's time per
//!   body and what each body cost the API threads, and checks that one container more is refused
//!   with 413. The control runs the same windows with the other client sending to a second agent
//!   process instead: what the well-behaved client loses there is the machine's share (both
//!   clients and both agents on the same cores), not this agent's.
//!
//! `admit-size --agent PATH [--sizes N,N,…] [--repetitions R] [--requests N] [--interval-us U]`
//! (defaults 10,100,1000,2000,4000; 11; 2000; 2000).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hugepage_agent::api::admit::{BODY_LIMIT, DEFAULT_MAX_CONTAINERS};
use hugepage_agent_tests::{Agent, BenchFlags, Percentiles, cpu_ns, two_numa_nodes, wait_ready};

const USAGE: &str =
    "admit-size --agent PATH [--sizes N,N,...] [--repetitions R] [--requests N] [--interval-us U]";

struct Args {
    agent: PathBuf,
    sizes: Vec<u64>,
    repetitions: usize,
    requests: usize,
    interval: Duration,
}

fn parse_args() -> Args {
    let flags = BenchFlags::parse(
        USAGE,
        &[
            "--agent",
            "--sizes",
            "--repetitions",
            "--requests",
            "--interval-us",
        ],
    );
    Args {
        agent: flags.path("--agent"),
        sizes: flags.numbers("--sizes", &[10, 100, 1000, 2000, 4000]),
        repetitions: flags.number("--repetitions", 11) as usize,
        requests: flags.number("--requests", 2000) as usize,
        interval: Duration::from_micros(flags.number("--interval-us", 2000)),
    }
}

/// One keep-alive HTTP/1.1 connection to the agent.
struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        Client {
            reader: BufReader::new(stream),
        }
    }

    /// `POST path` with a JSON body: the status and the answer's body.
    fn post(&mut self, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.reader.get_mut();
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body))
            .unwrap_or_else(|e| panic!("sending POST {path}: {e}"));
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("reading the answer to POST {path}: {e}"));
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("POST {path}: no status line: {line:?}"));
        let mut length = None;
        loop {
            line.clear();
            self.reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("reading the headers of POST {path}: {e}"));
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let length = length.unwrap_or_else(|| panic!("POST {path}: an answer without a length"));
        let mut answer = vec![0; length];
        self.reader
            .read_exact(&mut answer)
            .unwrap_or_else(|e| panic!("reading the body of POST {path}: {e}"));
        (status, answer)
    }

    /// [`Client::post`], timed; panics unless the answer is 200.
    fn timed(&mut self, path: &str, body: &[u8]) -> Duration {
        let start = Instant::now();
        let (status, answer) = self.post(path, body);
        let took = start.elapsed();
        assert_eq!(
            status,
            200,
            "POST {path}: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(2000)])
        );
        took
    }
}

/// The host tree: two nodes of 16,384 2 MiB pages (all free) and 128 GiB of memory each.
fn host_tree(root: &Path) {
    two_numa_nodes(root, 128 << 20, 16384, 16384);
}

/// An agent over `root` with `extra` flags, ready.
fn start(agent: &Path, root: &Path, extra: &[String]) -> Agent {
    let mut cmd = Command::new(agent);
    cmd.arg("run")
        .arg("--host-root")
        .arg(root)
        .args(["--ebpf", "off"])
        // A node whose kubelet pins memory: every admission takes the kubelet's hints and
        // selection (there is no kubelet here).
        .args([
            "--memory-manager-policy",
            "Static",
            "--topology-policy",
            "single-numa-node",
        ])
        .args(extra);
    let running = Agent::start(cmd);
    wait_ready(running.port, Duration::from_secs(30)).expect("the agent is ready within 30 s");
    running
}

/// The short form: `n` containers of `hugepages-2Mi: 2Mi` (no pod UID: nothing is reserved).
fn short(n: usize) -> Vec<u8> {
    let containers: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"name":"c-{i}","resources":{{"hugepages-2Mi":"2Mi"}}}}"#))
        .collect();
    format!(
        r#"{{"pod":{{"namespace":"bench","name":"wide"}},"containers":[{}]}}"#,
        containers.join(",")
    )
    .into_bytes()
}

/// A Guaranteed container of a `v1.Pod`, with `env` entries of padding.
fn guaranteed(i: usize, env: usize) -> String {
    let list = r#"{"cpu":"1","memory":"16Mi","hugepages-2Mi":"2Mi"}"#;
    let env: Vec<String> = (0..env)
        .map(|e| format!(r#"{{"name":"E{e}","value":"v"}}"#))
        .collect();
    let env = if env.is_empty() {
        String::new()
    } else {
        format!(r#","env":[{}]"#, env.join(","))
    };
    format!(r#"{{"name":"c-{i}","resources":{{"requests":{list},"limits":{list}}}{env}}}"#)
}

/// A `v1.Pod` of `n` Guaranteed containers (cpu, memory, hugepages), each with `env` variables.
fn pod(n: usize, env: usize) -> Vec<u8> {
    let containers: Vec<String> = (0..n).map(|i| guaranteed(i, env)).collect();
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"namespace":"bench","name":"wide"}},"spec":{{"containers":[{}]}}}}"#,
        containers.join(",")
    )
    .into_bytes()
}

/// The short form's fewest bytes for `n` Guaranteed containers: no names, no pod.
fn short_guaranteed(n: usize) -> Vec<u8> {
    let one = r#"{"resources":{"cpu":"1","memory":"16Mi","hugepages-2Mi":"2Mi"}}"#;
    format!(r#"{{"containers":[{}]}}"#, vec![one; n].join(",")).into_bytes()
}

/// The largest `v1.Pod` of `n` containers under the body limit: as many variables per container
/// as fit.
fn largest_pod(n: usize) -> Vec<u8> {
    // Each variable takes more than 20 bytes: the search starts under the limit's worth.
    let (mut low, mut high) = (0, BODY_LIMIT / (20 * n.max(1)) + 1);
    while low + 1 < high {
        let mid = (low + high) / 2;
        if pod(n, mid).len() <= BODY_LIMIT {
            low = mid;
        } else {
            high = mid;
        }
    }
    pod(n, low)
}

fn median(samples: &mut [Duration]) -> Duration {
    Percentiles::of(samples).median
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The size sweep of one form: per size, the client's median and fastest time and the agent's
/// median CPU time (the machine's other load moves the first two, hardly the third).
fn sweep(
    client: &mut Client,
    pid: u32,
    label: &str,
    path: &str,
    sizes: &[u64],
    repetitions: usize,
    body: impl Fn(usize) -> Vec<u8>,
) {
    println!("{label}");
    let mut medians = Vec::new();
    for &n in sizes {
        let body = body(n as usize);
        client.timed(path, &body);
        let mut times = Vec::with_capacity(repetitions);
        let mut cpu = Vec::with_capacity(repetitions);
        for _ in 0..repetitions {
            let before = cpu_ns(pid);
            times.push(client.timed(path, &body));
            cpu.push(Duration::from_nanos(cpu_ns(pid) - before));
        }
        let fastest = times.iter().min().copied().unwrap_or_default();
        let (m, c) = (median(&mut times), median(&mut cpu));
        println!(
            "  {n:>5} containers {:>5} KiB  median {:>8.3} ms  fastest {:>8.3} ms  {:>6.2} us per container  agent CPU {:>8.3} ms",
            body.len() / 1024,
            ms(m),
            ms(fastest),
            m.as_secs_f64() * 1e6 / n as f64,
            ms(c)
        );
        medians.push((n, m, c));
    }
    let at = |n: u64| medians.iter().find(|(s, _, _)| *s == n);
    if let (Some(&(_, small, small_cpu)), Some(&(_, large, large_cpu))) = (at(100), at(4000)) {
        println!(
            "  ratio time(4000) / time(100): {:.1}, agent CPU {:.1} (linear: 40; target: 50 at most)",
            large.as_secs_f64() / small.as_secs_f64(),
            large_cpu.as_secs_f64() / small_cpu.as_secs_f64()
        );
    }
}

/// A client that sends `body` back to back while `on` is set, and says whether it is between
/// requests (`idle`): what it sent, one time each.
struct Noisy {
    on: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Vec<Duration>>,
}

impl Noisy {
    fn start(port: u16, body: Vec<u8>) -> Noisy {
        let on = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (flags, done, quit) = (on.clone(), idle.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut client = Client::connect(port);
            let mut samples = Vec::new();
            while !quit.load(Ordering::SeqCst) {
                if flags.load(Ordering::SeqCst) {
                    done.store(false, Ordering::SeqCst);
                    samples.push(client.timed("/v1/admit", &body));
                } else {
                    done.store(true, Ordering::SeqCst);
                    thread::sleep(Duration::from_micros(200));
                }
            }
            samples
        });
        Noisy {
            on,
            idle,
            stop,
            thread,
        }
    }

    /// Starts or stops sending, and waits until it has.
    fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
        while self.idle.load(Ordering::SeqCst) == on {
            thread::sleep(Duration::from_micros(100));
        }
    }

    fn finish(self) -> Vec<Duration> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the noisy client")
    }
}

/// CPU time of the agent's API threads (`http-api-<n>`), in nanoseconds.
fn api_cpu_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task: {e}"));
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            let api = name.trim().strip_prefix("http-api-")?;
            api.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// What the well-behaved client saw, alone and beside the other client, and what the other
/// client's bodies cost the API threads.
struct Neighbourhood {
    alone: Percentiles,
    beside: Percentiles,
    noisy: Vec<Duration>,
    /// API threads' CPU per body of the other client, beyond the well-behaved client's share.
    api_per_body: Duration,
}

/// The well-behaved client sends `typical` every `interval`, `requests` in all, in `windows`
/// windows that alternate between alone and beside the other client looping `body`: both halves
/// see the same machine, whatever else it runs meanwhile.
fn neighbourhood(
    pid: u32,
    port: u16,
    noisy_port: u16,
    body: Vec<u8>,
    requests: usize,
    interval: Duration,
    windows: usize,
) -> Neighbourhood {
    let noisy = Noisy::start(noisy_port, body);
    let mut client = Client::connect(port);
    client.timed("/v1/admit", TYPICAL.as_bytes());
    let per_window = (requests / (2 * windows)).max(1);
    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    let (mut api_alone, mut api_beside) = (0u64, 0u64);
    for _ in 0..windows {
        for on in [false, true] {
            noisy.set(on);
            let before = api_cpu_ns(pid);
            let mut due = Instant::now();
            for _ in 0..per_window {
                due += interval;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let took = client.timed("/v1/admit", TYPICAL.as_bytes());
                if on { &mut beside } else { &mut alone }.push(took);
            }
            let spent = api_cpu_ns(pid) - before;
            if on {
                api_beside += spent;
            } else {
                api_alone += spent;
            }
        }
    }
    noisy.set(false);
    let sent = noisy.finish();
    // The API threads' time beside the other client, less the well-behaved client's own share.
    let bodies = u64::try_from(sent.len().max(1)).unwrap_or(u64::MAX);
    let api_per_body = Duration::from_nanos(api_beside.saturating_sub(api_alone) / bodies);
    Neighbourhood {
        alone: Percentiles::of(&mut alone),
        beside: Percentiles::of(&mut beside),
        noisy: sent,
        api_per_body,
    }
}

fn main() {
    let args = parse_args();
    let tree = tempfile::Builder::new()
        .prefix("hugepage-agent-admit-size-")
        .tempdir()
        .expect("a temporary host tree under $TMPDIR");
    host_tree(tree.path());
    let largest = args.sizes.iter().copied().max().unwrap_or(1);

    println!(
        "size sweep (--max-containers {largest}), one request at a time, median of {}",
        args.repetitions
    );
    let agent = start(
        &args.agent,
        tree.path(),
        &["--max-containers".to_owned(), largest.to_string()],
    );
    let mut client = Client::connect(agent.port);
    let (r, pid) = (args.repetitions, agent.pid());
    sweep(
        &mut client,
        pid,
        "POST /v1/admit, short form, hugepages-2Mi: 2Mi each",
        "/v1/admit",
        &args.sizes,
        r,
        short,
    );
    sweep(
        &mut client,
        pid,
        "POST /v1/admit, v1.Pod, Guaranteed: cpu, memory, hugepages each",
        "/v1/admit",
        &args.sizes,
        r,
        |n| pod(n, 0),
    );
    sweep(
        &mut client,
        pid,
        "POST /v1/hints, v1.Pod, Guaranteed",
        "/v1/hints",
        &args.sizes,
        r,
        |n| pod(n, 0),
    );
    drop(client);
    typical(agent.port, "short form", TYPICAL.as_bytes(), args.requests);
    typical(agent.port, "v1.Pod", &pod(1, 0), args.requests);
    drop(agent);

    let max = DEFAULT_MAX_CONTAINERS as usize;
    println!(
        "noisy neighbour: an agent with the default flags (--max-containers {max}), the well-behaved client sends the typical pod every {} us, {} requests",
        args.interval.as_micros(),
        args.requests
    );
    let agent = start(&args.agent, tree.path(), &[]);
    let port = agent.port;
    let (status, answer) = Client::connect(port).post("/v1/admit", &largest_pod(max + 1));
    println!(
        "  one container more than --max-containers: {status} {}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&answer));
    let pid = agent.pid();
    // The control: the other client sends to another agent, so what the well-behaved client
    // loses there is the machine's (the clients and the other agent share its cores), not this
    // agent's.
    let other = start(&args.agent, tree.path(), &[]);
    for (label, body) in [
        (
            format!("v1.Pod, {max} containers, padded to the body limit"),
            largest_pod(max),
        ),
        (
            format!("short form, {max} containers, fewest bytes"),
            short_guaranteed(max),
        ),
    ] {
        let size = body.len();
        println!("  beside a client looping a {label} ({} KiB):", size / 1024);
        for (to, noisy_port) in [("this agent", port), ("another agent", other.port)] {
            let seen = neighbourhood(
                pid,
                port,
                noisy_port,
                body.clone(),
                args.requests,
                args.interval,
                10,
            );
            let (alone, beside) = (seen.alone, seen.beside);
            let mut sent = seen.noisy;
            println!(
                "    sending to {to:<13}  alone p99 {:>7.1} us  beside p50 {:>7.1} us  p99 {:>7.1} us  p99 ratio {:.2}{}",
                us(alone.p99),
                us(beside.median),
                us(beside.p99),
                beside.p99.as_secs_f64() / alone.p99.as_secs_f64(),
                if noisy_port == port {
                    " (target: 2 at most)"
                } else {
                    " (the machine's share)"
                }
            );
            if noisy_port == port {
                println!(
                    "      the other client: {} bodies, median {:.3} ms each; this agent's API threads' CPU per body {:.1} us",
                    sent.len(),
                    ms(median(&mut sent)),
                    us(seen.api_per_body)
                );
            }
        }
    }
}

/// `requests` sends of a one-container pod, back to back: median and p99.
fn typical(port: u16, label: &str, body: &[u8], requests: usize) {
    let mut client = Client::connect(port);
    client.timed("/v1/admit", body);
    let mut samples: Vec<Duration> = (0..requests)
        .map(|_| client.timed("/v1/admit", body))
        .collect();
    let p = Percentiles::of(&mut samples);
    println!(
        "typical pod, {label:<11} median {:>7.1} us  p99 {:>7.1} us",
        us(p.median),
        us(p.p99)
    );
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One container of the short form, Guaranteed, as `admit-load` sends it (no UID: no reservation).
const TYPICAL: &str = r#"{"pod":{"namespace":"bench","name":"dpdk-0","qosClass":"Guaranteed"},"containers":[{"name":"app","resources":{"hugepages-2Mi":"2Mi","memory":"1Gi"}}]}"#;
