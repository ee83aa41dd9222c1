//! KEP-5394's node conditions from the guest's real memory pressure. A `kubepods` cgroup is made
//! at the root of the v2 hierarchy (where the kubelet's cgroupfs driver puts it, so the agent's
//! kubepods scope is its `memory.pressure`) with a child whose `memory.high` is 1 MiB, and one
//! `toucher` per CPU, pinned there, faults 1 GiB of ordinary pages in that child. There is no
//! swap: past `memory.high` nothing can be reclaimed, and the kernel throttles each toucher on
//! every return to user space (`mem_cgroup_handle_over_high`: reclaim, then sleep up to 2 s, both
//! inside `psi_memstall_enter`), so the child, kubepods and the whole system show memory `some`
//! stall nearly all the time for as long as they run.
//!
//! An agent of this check's own runs with a memory threshold of 20 % and a 500 ms interval. Its
//! `GET /v1/conditions` must show `SystemMemoryContentionPressure` and
//! `KubepodsMemoryContentionPressure` False before, True while the touchers run (avg60 and avg10
//! at or above 20 %: with the averages the kernel recomputes every 2 s, avg60 gets there after
//! about 14 s), and False again after they are killed (avg60 decays with its 60 s time constant
//! from just above 20 %: a few seconds). The threshold is chosen for that: a lower one is reached
//! sooner but overshot by more, relatively, and avg60 then takes longer to fall back.
//! `GET /v1/events` must hold the KEP's events of both transitions.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent_tests::{HostLock, http};
use serde_json::Value;

use crate::{CheckResult, Guest};

/// The memory threshold, in percent.
const THRESHOLD: &str = "20";
const CONDITIONS: [&str; 2] = [
    "SystemMemoryContentionPressure",
    "KubepodsMemoryContentionPressure",
];
/// `memory.high` of the cgroup the touchers run in: small, so that the kernel's throttling
/// (which grows with the square of the overage) reaches its 2 s sleeps within a few batches.
const HIGH: u64 = 1 << 20;
/// How long each transition may take.
const ON_WITHIN: Duration = Duration::from_secs(60);
const OFF_WITHIN: Duration = Duration::from_secs(45);

pub fn memory_high(guest: &Guest, lock: &HostLock) -> CheckResult {
    let tree = KubepodsTree::create(lock)?;
    let mut cmd = guest.agent();
    cmd.args(["run", "--ebpf", "off", "--psi-memory-threshold", THRESHOLD])
        .args(["--psi-interval", "500ms"]);
    let agent = guest.start_own("psi", cmd, Duration::from_secs(60))?;
    let (before, view) = wait_status(agent.port, "False", Duration::from_secs(10))?;
    let kubepods_file = format!("{}/memory.pressure", tree.kubepods.display());
    let armed: Vec<&str> = view["triggers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["armed"] == true)
        .filter_map(|t| t["file"].as_str())
        .collect();
    if !armed.contains(&"/proc/pressure/memory") || !armed.contains(&kubepods_file.as_str()) {
        return Err(format!(
            "expected PSI triggers armed on /proc/pressure/memory and {kubepods_file}: {}",
            view["triggers"]
        ));
    }
    let pressure = Pressure::start(guest, &tree.leaf)?;
    let touchers = pressure.children.len();
    let (on, _) = wait_status(agent.port, "True", ON_WITHIN)?;
    let pressed_for = pressure.started.elapsed();
    let ended = Instant::now();
    drop(pressure);
    let (off, _) = wait_status(agent.port, "False", OFF_WITHIN)?;
    let off_after = ended.elapsed();
    let (status, body) = http(agent.port, "GET", "/v1/events", None, "");
    let events: Value = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}: {body}"))?;
    let reasons: Vec<String> = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["resource"] == "memory")
        .filter_map(|e| {
            Some(format!(
                "{} {}",
                e["scope"].as_str()?,
                e["reason"].as_str()?
            ))
        })
        .collect();
    for condition in CONDITIONS {
        let scope = if condition.starts_with("System") {
            "system"
        } else {
            "kubepods"
        };
        for want in [
            "HighMemoryContentionPressure".to_owned(),
            format!("NodeHas{condition}"),
            format!("NodeHasNo{condition}"),
        ] {
            if !reasons.contains(&format!("{scope} {want}")) {
                return Err(format!(
                    "GET /v1/events: {status}, no {scope} event {want} among {reasons:?}"
                ));
            }
        }
    }
    drop(agent);
    drop(tree);
    Ok(format!(
        "threshold {THRESHOLD}%, {} touchers (one per CPU) over memory.high {} KiB in \
         kubepods/pressure: {} False ({}), True {:.1} s after they started ({}), False {:.1} s \
         after they were killed ({}); \
         triggers armed on /proc/pressure/memory and {kubepods_file}; events: {}",
        touchers,
        HIGH >> 10,
        CONDITIONS.join(" and "),
        averages(&before),
        pressed_for.as_secs_f64(),
        averages(&on),
        off_after.as_secs_f64(),
        averages(&off),
        reasons.join(", ")
    ))
}

