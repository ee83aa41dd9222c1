//! `cargo xtask bench abuse`: what clients that misbehave cost a well-behaved one. The release
//! agent (`run`, `--ebpf off` over a generated host tree, plain HTTP on loopback, every limit at
//! its default) is asked `POST /v1/admit?dryRun=true` by one client over one connection kept
//! alive, as the webhook's pool keeps its own, at `--rate` admissions a second (default 200):
//! unloaded, then while each abuse runs from other threads:
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
//! reconnect at once (refused while the webhook makes them wait, `--abuse-backoff`).
//!
//! Then the webhook's places before authentication: a caller that opens a new connection for
//! each call (`POST /scheduler/filter` of a pod without hugepages over HTTP/1.1, from
//! 127.0.0.2, its own peer), unloaded and while another peer (127.0.0.1) keeps `--held`
//! connections (default 256, the webhook's `--max-connections`) open, renewing each as the
//! webhook closes it:
//!
//! * `tls-silent`: each completes its TLS handshake and sends nothing;
//! * `tls-stalled`: each connects and never begins its handshake.
//!
//! Each case is `--rounds` rounds (default 3) of `--seconds` (default 5) unloaded then
//! `--seconds` under the abuse, each side's samples pooled: a drift of the shared machine's
//! other load hits both sides alike. With `--cpus split` (the default) the abusing threads run
//! on the last CPU and everything else (the agent or webhook, the well-behaved client, the
//! stand-in API server) on the others, in both phases: an attacker's CPU is its own machine's,
//! not the node's, and what is measured is what the abuse makes the server do. `--cpus shared`
//! leaves all on every CPU.
//!
//! Per abuse it prints the well-behaved client's p50 and p99 unloaded, its p99 under the abuse,
//! the ratio, whether the target (p99 under abuse ≤ 2× unloaded) is met, what the abuse did, and
//! what the listener counted (`*_http_limited_total`). The soft limit of open files is raised
//! (`setrlimit`, inherited by the agent) to what the idle connections need.
//!
//! `abuse-load --agent PATH [--rate R] [--seconds S] [--rounds N] [--idle N] [--slowloris N]
//! [--resetters N] [--held N] [--cpus split|shared]`.

use std::{
    collections::VecDeque,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, BenchFlags, Percentiles,
    abusers::{self, KeptAlive},
    allowed_cpus,
    apiserver::StandInApiServer,
    cluster::{self, Pki, WEBHOOK_NAME},
    https::Https,
    mtls::{self, Connection, Versions},
    pin_this_thread, raise_open_files,
};
use rustls_pki_types::ServerName;

const USAGE: &str = "abuse-load --agent PATH [--rate R] [--seconds S] [--rounds N] [--idle N] [--slowloris N] [--resetters N] [--held N] [--cpus split|shared]";
const ADMIT: &str =
    r#"{"containers":[{"name":"a","resources":{"hugepages-2Mi":"2Mi"}}],"numaNodes":[0]}"#;
/// The target: the well-behaved client's p99 under an abuse at most this times its unloaded p99.
const TARGET: f64 = 2.0;

struct Args {
    rate: u64,
    seconds: u64,
    rounds: u64,
    idle: usize,
    slowloris: usize,
    resetters: usize,
    held: usize,
    /// The CPU the abusing threads run on (`--cpus split`), if kept apart.
    abuse_cpu: Option<usize>,
}

