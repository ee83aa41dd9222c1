//! The what-if commands, for operators explaining a rejection and for checking parity with the
//! kubelet case by case: `hints` (the Memory Manager's hints for a pod on a given state) and
//! `merge` (the Topology Manager's merge of given hints). Both take files and print the kubelet's
//! answer as one line of JSON; they read nothing of the host.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use crate::{
    kube::pod::Pod,
    kubelet::features::FeatureGates,
    memorymanager::{
        checkpoint::{self, CheckpointError, Verification},
        hints::{self, HintError, Hints, Scope},
    },
    topologymanager::{
        NumaInfo, Policy, ProviderHints,
        bitmask::BitmaskError,
        manager::{self, StartError},
        merge::merge,
        numa_info::NumaInfoError,
        policy,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Json { path: String, detail: String },
    #[error(transparent)]
    State(#[from] CheckpointError),
    #[error("{0}")]
    Hints(HintError),
    #[error("{path}: machine state: {source}")]
    Machine { path: String, source: BitmaskError },
    #[error("{path}: {source}")]
    Numa { path: String, source: NumaInfoError },
    #[error("{path}: {source}")]
    Start { path: String, source: StartError },
    #[error("--container is needed in container scope: the pod has {0:?}")]
    NoContainer(Vec<String>),
}

fn read(path: &Path) -> Result<Vec<u8>, WhatIfError> {
    std::fs::read(path).map_err(|source| WhatIfError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The file's one JSON value: anything after it (a second value, a torn edit) is refused.
fn json<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, WhatIfError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| WhatIfError::Json {
        path: path.display().to_string(),
        detail: format!("at {}: {}", e.path(), e.inner()),
    })?;
    de.end().map_err(|e| WhatIfError::Json {
        path: path.display().to_string(),
        detail: format!("after the JSON value: {e}"),
    })?;
    Ok(value)
}

/// What `hints` prints, and why the kubelet would return no hints when it does not.
pub struct HintsAnswer {
    pub hints: Hints,
    pub note: Option<String>,
}

/// `hints --state STATE.json --pod POD.json [--container NAME] [--scope S] [--feature-gates G]`.
pub fn hints(
    state_path: &Path,
    pod_path: &Path,
    container: Option<&str>,
    scope: Scope,
    gates: FeatureGates,
) -> Result<HintsAnswer, WhatIfError> {
    let (state, pod) = (read(state_path)?, read(pod_path)?);
    hints_of(
        (state_path, &state),
        (pod_path, &pod),
        container,
        scope,
        gates,
    )
}

/// [`hints`] on the two files as read: each a path (named in errors) and its bytes.
pub fn hints_of(
    (state_path, state): (&Path, &[u8]),
    (pod_path, pod): (&Path, &[u8]),
    container: Option<&str>,
    scope: Scope,
    gates: FeatureGates,
) -> Result<HintsAnswer, WhatIfError> {
    let state = checkpoint::parse(state_path, state, Verification::UnlessAbsent)?;
    let pod: Pod = json(pod_path, pod)?;
    let result = match scope {
        Scope::Pod => hints::pod_hints(&state, &pod, gates),
        Scope::Container => {
            let name = match container {
                Some(name) => name,
                None if pod.spec.containers.len() == 1 => pod.spec.containers[0].name.as_str(),
                None => {
                    let names = pod.spec.containers.iter().map(|c| c.name.clone()).collect();
                    return Err(WhatIfError::NoContainer(names));
                }
            };
            let container = hints::find_container(&pod, name).map_err(WhatIfError::Hints)?;
            hints::PodFacts::of(&pod, gates)
                .map_err(HintError::from)
                .and_then(|facts| hints::container_hints(&state, &pod, &facts, container))
        }
    };
    match result {
        Ok(hints) => Ok(HintsAnswer { hints, note: None }),
        // The kubelet logs a request it cannot read and returns no hints.
        Err(HintError::Request(e)) => Ok(HintsAnswer {
            hints: None,
            note: Some(format!("the kubelet returns no hints: {e}")),
        }),
        Err(HintError::Machine(source)) => Err(WhatIfError::Machine {
            path: state_path.display().to_string(),
            source,
        }),
        Err(e) => Err(WhatIfError::Hints(e)),
    }
}

/// Hints as the kubelet's JSON: `null`, `{}` or `{"<resource>":[{"numaNodes":[0],"preferred":true}]}`.
pub fn hints_json(hints: &Hints) -> String {
    serde_json::to_string(hints).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
}

/// The `merge --input` file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MergeInput {
    policy: Policy,
    #[serde(default)]
    policy_options: BTreeMap<String, serde_json::Value>,
    numa_nodes: Vec<usize>,
    #[serde(default)]
    distances: BTreeMap<usize, Vec<u64>>,
    #[serde(default)]
    providers: Vec<ProviderHints>,
}

