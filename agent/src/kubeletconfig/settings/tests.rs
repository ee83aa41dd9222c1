use std::path::Path;

use super::*;
use crate::kubeletconfig::{cmdline, file};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn fixture(name: &str) -> file::ConfigFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/kubeletconfig/testdata")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture");
    file::parse(Path::new(name), &text).expect("a valid KubeletConfiguration")
}

fn resolve(layers: &[&Layer]) -> KubeletSettings {
    KubeletSettings::resolve(layers)
}

fn file_layer(files: &[&str]) -> Layer {
    let mut parsed: Vec<file::ConfigFile> = files.iter().map(|f| fixture(f)).collect();
    let base = parsed.remove(0);
    file::merge(Some(&base), &parsed).expect("merge")
}

fn args(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_owned).collect()
}

#[test]
fn nothing_found_is_the_kubelets_defaults_not_the_agents_old_ones() {
    let s = resolve(&[]);
    assert_eq!(s.policy.value, Policy::None);
    assert_eq!(s.scope.value, Scope::Container);
    assert_eq!(s.memory_manager_policy.value, MemoryManagerPolicy::None);
    assert!(s.reserved_memory.value.is_empty());
    assert_eq!(s.policy.source, Source::KubeletDefault);
    // The one default that is the agent's: verification on, saying why.
    assert!(s.verification());
    assert_eq!(
        s.gates[VERIFICATION_GATE].source,
        Source::AgentDefault(VERIFICATION_DEFAULT_WHY)
    );
    assert_eq!(s.feature_gates(), FeatureGates::default());
}

#[test]
fn kubeadms_file_sets_every_field_it_names() {
    let s = resolve(&[&file_layer(&["kubeadm-config.yaml"])]);
    let from = Source::File("kubeadm-config.yaml".into());
    assert_eq!(s.policy.value, Policy::SingleNumaNode);
    assert_eq!(s.policy.source, from);
    assert_eq!(s.scope.value, Scope::Pod);
    assert_eq!(s.memory_manager_policy.value, MemoryManagerPolicy::Static);
    let two = NumaInfo::new(
        vec![0, 1],
        BTreeMap::from([(0, vec![10, 20]), (1, vec![20, 10])]),
    )
    .expect("two nodes");
    let options = s.start(s.policy.value, &two).expect("the kubelet starts");
    assert!(options.prefer_closest_numa_nodes);
    assert_eq!(
        s.reserved_memory.value,
        ReservedMemory::from([
            (0, BTreeMap::from([("memory".to_owned(), 1124 * MI)])),
            (
                1,
                BTreeMap::from([("memory".to_owned(), GI), ("hugepages-2Mi".to_owned(), 0)])
            ),
        ])
    );
    assert_eq!(s.kube_reserved.value["memory"], "1Gi");
    assert_eq!(s.system_reserved.value["memory"], "1Gi");
    assert!(s.verification());
    assert_eq!(s.gates[VERIFICATION_GATE].source, from);
    let rows = s.rows();
    assert_eq!(
        rows["reservedMemory"].value,
        "0:memory=1124Mi;1:hugepages-2Mi=0,memory=1Gi"
    );
    assert_eq!(
        rows["topologyManagerPolicyOptions"].value,
        "prefer-closest-numa-nodes=true"
    );
    assert_eq!(
        rows["topologyManagerPolicy"].source,
        "file kubeadm-config.yaml"
    );
}

#[test]
fn eks_files_keep_the_kubelets_defaults_and_ignore_gates_not_mirrored() {
    for name in ["eks-al2-kubelet-config.json", "eks-al2023/config.json"] {
        let s = resolve(&[&file_layer(&[name])]);
        assert_eq!(s.policy.value, Policy::None, "{name}");
        assert_eq!(s.memory_manager_policy.source, Source::KubeletDefault);
        assert!(s.verification(), "{name}");
        assert!(!s.gates["PodLevelResources"].value);
    }
    let s = resolve(&[&file_layer(&["eks-al2023/config.json"])]);
    assert_eq!(s.kube_reserved.value["memory"], "893Mi");
}

#[test]
fn a_drop_in_overrides_the_one_field_it_sets_in_the_kubelets_order() {
    let s = resolve(&[&file_layer(&[
        "eks-al2023/config.json",
        "eks-al2023/config.json.d/40-nodeadm.conf",
        "eks-al2023/config.json.d/50-numa.conf",
    ])]);
    assert_eq!(s.policy.value, Policy::SingleNumaNode);
    assert_eq!(
        s.policy.source,
        Source::DropIn("eks-al2023/config.json.d/50-numa.conf".into())
    );
    // Everything else stays the base file's (or the kubelet's default).
    assert_eq!(
        s.kube_reserved.source,
        Source::File("eks-al2023/config.json".into())
    );
    assert_eq!(s.scope.source, Source::KubeletDefault);
}

