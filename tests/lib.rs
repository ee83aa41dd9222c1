//! Helpers for the tests that change the host: a lock that serialises them across processes,
//! guards that restore hugepage pools and cgroups on every exit path (panics included), and the
//! `toucher` child that faults real pages.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
};

use hugepage_agent::{probes::watch::CgroupV2, sysfs::HostFs};

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

/// Held while a test changes the host; tests in other processes wait for it.
pub struct HostLock(fs::File);

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
    HostLock(file)
}

/// Sets the 2 MiB pool to at least `pages` and restores the previous size when dropped.
pub struct HugepagePool {
    previous: u64,
}

impl HugepagePool {
    pub fn reserve(_lock: &HostLock, pages: u64) -> HugepagePool {
        let previous = read_u64(NR_HUGEPAGES);
        fs::write(NR_HUGEPAGES, pages.max(previous).to_string()).expect("write nr_hugepages");
        let now = read_u64(NR_HUGEPAGES);
        let pool = HugepagePool { previous };
        assert!(
            now >= pages,
            "asked the kernel for {pages} 2 MiB pages, it gave {now} (memory too fragmented?)"
        );
        pool
    }
}

impl Drop for HugepagePool {
    fn drop(&mut self) {
        if let Err(err) = fs::write(NR_HUGEPAGES, self.previous.to_string()) {
            eprintln!("restoring nr_hugepages to {}: {err}", self.previous);
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
}

impl Toucher {
    /// Starts `exe` (the `toucher` binary) in `cgroup`, faulting `huge` 2 MiB and `small` 4 KiB
    /// pages, and waits until it has touched them all. The pages stay mapped until drop.
    pub fn run(exe: &str, cgroup: Option<&Path>, huge: usize, small: usize) -> Toucher {
        let mut cmd = Command::new(exe);
        if let Some(dir) = cgroup {
            cmd.arg("--cgroup").arg(dir);
        }
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
        let stdin = child.stdin.take();
        let pid = child.id();
        Toucher { child, stdin, pid }
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
