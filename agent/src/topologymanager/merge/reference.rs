//! The kubelet Topology Manager's merge transcribed line by line, for tests and the fuzz target
//! only: every permutation of the providers' hints in the kubelet's order, each merged and put
//! through the kubelet's `compare`. Each block names the Go function it mirrors, in
//! `pkg/kubelet/cm/topologymanager/` (`policy.go`, `policy_{none,best_effort,restricted,
//! single_numa_node}.go`, `numa_info.go`, `bitmask/bitmask.go`). It shares nothing with the fast
//! merge in `merge.rs` but the `TopologyHint` and `ProviderHints` data types, so that comparing
//! the two checks the fast merge's reading of the kubelet rather than repeating it.

use std::{cell::Cell, collections::BTreeMap};

use super::{Merged, Policy, ProviderHints, TopologyHint};
use crate::topologymanager::NumaMask;

// bitmask.go: `type bitMask uint64` and the methods the merge uses.

fn count(s: u64) -> u32 {
    s.count_ones()
}

/// bitmask.go `IsLessThan`: `*s < *mask`.
fn is_less_than(s: u64, mask: u64) -> bool {
    s < mask
}

/// bitmask.go `IsNarrowerThan`.
fn is_narrower_than(s: u64, mask: u64) -> bool {
    if count(s) == count(mask) {
        return is_less_than(s, mask);
    }
    count(s) < count(mask)
}

/// bitmask.go `GetBits`: the set bits, ascending.
fn get_bits(s: u64) -> Vec<usize> {
    (0..64).filter(|&i| s & (1 << i) != 0).collect()
}

/// numa_info.go `NUMAInfo`: the nodes and `NUMADistances map[int][]uint64`, read `d[from][to]`.
pub struct NumaInfo {
    pub nodes: Vec<usize>,
    pub distances: BTreeMap<usize, Vec<u64>>,
}

impl NumaInfo {
    /// numa_info.go `Narrowest`.
    fn narrowest(&self, m1: u64, m2: u64) -> u64 {
        if is_narrower_than(m1, m2) {
            return m1;
        }
        m2
    }

    /// numa_info.go `Closest`.
    fn closest(&self, m1: u64, m2: u64) -> u64 {
        // If the length of both bitmasks aren't the same, choose the one that is narrowest.
        if count(m1) != count(m2) {
            return self.narrowest(m1, m2);
        }
        let m1_distance = self.calculate_average_for(m1);
        let m2_distance = self.calculate_average_for(m2);
        // If average distance is the same, take bitmask with more lower-number bits set.
        if m1_distance == m2_distance {
            if is_less_than(m1, m2) {
                return m1;
            }
            return m2;
        }
        // Otherwise, return the bitmask with the shortest average distance between NUMA nodes.
        if m1_distance < m2_distance {
            return m1;
        }
        m2
    }

    /// numa_info.go `DefaultAffinityMask`.
    fn default_affinity_mask(&self) -> u64 {
        self.nodes.iter().fold(0, |mask, &n| mask | 1 << n)
    }

    /// numa_info.go `NUMADistances.CalculateAverageFor`; a missing distance panics, as Go's
    /// index out of range does.
    fn calculate_average_for(&self, bm: u64) -> f64 {
        if count(bm) == 0 {
            return 0.0;
        }
        let mut count = 0.0;
        let mut sum = 0.0;
        for node1 in get_bits(bm) {
            for node2 in get_bits(bm) {
                sum += self.distances[&node1][node2] as f64;
                count += 1.0;
            }
        }
        sum / count
    }
}

