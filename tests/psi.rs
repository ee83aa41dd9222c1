//! PSI on the real kernel: the system-scope readers return the live values, and a cgroup put
//! under real memory pressure sees its `memory.pressure` rise and a kernel trigger fire.

use std::time::{Duration, Instant};

use hugepage_agent::{
    psi::{Resource, source, trigger::Trigger},
    sysfs::HostFs,
};
use hugepage_agent_tests::{MemoryPressure, host_lock};

#[test]
fn system_scope_readers_return_what_the_kernel_reports() {
    let host = HostFs::new("/");
    let scopes = source::Scopes::locate(&host);
    for resource in Resource::ALL {
        let file = scopes
            .system
            .file(resource)
            .unwrap_or_else(|| panic!("PSI is on here: {:?}", scopes.system.unavailable));
        let before = std::fs::read_to_string(&file).expect("read directly");
        let ours = source::read(&host, &file).expect("parses");
        let after = std::fs::read_to_string(&file).expect("read directly");
        let total = |text: &str| -> u64 {
            text.lines()
                .next()
                .and_then(|l| l.rsplit_once("total="))
                .and_then(|(_, t)| t.trim().parse().ok())
                .expect("a some line with total")
        };
        assert!(
            (total(&before)..=total(&after)).contains(&ours.some.total),
            "{resource}: ours {} between {before:?} and {after:?}",
            ours.some.total
        );
    }
}

#[test]
fn memory_pressure_in_a_cgroup_rises_and_fires_a_trigger() {
    let lock = host_lock();
    let pressure = MemoryPressure::start(&lock, "psi");
    let file = pressure.pressure_file();
    let host = HostFs::new("/");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    // 2 % of the 2 s window: 40 ms of stall, which a reader confined to 32 MiB exceeds.
    let fired = runtime.block_on(async {
        let trigger = Trigger::arm(&host, &file, 2.0)
            .unwrap_or_else(|e| panic!("arming a trigger on {file}: {e}"));
        tokio::time::timeout(Duration::from_secs(30), trigger.fired()).await
    });
    match fired {
        Ok(Ok(())) => eprintln!(
            "trigger fired {:?} after the pressure started",
            started.elapsed()
        ),
        Ok(Err(err)) => panic!("{err}"),
        Err(_) => panic!("no trigger within 30 s: {:?}", source::read(&host, &file)),
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = source::read(&host, &file).expect("the cgroup's memory.pressure parses");
        if now.some.total > 0 && now.some.avg10 > 0.0 {
            eprintln!("{file}: {now:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pressure never showed in the averages: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
