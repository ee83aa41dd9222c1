use std::collections::BTreeMap;

use super::{reference::Rule, *};
use crate::topologymanager::policy::PolicyError;

fn mask(nodes: &[usize]) -> NumaMask {
    NumaMask::from_nodes(nodes).unwrap()
}

fn hint(nodes: Option<&[usize]>, preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: nodes.map(mask),
        preferred,
    }
}

fn info(n: usize) -> NumaInfo {
    let nodes: Vec<usize> = (0..n).collect();
    let distances = nodes
        .iter()
        .map(|&a| {
            let row = nodes
                .iter()
                .map(|&b| {
                    if a == b {
                        10
                    } else {
                        10 + 10 * a.abs_diff(b) as u64
                    }
                })
                .collect();
            (a, row)
        })
        .collect();
    NumaInfo::new(nodes, distances).unwrap()
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Node ids a random machine may use; a hint may name one the machine lacks.
const ID_BITS: usize = 5;

/// A random machine and providers, as the kubelet receives them.
struct RandomCase {
    nodes: Vec<usize>,
    distances: BTreeMap<usize, Vec<u64>>,
    providers: Vec<ProviderHints>,
}

impl RandomCase {
    fn new(rng: &mut Rng) -> Self {
        // Mostly nodes 0..n; sometimes ids with gaps.
        let nodes: Vec<usize> = if rng.below(4) == 0 {
            let ids = 1 + rng.below((1 << ID_BITS) - 1);
            (0..ID_BITS).filter(|i| ids & 1 << i != 0).collect()
        } else {
            (0..1 + rng.below(4) as usize).collect()
        };
        // Few distinct values, so that equal mean distances (the tie rule) come up.
        let distances = (0..ID_BITS)
            .map(|from| {
                let row = (0..ID_BITS)
                    .map(|to| {
                        if from == to {
                            10
                        } else {
                            [11, 12, 20, 21][rng.below(4) as usize]
                        }
                    })
                    .collect();
                (from, row)
            })
            .collect();
        let machine: u64 = nodes.iter().map(|&n| 1u64 << n).sum();
        // Whether hints are preferred: never (the branch under test), as the Memory Manager
        // says (the provider's narrowest width), or at random.
        let preference = rng.below(3);
        let mut lists = 0;
        let providers = (0..1 + rng.below(3))
            .map(|_| match rng.below(10) {
                0 => None,
                1 => Some(BTreeMap::new()),
                _ => {
                    // Each provider needs a width of its own: its narrowest hint.
                    let width = 1 + rng.below(nodes.len() as u64) as u32;
                    let resources = (0..1 + rng.below(2))
                        .filter(|_| {
                            lists += 1;
                            lists <= 5
                        })
                        .map(|r| {
                            let hints = match rng.below(10) {
                                0 => None,
                                1 => Some(vec![]),
                                _ => Some(
                                    (0..1 + rng.below(4))
                                        .map(|_| random_hint(rng, machine, width, preference))
                                        .collect(),
                                ),
                            };
                            (format!("resource{r}"), hints)
                        })
                        .collect();
                    Some(resources)
                }
            })
            .collect();
        RandomCase {
            nodes,
            distances,
            providers,
        }
    }
}

fn random_hint(rng: &mut Rng, machine: u64, width: u32, preference: u64) -> TopologyHint {
    if rng.below(10) == 0 {
        return TopologyHint {
            affinity: None,
            preferred: preference != 0 && rng.below(2) == 0,
        };
    }
    let mut bits = rng.next() & machine;
    while bits.count_ones() < width {
        bits |= 1 << rng.below(ID_BITS as u64) & machine;
    }
    if rng.below(8) == 0 {
        bits |= 1 << rng.below(ID_BITS as u64);
    }
    let preferred = match preference {
        0 => false,
        1 => bits.count_ones() == width,
        _ => rng.below(3) == 0,
    };
    TopologyHint {
        affinity: Some(NumaMask(bits)),
        preferred,
    }
}

const POLICIES: [Policy; 4] = [
    Policy::None,
    Policy::BestEffort,
    Policy::Restricted,
    Policy::SingleNumaNode,
];

#[test]
fn agrees_with_the_kubelets_merge_transcribed_on_random_hints() {
    const ROUNDS: usize = 20_000;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let decisions = reference::Decisions::default();
    // Cases where the kubelet left a non-preferred best narrower than the widest need.
    let mut climbed = 0;
    for round in 0..ROUNDS {
        let case = RandomCase::new(&mut rng);
        let kubelet_info = reference::NumaInfo {
            nodes: case.nodes.clone(),
            distances: case.distances.clone(),
        };
        let before = decisions.get(Rule::Case3b) + decisions.get(Rule::Case3ca);
        for closest in [false, true] {
            let options = PolicyOptions {
                prefer_closest_numa_nodes: closest,
                ..PolicyOptions::default()
            };
            let info = NumaInfo::new(case.nodes.clone(), case.distances.clone()).unwrap();
            for policy in POLICIES {
                let fast = merge(policy, &options, &info, &case.providers);
                let kubelet =
                    reference::merge(policy, closest, &kubelet_info, &case.providers, &decisions);
                assert_eq!(
                    fast, kubelet,
                    "round {round}, {policy}, closest {closest}, nodes {:?}, providers {:?}",
                    case.nodes, case.providers
                );
            }
        }
        if decisions.get(Rule::Case3b) + decisions.get(Rule::Case3ca) > before {
            climbed += 1;
        }
    }
    let counts: Vec<(Rule, u64)> = Rule::ALL.iter().map(|&r| (r, decisions.get(r))).collect();
    assert!(
        counts.iter().all(|&(_, n)| n > 0),
        "some rule of compare was never reached: {counts:?}"
    );
    assert!(
        climbed > ROUNDS / 50,
        "{climbed} of {ROUNDS} cases left a best narrower than the widest need: {counts:?}"
    );
}

/// The kubelet ranges over each provider's map in Go's random order, and the merge's compare
/// is a total order (see the module documentation), so its answer cannot depend on the order
/// of the lists or of their hints; the fast merge relies on it.
#[test]
fn the_kubelets_answer_does_not_depend_on_the_order_of_resources_or_hints() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let decisions = reference::Decisions::default();
    for round in 0..5_000 {
        let case = RandomCase::new(&mut rng);
        let info = reference::NumaInfo {
            nodes: case.nodes.clone(),
            distances: case.distances.clone(),
        };
        let lists = reference::filter_providers_hints(&case.providers);
        let mut reordered = lists.clone();
        reordered.reverse();
        reordered.iter_mut().for_each(|l| l.reverse());
        if let Some(first) = reordered.first_mut() {
            first.rotate_left(1);
        }
        for closest in [false, true] {
            let merged = |lists: &[Vec<TopologyHint>]| {
                reference::HintMerger::new(
                    &info,
                    lists.to_vec(),
                    Policy::BestEffort,
                    closest,
                    &decisions,
                )
                .merge()
            };
            assert_eq!(
                merged(&lists),
                merged(&reordered),
                "round {round}, closest {closest}, lists {lists:?}"
            );
        }
    }
}