/// `Policy.Merge` of policy_none.go, policy_best_effort.go, policy_restricted.go and
/// policy_single_numa_node.go.
pub fn merge(
    policy: Policy,
    prefer_closest_numa: bool,
    numa_info: &NumaInfo,
    providers_hints: &[ProviderHints],
    decisions: &Decisions,
) -> Merged {
    let (best_hint, admit) = match policy {
        // nonePolicy.Merge: `return TopologyHint{}, p.canAdmitPodResult(nil)` (always true).
        Policy::None => (
            TopologyHint {
                affinity: None,
                preferred: false,
            },
            true,
        ),
        // bestEffortPolicy.Merge; restrictedPolicy.Merge is the same with
        // `canAdmitPodResult` returning `hint.Preferred`.
        Policy::BestEffort | Policy::Restricted => {
            let filtered_hints = filter_providers_hints(providers_hints);
            let merger = HintMerger::new(
                numa_info,
                filtered_hints,
                policy,
                prefer_closest_numa,
                decisions,
            );
            let best_hint = merger.merge();
            let admit = policy == Policy::BestEffort || best_hint.preferred;
            (best_hint, admit)
        }
        // singleNumaNodePolicy.Merge.
        Policy::SingleNumaNode => {
            let filtered_hints = filter_providers_hints(providers_hints);
            // Filter to only include don't cares and hints with a single NUMA node.
            let single_numa_hints = filter_single_numa_hints(filtered_hints);
            let merger = HintMerger::new(
                numa_info,
                single_numa_hints,
                policy,
                prefer_closest_numa,
                decisions,
            );
            let mut best_hint = merger.merge();
            let default_affinity = numa_info.default_affinity_mask();
            if best_hint.affinity.map(|m| m.0) == Some(default_affinity) {
                best_hint = TopologyHint {
                    affinity: None,
                    preferred: best_hint.preferred,
                };
            }
            (best_hint, best_hint.preferred)
        }
    };
    Merged {
        hint: best_hint,
        admit,
    }
}

/// policy.go `filterProvidersHints`. Go ranges over each provider's map in a random order;
/// this takes the resources in name order (the merge's answer does not depend on it, see
/// `tests.rs`).
pub fn filter_providers_hints(providers_hints: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let any = |preferred| TopologyHint {
        affinity: None,
        preferred,
    };
    let mut all_provider_hints = Vec::new();
    for hints in providers_hints {
        // If hints is nil, insert a single, preferred any-numa hint into allProviderHints.
        let Some(hints) = hints.as_ref().filter(|h| !h.is_empty()) else {
            all_provider_hints.push(vec![any(true)]);
            continue;
        };
        // Otherwise, accumulate the hints for each resource type into allProviderHints.
        for resource_hints in hints.values() {
            let Some(resource_hints) = resource_hints else {
                all_provider_hints.push(vec![any(true)]);
                continue;
            };
            if resource_hints.is_empty() {
                all_provider_hints.push(vec![any(false)]);
                continue;
            }
            all_provider_hints.push(resource_hints.clone());
        }
    }
    all_provider_hints
}

/// policy_single_numa_node.go `filterSingleNumaHints`.
fn filter_single_numa_hints(all_resources_hints: Vec<Vec<TopologyHint>>) -> Vec<Vec<TopologyHint>> {
    let mut filtered_resources_hints = Vec::new();
    for one_resource_hints in all_resources_hints {
        let mut filtered = Vec::new();
        for hint in one_resource_hints {
            if hint.affinity.is_none() && hint.preferred {
                filtered.push(hint);
            }
            if hint.affinity.is_some_and(|m| count(m.0) == 1) && hint.preferred {
                filtered.push(hint);
            }
        }
        filtered_resources_hints.push(filtered);
    }
    filtered_resources_hints
}

/// policy.go `mergePermutation`.
fn merge_permutation(default_affinity: u64, permutation: &[TopologyHint]) -> (u64, bool) {
    // Get the NUMANodeAffinity from each hint in the permutation and see if any
    // of them encode unpreferred allocations.
    let mut preferred = true;
    let mut numa_affinities: Vec<u64> = Vec::new();
    for hint in permutation {
        // Only consider hints that have an actual NUMANodeAffinity set.
        if let Some(affinity) = hint.affinity {
            numa_affinities.push(affinity.0);
            // Only mark preferred if all affinities are equal.
            if affinity.0 != numa_affinities[0] {
                preferred = false;
            }
        }
        // Only mark preferred if all affinities are preferred.
        if !hint.preferred {
            preferred = false;
        }
    }
    // Merge the affinities using a bitwise-and operation.
    let merged_affinity = numa_affinities.iter().fold(default_affinity, |s, m| s & m);
    (merged_affinity, preferred)
}

