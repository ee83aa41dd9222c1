//! `cargo xtask bench admit-load`: `POST /v1/admit` over loopback under a real load tool.
//!
//! Starts the release agent (eBPF as `--ebpf` auto gives it, logs to a file) and the load tool
//! in a cgroup whose hugetlb limits are 0, as the agent's own pod would be, waits for
//! `/readyz`, warms up, then drives it with `oha` over `--connections` connections: at a fixed
//! offered rate (`--rate`), latency-corrected (a stall is charged to every request it delayed)
//! and measured from the actual send, then as fast as it goes.
//! Prints achieved throughput and the latency percentiles `oha` measured, and every non-200
//! answer and transport error. The target is 20,000 requests/s with p99 under 2 ms; the load tool shares the
//! machine's two cores with the agent, so the figures are a floor for a real node.
//!
//! `admit-load --agent PATH --oha PATH [--rate R] [--connections C] [--seconds S]`
//! (defaults 20000, 50, 10).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use hugepage_agent_tests::{
    BenchFlags, HugetlbController, TestCgroup, free_port, host_lock, http, spawn_in, wait_ready,
    wait_timeout,
};

struct Args {
    agent: PathBuf,
    oha: PathBuf,
    rate: u32,
    connections: u32,
    seconds: u32,
}

fn parse_args() -> Args {
    let flags = BenchFlags::parse(
        "admit-load --agent PATH --oha PATH [--rate R] [--connections C] [--seconds S]",
        &["--agent", "--oha", "--rate", "--connections", "--seconds"],
    );
    Args {
        agent: flags.path("--agent"),
        oha: flags.path("--oha"),
        rate: flags.number("--rate", 20_000) as u32,
        connections: flags.number("--connections", 50) as u32,
        seconds: flags.number("--seconds", 10) as u32,
    }
}

/// What `oha --output-format json` reported, as numbers.
#[derive(Debug, Default, PartialEq)]
struct LoadReport {
    requests_per_sec: f64,
    /// `p50`, `p99`, `p99.9`, … → seconds.
    latency: BTreeMap<String, f64>,
    /// HTTP status → count.
    statuses: BTreeMap<String, u64>,
    /// Transport error → count.
    errors: BTreeMap<String, u64>,
}

fn parse_oha(json: &str) -> Result<LoadReport, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let numbers = |key: &str| -> BTreeMap<String, f64> {
        v[key]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let counts = |key: &str| {
        numbers(key)
            .into_iter()
            .map(|(k, n)| (k, n as u64))
            .collect()
    };
    Ok(LoadReport {
        requests_per_sec: v["summary"]["requestsPerSec"]
            .as_f64()
            .ok_or("no summary.requestsPerSec")?,
        latency: numbers("latencyPercentiles"),
        statuses: counts("statusCodeDistribution"),
        errors: counts("errorDistribution"),
    })
}

/// How `oha` offers load.
#[derive(Clone, Copy)]
enum Load {
    /// As fast as the connections go.
    Unthrottled,
    /// A fixed rate; `corrected` charges a stall to every request it delayed (coordinated
    /// omission), otherwise latency is measured from the actual send.
    Fixed { rate: u32, corrected: bool },
}

/// One `oha` run against `url`.
fn oha(
    args: &Args,
    pod: &TestCgroup,
    url: &str,
    body: &str,
    seconds: u32,
    load: Load,
) -> LoadReport {
    let mut cmd = Command::new(&args.oha);
    spawn_in(&mut cmd, pod);
    cmd.args(["--no-tui", "--output-format", "json", "-z"])
        .arg(format!("{seconds}s"))
        .args(["-c", &args.connections.to_string()]);
    if let Load::Fixed { rate, corrected } = load {
        cmd.args(["-q", &rate.to_string()]);
        if corrected {
            cmd.arg("--latency-correction");
        }
    }
    cmd.args(["-m", "POST", "-T", "application/json", "-d", body, url]);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", args.oha.display()));
    assert!(
        out.status.success(),
        "oha failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_oha(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("reading oha's JSON: {e}"))
}

fn print(label: &str, r: &LoadReport) {
    let ms = |p: &str| r.latency.get(p).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "{label:<44} {:>9.0} req/s  p50 {:6.3} ms  p99 {:6.3} ms  p99.9 {:6.3} ms  statuses {:?}",
        r.requests_per_sec,
        ms("p50"),
        ms("p99"),
        ms("p99.9"),
        r.statuses
    );
    for (e, n) in &r.errors {
        println!("    error x{n}: {e}");
    }
}

