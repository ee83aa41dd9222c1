//! What the tests of `deploy/` share: the oldest and newest Kubernetes the manifests are
//! validated against and the validation (`kubernetes-validate --strict`), CEL as kube-apiserver
//! evaluates admission expressions (PyPI's `cel-expr-python`, the CEL team's wrapper of its C++
//! implementation), the field names of kube-scheduler's configuration types, and the webhook's
//! Deployment arguments read by the command's own parser.

use std::process::{Command, Stdio};

use clap::Parser;
use hugepage_agent::{
    config::{Cli, Command as AgentCommand, Config},
    webhook::Settings,
};
use serde_json::{Value, json};

use crate::{
    peers::{kubernetes_validate, validate_python},
    rendered::{AgentPod, Rendered},
};

/// The oldest Kubernetes the manifests support (volume mounts' `recursiveReadOnly` first appears
/// in 1.30) and the newest the validator knows.
pub const OLDEST: &str = "1.30.0";
pub const NEWEST: &str = "1.37.0";

/// `kubernetes-validate --strict` of a rendering for `version`: (passed, its report).
pub fn validate(rendered: &Rendered, version: &str) -> (bool, String) {
    let file = tempfile::Builder::new()
        .prefix("hugepage-agent-rendered-")
        .suffix(".yaml")
        .tempfile()
        .expect("a temporary file");
    std::fs::write(file.path(), &rendered.yaml).expect("write the rendering");
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", version])
        .arg(file.path())
        .output()
        .expect("run kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}

/// The webhook's Deployment arguments read by the command's own parser (`hugepage-agent
/// webhook …` as the container runs it): the configuration and the webhook's settings.
pub fn webhook_command(webhook: &AgentPod) -> Settings {
    let argv = std::iter::once("hugepage-agent").chain(webhook.args.iter().map(String::as_str));
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("the Deployment's arguments {:?}: {e}", webhook.args));
    let config = Config::try_from(cli).unwrap_or_else(|e| panic!("{:?}: {e}", webhook.args));
    let AgentCommand::Webhook(settings) = config.command else {
        panic!("not the webhook: {:?}", webhook.args);
    };
    *settings
}

/// The CEL environment of admission matchConditions as kube-apiserver declares it
/// (k8s.io/apiserver/pkg/admission/plugin/cel/compile.go: `object` and `oldObject` are dynamic),
/// evaluating each expression on each object: per expression `{"results": [{"value": …} |
/// {"error": …}]}`, or `{"compileError": …}`. `JSONPatch` (a MutatingAdmissionPolicy's patch
/// type, k8s.io/apiserver/pkg/cel/mutation: `op`, `path`, `from` text and `value` of any type)
/// is declared as a protobuf message, its `value` a `google.protobuf.Value`.
pub const CEL: &str = r#"
import json, sys
from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2
F = descriptor_pb2.FieldDescriptorProto
pool = descriptor_pool.DescriptorPool()
pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
patch = descriptor_pb2.FileDescriptorProto(
    name="jsonpatch.proto", syntax="proto3", dependency=["google/protobuf/struct.proto"])
message = patch.message_type.add(name="JSONPatch")
for number, name in enumerate(["op", "path", "from"], start=1):
    message.field.add(name=name, number=number, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
message.field.add(name="value", number=4, type=F.TYPE_MESSAGE,
                  type_name=".google.protobuf.Value", label=F.LABEL_OPTIONAL)
pool.Add(patch)
spec = json.load(sys.stdin)
env = cel.NewEnv(descriptor_pool=pool, variables={
    "object": cel.Type.DYN, "oldObject": cel.Type.DYN, "request": cel.Type.DYN})
out = []
for expression in spec["expressions"]:
    try:
        compiled = env.compile(expression)
    except Exception as e:
        out.append({"compileError": str(e)})
        continue
    results = []
    for obj in spec["objects"]:
        try:
            value = compiled.eval(data={
                "object": obj, "oldObject": None, "request": {"operation": "CREATE"}})
        except Exception as e:
            results.append({"error": str(e)})
            continue
        if value.type() == cel.Type.ERROR:
            results.append({"error": str(value.value())})
            continue
        try:
            results.append({"value": value.plain_value()})
        except Exception as e:
            results.append({"error": repr(e)})
    out.append({"results": results})
json.dump(out, sys.stdout)
"#;

/// Each expression evaluated on each object by CEL.
pub fn cel(expressions: &[&str], objects: &[Value]) -> Vec<Value> {
    let mut child = Command::new(validate_python())
        .args(["-c", CEL])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the validator venv's Python (cargo xtask setup installs cel-expr-python)");
    std::io::Write::write_all(
        &mut child.stdin.take().expect("stdin"),
        json!({"expressions": expressions, "objects": objects})
            .to_string()
            .as_bytes(),
    )
    .expect("send the expressions");
    let out = child.wait_with_output().expect("CEL's answer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("JSON from the CEL script")
}

/// Whether all of `conditions` hold for each of `objects`, as the API server's matchConditions
/// decide. Panics on a compile or evaluation error, which the API server would not take for a
/// match or a miss but follow the failurePolicy for: none may occur.
pub fn all_hold(conditions: &[&str], objects: &[Value]) -> Vec<bool> {
    let answers = cel(conditions, objects);
    assert_eq!(answers.len(), conditions.len());
    (0..objects.len())
        .map(|i| {
            answers.iter().zip(conditions).all(|(answer, condition)| {
                answer["results"][i]["value"]
                    .as_bool()
                    .unwrap_or_else(|| panic!("object {i}: {condition}: {answer}"))
            })
        })
        .collect()
}

/// A pod as the API server hands it to admission (defaults applied: every container has
/// `resources`, possibly empty), with `containers` and optional `initContainers` resources.
pub fn pod(node: Option<&str>, containers: &[&Value], init: &[&Value]) -> Value {
    let container = |(i, resources): (usize, &&Value)| json!({"name": format!("c{i}"), "image": "app", "resources": resources});
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "p"}},
        "spec": {
            "containers": containers.iter().enumerate().map(container).collect::<Vec<_>>(),
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
        },
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if !init.is_empty() {
        pod["spec"]["initContainers"] = init.iter().enumerate().map(container).collect();
    }
    pod
}

/// The JSON tags of kube-scheduler's configuration types, as read in kubernetes/kubernetes
/// `staging/src/k8s.io/kube-scheduler/config/v1/types.go` (commit 08ced910cf7f): `Extender`,
/// `ExtenderTLSConfig`, and `KubeSchedulerConfiguration` with its `metav1.TypeMeta` and inlined
/// `DebuggingConfiguration`, and `ClientConnectionConfiguration` from
/// `staging/src/k8s.io/component-base/config/v1alpha1/types.go` (commit 01e8d0dd52a8).
/// kube-scheduler decodes its file strictly: an unknown or misspelled field stops it.
pub const EXTENDER_FIELDS: [&str; 12] = [
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
];
pub const EXTENDER_TLS_FIELDS: [&str; 8] = [
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
];
pub const CONFIGURATION_FIELDS: [&str; 14] = [
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "percentageOfPlacementsToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
];
pub const CLIENT_CONNECTION_FIELDS: [&str; 5] = [
    "kubeconfig",
    "acceptContentTypes",
    "contentType",
    "qps",
    "burst",
];

/// `KubeSchedulerProfile` of `k8s.io/kube-scheduler/config/v1`.
pub const PROFILE_FIELDS: [&str; 4] = [
    "schedulerName",
    "percentageOfNodesToScore",
    "plugins",
    "pluginConfig",
];
/// `LeaderElectionConfiguration` of `k8s.io/component-base/config/v1alpha1`.
pub const LEADER_ELECTION_FIELDS: [&str; 7] = [
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
];

/// The keys of a JSON object that are not among `known`.
pub fn unknown_fields(object: &Value, known: &[&str]) -> Vec<String> {
    object
        .as_object()
        .expect("an object")
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect()
}
