//! `cargo xtask bench abuse`: what clients that misbehave cost a well-behaved one. The release
//! agent (`run`, `--ebpf off` over a generated host tree, plain HTTP on loopback, every limit at
//! its default) is asked `POST /v1/admit?dryRun=true` by one client over one connection kept
//! alive, as the webhook's pool keeps its own, at `--rate` admissions a second (default 200),
//! for `--seconds` (default 5): unloaded, then while each abuse runs from other threads:
//!
//! * `idle`: `--idle` connections (default 3,000) opened and left silent: the first
//!   `--max-connections` (1,024) are held until the header time-out, the rest refused at accept;
//! * `slowloris`: `--slowloris` connections (default 1,000) each sending a request head a byte
//!   a second, never ending it;
//! * `oversized`: heads of 70 KiB (over the 64 KiB read buffer) in a loop, each answered 431;
//! * `garbage`: bytes that are not HTTP in a loop, each answered 400.
//!
//! Then the release webhook (HTTPS, its Node cache from the stand-in API server) is asked its
//! `POST /admission/validate` (a pod without hugepages, allowed without asking an agent) the
//! same way over HTTP/2, unloaded and while `--resetters` connections (default 2) each open and
//! reset HTTP/2 streams in a loop until the webhook ends the connection with GOAWAY, then
//! reconnect.
//!
//! Per abuse it prints the well-behaved client's p50 and p99 unloaded, its p99 under the abuse,
//! the ratio, whether the target (p99 under abuse ≤ 2× unloaded) is met, what the abuse did, and
//! what the listener counted (`*_http_limited_total`). The soft limit of open files is raised
//! (`setrlimit`, inherited by the agent) to what the idle connections need.
//!
//! `abuse-load --agent PATH [--rate R] [--seconds S] [--idle N] [--slowloris N]
//! [--resetters N]`.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, BenchFlags, Percentiles,
    abusers::{self, KeptAlive},
    apiserver::StandInApiServer,
    cluster::{self, Pki, WEBHOOK_NAME},
    https::Https,
    mtls::{self, Versions},
    raise_open_files,
};

const USAGE: &str =
    "abuse-load --agent PATH [--rate R] [--seconds S] [--idle N] [--slowloris N] [--resetters N]";
const ADMIT: &str =
    r#"{"containers":[{"name":"a","resources":{"hugepages-2Mi":"2Mi"}}],"numaNodes":[0]}"#;
/// The target: the well-behaved client's p99 under an abuse at most this times its unloaded p99.
const TARGET: f64 = 2.0;

struct Args {
    rate: u64,
    seconds: u64,
    idle: usize,
    slowloris: usize,
    resetters: usize,
}

/// An abuse running on threads of its own until told to stop; how many times it acted.
struct Running {
    stop: Arc<AtomicBool>,
    acts: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Running {
    fn new() -> Running {
        Running {
            stop: Arc::default(),
            acts: Arc::default(),
            threads: Vec::new(),
        }
    }

    /// Runs `act` in a loop on a thread until stopped, counting each.
    fn looping(mut self, act: impl Fn() + Send + 'static) -> Running {
        let (stop, acts) = (self.stop.clone(), self.acts.clone());
        self.threads.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                act();
                acts.fetch_add(1, Ordering::Relaxed);
            }
        }));
        self
    }

    fn end(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("an abuse thread");
        }
        self.acts.load(Ordering::Relaxed)
    }
}

/// The well-behaved client's latencies: `ask` at `rate` a second for `seconds`.
fn paced(args: &Args, mut ask: impl FnMut()) -> Vec<Duration> {
    let every = Duration::from_secs(1) / u32::try_from(args.rate.max(1)).unwrap_or(u32::MAX);
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let mut next = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < end {
        let started = Instant::now();
        ask();
        samples.push(started.elapsed());
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
    samples
}

/// One line of the table: the abuse, the unloaded and the loaded figures, what the abuse did.
fn report(name: &str, unloaded: &Percentiles, mut loaded: Vec<Duration>, did: &str) {
    let loaded = Percentiles::of(&mut loaded);
    let ratio = loaded.p99.as_secs_f64() / unloaded.p99.as_secs_f64();
    let met = if ratio <= TARGET { "met" } else { "NOT met" };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<10} unloaded p50 {:.3} ms p99 {:.3} ms | under abuse p50 {:.3} ms p99 {:.3} ms ({} asked) | ratio {ratio:.2} | target <= {TARGET}x {met} | {did}",
        ms(unloaded.median),
        ms(unloaded.p99),
        ms(loaded.median),
        ms(loaded.p99),
        loaded.count,
    );
}

/// `series` (name and labels, as written) in the exposition `text`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() {
    let flags = BenchFlags::parse(
        USAGE,
        &[
            "--agent",
            "--rate",
            "--seconds",
            "--idle",
            "--slowloris",
            "--resetters",
        ],
    );
    let bin = flags.path("--agent");
    let count = |name, default| usize::try_from(flags.number(name, default)).unwrap_or(usize::MAX);
    let args = Args {
        rate: flags.number("--rate", 200),
        seconds: flags.number("--seconds", 5),
        idle: count("--idle", 3000),
        slowloris: count("--slowloris", 1000),
        resetters: count("--resetters", 2),
    };
    println!(
        "{}",
        raise_open_files((args.idle + args.slowloris) as u64 * 2 + 4096)
    );
    agent_cases(&bin, &args);
    webhook_case(&bin, &args);
}

