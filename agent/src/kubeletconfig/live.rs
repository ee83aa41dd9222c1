//! The kubelet settings the running agent answers with, kept current: read at start, then
//! checked at every tick of the run loop (the pace at which the kubelet's checkpoint is checked)
//! for a new kubelet process or a changed file, and read again when either changed. The agent's
//! flags are laid over what was found. A reading that fails keeps the last good settings (at
//! start: the kubelet's defaults and the flags), says so once in the log, and marks every
//! source as kept; the view is published through an atomic pointer that the API reads.
//!
//! Settings with which the kubelet itself would not start on this machine (its Topology
//! Manager's refusal: more NUMA nodes than `max-allowable-numa-nodes` under a policy other than
//! `none`, options it does not know) are used all the same and said to be refused
//! ([`KubeletView::refusal`]: logged once, in `GET /v1/kubelet`, a metric, `/readyz`'s detail):
//! the agent keeps running, and only what needs the Topology Manager's answer (NUMA selection
//! for a request that names no NUMA nodes) says it cannot have one (#40). A node agent never
//! crash-loops over another component's setting.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::SystemTime};

use arc_swap::ArcSwap;
use serde::Serialize;
use tracing::{info, warn};

use super::{
    discovery::{self, Candidate, DiscoveryError, Found, Stamp},
    settings::{KubeletSettings, Layer, MemoryManagerPolicy, Row},
};
use crate::{
    host::NodeInfo,
    memorymanager::{hints::Scope, selection::TopologyConfig},
    sysfs::HostFs,
    topologymanager::{NumaInfo, Policy},
};

/// What the API and the admissions read.
#[derive(Debug, Clone)]
pub struct KubeletView {
    pub settings: KubeletSettings,
    /// The machine's NUMA nodes as the Topology Manager reads them, or why they cannot be read
    /// so (node ids past its 64-bit masks).
    pub machine: Result<Arc<NumaInfo>, String>,
    /// Why the kubelet would not start with these settings on this machine (or why the agent
    /// cannot select NUMA nodes as it would), when so.
    pub refusal: Option<String>,
    /// Where the settings came from, in words.
    pub origin: String,
    /// Every process named `kubelet` the latest reading looked at, and why each that is not
    /// followed is not the host's.
    pub candidates: Vec<Candidate>,
    /// Why the latest reading was not used, when it was not.
    pub error: Option<String>,
    /// Whether `settings` are from an earlier reading (the latest failed).
    pub kept: bool,
    pub loaded_at: SystemTime,
}

/// `GET /v1/kubelet`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletAnswer {
    pub origin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the kubelet would not start with these settings on this machine, when so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Every process named `kubelet` looked at; `refused` says why one is not the host's.
    pub candidates: Vec<Candidate>,
    pub settings: BTreeMap<String, Row>,
    pub loaded_at: String,
}

impl KubeletView {
    /// How the kubelet would select NUMA nodes, under the settings' own policy and scope or a
    /// request's: or why there is no such selection (the kubelet would not start with them on
    /// this machine).
    pub fn topology(
        &self,
        policy: Option<Policy>,
        scope: Option<Scope>,
    ) -> Result<TopologyConfig, String> {
        let info = self.machine.clone()?;
        let policy = policy.unwrap_or(self.settings.policy.value);
        let options = self
            .settings
            .start(policy, &info)
            .map_err(|e| refused(&e.to_string()))?;
        Ok(TopologyConfig {
            info,
            policy,
            options,
            scope: scope.unwrap_or(self.settings.scope.value),
            gates: self.settings.feature_gates(),
        })
    }

    /// Whether the kubelet pins memory to NUMA nodes (`Static`); under `None` KEP-5759 does not
    /// apply and the agent verifies on every node.
    pub fn pins_memory(&self) -> bool {
        self.settings.memory_manager_policy.value == MemoryManagerPolicy::Static
    }

    /// Every setting, its value and its source; a source kept from an earlier reading says so.
    pub fn rows(&self) -> BTreeMap<String, Row> {
        let mut rows = self.settings.rows();
        if self.kept {
            for row in rows.values_mut() {
                row.source.push_str(" (kept: the latest reading failed)");
            }
        }
        rows
    }