#[test]
fn drop_ins_merge_objects_key_by_key_replace_lists_and_null_removes() {
    let parse = |name: &str, text: &str| file::parse(Path::new(name), text).expect(name);
    let base = parse(
        "base.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         featureGates: {PodLevelResources: true, MemoryManagerHugepagesVerification: false}\n\
         systemReserved: {memory: 1Gi, cpu: 500m}\n\
         reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}, {numaNode: 1, limits: {memory: 1Gi}}]\n\
         topologyManagerScope: pod\n",
    );
    let drop_in = parse(
        "10-a.conf",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         featureGates: {MemoryManagerHugepagesVerification: true}\n\
         systemReserved: {memory: 2Gi}\n\
         reservedMemory: [{numaNode: 1, limits: {memory: 2Gi}}]\n\
         topologyManagerScope: null\n",
    );
    let s = resolve(&[&file::merge(Some(&base), &[drop_in]).expect("merge")]);
    assert!(s.gates["PodLevelResources"].value, "kept from the base");
    assert!(s.verification(), "replaced by the drop-in");
    assert_eq!(
        s.system_reserved.value,
        BTreeMap::from([
            ("cpu".to_owned(), "500m".to_owned()),
            ("memory".to_owned(), "2Gi".to_owned())
        ])
    );
    assert_eq!(
        s.reserved_memory.value,
        ReservedMemory::from([(1, BTreeMap::from([("memory".to_owned(), 2 * GI)]))])
    );
    assert_eq!(
        (s.scope.value, &s.scope.source),
        (Scope::Container, &Source::KubeletDefault)
    );
}

#[test]
fn the_kubelets_command_line_wins_over_its_file_and_the_agents_flags_over_both() {
    let files = file_layer(&["kubeadm-config.yaml"]);
    let line = cmdline::parse(
        7,
        &args(
            "--config=/var/lib/kubelet/config.yaml --v=2 --topology-manager-policy best-effort \
             --feature-gates=PodLevelResources=true,KubeletTracing=false \
             --feature-gates MemoryManagerHugepagesVerification=false \
             --reserved-memory 0:memory=1Gi --reserved-memory 1:memory=512Mi;2:hugepages-1Gi=1Gi \
             --system-reserved=cpu=1 --system-reserved=memory=2Gi",
        ),
    )
    .expect("command line");
    assert_eq!(line.config.as_deref(), Some("/var/lib/kubelet/config.yaml"));
    assert_eq!(line.config_dir, None);
    let s = resolve(&[&files, &line.layer]);
    let cmdline = Source::KubeletCmdline { pid: 7 };
    assert_eq!(
        (s.policy.value, &s.policy.source),
        (Policy::BestEffort, &cmdline)
    );
    assert_eq!(s.scope.value, Scope::Pod, "the file's, not overridden");
    assert!(
        !s.verification(),
        "an explicit false turns verification off"
    );
    assert_eq!(s.gates[VERIFICATION_GATE].source, cmdline);
    assert!(s.feature_gates().pod_level_resources);
    assert_eq!(s.reserved_memory.value[&1]["memory"], 512 * MI);
    assert_eq!(s.reserved_memory.value[&2]["hugepages-1Gi"], GI);
    assert_eq!(s.system_reserved.value.len(), 2, "map flags add up");
    let flags = Layer {
        policy: Some(Sourced {
            value: Policy::Restricted,
            source: Source::Flag("--topology-policy"),
        }),
        ..Layer::default()
    };
    let s = resolve(&[&files, &line.layer, &flags]);
    assert_eq!(s.policy.value, Policy::Restricted);
    assert_eq!(
        s.rows()["topologyManagerPolicy"].source,
        "flag --topology-policy"
    );
    assert_eq!(
        s.rows()["topologyManagerScope"].source,
        "file kubeadm-config.yaml"
    );
}

