//! What the kubelet's Topology Manager needs to start (`NewManager`, `topology_manager.go`):
//! under `none` nothing at all: it returns before it reads its options or counts NUMA nodes, so
//! any machine and any options start. Under the other policies its options must read (an
//! unknown name, or a value that does not, stops the kubelet), `prefer-closest-numa-nodes`
//! needs every distance, and the machine may have at most `max-allowable-numa-nodes` NUMA nodes
//! (8 unless it says more). [`start`] answers as the kubelet would: the options in effect, or
//! the refusal with which the kubelet itself does not start ([`StartError`]).
//!
//! Pure: the agent asks it of the kubelet's settings and of a request's own policy, and keeps
//! running whatever it answers (#40).

use super::{
    numa_info::NumaInfo,
    policy::{Policy, PolicyError, PolicyOptions},
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Options(#[from] PolicyError),
    #[error("prefer-closest-numa-nodes needs distances: node {node} has no distance to node {to}")]
    MissingDistance { node: usize, to: usize },
    #[error(
        "policy {policy} on {count} NUMA nodes: the kubelet's Topology Manager does not start on machines with more than {max} (its option max-allowable-numa-nodes raises that)"
    )]
    TooManyNodes {
        policy: Policy,
        count: usize,
        max: usize,
    },
}

/// Whether the kubelet's Topology Manager starts with `policy` and `options` (`name`, `value`
/// pairs as its flag and file spell them) on the machine `info`: the options in effect (under
/// `none` the defaults, never read), or why it does not.
pub fn start<'a, T: AsRef<str>>(
    policy: Policy,
    options: impl IntoIterator<Item = (&'a str, T)>,
    info: &NumaInfo,
) -> Result<PolicyOptions, StartError> {
    if policy == Policy::None {
        return Ok(PolicyOptions::default());
    }
    let options = PolicyOptions::from_pairs(options)?;
    if options.prefer_closest_numa_nodes
        && let Some((node, to)) = info.missing_distance()
    {
        return Err(StartError::MissingDistance { node, to });
    }
    let count = info.nodes().len();
    if count > options.max_allowable_numa_nodes {
        return Err(StartError::TooManyNodes {
            policy,
            count,
            max: options.max_allowable_numa_nodes,
        });
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn machine(count: usize) -> NumaInfo {
        let nodes: Vec<usize> = (0..count).collect();
        let distances = nodes
            .iter()
            .map(|&a| {
                (
                    a,
                    nodes
                        .iter()
                        .map(|&b| if a == b { 10 } else { 20 })
                        .collect(),
                )
            })
            .collect();
        NumaInfo::new(nodes, distances).expect("a machine")
    }

    const NO_OPTIONS: [(&str, &str); 0] = [];

    /// Bug (#40): the agent refused nine NUMA nodes under `none`, where the kubelet starts.
    #[test]
    fn none_starts_on_any_machine_with_any_options_as_the_kubelet_returns_first() {
        for count in [1, 8, 9, 16, 64] {
            assert_eq!(
                start(Policy::None, NO_OPTIONS, &machine(count)),
                Ok(PolicyOptions::default()),
                "{count} nodes"
            );
        }
        let nonsense = [("no-such-option", "x"), ("max-allowable-numa-nodes", "2")];
        assert_eq!(
            start(Policy::None, nonsense, &machine(9)),
            Ok(PolicyOptions::default())
        );
    }

    #[test]
    fn other_policies_take_at_most_max_allowable_numa_nodes_and_only_options_that_read() {
        for policy in [
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ] {
            assert!(start(policy, NO_OPTIONS, &machine(8)).is_ok());
            assert_eq!(
                start(policy, NO_OPTIONS, &machine(9)),
                Err(StartError::TooManyNodes {
                    policy,
                    count: 9,
                    max: 8
                })
            );
            let raised = [("max-allowable-numa-nodes", "16")];
            let options = start(policy, raised, &machine(16)).expect("raised to 16");
            assert_eq!(options.max_allowable_numa_nodes, 16);
            assert!(start(policy, raised, &machine(17)).is_err());
            assert_eq!(
                start(policy, [("prefer-closest", "true")], &machine(2)),
                Err(StartError::Options(PolicyError::UnknownOption(
                    "prefer-closest".into()
                )))
            );
        }
        let message = start(Policy::SingleNumaNode, NO_OPTIONS, &machine(9))
            .expect_err("nine")
            .to_string();
        assert_eq!(
            message,
            "policy single-numa-node on 9 NUMA nodes: the kubelet's Topology Manager does not start on machines with more than 8 (its option max-allowable-numa-nodes raises that)"
        );
    }

    #[test]
    fn prefer_closest_needs_every_distance_and_nothing_else_does() {
        let distances = BTreeMap::from([(0, vec![10, 20]), (1, vec![20])]);
        let info = NumaInfo::new(vec![0, 1], distances).expect("a machine");
        let closest = [("prefer-closest-numa-nodes", "true")];
        assert_eq!(
            start(Policy::BestEffort, closest, &info),
            Err(StartError::MissingDistance { node: 1, to: 1 })
        );
        assert!(start(Policy::BestEffort, NO_OPTIONS, &info).is_ok());
    }
}
