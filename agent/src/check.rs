//! `hugepage-agent check`: one verification from the shell. Without `--numa`, the NUMA nodes are
//! those the kubelet would pick for a Guaranteed pod asking these hugepages (`--policy`, else
//! `--topology-policy`), then verified there. Exit 0 admitted, 1 rejected (the KEP's message, or
//! the kubelet's topology refusal, on stderr), 2 bad input (the flag at fault on stderr).

use std::{collections::BTreeMap, process::ExitCode};

use crate::{
    admission::{
        plan,
        request::{
            self, Container, Hugepages, Pod, PodSpec, PodStatus, QuantityValue, Requirements,
            ResourceList,
        },
        verify::{Verdict, Verifier},
    },
    config::Config,
    memorymanager::{live::StateLoader, selection::Topology},
    numa::{
        NumaNode,
        map::{MapWriter, Source},
    },
    quantity::format_binary,
    sysfs::topology,
    topologymanager::{NumaInfo, Policy},
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    #[error("--request {0:?}: expected hugepages-<size>=<quantity>, e.g. hugepages-2Mi=4Gi")]
    RequestSyntax(String),
    #[error("--request {0:?}: not a hugepages resource")]
    NotHugepages(String),
    #[error("--request {given:?}: {detail}")]
    Request { given: String, detail: String },
    #[error("--numa {0:?}: expected NUMA node numbers separated by commas, e.g. 0,1")]
    Numa(String),
}

/// Parses `--request` values into a resource list (requests equal limits).
pub fn parse_requests(values: &[String]) -> Result<request::Hugepages, CheckError> {
    let mut total = request::Hugepages::new();
    for value in values {
        let (name, amount) = value
            .split_once('=')
            .ok_or_else(|| CheckError::RequestSyntax(value.clone()))?;
        let list: ResourceList =
            BTreeMap::from([(name.to_owned(), QuantityValue::Text(amount.to_owned()))]);
        let pages = request::from_list(&list, "--request").map_err(|e| CheckError::Request {
            given: value.clone(),
            detail: e.detail,
        })?;
        if request::page_size(name, "--request")
            .ok()
            .flatten()
            .is_none()
        {
            return Err(CheckError::NotHugepages(value.clone()));
        }
        for (size, bytes) in pages {
            *total.entry(size).or_default() += bytes;
        }
    }
    Ok(total)
}

/// Parses `--numa 0,1`.
pub fn parse_numa(text: &str) -> Result<Vec<NumaNode>, CheckError> {
    text.split(',')
        .map(|n| n.trim().parse().map(NumaNode))
        .collect::<Result<_, _>>()
        .map_err(|_| CheckError::Numa(text.to_owned()))
}