    pub fn answer(&self) -> KubeletAnswer {
        KubeletAnswer {
            origin: self.origin.clone(),
            error: self.error.clone(),
            refusal: self.refusal.clone(),
            candidates: self.candidates.clone(),
            settings: self.rows(),
            loaded_at: humantime::format_rfc3339_millis(self.loaded_at).to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("the kubelet settings with the agent's flags: {0}")]
    Flags(String),
}

/// Keeps the view current.
pub struct LiveKubelet {
    host: HostFs,
    explicit: Option<PathBuf>,
    flags: Layer,
    nodes: Vec<NodeInfo>,
    stamp: Stamp,
    view: Arc<ArcSwap<KubeletView>>,
    /// The refusal last logged: each is logged once, when it first applies.
    logged_refusal: Option<String>,
    /// When `/proc` was last scanned for processes that look like the host's kubelet.
    scanned: std::time::Instant,
}

/// How often `/proc` is scanned for a second process that looks like the host's kubelet while
/// one is followed (a scan reads every process's `comm`; the followed one is checked at every
/// tick by its own `stat`).
pub const SCAN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl LiveKubelet {
    /// The first reading (logged in one line). Fails only when the flags alone are unusable
    /// (e.g. options the machine refuses): those are the operator's to fix before starting.
    pub fn load(
        host: HostFs,
        explicit: Option<PathBuf>,
        flags: Layer,
        nodes: Vec<NodeInfo>,
    ) -> Result<LiveKubelet, LiveError> {
        let fallback = view(
            &[&flags],
            &nodes,
            "the agent's flags over the kubelet's defaults",
        )
        .map_err(LiveError::Flags)?;
        let mut live = LiveKubelet {
            host,
            explicit,
            flags,
            nodes,
            stamp: Stamp::default(),
            view: Arc::new(ArcSwap::from_pointee(fallback)),
            logged_refusal: None,
            scanned: std::time::Instant::now(),
        };
        live.reload();
        let view = live.view.load();
        if view.kept {
            log_change(&view, &view);
        }
        Ok(live)
    }

    /// The view in use.
    pub fn current(&self) -> Arc<KubeletView> {
        self.view.load_full()
    }

    /// The published view.
    pub fn reader(&self) -> Arc<ArcSwap<KubeletView>> {
        self.view.clone()
    }

    /// Checks for a new kubelet process, a second one, or a changed file; reads again if any
    /// changed. Returns whether the settings in use changed.
    pub fn tick(&mut self) -> bool {
        let scan = self.scanned.elapsed() >= SCAN_EVERY;
        if scan {
            self.scanned = std::time::Instant::now();
        }
        if discovery::restamp(&self.host, &self.stamp, scan) == self.stamp {
            return false;
        }
        self.reload()
    }

    /// Reads the settings afresh and publishes them (or keeps the last good ones); logs a
    /// refusal that is new.
    fn reload(&mut self) -> bool {
        let changed = self.read_and_publish();
        let view = self.view.load();
        if view.refusal != self.logged_refusal {
            log_refusal(self.logged_refusal.as_deref(), &view);
            self.logged_refusal.clone_from(&view.refusal);
        }
        changed
    }

    fn read_and_publish(&mut self) -> bool {
        let reading = discovery::read(&self.host, self.explicit.as_deref());
        self.stamp = reading.stamp;
        let before = self.view.load_full();
        log_refused(&before.candidates, &reading.candidates);
        match with_flags(
            reading.outcome,
            reading.candidates.clone(),
            &self.flags,
            &self.nodes,
        ) {
            Ok(next) => {
                log_change(&before, &next);
                let changed = next.settings != before.settings;
                self.view.store(Arc::new(next));
                changed
            }
            Err(error) => {
                if before.error.as_ref() != Some(&error) {
                    warn!(
                        "reading the kubelet's settings: {error}; the settings in use stay ({})",
                        before.origin
                    );
                }
                self.view.store(Arc::new(KubeletView {
                    error: Some(error),
                    kept: true,
                    candidates: reading.candidates,
                    ..(*before).clone()
                }));
                false
            }
        }
    }
}

/// One reading, unlogged, for the one-shot commands: the settings found with `flags` over them,
/// or (with the error) the flags over the kubelet's defaults.
pub fn read_once(
    host: &HostFs,
    explicit: Option<&std::path::Path>,
    flags: &Layer,
    nodes: &[NodeInfo],
) -> Result<KubeletView, LiveError> {
    let reading = discovery::read(host, explicit);
    match with_flags(reading.outcome, reading.candidates.clone(), flags, nodes) {
        Ok(view) => Ok(view),
        Err(error) => {
            let fallback = view(
                &[flags],
                nodes,
                "the agent's flags over the kubelet's defaults",
            )
            .map_err(LiveError::Flags)?;
            Ok(KubeletView {
                error: Some(error),
                kept: true,
                candidates: reading.candidates,
                ..fallback
            })
        }
    }
}

/// What a reading found with the agent's `flags` over it, or why it cannot be used.
fn with_flags(
    outcome: Result<Found, DiscoveryError>,
    candidates: Vec<Candidate>,
    flags: &Layer,
    nodes: &[NodeInfo],
) -> Result<KubeletView, String> {
    let found = outcome.map_err(|e| e.to_string())?;
    let mut layers: Vec<&Layer> = found.layers.iter().collect();
    layers.push(flags);
    Ok(KubeletView {
        candidates,
        ..view(&layers, nodes, &found.origin)?
    })
}

/// The kubelet's refusal to start with its Topology Manager's error `why`, in words.
fn refused(why: &str) -> String {
    format!(
        "the kubelet would not start with these settings on this machine: the Topology Manager: {why}"
    )
}

/// The settings of `layers` over the kubelet's defaults, on a machine with these NUMA nodes.
pub fn view(layers: &[&Layer], nodes: &[NodeInfo], origin: &str) -> Result<KubeletView, String> {
    let settings = KubeletSettings::resolve(layers);
    let reserved = &settings.reserved_memory;
    if let Some(node) = reserved
        .value
        .keys()
        .find(|&&n| !nodes.iter().any(|i| i.node.0 as usize == n))
    {
        return Err(format!(
            "reservedMemory ({}): NUMA node {node} does not exist on this machine",
            reserved.source
        ));
    }
    let machine = NumaInfo::from_topology(nodes).map(Arc::new).map_err(|e| {
        format!("the agent cannot select NUMA nodes as the kubelet would on this machine: {e}")
    });
    let refusal = match &machine {
        Ok(info) => settings
            .start(settings.policy.value, info)
            .err()
            .map(|e| refused(&e.to_string())),
        Err(why) => Some(why.clone()),
    };
    Ok(KubeletView {
        settings,
        machine,
        refusal,
        origin: origin.to_owned(),
        candidates: Vec::new(),
        error: None,
        kept: false,
        loaded_at: SystemTime::now(),
    })
}

/// A warning when the kubelet's refusal of the settings appears or changes (`was`: the one
/// logged before), a line when it goes.
fn log_refusal(was: Option<&str>, next: &KubeletView) {
    match (was, next.refusal.as_deref()) {
        (was, Some(now)) if was != Some(now) => warn!(
            origin = %next.origin,
            "{now}; the agent goes on (the map, verification on given NUMA nodes, consumers, PSI and telemetry), and admissions that need the kubelet's NUMA selection are refused saying so"
        ),
        (Some(_), None) => {
            info!(origin = %next.origin, "the kubelet's settings start on this machine again")
        }
        _ => {}
    }
}

/// A warning for each process named `kubelet` that is newly not followed, and why.
fn log_refused(before: &[Candidate], now: &[Candidate]) {
    for candidate in now {
        let Some(why) = &candidate.refused else {
            continue;
        };
        if !before.iter().any(|b| b == candidate) {
            warn!(
                pid = candidate.pid,
                "a process named kubelet is not followed: {why}"
            );
        }
    }
}

/// One line at start and whenever the settings or their origin change: every setting with its
/// value and source, and what changed.
fn log_change(before: &KubeletView, next: &KubeletView) {
    let rows = next.rows();
    let old = before.rows();
    let changed: Vec<String> = rows
        .iter()
        .filter_map(|(name, row)| {
            let was = old.get(name)?;
            (was.value != row.value).then(|| format!("{name}: {} -> {}", was.value, row.value))
        })
        .collect();
    if !changed.is_empty() || before.origin != next.origin || before.kept || next.kept {
        let settings: Vec<String> = rows
            .iter()
            .map(|(name, row)| format!("{name}={:?} ({})", row.value, row.source))
            .collect();
        let settings = settings.join(", ");
        if changed.is_empty() {
            info!(origin = %next.origin, settings, "kubelet settings");
        } else {
            let changed = changed.join("; ");
            info!(origin = %next.origin, changed, settings, "kubelet settings");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kubeletconfig::settings::{Source, Sourced},
        sysfs::{fake, topology},
        topologymanager::Policy,
    };

    const CONFIG: &str = "/var/lib/kubelet/config.yaml";

    fn config(policy: &str) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryManagerPolicy: Static\ntopologyManagerPolicy: {policy}\n"
        )
    }

