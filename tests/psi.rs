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

/// A `kubepods` cgroup made for the test, removed on drop.
struct Kubepods(std::path::PathBuf);

impl Drop for Kubepods {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir(&self.0) {
            eprintln!("removing {}: {err}", self.0.display());
        }
    }
}

#[test]
fn a_kubepods_cgroup_that_appears_is_found_and_read() {
    let _lock = host_lock();
    let host = HostFs::new("/");
    let mount = hugepage_agent_tests::v2().mount;
    let dir = std::path::PathBuf::from(format!("{mount}/kubepods"));
    if dir.exists() || std::path::Path::new(&format!("{mount}/kubepods.slice")).exists() {
        eprintln!(
            "skipped: this host runs a kubelet ({} exists); its kubepods cgroup is not ours to touch",
            dir.display()
        );
        return;
    }
    let config = hugepage_agent::psi::monitor::PsiConfig {
        memory_threshold: 10.0,
        io_threshold: 25.0,
        interval: Duration::from_secs(5),
    };
    let (mut monitor, reader) = hugepage_agent::psi::monitor::Monitor::new(host, config);
    monitor.evaluate(std::time::SystemTime::now());
    assert!(reader.load().scopes.kubepods.unavailable.is_some());
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let _kubepods = Kubepods(dir.clone());
    monitor.evaluate(std::time::SystemTime::now());
    let view = reader.load();
    assert_eq!(
        view.scopes.kubepods.dir.as_deref(),
        Some(dir.to_str().expect("utf-8"))
    );
    let kubepods_files: Vec<&str> = view
        .readings
        .iter()
        .filter(|r| r.scope == hugepage_agent::psi::Scope::Kubepods)
        .map(|r| r.file.as_str())
        .collect();
    assert_eq!(kubepods_files.len(), 3, "{kubepods_files:?}");
    let memory = view
        .conditions
        .iter()
        .find(|c| c.kind == "KubepodsMemoryContentionPressure")
        .expect("listed");
    assert_eq!(
        memory.status,
        hugepage_agent::psi::condition::Status::False,
        "an empty cgroup has no pressure: {memory:?}"
    );
}