/// The agent: unloaded, then each abuse of HTTP/1.1.
fn agent_cases(bin: &Path, args: &Args) {
    let tree = cluster::host_tree(2048);
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree.path())
        .args(["--ebpf", "off", "--topology-policy", "single-numa-node"])
        .args(["--memory-manager-policy", "Static"]);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, agent.port));
    let mut client = KeptAlive::connect(at).expect("connect");
    let mut admit = || {
        let (status, answer) = client
            .request("POST", "/v1/admit?dryRun=true", ADMIT)
            .expect("the well-behaved client is answered");
        assert_eq!(status, 200, "{answer}");
    };
    for _ in 0..200 {
        admit();
    }
    let unloaded = Percentiles::of(&mut paced(args, &mut admit));
    println!(
        "agent: POST /v1/admit?dryRun=true at {}/s for {} s per case, one kept-alive connection",
        args.rate, args.seconds
    );

    // Idle connections: opened before the measurement, held through it.
    let mut idle: Vec<TcpStream> = Vec::with_capacity(args.idle);
    for _ in 0..args.idle {
        match abusers::silent(at) {
            Ok(s) => idle.push(s),
            Err(e) => {
                println!("idle: stopped opening at {}: {e}", idle.len());
                break;
            }
        }
    }
    let opened = idle.len();
    let loaded = paced(args, &mut admit);
    drop(idle);
    let did = format!("{opened} connections opened and left silent");
    report("idle", &unloaded, loaded, &did);
    thread::sleep(Duration::from_secs(1));

    // Slowloris: heads that grow a byte a second and never end.
    let mut slow: Vec<TcpStream> = (0..args.slowloris)
        .filter_map(|_| abusers::slow_head(at).ok())
        .collect();
    let opened = slow.len();
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = {
        let stop = stop.clone();
        thread::spawn(move || {
            use std::io::Write;
            while !stop.load(Ordering::Relaxed) {
                for s in &mut slow {
                    let _ = s.write_all(b"a");
                }
                thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let loaded = paced(args, &mut admit);
    stop.store(true, Ordering::Relaxed);
    dripper.join().expect("the dripper");
    report(
        "slowloris",
        &unloaded,
        loaded,
        &format!("{opened} heads, a byte a second each"),
    );
    thread::sleep(Duration::from_secs(1));

    let oversized = Running::new().looping(move || {
        let _ = abusers::oversized_head(at, 70 << 10);
    });
    let loaded = paced(args, &mut admit);
    let n = oversized.end();
    report(
        "oversized",
        &unloaded,
        loaded,
        &format!("{n} heads of 70 KiB"),
    );

    let garbage = Running::new().looping(move || {
        let _ = abusers::garbage(at);
    });
    let loaded = paced(args, &mut admit);
    let n = garbage.end();
    report(
        "garbage",
        &unloaded,
        loaded,
        &format!("{n} connections of garbage"),
    );

    let (_, metrics) = client.request("GET", "/metrics", "").expect("metrics");
    let counted: Vec<String> = [
        "max_connections",
        "header_timeout",
        "head_too_large",
        "malformed",
    ]
    .iter()
    .map(|limit| {
        let series =
            format!("hugepage_agent_http_limited_total{{listener=\"api\",limit=\"{limit}\"}}");
        format!("{limit} {}", sample(&metrics, &series))
    })
    .collect();
    println!("agent counted: {}", counted.join(", "));
}

/// The webhook over HTTP/2: unloaded, then under reset loops.
fn webhook_case(bin: &Path, args: &Args) {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let webhook = cluster::webhook(bin, &pki, &api, 1, "ignore", "2s", &[]);
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, webhook.port));
    let mut config = (*mtls::client_config(&[&pki.webhook], None, Versions::Any)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let h2 = Arc::new(config);
    let mut client = Https::connect(at, h2.clone(), WEBHOOK_NAME);
    let mut n = 0;
    let mut review = || {
        n += 1;
        let body = abusers::plain_pod_review(&format!("review-{n}")).to_string();
        let (status, answer) = client.request("POST", "/admission/validate", &[], &body);
        assert_eq!(status, 200, "{answer}");
    };
    for _ in 0..200 {
        review();
    }
    let unloaded = Percentiles::of(&mut paced(args, &mut review));
    println!(
        "webhook: POST /admission/validate over HTTP/2 at {}/s for {} s, one connection",
        args.rate, args.seconds
    );
    let streams = Arc::new(AtomicUsize::new(0));
    let mut resetting = Running::new();
    for _ in 0..args.resetters {
        let (h2, streams) = (h2.clone(), streams.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        resetting = resetting.looping(move || {
            let ended = runtime.block_on(abusers::reset_loop(
                at,
                h2.clone(),
                WEBHOOK_NAME,
                "/admission/validate",
                1_000_000,
            ));
            if let Ok(ended) = ended {
                streams.fetch_add(ended.streams, Ordering::Relaxed);
            }
        });
    }
    let loaded = paced(args, &mut review);
    let connections = resetting.end();
    let did = format!(
        "{connections} connections ended by GOAWAY after {} streams reset in all",
        streams.load(Ordering::Relaxed)
    );
    report("h2-reset", &unloaded, loaded, &did);
    let (_, metrics) = client.request("GET", "/metrics", &[], "");
    let series =
        "hugepage_agent_webhook_http_limited_total{listener=\"webhook\",limit=\"http2_abuse\"}";
    println!("webhook counted: http2_abuse {}", sample(&metrics, series));
}
