//! `cargo xtask`: the project's own commands. `run` and `test` are the two the README names; both
//! install what they need first (idempotently), so they work on a fresh machine.
//!
//! * `setup`: prerequisites only (nightly rust-src, bpf-linker, Debian packages, cargo-fuzz, and
//!   the tests' peers: Prometheus, an OTLP receiver's venv, schemathesis's venv, `@grafana/schema`).
//! * `run [-- ARGS]`: build the agent (release) and run it on this machine.
//! * `test`: formatting, clippy, the build without the eBPF toolchain, every fuzz target for a
//!   few seconds, every test and the VM test; then a check that the tests left nothing on the
//!   host ([`host`]).
//! * `fuzz [--seconds N | --runs N] [--jobs N] [TARGET]`: the parsers of outside input under
//!   libFuzzer ([`fuzz`]).
//! * `vm-test [--kernel 6.1|6.1-rt|6.12|6.12-rt|all]`: Debian's kernels booted in turn under QEMU
//!   as a four-NUMA-node machine, the agent and its checks run inside ([`vm`]); part of `test`,
//!   all four.
//! * `layers`: the agent's modules as floors; a circle between modules, or pure logic that
//!   imports a reader, fails it (and `test`).
//! * `fresh-test`: `test` as on a new machine: the host's leftovers of earlier runs removed, a
//!   fresh clone of the committed tree, a new target directory and a new cache (bpf-linker and
//!   the peers installed again).
//! * `image [--source URL]`: the agent's OCI image (`localhost/hugepage-agent:<version>`), built
//!   offline with podman and checked by inspection ([`image`]).
//! * `release [--out DIR] [--source URL] [--allow-dirty]`: the image and a versioned bundle an
//!   operator installs from: the OCI archive, its SBOM, one manifest per common choice with the
//!   image by digest, the release notes from `CHANGELOG.md`, `SHA256SUMS` ([`release`]).
//! * `manifests [--check]`: the files of `deploy/` generated from `dashboards/` ([`manifests`]).
//! * `docs [--check]`: `docs/reference/` written from the code, and every relative link of
//!   `README.md` and `docs/` checked ([`docs`]).
//! * `bench probe-overhead|verify|psi|inventory|admit-load|admit-trace|admit-tls|admit-size|hints|extender|abuse|soak|conn-memory
//!   [--] [ARGS]`: the fault probe's cost on ordinary faults, one in-process verification, PSI
//!   evaluation and trigger latency, the cgroup inventory at scale, `POST /v1/admit` under a
//!   load tool, the same with OTLP tracing on against off and over TLS with a client
//!   certificate against plain HTTP, what one request costs as the pod grows and what one
//!   client's largest bodies cost another, hint generation, the webhook's extender filter
//!   over up to 1,000 nodes, a well-behaved client's latency while others misbehave, a
//!   soak of the agent under a mixed load (its memory, descriptors and admission p99 over time),
//!   and the webhook's memory per watched agent connection over HTTP/1.1 and over HTTP/2.

