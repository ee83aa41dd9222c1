//! The what-if commands' input files (`whatif.rs`): `merge --input` and `hints --state --pod`,
//! on any bytes. The first byte picks the command (even: `merge`, the rest its file; odd:
//! `hints`, the rest the state file and the pod file split at the first 0xff byte, which UTF-8
//! text never holds) and, for `hints`, the scope, `--container` and the feature gates. An answer
//! is JSON of the kubelet's shape whose NUMA nodes are the machine's (`merge`: the input's nodes;
//! `hints`: the state's); a merge admits as its policy does (`none` and `best-effort` always,
//! `restricted` and `single-numa-node` a preferred hint only, the latter on one node or any);
//! a refusal names the file, or `--container`, that it refused.
#![no_main]

use std::{collections::BTreeSet, path::Path};

use hugepage_agent::{
    kubelet::features::FeatureGates,
    memorymanager::{
        checkpoint::{self, Verification},
        hints::Scope,
    },
    whatif::{self, WhatIfError},
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const MERGE: &str = "/tmp/what-if/merge.json";
const STATE: &str = "/tmp/what-if/memory_manager_state";
const POD: &str = "/tmp/what-if/pod.json";
const CONTAINERS: [Option<&str>; 4] = [None, Some("app"), Some("init"), Some("")];

/// The NUMA nodes of a hint (`{"numaNodes":[0,1],"preferred":true}`), `None` for any.
fn nodes(hint: &Value) -> Option<Vec<u64>> {
    let list = hint.get("numaNodes")?;
    if list.is_null() {
        return None;
    }
    let list = list.as_array().expect("numaNodes is a list or null");
    Some(
        list.iter()
            .map(|n| n.as_u64().expect("a NUMA node is a number"))
            .collect(),
    )
}

fn merge(bytes: &[u8]) {
    match whatif::merge_of(Path::new(MERGE), bytes) {
        Ok(answer) => {
            let input: Value = serde_json::from_slice(bytes).expect("an accepted input is JSON");
            let machine: BTreeSet<u64> = input["numaNodes"]
                .as_array()
                .expect("an accepted input lists numaNodes")
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            let merged: Value = serde_json::from_str(&answer).expect("the answer is JSON");
            let admit = merged["admit"].as_bool().expect("admit is a boolean");
            let preferred = merged["preferred"]
                .as_bool()
                .expect("preferred is a boolean");
            let hint = nodes(&merged);
            if let Some(hint) = &hint {
                assert!(
                    hint.iter().all(|n| machine.contains(n)),
                    "{answer}: a node the machine does not have ({machine:?})"
                );
            }
            match input["policy"].as_str().expect("the policy is text") {
                "none" | "best-effort" => {
                    assert!(admit, "{answer}: refused under a lenient policy")
                }
                "restricted" => assert_eq!(admit, preferred, "{answer}"),
                "single-numa-node" => {
                    assert_eq!(admit, preferred, "{answer}");
                    if admit && let Some(hint) = &hint {
                        assert_eq!(hint.len(), 1, "{answer}: admitted on several nodes");
                    }
                }
                other => panic!("{other:?} accepted as a policy"),
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("{MERGE}: ")),
                "{message:?} does not name the file"
            );
        }
    }
}

fn hints(flags: u8, state: &[u8], pod: &[u8]) {
    let scope = if flags & 2 == 0 {
        Scope::Container
    } else {
        Scope::Pod
    };
    let container = CONTAINERS[usize::from((flags >> 2) & 3)];
    let gates = FeatureGates {
        pod_level_resources: flags & 16 != 0,
        pod_level_resource_managers: flags & 32 != 0,
    };
    let answer = whatif::hints_of(
        (Path::new(STATE), state),
        (Path::new(POD), pod),
        container,
        scope,
        gates,
    );
    match answer {
        Ok(answer) => {
            let machine: BTreeSet<u64> =
                checkpoint::parse(Path::new(STATE), state, Verification::UnlessAbsent)
                    .expect("an accepted state parses")
                    .machine_state
                    .keys()
                    .map(|&n| n as u64)
                    .collect();
            let text = whatif::hints_json(&answer.hints);
            let printed: Value = serde_json::from_str(&text).expect("the hints are JSON");
            if let Some(note) = &answer.note {
                assert!(answer.hints.is_none(), "a note with hints: {note}");
                assert!(note.starts_with("the kubelet returns no hints: "), "{note}");
            }
            let Value::Object(resources) = printed else {
                assert!(printed.is_null(), "{text}: neither null nor an object");
                return;
            };
            for (resource, list) in resources {
                for hint in list.as_array().expect("a resource's hints are a list") {
                    let hint_nodes = nodes(hint).expect("a resource's hint names its nodes");
                    assert!(!hint_nodes.is_empty(), "{text}: a hint on no node");
                    assert!(
                        hint_nodes.iter().all(|n| machine.contains(n)),
                        "{resource} in {text}: a node the state does not have ({machine:?})"
                    );
                }
            }
        }
        Err(WhatIfError::NoContainer(names)) => {
            assert!(container.is_none() && scope == Scope::Container);
            assert!(names.len() != 1, "one container, {names:?}, not taken");
        }
        Err(e) => {
            let message = e.to_string();
            let named = message.contains(STATE)
                || message.contains(POD)
                || container.is_some_and(|c| message.contains(&format!("{c:?}")));
            assert!(named, "{message:?} names neither file nor --container");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first & 1 == 0 {
        merge(rest);
        return;
    }
    let split = rest.iter().position(|&b| b == 0xff).unwrap_or(rest.len());
    let (state, pod) = rest.split_at(split);
    hints(first, state, pod.get(1..).unwrap_or_default());
});
