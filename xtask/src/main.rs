//! `cargo xtask`: the project's own commands. `run` and `test` are the two the README names; both
//! install what they need first (idempotently), so they work on a fresh machine.
//!
//! * `setup`: prerequisites only (nightly rust-src, bpf-linker, Debian packages, and the
//!   telemetry tests' peers: Prometheus, an OTLP receiver's venv, `@grafana/schema`).
//! * `run [-- ARGS]`: build the agent (release) and run it on this machine.
//! * `test`: formatting, clippy, the build without the eBPF toolchain, and every test.
//! * `bench probe-overhead|verify|psi|inventory|admit-load|admit-trace [-- ARGS]`: the fault
//!   probe's cost on ordinary faults, one in-process verification, PSI evaluation and trigger
//!   latency, the cgroup inventory at scale, `POST /v1/admit` under a load tool, and the same
//!   with OTLP tracing on against off.

mod bench;
mod cmd;
mod setup;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the build prerequisites (a second run only checks).
    Setup,
    /// Build and run the agent on this machine (as root); arguments after `--` go to the agent.
    Run {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every check and test (as root: the tests load eBPF and reserve hugepages).
    Test,
    /// Run a benchmark and print its figures.
    Bench {
        #[arg(value_enum)]
        which: bench::Bench,
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let mut env = setup::ensure()?;
    match Cli::parse().command {
        Task::Setup => setup::ensure_peers().map(drop),
        Task::Run { args } => {
            require_root("cargo xtask run")?;
            cmd::cargo(&env, &["build", "--release", "--package", "hugepage-agent"])?;
            let mut all = vec!["run".to_owned()];
            all.extend(args);
            cmd::exec(
                &env,
                &cmd::workspace().join("target/release/hugepage-agent"),
                &all,
            )
        }
        Task::Test => {
            env.peers = setup::ensure_peers()?;
            test(&env)
        }
        Task::Bench { which, args } => {
            require_root("cargo xtask bench")?;
            if which == bench::Bench::AdmitTrace {
                env.peers = setup::ensure_peers()?;
            }
            bench::run(&env, which, &args)
        }
    }
}

fn test(env: &cmd::Env) -> Result<()> {
    require_root("cargo xtask test")?;
    cmd::step("formatting");
    cmd::cargo(env, &["fmt", "--all", "--", "--check"])?;
    cmd::step("clippy, every crate and target");
    cmd::cargo(
        env,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    cmd::step("userspace without the eBPF toolchain (AYA_BUILD_SKIP=1)");
    cmd::cargo_without_ebpf(
        env,
        &[
            "clippy",
            "--package",
            "hugepage-agent",
            "--all-targets",
            "--target-dir",
            "target/no-ebpf",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    cmd::step("the agent binary the tests run");
    cmd::cargo(env, &["build", "--package", "hugepage-agent"])?;
    cmd::step("every test");
    let (passed, failed) = cmd::cargo_test(env, &["test", "--workspace"])?;
    println!("{passed} passed, {failed} failed");
    Ok(())
}

fn require_root(what: &str) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "{what} loads eBPF programs and changes hugepage pools: run it as root (sudo -E cargo xtask …)"
        );
    }
    Ok(())
}
