//! Benchmarks: built in release mode and run as binaries that print their figures.

use anyhow::Result;
use clap::ValueEnum;

use crate::{
    cmd::{self, Env},
    setup,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Bench {
    /// ns per ordinary 4 KiB fault: no probe, cgroup-filter mode, watch-everything mode.
    ProbeOverhead,
    /// One in-process verification: 2 sizes x 8 nodes on tmpfs, and this host's sysfs.
    Verify,
    /// PSI: one evaluation tick, and from a kernel trigger to the published conditions.
    Psi,
    /// The cgroup inventory: a 5,000-cgroup tree, and cgroup events at 10,000/s on the kernel.
    Inventory,
    /// One walk of the hugepages' holders (files, segments, memfds, every process's mappings
    /// and descriptors) with 64 files held by nothing that runs, as the host's processes grow
    /// to 2,000: median, p99, CPU per walk.
    Holders,
    /// POST /v1/admit over loopback under `oha`: a fixed rate, then unthrottled.
    AdmitLoad,
    /// Hint generation and merge for 8 NUMA nodes x 3 memory types.
    Hints,
    /// POST /v1/admit and /v1/hints for pods of 10 to 4,000 containers in both forms, a typical
    /// pod, and a well-behaved client's p99 beside another sending the largest bodies allowed.
    AdmitSize,
    /// admit-load with tracing off, exporting every span and 1 % of traces to a real OTLP
    /// receiver: the ratios to tracing off, and the CPU each costs.
    AdmitTrace,
    /// admit-load over plain HTTP and over TLS with a client certificate (connections kept
    /// alive), alternating: the ratios TLS / plain.
    AdmitTls,
    /// The webhook's scheduler-extender filter over 10, 100 and 1,000 nodes in both forms
    /// (`nodenames` from its Node cache, `nodes`), against real agents: p50, p99, calls/s, RSS.
    Extender,
    /// A well-behaved client's p99 unloaded and while clients misbehave: idle connections,
    /// slowloris heads, oversized heads, garbage (the agent), HTTP/2 reset loops (the webhook).
    Abuse,
    /// The webhook's and an agent's peak memory and their callers' p99 while request bodies
    /// flood them: at each endpoint's limit, declared or chunked past it, a byte a second.
    BodyFlood,
    /// From a hugetlb fault on this host's kernel to the agent's map, and to a watcher of the
    /// map (`GET /v1/hugepages?watch=true`): p50, p99.
    Freshness,
    /// The agent with eBPF on under admissions in bursts, cgroup churn, hugetlb faults, PSI
    /// triggers, scrapes and reservation expiries for 10 minutes (`--minutes M`): its RSS,
    /// descriptors, threads, ring-buffer losses and admission p99 every 10 s, and their slopes.
    Soak,
    /// The webhook's memory per idle watched agent connection, 1,000 and 5,000 of them against
    /// the real agent: its own HTTP/1.1 streams against hyper's HTTP/2 client, each design in a
    /// process of its own (VmRSS and VmHWM before and after).
    ConnMemory,
}

pub fn run(env: &Env, which: Bench, args: &[String]) -> Result<()> {
    let release = cmd::target_dir().join("release");
    let (binary, mut all) = match which {
        Bench::ProbeOverhead => ("probe-overhead", Vec::new()),
        Bench::Verify => ("verify-latency", Vec::new()),
        Bench::Psi => ("psi-latency", Vec::new()),
        Bench::Hints => ("hints-latency", Vec::new()),
        Bench::Holders => ("holders-walk", Vec::new()),
        Bench::Inventory
        | Bench::AdmitSize
        | Bench::Extender
        | Bench::Abuse
        | Bench::BodyFlood
        | Bench::Freshness
        | Bench::Soak
        | Bench::ConnMemory => {
            cmd::cargo(env, &["build", "--release", "--package", "hugepage-agent"])?;
            let agent = release.join("hugepage-agent");
            let binary = match which {
                Bench::AdmitSize => "admit-size",
                Bench::Extender => "extender-load",
                Bench::Abuse => "abuse-load",
                Bench::BodyFlood => "body-flood",
                Bench::Soak => "soak",
                Bench::Freshness => "freshness",
                Bench::ConnMemory => "conn-memory",
                _ => "inventory-load",
            };
            (
                binary,
                vec!["--agent".to_owned(), agent.display().to_string()],
            )
        }
        Bench::AdmitLoad | Bench::AdmitTrace | Bench::AdmitTls => {
            let oha = setup::ensure_oha()?;
            cmd::cargo(env, &["build", "--release", "--package", "hugepage-agent"])?;
            let agent = release.join("hugepage-agent");
            let mut all = vec![
                "--agent".to_owned(),
                agent.display().to_string(),
                "--oha".to_owned(),
                oha.display().to_string(),
            ];
            if which == Bench::AdmitTrace {
                // Nine short rounds: the two shared cores drift from run to run by more than
                // the 10 % the comparison looks for. Flags given after `--` come later and win.
                all.extend(
                    ["--tracing", "compare", "--rounds", "9", "--seconds", "5"].map(String::from),
                );
            }
            if which == Bench::AdmitTls {
                // The same short alternating rounds: TLS with a client certificate against
                // plain HTTP, both over kept-alive connections, the load tool's TLS on other
                // CPUs than the agent's (a webhook's is on another machine).
                all.extend(
                    [
                        "--tls",
                        "compare",
                        "--cpus",
                        "split",
                        "--rounds",
                        "9",
                        "--seconds",
                        "5",
                    ]
                    .map(String::from),
                );
            }
            ("admit-load", all)
        }
    };
    cmd::cargo(
        env,
        &[
            "build",
            "--release",
            "--package",
            "hugepage-agent-tests",
            "--bin",
            binary,
            "--bin",
            "toucher",
        ],
    )?;
    all.extend_from_slice(args);
    cmd::exec(env, &release.join(binary), &all)
}