fn main() {
    let args = parse_args();
    // The agent and the load run as a pod that requested no hugepages would: in a cgroup whose
    // hugetlb limits are 0, so the fault probe filters their own faults, as on a real node.
    let lock = host_lock();
    let _controller = HugetlbController::enable(&lock);
    let pod = TestCgroup::create(&lock, "admit-load");
    pod.set("hugetlb.2MB.max", "0");
    pod.set("hugetlb.1GB.max", "0");
    let port = free_port();
    let log = std::env::temp_dir().join(format!("hugepage-agent-admit-load-{port}.log"));
    let log_file =
        std::fs::File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let mut agent = Command::new(&args.agent);
    agent
        .args([
            "run",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
        ])
        .stdout(Stdio::null())
        .stderr(log_file);
    spawn_in(&mut agent, &pod);
    let mut agent = agent
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", args.agent.display()));
    let ready = wait_ready(port, Duration::from_secs(30));
    let Some(ready) = ready else {
        let _ = agent.kill();
        panic!("the agent was not ready within 30 s; see {}", log.display());
    };
    let body = r#"{"pod":{"namespace":"bench","name":"dpdk-0","uid":"00000000-0000-0000-0000-000000000001"},"containers":[{"name":"app","resources":{"hugepages-2Mi":"2Mi","hugepages-1Gi":"1Gi","memory":"1Gi"}}]}"#;
    let (status, answer) = http(port, "POST", "/v1/admit", Some("application/json"), body);
    assert_eq!(status, 200, "{answer}");
    println!("agent ready: {ready}");
    println!("request: {body}");
    println!("answer:  {answer}");
    let url = format!("http://127.0.0.1:{port}/v1/admit");
    oha(&args, &pod, &url, body, 2, Load::Unthrottled);
    for (label, load) in [
        (
            format!("offered {} req/s, corrected", args.rate),
            Load::Fixed {
                rate: args.rate,
                corrected: true,
            },
        ),
        (
            format!("offered {} req/s, uncorrected", args.rate),
            Load::Fixed {
                rate: args.rate,
                corrected: false,
            },
        ),
        ("unthrottled".to_owned(), Load::Unthrottled),
    ] {
        let report = oha(&args, &pod, &url, body, args.seconds, load);
        print(&format!("{label}, {} conns", args.connections), &report);
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut agent, Duration::from_secs(10));
    println!("agent stopped: {status}; its log: {}", log.display());
    println!("target: 20000 req/s with p99 under 2 ms");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oha_json_is_read() {
        let json = r#"{"summary":{"successRate":1.0,"total":10.0,"requestsPerSec":19994.5},
            "latencyPercentiles":{"p50":0.0003,"p99":0.0015,"p99.9":0.004},
            "statusCodeDistribution":{"200":199945},
            "errorDistribution":{"connection closed":2}}"#;
        let r = parse_oha(json).expect("oha's shape");
        assert_eq!(r.requests_per_sec, 19994.5);
        assert_eq!(r.latency.get("p99"), Some(&0.0015));
        assert_eq!(r.statuses.get("200"), Some(&199_945));
        assert_eq!(r.errors.get("connection closed"), Some(&2));
        assert!(parse_oha(r#"{"summary":{}}"#).is_err());
    }
}