/// policy.go `narrowestHint`: the affinity of the narrowest hint that has one.
fn narrowest_hint(hints: &[TopologyHint]) -> Option<u64> {
    let mut narrowest_hint: Option<u64> = None;
    for hint in hints {
        let Some(affinity) = hint.affinity else {
            continue;
        };
        let narrowest = *narrowest_hint.get_or_insert(affinity.0);
        if is_narrower_than(affinity.0, narrowest) {
            narrowest_hint = Some(affinity.0);
        }
    }
    narrowest_hint
}

/// policy.go `maxOfMinAffinityCounts`.
fn max_of_min_affinity_counts(filtered_hints: &[Vec<TopologyHint>]) -> u32 {
    let mut max_of_min_count = 0;
    for resource_hints in filtered_hints {
        let Some(narrowest_hint) = narrowest_hint(resource_hints) else {
            continue;
        };
        if count(narrowest_hint) > max_of_min_count {
            max_of_min_count = count(narrowest_hint);
        }
    }
    max_of_min_count
}

/// Which rule of `HintMerger.compare` decided, counted so that tests can show the random cases
/// reach every one (the names are those of the Go comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    EmptyCandidate,
    NoCurrent,
    PreferredOverNot,
    NotOverPreferred,
    BothPreferred,
    Case1,
    Case2,
    Case3a,
    Case3b,
    Case3ca,
    Case3cb,
    Case3cc,
}

impl Rule {
    pub const ALL: [Rule; 12] = [
        Rule::EmptyCandidate,
        Rule::NoCurrent,
        Rule::PreferredOverNot,
        Rule::NotOverPreferred,
        Rule::BothPreferred,
        Rule::Case1,
        Rule::Case2,
        Rule::Case3a,
        Rule::Case3b,
        Rule::Case3ca,
        Rule::Case3cb,
        Rule::Case3cc,
    ];
}

/// How often each rule decided.
#[derive(Default)]
pub struct Decisions([Cell<u64>; Rule::ALL.len()]);

impl Decisions {
    fn note(&self, rule: Rule) {
        let cell = &self.0[rule as usize];
        cell.set(cell.get() + 1);
    }

    pub fn get(&self, rule: Rule) -> u64 {
        self.0[rule as usize].get()
    }
}

/// policy.go `HintMerger`: hints as `(affinity, preferred)` with the affinity always set.
pub struct HintMerger<'a> {
    numa_info: &'a NumaInfo,
    hints: Vec<Vec<TopologyHint>>,
    best_non_preferred_affinity_count: u32,
    /// `(policyName != PolicySingleNumaNode) && opts.PreferClosestNUMA` in `NewHintMerger`.
    closest: bool,
    decisions: &'a Decisions,
}

type Hint = (u64, bool);

impl<'a> HintMerger<'a> {
    /// policy.go `NewHintMerger`.
    pub fn new(
        numa_info: &'a NumaInfo,
        hints: Vec<Vec<TopologyHint>>,
        policy: Policy,
        prefer_closest_numa: bool,
        decisions: &'a Decisions,
    ) -> Self {
        let best_non_preferred_affinity_count = max_of_min_affinity_counts(&hints);
        HintMerger {
            numa_info,
            hints,
            best_non_preferred_affinity_count,
            closest: policy != Policy::SingleNumaNode && prefer_closest_numa,
            decisions,
        }
    }

    /// The `compareNumaAffinityMasks` closure of `NewHintMerger`.
    fn compare_numa_affinity_masks(&self, current: Hint, candidate: Hint) -> Hint {
        // If current and candidate bitmasks are the same, prefer current hint.
        if candidate.0 == current.0 {
            return current;
        }
        // Otherwise compare the hints, based on the policy options provided
        let best = if self.closest {
            self.numa_info.closest(current.0, candidate.0)
        } else {
            self.numa_info.narrowest(current.0, candidate.0)
        };
        if best == current.0 {
            return current;
        }
        candidate
    }