/// Keeps this thread, and what it starts from now on (the agent, the webhook, their threads),
/// off the last CPU, which it returns for the abusers.
fn split_cpus() -> usize {
    let cpus = allowed_cpus();
    let Some((&last, others)) = cpus.split_last().filter(|(_, o)| !o.is_empty()) else {
        panic!("--cpus split needs two CPUs at least; this process may run on {cpus:?}");
    };
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in others {
        // SAFETY: the CPU came from sched_getaffinity, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: the set is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
    last
}

/// An abuse running on threads of its own until told to stop; how many times it acted.
struct Running {
    stop: Arc<AtomicBool>,
    acts: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
    cpu: Option<usize>,
}

impl Running {
    fn new(args: &Args) -> Running {
        Running {
            stop: Arc::default(),
            acts: Arc::default(),
            threads: Vec::new(),
            cpu: args.abuse_cpu,
        }
    }

    /// Runs `act` in a loop on a thread (on the abusers' CPU) until stopped, counting each.
    fn looping(mut self, act: impl Fn() + Send + 'static) -> Running {
        let (stop, acts, cpu) = (self.stop.clone(), self.acts.clone(), self.cpu);
        self.threads.push(thread::spawn(move || {
            if let Some(cpu) = cpu {
                pin_this_thread(cpu);
            }
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
fn paced(args: &Args, ask: &mut dyn FnMut()) -> Vec<Duration> {
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

/// An abuse begun; ending it says how many times it acted.
type Begun = Box<dyn FnOnce() -> usize>;

/// One case: `--rounds` times the well-behaved client unloaded, then while the abuse `begin`
/// starts runs; each side's samples pooled. Prints its line; `what` names the abuse's acts.
fn case(name: &str, args: &Args, ask: &mut dyn FnMut(), begin: &dyn Fn() -> Begun, what: &str) {
    let (mut unloaded, mut loaded, mut acts) = (Vec::new(), Vec::new(), 0);
    for _ in 0..args.rounds {
        unloaded.extend(paced(args, ask));
        let running = begin();
        loaded.extend(paced(args, ask));
        acts += running();
        // The listener closes what the abuse left before the next round's unloaded phase.
        thread::sleep(Duration::from_secs(1));
    }
    let unloaded = Percentiles::of(&mut unloaded);
    let loaded = Percentiles::of(&mut loaded);
    let ratio = loaded.p99.as_secs_f64() / unloaded.p99.as_secs_f64();
    let met = if ratio <= TARGET { "met" } else { "NOT met" };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<10} unloaded p50 {:.3} ms p99 {:.3} ms ({} asked) | under abuse p50 {:.3} ms p99 {:.3} ms ({} asked) | ratio {ratio:.2} | target <= {TARGET}x {met} | {acts} {what} in {} rounds",
        ms(unloaded.median),
        ms(unloaded.p99),
        unloaded.count,
        ms(loaded.median),
        ms(loaded.p99),
        loaded.count,
        args.rounds,
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
            "--rounds",
            "--idle",
            "--slowloris",
            "--resetters",
            "--held",
            "--cpus",
        ],
    );
    let bin = flags.path("--agent");
    let count = |name, default| usize::try_from(flags.number(name, default)).unwrap_or(usize::MAX);
    let abuse_cpu = match flags.word("--cpus", "split") {
        "split" => Some(split_cpus()),
        "shared" => None,
        other => panic!("--cpus {other}: split or shared\n{USAGE}"),
    };
    let args = Args {
        rate: flags.number("--rate", 200),
        seconds: flags.number("--seconds", 5),
        rounds: flags.number("--rounds", 3).max(1),
        idle: count("--idle", 3000),
        slowloris: count("--slowloris", 1000),
        resetters: count("--resetters", 2),
        held: count("--held", 256),
        abuse_cpu,
    };
    println!(
        "{}",
        raise_open_files((args.idle + args.slowloris + args.held) as u64 * 2 + 4096)
    );
    match args.abuse_cpu {
        Some(cpu) => println!(
            "abusing threads on CPU {cpu}; the server and the well-behaved client on CPUs {:?}",
            allowed_cpus()
        ),
        None => println!("every thread on every CPU (--cpus shared)"),
    }
    agent_cases(&bin, &args);
    webhook_case(&bin, &args);
    webhook_places(&bin, &args);
}

/// The webhook's places before authentication: a new connection per call from its own peer,
/// unloaded and while another peer holds `--held` connections that handshake and say nothing,
/// or never handshake.
fn webhook_places(bin: &Path, args: &Args) {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let webhook = cluster::webhook(bin, &pki, &api, 1, "ignore", "2s", &[]);
    let port = webhook.port;
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    let name = ServerName::try_from(WEBHOOK_NAME).expect("a DNS name");
    let good = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let body = cluster::args(cluster::pod(None), &[]).to_string();
    let mut filter = || {
        let mut conn = Connection::open_from(good, port, config.clone(), name.clone())
            .expect("the well-behaved caller connects");
        let answer = conn
            .request("POST", "/scheduler/filter", Some("application/json"), &body)
            .expect("the well-behaved caller is answered");
        assert_eq!(answer.status, 200, "{}", answer.body);
    };
    for _ in 0..50 {
        filter();
    }
    println!(
        "webhook: POST /scheduler/filter over HTTP/1.1, a new connection each from 127.0.0.2 at {}/s, {} rounds of {} s unloaded and {} s while 127.0.0.1 holds {} connections",
        args.rate, args.rounds, args.seconds, args.seconds, args.held
    );
    let held = args.held;
    let (handshaked, name2) = (config.clone(), name.clone());
    let begin_silent = move || -> Begun {
        let (config, name) = (handshaked.clone(), name2.clone());
        let open: Mutex<VecDeque<Connection>> = Mutex::default();
        let running = Running::new(args).looping(move || {
            let Ok(tcp) = abusers::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))) else {
                return;
            };
            let mut open = open.lock().expect("the abuser's own list");
            if let Ok(conn) = Connection::over(tcp, config.clone(), name.clone()) {
                open.push_back(conn);
            }
            if open.len() > held {
                open.pop_front();
            }
        });
        Box::new(move || running.end())
    };
    case(
        "tls-silent",
        args,
        &mut filter,
        &begin_silent,
        "connections tried from 127.0.0.1 (handshaked, then silent)",
    );
    let begin_stalled = move || -> Begun {
        let open: Mutex<VecDeque<TcpStream>> = Mutex::default();
        let running = Running::new(args).looping(move || {
            let mut open = open.lock().expect("the abuser's own list");
            if let Ok(tcp) = abusers::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))) {
                open.push_back(tcp);
            }
            if open.len() > held {
                open.pop_front();
            }
        });
        Box::new(move || running.end())
    };
    case(
        "tls-stalled",
        args,
        &mut filter,
        &begin_stalled,
        "connections tried from 127.0.0.1 (never handshaking)",
    );
    let metrics = cluster::metrics(&pki, &webhook);
    let limited = |limit: &str| {
        let series = format!(
            "hugepage_agent_webhook_http_limited_total{{listener=\"webhook\",limit=\"{limit}\"}}"
        );
        sample(&metrics, &series)
    };
    let timeouts = sample(
        &metrics,
        "hugepage_agent_webhook_tls_handshake_failures_total{reason=\"timeout\"}",
    );
    println!(
        "webhook counted: max_connections_per_peer {}, max_handshakes {}, max_connections {}, idle {}; handshakes timed out {timeouts}",
        limited("max_connections_per_peer"),
        limited("max_handshakes"),
        limited("max_connections"),
        limited("idle"),
    );
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
    println!(
        "agent: POST /v1/admit?dryRun=true at {}/s, {} rounds of {} s unloaded and {} s under each abuse, one kept-alive connection",
        args.rate, args.rounds, args.seconds, args.seconds
    );

    // Idle connections: opened before the measurement, held through it.
    let (idle, cpu) = (args.idle, args.abuse_cpu);
    let begin_idle = move || -> Begun {
        let opened = on_abuse_cpu(cpu, move || {
            let mut held: Vec<TcpStream> = Vec::with_capacity(idle);
            for _ in 0..idle {
                match abusers::silent(at) {
                    Ok(s) => held.push(s),
                    Err(e) => {
                        println!("idle: stopped opening at {}: {e}", held.len());
                        break;
                    }
                }
            }
            held
        });
        Box::new(move || {
            let n = opened.len();
            drop(opened);
            n
        })
    };
    case(
        "idle",
        args,
        &mut admit,
        &begin_idle,
        "connections opened and left silent",
    );

    // Slowloris: heads that grow a byte a second and never end.
    let slowloris = args.slowloris;
    let begin_slow = move || -> Begun {
        let mut slow: Vec<TcpStream> = on_abuse_cpu(cpu, move || {
            (0..slowloris)
                .filter_map(|_| abusers::slow_head(at).ok())
                .collect()
        });
        let opened = slow.len();
        let stop = Arc::new(AtomicBool::new(false));
        let dripper = {
            let stop = stop.clone();
            thread::spawn(move || {
                use std::io::Write;
                if let Some(cpu) = cpu {
                    pin_this_thread(cpu);
                }
                while !stop.load(Ordering::Relaxed) {
                    for s in &mut slow {
                        let _ = s.write_all(b"a");
                    }
                    thread::sleep(Duration::from_secs(1));
                }
            })
        };
        Box::new(move || {
            stop.store(true, Ordering::Relaxed);
            dripper.join().expect("the dripper");
            opened
        })
    };
    case(
        "slowloris",
        args,
        &mut admit,
        &begin_slow,
        "heads sent a byte a second",
    );

    let begin_oversized = || -> Begun {
        let running = Running::new(args).looping(move || {
            let _ = abusers::oversized_head(at, 70 << 10);
        });
        Box::new(move || running.end())
    };
    case(
        "oversized",
        args,
        &mut admit,
        &begin_oversized,
        "heads of 70 KiB",
    );

    let begin_garbage = || -> Begun {
        let running = Running::new(args).looping(move || {
            let _ = abusers::garbage(at);
        });
        Box::new(move || running.end())
    };
    case(
        "garbage",
        args,
        &mut admit,
        &begin_garbage,
        "connections of garbage",
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

/// Runs `open` on a thread on the abusers' CPU (when kept apart), so that the abuse's
/// connections are opened there too; what it returns.
fn on_abuse_cpu<T: Send + 'static>(
    cpu: Option<usize>,
    open: impl FnOnce() -> T + Send + 'static,
) -> T {
    thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_this_thread(cpu);
        }
        open()
    })
    .join()
    .expect("opening the abuse's connections")
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
    println!(
        "webhook: POST /admission/validate over HTTP/2 at {}/s, {} rounds of {} s unloaded and {} s under the abuse, one connection",
        args.rate, args.rounds, args.seconds, args.seconds
    );
    let streams = Arc::new(AtomicUsize::new(0));
    let begin_resets = || -> Begun {
        let mut resetting = Running::new(args);
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
        Box::new(move || resetting.end())
    };
    case(
        "h2-reset",
        args,
        &mut review,
        &begin_resets,
        "connections tried (ended by GOAWAY, or refused while their peer waits)",
    );
    let (_, metrics) = client.request("GET", "/metrics", &[], "");
    let count = |limit: &str| {
        let series = format!(
            "hugepage_agent_webhook_http_limited_total{{listener=\"webhook\",limit=\"{limit}\"}}"
        );
        sample(&metrics, &series)
    };
    println!(
        "webhook counted: http2_abuse {}, abuse_backoff {}; {} streams reset in all",
        count("http2_abuse"),
        count("abuse_backoff"),
        streams.load(Ordering::Relaxed)
    );
}
