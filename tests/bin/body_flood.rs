//! `cargo xtask bench body-flood`: what a flood of request bodies costs the webhook's memory and
//! its callers (#38), and the same for a node's agent.
//!
//! The release webhook, with every flag at its shipped default (`--body-budget` 64Mi,
//! `--max-connections` 256, the endpoints' limits, `--body-read-timeout` 30s), its Node cache
//! from the stand-in API server, one Node whose release agent answers over mTLS. Its two real
//! callers ask every 100 ms (the scheduler's filter over HTTP/1.1, the API server's review over
//! HTTP/2): first alone for `--seconds` (default 15), then as long again while the floods of
//! `tests/flood.rs` run (bodies just under each endpoint's limit, declared over it, chunked
//! past it, a byte a second). Then the release agent (mTLS, `--ebpf off` over a host tree,
//! `--body-budget` 16Mi by default) alone and under the same floods on its `/v1/admit` with
//! 1 MiB bodies, asked a dry run every 100 ms as the webhook asks it.
//!
//! The floods' threads run on the last CPU (an attacker's client is its own machine's load);
//! the processes and their callers on any.
//!
//! Printed per process: its RSS before, its peak while flooded (`VmHWM`, reset before the
//! flood) against its Deployment's or DaemonSet's memory limit, each caller's median, p99 and
//! maximum alone and flooded, and what the floods were answered.
//!
//! `body-flood --agent PATH [--seconds S]`.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use hugepage_agent_tests::{
    Agent, BenchFlags, Footprint, Percentiles,
    apiserver::StandInApiServer,
    cluster::{self, Pki},
    flood::{self, Caller, Tally, Target, Wave},
    free_port,
    mtls::{self, SERVER_NAME, Versions},
    raise_open_files,
};

const USAGE: &str = "body-flood --agent PATH [--seconds S]";
/// The DaemonSet's memory limit (`deploy/daemonset.yaml`).
const AGENT_MEMORY_LIMIT: u64 = 80 << 20;

/// The callers' times over a phase of `seconds`, with the floods of `waves` or without.
fn phase(
    target: &Target,
    process: &Agent,
    callers: &[Caller],
    waves: &[Wave],
    seconds: u64,
) -> (Vec<(Caller, Percentiles, usize)>, Footprint, Arc<Tally>) {
    Footprint::reset_peak(process.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let asking: Vec<_> = callers
        .iter()
        .map(|c| (*c, flood::call(target, *c, "worker-1", &stop)))
        .collect();
    let floods: Vec<_> = waves
        .iter()
        .flat_map(|w| flood::start(target, w, &stop, &tally))
        .collect();
    let mut peak = Footprint::of(process.pid());
    for _ in 0..seconds * 5 {
        thread::sleep(Duration::from_millis(200));
        let now = Footprint::of(process.pid());
        if now.peak_rss_kib > peak.peak_rss_kib {
            peak = now;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        let _ = f.join();
    }
    let times = asking
        .into_iter()
        .map(|(c, t)| {
            let mut calls = t.join().expect("a caller thread");
            let failed = calls.statuses.iter().filter(|s| **s != 200).count();
            (c, Percentiles::of(&mut calls.took), failed)
        })
        .collect();
    let last = Footprint::of(process.pid());
    if last.peak_rss_kib > peak.peak_rss_kib {
        peak = last;
    }
    (times, peak, tally)
}

/// Both phases against one process, printed.
fn measure(
    what: &str,
    target: &Target,
    process: &Agent,
    callers: &[Caller],
    waves: &[Wave],
    limit: u64,
    seconds: u64,
) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let before = Footprint::of(process.pid());
    let (alone, _, _) = phase(target, process, callers, &[], seconds);
    let (flooded, peak, tally) = phase(target, process, callers, waves, seconds);
    println!("{what}");
    println!(
        "  RSS before {:.1} MiB; peak while flooded {:.1} MiB (memory limit {} MiB)",
        mib(before.rss_kib),
        mib(peak.peak_rss_kib),
        limit >> 20
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for ((caller, a, a_failed), (_, f, f_failed)) in alone.iter().zip(&flooded) {
        println!(
            "  {caller:?}: alone median {:.2} ms p99 {:.2} ms max {:.2} ms ({} calls, {a_failed} not 200); flooded median {:.2} ms p99 {:.2} ms max {:.2} ms ({} calls, {f_failed} not 200)",
            ms(a.median),
            ms(a.p99),
            ms(a.max),
            a.count,
            ms(f.median),
            ms(f.p99),
            ms(f.max),
            f.count
        );
    }
    for ((kind, status), n) in tally.answers() {
        println!("  flood {:<24} answered {status:>3}: {n}", kind.name());
    }
}

fn main() {
    let flags = BenchFlags::parse(USAGE, &["--agent", "--seconds"]);
    let bin = flags.path("--agent");
    let seconds = flags.number("--seconds", 15);
    println!("{}", raise_open_files(4096));
    let cpu = flood::flood_cpu();
    println!("the floods' threads on CPU {cpu:?}, everything else on any CPU");
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let ip = Ipv4Addr::new(127, 0, 0, 2);
    api.put_node(cluster::node("worker-1", ip, "8Gi"));
    let port = free_port();
    let tree = cluster::host_tree(2048);
    let agent_cmd = cluster::tree_agent_command(&bin, &pki, tree.path(), &[]);
    let agent = cluster::start_agent(agent_cmd, ip, port, |_| true);
    let webhook = cluster::webhook(&bin, &pki, &api, port, "ignore", "2s", &[]);
    cluster::wait_ready(&pki, &webhook, Duration::from_secs(20));

    let target = Target::webhook(&pki, webhook.port);
    measure(
        "webhook (--body-budget 64Mi, --max-connections 256)",
        &target,
        &webhook,
        &[Caller::Scheduler, Caller::ApiServer],
        &flood::webhook_waves(cpu),
        flood::MEMORY_LIMIT_BYTES,
        seconds,
    );

    let to_agent = mtls::client_config(&[&pki.agents], Some(&pki.client), Versions::Any);
    let target = Target {
        addr: SocketAddr::new(ip.into(), port),
        name: SERVER_NAME,
        http1: to_agent.clone(),
        h2: to_agent,
    };
    measure(
        "agent (--body-budget 16Mi, --max-connections 1024, mTLS)",
        &target,
        &agent,
        &[Caller::Webhook],
        &flood::agent_waves(cpu),
        AGENT_MEMORY_LIMIT,
        seconds,
    );
}
