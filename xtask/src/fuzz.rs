//! `cargo xtask fuzz [--seconds N | --runs N] [--jobs N] [TARGET]`: the fuzz targets of `fuzz/`
//! (cargo-fuzz, libFuzzer with AddressSanitizer, on the nightly toolchain), each run for `N`
//! seconds, or for `N` executions, as one libFuzzer process or, with `--jobs`, in libFuzzer's
//! fork mode (one process handing short jobs to `N` at once), from its seed corpus
//! (`fuzz/corpus/<target>`, read only: what libFuzzer finds goes to a scratch corpus in the
//! target directory). One line per target,
//! `fuzz <target>: <N> executions, <M> crashes, <T> s`; any crash fails the command, its input
//! left in `fuzz/artifacts/<target>/` and named, with libFuzzer's log. The targets are compiled
//! by clippy (`-D warnings`) as they are built; [`check`] is what `cargo xtask test` asks of the
//! fuzz crate besides: its lock file in step.
//!
//! The targets build against the agent's library without the eBPF programs (`AYA_BUILD_SKIP=1`:
//! nothing fuzzed touches them) in a target directory of their own, `<target dir>/fuzz`, so the
//! nightly, sanitised build never invalidates the stable one. The build and each run are a
//! process group that a signal to xtask ends too ([`group`]).

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cmd, group, setup};

/// Every target, as `fuzz/Cargo.toml` lists them.
pub const TARGETS: [&str; 16] = [
    "quantity",
    "admit_body",
    "checkpoint",
    "psi",
    "sysfs_values",
    "cgroup_path",
    "reservations",
    "otel_env",
    "admission_review",
    "extender_args",
    "http1_answer",
    "topology_merge",
    "whatif_inputs",
    "kubelet_config",
    "kubelet_cmdline",
    "admit_live",
];

/// How long each target runs.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    /// For this many seconds (libFuzzer's `-max_total_time`).
    Seconds(u64),
    /// For this many executions (libFuzzer's `-runs`), however long they take.
    Runs(u64),
}

impl Budget {
    fn flag(self) -> String {
        match self {
            Budget::Seconds(n) => format!("-max_total_time={n}"),
            Budget::Runs(n) => format!("-runs={n}"),
        }
    }
}

/// What one target's run did.
struct Outcome {
    executions: u64,
    crashes: Vec<PathBuf>,
    log: PathBuf,
}

