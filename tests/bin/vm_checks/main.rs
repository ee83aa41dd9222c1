//! `vm-checks`: the checks `cargo xtask vm-test` runs inside its four-NUMA-node guest (started by
//! `tests/vm/init`), against the guest's own sysfs and the real `hugepage-agent` binary built on
//! the host. `--bin DIR` holds the binaries (`hugepage-agent`, `toucher`), `--work DIR` the
//! exchange with the host: `machine.json` (the machine the host defined) in, `results` out (one
//! `passed NAME: figures` or `failed NAME: why` a line) and, for a failed check, the agent's log
//! as `NAME.agent.log`. Each check's line is also printed on the console, prefixed `vm-check: `.
//! A check that panics (the test helpers do) fails with the panic's message. Exit 0 when every
//! check passed.

mod admit;
mod kep5759;
mod numa_consumer;
mod reservations;
mod selection;
mod sysfs;
mod topology;

use std::{
    fs,
    io::Write,
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use hugepage_agent_tests::Agent;
use serde_json::Value;

/// What a check returns: its figures when it passed, why when it failed.
pub type CheckResult = Result<String, String>;

/// Where the checks find the binaries and the machine's description.
pub struct Guest {
    pub bin: PathBuf,
    pub machine: Value,
}

impl Guest {
    /// A command running the agent binary.
    pub fn agent(&self) -> Command {
        Command::new(self.bin.join("hugepage-agent"))
    }

    /// A running agent with its probes required (`--ebpf on`), ready.
    pub fn start_agent(&self) -> Result<Agent, String> {
        let mut cmd = self.agent();
        cmd.args(["run", "--ebpf", "on"]);
        let agent = Agent::start(cmd);
        hugepage_agent_tests::wait_ready(agent.port, Duration::from_secs(120))
            .ok_or("the agent was not ready within 120 s")?;
        Ok(agent)
    }

    pub fn toucher(&self) -> String {
        self.bin.join("toucher").display().to_string()
    }
}

struct Runner {
    work: PathBuf,
    results: fs::File,
    failed: u32,
}

impl Runner {
    /// Runs one check and records its line.
    fn check(&mut self, name: &str, f: impl FnOnce() -> CheckResult) -> bool {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".to_owned());
            Err(format!("panicked: {text}"))
        });
        let took = started.elapsed().as_secs_f64();
        let line = match &outcome {
            Ok(figures) => format!("passed {name}: {figures} ({took:.1} s)"),
            Err(why) => format!("failed {name}: {why} ({took:.1} s)"),
        };
        println!("vm-check: {line}");
        let _ = writeln!(self.results, "{line}");
        if outcome.is_err() {
            self.failed += 1;
        }
        outcome.is_ok()
    }

    /// [`Runner::check`] of a check that uses `agent`, whose log is kept when it fails.
    fn check_agent(
        &mut self,
        name: &str,
        agent: &mut Agent,
        f: impl FnOnce(&mut Agent) -> CheckResult,
    ) {
        if !self.check(name, || f(&mut *agent)) {
            agent.log.take_in();
            let log: Vec<String> = agent.log.seen.iter().map(Value::to_string).collect();
            let _ = fs::write(self.work.join(format!("{name}.agent.log")), log.join("\n"));
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut bin, mut work) = (None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bin" => bin = args.next().map(PathBuf::from),
            "--work" => work = args.next().map(PathBuf::from),
            other => {
                eprintln!("vm-checks: unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(bin), Some(work)) = (bin, work) else {
        eprintln!("vm-checks: --bin DIR and --work DIR are required");
        return ExitCode::from(2);
    };
    match run(bin, &work) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("vm-checks: {err}");
            ExitCode::from(2)
        }
    }
}

fn run(bin: PathBuf, work: &Path) -> Result<u32, String> {
    let machine_file = work.join("machine.json");
    let machine: Value = fs::read(&machine_file)
        .map_err(|e| format!("{}: {e}", machine_file.display()))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))?;
    let results = fs::File::create(work.join("results")).map_err(|e| e.to_string())?;
    let guest = Guest { bin, machine };
    let mut runner = Runner {
        work: work.to_path_buf(),
        results,
        failed: 0,
    };
    runner.check("machine", || topology::machine(&guest));
    runner.check("status-json-equals-sysfs", || topology::status_json(&guest));
    let mut agent = match guest.start_agent() {
        Ok(agent) => agent,
        Err(why) => {
            runner.check("agent-starts-with-probes", || Err(why));
            return Ok(runner.failed);
        }
    };
    runner.check_agent("api-hugepages-topology", &mut agent, |agent| {
        topology::api_hugepages(agent.port)
    });
    let lock = hugepage_agent_tests::host_lock();
    let _hugetlb = hugepage_agent_tests::HugetlbController::enable(&lock);
    runner.check_agent("mbind-consumer-node2", &mut agent, |agent| {
        numa_consumer::mbind_node2(&guest, &lock, agent)
    });
    runner.check_agent("kep5759-story1-1gi", &mut agent, |agent| {
        kep5759::story1(&guest, &lock, agent)
    });
    runner.check_agent("kep5759-story2-nodes-0-1", &mut agent, |agent| {
        kep5759::story2(&guest, agent.port)
    });
    runner.check("selection-without-numa-nodes", || {
        selection::without_numa_nodes(&guest)
    });
    runner.check("reservations-across-nodes", || {
        reservations::across_nodes(&guest)
    });
    runner.check("discrepancy-node3-burstable", || {
        reservations::discrepancy(&guest, &lock)
    });
    Ok(runner.failed)
}
