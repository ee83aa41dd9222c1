//! What the tests may leave on the host, made checkable: a snapshot of everything a test could
//! change (the agent's state directory, the tests' lock and temporary files, hugepage pools,
//! cgroups, the cgroup v2 root's controllers, mounts), compared before and after `cargo xtask
//! test`; and the reset that `cargo xtask fresh-test` starts from, which removes what the
//! project's own tests and agents create, so that the suite runs as on a new machine.
//!
//! The comparison is what makes "the suite leaves nothing behind" a check instead of a hope: a
//! test that depended on a directory another had left passed only on machines that had run the
//! suite once.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// The agent's default `--state-dir`: no test may use it.
const STATE_DIR: &str = "/var/lib/hugepage-agent";
/// The lock that serialises the tests that change the host (`tests/lib.rs`).
const TEST_LOCK: &str = "/run/hugepage-agent-tests.lock";
/// Test cgroups are named `hugepage-agent-test-<name>-<pid>` (`tests/lib.rs`).
const TEST_CGROUP_PREFIX: &str = "hugepage-agent-test-";
/// Temporary files and directories of tests and benches start with this.
const TMP_PREFIX: &str = "hugepage-agent-";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const POOLS: &str = "/sys/kernel/mm/hugepages";
const NODES: &str = "/sys/devices/system/node";
/// Mounted by the agent itself when missing (docs/install/cluster.md, Requirements): not a test's leftover.
const TRACEFS: &str = "/sys/kernel/tracing";

/// Everything on the host a test could change, as text per item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<String, String>);

impl Snapshot {
    pub fn capture() -> Snapshot {
        let mut items = BTreeMap::new();
        items.insert(
            format!("{STATE_DIR} (the agent's default state directory)"),
            describe_path(Path::new(STATE_DIR)),
        );
        for entry in read_dir_names(Path::new("/tmp")) {
            if entry.starts_with(TMP_PREFIX) {
                items.insert(format!("/tmp/{entry}"), "present".into());
            }
        }
        for pool in read_dir_names(Path::new(POOLS)) {
            for file in ["nr_hugepages", "nr_overcommit_hugepages"] {
                let path = Path::new(POOLS).join(&pool).join(file);
                items.insert(path.display().to_string(), read_trimmed(&path));
            }
        }
        for node in read_dir_names(Path::new(NODES)) {
            if !node.starts_with("node") {
                continue;
            }
            let dir = Path::new(NODES).join(&node).join("hugepages");
            for pool in read_dir_names(&dir) {
                let path = dir.join(&pool).join("nr_hugepages");
                items.insert(path.display().to_string(), read_trimmed(&path));
            }
        }
        for hierarchy in read_dir_names(Path::new(CGROUP_ROOT)) {
            let dir = Path::new(CGROUP_ROOT).join(&hierarchy);
            let children: Vec<String> = subdirectories(&dir);
            items.insert(
                format!("cgroups directly under {}", dir.display()),
                children.join(" "),
            );
            let control = dir.join("cgroup.subtree_control");
            if control.exists() {
                items.insert(control.display().to_string(), read_trimmed(&control));
            }
        }
        items.insert("mount points".into(), mount_points().join(" "));
        Snapshot(items)
    }

    /// What differs from `before`, one line each; empty when the host is as it was.
    pub fn changes_since(&self, before: &Snapshot) -> Vec<String> {
        let keys: BTreeSet<&String> = before.0.keys().chain(self.0.keys()).collect();
        let absent = String::from("absent");
        keys.into_iter()
            .filter_map(|key| {
                let was = before.0.get(key).unwrap_or(&absent);
                let now = self.0.get(key).unwrap_or(&absent);
                (was != now).then(|| format!("{key}: was {was:?}, now {now:?}"))
            })
            .collect()
    }
}

