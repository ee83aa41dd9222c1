//! Helpers for the tests that change the host: a lock that serialises them across processes,
//! guards that restore hugepage pools and cgroups on every exit path (panics included), and the
//! `toucher` child that faults real pages.

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent::{probes::watch::CgroupV2, sysfs::HostFs};

pub mod abusers;
pub mod apiserver;
pub mod cluster;
mod flags;
pub mod flood;
mod host_tree;
pub mod https;
pub mod hugetlbfs;
mod log;
pub mod manifests;
pub mod mbind;
pub mod mtls;
pub mod peers;
mod pressure;
pub mod rendered;
pub mod rng;
mod stats;
pub mod watcher;
pub use flags::BenchFlags;
pub use host_tree::{QUIET_PRESSURE, numa_nodes, put, quiet_pressure, two_numa_nodes};
pub use log::{LogLines, warnings_in};
pub use pressure::MemoryPressure;
pub use stats::Percentiles;

const LOCK: &str = "/run/hugepage-agent-tests.lock";
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Panics with a clear message unless the tests run as root (they load BPF and change the host).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests load eBPF programs and reserve hugepages: run them as root (cargo xtask test)"
    );
}

/// Whether the running kernel has the hugetlbfs tracepoints (`hugetlbfs_alloc_inode` and its
/// kin, in kernels newer than 6.12), as its BTF says.
pub fn kernel_has_hugetlbfs_tracepoints() -> std::io::Result<bool> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux")?;
    let name = b"btf_trace_hugetlbfs_fallocate";
    Ok(btf.windows(name.len()).any(|w| w == name))
}

/// Held while a test changes the host; tests in other processes wait for it. The lock is the
/// open file's `flock`, released when the file closes.
pub struct HostLock {
    _file: fs::File,
}

pub fn host_lock() -> HostLock {
    require_root();
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .expect("open the test lock");
    // SAFETY: valid descriptor; blocks until the lock is free.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {LOCK}: {}", std::io::Error::last_os_error());
    HostLock { _file: file }
}

/// Sets a hugepage pool to at least `pages` and restores its previous size when dropped: the
/// system's 2 MiB pool ([`HugepagePool::reserve`]) or any pool's `nr_hugepages` file
/// ([`HugepagePool::reserve_in`], a node's).
pub struct HugepagePool {
    file: String,
    previous: u64,
}

impl HugepagePool {
    pub fn reserve(lock: &HostLock, pages: u64) -> HugepagePool {
        HugepagePool::reserve_in(lock, NR_HUGEPAGES, pages)
    }

    pub fn reserve_in(lock: &HostLock, file: &str, pages: u64) -> HugepagePool {
        HugepagePool::try_reserve_in(lock, file, pages).unwrap_or_else(|gave| {
            panic!(
                "asked the kernel for {pages} pages in {file}, it gave {gave} (memory too fragmented?)"
            )
        })
    }

    /// [`HugepagePool::reserve_in`] where the kernel may not have the pages (1 GiB pages at
    /// runtime need that much contiguous memory): how many it gave, the pool restored, when it
    /// gave fewer.
    pub fn try_reserve_in(_lock: &HostLock, file: &str, pages: u64) -> Result<HugepagePool, u64> {
        let previous = read_u64(file);
        let pool = HugepagePool {
            file: file.to_owned(),
            previous,
        };
        fs::write(file, pages.max(previous).to_string())
            .unwrap_or_else(|e| panic!("writing {file}: {e}"));
        let now = read_u64(file);
        if now < pages {
            return Err(now);
        }
        Ok(pool)
    }
}

impl Drop for HugepagePool {
    fn drop(&mut self) {
        if let Err(err) = fs::write(&self.file, self.previous.to_string()) {
            eprintln!("restoring {} to {}: {err}", self.file, self.previous);
        }
    }
}