    /// policy.go `HintMerger.compare`, its comments shortened.
    fn compare(&self, current: Option<Hint>, candidate: Hint) -> Option<Hint> {
        let decided = |rule: Rule, hint: Hint| {
            self.decisions.note(rule);
            Some(hint)
        };
        // Only consider candidates that result in a NUMANodeAffinity > 0 to replace the current
        // bestHint.
        if count(candidate.0) == 0 {
            self.decisions.note(Rule::EmptyCandidate);
            return current;
        }
        // If no current bestHint is set, return the candidate as the bestHint.
        let Some(current) = current else {
            return decided(Rule::NoCurrent, candidate);
        };
        // Non-preferred current, preferred candidate: always the preferred one.
        if !current.1 && candidate.1 {
            return decided(Rule::PreferredOverNot, candidate);
        }
        // Preferred current, non-preferred candidate: never update.
        if current.1 && !candidate.1 {
            return decided(Rule::NotOverPreferred, current);
        }
        // Both preferred: only consider fitter NUMANodeAffinity.
        if current.1 && candidate.1 {
            return decided(
                Rule::BothPreferred,
                self.compare_numa_affinity_masks(current, candidate),
            );
        }
        // Both non-preferred: as close to (but not higher than) bestNonPreferredAffinityCount
        // as possible.
        let best = self.best_non_preferred_affinity_count;
        // Case 1
        if count(current.0) > best {
            return decided(
                Rule::Case1,
                self.compare_numa_affinity_masks(current, candidate),
            );
        }
        // Case 2
        if count(current.0) == best {
            if count(candidate.0) != best {
                return decided(Rule::Case2, current);
            }
            return decided(
                Rule::Case2,
                self.compare_numa_affinity_masks(current, candidate),
            );
        }
        // Case 3a
        if count(candidate.0) > best {
            return decided(Rule::Case3a, current);
        }
        // Case 3b
        if count(candidate.0) == best {
            return decided(Rule::Case3b, candidate);
        }
        // Case 3ca
        if count(candidate.0) > count(current.0) {
            return decided(Rule::Case3ca, candidate);
        }
        // Case 3cb
        if count(candidate.0) < count(current.0) {
            return decided(Rule::Case3cb, current);
        }
        // Case 3cc
        decided(
            Rule::Case3cc,
            self.compare_numa_affinity_masks(current, candidate),
        )
    }

    /// policy.go `HintMerger.Merge`.
    pub fn merge(&self) -> TopologyHint {
        let default_affinity = self.numa_info.default_affinity_mask();
        let mut best_hint: Option<Hint> = None;
        iterate_all_provider_topology_hints(&self.hints, &mut |permutation| {
            // Get the NUMANodeAffinity from each hint in the permutation and see if any of them
            // encode unpreferred allocations.
            let merged_hint = merge_permutation(default_affinity, permutation);
            // Compare the current bestHint with the candidate mergedHint and update bestHint if
            // appropriate.
            best_hint = self.compare(best_hint, merged_hint);
        });
        let (affinity, preferred) = best_hint.unwrap_or((default_affinity, false));
        TopologyHint {
            affinity: Some(NumaMask(affinity)),
            preferred,
        }
    }
}

/// policy.go `iterateAllProviderTopologyHints`: for i over the first provider's hints, for j
/// over the second's, …, the callback on `[hints[0][i], hints[1][j], …]`.
fn iterate_all_provider_topology_hints(
    all_provider_hints: &[Vec<TopologyHint>],
    callback: &mut dyn FnMut(&[TopologyHint]),
) {
    fn iterate(
        all_provider_hints: &[Vec<TopologyHint>],
        i: usize,
        accum: &mut Vec<TopologyHint>,
        callback: &mut dyn FnMut(&[TopologyHint]),
    ) {
        // Base case: we have looped through all providers and have a full permutation.
        if i == all_provider_hints.len() {
            callback(accum);
            return;
        }
        // Loop through all hints for provider 'i', and recurse to build the permutation of this
        // hint with all hints from providers 'i++'.
        for &hint in &all_provider_hints[i] {
            accum.push(hint);
            iterate(all_provider_hints, i + 1, accum, callback);
            accum.pop();
        }
    }
    iterate(all_provider_hints, 0, &mut Vec::new(), callback);
}