/// Removes what the project's tests, benches and agents create on a host, and returns pools and
/// controllers to a new machine's state (no hugepages, hugetlb not enabled for the v2 root's
/// children, tracefs not mounted). For disposable machines of this kind only: it changes the host.
/// Refused while another test run holds the tests' lock: resetting the host under it would break
/// that run, and removing the lock would let a second run change the host beside it.
pub fn reset() -> Result<Vec<String>> {
    let _held = unheld(Path::new(TEST_LOCK))?;
    let mut done = Vec::new();
    for path in [Path::new(STATE_DIR), Path::new(TEST_LOCK)] {
        if path.exists() {
            remove(path)?;
            done.push(format!("removed {}", path.display()));
        }
    }
    for entry in read_dir_names(Path::new("/tmp")) {
        if entry.starts_with(TMP_PREFIX) {
            let path = Path::new("/tmp").join(&entry);
            remove(&path)?;
            done.push(format!("removed {}", path.display()));
        }
    }
    for hierarchy in read_dir_names(Path::new(CGROUP_ROOT)) {
        let dir = Path::new(CGROUP_ROOT).join(&hierarchy);
        for child in subdirectories(&dir) {
            if child.starts_with(TEST_CGROUP_PREFIX) {
                let path = dir.join(&child);
                remove_cgroup(&path)?;
                done.push(format!("removed cgroup {}", path.display()));
            }
        }
    }
    for pool in read_dir_names(Path::new(POOLS)) {
        for file in ["nr_hugepages", "nr_overcommit_hugepages"] {
            let path = Path::new(POOLS).join(&pool).join(file);
            if read_trimmed(&path) != "0" {
                fs::write(&path, "0")
                    .with_context(|| format!("writing 0 to {}", path.display()))?;
                done.push(format!("{} set to 0", path.display()));
            }
        }
    }
    let control = Path::new(CGROUP_ROOT).join("unified/cgroup.subtree_control");
    if read_trimmed(&control)
        .split_whitespace()
        .any(|c| c == "hugetlb")
    {
        fs::write(&control, "-hugetlb")
            .with_context(|| format!("disabling hugetlb in {}", control.display()))?;
        done.push(format!("hugetlb disabled in {}", control.display()));
    }
    if mount_points().iter().any(|m| m == TRACEFS) {
        cmd::run({
            let mut umount = std::process::Command::new("umount");
            umount.arg(TRACEFS);
            umount
        })?;
        done.push(format!("unmounted {TRACEFS}"));
    }
    Ok(done)
}

/// Leftovers that are the agent's documented behaviour, not a test's: tracefs mounted.
pub fn without_documented(changes: Vec<String>) -> Vec<String> {
    changes
        .into_iter()
        .map(|line| {
            if line.starts_with("mount points:") {
                // Compare the mount lists without tracefs, which the agent mounts when missing.
                line.replace(&format!(" {TRACEFS}"), "")
                    .replace(&format!("{TRACEFS} "), "")
            } else {
                line
            }
        })
        .filter(|line| {
            line.strip_prefix("mount points: was ")
                .and_then(|rest| rest.split_once(", now "))
                .is_none_or(|(was, now)| was != now)
        })
        .collect()
}

fn describe_path(path: &Path) -> String {
    match fs::read_dir(path) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect();
            names.sort();
            format!("present: [{}]", names.join(", "))
        }
        Err(_) if path.exists() => "present".into(),
        Err(_) => "absent".into(),
    }
}

fn read_dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn subdirectories(dir: &Path) -> Vec<String> {
    read_dir_names(dir)
        .into_iter()
        .filter(|name| dir.join(name).is_dir())
        .collect()
}

fn read_trimmed(path: &Path) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

fn mount_points() -> Vec<String> {
    let mut points: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(str::to_owned))
        .collect();
    points.sort();
    points.dedup();
    points
}

