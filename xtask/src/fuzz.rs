//! `cargo xtask fuzz [--seconds N] [TARGET]`: the fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer
//! with AddressSanitizer, on the nightly toolchain), each run for `N` seconds from its seed corpus
//! (`fuzz/corpus/<target>`, read only: what libFuzzer finds goes to a scratch corpus in the
//! target directory). One line per target, `fuzz <target>: <N> executions, <M> crashes`; any
//! crash fails the command, its input left in `fuzz/artifacts/<target>/` and named, with
//! libFuzzer's log.
//!
//! The targets build against the agent's library without the eBPF programs (`AYA_BUILD_SKIP=1`:
//! nothing fuzzed touches them) in a target directory of their own, `<target dir>/fuzz`, so the
//! nightly, sanitised build never invalidates the stable one.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{cmd, setup};

/// Every target, as `fuzz/Cargo.toml` lists them.
pub const TARGETS: [&str; 12] = [
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
];

/// What one target's run did.
struct Outcome {
    executions: u64,
    crashes: Vec<PathBuf>,
    log: PathBuf,
}

/// Builds the targets and runs `only` (else every one) for `seconds` each.
pub fn run(seconds: u64, only: Option<&str>) -> Result<()> {
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
    let out = cmd::target_dir().join("fuzz");
    cmd::step(&format!(
        "building the fuzz targets (nightly, AddressSanitizer) in {}",
        out.display()
    ));
    let mut build = fuzz_command(&cargo_fuzz, &out, "build");
    build.args(only);
    cmd::run(build)?;
    let mut failed = Vec::new();
    for target in targets {
        let outcome = run_one(&cargo_fuzz, &out, target, seconds)?;
        println!(
            "fuzz {target}: {} executions, {} crashes",
            outcome.executions,
            outcome.crashes.len()
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

/// `cargo +nightly fuzz <verb>` on `fuzz/`, building into `out`.
fn fuzz_command(cargo_fuzz: &Path, out: &Path, verb: &str) -> Command {
    let mut path = std::ffi::OsString::from(cargo_fuzz);
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    let mut command = Command::new("cargo");
    command
        .args(["+nightly", "fuzz", verb, "--fuzz-dir"])
        .arg(cmd::workspace().join("fuzz"))
        .arg("--target-dir")
        .arg(out)
        .current_dir(cmd::workspace())
        .env("PATH", path)
        .env("RUSTUP_TOOLCHAIN", "nightly")
        .env("AYA_BUILD_SKIP", "1")
        // The stable cargo running xtask set these; the nightly one sets its own.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    command
}

fn run_one(cargo_fuzz: &Path, out: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    let seeds = cmd::workspace().join("fuzz/corpus").join(target);
    let scratch = out.join("corpus").join(target);
    let artifacts = cmd::workspace().join("fuzz/artifacts").join(target);
    let logs = out.join("logs");
    for dir in [&scratch, &artifacts, &logs] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let before = crash_files(&artifacts)?;
    let log = logs.join(format!("{target}.log"));
    let log_file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut fuzz = fuzz_command(cargo_fuzz, out, "run");
    fuzz.arg(target)
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args([
            "-print_final_stats=1",
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-max_len=65536",
        ])
        .stdout(Stdio::null())
        .stderr(log_file);
    let status = fuzz
        .status()
        .with_context(|| format!("starting {fuzz:?}"))?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    let mut crashes: Vec<PathBuf> = crash_files(&artifacts)?
        .difference(&before)
        .cloned()
        .collect();
    if !status.success() && crashes.is_empty() {
        // A failure that left no input (the build, or libFuzzer itself): the log says which.
        crashes.push(log.clone());
    }
    Ok(Outcome {
        executions: executions(&text),
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
fn executions(log: &str) -> u64 {
    let stat = log.lines().find_map(|l| {
        l.strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    });
    stat.unwrap_or_else(|| {
        log.lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .max()
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::executions;

    #[test]
    fn executions_come_from_libfuzzers_stats_else_its_status_lines() {
        let done = "#2\tINITED cov: 10\n#524288\tpulse  cov: 12\nDone 812345 runs in 5 second(s)\nstat::number_of_executed_units: 812345\n";
        assert_eq!(executions(done), 812_345);
        assert_eq!(
            executions("#2\tINITED\n#4096\tNEW cov: 3\n==1== ERROR"),
            4096
        );
        assert_eq!(executions("nothing"), 0);
    }
}
