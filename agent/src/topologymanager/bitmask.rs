//! A set of NUMA nodes as the kubelet keeps it: a 64-bit mask, "narrower" meaning fewer nodes and,
//! between masks of as many nodes, the smaller number; and every mask of a node list in the
//! kubelet's order (by size, then lexicographically by node list position).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// NUMA node ids a mask can hold: the kubelet's mask is a `uint64`.
pub const MAX_NODE: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitmaskError {
    #[error("NUMA node {0} is out of range: node ids go from 0 to {MAX_NODE}")]
    OutOfRange(usize),
}

/// A set of NUMA node ids.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NumaMask(pub u64);

impl NumaMask {
    pub fn from_nodes(nodes: &[usize]) -> Result<Self, BitmaskError> {
        let mut bits = 0u64;
        for &n in nodes {
            if n > MAX_NODE {
                return Err(BitmaskError::OutOfRange(n));
            }
            bits |= 1 << n;
        }
        Ok(NumaMask(bits))
    }

    /// The node ids, ascending.
    pub fn nodes(self) -> Vec<usize> {
        self.iter().collect()
    }

    /// The node ids, ascending, without collecting them.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            let n = (bits != 0).then(|| bits.trailing_zeros() as usize)?;
            bits &= bits - 1;
            Some(n)
        })
    }

    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    /// Fewer nodes, or as many and the smaller number (more low-numbered nodes).
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        if self.count() == other.count() {
            self.0 < other.0
        } else {
            self.count() < other.count()
        }
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.nodes())
    }
}

impl Serialize for NumaMask {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // No list per mask: an answer carries a few masks for each container.
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for NumaMask {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let nodes = Vec::<usize>::deserialize(deserializer)?;
        NumaMask::from_nodes(&nodes).map_err(serde::de::Error::custom)
    }
}

/// Calls `each` with every non-empty mask of `nodes`: all single nodes first, then all pairs, and
/// so on, each size in lexicographic order of positions in `nodes` (the kubelet's order, which
/// decides the order of hints).
pub fn iterate_masks(nodes: &[usize], mut each: impl FnMut(NumaMask)) -> Result<(), BitmaskError> {
    if let Some(&n) = nodes.iter().find(|&&n| n > MAX_NODE) {
        return Err(BitmaskError::OutOfRange(n));
    }
    let mut chosen = Vec::with_capacity(nodes.len());
    for size in 1..=nodes.len() {
        combinations(nodes, size, &mut chosen, &mut each);
    }
    Ok(())
}

fn combinations(
    rest: &[usize],
    size: usize,
    chosen: &mut Vec<usize>,
    each: &mut impl FnMut(NumaMask),
) {
    if chosen.len() == size {
        each(NumaMask(chosen.iter().fold(0, |bits, &n| bits | 1 << n)));
        return;
    }
    for (i, &n) in rest.iter().enumerate() {
        chosen.push(n);
        combinations(&rest[i + 1..], size, chosen, each);
        chosen.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(nodes: &[usize]) -> Vec<Vec<usize>> {
        let mut masks = Vec::new();
        iterate_masks(nodes, |m| masks.push(m.nodes())).unwrap();
        masks
    }

    #[test]
    fn masks_come_by_size_then_lexicographically() {
        assert_eq!(
            all(&[0, 1, 2]),
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![0, 1],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
        assert_eq!(all(&[0, 1, 2, 3, 4, 5, 6, 7]).len(), 255);
        assert_eq!(all(&[]).len(), 0);
    }

    #[test]
    fn narrower_is_fewer_nodes_then_the_smaller_number() {
        let m = |n: &[usize]| NumaMask::from_nodes(n).unwrap();
        assert!(m(&[3]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[0, 1]).is_narrower_than(m(&[0, 2])));
        assert!(!m(&[0, 3]).is_narrower_than(m(&[1, 2])));
        assert_eq!(m(&[0, 1]).and(m(&[1, 2])), m(&[1]));
        assert!(!m(&[0]).is_narrower_than(m(&[0])));
    }

    #[test]
    fn node_ids_past_63_are_refused() {
        assert_eq!(
            NumaMask::from_nodes(&[64]),
            Err(BitmaskError::OutOfRange(64))
        );
        assert!(iterate_masks(&[0, 70], |_| {}).is_err());
        let parsed: Result<NumaMask, _> = serde_json::from_str("[0,64]");
        assert!(parsed.unwrap_err().to_string().contains("NUMA node 64"));
    }
}
