//! Real memory pressure in a cgroup, for the PSI tests and benchmark: a process whose memory is
//! limited to 32 MiB reads a 256 MiB file over and over, so every read reclaims its own page
//! cache and its tasks stall on memory (and io). The process runs in a fresh cgroup v2 directory,
//! whose `memory.pressure` then rises; the limit is set on cgroup v2 when the memory controller
//! is there, else on the v1 memory hierarchy (hybrid hosts). Everything is undone on drop.

use std::{
    fs,
    io::Write,
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use crate::{HostLock, TestCgroup, spawn_in_all, v2};

const LIMIT: u64 = 32 << 20;
const FILE_MIB: usize = 256;

/// Where the memory limit lives.
enum Limit {
    /// `memory.max` of the v2 cgroup itself; the controller was enabled here if `enabled`.
    V2 { control: PathBuf, enabled: bool },
    /// A v1 memory cgroup, removed on drop.
    V1(PathBuf),
}

/// A process under memory pressure, in `cgroup`.
pub struct MemoryPressure {
    child: Child,
    limit: Limit,
    file: PathBuf,
    /// The cgroup v2 directory whose `memory.pressure` rises (taken on drop).
    cgroup: Option<TestCgroup>,
}

impl MemoryPressure {
    /// Creates the cgroups and the file, then starts the reader.
    pub fn start(lock: &HostLock, name: &str) -> MemoryPressure {
        let cgroup = TestCgroup::create(lock, name);
        let mount = v2().mount;
        let controllers =
            fs::read_to_string(format!("{mount}/cgroup.controllers")).unwrap_or_default();
        let mut procs = vec![cgroup.dir.join("cgroup.procs")];
        let limit = if controllers.split_whitespace().any(|c| c == "memory") {
            let control = PathBuf::from(format!("{mount}/cgroup.subtree_control"));
            let before = fs::read_to_string(&control).unwrap_or_default();
            let enabled = !before.split_whitespace().any(|c| c == "memory");
            if enabled {
                fs::write(&control, "+memory").expect("enable the v2 memory controller");
            }
            cgroup.set("memory.max", &LIMIT.to_string());
            Limit::V2 { control, enabled }
        } else {
            let dir = PathBuf::from(format!(
                "/sys/fs/cgroup/memory/hugepage-agent-test-{name}-{}",
                std::process::id()
            ));
            assert!(
                dir.parent()
                    .is_some_and(|p| p.join("memory.limit_in_bytes").exists()),
                "no memory controller on cgroup v2 and no v1 memory hierarchy at /sys/fs/cgroup/memory"
            );
            fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            fs::write(dir.join("memory.limit_in_bytes"), LIMIT.to_string())
                .expect("set the v1 limit");
            procs.push(dir.join("cgroup.procs"));
            Limit::V1(dir)
        };
        let file = std::env::temp_dir().join(format!(
            "hugepage-agent-pressure-{}.bin",
            std::process::id()
        ));
        write_file(&file);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "while :; do cat {} > /dev/null; done",
                file.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        spawn_in_all(&mut cmd, &procs);
        let child = cmd.spawn().expect("start the reader");
        MemoryPressure {
            child,
            limit,
            file,
            cgroup: Some(cgroup),
        }
    }

    /// The host path of the cgroup's memory pressure file.
    pub fn pressure_file(&self) -> String {
        self.cgroup
            .as_ref()
            .map(|c| c.dir.join("memory.pressure").display().to_string())
            .unwrap_or_default()
    }
}

/// Writes the file and drops it from the page cache, so that reading it charges the reader.
fn write_file(path: &PathBuf) {
    let mut f =
        fs::File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..FILE_MIB {
        f.write_all(&chunk).expect("write");
    }
    f.sync_all().expect("fsync");
    // SAFETY: fadvise on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

impl Drop for MemoryPressure {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The v2 cgroup goes first: a controller cannot be disabled while a child uses it.
        drop(self.cgroup.take());
        match &self.limit {
            Limit::V2 { control, enabled } => {
                if *enabled && let Err(err) = fs::write(control, "-memory") {
                    eprintln!("disabling memory in {}: {err}", control.display());
                }
            }
            Limit::V1(dir) => {
                for _ in 0..100 {
                    if fs::remove_dir(dir).is_ok() || !dir.exists() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        let _ = fs::remove_file(&self.file);
    }
}
