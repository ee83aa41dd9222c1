//! Build prerequisites, installed idempotently: the nightly toolchain's `rust-src`, `bpf-linker`
//! built against that nightly's own libLLVM (no system LLVM), and the Debian packages tests use;
//! and the peers the tests run ([`ensure_peers`]): Prometheus and promtool (Debian), an OTLP
//! receiver's Python packages, schemathesis (the API contract test) and `kubernetes-validate`
//! with `cel-expr-python` (the manifests), each from PyPI in a venv of its own, and `@grafana/schema` with TypeScript
//! and the CRD models of the Prometheus Operator and cert-manager (npm), each in the project's
//! cache (`HUGEPAGE_AGENT_CACHE`, else `~/.cache/hugepage-agent`) at pinned versions.
//!
//! cargo-fuzz ([`ensure_cargo_fuzz`], for `cargo xtask fuzz` and `test`) and cargo-deny
//! ([`ensure_cargo_deny`], for `test`) are built from the crate registry at pinned versions into
//! `<cache>/<name>-<version>`.
//!
//! bpf-linker lives in `<cache>/bpf-linker-<nightly commit>`: a new nightly gets a new linker, and
//! the check is "does that binary run", not "does the directory exist". `<cache>/bin` points at the
//! current one, which is where a plain `cargo build` (`agent/build.rs`) finds it.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::cmd::{self, Env};

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages the tests need: `setpriv` and `unshare` (util-linux) run the agent without
/// privileges and in a mount namespace of its own; `capsh` (libcap2-bin) gives it a container's
/// root, capabilities and no_new_privs; `openssl` makes the mTLS test certificates and `curl`
/// presents them, in the agent's network namespace (`nsenter`, `ip` from iproute2); `prometheus`
/// is the server and promtool the telemetry tests check against; Go and go-spew build the
/// independent peer that checks the kubelet checkpoint checksum; `docker-registry` (the CNCF
/// Distribution registry) is the registry a release's archive is pushed to.
const DEBIAN_PACKAGES: [&str; 9] = [
    "util-linux",
    "libcap2-bin",
    "openssl",
    "curl",
    "iproute2",
    "prometheus",
    "golang-go",
    "golang-github-davecgh-go-spew-dev",
    "docker-registry",
];
/// The OTLP receiver's packages (PyPI): the official protocol messages and gRPC.
const PYTHON_PACKAGES: [&str; 3] = [
    "opentelemetry-proto==1.45.2",
    "grpcio==1.85.1",
    "protobuf==7.36.2",
];
/// The API contract test's packages (PyPI): schemathesis, which generates requests from the
/// agent's OpenAPI document, with the two packages that decide what it generates and what it
/// calls valid pinned too (hypothesis, jsonschema_rs), so that a run is the same on every machine.
const SCHEMATHESIS_PACKAGES: [&str; 3] = [
    "schemathesis==4.32.5",
    "hypothesis==6.170.17",
    "jsonschema_rs==0.60.3",
];
/// The manifests' check against the official Kubernetes schemas, and CEL (the CEL team's Python
/// wrapper of its C++ implementation) to evaluate the admission configurations' matchConditions
/// and the MutatingAdmissionPolicy's JSONPatch expression, whose `JSONPatch` type is declared to
/// CEL as a protobuf message (PyPI).
const VALIDATE_PACKAGES: [&str; 3] = [
    "kubernetes-validate==1.37.0",
    "cel-expr-python==0.1.3",
    "protobuf==7.36.2",
];
/// The dashboard's schema check (npm).
const NPM_PACKAGES: [&str; 2] = ["@grafana/schema@13.2.3", "typescript@5.9.3"];
/// The custom resources' check (npm): the Prometheus Operator's and cert-manager's CRD schemas
/// as models that validate a document against them.
const CRD_MODEL_PACKAGES: [&str; 2] = [
    "@kubernetes-models/prometheus-operator@6.0.0",
    "@kubernetes-models/cert-manager@6.0.0",
];
/// Debian packages only benchmarks need: `oha` (the HTTP load generator) builds against OpenSSL.
pub const BENCH_PACKAGES: [&str; 2] = ["libssl-dev", "pkg-config"];
const OHA_VERSION: &str = "1.16.0";
/// cargo-fuzz, which builds and runs the fuzz targets of `fuzz/` (`cargo xtask fuzz`).
const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// cargo-deny, the supply chain's check (`deny.toml`).
const CARGO_DENY_VERSION: &str = "0.20.2";

