//! `vm-checks`: the checks `cargo xtask vm-test` runs inside its four-NUMA-node guest (started by
//! `tests/vm/init`), against the guest's own sysfs and the real `hugepage-agent` binary built on
//! the host. `--bin DIR` holds the binaries (`hugepage-agent`, `toucher`), `--work DIR` the
//! exchange with the host: `machine.json` (the machine the host defined) in, `results` out (one
//! `passed NAME: figures` or `failed NAME: why` a line) and, for a failed check, the logs of the
//! agents it used: the shared agent's as `NAME.agent.log`, each agent the check started of its
//! own as `NAME.LABEL.agent.log` ([`OwnAgent`]). Each check's line is also printed on the
//! console, prefixed `vm-check: `. A check that panics (the test helpers do) fails with the
//! panic's message. Exit 0 when every check passed.

mod admit;
mod cgroup_events;
mod holders;
mod kep5759;
mod kernel;
mod numa_consumer;
mod pool_resize;
mod psi;
mod reservations;
mod selection;
mod strict;
mod sysfs;
mod topology;

use std::{
    cell::RefCell,
    fs,
    io::Write,
    ops::{Deref, DerefMut},
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
    /// The logs of the agents the running check started of its own.
    kept: KeptLogs,
}

/// The logs of the agents a check started of its own, each taken as its agent ends; the runner
/// writes them out when the check fails and forgets them when it passed.
#[derive(Default)]
struct KeptLogs(RefCell<Vec<(String, Vec<Value>)>>);

/// An agent a check started of its own (`label` tells it from the check's others); when it is
/// dropped, on every path out of the check, panics included, its log goes to the check's
/// [`KeptLogs`].
pub struct OwnAgent<'g> {
    agent: Agent,
    label: String,
    kept: &'g KeptLogs,
}

impl Deref for OwnAgent<'_> {
    type Target = Agent;
    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl DerefMut for OwnAgent<'_> {
    fn deref_mut(&mut self) -> &mut Agent {
        &mut self.agent
    }
}

impl Drop for OwnAgent<'_> {
    fn drop(&mut self) {
        self.agent.log.take_in();
        let seen = std::mem::take(&mut self.agent.log.seen);
        if let Ok(mut kept) = self.kept.0.try_borrow_mut() {
            kept.push((std::mem::take(&mut self.label), seen));
        }
    }
}

impl Guest {
    /// A command running the agent binary.
    pub fn agent(&self) -> Command {
        Command::new(self.bin.join("hugepage-agent"))
    }

    /// The shared agent, with its probes required (`--ebpf on`), started (see [`run`] for the
    /// wait until it is ready).
    pub fn start_agent(&self) -> Agent {
        let mut cmd = self.agent();
        cmd.args(["run", "--ebpf", "on"]);
        Agent::start(cmd)
    }

    /// Starts `cmd` (an agent command line, `run …`) as an agent of the running check's own,
    /// whose log is kept if the check fails, and waits until it is ready.
    pub fn start_own(
        &self,
        label: &str,
        cmd: Command,
        within: Duration,
    ) -> Result<OwnAgent<'_>, String> {
        let agent = OwnAgent {
            agent: Agent::start(cmd),
            label: label.to_owned(),
            kept: &self.kept,
        };
        hugepage_agent_tests::wait_ready(agent.port, within).ok_or_else(|| {
            format!(
                "the agent ({label}) was not ready within {} s",
                within.as_secs()
            )
        })?;
        Ok(agent)
    }

    pub fn toucher(&self) -> String {
        self.bin.join("toucher").display().to_string()
    }
}

struct Runner<'g> {
    work: PathBuf,
    results: fs::File,
    failed: u32,
    /// Where the running check's own agents leave their logs.
    kept: &'g KeptLogs,
}

impl Runner<'_> {
    /// Runs one check and records its line; when it failed, writes the logs of the agents it
    /// started of its own.
    fn check(&mut self, name: &str, f: impl FnOnce() -> CheckResult) -> bool {
        self.kept.0.borrow_mut().clear();
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
        let kept = std::mem::take(&mut *self.kept.0.borrow_mut());
        if outcome.is_err() {
            self.failed += 1;
            for (label, log) in kept {
                let log: Vec<String> = log.iter().map(Value::to_string).collect();
                let file = self.work.join(format!("{name}.{label}.agent.log"));
                if let Err(err) = fs::write(&file, log.join("\n")) {
                    eprintln!("vm-checks: could not keep {}: {err}", file.display());
                }
            }
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
    let guest = Guest {
        bin,
        machine,
        kept: KeptLogs::default(),
    };
    let mut runner = Runner {
        work: work.to_path_buf(),
        results,
        failed: 0,
        kept: &guest.kept,
    };
    runner.check("machine", || topology::machine(&guest));
    runner.check("status-json-equals-sysfs", || topology::status_json(&guest));
    let mut agent = guest.start_agent();
    if hugepage_agent_tests::wait_ready(agent.port, Duration::from_secs(120)).is_none() {
        runner.check_agent("agent-starts-with-probes", &mut agent, |_| {
            Err("the agent was not ready within 120 s".to_owned())
        });
        return Ok(runner.failed);
    }
    runner.check_agent("api-hugepages-topology", &mut agent, |agent| {
        topology::api_hugepages(agent.port)
    });
    runner.check_agent("probes-on-this-kernel", &mut agent, |agent| {
        kernel::probes(agent)
    });
    let lock = hugepage_agent_tests::host_lock();
    let _hugetlb = hugepage_agent_tests::HugetlbController::enable(&lock);
    runner.check_agent("mbind-consumer-node2", &mut agent, |agent| {
        numa_consumer::mbind_node2(&guest, &lock, agent)
    });
    runner.check_agent("kep5759-story1-1gi", &mut agent, |agent| {
        kep5759::story1(&guest, &lock, agent)
    });
    runner.check_agent("runtime-pool-resize-node1", &mut agent, |agent| {
        pool_resize::node1_grows(&lock, agent.port, Duration::from_secs(10))
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
    runner.check_agent("strict-mode-multi-node", &mut agent, |agent| {
        strict::multi_node(&guest, agent.port)
    });
    runner.check_agent("cgroup-events", &mut agent, |agent| {
        cgroup_events::kubepods_shaped(&guest, &lock, agent)
    });
    runner.check_agent("held-by-nothing-that-runs", &mut agent, |agent| {
        holders::orphans(&lock, agent)
    });
    runner.check("psi-conditions", || psi::memory_high(&guest, &lock));
    Ok(runner.failed)
}