/// Builds the targets and runs `only` (else every one), each for `budget` on `jobs` processes.
pub fn run(budget: Budget, jobs: u32, only: Option<&str>) -> Result<()> {
    let targets: Vec<&str> = match only {
        Some(name) if TARGETS.contains(&name) => vec![name],
        Some(name) => bail!(
            "no fuzz target {name:?}: the targets are {}",
            TARGETS.join(", ")
        ),
        None => TARGETS.to_vec(),
    };
    cmd::output("rustc", &["+nightly", "--version"]).context(
        "the fuzz targets build with the nightly toolchain; install it with `rustup toolchain install nightly`",
    )?;
    let cargo_fuzz = setup::ensure_cargo_fuzz()?;
    let sysroot = cmd::output("rustc", &["+nightly", "--print", "sysroot"])?;
    let clippy = Path::new(sysroot.trim()).join("bin/clippy-driver");
    if !clippy.is_file() {
        bail!(
            "{} is missing: the fuzz targets build through clippy; install it with `rustup component add clippy --toolchain nightly`",
            clippy.display()
        );
    }
    let tools = Tools {
        cargo_fuzz,
        clippy,
        out: cmd::target_dir().join("fuzz"),
    };
    let out = &tools.out;
    cmd::step(&format!(
        "building the fuzz targets (nightly, AddressSanitizer, linted by clippy) in {}",
        out.display()
    ));
    let mut build = tools.command("build");
    build.args(only);
    cmd::run_ending_with_xtask(build)?;
    let mut failed = Vec::new();
    for target in targets {
        let started = Instant::now();
        let outcome = run_one(&tools, target, budget, jobs)?;
        println!(
            "fuzz {target}: {} executions, {} crashes, {:.1} s",
            outcome.executions,
            outcome.crashes.len(),
            started.elapsed().as_secs_f64()
        );
        if !outcome.crashes.is_empty() {
            for input in &outcome.crashes {
                eprintln!("  the input: {}", input.display());
            }
            eprintln!("  libFuzzer's log: {}", outcome.log.display());
            eprintln!(
                "  again: cargo +nightly fuzz run --fuzz-dir fuzz {target} {}",
                outcome.crashes[0].display()
            );
            failed.push(target);
        }
    }
    if !failed.is_empty() {
        bail!(
            "fuzzing crashed {} target(s): {} (inputs and logs above)",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// What `cargo xtask test` asks of the fuzz crate before running it: `fuzz/Cargo.lock` in step
/// with the crate and the agent's dependencies (the fuzz crate is a workspace of its own, so a
/// dependency added to the agent changes both lock files).
pub fn check() -> Result<()> {
    cmd::step("fuzz/Cargo.lock is in step with the fuzz crate and the agent");
    let manifest = cmd::workspace().join("fuzz/Cargo.toml");
    let metadata = Command::new("cargo")
        .args([
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(&manifest)
        .current_dir(cmd::workspace())
        .stdout(Stdio::null())
        .output()
        .context("starting cargo metadata")?;
    if !metadata.status.success() {
        bail!(
            "fuzz/Cargo.lock is not in step with fuzz/Cargo.toml and the agent's dependencies:\n{}\n\
             update it with `cargo metadata --manifest-path fuzz/Cargo.toml --format-version 1 \
             > /dev/null` (it changes the lock file as little as it can) and commit it",
            String::from_utf8_lossy(&metadata.stderr).trim()
        );
    }
    Ok(())
}

/// What runs the targets.
struct Tools {
    cargo_fuzz: PathBuf,
    /// The nightly's clippy, which compiles the targets (not the agent nor the dependencies):
    /// `RUSTC_WORKSPACE_WRAPPER`, as `cargo clippy` does, so that the targets are linted, a
    /// warning failing the build, by the build the fuzzing needs anyway (a `cargo clippy` of its
    /// own would check every dependency again, the nightly's way).
    clippy: PathBuf,
    /// The target directory of the fuzz build.
    out: PathBuf,
}

impl Tools {
    /// `cargo +nightly fuzz <verb>` on `fuzz/`, building into `out`.
    fn command(&self, verb: &str) -> Command {
        let mut path = std::ffi::OsString::from(&self.cargo_fuzz);
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        let mut command = Command::new("cargo");
        command
            .args(["+nightly", "fuzz", verb, "--fuzz-dir"])
            .arg(cmd::workspace().join("fuzz"))
            .arg("--target-dir")
            .arg(&self.out)
            .current_dir(cmd::workspace())
            .env("PATH", path)
            .env("RUSTUP_TOOLCHAIN", "nightly")
            .env("AYA_BUILD_SKIP", "1")
            .env("RUSTC_WORKSPACE_WRAPPER", &self.clippy)
            // `cargo clippy -- -D warnings` passes its arguments to clippy-driver so.
            .env(
                "CLIPPY_ARGS",
                "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
            )
            // The stable cargo running xtask set these; the nightly one sets its own.
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTDOC");
        command
    }
}

fn run_one(tools: &Tools, target: &str, budget: Budget, jobs: u32) -> Result<Outcome> {
    let out = &tools.out;
    let seeds = cmd::workspace().join("fuzz/corpus").join(target);
    let scratch = out.join("corpus").join(target);
    let artifacts = cmd::workspace().join("fuzz/artifacts").join(target);
    let logs = out.join("logs");
    // Fork mode's working directory (each job's corpus and log), under the build's, not /tmp,
    // if a signal ends the run.
    let tmp = out.join("tmp");
    for dir in [&scratch, &artifacts, &logs, &tmp] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let before = crash_files(&artifacts)?;
    let log = logs.join(format!("{target}.log"));
    let log_file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut fuzz = tools.command("run");
    fuzz.arg(target)
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(budget.flag())
        .args([
            "-print_final_stats=1",
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-max_len=65536",
        ])
        .stdout(Stdio::null())
        .stderr(log_file);
    if jobs > 1 {
        // Fork mode ignores time-outs and out-of-memory exits unless told not to: a single
        // process stops at them, and so does this.
        fuzz.args([
            format!("-fork={jobs}"),
            "-ignore_timeouts=0".to_owned(),
            "-ignore_ooms=0".to_owned(),
        ])
        .env("TMPDIR", tmp);
    }
    let status = group::status(&mut fuzz).with_context(|| format!("starting {fuzz:?}"))?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    let forked = jobs > 1;
    let mut crashes: Vec<PathBuf> = crash_files(&artifacts)?
        .difference(&before)
        .cloned()
        .collect();
    if !status.success() && crashes.is_empty() {
        // A failure that left no input (the build, or libFuzzer itself): the log says which.
        crashes.push(log.clone());
    }
    Ok(Outcome {
        executions: executions(&text, forked),
        crashes,
        log,
    })
}

/// The crash, leak, timeout and out-of-memory inputs libFuzzer left in `dir`.
fn crash_files(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut found = BTreeSet::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if ["crash-", "leak-", "timeout-", "oom-"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            found.insert(path);
        }
    }
    Ok(found)
}

/// The executions libFuzzer counted: its final statistics, else its last status line (`#N`).
/// In fork mode, only the parent's status lines (`#N:`, every job's executions together): the
/// statistics and `#N` lines in its log are a crashed job's own, copied after it.
fn executions(log: &str, forked: bool) -> u64 {
    let stat = log.lines().find_map(|l| {
        l.strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    });
    let status = || {
        log.lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter_map(|l| {
                let n = l.split_whitespace().next()?;
                if forked { n.strip_suffix(':') } else { Some(n) }?
                    .parse()
                    .ok()
            })
            .max()
            .unwrap_or(0)
    };
    match stat {
        Some(n) if !forked => n,
        _ => status(),
    }
}

#[cfg(test)]
mod tests {
    use super::{TARGETS, executions};

    #[test]
    fn every_target_of_the_fuzz_crate_is_listed_and_has_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("fuzz/Cargo.toml");
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|name| *name != "hugepage-agent-fuzz")
            .collect();
        assert_eq!(bins, TARGETS, "fuzz/Cargo.toml's [[bin]]s against TARGETS");
        for target in TARGETS {
            let seeds = std::fs::read_dir(root.join("corpus").join(target))
                .unwrap_or_else(|e| panic!("fuzz/corpus/{target}: {e}"));
            assert!(seeds.count() > 0, "fuzz/corpus/{target} holds no seed");
        }
    }

    #[test]
    fn executions_come_from_libfuzzers_stats_else_its_status_lines() {
        let done = "#2\tINITED cov: 10\n#524288\tpulse  cov: 12\nDone 812345 runs in 5 second(s)\nstat::number_of_executed_units: 812345\n";
        assert_eq!(executions(done, false), 812_345);
        assert_eq!(
            executions("#2\tINITED\n#4096\tNEW cov: 3\n==1== ERROR", false),
            4096
        );
        let fork = "INFO: -fork=2: fuzzing in separate process(s)\n#31337: cov: 40 ft: 90 corp: 12 exec/s: 3000 oom/timeout/crash: 0/0/0 time: 10s job: 2 dft_time: 0\n#64001: cov: 41 ft: 93 corp: 13 exec/s: 3100 oom/timeout/crash: 0/0/0 time: 20s job: 3 dft_time: 0\nINFO: fuzzed for 64001 iterations, wrapping up soon\n";
        assert_eq!(executions(fork, true), 64_001);
        // A job crashed: the parent's count, not the job's own copied after it.
        let crashed = "#64001: cov: 41 ft: 93 corp: 13 exec/s: 3100 oom/timeout/crash: 0/0/1 time: 20s job: 3 dft_time: 0\nINFO: log from the inner process:\n#2\tINITED cov: 40\n#8192\tpulse cov: 41\n==7== ERROR: AddressSanitizer\nstat::number_of_executed_units: 9000\n";
        assert_eq!(executions(crashed, true), 64_001);
        assert_eq!(executions("nothing", false), 0);
    }
}
