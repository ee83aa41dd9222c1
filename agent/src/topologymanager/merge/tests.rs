use super::*;

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
    let options = PolicyOptions {
        max_allowable_numa_nodes: 64,
        ..PolicyOptions::default()
    };
    NumaInfo::new(nodes, distances, &options).unwrap()
}

/// The kubelet's merge as it is written: every permutation, in order, through `compare`.
fn exhaustive(info: &NumaInfo, lists: &[Vec<TopologyHint>], closest: bool) -> TopologyHint {
    let merger = Merger::new(info, lists, closest);
    let default = info.default_affinity();
    let mut best: Option<TopologyHint> = None;
    let mut picks = vec![0usize; lists.len()];
    if lists.iter().all(|l| !l.is_empty()) {
        loop {
            let permutation: Vec<TopologyHint> =
                picks.iter().zip(lists).map(|(&i, l)| l[i]).collect();
            let affinities: Vec<NumaMask> = permutation.iter().filter_map(|h| h.affinity).collect();
            let preferred = permutation.iter().all(|h| h.preferred)
                && affinities.iter().all(|&m| m == affinities[0]);
            let merged = affinities.iter().fold(default, |acc, &m| acc.and(m));
            let candidate = TopologyHint {
                affinity: Some(merged),
                preferred,
            };
            best = compare(&merger, best, candidate);
            let mut level = lists.len();
            loop {
                if level == 0 {
                    break;
                }
                level -= 1;
                picks[level] += 1;
                if picks[level] < lists[level].len() {
                    break;
                }
                picks[level] = 0;
                if level == 0 {
                    level = usize::MAX;
                    break;
                }
            }
            if level == usize::MAX || lists.is_empty() {
                break;
            }
        }
    }
    best.unwrap_or(TopologyHint {
        affinity: Some(default),
        preferred: false,
    })
}

fn compare(
    merger: &Merger<'_>,
    current: Option<TopologyHint>,
    candidate: TopologyHint,
) -> Option<TopologyHint> {
    let cand = candidate.affinity.unwrap();
    if cand.count() == 0 {
        return current;
    }
    let Some(cur) = current else {
        return Some(candidate);
    };
    let now = cur.affinity.unwrap();
    let masks = |keep: TopologyHint| {
        if cand == now || merger.info.better(merger.closest, now, cand) == now {
            Some(keep)
        } else {
            Some(candidate)
        }
    };
    match (cur.preferred, candidate.preferred) {
        (false, true) => Some(candidate),
        (true, false) => Some(cur),
        (true, true) => masks(cur),
        (false, false) => {
            let target = merger.best_non_preferred_count;
            if now.count() > target {
                masks(cur)
            } else if now.count() == target {
                if cand.count() != target {
                    Some(cur)
                } else {
                    masks(cur)
                }
            } else if cand.count() > target {
                Some(cur)
            } else {
                masks(cur)
            }
        }
    }
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

fn random_lists(rng: &mut Rng, nodes: usize) -> Vec<Vec<TopologyHint>> {
    let lists = 1 + rng.below(3) as usize;
    (0..lists)
        .map(|_| {
            let len = rng.below(6) as usize;
            (0..len)
                .map(|_| {
                    let affinity = if rng.below(8) == 0 {
                        None
                    } else {
                        // Sometimes a node outside the machine, as a provider may send.
                        Some(NumaMask(rng.below(1 << (nodes + 1))))
                    };
                    TopologyHint {
                        affinity,
                        preferred: rng.below(3) == 0,
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn agrees_with_the_kubelets_exhaustive_walk_on_random_hints() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut differing_orders = 0;
    for round in 0..20_000 {
        let nodes = 1 + rng.below(4) as usize;
        let info = info(nodes);
        let lists = random_lists(&mut rng, nodes);
        for closest in [false, true] {
            let fast = Merger::new(&info, &lists, closest).merge();
            let slow = exhaustive(&info, &lists, closest);
            assert_eq!(
                fast, slow,
                "round {round}, closest {closest}, lists {lists:?}"
            );
        }
        // The walk order matters to the kubelet; check the random cases do reach such cases.
        let mut reversed: Vec<Vec<TopologyHint>> = lists.clone();
        reversed.iter_mut().for_each(|l| l.reverse());
        if exhaustive(&info, &lists, false) != exhaustive(&info, &reversed, false) {
            differing_orders += 1;
        }
    }
    assert!(
        differing_orders > 0,
        "no order-sensitive case was generated"
    );
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
    let lists = [list];
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
fn options_and_machines_are_validated() {
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
        Err(MergeError::UnknownOption(_))
    ));
    assert!(matches!(
        parse(r#"{"max-allowable-numa-nodes":"x"}"#),
        Err(MergeError::BadOption { .. })
    ));
    let defaults = PolicyOptions::default();
    assert_eq!(
        NumaInfo::new((0..9).collect(), BTreeMap::new(), &defaults).unwrap_err(),
        MergeError::TooManyNodes { count: 9, max: 8 }
    );
    let closest = PolicyOptions {
        prefer_closest_numa_nodes: true,
        ..defaults
    };
    let distances = BTreeMap::from([(0, vec![10, 20]), (1, vec![20])]);
    assert_eq!(
        NumaInfo::new(vec![0, 1], distances, &closest).unwrap_err(),
        MergeError::MissingDistance { node: 1, to: 1 }
    );
    assert_eq!(
        "best".parse::<Policy>().unwrap_err(),
        MergeError::UnknownPolicy("best".into())
    );
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
        let info = NumaInfo::new(nodes, distances, &options).unwrap();
        let merged = merge(policy, &options, &info, &providers);
        let got = Expected {
            numa_nodes: merged.hint.affinity,
            preferred: merged.hint.preferred,
            admit: merged.admit,
        };
        if got != case.expected {
            failures.push(format!(
                "{} ({}, {}): expected {:?}, got {:?}",
                case.name, case.source, policy, case.expected, got
            ));
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
