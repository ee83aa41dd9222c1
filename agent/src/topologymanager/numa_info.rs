//! The machine's NUMA nodes as the Topology Manager reads them (the kubelet's `NUMAInfo`): their
//! ids, the mask of all of them ("any node"), and the distances between them
//! (`/sys/devices/system/node/node<N>/distance`), with the comparisons the merge makes of masks
//! (narrower; with `prefer-closest-numa-nodes`, closer). Node ids must fit the kubelet's 64-bit
//! masks; how many nodes a policy accepts is [`super::manager`]'s.

use std::collections::BTreeMap;

use super::bitmask::{BitmaskError, NumaMask};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumaInfoError {
    #[error("NUMA node {0} is listed twice")]
    DuplicateNode(usize),
    #[error("no NUMA nodes: the machine has at least one")]
    NoNodes,
    #[error(transparent)]
    Bitmask(#[from] BitmaskError),
}

/// The machine's NUMA nodes and their distances (`/sys/devices/system/node/node<N>/distance`,
/// indexed by node id).
#[derive(Debug, Clone)]
pub struct NumaInfo {
    nodes: Vec<usize>,
    /// `distances[from * width + to]`, node ids as indices; 0 where unknown.
    distances: Vec<u64>,
    width: usize,
    default_affinity: NumaMask,
    /// The first (from, to) without a distance.
    missing: Option<(usize, usize)>,
}

impl NumaInfo {
    /// The nodes (any order, each once) and their distances (`distances[from][to]`, rows
    /// indexed by node id); the nodes must fit the kubelet's 64-bit masks.
    pub fn new(
        mut nodes: Vec<usize>,
        distances: BTreeMap<usize, Vec<u64>>,
    ) -> Result<Self, NumaInfoError> {
        nodes.sort_unstable();
        if let Some(w) = nodes.windows(2).find(|w| w[0] == w[1]) {
            return Err(NumaInfoError::DuplicateNode(w[0]));
        }
        if nodes.is_empty() {
            return Err(NumaInfoError::NoNodes);
        }
        let default_affinity = NumaMask::from_nodes(&nodes)?;
        let missing = nodes.iter().find_map(|&node| {
            let row = distances.get(&node);
            let to = nodes
                .iter()
                .find(|&&to| row.is_none_or(|r| r.get(to).is_none()))?;
            Some((node, *to))
        });
        let width = nodes.iter().max().map_or(0, |&m| m + 1);
        let mut dense = vec![0; width * width];
        for (&from, row) in distances.iter().filter(|(from, _)| **from < width) {
            for (to, &d) in row.iter().enumerate().take(width) {
                dense[from * width + to] = d;
            }
        }
        Ok(NumaInfo {
            nodes,
            distances: dense,
            width,
            default_affinity,
            missing,
        })
    }

    /// The first pair of nodes without a distance, if any (`prefer-closest-numa-nodes` needs
    /// every one).
    pub fn missing_distance(&self) -> Option<(usize, usize)> {
        self.missing
    }

    /// From the sysfs topology (distance rows in node-list order, re-indexed here by node id).
    pub fn from_topology(nodes: &[crate::host::NodeInfo]) -> Result<Self, NumaInfoError> {
        let ids: Vec<usize> = nodes.iter().map(|n| n.node.0 as usize).collect();
        let width = ids.iter().max().map_or(0, |m| m + 1);
        let distances = nodes
            .iter()
            .map(|n| {
                let mut row = vec![0; width];
                for (&to, &d) in ids.iter().zip(&n.distances) {
                    row[to] = u64::from(d);
                }
                (n.node.0 as usize, row)
            })
            .collect();
        NumaInfo::new(ids, distances)
    }

    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// Each node's row of distances, indexed by node id (0 where unknown): what
    /// [`NumaInfo::new`] takes to build this machine elsewhere. A distance that was missing
    /// reads 0 there and is not missing any more; only `prefer-closest-numa-nodes` reads
    /// distances, and the Topology Manager does not start with it where one is missing
    /// ([`super::manager::start`]).
    pub fn rows(&self) -> BTreeMap<usize, Vec<u64>> {
        self.nodes
            .iter()
            .map(|&node| {
                let row = &self.distances[node * self.width..(node + 1) * self.width];
                (node, row.to_vec())
            })
            .collect()
    }

    /// Every node: the affinity of "anywhere".
    pub fn default_affinity(&self) -> NumaMask {
        self.default_affinity
    }

    pub(super) fn distance(&self, from: usize, to: usize) -> u64 {
        if from < self.width && to < self.width {
            self.distances[from * self.width + to]
        } else {
            0
        }
    }

    /// Mean distance over all ordered pairs of the mask's nodes (each node with itself too).
    pub(super) fn average_distance(&self, mask: NumaMask) -> f64 {
        let nodes = mask.nodes();
        if nodes.is_empty() {
            return 0.0;
        }
        let mut sum = 0.0;
        let mut count = 0.0;
        for &a in &nodes {
            for &b in &nodes {
                sum += self.distance(a, b) as f64;
                count += 1.0;
            }
        }
        sum / count
    }

    /// The better of two different masks: the narrower, or with `closest` among masks of as
    /// many nodes the one with the shorter mean distance (ties: the smaller number).
    pub(super) fn better(&self, closest: bool, current: NumaMask, candidate: NumaMask) -> NumaMask {
        if closest && current.count() == candidate.count() {
            let (c, d) = (
                self.average_distance(current),
                self.average_distance(candidate),
            );
            if c == d {
                return if current.0 < candidate.0 {
                    current
                } else {
                    candidate
                };
            }
            return if c < d { current } else { candidate };
        }
        if current.is_narrower_than(candidate) {
            current
        } else {
            candidate
        }
    }
}
