//! `cargo xtask bench psi`: what a PSI evaluation costs and how fast a trigger becomes a
//! condition.
//!
//! 1. One evaluation tick on this host (read every pressure file of both scopes, apply the
//!    KEP-5394 logic, publish), `--ticks` times: median, p99, maximum.
//! 2. Real memory pressure in a cgroup (a reader confined to 32 MiB) with a kernel trigger armed
//!    on its `memory.pressure` at 2 % of the 2 s window: the time from starting the pressure to
//!    the first trigger, and, for each of `--fires` triggers, the time from the wake-up to the
//!    evaluation's published view.
//!
//! `psi-latency [--ticks N] [--fires N]` (defaults 20,000 and 10).

use std::time::{Duration, Instant, SystemTime};

use hugepage_agent::{
    psi::{
        monitor::{Monitor, PsiConfig},
        trigger::Trigger,
    },
    sysfs::HostFs,
};
use hugepage_agent_tests::{BenchFlags, MemoryPressure, Percentiles, host_lock};

fn main() {
    let flags = BenchFlags::parse(
        "psi-latency [--ticks N] [--fires N]",
        &["--ticks", "--fires"],
    );
    let ticks = flags.number("--ticks", 20_000) as usize;
    let fires = flags.number("--fires", 10) as usize;
    let host = HostFs::new("/");
    let config = PsiConfig {
        memory_threshold: 10.0,
        io_threshold: 25.0,
        interval: Duration::from_secs(5),
    };
    let (mut monitor, reader) = Monitor::new(host.clone(), config);
    for _ in 0..100 {
        monitor.evaluate(SystemTime::now());
    }
    let mut samples = Vec::with_capacity(ticks);
    for _ in 0..ticks {
        let start = Instant::now();
        monitor.evaluate(SystemTime::now());
        samples.push(start.elapsed());
    }
    let files = reader.load().readings.len();
    println!(
        "evaluation tick ({files} pressure files read)  {}",
        Percentiles::of(&mut samples)
    );

    let lock = host_lock();
    let pressure = MemoryPressure::start(&lock, "psi-bench");
    let file = pressure.pressure_file();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut first = None;
    let mut to_condition = Vec::with_capacity(fires);
    runtime.block_on(async {
        let trigger = Trigger::arm(&host, &file, 2.0)
            .unwrap_or_else(|e| panic!("arming a trigger on {file}: {e}"));
        for _ in 0..fires {
            tokio::time::timeout(Duration::from_secs(30), trigger.fired())
                .await
                .unwrap_or_else(|_| panic!("no trigger within 30 s on {file}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let woke = Instant::now();
            first.get_or_insert_with(|| started.elapsed());
            monitor.evaluate(SystemTime::now());
            let _view = reader.load();
            to_condition.push(woke.elapsed());
        }
    });
    drop(pressure);
    println!(
        "pressure start -> first trigger                {:.3} s (the kernel's 2 s window)",
        first.unwrap_or_default().as_secs_f64()
    );
    println!(
        "trigger wake -> conditions published ({fires} fires) {}",
        Percentiles::of(&mut to_condition)
    );
}