pub fn read_u64(path: &str) -> u64 {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

/// The host's cgroup v2 hierarchy (mount point on the host).
pub fn v2() -> CgroupV2 {
    CgroupV2::find(&HostFs::new("/")).expect("this kernel has a cgroup v2 hierarchy")
}

/// A fresh cgroup v2 directory, removed (after its tasks are gone) when dropped.
pub struct TestCgroup {
    pub dir: PathBuf,
    /// Path relative to the hierarchy's mount, as cgroup events report it.
    pub rel: String,
    pub id: u64,
}

impl TestCgroup {
    pub fn create(_lock: &HostLock, name: &str) -> TestCgroup {
        let mount = v2().mount;
        let rel = format!("/hugepage-agent-test-{name}-{}", std::process::id());
        let dir = PathBuf::from(format!("{mount}{rel}"));
        if dir.exists() {
            let _ = fs::remove_dir(&dir);
        }
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let id = fs::metadata(&dir).expect("stat cgroup").ino();
        TestCgroup { dir, rel, id }
    }

    /// Writes `value` to the cgroup's `file`.
    pub fn set(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value)
            .unwrap_or_else(|e| panic!("writing {value:?} to {}: {e}", path.display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("could not remove test cgroup {}", self.dir.display());
    }
}

/// Creates `parts` nested under `root` with the hugetlb controller enabled down to the last,
/// as the kubelet's pod and container cgroups are; returns the guard and the innermost directory.
pub fn pod_cgroups(root: &TestCgroup, parts: &[&str]) -> (Nested, PathBuf) {
    root.set("cgroup.subtree_control", "+hugetlb");
    let mut dirs = Vec::new();
    let mut dir = root.dir.clone();
    for (i, part) in parts.iter().enumerate() {
        dir = dir.join(part);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        dirs.push(dir.clone());
        if i + 1 < parts.len() {
            fs::write(dir.join("cgroup.subtree_control"), "+hugetlb")
                .unwrap_or_else(|e| panic!("enabling hugetlb in {}: {e}", dir.display()));
        }
    }
    (Nested(dirs), dir)
}

/// Nested cgroup directories made by a test, removed innermost first on drop.
pub struct Nested(pub Vec<PathBuf>);

impl Drop for Nested {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            if let Err(err) = fs::remove_dir(dir) {
                eprintln!("removing {}: {err}", dir.display());
            }
        }
    }
}

/// Makes `cmd` start inside `cgroup` (it joins before `exec`, so its first fault is already there).
pub fn spawn_in(cmd: &mut Command, cgroup: &TestCgroup) {
    spawn_in_all(cmd, &[cgroup.dir.join("cgroup.procs")]);
}

/// Makes `cmd` join every cgroup whose `cgroup.procs` file is listed (one per hierarchy) before
/// `exec`.
pub fn spawn_in_all(cmd: &mut Command, procs_files: &[PathBuf]) {
    use std::os::unix::{ffi::OsStrExt, process::CommandExt};
    let files: Vec<std::ffi::CString> = procs_files
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("a path without NUL"))
        .collect();
    // SAFETY: between fork and exec only async-signal-safe calls (open, write, close) run, on
    // memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for procs in &files {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
}

/// Enables the hugetlb controller for the children of the v2 root; restores the old state.
pub struct HugetlbController {
    enabled_here: bool,
    control: PathBuf,
}

impl HugetlbController {
    pub fn enable(_lock: &HostLock) -> HugetlbController {
        let control = PathBuf::from(format!("{}/cgroup.subtree_control", v2().mount));
        let before = fs::read_to_string(&control).expect("read subtree_control");
        let enabled_here = !before.split_whitespace().any(|c| c == "hugetlb");
        if enabled_here {
            fs::write(&control, "+hugetlb")
                .unwrap_or_else(|e| panic!("enabling hugetlb in {}: {e}", control.display()));
        }
        HugetlbController {
            enabled_here,
            control,
        }
    }
}

impl Drop for HugetlbController {
    fn drop(&mut self) {
        if self.enabled_here
            && let Err(err) = fs::write(&self.control, "-hugetlb")
        {
            eprintln!("disabling hugetlb in {}: {err}", self.control.display());
        }
    }
}

/// A running `toucher`; killed when dropped.
pub struct Toucher {
    child: Child,
    stdin: Option<ChildStdin>,
    pub pid: u32,
    /// CPU time the child spent touching its small pages, faults included.
    pub small_cpu_ns: u64,
    /// CLOCK_MONOTONIC just before its first huge page's touch (0 when it touched none).
    pub first_touch_ns: u64,
}

impl Toucher {
    /// Starts `exe` (the `toucher` binary) in `cgroup`, faulting `huge` 2 MiB and `small` 4 KiB
    /// pages, and waits until it has touched them all. The pages stay mapped until drop.
    pub fn run(exe: &str, cgroup: Option<&Path>, huge: usize, small: usize) -> Toucher {
        Self::run_with(exe, cgroup, huge, small, &[])
    }