/// Makes sure everything is installed; returns the build environment.
pub fn ensure() -> Result<Env> {
    let sysroot = PathBuf::from(cmd::output("rustc", &["+nightly", "--print", "sysroot"]).context(
        "the nightly toolchain builds the eBPF programs; install it with `rustup toolchain install nightly`",
    )?.trim());
    ensure_rust_src(&sysroot)?;
    ensure_components()?;
    let linker_bin = ensure_bpf_linker(&sysroot)?;
    ensure_debian_packages(&DEBIAN_PACKAGES)?;
    Ok(Env {
        linker_bin,
        peers: Vec::new(),
    })
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    cmd::step("installing rust-src for the nightly toolchain");
    cmd::run(command(
        "rustup",
        &["component", "add", "rust-src", "--toolchain", "nightly"],
    ))
}

fn ensure_components() -> Result<()> {
    for (component, probe) in [
        ("clippy", ["clippy", "--version"]),
        ("rustfmt", ["fmt", "--version"]),
    ] {
        let present = Command::new("cargo")
            .args(probe)
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            cmd::step(&format!("installing {component}"));
            cmd::run(command("rustup", &["component", "add", component]))?;
        }
    }
    Ok(())
}

fn ensure_bpf_linker(sysroot: &Path) -> Result<PathBuf> {
    let verbose = cmd::output("rustc", &["+nightly", "-vV"])?;
    let field = |name: &str| {
        verbose
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("`rustc +nightly -vV` printed no {name}"))
    };
    let commit = field("commit-hash:")?;
    let llvm_major = field("LLVM version:")?
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    let cache = cache_dir()?;
    let prefix = cache.join(format!("bpf-linker-{}", &commit[..commit.len().min(12)]));
    let bin = prefix.join("bin");
    if !runs(&bin.join("bpf-linker")) {
        build_bpf_linker(sysroot, &prefix, &llvm_major)?;
    }
    // The stable name `agent/build.rs` looks for, so that a plain `cargo build` finds the linker.
    let current = cache.join("bin");
    let _ = fs::remove_file(&current);
    symlink(&bin, &current).with_context(|| format!("linking {}", current.display()))?;
    Ok(bin)
}

