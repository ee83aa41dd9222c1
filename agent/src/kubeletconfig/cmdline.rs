//! The running kubelet's command line, as its flag parser (pflag) reads it: `--name=value` or
//! `--name value`; a repeated flag's last value wins, except that the map flags
//! (`--feature-gates`, `--system-reserved`, `--kube-reserved`,
//! `--topology-manager-policy-options`) add their pairs up and `--reserved-memory` its entries. What is kept: `--config` and `--config-dir` (where the files are), and the flags that
//! set the settings this agent reads, which win over the files as in the kubelet. Every other
//! argument is skipped. Pure: the caller reads `/proc/<pid>/cmdline`.

use std::collections::BTreeMap;

use super::settings::{
    Layer, LayerError, Source, Sourced, key_values, parse_gates, parse_memory_manager_policy,
    parse_policy, parse_scope, reserve,
};
use crate::memorymanager::machine::ReservedMemory;

/// The flags whose value is a separate argument when not given with `=`: the ones read here.
const READ: [&str; 10] = [
    "--config",
    "--config-dir",
    "--topology-manager-policy",
    "--topology-manager-scope",
    "--topology-manager-policy-options",
    "--memory-manager-policy",
    "--reserved-memory",
    "--system-reserved",
    "--kube-reserved",
    "--feature-gates",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    #[error("the kubelet (pid {pid}) command line: {flag} has no value")]
    NoValue { pid: u32, flag: &'static str },
    #[error("the kubelet (pid {pid}) command line: {source}")]
    Value {
        pid: u32,
        #[source]
        source: LayerError,
    },
}

/// What the kubelet's command line says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletCmdline {
    /// `--config`, as given (relative to the kubelet's working directory unless absolute).
    pub config: Option<String>,
    /// `--config-dir`, as given.
    pub config_dir: Option<String>,
    /// The settings its flags set.
    pub layer: Layer,
}

/// Parses `args` (argv without argv\[0\]) of the kubelet with process id `pid`.
pub fn parse(pid: u32, args: &[String]) -> Result<KubeletCmdline, CmdlineError> {
    let mut values: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        let Some(&flag) = READ.iter().find(|f| **f == name) else {
            continue;
        };
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or(CmdlineError::NoValue { pid, flag })?,
        };
        values.entry(flag).or_default().push(value);
    }
    let last = |flag: &str| values.get(flag).and_then(|v| v.last()).cloned();
    let map = |flag: &str| -> Result<Option<BTreeMap<String, String>>, LayerError> {
        let Some(all) = values.get(flag) else {
            return Ok(None);
        };
        let mut map = BTreeMap::new();
        for text in all {
            map.extend(key_values(flag, text)?);
        }
        Ok(Some(map))
    };
    let source = Source::KubeletCmdline { pid };
    fn at<T>(value: T, source: &Source) -> Sourced<T> {
        Sourced {
            value,
            source: source.clone(),
        }
    }
    let err = |source: LayerError| CmdlineError::Value { pid, source };
    let mut layer = Layer::default();
    if let Some(text) = last("--topology-manager-policy") {
        let policy = parse_policy("--topology-manager-policy", &text).map_err(err)?;
        layer.policy = Some(at(policy, &source));
    }
    if let Some(text) = last("--topology-manager-scope") {
        let scope = parse_scope("--topology-manager-scope", &text).map_err(err)?;
        layer.scope = Some(at(scope, &source));
    }
    const OPTIONS: &str = "--topology-manager-policy-options";
    if let Some(options) = map(OPTIONS).map_err(err)? {
        // Read as the Topology Manager reads them, when it does (`topologymanager::manager`).
        layer.options = Some(at(options, &source));
    }
    if let Some(text) = last("--memory-manager-policy") {
        let policy = parse_memory_manager_policy("--memory-manager-policy", &text).map_err(err)?;
        layer.memory_manager_policy = Some(at(policy, &source));
    }
    if let Some(all) = values.get("--reserved-memory") {
        layer.reserved_memory = Some(at(reserved_memory(all).map_err(err)?, &source));
    }
    for (flag, slot) in [
        ("--system-reserved", &mut layer.system_reserved),
        ("--kube-reserved", &mut layer.kube_reserved),
    ] {
        if let Some(value) = map(flag).map_err(err)? {
            *slot = Some(at(value, &source));
        }
    }
    for text in values.get("--feature-gates").into_iter().flatten() {
        for (gate, on) in parse_gates("--feature-gates", text).map_err(err)? {
            layer.gates.insert(gate, at(on, &source));
        }
    }
    Ok(KubeletCmdline {
        config: last("--config"),
        config_dir: last("--config-dir"),
        layer,
    })
}

/// `--reserved-memory` values: `0:memory=1Gi,hugepages-1Gi=2Gi`, nodes also separated by `;`.
pub fn reserved_memory(values: &[String]) -> Result<ReservedMemory, LayerError> {
    const FLAG: &str = "--reserved-memory";
    let mut reserved = ReservedMemory::new();
    for entry in values
        .iter()
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let syntax = || LayerError {
            field: FLAG.to_owned(),
            detail: format!(
                "{entry:?}: expected <numa node>:<type>=<quantity>[,<type>=<quantity>…], e.g. 0:memory=1Gi,hugepages-1Gi=2Gi"
            ),
        };
        let (node, limits) = entry.split_once(':').ok_or_else(syntax)?;
        let node: usize = node.trim().parse().map_err(|_| syntax())?;
        for limit in limits.split(',') {
            let (name, amount) = limit.split_once('=').ok_or_else(syntax)?;
            reserve(&mut reserved, FLAG, node, name.trim(), amount.trim())?;
        }
    }
    Ok(reserved)
}
