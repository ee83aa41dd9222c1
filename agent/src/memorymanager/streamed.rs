//! The kubelet's NUMA selection as an agent's watch carries it (`kubeletSelection` of
//! `GET /v1/hugepages?watch=true`), so that a watcher selects the nodes the kubelet would pick
//! with the agent's own code ([`crate::admission::plan`]) and no call: the Topology Manager's
//! policy, options and scope, the feature gates that change hint generation, the machine's NUMA
//! nodes and distances, and the Memory Manager's machine state (the kubelet's checkpoint form of
//! `machineState`). The assignments are left out: a pod being scheduled has none on any node, and
//! they would grow with every Guaranteed pod the node runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    hints::Scope,
    selection::TopologyConfig,
    state::{MachineState, MemoryManagerState},
};
use crate::{
    kubelet::features::FeatureGates,
    topologymanager::{NumaInfo, Policy, PolicyOptions, numa_info::NumaInfoError},
};

/// What a watcher needs to select NUMA nodes as the kubelet would on the agent's node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSelection {
    pub topology_manager_policy: Policy,
    pub topology_manager_scope: Scope,
    pub prefer_closest_numa_nodes: bool,
    pub max_allowable_numa_nodes: usize,
    pub pod_level_resources: bool,
    pub pod_level_resource_managers: bool,
    /// NUMA node id → its distances to the nodes (`/sys/devices/system/node/node<N>/distance`,
    /// indexed by node id).
    pub numa_distances: BTreeMap<usize, Vec<u64>>,
    /// The Memory Manager's machine state, as in its checkpoint.
    pub machine_state: MachineState,
}

/// The selection rebuilt from a [`KubeletSelection`]: what [`crate::admission::plan::plan`]
/// takes.
#[derive(Debug, Clone)]
pub struct Selector {
    pub config: TopologyConfig,
    pub state: MemoryManagerState,
}

impl KubeletSelection {
    /// The selection of `config` on `state` (its assignments left out).
    pub fn of(config: &TopologyConfig, state: &MemoryManagerState) -> KubeletSelection {
        KubeletSelection {
            topology_manager_policy: config.policy,
            topology_manager_scope: config.scope,
            prefer_closest_numa_nodes: config.options.prefer_closest_numa_nodes,
            max_allowable_numa_nodes: config.options.max_allowable_numa_nodes,
            pod_level_resources: config.gates.pod_level_resources,
            pod_level_resource_managers: config.gates.pod_level_resource_managers,
            numa_distances: config.info.rows(),
            machine_state: state.machine_state.clone(),
        }
    }

    /// The configuration and state to select with; the machine must be one the kubelet accepts.
    pub fn selector(self) -> Result<Selector, NumaInfoError> {
        let nodes = self.numa_distances.keys().copied().collect();
        let info = NumaInfo::new(nodes, self.numa_distances)?;
        Ok(Selector {
            config: TopologyConfig {
                info: std::sync::Arc::new(info),
                policy: self.topology_manager_policy,
                options: PolicyOptions {
                    prefer_closest_numa_nodes: self.prefer_closest_numa_nodes,
                    max_allowable_numa_nodes: self.max_allowable_numa_nodes,
                },
                scope: self.topology_manager_scope,
                gates: FeatureGates {
                    pod_level_resources: self.pod_level_resources,
                    pod_level_resource_managers: self.pod_level_resource_managers,
                },
            },
            state: MemoryManagerState {
                policy_name: "Static".to_owned(),
                machine_state: self.machine_state,
                entries: BTreeMap::new(),
                pod_entries: BTreeMap::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memorymanager::testing::{GI, node, state};

    fn config(distances: BTreeMap<usize, Vec<u64>>) -> TopologyConfig {
        let nodes = distances.keys().copied().collect();
        TopologyConfig {
            info: std::sync::Arc::new(NumaInfo::new(nodes, distances).expect("a machine")),
            policy: Policy::Restricted,
            options: PolicyOptions {
                prefer_closest_numa_nodes: true,
                max_allowable_numa_nodes: 8,
            },
            scope: Scope::Pod,
            gates: FeatureGates {
                pod_level_resources: true,
                pod_level_resource_managers: false,
            },
        }
    }

    #[test]
    fn the_selection_goes_through_json_and_comes_back_the_same_without_assignments() {
        let distances = BTreeMap::from([(0, vec![10, 21]), (1, vec![21, 10])]);
        let config = config(distances.clone());
        let mut mm = state(vec![
            (0, node(&[("hugepages-2Mi", GI, GI / 2)], &[0], 1)),
            (1, node(&[("hugepages-2Mi", GI, GI)], &[1], 0)),
        ]);
        mm.entries.insert("pod".into(), BTreeMap::new());
        let sent = serde_json::to_string(&KubeletSelection::of(&config, &mm)).expect("json");
        let read: KubeletSelection = serde_json::from_str(&sent).expect("read back");
        assert!(
            sent.contains(r#""topologyManagerPolicy":"restricted""#),
            "{sent}"
        );
        assert!(sent.contains(r#""topologyManagerScope":"pod""#), "{sent}");
        let Selector { config: got, state } = read.selector().expect("a machine");
        assert_eq!(got.policy, config.policy);
        assert_eq!(got.options, config.options);
        assert_eq!(got.scope, config.scope);
        assert_eq!(got.gates, config.gates);
        assert_eq!(got.info.rows(), distances);
        assert_eq!(state.machine_state, mm.machine_state);
        assert!(state.entries.is_empty(), "no assignments travel");
    }

    #[test]
    fn a_machine_the_kubelet_would_refuse_is_refused_by_name() {
        let mut selection = KubeletSelection::of(
            &config(BTreeMap::from([(0, vec![10])])),
            &MemoryManagerState::default(),
        );
        selection.numa_distances.clear();
        let err = selection.selector().expect_err("no nodes");
        assert_eq!(err, NumaInfoError::NoNodes);
    }
}