#[test]
fn a_known_field_with_a_wrong_type_or_value_names_the_file_and_the_field() {
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let cases = [
        (
            "topologyManagerPolicy: 3\n",
            "topologyManagerPolicy: expected a string, found a number",
        ),
        (
            "topologyManagerPolicy: strict\n",
            "topologyManagerPolicy: \"strict\" is not one of",
        ),
        (
            "topologyManagerScope: node\n",
            "topologyManagerScope: \"node\" is not container or pod",
        ),
        (
            "memoryManagerPolicy: static\n",
            "memoryManagerPolicy: \"static\" is not None or Static",
        ),
        (
            "featureGates: {PodLevelResources: yes-please}\n",
            "featureGates.PodLevelResources: expected a boolean, found a string",
        ),
        (
            "featureGates: [PodLevelResources]\n",
            "featureGates: expected an object, found a list",
        ),
        (
            "reservedMemory: {numaNode: 0}\n",
            "reservedMemory: expected a list, found an object",
        ),
        (
            "reservedMemory: [{limits: {memory: 1Gi}}]\n",
            "reservedMemory[0].numaNode: expected a NUMA node number",
        ),
        (
            "reservedMemory: [{numaNode: 0, limits: {memory: lots}}]\n",
            "reservedMemory[0].limits.memory:",
        ),
        (
            "reservedMemory: [{numaNode: 0, limits: {cpu: 1}}]\n",
            "reservedMemory[0].limits.cpu: unknown memory type \"cpu\"",
        ),
        (
            "systemReserved: {memory: [1Gi]}\n",
            "systemReserved.memory: expected a string, found a list",
        ),
        (
            "topologyManagerPolicyOptions: [best-guess]\n",
            "topologyManagerPolicyOptions: expected an object, found a list",
        ),
    ];
    for (body, expected) in cases {
        let err = file::parse(Path::new("/etc/kubelet.yaml"), &format!("{head}{body}"))
            .expect_err(body)
            .to_string();
        assert!(err.starts_with("/etc/kubelet.yaml: "), "{err}");
        assert!(err.contains(expected), "{body}: {err}");
    }
    let err = file::parse(Path::new("/k.yaml"), "kind: KubeletConfiguration\n: : :\n")
        .expect_err("syntax")
        .to_string();
    assert!(err.starts_with("/k.yaml: not YAML or JSON"), "{err}");
    let err = file::parse(Path::new("/k.yaml"), "apiVersion: v1\nkind: Pod\n")
        .expect_err("kind")
        .to_string();
    assert!(
        err.contains("apiVersion is \"v1\", expected \"kubelet.config.k8s.io/v1beta1\""),
        "{err}"
    );
    let err = file::parse(Path::new("/k.yaml"), "[1, 2]")
        .expect_err("list")
        .to_string();
    assert_eq!(
        err,
        "/k.yaml: expected a KubeletConfiguration object, found a list"
    );
    // Unknown fields are ignored, as the kubelet's lenient decoding ignores them.
    file::parse(
        Path::new("/k.yaml"),
        &format!("{head}someFutureField: {{a: 1}}\n"),
    )
    .expect("unknown fields ignored");
}

#[test]
fn bad_command_line_values_name_the_pid_and_the_flag() {
    for (line, expected) in [
        (
            "--topology-manager-policy",
            "the kubelet (pid 9) command line: --topology-manager-policy has no value",
        ),
        (
            "--topology-manager-scope=node",
            "the kubelet (pid 9) command line: --topology-manager-scope: \"node\" is not container or pod",
        ),
        (
            "--reserved-memory=memory=1Gi",
            "the kubelet (pid 9) command line: --reserved-memory: \"memory=1Gi\": expected",
        ),
        (
            "--feature-gates=PodLevelResources=maybe",
            "--feature-gates: PodLevelResources=maybe: not true or false",
        ),
    ] {
        let err = cmdline::parse(9, &args(line)).expect_err(line).to_string();
        assert!(err.contains(expected), "{line}: {err}");
    }
    // Arguments after `--` and flags not read are skipped.
    let line = cmdline::parse(
        9,
        &args("--node-ip=10.0.0.1 -v 2 -- --topology-manager-policy=bogus"),
    )
    .expect("skipped");
    assert_eq!(line.layer, Layer::default());
}

/// Found writing the `kubelet_cmdline` and `kubelet_config` fuzz targets (and reproduced on
/// their build, which checks overflow): amounts reserved twice for one node and type were added
/// unchecked, which panics with overflow checks and wraps around without them.
#[test]
fn reserved_amounts_that_add_up_past_u64_are_refused_naming_the_field() {
    let err = cmdline::parse(
        9,
        &args("--reserved-memory=0:memory=10Ei --reserved-memory 0:memory=10Ei"),
    )
    .expect_err("20 EiB")
    .to_string();
    assert_eq!(
        err,
        "the kubelet (pid 9) command line: --reserved-memory: memory reserved on NUMA node 0 adds up to more than 2^64-1 bytes"
    );
    let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
        reservedMemory: [{numaNode: 1, limits: {hugepages-2Mi: 10Ei}}, \
        {numaNode: 1, limits: {hugepages-2048Ki: 10Ei}}]\n";
    let err = file::parse(Path::new("/k.yaml"), text)
        .expect_err("20 EiB")
        .to_string();
    assert_eq!(
        err,
        "/k.yaml: reservedMemory[1].limits.hugepages-2048Ki: hugepages-2048Ki reserved on NUMA node 1 adds up to more than 2^64-1 bytes"
    );
    let line = cmdline::parse(9, &args("--reserved-memory=0:memory=8Ei;0:memory=8191Pi"))
        .expect("less than 16 EiB");
    let reserved = line.layer.reserved_memory.expect("reserved memory").value;
    assert_eq!(reserved[&0]["memory"], (1 << 63) + (8191 << 50));
}
