//! `hugepage-agent check`: one verification from the shell. `--request` takes what a pod's
//! container asks, as `POST /v1/admit` does: `hugepages-<size>` (placed and verified), `memory`
//! (placed, never verified: KEP-5759 verifies hugepages only), and any other resource name
//! (accepted and ignored, with a note: the Memory Manager does not place it). Without `--numa`,
//! the NUMA nodes are those the node's kubelet would pick for a Guaranteed pod asking these
//! resources (`--policy`, else its Topology Manager policy; every node under its Memory Manager
//! policy `None`), then verified there. Exit 0 admitted, 1 rejected (the
//! KEP's message, or the kubelet's topology refusal, on stderr), 2 bad input (the flag at fault on
//! stderr).

use std::{collections::BTreeMap, process::ExitCode};

use crate::{
    admission::{
        plan,
        verify::{Gate, Settings, Verdict, Verifier},
    },
    config::CheckConfig,
    host::NumaNode,
    kube::pod::{
        self, Container, Hugepages, Pod, PodSpec, PodStatus, QuantityValue, Requirements,
        ResourceList, ResourceUse,
    },
    kubeletconfig::live::{KubeletView, read_once},
    memorymanager::live::StateLoader,
    numa::map::{MapWriter, Source},
    quantity::{self, format_binary},
    sysfs::topology,
    topologymanager::Policy,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    #[error(
        "--request {0:?}: expected <resource>=<quantity>, e.g. hugepages-2Mi=4Gi or memory=1Gi"
    )]
    RequestSyntax(String),
    #[error("--request {given:?}: {detail}")]
    Request { given: String, detail: String },
    #[error("--request {resource}: the total of the requests overflows 64 bits of bytes")]
    Overflow { resource: String },
    #[error("--numa {0:?}: expected NUMA node numbers separated by commas, e.g. 0,1")]
    Numa(String),
}

/// What `--request` values ask, as a container's resources (requests equal limits).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Bytes of memory and of each hugepage size, summed over repeated names.
    pub placed: BTreeMap<String, u64>,
    /// The hugepages among them, per page size: what is verified.
    pub pages: Hugepages,
    /// Values naming resources the Memory Manager does not place, as given.
    pub ignored: Vec<String>,
}

/// Parses `--request` values: `hugepages-<size>` and `memory` are kept (summed per name), other
/// resource names are set aside in [`Requests::ignored`].
pub fn parse_requests(values: &[String]) -> Result<Requests, CheckError> {
    let mut requests = Requests::default();
    for value in values {
        let (name, amount) = value
            .split_once('=')
            .ok_or_else(|| CheckError::RequestSyntax(value.clone()))?;
        let bad = |e: pod::RequestError| CheckError::Request {
            given: value.clone(),
            detail: e.detail,
        };
        let (key, bytes) = match pod::resource_use(name, "--request").map_err(bad)? {
            ResourceUse::Ignored => {
                requests.ignored.push(value.clone());
                continue;
            }
            ResourceUse::Memory => {
                let bytes = quantity::parse_bytes(amount).map_err(|e| CheckError::Request {
                    given: value.clone(),
                    detail: e.to_string(),
                })?;
                ("memory".to_owned(), bytes)
            }
            ResourceUse::Hugepages(size) => {
                let list: ResourceList =
                    BTreeMap::from([(name.to_owned(), QuantityValue::Text(amount.to_owned()))]);
                let pages = pod::from_list(&list, "--request").map_err(bad)?;
                let bytes = pages.get(&size).copied().unwrap_or(0);
                if bytes > 0 {
                    requests.pages.insert(size, 0);
                }
                (size.resource_name(), bytes)
            }
        };
        let total = requests.placed.entry(key.clone()).or_default();
        *total = total
            .checked_add(bytes)
            .ok_or(CheckError::Overflow { resource: key })?;
    }
    for (size, bytes) in &mut requests.pages {
        *bytes = requests
            .placed
            .get(&size.resource_name())
            .copied()
            .unwrap_or(0);
    }
    Ok(requests)
}

/// Parses `--numa 0,1`.
pub fn parse_numa(text: &str) -> Result<Vec<NumaNode>, CheckError> {
    text.split(',')
        .map(|n| n.trim().parse().map(NumaNode))
        .collect::<Result<_, _>>()
        .map_err(|_| CheckError::Numa(text.to_owned()))
}

