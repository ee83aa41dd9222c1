//! The agent's flags that override the node's kubelet settings (`--topology-policy`,
//! `--topology-policy-options`, `--topology-scope`, `--memory-manager-policy`,
//! `--reserved-memory`, `--feature-gates`), and where the kubelet's files are when no kubelet
//! process says (`--kubelet-config`, `--kubelet-state`). The overrides become one [`Layer`] over
//! what the kubelet's own command line and files set; a flag that does not read is refused here,
//! naming it, before the agent starts.

use std::path::PathBuf;

use clap::Args;

use super::{
    cmdline,
    settings::{
        Layer, LayerError, MIRRORED_GATES, Source, Sourced, VERIFICATION_GATE, check_options,
        key_values, parse_memory_manager_policy,
    },
};
use crate::{
    admission::verify::Gate, memorymanager::hints::Scope, sysfs::HostFs, topologymanager::Policy,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeletFlagError {
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error(
        "--feature-gates: unrecognized feature gate {0:?}: the agent mirrors MemoryManagerHugepagesVerification, PodLevelResources and PodLevelResourceManagers"
    )]
    UnknownGate(String),
}

/// `container` or `pod`, for clap.
pub fn parse_scope(text: &str) -> Result<Scope, String> {
    text.parse()
}

/// `--feature-gates`, alone for `hints`, among the overrides for `run` and `check`.
#[derive(Debug, Clone, Args)]
pub struct GateArgs {
    /// Override of kubelet feature gates the agent mirrors, e.g.
    /// `PodLevelResources=true,MemoryManagerHugepagesVerification=false`; each gate named
    /// replaces the kubelet's.
    #[arg(long, env = "HUGEPAGE_AGENT_FEATURE_GATES")]
    pub feature_gates: Option<String>,
}

impl GateArgs {
    /// The gates named, each checked, into `layer`.
    pub fn into_layer(&self, layer: &mut Layer) -> Result<(), KubeletFlagError> {
        let Some(text) = &self.feature_gates else {
            return Ok(());
        };
        const FLAG: &str = "--feature-gates";
        for (name, value) in key_values(FLAG, text)? {
            let gate = MIRRORED_GATES
                .into_iter()
                .find(|g| *g == name)
                .ok_or_else(|| KubeletFlagError::UnknownGate(name.clone()))?;
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(LayerError {
                        field: FLAG.into(),
                        detail: format!("{name}={value}: not true or false"),
                    }
                    .into());
                }
            };
            layer.gates.insert(gate, at(on, FLAG));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubelet settings (overrides)")]
pub struct KubeletArgs {
    /// Override of the kubelet's Topology Manager policy (default: the node's kubelet's).
    #[arg(long, env = "HUGEPAGE_AGENT_TOPOLOGY_POLICY", value_enum)]
    pub topology_policy: Option<Policy>,
    /// Override of the kubelet's `--topology-manager-policy-options`, e.g.
    /// `prefer-closest-numa-nodes=true`.
    #[arg(long, env = "HUGEPAGE_AGENT_TOPOLOGY_POLICY_OPTIONS")]
    pub topology_policy_options: Option<String>,
    /// Override of the kubelet's Topology Manager scope: container or pod.
    #[arg(long, env = "HUGEPAGE_AGENT_TOPOLOGY_SCOPE", value_parser = parse_scope)]
    pub topology_scope: Option<Scope>,
    /// Override of the kubelet's Memory Manager policy: None (nothing pinned: verified on every
    /// NUMA node) or Static.
    #[arg(long, env = "HUGEPAGE_AGENT_MEMORY_MANAGER_POLICY")]
    pub memory_manager_policy: Option<String>,
    /// The kubelet Memory Manager checkpoint (default: <host-root>/var/lib/kubelet/memory_manager_state).
    #[arg(long, env = "HUGEPAGE_AGENT_KUBELET_STATE")]
    pub kubelet_state: Option<PathBuf>,
    /// The kubelet's configuration file (a host path) when no kubelet process is found (default:
    /// the first of the places installers write it).
    #[arg(long, env = "HUGEPAGE_AGENT_KUBELET_CONFIG", value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
    /// Override of the kubelet's `--reserved-memory`, used when there is no checkpoint, e.g.
    /// `0:memory=1Gi,hugepages-1Gi=2Gi`; repeat or separate nodes with `;`.
    #[arg(long, env = "HUGEPAGE_AGENT_RESERVED_MEMORY", value_delimiter = ' ')]
    pub reserved_memory: Vec<String>,
    #[command(flatten)]
    pub gates: GateArgs,
}

/// A value an agent flag set.
fn at<T>(value: T, flag: &'static str) -> Sourced<T> {
    Sourced {
        value,
        source: Source::Flag(flag),
    }
}

/// What the kubelet's overrides come to: one layer over the kubelet's settings, and where its
/// files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletFlags {
    /// The agent's flags that override the node's kubelet settings.
    pub layer: Layer,
    /// `--kubelet-config`: the file read when no kubelet process is found (a host path).
    pub config: Option<PathBuf>,
    /// The kubelet Memory Manager checkpoint, as a path on this machine.
    pub state: PathBuf,
}

impl KubeletArgs {
    /// The overrides, each checked, on `host`; `--verification` overrides the kubelet's gate.
    pub fn flags(
        &self,
        host: &HostFs,
        verification: Option<Gate>,
    ) -> Result<KubeletFlags, KubeletFlagError> {
        let mut layer = Layer {
            policy: self.topology_policy.map(|p| at(p, "--topology-policy")),
            scope: self.topology_scope.map(|s| at(s, "--topology-scope")),
            ..Layer::default()
        };
        if let Some(text) = &self.topology_policy_options {
            const FLAG: &str = "--topology-policy-options";
            let options = key_values(FLAG, text)?;
            check_options(FLAG, &options)?;
            layer.options = Some(at(options, FLAG));
        }
        if let Some(text) = &self.memory_manager_policy {
            const FLAG: &str = "--memory-manager-policy";
            layer.memory_manager_policy = Some(at(parse_memory_manager_policy(FLAG, text)?, FLAG));
        }
        if !self.reserved_memory.is_empty() {
            let reserved = cmdline::reserved_memory(&self.reserved_memory)?;
            layer.reserved_memory = Some(at(reserved, "--reserved-memory"));
        }
        self.gates.into_layer(&mut layer)?;
        if let Some(gate) = verification {
            layer
                .gates
                .insert(VERIFICATION_GATE, at(gate == Gate::On, "--verification"));
        }
        Ok(KubeletFlags {
            layer,
            config: self.kubelet_config.clone(),
            state: self
                .kubelet_state
                .clone()
                .unwrap_or_else(|| host.path("/var/lib/kubelet/memory_manager_state")),
        })
    }
}
