//! `cargo xtask bench inventory`: the cgroup inventory at scale.
//!
//! 1. A generated cgroup v2 tree on tmpfs (`/dev/shm`) of `--pods` pods with 4 containers each
//!    (5,000 cgroups by default), every one with hugetlb files: the time of one pod-cgroup scan
//!    and of one `GET /v1/consumers` listing (median of 5), and the memory they take.
//! 2. The real kernel: the release agent runs (eBPF on) while this process creates and removes
//!    cgroups under a test cgroup, paced at `--rate` cgroup events per second (a mkdir and an
//!    rmdir each; the kernel adds a release event), for `--seconds`. Printed: the agent's CPU time
//!    per event and its peak memory, and the probe's counts of cgroup events seen and lost.
//!
//! `inventory-load --agent PATH [--pods N] [--rate R] [--seconds S]`
//! (defaults 1000, 10000, 3).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent::{
    consumers::{self, FaultBook},
    host::{GlobalPool, HugepageTable, PageSize},
    kubelet::pods::PodCgroups,
    probes::watch::CgroupV2,
    sysfs::HostFs,
};
use hugepage_agent_tests::{
    BenchFlags, Footprint, Percentiles, TestCgroup, cpu_time, free_port, fresh_state_dir,
    host_lock, wait_ready, wait_timeout,
};

struct Args {
    agent: PathBuf,
    pods: usize,
    rate: u64,
    seconds: u64,
}

fn parse_args() -> Args {
    let flags = BenchFlags::parse(
        "inventory-load --agent PATH [--pods N] [--rate R] [--seconds S]",
        &["--agent", "--pods", "--rate", "--seconds"],
    );
    Args {
        agent: flags.path("--agent"),
        pods: flags.number("--pods", 1000) as usize,
        rate: flags.number("--rate", 10_000),
        seconds: flags.number("--seconds", 3),
    }
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib(pid: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn generate(root: &Path, pods: usize) -> usize {
    let write = |dir: &Path, name: &str, value: &str| {
        fs::write(dir.join(name), value)
            .unwrap_or_else(|e| panic!("writing {}: {e}", dir.display()));
    };
    fs::create_dir_all(root).expect("mkdir root");
    write(root, "cgroup.controllers", "hugetlb\n");
    let mut count = 0;
    for p in 0..pods {
        let uid = format!("{p:08x}-0000-4000-8000-000000000000");
        let pod = root.join(format!("kubepods/burstable/pod{uid}"));
        let mut dirs = vec![pod.clone()];
        dirs.extend((0..4).map(|c| pod.join(format!("{:064x}", p * 4 + c))));
        for dir in dirs {
            fs::create_dir_all(&dir).expect("mkdir");
            write(&dir, "hugetlb.2MB.current", "2097152\n");
            write(&dir, "hugetlb.2MB.rsvd.current", "2097152\n");
            write(&dir, "hugetlb.2MB.numa_stat", "total=2097152 N0=2097152\n");
            count += 1;
        }
    }
    count
}

fn main() {
    let args = parse_args();
    let me = std::process::id().to_string();
    let tree = Path::new("/dev/shm").join(format!("hugepage-agent-inventory-{me}"));
    let count = generate(&tree.join("sys/fs/cgroup"), args.pods);
    let host = HostFs::new(&tree);
    assert!(
        CgroupV2::find(&host).is_some(),
        "the generated tree is a v2 hierarchy"
    );
    let pools = HugepageTable {
        nodes: Vec::new(),
        global: vec![GlobalPool {
            size: PageSize(2 << 20),
            total: 0,
            free: 0,
            reserved: 0,
            surplus: 0,
        }],
    };
    let rss_before = peak_rss_kib("self");
    let mut scans = Vec::new();
    let mut lists = Vec::new();
    let mut listed = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let pods = PodCgroups::scan(&host).expect("walks the generated tree");
        scans.push(start.elapsed());
        std::hint::black_box(pods);
        let start = Instant::now();
        listed = consumers::list(&host, &pools, &FaultBook::default())
            .expect("lists")
            .len();
        lists.push(start.elapsed());
    }
    let _ = fs::remove_dir_all(&tree);
    println!(
        "generated tree: {count} cgroups ({} pods x 5), {listed} consumers listed",
        args.pods
    );
    println!("pod-cgroup scan           {}", Percentiles::of(&mut scans));
    println!("consumers listing         {}", Percentiles::of(&mut lists));
    println!(
        "peak memory of this process grew by {} KiB over the scans",
        peak_rss_kib("self").saturating_sub(rss_before)
    );

    let lock = host_lock();
    let port = free_port();
    let log = std::env::temp_dir().join(format!("hugepage-agent-inventory-{port}.log"));
    let state = fresh_state_dir(0);
    let mut agent = Command::new(&args.agent)
        .args([
            "run",
            "--ebpf",
            "on",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
            "--reconcile-interval",
            "1h",
        ])
        .arg("--state-dir")
        .arg(state.path())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", args.agent.display()));
    if wait_ready(port, Duration::from_secs(30)).is_none() {
        let _ = agent.kill();
        panic!("the agent was not ready within 30 s; see {}", log.display());
    }
    let root = TestCgroup::create(&lock, "inventory");
    let pairs = args.rate / 2 * args.seconds;
    let cpu_before = cpu_time(agent.id());
    let began = Instant::now();
    for i in 0..pairs {
        let due = began + Duration::from_nanos(i * 2 * 1_000_000_000 / args.rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let dir = root.dir.join(format!("c{i}"));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        fs::remove_dir(&dir).unwrap_or_else(|e| panic!("rmdir {}: {e}", dir.display()));
    }
    let took = began.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let cpu = cpu_time(agent.id()).saturating_sub(cpu_before);
    let agent_memory = Footprint::of(agent.id());
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut agent, Duration::from_secs(10));
    drop(root);
    let totals = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"probe totals\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .next_back()
        .unwrap_or_default();
    let events = pairs * 2;
    println!(
        "real kernel: {events} mkdir+rmdir events in {:.2} s ({:.0} events/s offered)",
        took.as_secs_f64(),
        events as f64 / took.as_secs_f64()
    );
    println!(
        "agent CPU {:.0} ms in all, {:.1} us per offered event; agent memory: {agent_memory}",
        cpu.as_secs_f64() * 1000.0,
        cpu.as_secs_f64() * 1e6 / events as f64,
    );
    println!(
        "probe: cgroup_events {} (mkdir, rmdir and release, every hierarchy), cgroup_events_lost {}",
        totals["cgroup_events"], totals["cgroup_events_lost"]
    );
}
