//! `cargo xtask vm-test [--kernel 6.1|6.1-rt|6.12|6.12-rt|all]`: the agent on real multi-NUMA
//! kernels of other versions. Boots each of Debian's kernels asked ([`kernel`]: 6.1 and 6.12,
//! generic and PREEMPT_RT) in turn under QEMU ([`qemu`]) as the same four-node machine of
//! [`machine`], from a busybox initramfs ([`initramfs`]) whose init (`tests/vm/init`) mounts the
//! host's debug build over 9p and runs `vm-checks` (`tests/bin/vm_checks/`), which runs the real
//! `hugepage-agent` binary, the same code as on the host, and writes one line per check. The
//! host prints those lines, then per kernel a closing line in libtest's format so that `cargo
//! xtask test` and CI count them. What a failed run leaves (the console, the logs the checks
//! kept) is in `<target>/vm-test/<kernel>/`.

mod initramfs;
mod kernel;
mod machine;
mod qemu;

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use kernel::Flavour;

use crate::{
    cmd::{self, Env},
    setup,
};

/// Debian packages the VM test needs: QEMU (x86 system emulation), a static busybox, and the
/// decompressors of kernel modules (6.12's are xz).
const VM_PACKAGES: [&str; 4] = ["qemu-system-x86", "busybox-static", "xz-utils", "zstd"];
/// The whole boot, checks included; a hung guest is killed after it.
const BOOT_LIMIT: Duration = Duration::from_secs(480);

/// The VM's prerequisites: the Debian packages and the kernels (idempotent).
pub fn ensure_prerequisites() -> Result<()> {
    setup::ensure_debian_packages(&VM_PACKAGES)?;
    for flavour in Flavour::ALL {
        kernel::ensure(flavour)?;
    }
    Ok(())
}

/// Builds once, then boots and checks each of `kernels` in turn; returns (passed, failed) over
/// all of them, having printed each kernel's closing line.
pub fn test(env: &Env, kernels: &[Flavour]) -> Result<(u64, u64)> {
    setup::ensure_debian_packages(&VM_PACKAGES)?;
    let ready: Vec<kernel::Kernel> = kernels
        .iter()
        .map(|k| kernel::ensure(*k))
        .collect::<Result<_>>()?;
    cmd::step("the binaries the guest runs (debug build: the agent, vm-checks, toucher)");
    cmd::cargo(
        env,
        &[
            "build",
            "--package",
            "hugepage-agent",
            "--package",
            "hugepage-agent-tests",
            "--bin",
            "hugepage-agent",
            "--bin",
            "vm-checks",
            "--bin",
            "toucher",
        ],
    )?;
    let (mut passed, mut failed) = (0, 0);
    for kernel in &ready {
        let (p, f) = boot(kernel)?;
        passed += p;
        failed += f;
    }
    Ok((passed, failed))
}

/// Boots `kernel` with the checks; (passed, failed), its closing line printed.
fn boot(kernel: &kernel::Kernel) -> Result<(u64, u64)> {
    let bin = cmd::target_dir().join("debug");
    let dir = cmd::target_dir()
        .join("vm-test")
        .join(kernel.flavour.label());
    let work = dir.join("work");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    fs::write(
        work.join("machine.json"),
        serde_json::to_vec_pretty(&machine::description(
            kernel.flavour.release_prefix(),
            kernel.flavour.realtime(),
        ))?,
    )?;
    let initramfs = dir.join("initramfs.cpio");
    let binaries: Vec<_> = ["hugepage-agent", "vm-checks", "toucher"]
        .iter()
        .map(|b| bin.join(b))
        .collect();
    initramfs::build(
        &initramfs,
        &cmd::workspace().join("tests/vm/init"),
        kernel,
        &binaries,
    )?;
    cmd::step(&format!(
        "booting {} ({}) under QEMU (TCG, 4 NUMA nodes) and running the checks in it",
        kernel.package,
        kernel.flavour.label()
    ));
    let console = dir.join("console.log");
    let guest = qemu::Boot {
        bzimage: &kernel.bzimage,
        initramfs: &initramfs,
        bin: &bin,
        work: &work,
        console: &console,
        limit: BOOT_LIMIT,
    };
    let mut started = Instant::now();
    let mut outcome = qemu::run(&guest)?;
    let (mut passed, mut failed) = count(&work.join("results"));
    // A guest kernel that panics while it boots, before any check (seen on 6.12 under TCG: an
    // invalid opcode in a code site being patched), is booted once more and said so.
    if (passed, failed) == (0, 0) && panicked(&console) {
        eprintln!(
            "vm-test: the guest kernel panicked while booting, before any check ({}): booting it once more",
            console.display()
        );
        fs::rename(&console, dir.join("console.first.log"))?;
        started = Instant::now();
        outcome = qemu::run(&guest)?;
        (passed, failed) = count(&work.join("results"));
    }
    let elapsed = started.elapsed();
    if outcome != qemu::Outcome::Exited(u8::from(failed > 0)) {
        eprintln!(
            "vm-test: the guest ended with {outcome:?} after {passed} passed and {failed} failed check(s)"
        );
        failed += 1;
    }
    println!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s (kernel {})",
        if failed == 0 { "ok" } else { "FAILED" },
        elapsed.as_secs_f64(),
        kernel.flavour.label()
    );
    if failed > 0 {
        eprintln!(
            "vm-test: the guest's console is in {}, the failed checks' logs in {}",
            console.display(),
            work.display()
        );
    }
    Ok((passed, failed))
}

/// Whether the guest's console at `console` shows a kernel panic.
fn panicked(console: &std::path::Path) -> bool {
    fs::read(console).is_ok_and(|text| {
        text.windows(b"Kernel panic".len())
            .any(|w| w == b"Kernel panic")
    })
}

/// `cargo xtask vm-test`: fails when a check failed on any of `kernels`.
pub fn run(env: &Env, kernels: &[Flavour]) -> Result<()> {
    let (_, failed) = test(env, kernels)?;
    if failed > 0 {
        bail!("{failed} VM check(s) failed");
    }
    Ok(())
}

/// (passed, failed) from the guest's `results`: one `passed NAME …` or `failed NAME …` a line.
fn count(results: &Path) -> (u64, u64) {
    let text = fs::read_to_string(results).unwrap_or_default();
    let lines = |word: &str| {
        text.lines()
            .filter(|l| l.split_whitespace().next() == Some(word))
            .count() as u64
    };
    (lines("passed"), lines("failed"))
}
