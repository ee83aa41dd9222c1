//! The kubelet settings the running agent answers with, kept current: read at start, then
//! checked at every tick of the run loop (the pace at which the kubelet's checkpoint is checked)
//! for a new kubelet process or a changed file, and read again when either changed. The agent's
//! flags are laid over what was found. A reading that fails keeps the last good settings (at
//! start: the kubelet's defaults and the flags), says so once in the log, and marks every
//! source as kept; the view is published through an atomic pointer that the API reads.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::SystemTime};

use arc_swap::ArcSwap;
use serde::Serialize;
use tracing::{info, warn};

use super::{
    discovery::{self, DiscoveryError, Found, Stamp},
    settings::{KubeletSettings, Layer, MemoryManagerPolicy, Row},
};
use crate::{
    host::NodeInfo, memorymanager::selection::TopologyConfig, sysfs::HostFs,
    topologymanager::NumaInfo,
};

/// What the API and the admissions read.
#[derive(Debug, Clone)]
pub struct KubeletView {
    pub settings: KubeletSettings,
    /// The machine's NUMA nodes as the Topology Manager sees them under these settings' options.
    pub numa_info: Arc<NumaInfo>,
    /// Where the settings came from, in words.
    pub origin: String,
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
    pub settings: BTreeMap<String, Row>,
    pub loaded_at: String,
}

impl KubeletView {
    pub fn topology(&self) -> TopologyConfig {
        self.settings.topology()
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
}

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

    /// Checks for a new kubelet process or a changed file; reads again if either changed.
    /// Returns whether the settings in use changed.
    pub fn tick(&mut self) -> bool {
        if discovery::restamp(&self.host, &self.stamp) == self.stamp {
            return false;
        }
        self.reload()
    }

    /// Reads the settings afresh and publishes them (or keeps the last good ones).
    fn reload(&mut self) -> bool {
        let reading = discovery::read(&self.host, self.explicit.as_deref());
        self.stamp = reading.stamp;
        let before = self.view.load_full();
        match with_flags(reading.outcome, &self.flags, &self.nodes) {
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
    match with_flags(discovery::read(host, explicit).outcome, flags, nodes) {
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
                ..fallback
            })
        }
    }
}

/// What a reading found with the agent's `flags` over it, or why it cannot be used.
fn with_flags(
    outcome: Result<Found, DiscoveryError>,
    flags: &Layer,
    nodes: &[NodeInfo],
) -> Result<KubeletView, String> {
    let found = outcome.map_err(|e| e.to_string())?;
    let mut layers: Vec<&Layer> = found.layers.iter().collect();
    layers.push(flags);
    view(&layers, nodes, &found.origin)
}

/// The settings of `layers` over the kubelet's defaults, on a machine with these NUMA nodes.
pub fn view(layers: &[&Layer], nodes: &[NodeInfo], origin: &str) -> Result<KubeletView, String> {
    let settings = KubeletSettings::resolve(layers).map_err(|e| e.to_string())?;
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
    let numa_info = NumaInfo::from_topology(nodes, &settings.policy_options)
        .map_err(|e| format!("the Topology Manager: {e}"))?;
    Ok(KubeletView {
        settings,
        numa_info: Arc::new(numa_info),
        origin: origin.to_owned(),
        error: None,
        kept: false,
        loaded_at: SystemTime::now(),
    })
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
}
