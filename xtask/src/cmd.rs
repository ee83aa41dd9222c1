//! Running commands: cargo with the eBPF toolchain on `PATH`, and plain processes.

use std::{
    ffi::OsString,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::group;

/// What the build needs in its environment.
pub struct Env {
    /// Directory holding the `bpf-linker` built for the current nightly.
    pub linker_bin: PathBuf,
    /// Variables telling tests and benchmarks where their peers are installed.
    pub peers: Vec<(&'static str, PathBuf)>,
}

impl Env {
    fn path(&self) -> OsString {
        let mut path = OsString::from(&self.linker_bin);
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        path
    }
}

/// The workspace root (this crate's parent).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR`, else the workspace's `target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                workspace().join(dir)
            }
        })
        .unwrap_or_else(|| workspace().join("target"))
}

pub fn step(what: &str) {
    eprintln!("==> {what}");
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// A cargo command with bpf-linker on `PATH` and the peers' variables, not yet run.
pub fn cargo_command(env: &Env, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args)
        .current_dir(workspace())
        .env("PATH", env.path())
        .envs(env.peers.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Runs cargo with bpf-linker on `PATH`.
pub fn cargo(env: &Env, args: &[&str]) -> Result<()> {
    run(cargo_command(env, args))
}

/// Runs `cargo test`, passing its output through, and returns (passed, failed) summed over every
/// test binary.
pub fn cargo_test(env: &Env, args: &[&str]) -> Result<(u64, u64)> {
    let mut cmd = cargo_command(env, args);
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(summary) = line.strip_prefix("test result: ") {
            passed += count(summary, " passed");
            failed += count(summary, " failed");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok((passed, failed))
}

/// The number before `label` in a libtest summary (`ok. 5 passed; 0 failed; …`).
fn count(summary: &str, label: &str) -> u64 {
    summary
        .split(';')
        .find_map(|part| part.trim().strip_suffix(label.trim_start()))
        .and_then(|n| n.trim().rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Runs cargo with the eBPF build skipped and without bpf-linker on `PATH`.
pub fn cargo_without_ebpf(env: &Env, args: &[&str]) -> Result<()> {
    let mut cmd = cargo_command(env, args);
    let path = std::env::var_os("PATH").unwrap_or_default();
    cmd.env("PATH", path).env("AYA_BUILD_SKIP", "1");
    run(cmd)
}

/// Runs `cmd` and fails unless it succeeds.
pub fn run(mut cmd: Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    succeeded(&cmd, status)
}

/// Runs `cmd` as [`group::status`] does (a signal that ends xtask ends it too) and fails unless
/// it succeeds.
pub fn run_ending_with_xtask(mut cmd: Command) -> Result<()> {
    let status = group::status(&mut cmd).with_context(|| format!("starting {cmd:?}"))?;
    succeeded(&cmd, status)
}

fn succeeded(cmd: &Command, status: ExitStatus) -> Result<()> {
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Output of a command that must succeed.
pub fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Replaces this process with `program` (so signals reach it directly).
pub fn exec(env: &Env, program: &Path, args: &[String]) -> Result<()> {
    let err = Command::new(program)
        .args(args)
        .env("PATH", env.path())
        .envs(env.peers.iter().map(|(k, v)| (k, v)))
        .exec();
    Err(err).with_context(|| format!("running {}", program.display()))
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_come_from_libtest_summaries() {
        let line =
            "ok. 37 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.09s";
        assert_eq!((count(line, " passed"), count(line, " failed")), (37, 2));
        assert_eq!(count("FAILED. 4 passed; 1 failed; 0 ignored", " failed"), 1);
    }
}