fn build_bpf_linker(sysroot: &Path, prefix: &Path, llvm_major: &str) -> Result<()> {
    cmd::step(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {llvm_major} (a few minutes, once)"
    ));
    let lib = fs::read_dir(sysroot.join("lib"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so."))
        })
        .with_context(|| format!("no libLLVM.so.* in {}/lib", sysroot.display()))?;
    let llvm = prefix.join("llvm");
    let llvm_lib = llvm.join("lib");
    fs::create_dir_all(&llvm_lib)?;
    // One link for `-lLLVM` at link time, one under the real name for the rpath at run time.
    for name in [
        PathBuf::from("libLLVM.so"),
        PathBuf::from(lib.file_name().unwrap_or_default()),
    ] {
        let link = llvm_lib.join(name);
        let _ = fs::remove_file(&link);
        symlink(&lib, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    let mut install = command(
        "cargo",
        &[
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--force",
        ],
    );
    install
        .args(["--features", &format!("llvm-{llvm_major}"), "--root"])
        .arg(prefix)
        .env("LLVM_PREFIX", &llvm);
    cmd::run(install)
}

/// Where the tests' peers are (telemetry, the API contract), for the environment of `cargo test`.
pub fn ensure_peers() -> Result<Vec<(&'static str, PathBuf)>> {
    ensure_debian_packages(&DEBIAN_PACKAGES)?;
    let cache = cache_dir()?;
    Ok(vec![
        (
            "HUGEPAGE_AGENT_OTLP_PYTHON",
            ensure_venv(
                &cache.join("otlp-venv"),
                &PYTHON_PACKAGES,
                "import grpc; from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc",
            )?,
        ),
        (
            "HUGEPAGE_AGENT_SCHEMATHESIS",
            ensure_venv(
                &cache.join("schemathesis-venv"),
                &SCHEMATHESIS_PACKAGES,
                "import schemathesis, hypothesis, jsonschema_rs",
            )?
            .with_file_name("schemathesis"),
        ),
        (
            "HUGEPAGE_AGENT_VALIDATE_PYTHON",
            ensure_venv(
                &cache.join("kubernetes-validate-venv"),
                &VALIDATE_PACKAGES,
                "import kubernetes_validate, yaml, google.protobuf; from cel_expr_python import cel",
            )?,
        ),
        (
            "HUGEPAGE_AGENT_GRAFANA_SCHEMA",
            ensure_npm(&cache.join("grafana-schema"), &NPM_PACKAGES, |prefix| {
                runs(&prefix.join("node_modules/.bin/tsc"))
                    && prefix
                        .join("node_modules/@grafana/schema/package.json")
                        .exists()
            })?,
        ),
        (
            "HUGEPAGE_AGENT_CRD_MODELS",
            ensure_npm(&cache.join("crd-models"), &CRD_MODEL_PACKAGES, |prefix| {
                CRD_MODEL_PACKAGES.iter().all(|p| {
                    let name = p.rsplit_once('@').map_or(*p, |(name, _)| name);
                    prefix
                        .join("node_modules")
                        .join(name)
                        .join("package.json")
                        .exists()
                })
            })?,
        ),
    ])
}

/// `HUGEPAGE_AGENT_CACHE`, else `~/.cache/hugepage-agent`: where bpf-linker, the peers and the
/// load generator are installed (`agent/build.rs` reads the same variable).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_VAR) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/hugepage-agent"))
}

pub const CACHE_VAR: &str = "HUGEPAGE_AGENT_CACHE";

/// A venv with `packages`, returning its Python; the check runs `imports` and compares the pins
/// it recorded.
fn ensure_venv(venv: &Path, packages: &[&str], imports: &str) -> Result<PathBuf> {
    let python = venv.join("bin/python");
    let pins = venv.join("hugepage-agent-pins");
    let wanted = packages.join(" ");
    let works = Command::new(&python)
        .args(["-c", imports])
        .output()
        .is_ok_and(|o| o.status.success());
    if works && fs::read_to_string(&pins).is_ok_and(|p| p == wanted) {
        return Ok(python);
    }
    cmd::step(&format!("installing {wanted} into {}", venv.display()));
    cmd::run(command(
        "python3",
        &["-m", "venv", &venv.display().to_string()],
    ))?;
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args(["install", "--quiet", "--disable-pip-version-check"])
        .args(packages);
    cmd::run(pip)?;
    fs::write(&pins, wanted)?;
    Ok(python)
}

/// An npm prefix with `packages`; the check is `installed` (does it work) and the recorded pins.
fn ensure_npm(
    prefix: &Path,
    packages: &[&str],
    installed: impl Fn(&Path) -> bool,
) -> Result<PathBuf> {
    let pins = prefix.join("hugepage-agent-pins");
    let wanted = packages.join(" ");
    if installed(prefix) && fs::read_to_string(&pins).is_ok_and(|p| p == wanted) {
        return Ok(prefix.to_path_buf());
    }
    if !Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        ensure_debian_packages(&["nodejs", "npm"])?;
    }
    cmd::step(&format!("installing {wanted} into {}", prefix.display()));
    fs::create_dir_all(prefix)?;
    let mut npm = command(
        "npm",
        &["install", "--no-audit", "--no-fund", "--silent", "--prefix"],
    );
    npm.arg(prefix).args(packages);
    cmd::run(npm)?;
    fs::write(&pins, wanted)?;
    Ok(prefix.to_path_buf())
}