fn provider(resources: &[(&str, Vec<TopologyHint>)]) -> ProviderHints {
    Some(
        resources
            .iter()
            .map(|(name, hints)| (name.to_string(), Some(hints.clone())))
            .collect(),
    )
}

/// Every merged hint non-preferred and the first narrower than the widest of the providers'
/// narrowest hints (`BestNonPreferredAffinityCount`): the kubelet then takes any hint up to that
/// width with more nodes (cases 3b and 3ca of `compare`), where a narrower-is-better test keeps
/// the first. The shape: CPU with single-node hints, memory and hugepages only on grouped nodes.
#[test]
fn a_non_preferred_best_narrower_than_the_widest_need_is_replaced_as_the_kubelet_does() {
    let cpu = provider(&[(
        "cpu",
        vec![
            hint(Some(&[0]), true),
            hint(Some(&[1]), true),
            hint(Some(&[0, 1]), false),
        ],
    )]);
    let grouped = |nodes: &[usize]| {
        let hints = vec![hint(Some(nodes), false)];
        provider(&[("hugepages-1Gi", hints.clone()), ("memory", hints)])
    };
    // Two nodes, memory only on both: {0}, then {1}, then {0, 1} at the width of 2 (case 3b).
    // Four nodes, memory only on three: {0}, {1}, then {0, 1}, closer to 3 (case 3ca).
    let shapes = [
        (2, grouped(&[0, 1]), [0, 1]),
        (4, grouped(&[0, 1, 2]), [0, 1]),
    ];
    for (nodes, memory, expected) in shapes {
        let info = info(nodes);
        let providers = [cpu.clone(), memory];
        for closest in [false, true] {
            let options = PolicyOptions {
                prefer_closest_numa_nodes: closest,
                max_allowable_numa_nodes: 64,
            };
            let best_effort = merge(Policy::BestEffort, &options, &info, &providers);
            assert_eq!(
                (best_effort.hint, best_effort.admit),
                (hint(Some(&expected), false), true),
                "best-effort, {nodes} nodes, closest {closest}"
            );
            let restricted = merge(Policy::Restricted, &options, &info, &providers);
            assert_eq!(
                (restricted.hint, restricted.admit),
                (hint(Some(&expected), false), false),
                "restricted, {nodes} nodes, closest {closest}"
            );
        }
    }
}

#[test]
fn no_providers_merge_to_every_node_preferred() {
    let info = info(2);
    let merged = merge(Policy::BestEffort, &PolicyOptions::default(), &info, &[]);
    assert_eq!(merged.hint, hint(Some(&[0, 1]), true));
    assert!(merged.admit);
}

