//! `cargo xtask bench probe-overhead`: what the fault probe costs an ordinary 4 KiB fault.
//!
//! A child in a cgroup whose hugetlb limits are 0 (a pod that requested no hugepages) touches
//! fresh 4 KiB pages and reports the CPU time it spent, faults included. Three modes alternate
//! round by round so drift hits them alike: no probe attached; the probe in cgroup-filter mode
//! (the child's cgroup is not watched: one map lookup, then out); the probe watching every process
//! (`bpf_find_vma` on every fault). Prints medians per fault and the ratios to no probe.
//!
//! `probe-overhead [--mib M] [--rounds R]` (defaults 512 MiB per run, 9 rounds).

use hugepage_agent::{
    probes::{Counters, Probes},
    sysfs::HostFs,
};
use hugepage_agent_common::counters::Counter;
use hugepage_agent_tests::{HugetlbController, TestCgroup, Toucher, host_lock, v2};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoProbe,
    CgroupFilter,
    WatchAll,
}

const MODES: [Mode; 3] = [Mode::NoProbe, Mode::CgroupFilter, Mode::WatchAll];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoProbe => "no probe",
            Mode::CgroupFilter => "cgroup-filter mode",
            Mode::WatchAll => "watch-everything mode",
        }
    }
}

fn main() {
    let (mut mib, mut rounds) = (512usize, 9usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (arg.as_str(), value) {
            ("--mib", Some(v)) => mib = v,
            ("--rounds", Some(v)) => rounds = v,
            _ => {
                eprintln!("usage: probe-overhead [--mib M] [--rounds R]");
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
    let _runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = _runtime.enter();
    let host = HostFs::new("/");
    let (mut probes, _streams) =
        Probes::load(&host).unwrap_or_else(|e| panic!("loading the probes: {}", e.explain()));
    let scan = v2().scan(&host).expect("scan cgroups");
    assert!(
        !scan.watched.contains(&pod.id),
        "the benchmark cgroup must not be watched"
    );
    probes.sync_watched(&scan.watched).expect("watch set");

    println!(
        "probe-overhead: {mib} MiB of fresh 4 KiB faults per run ({pages} faults), {rounds} rounds, modes alternating"
    );
    let mut samples: [Vec<f64>; 3] = Default::default();
    let mut inspected: [u64; 3] = [0; 3];
    for round in 0..rounds {
        for k in 0..MODES.len() {
            let i = (round + k) % MODES.len();
            set_mode(&mut probes, MODES[i]);
            let before = probes.counters().expect("counters");
            let child = Toucher::run(&toucher, Some(&pod.dir), 0, pages);
            let after = probes.counters().expect("counters");
            samples[i].push(child.small_cpu_ns as f64 / pages as f64);
            inspected[i] += inspected_faults(&before, &after);
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    for (i, mode) in MODES.iter().enumerate() {
        let min = samples[i].iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:<22} median {:>7.0} ns/fault  min {:>7.0}  ratio {:.3}  bpf_find_vma calls {}",
            mode.name(),
            medians[i],
            min,
            medians[i] / medians[0],
            inspected[i]
        );
    }
    let overhead = (medians[1] / medians[0] - 1.0) * 100.0;
    let verdict = if overhead <= 5.0 { "within" } else { "OUTSIDE" };
    println!(
        "cgroup-filter mode costs {overhead:+.1} % per ordinary fault vs no probe: {verdict} the 5 % target"
    );
}

fn set_mode(probes: &mut Probes, mode: Mode) {
    let result = match mode {
        Mode::NoProbe => probes.detach_faults(),
        Mode::CgroupFilter => probes
            .attach_faults()
            .and_then(|()| probes.set_watch_all(false)),
        Mode::WatchAll => probes
            .attach_faults()
            .and_then(|()| probes.set_watch_all(true)),
    };
    if let Err(err) = result {
        panic!("switching the probe mode: {}", err.explain());
    }
}

/// Faults that reached `bpf_find_vma` (all processes) between two counter reads.
fn inspected_faults(before: &Counters, after: &Counters) -> u64 {
    [
        Counter::FaultsNotHugetlb,
        Counter::HugetlbFaults,
        Counter::FindVmaBusy,
        Counter::FindVmaFailed,
    ]
    .into_iter()
    .map(|c| after.get(c) - before.get(c))
    .sum()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