    #[test]
    fn bad_input_keeps_the_last_good_settings_and_a_fix_is_taken_at_the_next_tick() {
        let (dir, host) = fake::tree(&[
            ("/proc/1/comm", "init\n"),
            ("/proc/1/cmdline", "init\0"),
            ("/sys/devices/system/node/online", "0\n"),
            ("/sys/devices/system/node/node0/cpulist", "0\n"),
            ("/sys/devices/system/node/node0/distance", "10\n"),
            (CONFIG, &config("single-numa-node")),
        ]);
        let nodes = topology::read(&host).expect("topology");
        let mut live =
            LiveKubelet::load(host, None, Layer::default(), nodes.clone()).expect("loaded");
        let reader = live.reader();
        let view = reader.load();
        assert_eq!(view.settings.policy.value, Policy::SingleNumaNode);
        assert!(view.pins_memory());
        assert_eq!(view.settings.policy.source, Source::File(CONFIG.into()));
        assert!(!live.tick(), "nothing changed");

        fake::write(dir.path(), CONFIG, "topologyManagerPolicy: [\n");
        assert!(!live.tick(), "the settings in use do not change");
        let view = reader.load();
        assert_eq!(view.settings.policy.value, Policy::SingleNumaNode);
        let error = view.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with(&format!("{CONFIG}: not YAML or JSON")),
            "{error}"
        );
        assert_eq!(
            view.rows()["topologyManagerPolicy"].source,
            format!("file {CONFIG} (kept: the latest reading failed)")
        );

