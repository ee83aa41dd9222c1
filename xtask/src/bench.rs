//! Benchmarks: built in release mode and run as binaries that print their figures.

use anyhow::Result;
use clap::ValueEnum;

use crate::cmd::{self, Env};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Bench {
    /// ns per ordinary 4 KiB fault: no probe, cgroup-filter mode, watch-everything mode.
    ProbeOverhead,
}

pub fn run(env: &Env, which: Bench, args: &[String]) -> Result<()> {
    let binary = match which {
        Bench::ProbeOverhead => "probe-overhead",
    };
    cmd::cargo(
        env,
        &[
            "build",
            "--release",
            "--package",
            "hugepage-agent-tests",
            "--bin",
            binary,
            "--bin",
            "toucher",
        ],
    )?;
    cmd::exec(
        env,
        &cmd::workspace().join("target/release").join(binary),
        args,
    )
}
