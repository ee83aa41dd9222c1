//! The map's thread on the real kernel: the agent's loop (the probes' events, the re-reads of
//! sysfs they prompt) runs on a thread named `map`, of the default policy unless
//! `--map-thread-priority` asks for SCHED_FIFO (which it leaves for each reconcile and takes
//! again); a fault reaches the map from that thread either way; without CAP_SYS_NICE the
//! priority is refused by name and the agent does not start.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, HugepagePool, TestCgroup, Toucher, agent_bin, free_port, host_lock, output,
    probed_agent, require_root, thread_schedules,
};
use serde_json::Value;

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
/// SCHED_OTHER and SCHED_FIFO, as `/proc/<pid>/task/<tid>/stat` writes a thread's policy.
const SCHED_OTHER: u64 = 0;
const SCHED_FIFO: u64 = 1;

/// The policy and real-time priority of the thread of `pid` named `name`.
fn thread_policy(pid: u32, name: &str) -> (u64, u64) {
    let threads = thread_schedules(pid);
    threads
        .iter()
        .find(|(comm, _, _)| comm == name)
        .map(|&(_, policy, priority)| (policy, priority))
        .unwrap_or_else(|| panic!("no thread named {name} in process {pid}: {threads:?}"))
}

/// Stops `agent` (SIGTERM), which must exit 0; its start-up line.
fn stopped_cleanly(agent: Agent) -> Value {
    let (status, log) = agent.terminate();
    assert!(status.success(), "{status:?}");
    log.into_iter()
        .find(|l| l["message"] == "agent running")
        .expect("the start-up line")
}

/// Whether `now` holds at some time within `within` (checked as fast as it can be).
fn seen_within(within: Duration, now: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if now() {
            return true;
        }
    }
    false
}

/// A fault of `pages` 2 MiB pages by a toucher in a cgroup of its own, and the map's change the
/// agent logged for it.
fn fault_reaches_the_map(agent: &mut Agent, cgroup: &TestCgroup) -> Value {
    let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 2, 16);
    let changed = agent.wait_for("hugepage pool changed", Duration::from_secs(10), |l| {
        l["fault_to_map_us"].is_u64()
    });
    drop(toucher);
    changed
}

#[test]
fn the_map_thread_runs_at_the_default_policy_unless_a_real_time_priority_is_asked() {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let cgroup = TestCgroup::create(&lock, "map-thread");

    let mut plain = probed_agent(&agent_bin(), &[]);
    assert_eq!(thread_policy(plain.pid(), "map"), (SCHED_OTHER, 0));
    fault_reaches_the_map(&mut plain, &cgroup);
    let running = stopped_cleanly(plain);
    assert_eq!(running["map_thread_priority"], "none", "{running}");

    // A reconcile every 100 ms, which the thread runs at the default policy: it is real-time
    // again after each.
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--ebpf", "on", "--reconcile-interval", "100ms"])
        .args(["--map-thread-priority", "7"]);
    let mut realtime = Agent::start(cmd);
    realtime.wait_for("agent running", Duration::from_secs(30), |l| {
        l["source"] == "ebpf+sysfs"
    });
    let pid = realtime.pid();
    // Seen at the default policy during a reconcile, and real-time again after it.
    assert!(
        seen_within(Duration::from_secs(5), || thread_policy(pid, "map")
            == (SCHED_OTHER, 0)),
        "the map thread was never seen lowered for a reconcile"
    );
    assert!(
        seen_within(Duration::from_secs(5), || thread_policy(pid, "map")
            == (SCHED_FIFO, 7)),
        "the map thread did not take SCHED_FIFO 7 again: {:?}",
        thread_policy(pid, "map")
    );
    // The other threads keep the default policy.
    assert_eq!(
        thread_policy(realtime.pid(), "hugepage-agent"),
        (SCHED_OTHER, 0)
    );
    fault_reaches_the_map(&mut realtime, &cgroup);
    let running = stopped_cleanly(realtime);
    assert_eq!(running["map_thread_priority"], "SCHED_FIFO 7", "{running}");
}

#[test]
fn without_cap_sys_nice_the_priority_is_refused_by_name_and_the_agent_does_not_start() {
    require_root();
    let _lock = host_lock();
    let state = tempfile::tempdir().expect("a state directory");
    let listen = format!("127.0.0.1:{}", free_port());
    // Root without CAP_SYS_NICE: gone from the bounding and inheritable sets before the exec.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--"])
        .arg(agent_bin())
        .args(["run", "--ebpf", "off", "--map-thread-priority", "7"])
        .args(["--listen", &listen, "--state-dir"])
        .arg(state.path());
    let (status, out, err) = output(cmd);
    assert_eq!(status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains("hugepage-agent: --map-thread-priority 7: the kernel refused SCHED_FIFO for the map's thread: Operation not permitted"),
        "{err}"
    );
    assert!(err.contains("CAP_SYS_NICE"), "{err}");
    assert!(!err.contains("agent running"), "{err}");

    // Out of range: refused by the flag's parser before anything starts.
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--map-thread-priority", "100"]);
    let (status, _, err) = output(cmd);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--map-thread-priority"), "{err}");
    assert!(err.contains("1..=99"), "{err}");
}