    /// Starts a toucher pinned to `cpu` that faults 4 KiB pages without pause, runs `meanwhile`,
    /// then lets it touch `huge` pages; returns once it has.
    pub fn spin_then_touch(
        exe: &str,
        cgroup: &Path,
        cpu: usize,
        huge: usize,
        meanwhile: impl FnOnce(),
    ) -> Toucher {
        let mut child = Command::new(exe)
            .arg("--cgroup")
            .arg(cgroup)
            .args([
                "--cpu",
                &cpu.to_string(),
                "--huge",
                &huge.to_string(),
                "--spin",
                "--hold",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn toucher");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read toucher");
        assert_eq!(line.trim(), "spinning", "toucher did not start spinning");
        meanwhile();
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "go").expect("tell the toucher to go");
        line.clear();
        stdout.read_line(&mut line).expect("read toucher");
        assert!(line.starts_with("touched "), "toucher failed: {line:?}");
        let pid = child.id();
        Toucher {
            child,
            stdin: Some(stdin),
            pid,
            small_cpu_ns: 0,
            first_touch_ns: 0,
        }
    }

    /// [`Toucher::run`] with extra arguments, such as `--cpu 1`.
    pub fn run_with(
        exe: &str,
        cgroup: Option<&Path>,
        huge: usize,
        small: usize,
        extra: &[&str],
    ) -> Toucher {
        let mut cmd = Command::new(exe);
        if let Some(dir) = cgroup {
            cmd.arg("--cgroup").arg(dir);
        }
        cmd.args(extra);
        cmd.args([
            "--huge",
            &huge.to_string(),
            "--small",
            &small.to_string(),
            "--hold",
        ]);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn toucher");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read toucher");
        let status = if line.is_empty() {
            child.wait().ok()
        } else {
            None
        };
        assert!(
            line.starts_with("touched "),
            "toucher failed ({status:?}): {line:?}"
        );
        let small_cpu_ns = line
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .expect("toucher reports CPU time");
        let first_touch_ns = line
            .split_whitespace()
            .nth(4)
            .and_then(|n| n.parse().ok())
            .expect("toucher reports its first touch's time");
        let stdin = child.stdin.take();
        let pid = child.id();
        Toucher {
            child,
            stdin,
            pid,
            small_cpu_ns,
            first_touch_ns,
        }
    }
}

impl Drop for Toucher {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.child.wait().is_err() {
            let _ = self.child.kill();
        }
    }
}

/// The agent the image ships: the statically linked release build `cargo xtask image` makes
/// (and `cargo xtask test` before every test), for the tests whose figures are the shipped
/// build's. Built by hand after a change, it is as old as the last `cargo xtask image`.
pub fn shipped_agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe
        .ancestors()
        .nth(3)
        .map(|target| target.join("x86_64-unknown-linux-gnu/release/hugepage-agent"))
        .expect("target directory");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo xtask image), or run cargo xtask test",
        path.display()
    );
    path
}

/// The `hugepage-agent` binary: `HUGEPAGE_AGENT_BIN`, else the one cargo built beside the tests.
pub fn agent_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("HUGEPAGE_AGENT_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("hugepage-agent"))
        .expect("target directory");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p hugepage-agent), or run cargo xtask test",
        path.display()
    );
    path
}

/// A fresh, empty directory for an agent's `--state-dir`, owned by `uid` (the user the agent runs
/// as), removed when dropped. No test may share the host's `/var/lib/hugepage-agent`: a test
/// that relied on another having created it passed only on machines that had run the suite once.
pub fn fresh_state_dir(uid: u32) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("hugepage-agent-state-")
        .tempdir()
        .expect("a temporary state directory");
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {} to {uid}: {e}", dir.path().display()));
    dir
}

/// A running agent whose JSON log lines (stderr) are collected as they come.
pub struct Agent {
    child: Child,
    /// Its `--state-dir`, when the test did not pass one (removed with the agent).
    _state: Option<tempfile::TempDir>,
    /// The port its HTTP API listens on (127.0.0.1, unless started with [`Agent::start_on`]).
    pub port: u16,
    /// Its JSON log.
    pub log: LogLines,
}

impl Agent {
    /// Starts `cmd` (an agent command line: `run`, or the webhook) with JSON logs, listening on a
    /// free loopback port, with a fresh `--state-dir` for `run` unless `cmd` names one.
    pub fn start(cmd: Command) -> Agent {
        Agent::start_as(cmd, 0)
    }