/// Runs the check and prints the outcome; returns the exit code.
pub fn run(
    config: &Config,
    requests: &[String],
    numa: Option<&str>,
    policy: Option<Policy>,
    json: bool,
) -> ExitCode {
    let bad = |err: &dyn std::fmt::Display| {
        eprintln!("hugepage-agent: {err}");
        ExitCode::from(2)
    };
    let request = match parse_requests(requests) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    let verifier = match Verifier::new(config.host.clone()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hugepage-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let groups = match numa.map(parse_numa).transpose() {
        Ok(Some(nodes)) => BTreeMap::from([(nodes, request.clone())]),
        Ok(None) => match select(config, policy, &request, &verifier.nodes()) {
            Ok(Selected::Groups(groups)) => groups,
            Ok(Selected::Refused { reason, message }) => {
                println!("rejected ({reason})");
                eprintln!("{message}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("hugepage-agent: {e}");
                return ExitCode::FAILURE;
            }
        },
        Err(e) => return bad(&e),
    };
    let mut verdicts = Vec::new();
    for (nodes, pages) in &groups {
        match verifier.verify(pages, nodes, config.verification) {
            Ok(v) => verdicts.push(v),
            Err(e) => return bad(&e),
        }
    }
    let Some(verdict) = plan::combine(verdicts) else {
        println!("admitted");
        return ExitCode::SUCCESS;
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&verdict).unwrap_or_default()
        );
    } else {
        print!("{}", summary(&verdict));
    }
    match &verdict.message {
        Some(message) if !verdict.allowed => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// What the kubelet's selection made of a check.
enum Selected {
    /// Hugepages to verify per set of nodes.
    Groups(BTreeMap<Vec<NumaNode>, Hugepages>),
    /// The kubelet's refusal.
    Refused {
        reason: &'static str,
        message: String,
    },
}

/// NUMA nodes as the kubelet would pick them for a Guaranteed pod asking these hugepages (on the
/// kubelet's checkpoint, or the state built from sysfs).
fn select(
    config: &Config,
    policy: Option<Policy>,
    request: &Hugepages,
    all: &[NumaNode],
) -> Result<Selected, String> {
    let (writer, _) =
        MapWriter::new(config.host.clone(), Source::Sysfs).map_err(|e| e.to_string())?;
    let mut loader = StateLoader::new(
        config.host.clone(),
        config.kubelet_state.clone(),
        config.reserved_memory.clone(),
    );
    let view = loader.load(&writer.current()).map_err(|e| e.to_string())?;
    if let Some(err) = &view.checkpoint_error {
        eprintln!(
            "hugepage-agent: the kubelet's checkpoint is refused ({err}); using the state built from sysfs"
        );
    }
    let topology_nodes = topology::read(&config.host).map_err(|e| e.to_string())?;
    let info = NumaInfo::from_topology(&topology_nodes, &config.topology.options)
        .map_err(|e| e.to_string())?;
    let list: ResourceList = request
        .iter()
        .map(|(size, bytes)| (size.resource_name(), QuantityValue::Number(*bytes)))
        .collect();
    let pod = Pod {
        spec: PodSpec {
            containers: vec![Container {
                name: "check".into(),
                resources: Requirements {
                    requests: list.clone(),
                    limits: list,
                },
                restart_policy: None,
            }],
            ..PodSpec::default()
        },
        status: PodStatus {
            qos_class: Some("Guaranteed".into()),
        },
        ..Pod::default()
    };
    let topology = Topology {
        info: &info,
        policy: policy.unwrap_or(config.topology.policy),
        options: &config.topology.options,
        scope: config.topology.scope,
        gates: config.topology.gates,
    };
    let pages = request::pod_hugepages(&pod.spec).map_err(|e| e.to_string())?;
    let plan = plan::plan(&view.state, &pod, &pages, topology, all).map_err(|e| e.to_string())?;
    if !plan.selection.admit {
        let reason = plan.selection.reason.unwrap_or("TopologyAffinityError");
        let message = plan.selection.message.unwrap_or_default();
        return Ok(Selected::Refused { reason, message });
    }
    Ok(Selected::Groups(plan.groups))
}

/// One line per size: requested, available in the chosen mode, and both numbers.
pub fn summary(verdict: &Verdict) -> String {
    let mut out = String::new();
    for c in &verdict.checks {
        let state = match (&c.unverified, c.ok) {
            (Some(_), _) => "unverified",
            (None, true) => "ok",
            (None, false) => "insufficient",
        };
        out.push_str(&format!(
            "{state:<12} {} on NUMA node(s) {:?}: requested {}, available {} (free {}, unreserved {})\n",
            c.resource,
            c.numa_nodes.iter().map(|n| n.0).collect::<Vec<_>>(),
            format_binary(c.requested_bytes),
            format_binary(c.available_bytes),
            format_binary(c.free_bytes),
            format_binary(c.unreserved_bytes),
        ));
    }
    out.push_str(if verdict.allowed {
        "admitted\n"
    } else {
        "rejected\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numa::PageSize;

    #[test]
    fn requests_parse_and_add_up_per_size() {
        let values = [
            "hugepages-2Mi=4Gi",
            "hugepages-1Gi=2Gi",
            "hugepages-2Mi=2048Mi",
        ]
        .map(String::from);
        let parsed = parse_requests(&values).expect("valid");
        assert_eq!(
            parsed,
            request::Hugepages::from([(PageSize(2 << 20), 6 << 30), (PageSize(1 << 30), 2 << 30)])
        );
    }

    #[test]
    fn bad_requests_name_the_value() {
        let one = |v: &str| parse_requests(&[v.to_owned()]).unwrap_err().to_string();
        assert_eq!(
            one("hugepages-2Mi"),
            "--request \"hugepages-2Mi\": expected hugepages-<size>=<quantity>, e.g. hugepages-2Mi=4Gi"
        );
        assert_eq!(
            one("memory=1Gi"),
            "--request \"memory=1Gi\": not a hugepages resource"
        );
        assert!(one("hugepages-2Mi=1G").contains("not a whole multiple of the page size 2Mi"));
        assert!(one("hugepages-2Mi=lots").contains("is not a quantity"));
    }

    #[test]
    fn numa_lists_parse() {
        assert_eq!(parse_numa("0,1"), Ok(vec![NumaNode(0), NumaNode(1)]));
        assert_eq!(parse_numa("0, 2"), Ok(vec![NumaNode(0), NumaNode(2)]));
        assert_eq!(parse_numa("zero"), Err(CheckError::Numa("zero".into())));
    }
}