mod bench;
mod cmd;
mod docs;
mod figures;
mod fuzz;
mod group;
mod host;
mod image;
mod layers;
mod manifests;
mod markdown;
mod release;
mod sbom;
mod setup;
mod vm;

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
    /// Run `test` as on a new machine: remove what earlier runs left on the host, then test a
    /// fresh clone of the committed tree with a new target directory and a new cache.
    FreshTest {
        /// Keep the project's cache (bpf-linker, the peers) instead of installing it again.
        #[arg(long)]
        keep_cache: bool,
    },
    /// Fuzz the parsers of outside input (cargo-fuzz on the nightly): every target, or one.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = 60, value_name = "N")]
        seconds: u64,
        /// Run each target for N executions (libFuzzer's -runs) instead of for a time.
        #[arg(long, value_name = "N", conflicts_with = "seconds")]
        runs: Option<u64>,
        /// Run each target as N libFuzzer processes at once (libFuzzer's -fork=N), their
        /// executions counted together: one run on N CPUs.
        #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        jobs: u32,
        /// One target (see fuzz/Cargo.toml); all of them when absent.
        target: Option<String>,
    },
    /// Boot Debian's kernels under QEMU with 4 NUMA nodes and run the agent's checks in each.
    VmTest {
        /// Which kernel: 6.1, 6.1-rt, 6.12, 6.12-rt (Debian bookworm's, PREEMPT_RT the -rt), or
        /// all four in turn.
        #[arg(long, default_value = "all", value_name = "KERNEL", value_parser = kernels)]
        kernel: Kernels,
    },
    /// Print the agent's modules as floors; fail on a circle or on pure logic importing a reader.
    Layers,
    /// Build the agent's container image (statically linked, FROM scratch) and check it.
    Image {
        /// The `org.opencontainers.image.source` label (default: the `origin` remote).
        #[arg(long, value_name = "URL")]
        source: Option<String>,
    },
    /// Build the image and write a release bundle: the image as an OCI archive with its SBOM,
    /// one manifest per common choice naming the image by digest, the release notes, SHA256SUMS.
    Release {
        /// The directory the bundle's own directory (`hugepage-agent-<version>`) goes in
        /// (default: the target directory's `release`).
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
        /// The image's `org.opencontainers.image.source` label (default: the `origin` remote).
        #[arg(long, value_name = "URL")]
        source: Option<String>,
        /// Release a tree whose tracked files differ from HEAD (its notes say so).
        #[arg(long)]
        allow_dirty: bool,
    },
    /// Write the files of deploy/ generated from dashboards/ (the PrometheusRule).
    Manifests {
        /// Only check that the committed files are current.
        #[arg(long)]
        check: bool,
    },
    /// Write docs/reference/ from the code, and check every link of README.md and docs/.
    Docs {
        /// Only check that docs/reference/ is current (and the links).
        #[arg(long)]
        check: bool,
    },
    /// Run a benchmark and print its figures; its own flags follow, after `--` or not.
    Bench {
        #[arg(value_enum)]
        which: bench::Bench,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup => {
            setup::ensure()?;
            setup::ensure_cargo_fuzz()?;
            setup::ensure_cargo_deny()?;
            setup::ensure_peers()?;
            vm::ensure_prerequisites()
        }
        Task::Run { args } => {
            require_root("cargo xtask run")?;
            let env = setup::ensure()?;
            cmd::step(
                "building the agent (release) and its eBPF programs (the nightly, for the BPF target)",
            );
            cmd::cargo(&env, &["build", "--release", "--package", "hugepage-agent"])?;
            cmd::step("running the agent (Ctrl-C stops it)");
            let mut all = vec!["run".to_owned()];
            all.extend(args);
            cmd::exec(
                &env,
                &cmd::target_dir().join("release/hugepage-agent"),
                &all,
            )
        }
        Task::Test => {
            require_root("cargo xtask test")?;
            let mut env = setup::ensure()?;
            env.peers = setup::ensure_peers()?;
            test(&env)
        }
        Task::FreshTest { keep_cache } => fresh_test(keep_cache),
        Task::Fuzz {
            seconds,
            runs,
            jobs,
            target,
        } => {
            let budget = runs.map_or(fuzz::Budget::Seconds(seconds), fuzz::Budget::Runs);
            fuzz::run(budget, jobs, target.as_deref())
        }
        Task::VmTest { kernel } => vm::run(&setup::ensure()?, &kernel.0),
        Task::Layers => layers::check(&cmd::workspace().join("agent/src")),
        Task::Image { source } => {
            let env = setup::ensure()?;
            image::build(&env, source.as_deref()).map(|_| ())
        }
        Task::Release {
            out,
            source,
            allow_dirty,
        } => {
            let env = setup::ensure()?;
            release::run(&env, out, source.as_deref(), allow_dirty).map(|_| ())
        }
        Task::Manifests { check } => manifests::run(check),
        Task::Docs { check } => {
            let mut env = setup::ensure()?;
            env.peers = setup::ensure_peers()?;
            docs::run(&env, check)
        }
        Task::Bench { which, args } => {
            require_root("cargo xtask bench")?;
            let mut env = setup::ensure()?;
            if which == bench::Bench::AdmitTrace {
                env.peers = setup::ensure_peers()?;
            }
            bench::run(&env, which, &args)
        }
    }
}

/// How long `test` runs each fuzz target: long enough to replay the seeds and mutate them a few
/// hundred thousand times; the long runs are `cargo xtask fuzz --seconds N` or `--runs N`.
const FUZZ_TEST_SECONDS: u64 = 5;

