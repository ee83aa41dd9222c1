//! The Topology Manager's merge: every permutation of one hint per resource of every provider is
//! merged (the AND of its masks; preferred only if all its hints are preferred and agree), and the
//! best merged hint wins by the kubelet's `compare`. Preferred beats non-preferred, and between
//! preferred hints the narrowest (or, with `prefer-closest-numa-nodes`, the closest) mask wins.
//! Between non-preferred hints `compare` steers towards `BestNonPreferredAffinityCount`, the
//! widest of the lists' narrowest hints: a best wider than that gives way to a fitter mask, one
//! as wide only to a fitter mask as wide, and one narrower to any mask as wide as the count, to
//! one with more nodes short of it, or to a fitter one with as many. `single-numa-node` first
//! keeps only preferred single-node and "don't care" hints, and reports a merged hint spanning
//! every node as none.
//!
//! The kubelet walks all permutations (255³ for 8 nodes and 3 memory types). This merge returns
//! the same hint without doing so, because `compare` always keeps the higher of its two hints in
//! one strict total order: preferred hints above the others, ranked by the mask comparison
//! (fewer nodes; with `closest`, among as many nodes the shorter mean distance; then the smaller
//! number); then non-preferred masks as wide as the count, ranked by the mask comparison; then
//! narrower ones, more nodes first and then by the mask comparison; then wider ones, by the mask
//! comparison. Every rule of `compare` agrees with that order, across groups too: a wider
//! non-preferred best gives way to any narrower mask (the mask comparison calls it fitter), and
//! one as wide as the count or narrower never to a wider one. So the kubelet's answer is the
//! highest merged hint, whatever order the permutations come in (Go's map order already shuffles
//! the resources). Hence:
//!
//! * once a preferred candidate exists only preferred ones can win, and the best of them is found
//!   directly from the masks every list offers as preferred (or as "any node");
//! * otherwise every candidate is non-preferred and the walk runs in the kubelet's order with the
//!   kubelet's compare, but visits each (level, AND) once: the candidates below it depend on
//!   nothing else, and taking the highest of a set twice changes nothing. A subtree none of whose
//!   masks (subsets of its AND) ranks above the best so far is skipped; the best only rises, so
//!   such a subtree could not matter later either.
//!
//! `merge/reference.rs` transcribes the kubelet's walk line by line, for the tests to compare.

use std::{borrow::Cow, cmp::Ordering, collections::HashSet};

use serde::Serialize;

use super::{
    bitmask::NumaMask,
    numa_info::NumaInfo,
    policy::{Policy, PolicyOptions, ProviderHints, TopologyHint},
};

/// The merged hint and whether the policy admits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Merged {
    #[serde(flatten)]
    pub hint: TopologyHint,
    pub admit: bool,
}

/// Merges the providers' hints under `policy`, as the kubelet's Topology Manager does.
pub fn merge(
    policy: Policy,
    options: &PolicyOptions,
    info: &NumaInfo,
    providers: &[ProviderHints],
) -> Merged {
    let lists = provider_lists(providers);
    let lists: Vec<&[TopologyHint]> = lists.iter().map(Vec::as_slice).collect();
    merge_lists(policy, options, info, &lists)
}

/// [`merge`] over the lists [`provider_lists`] makes of the providers' hints (one per resource
/// of every provider), borrowed.
pub fn merge_lists(
    policy: Policy,
    options: &PolicyOptions,
    info: &NumaInfo,
    lists: &[&[TopologyHint]],
) -> Merged {
    match policy {
        Policy::None => Merged {
            hint: TopologyHint {
                affinity: None,
                preferred: false,
            },
            admit: true,
        },
        Policy::BestEffort | Policy::Restricted => {
            let hint = Merger::new(info, lists, options.prefer_closest_numa_nodes).merge();
            Merged {
                hint,
                admit: policy == Policy::BestEffort || hint.preferred,
            }
        }
        Policy::SingleNumaNode => {
            let kept = |h: &TopologyHint| h.preferred && h.affinity.is_none_or(|m| m.count() == 1);
            // A list is copied only when the filter drops some of its hints.
            let filtered: Vec<Cow<'_, [TopologyHint]>> = lists
                .iter()
                .map(|&list| {
                    if list.iter().all(kept) {
                        Cow::Borrowed(list)
                    } else {
                        Cow::Owned(list.iter().copied().filter(kept).collect())
                    }
                })
                .collect();
            let lists: Vec<&[TopologyHint]> = filtered.iter().map(AsRef::as_ref).collect();
            let mut hint = Merger::new(info, &lists, false).merge();
            if hint.affinity == Some(info.default_affinity()) {
                hint.affinity = None;
            }
            Merged {
                hint,
                admit: hint.preferred,
            }
        }
    }
}

/// The list of "no preference" for a resource: a single preferred hint for any node.
pub const ANY_NODE: &[TopologyHint] = &[TopologyHint {
    affinity: None,
    preferred: true,
}];

