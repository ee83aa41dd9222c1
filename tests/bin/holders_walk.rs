//! `cargo xtask bench holders`: what one walk of the hugepages' holders costs on this host
//! (`holders::walk`, the walk behind `GET /v1/consumers`, `GET /v1/discrepancy` and, at most
//! every 5 s, `GET /metrics`), as the processes on the host grow.
//!
//! A hugetlbfs mount of the bench's own holds `--files` files of one 2 MiB page each that
//! nothing holds (the pool grown for them and restored after); then, for each count of
//! `--processes`, that many `sleep` children run beside everything else on the host while the
//! walk is made `--rounds` times in this process. Printed per count: the processes `/proc`
//! holds, the walk's median and p99, its CPU time per walk (this thread's), the median of one
//! read of the task iterators alone (#45: the probes are loaded once, and the walk reads them as
//! the agent's does), and this process's peak memory. Each walk is checked to name every file
//! held by nothing that runs.
//!
//! `holders-walk [--processes 1,1000,2000] [--files 64] [--rounds 20]`

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent::{
    holders::{self, Kind, book::Book},
    probes::{Probes, flags::FaultAttach},
    sysfs::{HostFs, hugepages},
};
use hugepage_agent_tests::{
    BenchFlags, Footprint, HugepagePool, Percentiles, clock_ns, host_lock,
    hugetlbfs::{Mounted, left_behind},
};

const MI2: u64 = 2 << 20;

/// `sleep` children, killed when dropped.
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn main() {
    let flags = BenchFlags::parse(
        "holders-walk [--processes 1,1000,2000] [--files 64] [--rounds 20]",
        &["--processes", "--files", "--rounds"],
    );
    let counts = flags.numbers("--processes", &[1, 1000, 2000]);
    let files = flags.number("--files", 64);
    let rounds = flags.number("--rounds", 20) as usize;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, files);
    let mount = Mounted::new(&lock, "pagesize=2M", None);
    for i in 0..files {
        left_behind(&mount.path(&format!("rtemap_{i}")), 1, MI2, None);
    }
    let host = HostFs::new("/");
    let pools = hugepages::read_table(&host).expect("the pools");
    let (probes, _streams) = Probes::load(&host, FaultAttach::Auto)
        .unwrap_or_else(|e| panic!("the probes on this kernel: {}", e.explain()));
    let tasks = probes
        .tasks
        .clone()
        .unwrap_or_else(|why| panic!("the task iterators on this kernel: {why}"));
    let book = Book::default();
    book.read_tasks(Some(Ok(tasks.clone())));
    println!(
        "{files} files of one 2 MiB page held by nothing that runs in {}; {rounds} walks per row",
        mount.dir.display()
    );
    println!(
        "{:>9} {:>12} {:>12} {:>14} {:>14} {:>10}",
        "processes", "median ms", "p99 ms", "CPU ms/walk", "iterators ms", "peak MiB"
    );
    for count in counts {
        let sleepers = Sleepers(
            (0..count)
                .map(|_| {
                    Command::new("sleep")
                        .arg("3600")
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("spawn sleep")
                })
                .collect(),
        );
        let on_host = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count();
        let mut took = Vec::with_capacity(rounds);
        let cpu_before = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        for _ in 0..rounds {
            let started = Instant::now();
            let held = holders::walk_with(&host, &pools, &book);
            took.push(started.elapsed());
            let orphans = held
                .holders
                .iter()
                .filter(|h| h.kind == Kind::HugetlbfsFile && h.held_by_nothing_that_runs)
                .count() as u64;
            assert!(
                orphans >= files,
                "the walk named {orphans} of {files} files"
            );
        }
        let cpu = Duration::from_nanos(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - cpu_before);
        let mut read = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            tasks.read().expect("the task iterators");
            read.push(started.elapsed());
        }
        let p = Percentiles::of(&mut took);
        let iterators = Percentiles::of(&mut read);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{on_host:>9} {:>12.1} {:>12.1} {:>14.1} {:>14.2} {:>10.1}",
            ms(p.median),
            ms(p.p99),
            ms(cpu) / rounds as f64,
            ms(iterators.median),
            Footprint::of(std::process::id()).peak_rss_kib as f64 / 1024.0
        );
        drop(sleepers);
    }
}