/// Runs the check and prints the outcome; returns the exit code.
pub fn run(config: &CheckConfig) -> ExitCode {
    let (requests, numa, policy, json) = (
        config.requests.as_slice(),
        config.numa.as_deref(),
        config.policy,
        config.json,
    );
    let bad = |err: &dyn std::fmt::Display| {
        eprintln!("hugepage-agent: {err}");
        ExitCode::from(2)
    };
    let requests = match parse_requests(requests) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    for value in &requests.ignored {
        eprintln!(
            "hugepage-agent: --request {value}: not memory or hugepages; the Memory Manager does not place it, ignored"
        );
    }
    let verifier = match Verifier::new(config.host.clone()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hugepage-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kubelet = match topology::read(&config.host)
        .map_err(|e| e.to_string())
        .and_then(|nodes| {
            let explicit = config.kubelet.config.as_deref();
            read_once(&config.host, explicit, &config.kubelet.layer, &nodes)
                .map_err(|e| e.to_string())
        }) {
        Ok(view) => view,
        Err(e) => {
            eprintln!("hugepage-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(err) = &kubelet.error {
        eprintln!(
            "hugepage-agent: reading the kubelet's settings: {err}; using the flags over the kubelet's defaults"
        );
    }
    let all = verifier.nodes();
    let groups = match numa.map(parse_numa).transpose() {
        Ok(Some(nodes)) => BTreeMap::from([(nodes, requests.pages.clone())]),
        Ok(None) if !kubelet.pins_memory() => BTreeMap::from([(all, requests.pages.clone())]),
        Ok(None) => match select(config, &kubelet, policy, &requests.placed, &all) {
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
        let settings = Settings {
            gate: if kubelet.settings.verification() {
                Gate::On
            } else {
                Gate::Off
            },
            ..config.verification
        };
        match verifier.verify(pages, nodes, settings) {
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

/// NUMA nodes as the kubelet would pick them for a Guaranteed pod asking this memory and these
/// hugepages (on the kubelet's checkpoint, or the state built from sysfs).
fn select(
    config: &CheckConfig,
    kubelet: &KubeletView,
    policy: Option<Policy>,
    placed: &BTreeMap<String, u64>,
    all: &[NumaNode],
) -> Result<Selected, String> {
    let (writer, _) =
        MapWriter::new(config.host.clone(), Source::Sysfs).map_err(|e| e.to_string())?;
    let mut loader = StateLoader::new(
        config.host.clone(),
        config.kubelet.state.clone(),
        kubelet.settings.reserved_memory.value.clone(),
    );
    let view = loader.load(&writer.current()).map_err(|e| e.to_string())?;
    if let Some(err) = &view.checkpoint_error {
        eprintln!(
            "hugepage-agent: the kubelet's checkpoint is refused ({err}); using the state built from sysfs"
        );
    }
    view.usable()?;
    let topology = kubelet.topology(policy, None)?;
    let list: ResourceList = placed
        .iter()
        .map(|(name, bytes)| (name.clone(), QuantityValue::Number(*bytes)))
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
    let pages = pod::pod_hugepages(&pod.spec).map_err(|e| e.to_string())?;
    let plan = plan::plan(&view.state, &pod, &pages, topology.topology(), all)
        .map_err(|e| e.to_string())?;
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
    use crate::host::PageSize;

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
            parsed.pages,
            pod::Hugepages::from([(PageSize(2 << 20), 6 << 30), (PageSize(1 << 30), 2 << 30)])
        );
    }

    #[test]
    fn check_accepts_the_memory_a_pod_asks_for_and_places_it_without_verifying_it() {
        let values = ["memory=4Gi", "hugepages-1Gi=2Gi", "memory=1Gi"].map(String::from);
        let parsed = parse_requests(&values).expect("memory is a pod's request");
        assert_eq!(
            parsed.placed,
            BTreeMap::from([
                ("hugepages-1Gi".to_owned(), 2 << 30),
                ("memory".to_owned(), 5 << 30)
            ])
        );
        assert_eq!(
            parsed.pages,
            pod::Hugepages::from([(PageSize(1 << 30), 2 << 30)])
        );
        assert!(parsed.ignored.is_empty());
    }

    #[test]
    fn other_resources_are_set_aside_and_malformed_names_refused() {
        let values = ["cpu=2", "example.com/nic=1", "hugepages-2Mi=2Mi"].map(String::from);
        let parsed = parse_requests(&values).expect("valid names");
        assert_eq!(parsed.ignored, ["cpu=2", "example.com/nic=1"]);
        assert_eq!(parsed.placed.len(), 1);
        let err = parse_requests(&["bad name=1".to_owned()]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--request \"bad name=1\": \"bad name\" is not a resource name"),
            "{err}"
        );
    }

    #[test]
    fn a_total_that_overflows_names_the_resource() {
        let values = ["memory=8Ei", "memory=8Ei"].map(String::from);
        assert_eq!(
            parse_requests(&values),
            Err(CheckError::Overflow {
                resource: "memory".into()
            })
        );
    }

    #[test]
    fn bad_requests_name_the_value() {
        let one = |v: &str| parse_requests(&[v.to_owned()]).unwrap_err().to_string();
        assert_eq!(
            one("hugepages-2Mi"),
            "--request \"hugepages-2Mi\": expected <resource>=<quantity>, e.g. hugepages-2Mi=4Gi or memory=1Gi"
        );
        assert!(one("memory=lots").contains("is not a quantity"));
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
