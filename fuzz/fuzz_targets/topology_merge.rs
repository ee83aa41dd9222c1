//! The Topology Manager's merge (`topologymanager/merge.rs`): the fast merge and the kubelet's
//! walk transcribed (`merge/reference.rs`) agree on any machine and any providers' hints, under
//! every policy, with and without `prefer-closest-numa-nodes`. The bytes decode to a machine of
//! up to 5 node ids (any subset, gaps included) with any distances, and up to 3 providers of up
//! to 5 hint lists of up to 4 hints in all (hints may name nodes the machine lacks), the sizes
//! the reference's walk over every permutation allows.
#![no_main]

use std::collections::BTreeMap;

use hugepage_agent::topologymanager::{
    NumaInfo, NumaMask, Policy, PolicyOptions, ProviderHints, TopologyHint,
    merge::{merge, reference},
};
use libfuzzer_sys::fuzz_target;

const ID_BITS: usize = 5;
const DISTANCES: [u64; 8] = [10, 11, 12, 20, 21, 10, 30, 255];
const POLICIES: [Policy; 4] = [
    Policy::None,
    Policy::BestEffort,
    Policy::Restricted,
    Policy::SingleNumaNode,
];

/// The input's bytes, then zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let machine = u64::from(bytes.next()) & ((1 << ID_BITS) - 1);
    if machine == 0 {
        return;
    }
    let nodes: Vec<usize> = (0..ID_BITS).filter(|i| machine & 1 << i != 0).collect();
    let distances: BTreeMap<usize, Vec<u64>> = (0..ID_BITS)
        .map(|from| {
            let row = (0..ID_BITS)
                .map(|_| DISTANCES[usize::from(bytes.next() % 8)])
                .collect();
            (from, row)
        })
        .collect();
    let mut lists = 0;
    let providers: Vec<ProviderHints> = (0..1 + bytes.next() % 3)
        .map(|_| match bytes.next() % 10 {
            0 => None,
            1 => Some(BTreeMap::new()),
            _ => Some(
                (0..1 + bytes.next() % 2)
                    .filter(|_| {
                        lists += 1;
                        lists <= 5
                    })
                    .map(|r| {
                        let hints = match bytes.next() % 10 {
                            0 => None,
                            1 => Some(Vec::new()),
                            _ => Some(
                                (0..1 + bytes.next() % 4)
                                    .map(|_| {
                                        let b = bytes.next();
                                        let bits = u64::from(b & 0x1f);
                                        TopologyHint {
                                            affinity: (b & 0x20 == 0).then_some(NumaMask(
                                                if bits == 0 { machine } else { bits },
                                            )),
                                            preferred: b & 0x80 != 0,
                                        }
                                    })
                                    .collect(),
                            ),
                        };
                        (format!("resource{r}"), hints)
                    })
                    .collect(),
            ),
        })
        .collect();
    let kubelet_info = reference::NumaInfo {
        nodes: nodes.clone(),
        distances: distances.clone(),
    };
    let decisions = reference::Decisions::default();
    for closest in [false, true] {
        let options = PolicyOptions {
            prefer_closest_numa_nodes: closest,
            ..PolicyOptions::default()
        };
        let Ok(info) = NumaInfo::new(nodes.clone(), distances.clone()) else {
            continue;
        };
        for policy in POLICIES {
            let fast = merge(policy, &options, &info, &providers);
            let kubelet = reference::merge(policy, closest, &kubelet_info, &providers, &decisions);
            assert_eq!(
                fast, kubelet,
                "{policy:?}, closest {closest}, nodes {nodes:?}, distances {distances:?}, providers {providers:?}"
            );
        }
    }
});