/// The lock file at `path`, locked by us (`flock`, as `tests/lib.rs` takes it), or `None` when
/// there is none; an error when another process holds it.
fn unheld(path: &Path) -> Result<Option<fs::File>> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => bail!(
            "{} is held: a test run is changing this host; wait for it to end, then run fresh-test",
            path.display()
        ),
        Err(fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

fn remove(path: &Path) -> Result<()> {
    if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
    .with_context(|| format!("removing {}", path.display()))
}

/// A cgroup and its descendants, deepest first (cgroup directories are removed with rmdir).
fn remove_cgroup(dir: &Path) -> Result<()> {
    for child in subdirectories(dir) {
        remove_cgroup(&dir.join(child))?;
    }
    fs::remove_dir(dir).with_context(|| format!("removing cgroup {}", dir.display()))
}

/// A fresh clone of the committed tree in a new temporary directory.
pub fn fresh_clone() -> Result<PathBuf> {
    let parent = std::env::temp_dir().join(format!("fresh-test-{}", std::process::id()));
    let clone = parent.join("hugepage-agent");
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let mut git = std::process::Command::new("git");
    git.args(["clone", "--quiet", "--no-hardlinks"])
        .arg(cmd::workspace())
        .arg(&clone);
    cmd::run(git)?;
    Ok(clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bug: fresh-test removed the tests' lock while another checkout's suite held it, and the
    /// two changed the host at once (a PSI test failed). A held lock refuses the reset.
    #[test]
    fn a_held_test_lock_refuses_the_reset_and_a_free_one_is_taken() {
        let path = std::env::temp_dir().join(format!("xtask-lock-test-{}", std::process::id()));
        assert!(unheld(&path).expect("no lock file").is_none());
        fs::write(&path, "").expect("the lock file");
        let holder = fs::File::open(&path).expect("open");
        holder.lock().expect("held by the other run");
        let refused = unheld(&path).expect_err("held elsewhere");
        assert!(
            refused
                .to_string()
                .contains("is held: a test run is changing this host")
        );
        drop(holder);
        // A child that another test of this binary forked while the lock was held shares it
        // until it execs (its copy is close-on-exec): milliseconds. Seen once, on a first run.
        let start = std::time::Instant::now();
        let free = loop {
            match unheld(&path) {
                Ok(lock) => break lock,
                Err(_) if start.elapsed() < std::time::Duration::from_secs(5) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("still held 5 s after it was let go: {e:#}"),
            }
        };
        assert!(free.is_some());
        drop(free);
        fs::remove_file(&path).expect("removed");
    }

    fn snapshot(items: &[(&str, &str)]) -> Snapshot {
        Snapshot(
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn a_directory_a_test_left_is_a_change() {
        let before = snapshot(&[("/var/lib/hugepage-agent", "absent")]);
        let after = snapshot(&[("/var/lib/hugepage-agent", "present: []")]);
        assert_eq!(
            after.changes_since(&before),
            ["/var/lib/hugepage-agent: was \"absent\", now \"present: []\""]
        );
        assert!(before.changes_since(&before).is_empty());
    }

    #[test]
    fn a_temporary_file_that_appeared_is_a_change() {
        let before = snapshot(&[]);
        let after = snapshot(&[("/tmp/hugepage-agent-x", "present")]);
        assert_eq!(
            after.changes_since(&before),
            ["/tmp/hugepage-agent-x: was \"absent\", now \"present\""]
        );
    }

    #[test]
    fn tracefs_mounted_by_the_agent_is_documented_but_other_mounts_are_not() {
        let before = snapshot(&[("mount points", "/ /proc")]);
        let tracefs = snapshot(&[("mount points", "/ /proc /sys/kernel/tracing")]);
        assert!(without_documented(tracefs.changes_since(&before)).is_empty());
        let other = snapshot(&[("mount points", "/ /mnt/x /proc /sys/kernel/tracing")]);
        assert_eq!(without_documented(other.changes_since(&before)).len(), 1);
    }
}