/// `merge --input MERGE.json`: the merged hint and the admit decision, as JSON.
pub fn merge_file(path: &Path) -> Result<String, WhatIfError> {
    merge_of(path, &read(path)?)
}

/// [`merge_file`] on the file as read: its path (named in errors) and its bytes.
pub fn merge_of(path: &Path, bytes: &[u8]) -> Result<String, WhatIfError> {
    let input: MergeInput = json(path, bytes)?;
    let path = path.display().to_string();
    let info =
        NumaInfo::new(input.numa_nodes, input.distances).map_err(|source| WhatIfError::Numa {
            path: path.clone(),
            source,
        })?;
    let options = input
        .policy_options
        .iter()
        .map(|(name, value)| (name.as_str(), policy::text(value)));
    let options = manager::start(input.policy, options, &info)
        .map_err(|source| WhatIfError::Start { path, source })?;
    let merged = merge(input.policy, &options, &info, &input.providers);
    serde_json::to_string(&merged).map_err(|e| WhatIfError::Json {
        path: "(answer)".into(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Found by the `whatif_inputs` fuzz target: a merge file with text after its object
    /// (`{…}st-effort", …`) was answered as if the rest were not there.
    #[test]
    fn text_after_the_json_value_is_refused_naming_the_file() {
        let merge = r#"{"policy": "best-effort", "numaNodes": [0, 1]}"#;
        merge_of(Path::new("/m.json"), merge.as_bytes()).expect("one object");
        for after in [" {}", "st-effort\", \"x\": 1}", "]"] {
            let text = format!("{merge}{after}");
            let err = merge_of(Path::new("/m.json"), text.as_bytes())
                .expect_err(&text)
                .to_string();
            assert!(
                err.starts_with("/m.json: after the JSON value: trailing characters"),
                "{text}: {err}"
            );
        }
        merge_of(Path::new("/m.json"), format!("{merge} \n\t").as_bytes())
            .expect("white space after the object is fine");
        let state = r#"{"policyName": "Static", "machineState": {}}"#;
        let pod = r#"{"spec": {"containers": [{"name": "app"}]}}"#;
        let err = hints_of(
            (Path::new("/state"), state.as_bytes()),
            (Path::new("/pod.json"), format!("{pod}{pod}").as_bytes()),
            None,
            Scope::Container,
            FeatureGates::default(),
        )
        .err()
        .expect("two pods in one file")
        .to_string();
        assert!(err.starts_with("/pod.json: after the JSON value"), "{err}");
    }

    /// Found writing the `whatif_inputs` fuzz target (and reproduced on its build): a state
    /// whose machine has a node id past 63 was refused as `machine state: NUMA node 64 is out of
    /// range…`, without the file.
    #[test]
    fn a_machine_state_out_of_range_names_the_state_file() {
        let table =
            r#"{"total": 1, "systemReserved": 0, "allocatable": 1, "reserved": 0, "free": 1}"#;
        let state = format!(
            r#"{{"policyName": "Static", "machineState": {{"64": {{"numberOfAssignments": 0, "memoryMap": {{"memory": {table}}}, "cells": []}}}}}}"#
        );
        let limits = r#"{"memory": "1Gi", "cpu": "1"}"#;
        let pod = format!(
            r#"{{"spec": {{"containers": [{{"name": "app", "resources": {{"requests": {limits}, "limits": {limits}}}}}]}}}}"#
        );
        let err = hints_of(
            (Path::new("/state"), state.as_bytes()),
            (Path::new("/pod.json"), pod.as_bytes()),
            None,
            Scope::Container,
            FeatureGates::default(),
        )
        .err()
        .expect("node 64")
        .to_string();
        assert_eq!(
            err,
            "/state: machine state: NUMA node 64 is out of range: node ids go from 0 to 63"
        );
    }
}