/// The list of "fits nowhere" for a resource: a single non-preferred hint for any node.
pub const NOWHERE: &[TopologyHint] = &[TopologyHint {
    affinity: None,
    preferred: false,
}];

/// One list per resource of every provider; "no preference" becomes a single preferred hint for
/// any node ([`ANY_NODE`]), "fits nowhere" a single non-preferred one ([`NOWHERE`]).
pub fn provider_lists(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut lists = Vec::new();
    for provider in providers {
        match provider {
            Some(resources) if !resources.is_empty() => {
                for hints in resources.values() {
                    lists.push(match hints {
                        None => ANY_NODE.to_vec(),
                        Some(h) if h.is_empty() => NOWHERE.to_vec(),
                        Some(h) => h.clone(),
                    });
                }
            }
            _ => lists.push(ANY_NODE.to_vec()),
        }
    }
    lists
}

/// The merge over filtered lists.
pub(crate) struct Merger<'a> {
    info: &'a NumaInfo,
    lists: &'a [&'a [TopologyHint]],
    closest: bool,
    /// The widest of the providers' narrowest hints, in nodes.
    best_non_preferred_count: u32,
    /// The shortest distance of a node to itself and to another node, over the machine.
    machine_distances: (u64, u64),
}

impl<'a> Merger<'a> {
    pub(crate) fn new(info: &'a NumaInfo, lists: &'a [&'a [TopologyHint]], closest: bool) -> Self {
        let best_non_preferred_count = lists
            .iter()
            .filter_map(|list| {
                list.iter()
                    .filter_map(|h| h.affinity)
                    .reduce(|narrowest, m| {
                        if m.is_narrower_than(narrowest) {
                            m
                        } else {
                            narrowest
                        }
                    })
            })
            .map(NumaMask::count)
            .max()
            .unwrap_or(0);
        let nodes = info.nodes();
        let pairs = nodes
            .iter()
            .flat_map(|&a| nodes.iter().map(move |&b| (a, b)));
        let machine_distances = pairs.fold((u64::MAX, u64::MAX), |(selves, nearest), (a, b)| {
            let d = info.distance(a, b);
            if a == b {
                (selves.min(d), nearest)
            } else {
                (selves, nearest.min(d))
            }
        });
        Merger {
            info,
            lists,
            closest,
            best_non_preferred_count,
            machine_distances,
        }
    }

    pub(crate) fn merge(&self) -> TopologyHint {
        let default = self.info.default_affinity();
        let fallback = TopologyHint {
            affinity: Some(default),
            preferred: false,
        };
        if self.lists.iter().any(|l| l.is_empty()) {
            return fallback;
        }
        if let Some(mask) = self.best_preferred() {
            return TopologyHint {
                affinity: Some(mask),
                preferred: true,
            };
        }
        let mut search = Search {
            merger: self,
            seen: Seen::new(self.lists.len() + 1, default),
            best: None,
        };
        search.visit(0, default.0);
        search.best.map_or(fallback, |mask| TopologyHint {
            affinity: Some(mask),
            preferred: false,
        })
    }

    /// The best mask among preferred merged candidates: those where every list offers that mask
    /// (or "any node") as a preferred hint. The best is the highest in a total order
    /// (`NumaInfo::better`), so the candidates may come in any order, and more than once: they
    /// are taken from one list that does not offer "any node", which must offer each of them.
    fn best_preferred(&self) -> Option<NumaMask> {
        let default = self.info.default_affinity();
        let offers = |list: &[TopologyHint], mask: Option<NumaMask>| {
            list.iter()
                .any(|h| h.preferred && (h.affinity.is_none() || h.affinity == mask))
        };
        let mut best: Option<NumaMask> = None;
        let mut consider = |mask: NumaMask| {
            let merged = mask.and(default);
            if merged.count() == 0 {
                return;
            }
            best = Some(match best {
                Some(current) if current == merged => current,
                Some(current) => self.info.better(self.closest, current, merged),
                None => merged,
            });
        };
        let narrowing = self.lists.iter().find(|l| !offers(l, None));
        if narrowing.is_none() {
            consider(default);
        }
        let sources = narrowing.map_or(self.lists, std::slice::from_ref);
        for hint in sources.iter().copied().flatten() {
            if let (true, Some(mask)) = (hint.preferred, hint.affinity)
                && self.lists.iter().all(|l| offers(l, Some(mask)))
            {
                consider(mask);
            }
        }
        best
    }

    /// The kubelet's `compare` between two different non-preferred masks (its cases 1 to 3cc):
    /// whether `candidate` replaces `current`.
    fn replaces(&self, current: NumaMask, candidate: NumaMask) -> bool {
        let target = self.best_non_preferred_count;
        let (now, next) = (current.count(), candidate.count());
        let fitter = || {
            candidate != current && self.info.better(self.closest, current, candidate) == candidate
        };
        match now.cmp(&target) {
            // 1: wider than the count: the fitter mask.
            Ordering::Greater => fitter(),
            // 2: as wide: only a fitter mask as wide.
            Ordering::Equal => next == target && fitter(),
            // 3: narrower. 3a: never one wider than the count; 3b: always one as wide; 3ca:
            // always one with more nodes; 3cb: never one with fewer; 3cc: the fitter of as many.
            Ordering::Less if next > target => false,
            Ordering::Less if next == target => true,
            Ordering::Less => match next.cmp(&now) {
                Ordering::Greater => true,
                Ordering::Less => false,
                Ordering::Equal => fitter(),
            },
        }
    }
}

impl Merger<'_> {
    /// Whether some non-empty subset of `within` could replace the non-preferred `best` (false
    /// only when none can; a lower bound on distances keeps it safe with `closest`).
    fn could_improve(&self, best: NumaMask, within: NumaMask) -> bool {
        let (count, available) = (best.count(), within.count());
        if available == 0 {
            return false;
        }
        match count.cmp(&self.best_non_preferred_count) {
            // Wider than the count: any subset with fewer nodes replaces it (a single node will do).
            Ordering::Greater if count > 1 => return true,
            // Narrower: a subset with one node more, at most the count, replaces it.
            Ordering::Less if available > count => return true,
            // Otherwise only a fitter subset with as many nodes could.
            _ => {}
        }
        if available < count {
            return false;
        }
        // As many nodes as the best: the numerically smallest such subset is the lowest bits.
        let mut lowest = 0u64;
        let mut bits = within.0;
        for _ in 0..count {
            lowest |= bits & bits.wrapping_neg();
            bits &= bits - 1;
        }
        if !self.closest {
            return lowest < best.0;
        }
        let k = f64::from(count);
        let current = self.info.average_distance(best);
        let bound = |selves: u64, nearest: u64| {
            let nearest = if nearest == u64::MAX {
                0.0
            } else {
                nearest as f64
            };
            (k * selves as f64 + (k * k - k) * nearest) / (k * k)
        };
        let could = |bound: f64| bound < current || (bound == current && lowest < best.0);
        // The machine-wide bound first: it holds for every subset, and is usually enough.
        if !could(bound(self.machine_distances.0, self.machine_distances.1)) {
            return false;
        }
        let (mut selves, mut nearest) = (u64::MAX, u64::MAX);
        let mut from = within.0;
        while from != 0 {
            let a = from.trailing_zeros() as usize;
            from &= from - 1;
            let mut to = within.0;
            while to != 0 {
                let b = to.trailing_zeros() as usize;
                to &= to - 1;
                let d = self.info.distance(a, b);
                if a == b {
                    selves = selves.min(d);
                } else {
                    nearest = nearest.min(d);
                }
            }
        }
        // Below the best's mean distance a subset could be closer; at it, only as close and smaller.
        could(bound(selves, nearest))
    }
}