#[test]
fn a_resource_that_fits_nowhere_is_rejected_by_restricted_but_not_best_effort() {
    let info = info(2);
    let providers = vec![Some(BTreeMap::from([("memory".to_string(), Some(vec![]))]))];
    let best = merge(
        Policy::BestEffort,
        &PolicyOptions::default(),
        &info,
        &providers,
    );
    assert_eq!(best.hint, hint(Some(&[0, 1]), false));
    assert!(best.admit);
    let restricted = merge(
        Policy::Restricted,
        &PolicyOptions::default(),
        &info,
        &providers,
    );
    assert!(!restricted.admit);
}

#[test]
fn single_numa_node_reports_every_node_as_none_and_ignores_wider_hints() {
    let info = info(2);
    let providers = vec![Some(BTreeMap::from([(
        "hugepages-2Mi".to_string(),
        Some(vec![hint(Some(&[0, 1]), true)]),
    )]))];
    let merged = merge(
        Policy::SingleNumaNode,
        &PolicyOptions::default(),
        &info,
        &providers,
    );
    assert_eq!(merged.hint, hint(None, false));
    assert!(!merged.admit);
    let none = merge(Policy::None, &PolicyOptions::default(), &info, &providers);
    assert_eq!((none.hint, none.admit), (hint(None, false), true));
}

#[test]
fn prefer_closest_picks_the_pair_with_the_shorter_distance() {
    let info = info(4);
    let list = vec![hint(Some(&[0, 2]), true), hint(Some(&[1, 2]), true)];
    let lists = [list.as_slice()];
    assert_eq!(
        Merger::new(&info, &lists, false).merge(),
        hint(Some(&[0, 2]), true)
    );
    assert_eq!(
        Merger::new(&info, &lists, true).merge(),
        hint(Some(&[1, 2]), true)
    );
}

#[test]
fn options_and_policies_are_read_as_the_kubelet_reads_them() {
    let parse = |json: &str| PolicyOptions::from_map(&serde_json::from_str(json).unwrap());
    assert!(
        parse(r#"{"prefer-closest-numa-nodes":"true"}"#)
            .unwrap()
            .prefer_closest_numa_nodes
    );
    assert!(
        parse(r#"{"prefer-closest-numa-nodes":true}"#)
            .unwrap()
            .prefer_closest_numa_nodes
    );
    assert!(matches!(
        parse(r#"{"prefer-closest":true}"#),
        Err(PolicyError::UnknownOption(_))
    ));
    assert!(matches!(
        parse(r#"{"max-allowable-numa-nodes":"x"}"#),
        Err(PolicyError::BadOption { .. })
    ));
    assert_eq!(
        "best".parse::<Policy>().unwrap_err(),
        PolicyError::UnknownPolicy("best".into())
    );
    // Any number of nodes is a machine; how many a policy takes is the manager's (#40).
    let nine = NumaInfo::new((0..9).collect(), BTreeMap::new()).expect("nine nodes");
    assert_eq!(nine.nodes().len(), 9);
}

/// One case of the kubelet's topology policy tests, as data (`testdata/kubelet_cases.json`,
/// transcribed from `pkg/kubelet/cm/topologymanager/policy*_test.go`; each names its source).
#[derive(serde::Deserialize)]
struct KubeletCase {
    name: String,
    source: String,
    input: serde_json::Value,
    expected: Expected,
}

#[derive(serde::Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Expected {
    numa_nodes: Option<NumaMask>,
    preferred: bool,
    admit: bool,
}

#[test]
fn every_kubelet_topology_policy_case() {
    let cases: Vec<KubeletCase> =
        serde_json::from_str(include_str!("testdata/kubelet_cases.json")).unwrap();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let input = &case.input;
        let policy: Policy = serde_json::from_value(input["policy"].clone()).unwrap();
        let options = PolicyOptions::from_map(
            &serde_json::from_value(input.get("policyOptions").cloned().unwrap_or_default())
                .unwrap_or_default(),
        )
        .unwrap();
        let nodes: Vec<usize> = serde_json::from_value(input["numaNodes"].clone()).unwrap();
        let distances: BTreeMap<usize, Vec<u64>> =
            serde_json::from_value(input.get("distances").cloned().unwrap_or_default())
                .unwrap_or_default();
        let providers: Vec<ProviderHints> =
            serde_json::from_value(input["providers"].clone()).unwrap();
        let kubelet_info = reference::NumaInfo {
            nodes: nodes.clone(),
            distances: distances.clone(),
        };
        let info = NumaInfo::new(nodes, distances).unwrap();
        let fast = merge(policy, &options, &info, &providers);
        // The transcription is checked against the kubelet's own cases too.
        let transcribed = reference::merge(
            policy,
            options.prefer_closest_numa_nodes,
            &kubelet_info,
            &providers,
            &reference::Decisions::default(),
        );
        for (which, merged) in [("merge", fast), ("transcription", transcribed)] {
            let got = Expected {
                numa_nodes: merged.hint.affinity,
                preferred: merged.hint.preferred,
                admit: merged.admit,
            };
            if got != case.expected {
                failures.push(format!(
                    "{which}: {} ({}, {}): expected {:?}, got {:?}",
                    case.name, case.source, policy, case.expected, got
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