    /// [`Agent::start`] for an agent that runs as `uid` (its fresh state directory is its own).
    pub fn start_as(cmd: Command, uid: u32) -> Agent {
        Agent::start_on(cmd, uid, std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// [`Agent::start_as`] listening on `ip` (a free port; 127.0.0.1 reaches it for the
    /// unspecified address as well).
    pub fn start_on(cmd: Command, uid: u32, ip: std::net::IpAddr) -> Agent {
        Agent::start_at(cmd, uid, std::net::SocketAddr::new(ip, free_port()))
    }

    /// [`Agent::start_as`] listening on `addr` (several agents on loopback addresses of their
    /// own share one port, as agents on the nodes of a cluster do).
    pub fn start_at(mut cmd: Command, uid: u32, addr: std::net::SocketAddr) -> Agent {
        // Only `run` keeps state (the webhook takes no --state-dir); `cmd` may be a wrapper
        // (setpriv, unshare) whose own arguments come first.
        let runs = !cmd.get_args().any(|a| a == "webhook");
        let names_state = cmd.get_args().any(|a| a == "--state-dir");
        let state = (runs && !names_state).then(|| fresh_state_dir(uid));
        if let Some(dir) = &state {
            cmd.arg("--state-dir").arg(dir.path());
        }
        let port = addr.port();
        cmd.args(["--log-format", "json", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the agent");
        let log = LogLines::follow(child.stderr.take().expect("stderr"));
        Agent {
            child,
            _state: state,
            port,
            log,
        }
    }

    /// Waits until a log line with `message` satisfies `pred`; panics with the log after `within`.
    pub fn wait_for(
        &mut self,
        message: &str,
        within: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.log.wait_for(message, within, pred)
    }

    /// Log lines with `message` seen so far (after draining what has arrived).
    pub fn lines_with(&mut self, message: &str) -> Vec<serde_json::Value> {
        self.log.take_in();
        self.log
            .seen
            .iter()
            .filter(|v| v["message"] == message)
            .cloned()
            .collect()
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and returns the exit status and the remaining log.
    pub fn terminate(mut self) -> (ExitStatus, Vec<serde_json::Value>) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = wait_timeout(&mut self.child, Duration::from_secs(10));
        // The log closes with the process; what it wrote last is in within this.
        self.log.drain(Duration::from_millis(200));
        (status, std::mem::take(&mut self.log.seen))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child`, killing it after `within`.
pub fn wait_timeout(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion: (status, stdout, stderr).
pub fn output(mut cmd: Command) -> (ExitStatus, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    (wait_timeout(&mut child, Duration::from_secs(30)), out, err)
}

/// A kubelet Memory Manager checkpoint, checksum and all, as the newest kubelet writes it, for
/// `machine_state` (the JSON of its `machineState`, static policy, no assignments).
pub fn kubelet_checkpoint(machine_state: serde_json::Value) -> Vec<u8> {
    use hugepage_agent::memorymanager::checkpoint::{Verification, parse, to_kubelet_json};
    let state = serde_json::json!({"policyName": "Static", "machineState": machine_state});
    let state = parse(
        Path::new("hand-written"),
        state.to_string().as_bytes(),
        Verification::UnlessAbsent,
    )
    .expect("a valid state");
    to_kubelet_json(&state)
}

/// A checkpoint for node 0 alone: 64 GiB of memory all free, and a 2 MiB pool of `total_2m`
/// bytes of which it believes `free_2m` free.
pub fn node0_checkpoint(total_2m: u64, free_2m: u64) -> Vec<u8> {
    let table = |total: u64, free: u64| serde_json::json!({"total": total, "systemReserved": 0, "allocatable": total, "reserved": total - free, "free": free});
    kubelet_checkpoint(serde_json::json!({"0": {
        "numberOfAssignments": 0,
        "memoryMap": {"memory": table(64 << 30, 64 << 30), "hugepages-2Mi": table(total_2m, free_2m)},
        "cells": [0]
    }}))
}

/// A process's memory as the kernel counts it: resident now, the anonymous part of it (the rest
/// is file pages: the binary's code, shared with the page cache), the peak, and how much is
/// transparent huge pages (`/proc/<pid>/status` and `smaps_rollup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub peak_rss_kib: u64,
    pub anon_huge_kib: u64,
}

impl Footprint {
    /// Resets the process's peak RSS to its current RSS (`clear_refs` 5), so that the next
    /// [`Footprint::of`] shows the peak since now.
    pub fn reset_peak(pid: u32) {
        let path = format!("/proc/{pid}/clear_refs");
        std::fs::write(&path, "5").unwrap_or_else(|e| panic!("writing 5 to {path}: {e}"));
    }

    pub fn of(pid: u32) -> Footprint {
        let field = |file: &str, name: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/{file}"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Footprint {
            rss_kib: field("status", "VmRSS:"),
            anon_kib: field("status", "RssAnon:"),
            peak_rss_kib: field("status", "VmHWM:"),
            anon_huge_kib: field("smaps_rollup", "AnonHugePages:"),
        }
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MB ({:.1} MB anonymous), peak {:.1} MB, AnonHugePages {} kB",
            self.rss_kib as f64 / 1024.0,
            self.anon_kib as f64 / 1024.0,
            self.peak_rss_kib as f64 / 1024.0,
            self.anon_huge_kib
        )
    }
}

/// User + system CPU time of a process.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Duration::from_millis(ticks * 1000 / hz)
}

/// `clock` (`CLOCK_MONOTONIC`, the clock the probes stamp their events with;
/// `CLOCK_THREAD_CPUTIME_ID`, this thread's CPU time) in nanoseconds.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `bin run` on this host with its probes (faults prompt the map), no reconcile while it runs
/// (a change must come from the faults), plain HTTP, and `extra`; returned once its probes are
/// attached.
pub fn probed_agent(bin: &Path, extra: &[&str]) -> Agent {
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--ebpf", "on", "--reconcile-interval", "1h"])
        .args(extra);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(30), |l| {
        l["source"] == "ebpf+sysfs"
    });
    agent
}

/// CPU time the process `pid` has run, all its threads that are alive (`schedstat`, in
/// nanoseconds: finer than [`cpu_time`]'s clock ticks).
pub fn cpu_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task: {e}"));
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Each thread of process `pid`: its name, scheduling policy (0 SCHED_OTHER, 1 SCHED_FIFO, 5
/// SCHED_IDLE) and real-time priority, fields 41 and 40 of `/proc/<pid>/task/<tid>/stat`.
pub fn thread_schedules(pid: u32) -> Vec<(String, u64, u64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task: {e}"));
    let mut out = Vec::new();
    for task in tasks.filter_map(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Field 3 on follows the command's closing parenthesis: field N is at N - 3.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse().ok());
        if let (Some(policy), Some(priority)) = (field(41), field(40)) {
            out.push((comm.trim().to_owned(), policy, priority));
        }
    }
    out
}

/// Runs the calling thread on `cpu` only.
pub fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays within it for cpu < 1024.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "pinning to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(
        rc,
        0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Waits until the agent on `port` answers `/readyz` with 200; its body, or `None` after `within`.
/// A request that fails or is not answered within its own time-out (an agent still starting on
/// a slow machine, such as the VM test's emulated guest) is asked again, until `within`; no
/// request waits past it.
pub fn wait_ready(port: u16, within: Duration) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < within {
        let left = within.saturating_sub(start.elapsed());
        let timeout = left.clamp(Duration::from_millis(100), ANSWER_WITHIN);
        // Once the port accepts, the API is up; /readyz then says whether the agent is ready.
        if let Ok((200, text)) = request(port, "GET", "/readyz", None, "", timeout) {
            return Some(text);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// One HTTP/1.1 request over a real socket to 127.0.0.1:`port`: (status, body); panics when
/// it cannot be sent or is not answered within 10 s.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, String) {
    try_http(port, method, path, content_type, body)
        .unwrap_or_else(|e| panic!("{method} {path} on 127.0.0.1:{port}: {e}"))
}

/// How long [`http`] and [`try_http`] wait for an answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// [`http`], with what went wrong as an error.
pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> std::io::Result<(u16, String)> {
    request(port, method, path, content_type, body, ANSWER_WITHIN)
}

/// One request, its answer awaited at most `timeout` at a time.
fn request(
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    use std::net::TcpStream;
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(timeout))?;
    let ctype = content_type
        .map(|t| format!("content-type: {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{ctype}content-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no status line in {response:?}"),
            )
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Raises this process's soft limit of open files to `need` when it is lower (the hard limit
/// too, which root may), for a bench that holds thousands of connections; its children (the
/// agent, the webhook) inherit it. Says what it found and did.
pub fn raise_open_files(need: u64) -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if limit.rlim_cur >= need {
        return format!(
            "open files: soft limit {} (enough: at most {need} wanted), not changed",
            limit.rlim_cur
        );
    }
    let raised = libc::rlimit {
        rlim_cur: need,
        rlim_max: limit.rlim_max.max(need),
    };
    // SAFETY: setrlimit reads the struct it is given.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    assert_eq!(
        rc,
        0,
        "setrlimit RLIMIT_NOFILE to {need}: {}",
        std::io::Error::last_os_error()
    );
    format!(
        "open files: soft limit raised from {} to {need} (setrlimit), inherited by the processes started after",
        limit.rlim_cur
    )
}