        fake::write(dir.path(), CONFIG, &config("best-effort"));
        assert!(live.tick(), "the fix is read");
        let view = reader.load();
        assert_eq!(view.settings.policy.value, Policy::BestEffort);
        assert!(view.error.is_none() && !view.kept);

        // Reserved memory on a node the machine does not have is bad input too.
        fake::write(
            dir.path(),
            CONFIG,
            &(config("none") + "reservedMemory:\n- numaNode: 1\n  limits:\n    memory: 1Gi\n"),
        );
        assert!(!live.tick());
        let view = reader.load();
        assert_eq!(view.settings.policy.value, Policy::BestEffort);
        assert_eq!(
            view.error.as_deref(),
            Some(
                "reservedMemory (file /var/lib/kubelet/config.yaml): NUMA node 1 does not exist on this machine"
            )
        );

        // A flag overrides whatever the file says.
        let flags = Layer {
            policy: Some(Sourced {
                value: Policy::Restricted,
                source: Source::Flag("--topology-policy"),
            }),
            ..Layer::default()
        };
        let live = LiveKubelet::load(HostFs::new(dir.path()), None, flags, nodes).expect("flags");
        assert_eq!(live.current().settings.policy.value, Policy::Restricted);
    }

    /// A host tree of `count` NUMA nodes, the first two with a CPU each and the rest CPU-less
    /// (as CXL memory expanders show them), and a kubelet configuration file of `config`.
    fn machine(count: u32, config: &str) -> (tempfile::TempDir, HostFs, Vec<NodeInfo>) {
        let last = count - 1;
        let mut files = vec![
            ("/proc/1/comm".to_owned(), "init\n".to_owned()),
            ("/proc/1/cmdline".to_owned(), "init\0".to_owned()),
            (
                "/sys/devices/system/node/online".to_owned(),
                format!("0-{last}\n"),
            ),
            (CONFIG.to_owned(), config.to_owned()),
        ];
        for n in 0..count {
            let cpus = if n < 2 {
                format!("{n}\n")
            } else {
                "\n".to_owned()
            };
            let distances: Vec<String> = (0..count)
                .map(|to| if to == n { "10" } else { "20" }.to_owned())
                .collect();
            let dir = format!("/sys/devices/system/node/node{n}");
            files.push((format!("{dir}/cpulist"), cpus));
            files.push((format!("{dir}/distance"), distances.join(" ") + "\n"));
        }
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        let (dir, host) = fake::tree(&files);
        let nodes = topology::read(&host).expect("topology");
        (dir, host, nodes)
    }

    /// Bug (#40): on nine NUMA nodes with the kubelet's defaults (policy `none`) the agent
    /// exited, where the kubelet starts: under `none` it neither counts nodes nor reads options.
    #[test]
    fn under_none_any_number_of_nodes_and_any_options_start_and_select() {
        for count in [9, 16, 64] {
            let file = config("none") + "topologyManagerPolicyOptions: {best-guess: \"true\"}\n";
            let (_dir, host, nodes) = machine(count, &file);
            let live = LiveKubelet::load(host, None, Layer::default(), nodes).expect("runs");
            let view = live.current();
            assert_eq!(view.refusal, None, "{count} nodes");
            let topology = view.topology(None, None).expect("a selection");
            assert_eq!(topology.info.nodes().len(), count as usize);
            assert_eq!(topology.policy, Policy::None);
        }
    }

    /// Bug (#40): settings the kubelet would not start with are the kubelet's to fix; the agent
    /// says so and keeps running, and only a selection under them is refused.
    #[test]
    fn a_policy_the_kubelet_refuses_on_this_machine_is_reported_and_selection_says_why() {
        let (_dir, host, nodes) = machine(9, &config("single-numa-node"));
        let live = LiveKubelet::load(host, None, Layer::default(), nodes).expect("runs");
        let view = live.current();
        let why = "the kubelet would not start with these settings on this machine: the Topology Manager: policy single-numa-node on 9 NUMA nodes: the kubelet's Topology Manager does not start on machines with more than 8 (its option max-allowable-numa-nodes raises that)";
        assert_eq!(view.refusal.as_deref(), Some(why));
        assert_eq!(view.answer().refusal.as_deref(), Some(why));
        assert_eq!(view.topology(None, None).err().as_deref(), Some(why));
        // A request's own policy `none` needs no Topology Manager's count.
        let none = view.topology(Some(Policy::None), None).expect("none");
        assert_eq!(none.info.nodes().len(), 9);
        // The settings are in use all the same, not kept from an earlier reading.
        assert!(!view.kept && view.error.is_none());
        assert_eq!(view.settings.policy.value, Policy::SingleNumaNode);

        let raised = config("single-numa-node")
            + "topologyManagerPolicyOptions: {max-allowable-numa-nodes: \"16\"}\n";
        let (_dir, host, nodes) = machine(16, &raised);
        let view = LiveKubelet::load(host, None, Layer::default(), nodes)
            .expect("runs")
            .current();
        assert_eq!(view.refusal, None);
        let selecting = view
            .topology(None, None)
            .expect("selects as the kubelet would");
        assert_eq!(selecting.options.max_allowable_numa_nodes, 16);

        let unknown =
            config("best-effort") + "topologyManagerPolicyOptions: {best-guess: \"true\"}\n";
        let (_dir, host, nodes) = machine(2, &unknown);
        let view = LiveKubelet::load(host, None, Layer::default(), nodes)
            .expect("runs")
            .current();
        let refusal = view.refusal.clone().unwrap_or_default();
        assert!(refusal.ends_with("unknown topology policy option \"best-guess\": prefer-closest-numa-nodes and max-allowable-numa-nodes are known"), "{refusal}");
    }
}
