//! What the `kubelet_config` and `kubelet_cmdline` targets share: the settings printed as the
//! agent shows them (`KubeletSettings::rows`, the `GET /v1/kubelet` values, in the kubelet's
//! flag syntax) and read back as a kubelet command line give the same settings.

use std::collections::BTreeMap;

use hugepage_agent::kubeletconfig::{cmdline, settings::KubeletSettings};

/// The row of each `KubeletConfiguration` field and the kubelet flag that sets it.
const FLAGS: [(&str, &str); 7] = [
    ("topologyManagerPolicy", "--topology-manager-policy"),
    ("topologyManagerScope", "--topology-manager-scope"),
    (
        "topologyManagerPolicyOptions",
        "--topology-manager-policy-options",
    ),
    ("memoryManagerPolicy", "--memory-manager-policy"),
    ("reservedMemory", "--reserved-memory"),
    ("systemReserved", "--system-reserved"),
    ("kubeReserved", "--kube-reserved"),
];

/// Whether a map's pairs can be written as a map flag's `k=v,k2=v2` (which splits at commas and
/// the first `=`, and trims): a file's YAML map can hold keys and values no flag can.
fn flag_safe(map: &BTreeMap<String, String>) -> bool {
    map.iter()
        .all(|(k, v)| !k.contains([',', '=']) && !v.contains(',') && k.trim() == k && v.trim() == v)
}

/// Every value, sources left out.
fn values(s: &KubeletSettings) -> impl PartialEq + std::fmt::Debug + '_ {
    let gates: BTreeMap<&str, bool> = s.gates.iter().map(|(g, v)| (*g, v.value)).collect();
    (
        (s.policy.value, s.scope.value, &s.options.value),
        (s.memory_manager_policy.value, &s.reserved_memory.value),
        (&s.system_reserved.value, &s.kube_reserved.value),
        gates,
    )
}

/// Prints `settings` as flags, reads them back as the kubelet's command line, and asserts the
/// same settings come out (when every map is [`flag_safe`]).
pub fn round_trip(settings: &KubeletSettings) {
    let maps = [
        &settings.options.value,
        &settings.system_reserved.value,
        &settings.kube_reserved.value,
    ];
    if !maps.into_iter().all(flag_safe) {
        return;
    }
    let rows = settings.rows();
    let mut args: Vec<String> = FLAGS
        .iter()
        .map(|(field, flag)| format!("{flag}={}", rows[*field].value))
        .collect();
    let gates: Vec<String> = rows
        .iter()
        .filter_map(|(k, row)| {
            Some(format!(
                "{}={}",
                k.strip_prefix("featureGates.")?,
                row.value
            ))
        })
        .collect();
    args.push(format!("--feature-gates={}", gates.join(",")));
    let line = cmdline::parse(1, &args)
        .unwrap_or_else(|e| panic!("the settings as printed are refused: {e}\n{args:#?}"));
    let again = KubeletSettings::resolve(&[&line.layer]);
    assert_eq!(
        values(&again),
        values(settings),
        "printed and read back, the settings changed\n{args:#?}"
    );
}