/// The walk over non-preferred candidates in the kubelet's permutation order.
struct Search<'a, 'm> {
    merger: &'m Merger<'a>,
    seen: Seen,
    best: Option<NumaMask>,
}

impl Search<'_, '_> {
    fn visit(&mut self, level: usize, and: u64) {
        if !self.seen.insert(level, and) {
            return;
        }
        if let Some(best) = self.best
            && !self.merger.could_improve(best, NumaMask(and))
        {
            return;
        }
        let lists = self.merger.lists;
        let Some(list) = lists.get(level) else {
            let candidate = NumaMask(and);
            if candidate.count() > 0 {
                self.best = Some(match self.best {
                    Some(current) if !self.merger.replaces(current, candidate) => current,
                    _ => candidate,
                });
            }
            return;
        };
        for hint in *list {
            self.visit(level + 1, and & hint.affinity.map_or(u64::MAX, |m| m.0));
        }
    }
}

/// (level, AND) pairs already walked: a dense bitmap when node ids are small, else a set.
enum Seen {
    Dense { bits: Vec<u64>, width: usize },
    Sparse(HashSet<(usize, u64)>),
}

impl Seen {
    const DENSE_MAX_BITS: u32 = 16;

    fn new(levels: usize, default: NumaMask) -> Seen {
        let high = 64 - default.0.leading_zeros();
        if high <= Self::DENSE_MAX_BITS {
            let width = 1usize << high;
            Seen::Dense {
                bits: vec![0; (levels * width).div_ceil(64)],
                width,
            }
        } else {
            Seen::Sparse(HashSet::new())
        }
    }

    /// False when already there.
    fn insert(&mut self, level: usize, and: u64) -> bool {
        match self {
            Seen::Dense { bits, width } => {
                // `and` is within the default affinity, so below `width`.
                let index = level * *width + and as usize;
                let (word, bit) = (index / 64, 1u64 << (index % 64));
                let fresh = bits[word] & bit == 0;
                bits[word] |= bit;
                fresh
            }
            Seen::Sparse(set) => set.insert((level, and)),
        }
    }
}

/// The kubelet's merge transcribed, for the tests and the fuzz target (`--features fuzzing`)
/// that compare it with [`merge`]; not part of the agent's build.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod reference;
#[cfg(test)]
mod tests;
