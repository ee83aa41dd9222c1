//! `cargo xtask bench probe-overhead`: what the fault probe costs an ordinary 4 KiB fault.
//!
//! A child in a cgroup whose hugetlb limits are 0 (a pod that requested no hugepages), pinned to
//! one CPU, touches fresh 4 KiB pages and reports the CPU time it spent, faults included. Four
//! modes alternate round by round so that drift hits them alike: no probe attached; the probe
//! attached but returning at once (the floor: what the kernel charges for running any program on
//! this tracepoint); cgroup-filter mode (the child's cgroup is not watched); and watch-everything
//! mode (`bpf_find_vma` on every fault). Per mode it prints the median and minimum CPU time per
//! fault and the median of the per-round ratios to that round's no-probe run (paired, so drift
//! between rounds cancels); the verdict uses that paired ratio.
//!
//! `probe-overhead [--mib M] [--rounds R]` (defaults 256 MiB per run, 21 rounds).

use hugepage_agent::{
    probes::{Counters, Probes, flags::FaultAttach},
    sysfs::HostFs,
};
use hugepage_agent_common::counters::Counter;
use hugepage_agent_tests::{HugetlbController, TestCgroup, Toucher, host_lock, v2};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoProbe,
    Floor,
    CgroupFilter,
    WatchAll,
}

const MODES: [Mode; 4] = [
    Mode::NoProbe,
    Mode::Floor,
    Mode::CgroupFilter,
    Mode::WatchAll,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoProbe => "no probe",
            Mode::Floor => "attached, returns at once",
            Mode::CgroupFilter => "cgroup-filter mode",
            Mode::WatchAll => "watch-everything mode",
        }
    }

    /// (fault program attached, paused, watching every process)
    fn settings(self) -> (bool, bool, bool) {
        match self {
            Mode::NoProbe => (false, false, false),
            Mode::Floor => (true, true, false),
            Mode::CgroupFilter => (true, false, false),
            Mode::WatchAll => (true, false, true),
        }
    }
}

fn main() {
    let (mut mib, mut rounds) = (256usize, 21usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--mib", Some(v)) if v > 0 => mib = v,
            ("--rounds", Some(v)) if v > 0 => rounds = v,
            _ => {
                eprintln!("usage: probe-overhead [--mib M] [--rounds R] (both above zero)");
                std::process::exit(2);
            }
        }
    }
    let pages = mib * 256;
    let toucher = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("toucher")))
        .filter(|p| p.exists())
        .expect("the toucher binary beside this one (cargo xtask bench builds both)");
    let toucher = toucher.to_string_lossy().into_owned();

    let lock = host_lock();
    let _controller = HugetlbController::enable(&lock);
    let pod = TestCgroup::create(&lock, "bench");
    pod.set("hugetlb.2MB.max", "0");
    pod.set("hugetlb.1GB.max", "0");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = runtime.enter();
    let host = HostFs::new("/");
    let (mut probes, _streams) = Probes::load(&host, FaultAttach::Auto)
        .unwrap_or_else(|e| panic!("loading the probes: {}", e.explain()));
    let scan = v2().scan(&host).expect("scan cgroups");
    assert!(
        !scan.watched.contains(&pod.id),
        "the benchmark cgroup must not be watched"
    );
    probes.sync_watched(&scan.watched).expect("watch set");

    println!(
        "probe-overhead: {mib} MiB of fresh 4 KiB faults per run ({pages} faults), {rounds} rounds, modes alternating"
    );
    let mut samples: [Vec<f64>; 4] = Default::default();
    let mut inspected = [0u64; 4];
    for round in 0..rounds {
        for k in 0..MODES.len() {
            let i = (round + k) % MODES.len();
            set_mode(&mut probes, MODES[i]);
            let before = probes.counters().expect("counters");
            let child = Toucher::run_with(&toucher, Some(&pod.dir), 0, pages, &["--cpu", "1"]);
            let after = probes.counters().expect("counters");
            samples[i].push(child.small_cpu_ns as f64 / pages as f64);
            inspected[i] += inspected_faults(&before, &after);
        }
    }
    let ratios: Vec<f64> = samples
        .iter()
        .map(|s| {
            median(
                s.iter()
                    .zip(&samples[0])
                    .map(|(m, none)| m / none)
                    .collect(),
            )
        })
        .collect();
    for (i, mode) in MODES.iter().enumerate() {
        let min = samples[i].iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:<26} median {:>6.0} ns/fault  min {:>6.0}  paired ratio {:.3}  bpf_find_vma calls {}",
            mode.name(),
            median(samples[i].clone()),
            min,
            ratios[i],
            inspected[i]
        );
    }
    let floor = (ratios[1] - 1.0) * 100.0;
    let overhead = (ratios[2] - 1.0) * 100.0;
    let verdict = if overhead <= 5.0 { "within" } else { "OUTSIDE" };
    println!(
        "cgroup-filter mode costs {overhead:+.1} % per ordinary fault vs no probe, of which {floor:+.1} % \
         is the kernel running any program on the tracepoint: {verdict} the 5 % target"
    );
}

fn set_mode(probes: &mut Probes, mode: Mode) {
    let (attached, paused, watch_all) = mode.settings();
    let attach = if attached {
        probes.attach_faults()
    } else {
        probes.detach_faults()
    };
    let result = attach
        .and_then(|()| probes.set_paused(paused))
        .and_then(|()| probes.set_watch_all(watch_all));
    if let Err(err) = result {
        panic!("switching the probe mode: {}", err.explain());
    }
}

/// Faults that reached `bpf_find_vma` (all processes) between two counter reads.
fn inspected_faults(before: &Counters, after: &Counters) -> u64 {
    Counter::FAULT_OUTCOMES
        .into_iter()
        .filter(|&c| c != Counter::FaultsFiltered)
        .map(|c| after.get(c) - before.get(c))
        .sum()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