fn test(env: &cmd::Env) -> Result<()> {
    cmd::step("deploy/ files generated from dashboards/ are current");
    manifests::run(true)?;
    // Before the snapshot: the build fills podman's storage and its cache, which stay.
    cmd::step("the container image the DaemonSet test runs");
    image::build(env, None)?;
    let before = host::Snapshot::capture();
    cmd::step("module layers: every import points down");
    layers::check(&cmd::workspace().join("agent/src"))?;
    fuzz::check()?;
    cmd::step("the supply chain: cargo deny check licenses bans sources (deny.toml)");
    let deny = setup::ensure_cargo_deny()?.join("cargo-deny");
    let mut check = std::process::Command::new(deny);
    check
        .args(["--locked", "check", "licenses", "bans", "sources"])
        .current_dir(cmd::workspace());
    cmd::run(check)?;
    cmd::step("formatting");
    cmd::cargo(env, &["fmt", "--all", "--", "--check"])?;
    cmd::cargo(
        env,
        &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"],
    )?;
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
    // Before the long steps: the fuzz crate is not in the workspace, so clippy above does not
    // build it, and a change of the agent's API shows here first.
    cmd::step(&format!(
        "every fuzz target for {FUZZ_TEST_SECONDS} s (`cargo xtask fuzz` runs them longer)"
    ));
    fuzz::run(fuzz::Budget::Seconds(FUZZ_TEST_SECONDS), 1, None)?;
    cmd::step("the agent binary the tests run");
    cmd::cargo(env, &["build", "--package", "hugepage-agent"])?;
    cmd::step("docs/reference/ is what the code gives, and every link of the docs resolves");
    docs::run(env, true)?;
    cmd::step("every test");
    let (mut passed, mut failed) = cmd::cargo_test(env, &["test", "--workspace"])?;
    cmd::step(
        "the VM test: Linux 6.1, 6.1-rt, 6.12 and 6.12-rt with 4 NUMA nodes under QEMU, the agent's checks inside",
    );
    let (vm_passed, vm_failed) = vm::test(env, &vm::Flavour::ALL)?;
    (passed, failed) = (passed + vm_passed, failed + vm_failed);
    if vm_failed > 0 {
        bail!("{vm_failed} VM check(s) failed (above)");
    }
    cmd::step("nothing left on the host by the tests");
    let left = host::without_documented(host::Snapshot::capture().changes_since(&before));
    for line in &left {
        eprintln!("left on the host: {line}");
    }
    if !left.is_empty() {
        bail!(
            "the tests left {} change(s) on the host (above): a test must restore what it changes",
            left.len()
        );
    }
    println!("{passed} passed, {failed} failed");
    Ok(())
}

/// `cargo xtask test` in a fresh clone, on a host reset to a new machine's state.
fn fresh_test(keep_cache: bool) -> Result<()> {
    require_root("cargo xtask fresh-test")?;
    cmd::step("removing what earlier runs left on this host");
    for line in host::reset()? {
        eprintln!("  {line}");
    }
    let clone = host::fresh_clone()?;
    cmd::step(&format!(
        "cargo xtask test in a fresh clone at {}",
        clone.display()
    ));
    let mut test = std::process::Command::new("cargo");
    test.args(["xtask", "test"])
        .current_dir(&clone)
        .env("CARGO_TARGET_DIR", clone.join("target"));
    if !keep_cache {
        test.env(setup::CACHE_VAR, clone.join("cache"));
    }
    let outcome = cmd::run(test);
    if outcome.is_ok() {
        let _ = std::fs::remove_dir_all(clone.parent().unwrap_or(&clone));
    } else {
        // The build (about 20 GB) goes even on failure: a kept one filled this machine's disk
        // and the next CI run on it failed for want of space. The sources stay for a look.
        for built in ["target", "cache"] {
            let _ = std::fs::remove_dir_all(clone.join(built));
        }
        eprintln!(
            "the clone's sources are kept for a look (its target/ and cache/ removed): {}",
            clone.display()
        );
    }
    outcome
}

/// The kernels `--kernel` names: one flavour, or `all`.
#[derive(Debug, Clone)]
struct Kernels(Vec<vm::Flavour>);

fn kernels(text: &str) -> Result<Kernels, String> {
    if text == "all" {
        return Ok(Kernels(vm::Flavour::ALL.to_vec()));
    }
    <vm::Flavour as clap::ValueEnum>::from_str(text, false)
        .map(|k| Kernels(vec![k]))
        .map_err(|_| format!("{text:?}: expected 6.1, 6.1-rt, 6.12, 6.12-rt or all"))
}

fn require_root(what: &str) -> Result<()> {
    if !cmd::is_root() {
        bail!("{what} loads eBPF programs and changes hugepage pools: run it as root");
    }
    Ok(())
}
