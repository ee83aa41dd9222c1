//! Faults injected on the real kernel, with the real agent (eBPF on) running as root: sysfs files
//! that turn unreadable while the agent runs, and ring buffers that overflow. Each test says what
//! it injects, what the agent must do, and what is lost (nothing). Every mount, pool and cgroup
//! is restored by a guard on every exit path, failures included.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, HugepagePool, HugetlbController, TestCgroup, Toucher, agent_bin, host_lock, http,
    read_u64,
};
use serde_json::Value;

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const NODE0_2M: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";
const GLOBAL_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";
const MI2: u64 = 2 << 20;

/// The agent in a private mount namespace of its own (`unshare --mount --propagation private`
/// execs it: the pid is the agent's), reading the host's real `/sys`.
fn agent_in_own_mount_namespace(extra: &[&str]) -> Agent {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(agent_bin())
        .args(["run", "--host-root", "/", "--ebpf", "on"])
        .args(extra);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(30), |l| {
        l["source"] == "ebpf+sysfs"
    });
    agent
}

/// Empty tmpfs mounts over sysfs directories, in the mount namespace of process `pid` only;
/// unmounted when dropped (they also go with the namespace when its last process exits).
struct Hidden {
    pid: u32,
    dirs: Vec<&'static str>,
}

impl Hidden {
    fn mount(pid: u32, dirs: &[&'static str]) -> Hidden {
        let mut hidden = Hidden {
            pid,
            dirs: Vec::new(),
        };
        for &dir in dirs {
            let status = nsenter(pid)
                .args(["mount", "-t", "tmpfs", "-o", "size=4k,mode=0555"])
                .args(["hugepage-agent-test-hide", dir])
                .status()
                .expect("run nsenter");
            assert!(
                status.success(),
                "mounting a tmpfs over {dir} in {pid}'s namespace"
            );
            hidden.dirs.push(dir);
        }
        hidden
    }

    /// Unmounts everything, asserting that it worked.
    fn unmount(mut self) {
        for dir in std::mem::take(&mut self.dirs).into_iter().rev() {
            let status = nsenter(self.pid)
                .args(["umount", dir])
                .status()
                .expect("run nsenter");
            assert!(
                status.success(),
                "unmounting {dir} in {}'s namespace",
                self.pid
            );
        }
    }
}

impl Drop for Hidden {
    fn drop(&mut self) {
        for dir in self.dirs.iter().rev() {
            let _ = nsenter(self.pid)
                .args(["umount", dir])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn nsenter(pid: u32) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.args(["--target", &pid.to_string(), "--mount", "--"]);
    cmd
}

/// Whether `dir` is a mount point in the mount namespace of `/proc/<who>`.
fn is_mount_point(who: &str, dir: &str) -> bool {
    fs::read_to_string(format!("/proc/{who}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(dir))
}

fn get(port: u16, path: &str) -> Value {
    let (status, body) = http(port, "GET", path, None, "");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

fn metrics(port: u16) -> String {
    let (status, body) = http(port, "GET", "/metrics", None, "");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample whose name and labels start with `series`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Node 0's 2 MiB pool in `GET /v1/hugepages`.
fn node0_2m(map: &Value) -> Value {
    map["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == 0))
        .and_then(|n| n["sizes"].as_array())
        .and_then(|sizes| sizes.iter().find(|s| s["pageSizeBytes"] == MI2))
        .cloned()
        .unwrap_or_else(|| panic!("no node 0 2 MiB pool in {map:#}"))
}

fn global_2m(map: &Value) -> Value {
    map["global"]
        .as_array()
        .and_then(|g| g.iter().find(|s| s["pageSizeBytes"] == MI2))
        .cloned()
        .unwrap_or_else(|| panic!("no system-wide 2 MiB pool in {map:#}"))
}

/// Polls `check` every 50 ms until it returns `Some`; panics with `what` after `within`.
fn until<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn admit(port: u16, pages: u64) -> Value {
    let body = format!(
        "{{\"containers\":[{{\"name\":\"a\",\"resources\":{{\"hugepages-2Mi\":\"{}\"}}}}],\"numaNodes\":[0]}}",
        hugepage_agent::quantity::format_binary(pages * MI2)
    );
    let (status, answer) = http(port, "POST", "/v1/admit", Some("application/json"), &body);
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("JSON")
}

/// Whether the agent has logged a line that satisfies `pred`.
fn logged(agent: &mut Agent, pred: impl Fn(&Value) -> bool) -> bool {
    agent.log.take_in();
    agent.log.seen.iter().any(pred)
}

/// Injected: node 0's 2 MiB pool directory and the system-wide 2 MiB directory become empty (a
/// tmpfs mounted over each in the agent's own mount namespace) while the agent runs, and the
/// pool grows by 2 pages meanwhile. The agent must: answer `POST /v1/admit` for that size as
/// `--on-sysfs-error` says, naming the file (answer, log, metric); keep the map's last good
/// figures for those pools, marked stale with since-when and the file (`GET /v1/hugepages`,
/// `/metrics`); and, once the files are back, drop the mark, show the grown pool and verify
/// exactly again. Lost: nothing (the host's namespace never sees the mounts).
fn unreadable_sysfs_files(on_sysfs_error: &str) {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let mut agent = agent_in_own_mount_namespace(&[
        "--reconcile-interval",
        "500ms",
        "--on-sysfs-error",
        on_sysfs_error,
    ]);
    let port = agent.port;
    let total = read_u64(&format!("{NODE0_2M}/nr_hugepages"));
    let before = node0_2m(&get(port, "/v1/hugepages"));
    assert_eq!(before["total"], total, "{before}");
    assert!(before.get("stale").is_none(), "{before}");

    let hidden = Hidden::mount(agent.pid(), &[NODE0_2M, GLOBAL_2M]);
    let hidden_at = Instant::now();
    assert!(is_mount_point(&agent.pid().to_string(), NODE0_2M));
    assert!(
        !is_mount_point("self", NODE0_2M) && !is_mount_point("self", GLOBAL_2M),
        "the host's namespace is untouched"
    );
    let file = format!("{NODE0_2M}/free_hugepages");
    // The host still reads it (read_u64 panics otherwise).
    read_u64(&file);
    // The truth moves on while the agent cannot see it.
    let _grown = HugepagePool::reserve_in(&lock, &format!("{NODE0_2M}/nr_hugepages"), total + 2);

    let answer = admit(port, 1);
    let check = &answer["checks"][0];
    assert!(
        check["unverified"]
            .as_str()
            .is_some_and(|e| e.contains(&file)),
        "the answer names the file: {answer}"
    );
    match on_sysfs_error {
        "admit" => assert_eq!(
            (&answer["allowed"], &check["ok"]),
            (&Value::Bool(true), &Value::Bool(true)),
            "admitted unverified: {answer}"
        ),
        _ => {
            assert_eq!(answer["allowed"], false, "{answer}");
            assert_eq!(answer["reason"], "HugepagesVerificationUnavailable");
            assert!(
                answer["message"].as_str().is_some_and(|m| {
                    m.starts_with("cannot verify hugepages-2Mi on NUMA node(s) [0]: ")
                        && m.contains(&file)
                }),
                "the refusal names the file: {answer}"
            );
        }
    }
    let errors = sample(
        &metrics(port),
        "hugepage_agent_verification_sysfs_errors_total",
    );
    assert_eq!(errors, Some(1.0), "counted");
    until(Duration::from_secs(5), "a warning naming the file", || {
        logged(&mut agent, |l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("hugepages not verified: ") && m.contains(&file))
        })
        .then_some(())
    });

    // The map: the last good figures, marked stale, naming the file.
    let (pool, global) = until(
        Duration::from_secs(10),
        "the map marks the pools stale",
        || {
            let map = get(port, "/v1/hugepages");
            let (pool, global) = (node0_2m(&map), global_2m(&map));
            (pool.get("stale").is_some() && global.get("stale").is_some()).then_some((pool, global))
        },
    );
    let marked_after = hidden_at.elapsed();
    assert_eq!(
        pool["total"], total,
        "the last good figure, not the grown pool: {pool}"
    );
    assert!(
        pool["stale"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(NODE0_2M)),
        "{pool}"
    );
    assert!(
        pool["stale"]["since"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{pool}"
    );
    assert!(
        global["stale"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(GLOBAL_2M)),
        "{global}"
    );
    assert!(
        logged(&mut agent, |l| {
            l["message"] == "hugepage pool unreadable: the map keeps its last figures, marked stale"
                && l["error"].as_str().is_some_and(|e| e.contains(NODE0_2M))
        }),
        "the map's warning names the file"
    );
    let text = metrics(port);
    let stale_series =
        "hugepage_agent_hugepages_stale_seconds{numa_node=\"0\",hugepage_size=\"2Mi\"}";
    assert!(
        sample(&text, stale_series).is_some_and(|s| s > 0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "hugepage_agent_hugepages_pool_pages{numa_node=\"0\",hugepage_size=\"2Mi\"}"
        ),
        Some(total as f64),
        "the metric keeps the last good figure too"
    );

    // The files come back: the mark goes, the map shows the grown pool, verification is exact.
    hidden.unmount();
    let back_at = Instant::now();
    let pool = until(Duration::from_secs(10), "the map recovers", || {
        let pool = node0_2m(&get(port, "/v1/hugepages"));
        (pool.get("stale").is_none() && pool["total"] == total + 2).then_some(pool)
    });
    let recovered_after = back_at.elapsed();
    assert!(
        global_2m(&get(port, "/v1/hugepages"))
            .get("stale")
            .is_none()
    );
    assert_eq!(sample(&metrics(port), stale_series), Some(0.0));
    assert!(
        agent
            .lines_with("hugepage pool readable again")
            .iter()
            .any(|l| l["node"] == 0),
        "the recovery is logged"
    );
    let free = read_u64(&file);
    assert_eq!(pool["free"], free, "{pool}");
    let exact = admit(port, free);
    assert_eq!(exact["allowed"], true, "{exact}");
    assert_eq!(exact["checks"][0]["availableBytes"], free * MI2, "{exact}");
    assert!(exact["checks"][0].get("unverified").is_none(), "{exact}");
    let over = admit(port, free + 1);
    assert_eq!(over["reason"], "FailedHugepagesVerification", "{over}");
    assert_eq!(
        sample(
            &metrics(port),
            "hugepage_agent_verification_sysfs_errors_total"
        ),
        Some(1.0),
        "no error since"
    );
    println!(
        "--on-sysfs-error {on_sysfs_error}: marked stale {marked_after:?} after the files were hidden, fresh {recovered_after:?} after they came back (reconcile every 500 ms)"
    );
    let (status, _) = agent.terminate();
    assert!(status.success());
}

#[test]
fn unreadable_sysfs_files_admit_unverified_and_the_map_keeps_its_last_figures_marked_stale() {
    unreadable_sysfs_files("admit");
}

#[test]
fn unreadable_sysfs_files_refuse_naming_the_file_with_on_sysfs_error_reject() {
    unreadable_sysfs_files("reject");
}

/// Directories a test made under a cgroup, removed deepest first when dropped (after the
/// processes in them are gone); a directory already removed is fine.
struct CgroupDirs(Vec<PathBuf>);

impl CgroupDirs {
    fn mkdir(&mut self, dir: PathBuf, hugetlb_below: bool) -> PathBuf {
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        self.0.push(dir.clone());
        if hugetlb_below {
            fs::write(dir.join("cgroup.subtree_control"), "+hugetlb")
                .unwrap_or_else(|e| panic!("enabling hugetlb in {}: {e}", dir.display()));
        }
        dir
    }
}

impl Drop for CgroupDirs {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            if let Err(err) = fs::remove_dir(dir)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                eprintln!("removing {}: {err}", dir.display());
            }
        }
    }
}

/// Stops a process (`SIGSTOP`) and continues it when dropped.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        let state = || {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()?.to_owned()))
        };
        until(Duration::from_secs(5), "the agent stops", || {
            (state().as_deref() == Some("T")).then_some(())
        });
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

fn lost(text: &str, ring: &str) -> u64 {
    sample(
        text,
        &format!("hugepage_agent_ring_buffer_lost_events_total{{ring_buffer=\"{ring}\"}}"),
    )
    .map_or(0, |v| v as u64)
}

/// The consumer listed for cgroup `rel`, if any.
fn consumer(port: u16, rel: &str) -> Option<Value> {
    get(port, "/v1/consumers")["consumers"]
        .as_array()
        .and_then(|list| list.iter().find(|c| c["cgroup"] == rel).cloned())
}

fn reservation_ids(port: u16) -> Vec<String> {
    get(port, "/v1/reservations")["reservations"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn reserve(port: u16, uid: &str, pages: u64) -> String {
    let body = format!(
        "{{\"pod\":{{\"uid\":\"{uid}\"}},\"containers\":[{{\"name\":\"a\",\"resources\":{{\"hugepages-2Mi\":\"{}\"}}}}],\"numaNodes\":[0]}}",
        hugepage_agent::quantity::format_binary(pages * MI2)
    );
    let (status, answer) = http(port, "POST", "/v1/admit", Some("application/json"), &body);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(answer["allowed"], true, "{answer}");
    answer["reservation"]["id"]
        .as_str()
        .expect("a reservation")
        .to_owned()
}

/// Faults `pages` 2 MiB pages in `cgroup` and exits (the pages go back to the pool).
fn fault_and_exit(cgroup: &Path, pages: u64) {
    let status = Command::new(TOUCHER)
        .arg("--cgroup")
        .arg(cgroup)
        .args(["--huge", &pages.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("run toucher");
    assert!(status.success(), "toucher in {}", cgroup.display());
}

const POD_W: &str = "0f000000-0000-4000-8000-00000000000a";
const POD_X: &str = "0f000000-0000-4000-8000-00000000000b";
const POD_Y: &str = "0f000000-0000-4000-8000-00000000000c";
const CONTAINER_W: &str = "aaaa000000000000000000000000000000000000000000000000000000000001";
const CONTAINER_X: &str = "bbbb000000000000000000000000000000000000000000000000000000000002";
/// Pod-shaped cgroups made and removed while the agent is stopped: each is a mkdir, an rmdir
/// and a release event of 560 bytes in a 512 KiB ring (936 records).
const CGROUP_CHURN: usize = 2000;
/// Toucher runs while the agent is stopped, each faulting [`PAGES_PER_RUN`] pages: 6,000 fault
/// records of 80 bytes for a 256 KiB ring (3,276 records).
const FAULT_RUNS: usize = 100;
const PAGES_PER_RUN: u64 = 60;
/// Pages pod X's container faults (and holds) while the agent is stopped.
const X_PAGES: u64 = 4;

/// Injected: the agent is stopped (`SIGSTOP`, so its ring-buffer readers stop while the eBPF
/// programs keep writing), then 2,000 pod cgroups are made and removed and 6,000 hugetlb faults
/// are taken in a watched container, more than either ring holds; after the rings are full, pod
/// Y's cgroup (with a reservation) is removed, and pod X's cgroups (with a reservation) are made
/// and its container faults 4 pages: every one of those events is lost. Then `SIGCONT`. The
/// agent must count the losses per ring and export them, reconcile at once (the interval is 1 h:
/// only the losses can bring it forward), and so be right again: Y's reservation ends (pod gone),
/// X's ends (pod faulted), X is watched (its next faults are seen), `GET /v1/consumers` lists X
/// with its pages and none of the removed cgroups, and the map equals sysfs. Lost: the events
/// themselves (counted); nothing the agent serves.
#[test]
fn ring_buffers_overflowing_are_counted_and_a_reconcile_makes_inventory_and_map_right_again() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, PAGES_PER_RUN + X_PAGES + 8);
    let _controller = HugetlbController::enable(&lock);
    let root = TestCgroup::create(&lock, "overflow");
    root.set("cgroup.subtree_control", "+hugetlb");
    let mut dirs = CgroupDirs(Vec::new());
    let kubepods = dirs.mkdir(root.dir.join("kubepods"), true);
    let pod_w = dirs.mkdir(kubepods.join(format!("pod{POD_W}")), true);
    let container_w = dirs.mkdir(pod_w.join(CONTAINER_W), false);
    let pod_y = dirs.mkdir(kubepods.join(format!("pod{POD_Y}")), true);
    let rel = |dir: &Path| {
        format!(
            "{}{}",
            root.rel,
            dir.strip_prefix(&root.dir)
                .map_or(String::new(), |p| format!("/{}", p.display()))
        )
    };

    let mut agent = Agent::start({
        let mut cmd = Command::new(agent_bin());
        cmd.args(["run", "--ebpf", "on", "--reconcile-interval", "1h"])
            .args(["--reservation-ttl", "1h"]);
        cmd
    });
    agent.wait_for("agent running", Duration::from_secs(30), |l| {
        l["source"] == "ebpf+sysfs"
    });
    let port = agent.port;
    let id_y = reserve(port, POD_Y, 2);
    let id_x = reserve(port, POD_X, X_PAGES);
    // W is watched: its faults are seen.
    let w_id = fs::metadata(&container_w).map(|m| m.ino()).expect("stat");
    fault_and_exit(&container_w, 2);
    agent.wait_for("hugetlb fault", Duration::from_secs(5), |l| {
        l["cgroup_id"] == w_id
    });
    let text = metrics(port);
    let lost_before = (lost(&text, "hugetlb_faults"), lost(&text, "cgroup_events"));
    assert_eq!(lost_before, (0, 0), "nothing lost yet");

    let stopped = Stopped::stop(agent.pid());
    let burst = Instant::now();
    for i in 0..CGROUP_CHURN {
        let dir = kubepods.join(format!("pod0e000000-0000-4000-8000-{i:012}"));
        let mut churn = CgroupDirs(Vec::new());
        churn.mkdir(dir, false);
    }
    for _ in 0..FAULT_RUNS {
        fault_and_exit(&container_w, PAGES_PER_RUN);
    }
    // The rings are full: these are lost.
    fs::remove_dir(&pod_y).expect("rmdir pod Y");
    let pod_x = dirs.mkdir(kubepods.join(format!("pod{POD_X}")), true);
    let container_x = dirs.mkdir(pod_x.join(CONTAINER_X), false);
    let x_first = Toucher::run(TOUCHER, Some(&container_x), X_PAGES as usize, 0);
    let burst_took = burst.elapsed();
    drop(stopped);
    let continued = Instant::now();

    let (lost_faults, lost_cgroup) = until(Duration::from_secs(10), "losses exported", || {
        let text = metrics(port);
        let lost = (lost(&text, "hugetlb_faults"), lost(&text, "cgroup_events"));
        (lost.0 > 0 && lost.1 > 0).then_some(lost)
    });
    let line = agent.wait_for(
        "probe events lost (ring buffer full): reconciling now",
        Duration::from_secs(10),
        |_| true,
    );
    assert!(line["lost"].as_u64().is_some_and(|n| n > 0), "{line}");
    let reconciled_after = continued.elapsed();

    // The inventory: Y gone, X found and faulted; both reservations end.
    until(Duration::from_secs(10), "both reservations end", || {
        let ids = reservation_ids(port);
        (!ids.contains(&id_y) && !ids.contains(&id_x)).then_some(())
    });
    agent.wait_for("reservation released", Duration::from_secs(1), |l| {
        l["id"] == id_y.as_str() && l["reason"] == "PodRemoved"
    });
    agent.wait_for("reservation released", Duration::from_secs(1), |l| {
        l["id"] == id_x.as_str() && l["reason"] == "Faulted"
    });
    let inventory_after = continued.elapsed();
    let x_rel = rel(&container_x);
    let listed = consumer(port, &x_rel).unwrap_or_else(|| panic!("{x_rel} listed"));
    assert_eq!(listed["inUseBytes"], X_PAGES * MI2, "{listed}");
    assert_eq!(listed["podUid"], POD_X, "{listed}");
    let all = get(port, "/v1/consumers").to_string();
    assert!(
        !all.contains("pod0e000000") && !all.contains(POD_Y),
        "removed cgroups are gone: {all}"
    );

    // X is watched again: its next faults are seen.
    let x_id = fs::metadata(&container_x).map(|m| m.ino()).expect("stat");
    let x_second = Toucher::run(TOUCHER, Some(&container_x), 2, 0);
    agent.wait_for("hugetlb fault", Duration::from_secs(5), |l| {
        l["cgroup_id"] == x_id
    });
    let listed = until(Duration::from_secs(5), "X's faults listed", || {
        consumer(port, &x_rel).filter(|c| c["faults"].as_u64() >= Some(2))
    });
    assert_eq!(listed["inUseBytes"], (X_PAGES + 2) * MI2, "{listed}");

    // The map equals sysfs.
    let pool = until(Duration::from_secs(5), "the map equals sysfs", || {
        let pool = node0_2m(&get(port, "/v1/hugepages"));
        let sysfs = (
            read_u64(&format!("{NODE0_2M}/nr_hugepages")),
            read_u64(&format!("{NODE0_2M}/free_hugepages")),
        );
        (pool["total"] == sysfs.0 && pool["free"] == sysfs.1).then_some(pool)
    });
    let text = metrics(port);
    assert_eq!(
        sample(
            &text,
            "hugepage_agent_hugepages_free_pages{numa_node=\"0\",hugepage_size=\"2Mi\"}"
        ),
        pool["free"].as_f64()
    );
    println!(
        "burst of {CGROUP_CHURN} cgroups and {} faults in {burst_took:?}: lost {lost_faults} hugetlb fault and {lost_cgroup} cgroup events; reconciled {reconciled_after:?} after SIGCONT, reservations and inventory right {inventory_after:?} after it",
        FAULT_RUNS as u64 * PAGES_PER_RUN
    );
    drop((x_first, x_second));
    let (status, _) = agent.terminate();
    assert!(status.success());
    drop(dirs);
}
