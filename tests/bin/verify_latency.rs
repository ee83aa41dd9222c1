//! `cargo xtask bench verify`: what one KEP-5759 verification costs in process.
//!
//! Two hosts: a generated sysfs tree on tmpfs (`/dev/shm`) with 8 NUMA nodes and two page sizes,
//! and this machine's real sysfs. On each, a request for both sizes is verified on every node,
//! in `kep` and in `strict` mode, `--iterations` times after a warm-up (the first call opens the
//! descriptors that later calls `pread`). Each call is timed alone; the median, p99, p99.9 and
//! maximum are printed. The target is p99 under 50 µs, against the KEP's SLO of 10 ms.
//!
//! `verify-latency [--iterations N]` (default 200,000).

use std::{fs, path::Path, time::Instant};

use hugepage_agent::{
    admission::verify::{Gate, Mode, OnSysfsError, Settings, Verifier},
    host::{NumaNode, PageSize},
    kube::pod::Hugepages,
    sysfs::HostFs,
};
use hugepage_agent_tests::{BenchFlags, Percentiles};

const NODES: u32 = 8;
const SIZES: [PageSize; 2] = [PageSize(2 << 20), PageSize(1 << 30)];

fn main() {
    let flags = BenchFlags::parse("verify-latency [--iterations N]", &["--iterations"]);
    let iterations = flags.number("--iterations", 200_000) as usize;
    let tree = tempfile_in_shm();
    generate(&tree);
    println!(
        "verification of hugepages-2Mi + hugepages-1Gi, {iterations} calls each, after warm-up"
    );
    let fake = HostFs::new(&tree);
    let all: Vec<NumaNode> = (0..NODES).map(NumaNode).collect();
    for mode in [Mode::Kep, Mode::Strict] {
        report(
            &format!("tmpfs tree, {NODES} nodes x 2 sizes, {mode:?}"),
            &fake,
            &all,
            mode,
            iterations,
        );
    }
    let host = HostFs::new("/");
    let verifier = Verifier::new(host.clone()).unwrap_or_else(|e| panic!("this host: {e}"));
    let nodes = verifier.nodes();
    for mode in [Mode::Kep, Mode::Strict] {
        report(
            &format!(
                "this host's sysfs, {} node(s) x 2 sizes, {mode:?}",
                nodes.len()
            ),
            &host,
            &nodes,
            mode,
            iterations,
        );
    }
    let _ = fs::remove_dir_all(&tree);
    println!("target: p99 under 50 us (KEP-5759 SLO: 10 ms)");
}

fn tempfile_in_shm() -> std::path::PathBuf {
    let dir = Path::new("/dev/shm").join(format!("hugepage-agent-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// 8 nodes, both sizes on each, counters as a loaded host has them.
fn generate(root: &Path) {
    let write = |path: String, value: &str| {
        let full = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(full.parent().expect("a parent directory"))
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", full.display()));
        fs::write(&full, value).unwrap_or_else(|e| panic!("writing {}: {e}", full.display()));
    };
    for n in 0..NODES {
        for size in SIZES {
            let dir = format!(
                "/sys/devices/system/node/node{n}/hugepages/{}",
                size.dir_name()
            );
            write(format!("{dir}/nr_hugepages"), "1024\n");
            write(format!("{dir}/free_hugepages"), "1000\n");
            write(format!("{dir}/surplus_hugepages"), "0\n");
        }
    }
    for size in SIZES {
        let dir = format!("/sys/kernel/mm/hugepages/{}", size.dir_name());
        write(format!("{dir}/resv_hugepages"), "16\n");
    }
}

fn report(label: &str, host: &HostFs, nodes: &[NumaNode], mode: Mode, iterations: usize) {
    let verifier = Verifier::new(host.clone()).unwrap_or_else(|e| panic!("{label}: verifier: {e}"));
    let request: Hugepages = SIZES.iter().map(|&s| (s, s.0)).collect();
    let settings = Settings {
        gate: Gate::On,
        mode,
        on_sysfs_error: OnSysfsError::Reject,
    };
    let once = || {
        verifier
            .verify(&request, nodes, settings)
            .unwrap_or_else(|e| panic!("{label}: {e}"))
    };
    let first = once();
    assert!(
        first.checks.iter().all(|c| c.unverified.is_none()),
        "{label}: every file was read: {first:?}"
    );
    for _ in 0..1000 {
        std::hint::black_box(once());
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        std::hint::black_box(once());
        samples.push(start.elapsed());
    }
    let p = Percentiles::of(&mut samples);
    println!("{label:<48} {p}");
}