/// Polls `GET /v1/conditions` until both memory conditions have `status`; returns them (in
/// [`CONDITIONS`] order) and the whole answer.
fn wait_status(port: u16, status: &str, within: Duration) -> Result<(Vec<Value>, Value), String> {
    let deadline = Instant::now() + within;
    loop {
        let (code, body) = http(port, "GET", "/v1/conditions", None, "");
        let view: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let found: Vec<Value> = CONDITIONS
            .iter()
            .filter_map(|kind| {
                view["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == *kind)
                    .cloned()
            })
            .collect();
        if code == 200 && found.len() == 2 && found.iter().all(|c| c["status"] == status) {
            return Ok((found, view));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "GET /v1/conditions: {code}: the memory conditions were not all {status} within \
                 {} s: {}",
                within.as_secs(),
                serde_json::to_string(&found).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The averages a condition's message gives, one scope after the other:
/// `system avg10=…% avg60=…%; kubepods …`.
fn averages(conditions: &[Value]) -> String {
    conditions
        .iter()
        .map(|c| {
            let message = c["message"].as_str().unwrap_or_default();
            let pick = |key: &str| {
                message
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .unwrap_or("?")
                    .to_owned()
            };
            let scope = c["type"].as_str().map_or("?", |t| {
                if t.starts_with("System") {
                    "system"
                } else {
                    "kubepods"
                }
            });
            format!("{scope} avg10={} avg60={}", pick("avg10="), pick("avg60="))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `kubepods` at the root of the v2 hierarchy with the memory controller, and its child
/// `pressure` with `memory.high` of [`HIGH`]; removed, and the controller disabled again if it was
/// enabled here, when dropped.
struct KubepodsTree {
    kubepods: PathBuf,
    leaf: PathBuf,
    /// The root's `cgroup.subtree_control`, when `+memory` was written to it here.
    enabled: Option<PathBuf>,
}

impl KubepodsTree {
    fn create(_lock: &HostLock) -> Result<KubepodsTree, String> {
        let mount = PathBuf::from(hugepage_agent_tests::v2().mount);
        let control = mount.join("cgroup.subtree_control");
        let before =
            fs::read_to_string(&control).map_err(|e| format!("{}: {e}", control.display()))?;
        let mut tree = KubepodsTree {
            kubepods: mount.join("kubepods"),
            leaf: mount.join("kubepods/pressure"),
            enabled: None,
        };
        if !before.split_whitespace().any(|c| c == "memory") {
            write(&control, "+memory")?;
            tree.enabled = Some(control);
        }
        if tree.kubepods.exists() {
            return Err(format!("{} exists already", tree.kubepods.display()));
        }
        fs::create_dir(&tree.kubepods)
            .map_err(|e| format!("mkdir {}: {e}", tree.kubepods.display()))?;
        write(&tree.kubepods.join("cgroup.subtree_control"), "+memory")?;
        fs::create_dir(&tree.leaf).map_err(|e| format!("mkdir {}: {e}", tree.leaf.display()))?;
        write(&tree.leaf.join("memory.high"), &HIGH.to_string())?;
        Ok(tree)
    }
}

fn write(path: &std::path::Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

impl Drop for KubepodsTree {
    fn drop(&mut self) {
        for dir in [&self.leaf, &self.kubepods] {
            for _ in 0..100 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(control) = &self.enabled
            && let Err(err) = fs::write(control, "-memory")
        {
            eprintln!("disabling memory in {}: {err}", control.display());
        }
    }
}

/// One toucher per CPU, pinned there, each faulting 1 GiB of 4 KiB pages in the throttled
/// cgroup; killed (`SIGKILL`: the throttling sleep is killable) when dropped.
///
/// One on every CPU, because the system's `some` is each CPU's share weighted by how busy that
/// CPU was: a single stalled task leaves the agent's and this check's CPU time, unstalled,
/// diluting the system's figure (64 % against the kubepods cgroup's 84 % with one toucher), and
/// the system's condition then turns True well after the kubepods one, whose avg60 has by then
/// overshot the threshold and takes far longer to fall back.
struct Pressure {
    children: Vec<Child>,
    started: Instant,
}

impl Pressure {
    fn start(guest: &Guest, cgroup: &std::path::Path) -> Result<Pressure, String> {
        let mut pressure = Pressure {
            children: Vec::new(),
            started: Instant::now(),
        };
        let cpus: Vec<u32> = crate::sysfs::nodes()?
            .into_iter()
            .map(crate::sysfs::cpus)
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        for cpu in cpus {
            let child = Command::new(guest.toucher())
                .arg("--cgroup")
                .arg(cgroup)
                .args(["--cpu", &cpu.to_string()])
                .args(["--small", &(1u64 << 18).to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting a toucher on CPU {cpu}: {e}"))?;
            pressure.children.push(child);
        }
        Ok(pressure)
    }
}

impl Drop for Pressure {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}