/// The `oha` load generator, built from the crate registry once into
/// `~/.cache/hugepage-agent/oha-<version>`; returns its path.
pub fn ensure_oha() -> Result<PathBuf> {
    ensure_debian_packages(&BENCH_PACKAGES)?;
    let prefix = cache_dir()?.join(format!("oha-{OHA_VERSION}"));
    let bin = prefix.join("bin/oha");
    if runs(&bin) {
        return Ok(bin);
    }
    cmd::step(&format!(
        "building the oha {OHA_VERSION} load generator (a few minutes, once)"
    ));
    let mut install = command(
        "cargo",
        &[
            "install",
            "oha",
            "--locked",
            "--version",
            OHA_VERSION,
            "--no-default-features",
            "--features",
            "native-tls",
            "--force",
            "--root",
        ],
    );
    install.arg(&prefix);
    cmd::run(install)?;
    Ok(bin)
}

/// cargo-fuzz, built from the crate registry once into `<cache>/cargo-fuzz-<version>`; returns
/// the directory of its binary (for `PATH`: cargo finds `cargo-fuzz` there). The check is "does
/// that version run".
pub fn ensure_cargo_fuzz() -> Result<PathBuf> {
    ensure_cargo_tool("cargo-fuzz", CARGO_FUZZ_VERSION, "about a minute")
}

/// cargo-deny, the same way into `<cache>/cargo-deny-<version>`.
pub fn ensure_cargo_deny() -> Result<PathBuf> {
    ensure_cargo_tool("cargo-deny", CARGO_DENY_VERSION, "about five minutes")
}

/// A cargo subcommand `name` at `version`, built `--locked` from the crate registry once into
/// the cache; the directory of its binary.
fn ensure_cargo_tool(name: &str, version: &str, takes: &str) -> Result<PathBuf> {
    let prefix = cache_dir()?.join(format!("{name}-{version}"));
    let bin = prefix.join("bin");
    let wanted = format!("{name} {version}");
    let installed = Command::new(bin.join(name))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == wanted);
    if installed {
        return Ok(bin);
    }
    cmd::step(&format!("building {name} {version} ({takes}, once)"));
    let mut install = command(
        "cargo",
        &[
            "install",
            name,
            "--locked",
            "--version",
            version,
            "--force",
            "--root",
        ],
    );
    install.arg(&prefix);
    cmd::run(install)?;
    Ok(bin)
}

/// Installs whichever of `packages` are missing (as root), and nothing when all are there.
pub fn ensure_debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| !String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(true)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !cmd::is_root() {
        bail!(
            "Debian packages {missing:?} are needed: run as root, or `apt-get install {}`",
            missing.join(" ")
        );
    }
    cmd::step(&format!("installing Debian packages {missing:?}"));
    apt_update()?;
    let mut install = apt_get(&["install", "-y", "--no-install-recommends"]);
    install
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    cmd::run(install)
}

/// `apt-get update`, tried again every 5 s for up to ten minutes while another apt (a second
/// set-up, the daily update at boot) holds the package lists' lock: that lock, unlike dpkg's,
/// has no time-out of apt's own.
pub fn apt_update() -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        let mut update = apt_get(&["update"]);
        // The lock's message is matched: apt's own words, whatever the locale.
        let out = update
            .env("LC_ALL", "C")
            .stdout(std::process::Stdio::inherit())
            .stderr(std::process::Stdio::piped())
            .output()
            .with_context(|| format!("starting {update:?}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprint!("{stderr}");
        if out.status.success() {
            return Ok(());
        }
        if !stderr.contains("Could not get lock") || std::time::Instant::now() >= deadline {
            bail!("{update:?} failed: {}", out.status);
        }
        cmd::step("apt-get update: another apt holds the lists' lock; trying again in 5 s");
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
}

/// `apt-get` with `args`, waiting up to ten minutes for another apt or dpkg (a second set-up,
/// unattended upgrades at boot) to release dpkg's lock instead of failing at once (`update`
/// takes another lock: [`apt_update`]).
pub fn apt_get(args: &[&str]) -> Command {
    let mut cmd = command("apt-get", &["-o", "DPkg::Lock::Timeout=600"]);
    cmd.args(args);
    cmd
}

/// Whether `bin --version` runs: the check is "does it work", not "is the file there".
fn runs(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}
