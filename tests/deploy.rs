//! The manifests of `deploy/`, rendered by `kubectl kustomize` as an operator would apply them:
//! valid against the official Kubernetes schemas (`kubernetes-validate --strict`, PyPI) for the
//! oldest and the newest Kubernetes supported, the custom resources against their CRD schemas
//! (`@kubernetes-models`, npm), the PrometheusRule equal to `dashboards/alerts.yaml` and passing
//! promtool, the dashboard's ConfigMap the dashboard byte for byte, and the DaemonSet's least
//! privilege and wiring (arguments, mounts, probes, ports, network policy) consistent. The
//! webhook's component the same way: its Deployment's arguments read by the command's own parser
//! and compared with the ValidatingWebhookConfiguration, the Service, the RBAC, the certificates
//! and kube-scheduler's extender configuration (whose field names are checked against the
//! upstream Go types), and the configuration's CEL matchConditions evaluated by CEL (PyPI's
//! `cel-expr-python`, the CEL team's wrapper of its C++ implementation). Nothing here changes the
//! host; `tests/daemonset.rs` runs the agent under what these manifests declare.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use hugepage_agent::{quantity::parse_bytes, webhook::FailurePolicy};
use hugepage_agent_tests::{
    manifests::{
        CLIENT_CONNECTION_FIELDS, CONFIGURATION_FIELDS, EXTENDER_FIELDS, EXTENDER_TLS_FIELDS,
        NEWEST, OLDEST, all_hold, cel, pod, unknown_fields, validate, webhook_command,
    },
    peers::{crd_models, promtool, workspace},
    rendered::{AgentPod, Rendered, Source, WEBHOOK, render, yaml_documents},
};
use serde_json::{Value, json};

/// Every optional component but the MutatingAdmissionPolicy (Kubernetes 1.36 and later:
/// tests/scheduler.rs validates it).
const COMPONENTS: [&str; 10] = [
    "psi-triggers",
    "prometheus-operator",
    "grafana-dashboard",
    "cert-manager",
    "webhook",
    "scheduler",
    "scheduler-by-default-webhook",
    "webhook-client-auth",
    "webhook-fixed-clusterip",
    "kubelet-serving-identity",
];
/// The kinds kubernetes-validate has no schema for, checked against their CRDs instead.
const CUSTOM_KINDS: [&str; 4] = ["PodMonitor", "PrometheusRule", "Issuer", "Certificate"];

#[test]
fn every_rendering_validates_strictly_for_the_oldest_and_newest_kubernetes() {
    let mut renderings = vec![(vec![], render(&[]))];
    renderings.push((COMPONENTS.to_vec(), render(&COMPONENTS)));
    for one in [
        "psi-triggers",
        "eks-kubelet-config",
        "gke-kubelet-config",
        "realtime-map-thread",
        "holders",
        "webhook",
    ] {
        renderings.push((vec![one], render(&[one])));
    }
    for (components, rendered) in &renderings {
        for version in [OLDEST, NEWEST] {
            let (ok, report) = validate(rendered, version);
            assert!(ok, "{components:?} against {version}:\n{report}");
            let short = &version[..version.rfind('.').unwrap_or(version.len())];
            for document in &rendered.documents {
                let kind = document["kind"].as_str().expect("a kind");
                let name = document["metadata"]["name"].as_str().expect("a name");
                let checked = format!(
                    "passed for resource {}/{name} against version {short}",
                    kind.to_lowercase()
                );
                let unknown = format!("Couldn't find schema for kind {kind} ");
                if CUSTOM_KINDS.contains(&kind) {
                    assert!(report.contains(&unknown), "{kind}: {report}");
                } else {
                    assert!(
                        report.contains(&checked),
                        "{kind}/{name} not validated: {report}"
                    );
                }
            }
        }
    }
    // The floor is real: the version before the oldest does not know recursiveReadOnly.
    let (ok, report) = validate(&renderings[0].1, "1.29.0");
    assert!(
        !ok && report.contains("'recursiveReadOnly' was unexpected"),
        "{report}"
    );
}

#[test]
fn the_custom_resources_validate_against_their_crd_schemas() {
    let rendered = render(&COMPONENTS);
    let custom: Vec<&Value> = rendered
        .documents
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| CUSTOM_KINDS.contains(&k))
        })
        .collect();
    assert_eq!(custom.len(), 11, "{:?}", rendered.names());
    let script = r#"
import * as po from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import * as cm from '@kubernetes-models/cert-manager/cert-manager.io/v1';
const models = {'monitoring.coreos.com/v1': po, 'cert-manager.io/v1': cm};
let input = '';
for await (const chunk of process.stdin) input += chunk;
for (const doc of JSON.parse(input)) {
  const Model = models[doc.apiVersion]?.[doc.kind];
  const name = doc.kind + '/' + doc.metadata.name;
  if (!Model) { console.log('no model for ' + name); process.exitCode = 1; continue; }
  try { new Model(doc).validate(); console.log('valid ' + name); }
  catch (e) { console.log('invalid ' + name + ': ' + e.message); process.exitCode = 1; }
}
"#;
    let mut node = Command::new("node")
        .args(["--input-type=module", "-e", script])
        .current_dir(crd_models())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node (cargo xtask setup installs it)");
    std::io::Write::write_all(
        &mut node.stdin.take().expect("stdin"),
        serde_json::to_string(&custom).expect("JSON").as_bytes(),
    )
    .expect("send the documents");
    let out = node.wait_with_output().expect("node's answer");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        report.lines().filter(|l| l.starts_with("valid ")).count(),
        11,
        "{report}"
    );
    // And the models do refuse what does not fit (a type the CRD does not allow).
    let mut wrong = rendered.find("PodMonitor", "hugepage-agent").clone();
    wrong["spec"]["selector"] = json!("everything");
    let mut node = Command::new("node")
        .args(["--input-type=module", "-e", script])
        .current_dir(crd_models())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run node");
    std::io::Write::write_all(
        &mut node.stdin.take().expect("stdin"),
        json!([wrong]).to_string().as_bytes(),
    )
    .expect("send the document");
    let out = node.wait_with_output().expect("node's answer");
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_prometheus_rule_is_the_alert_rules_and_passes_promtool() {
    let rendered = render(&["prometheus-operator", "webhook"]);
    let rule = rendered.find("PrometheusRule", "hugepage-agent");
    let rules_text = std::fs::read_to_string(workspace().join("dashboards/alerts.yaml"))
        .expect("dashboards/alerts.yaml");
    let rules = &hugepage_agent_tests::rendered::yaml_documents(&rules_text)[0];
    assert_eq!(&rule["spec"], rules, "regenerate it: cargo xtask manifests");
    let file = tempfile::Builder::new()
        .prefix("hugepage-agent-rule-")
        .suffix(".json")
        .tempfile()
        .expect("a temporary file");
    std::fs::write(file.path(), rule["spec"].to_string()).expect("write the spec");
    let path = file.path().to_str().expect("a UTF-8 path");
    let (ok, out) = promtool(&["check", "rules", path], "");
    assert!(ok && out.contains("SUCCESS: 16 rules found"), "{out}");

    let monitor = rendered.find("PodMonitor", "hugepage-agent");
    let agent = rendered.agent();
    let labels = &agent_template(&rendered)["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            &labels[key], value,
            "the PodMonitor selects the agent's pods"
        );
    }
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    agent.port(endpoint["port"].as_str().expect("a port name"));
    assert_eq!(endpoint["relabelings"][0]["targetLabel"], "node");
    assert_eq!(monitor["metadata"]["namespace"], "hugepage-agent");
    assert_eq!(rule["metadata"]["namespace"], "hugepage-agent");

    // The webhook's PodMonitor: its pods alone, on the plain port --metrics-listen binds.
    let monitor = rendered.find("PodMonitor", WEBHOOK);
    let deployment = rendered.find("Deployment", WEBHOOK);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    assert!(selects(selector, labels), "{selector}");
    assert!(!selects(
        selector,
        &agent_template(&rendered)["metadata"]["labels"]
    ));
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    let webhook = rendered.webhook();
    let metrics = webhook.arg("--metrics-listen").expect("--metrics-listen");
    assert!(
        metrics.ends_with(&format!(":{}", webhook.port("metrics"))),
        "{metrics}"
    );
    assert_eq!(
        monitor["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
}

fn agent_template(rendered: &Rendered) -> &Value {
    &rendered.find("DaemonSet", "hugepage-agent")["spec"]["template"]
}

#[test]
fn the_dashboard_configmap_is_the_dashboard_byte_for_byte() {
    let rendered = render(&["grafana-dashboard"]);
    let map = rendered.find("ConfigMap", "hugepage-agent-dashboard");
    let dashboard = std::fs::read_to_string(workspace().join("dashboards/hugepage-agent.json"))
        .expect("the dashboard");
    assert_eq!(map["data"]["hugepage-agent.json"], dashboard.as_str());
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(map["metadata"]["namespace"], "hugepage-agent");
}

#[test]
fn the_daemonset_grants_only_what_the_agent_needs() {
    let rendered = render(&[]);
    let agent = rendered.agent();
    let pod = &agent.pod;
    let security = &agent.container["securityContext"];
    assert_eq!(agent.capabilities, ["BPF", "PERFMON"]);
    assert_eq!(agent.drop, ["ALL"]);
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    for shared in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[shared].is_null() || pod[shared] == false, "{shared}");
    }
    assert_eq!(pod["automountServiceAccountToken"], false);
    let account = rendered.find("ServiceAccount", "hugepage-agent");
    assert_eq!(account["automountServiceAccountToken"], false);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let namespace = rendered.find("Namespace", "hugepage-agent");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );

    // Host paths are read-only under --host-root, but for the state directory; the
    // psi-triggers component makes the cgroup hierarchy and /proc/pressure writable.
    let host_root = agent.arg("--host-root").expect("--host-root");
    let state = agent.arg("--state-dir").expect("--state-dir");
    let writable = |agent: &AgentPod| -> Vec<String> {
        agent
            .mounts
            .iter()
            .filter(|m| !m.read_only)
            .map(|m| m.path.clone())
            .collect()
    };
    assert_eq!(writable(&agent), [state]);
    assert_eq!(
        writable(&render(&["psi-triggers"]).agent()),
        ["/host/sys/fs/cgroup", state, "/host/proc/pressure"]
    );
    // No host path the base mounts is one that some node kind lacks: a file of a cgroup
    // layout, or /proc/pressure (absent where PSI is off). tests/daemonset.rs starts the
    // rendered DaemonSet on v1, v2 and hybrid hierarchies under the kubelet's type check.
    for mount in &agent.mounts {
        if let Source::HostPath { path, kind } = &mount.source {
            assert!(
                kind != "File" && !path.starts_with("/sys/fs/cgroup/") && path != "/proc/pressure",
                "{mount:?}"
            );
        }
    }
    for mount in &agent.mounts {
        match &mount.source {
            Source::HostPath { path, .. } if mount.path.starts_with(host_root) => {
                assert_eq!(
                    mount.path,
                    format!("{host_root}{path}"),
                    "the host's {path} is where --host-root puts it"
                );
            }
            Source::HostPath { path, .. } => {
                assert!(
                    [state, "/sys/kernel/tracing"].contains(&mount.path.as_str())
                        && mount.path == *path,
                    "{mount:?}"
                );
            }
            Source::Secret { .. } => assert!(mount.read_only),
        }
    }
    // The kubelet replaces its checkpoint by a rename: its directory is mounted, not the file.
    let kubelet = agent.mount("/host/var/lib/kubelet");
    assert_eq!(
        kubelet.source,
        Source::HostPath {
            path: "/var/lib/kubelet".into(),
            kind: "Directory".into()
        }
    );
    assert!(kubelet.read_only);
    // The node's kubelet settings: its process in the host's /proc, read-only, and no policy
    // flag of the agent's (they would override the kubelet's on every node alike).
    let proc = agent.mount("/host/proc");
    assert_eq!(
        (&proc.source, proc.read_only),
        (
            &Source::HostPath {
                path: "/proc".into(),
                kind: "Directory".into()
            },
            true
        )
    );
    for flag in [
        "--topology-policy",
        "--topology-policy-options",
        "--topology-scope",
        "--memory-manager-policy",
        "--reserved-memory",
        "--feature-gates",
        "--verification",
        "--kubelet-config",
    ] {
        assert_eq!(agent.arg(flag), None, "{flag}");
    }
    for (component, path, kind) in [
        ("eks-kubelet-config", "/etc/kubernetes/kubelet", "Directory"),
        (
            "gke-kubelet-config",
            "/home/kubernetes/kubelet-config.yaml",
            "File",
        ),
    ] {
        let rendered = render(&[component]);
        let pod = rendered.agent();
        let mount = pod.mount(&format!("{host_root}{path}"));
        assert_eq!(
            (&mount.source, mount.read_only),
            (
                &Source::HostPath {
                    path: path.into(),
                    kind: kind.into()
                },
                true
            ),
            "{component}"
        );
    }
    // Read-only all the way down: every read-only host path asks recursiveReadOnly, but the
    // kubelet's directory, whose HostToContainer propagation (so that no pod volume stays
    // mounted in the agent after the kubelet unmounts it) the API does not allow with it.
    for component in ["", "eks-kubelet-config", "gke-kubelet-config"] {
        let components: &[&str] = if component.is_empty() {
            &[]
        } else {
            &[component]
        };
        let rendered = render(components);
        for mount in &rendered.agent().mounts {
            if !mount.read_only || !matches!(mount.source, Source::HostPath { .. }) {
                continue;
            }
            let expected = if mount.path == format!("{host_root}/var/lib/kubelet") {
                (None, Some("HostToContainer"))
            } else {
                (Some("IfPossible"), None)
            };
            assert_eq!(
                (
                    mount.recursive_read_only.as_deref(),
                    mount.propagation.as_deref()
                ),
                expected,
                "{component} {}",
                mount.path
            );
        }
    }
    assert_eq!(
        agent.arg("--kubelet-state"),
        None,
        "the default, under --host-root"
    );

    // TLS material from the mounted Secret; every flag's file is in it.
    let tls = agent.mount("/etc/hugepage-agent/tls");
    assert_eq!(
        tls.source,
        Source::Secret {
            name: "hugepage-agent-tls".into()
        }
    );
    for (flag, file) in [
        ("--tls-cert-file", "tls.crt"),
        ("--tls-private-key-file", "tls.key"),
        ("--client-ca-file", "ca.crt"),
    ] {
        assert_eq!(
            agent.arg(flag),
            Some(format!("{}/{file}", tls.path).as_str()),
            "{flag}"
        );
    }

    // Listeners, ports and probes agree.
    let listen_port = |flag: &str| -> u16 {
        let address = agent.arg(flag).unwrap_or_else(|| panic!("{flag}"));
        address
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("{flag}={address}"))
    };
    assert_eq!(listen_port("--listen"), agent.port("api"));
    assert_eq!(listen_port("--metrics-listen"), agent.port("metrics"));
    let api = &agent.container["ports"][0];
    assert_eq!(
        (api["name"].as_str(), api["hostPort"].as_u64()),
        (Some("api"), Some(9820))
    );
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(
            agent.container[probe]["httpGet"]["port"], "metrics",
            "{probe}"
        );
    }
    assert_eq!(
        agent.container["readinessProbe"]["httpGet"]["path"],
        "/readyz"
    );
    assert_eq!(
        agent.container["livenessProbe"]["httpGet"]["path"],
        "/healthz"
    );
    // Longer than the API's 5 s drain and the 5 s flush of queued spans after it.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert!(grace > 10, "{grace}");
    let env = &agent.container["env"][0];
    assert_eq!(env["name"], "NODE_NAME");
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");

    // The image is the one `cargo xtask image` builds: the agent's version.
    let manifest = std::fs::read_to_string(workspace().join("agent/Cargo.toml")).expect("agent");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"'))
        .expect("the agent's version");
    assert_eq!(agent.image, format!("hugepage-agent:{version}"));
}

#[test]
fn only_the_webhook_and_the_monitoring_namespace_reach_the_agent() {
    let rendered = render(&[]);
    let agent = rendered.agent();
    let policy = rendered.find("NetworkPolicy", "hugepage-agent");
    let labels = &agent_template(&rendered)["metadata"]["labels"];
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[key], value, "the policy selects the agent's pods");
    }
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules[0]["ports"],
        json!([{"port": "api", "protocol": "TCP"}])
    );
    assert_eq!(
        rules[0]["from"],
        json!([{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "hugepage-agent",
            "app.kubernetes.io/component": "webhook"}}}])
    );
    assert_eq!(
        rules[1]["ports"],
        json!([{"port": "metrics", "protocol": "TCP"}])
    );
    assert_eq!(
        rules[1]["from"],
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
    );
    for rule in rules {
        agent.port(rule["ports"][0]["port"].as_str().expect("a named port"));
    }
    let service = rendered.find("Service", "hugepage-agent-metrics");
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
}

#[test]
fn cert_manager_writes_the_secret_the_daemonset_mounts() {
    let rendered = render(&["cert-manager"]);
    let agent = rendered.agent();
    let certificate = rendered.find("Certificate", "hugepage-agent-tls");
    assert_eq!(
        Source::Secret {
            name: certificate["spec"]["secretName"]
                .as_str()
                .expect("secretName")
                .into()
        },
        agent.mount("/etc/hugepage-agent/tls").source
    );
    assert_eq!(
        certificate["spec"]["usages"],
        json!(["server auth", "digital signature"])
    );
    // Signed by the installation's own CA, which is also the CA clients must be signed by.
    let issuer = certificate["spec"]["issuerRef"]["name"]
        .as_str()
        .expect("an issuer");
    let ca = rendered.find("Issuer", issuer);
    let root = rendered.find(
        "Certificate",
        ca["spec"]["ca"]["secretName"].as_str().expect("ca"),
    );
    assert_eq!(root["spec"]["isCA"], true);
}

/// The `failurePolicy` (ValidatingWebhookConfiguration) that says what `--failure-policy` says.
fn admission_policy(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Ignore => "Ignore",
        FailurePolicy::Fail => "Fail",
    }
}

/// Whether every `key: value` of a selector's `matchLabels` is among `labels`.
fn selects(match_labels: &Value, labels: &Value) -> bool {
    match_labels
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

/// Where kube-scheduler's PodTopologySpread filter (pkg/scheduler/framework/plugins/
/// podtopologyspread) lets `replicas` pods of `pod` go, one after the other, on `nodes`
/// (`{name, labels, taints}`) under the hostname constraint `spread`: a node passes the pod's
/// nodeSelector and its NoSchedule and NoExecute taints; the domains counted are the nodes that
/// carry the topology key and pass the nodeSelector (nodeAffinityPolicy Honor, the default) and,
/// with nodeTaintsPolicy Honor, whose taints the pod tolerates; a node is allowed while its count plus one, less the fewest
/// of any domain, is at most maxSkew. Each pod goes to the first allowed node with the fewest.
/// `None` when one cannot be placed.
fn place(pod: &Value, spread: &Value, nodes: &[Value], replicas: u64) -> Option<Vec<String>> {
    let selected = |node: &Value| {
        pod["nodeSelector"]
            .as_object()
            .is_none_or(|s| s.iter().all(|(k, v)| &node["labels"][k] == v))
    };
    // A toleration matches a taint by key (none: every key, with Exists), by value unless it is
    // Exists, and by effect (none: every effect); PreferNoSchedule never keeps a pod off.
    let tolerated = |node: &Value| {
        node["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|taint| {
                taint["effect"] == "PreferNoSchedule"
                    || pod["tolerations"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| {
                            let exists = t["operator"] == "Exists";
                            (t["key"] == taint["key"] || (t["key"].is_null() && exists))
                                && (exists || t["value"] == taint["value"])
                                && (t["effect"].is_null() || t["effect"] == taint["effect"])
                        })
            })
    };
    let key = spread["topologyKey"].as_str().expect("topologyKey");
    let labelled = |node: &Value| node["labels"][key].is_string();
    let honor_taints = spread["nodeTaintsPolicy"] == "Honor";
    let max_skew = spread["maxSkew"].as_u64().expect("maxSkew");
    let domains: Vec<&Value> = nodes
        .iter()
        .filter(|n| labelled(n) && selected(n) && (!honor_taints || tolerated(n)))
        .collect();
    let mut counts: BTreeMap<String, u64> = domains
        .iter()
        .map(|n| (n["name"].as_str().unwrap_or("").to_owned(), 0))
        .collect();
    let mut placed = Vec::new();
    for _ in 0..replicas {
        let fewest = counts.values().copied().min().unwrap_or(0);
        let chosen = nodes
            .iter()
            .filter(|n| selected(n) && tolerated(n))
            .filter_map(|n| n["name"].as_str())
            .filter(|name| {
                counts
                    .get(*name)
                    .is_some_and(|c| c + 1 - fewest <= max_skew)
            })
            .min_by_key(|name| counts[*name])?
            .to_owned();
        *counts.entry(chosen.clone()).or_default() += 1;
        placed.push(chosen);
    }
    Some(placed)
}

/// The Service port `port` of `service`, followed to the container port it targets.
fn target_port(service: &Value, port: u64, pod: &AgentPod) -> u16 {
    let entry = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["port"] == port)
        .unwrap_or_else(|| panic!("no port {port} on {service}"));
    match &entry["targetPort"] {
        Value::String(name) => pod.port(name),
        number => number
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .expect("a targetPort"),
    }
}

#[test]
fn the_webhook_runs_two_unprivileged_replicas_on_different_nodes() {
    let rendered = render(&["webhook"]);
    let deployment = rendered.find("Deployment", WEBHOOK);
    let webhook = rendered.webhook();
    let agent = rendered.agent();
    let pod = &webhook.pod;
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        labels
    ));
    assert_eq!(labels["app.kubernetes.io/component"], "webhook");
    assert_eq!(
        deployment["metadata"]["namespace"],
        agent_namespace(&rendered)
    );

    // The DaemonSet's image, running the webhook command.
    assert_eq!(webhook.image, agent.image);
    assert_eq!(webhook.args.first().map(String::as_str), Some("webhook"));

    // No privilege: another user than the image's root, nothing added, nothing of the host.
    let security = &webhook.container["securityContext"];
    assert_ne!(webhook.run_as_user, 0);
    assert_ne!(webhook.run_as_group, 0);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(webhook.drop, ["ALL"]);
    assert!(
        webhook.capabilities.is_empty(),
        "{:?}",
        webhook.capabilities
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    for shared in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[shared].is_null() || pod[shared] == false, "{shared}");
    }
    assert!(webhook.container["ports"][0]["hostPort"].is_null());
    for mount in &webhook.mounts {
        assert!(
            matches!(mount.source, Source::Secret { .. }) && mount.read_only,
            "{mount:?}"
        );
    }
    // The Secrets' files are readable by the pod's group, not only by root.
    let fs_group = pod["securityContext"]["fsGroup"].as_u64();
    assert_eq!(fs_group, Some(u64::from(webhook.run_as_group)));

    // Probes over plain HTTP on the port --metrics-listen binds (the kubelet presents no
    // client certificate, which --listen may ask for).
    let settings = webhook_command(&webhook);
    assert_eq!(settings.listen.port(), webhook.port("https"));
    let metrics = webhook.arg("--metrics-listen").expect("--metrics-listen");
    let metrics_port = metrics.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
    assert_eq!(metrics_port, Some(webhook.port("metrics")), "{metrics}");
    assert_eq!(webhook.port("metrics"), 9821);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &webhook.container[probe]["httpGet"];
        assert_eq!(
            (&get["scheme"], &get["path"], &get["port"]),
            (&json!("HTTP"), &json!(path), &json!("metrics")),
            "{probe}"
        );
    }

    // Room for the 50 MB RSS target, and no CPU limit to throttle the scheduler's calls.
    let resources = &webhook.container["resources"];
    let bytes = |q: &Value| parse_bytes(q.as_str().expect("a quantity")).expect("a quantity");
    let request = bytes(&resources["requests"]["memory"]);
    let limit = bytes(&resources["limits"]["memory"]);
    assert!(request >= 50_000_000 && limit >= request, "{resources}");
    assert!(resources["limits"]["cpu"].is_null(), "{resources}");
    assert!(resources["requests"]["cpu"].is_string(), "{resources}");

    // Spread over nodes, and one replica always left through voluntary disruptions.
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    let by_node = spread
        .iter()
        .find(|c| c["topologyKey"] == "kubernetes.io/hostname")
        .expect("a spread over nodes");
    assert_eq!(by_node["maxSkew"], 1);
    assert_eq!(by_node["whenUnsatisfiable"], "DoNotSchedule");
    assert!(selects(&by_node["labelSelector"]["matchLabels"], labels));
    // Both replicas find a node on a kubeadm cluster of one control plane and one worker, and
    // on two workers they go to different ones; without nodeTaintsPolicy Honor the tainted
    // control-plane node would leave the second Pending.
    let control_plane = json!({"name": "cp", "labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "cp"},
        "taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]});
    let worker = |name: &str| json!({"name": name, "labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name}, "taints": []});
    let replicas = deployment["spec"]["replicas"].as_u64().expect("replicas");
    assert_eq!(
        place(
            pod,
            by_node,
            &[control_plane.clone(), worker("w1")],
            replicas
        ),
        Some(vec!["w1".to_owned(), "w1".to_owned()])
    );
    assert_eq!(
        place(
            pod,
            by_node,
            &[control_plane.clone(), worker("w1"), worker("w2")],
            replicas
        ),
        Some(vec!["w1".to_owned(), "w2".to_owned()])
    );
    let mut ignoring = by_node.clone();
    ignoring["nodeTaintsPolicy"] = json!("Ignore");
    assert_eq!(
        place(
            pod,
            &ignoring,
            &[control_plane.clone(), worker("w1")],
            replicas
        ),
        None,
        "the default policy would leave the second replica Pending"
    );
    // The second scheduler's replicas likewise.
    let scheduler = render(&["webhook", "scheduler"]);
    let second = scheduler.find("Deployment", "hugepage-agent-scheduler");
    let second_pod = &second["spec"]["template"]["spec"];
    let second_spread = second_pod["topologySpreadConstraints"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["topologyKey"] == "kubernetes.io/hostname")
        })
        .expect("the second scheduler's spread over nodes");
    assert_eq!(
        place(
            second_pod,
            second_spread,
            &[control_plane, worker("w1")],
            second["spec"]["replicas"].as_u64().expect("replicas")
        ),
        Some(vec!["w1".to_owned(), "w1".to_owned()])
    );
    let budget = rendered.find("PodDisruptionBudget", WEBHOOK);
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert!(selects(&budget["spec"]["selector"]["matchLabels"], labels));
    assert_eq!(
        budget["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    // Only the webhook's pods: the agent's are not counted in the budget.
    let agent_labels =
        &rendered.find("DaemonSet", "hugepage-agent")["spec"]["template"]["metadata"]["labels"];
    assert!(!selects(
        &budget["spec"]["selector"]["matchLabels"],
        agent_labels
    ));

    // The agent's NetworkPolicy lets these pods reach the agents' API.
    let policy = rendered.find("NetworkPolicy", "hugepage-agent");
    assert_eq!(
        policy["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let api_rule = &policy["spec"]["ingress"][0];
    assert_eq!(api_rule["ports"][0]["port"], "api");
    assert!(selects(
        &api_rule["from"][0]["podSelector"]["matchLabels"],
        labels
    ));

    // Its own NetworkPolicy: these pods alone, their HTTPS port from anywhere (the API server's
    // and the scheduler's addresses cannot be selected by labels), their metrics port from the
    // monitoring namespace.
    let own = rendered.find("NetworkPolicy", WEBHOOK);
    assert!(selects(&own["spec"]["podSelector"]["matchLabels"], labels));
    assert!(!selects(
        &own["spec"]["podSelector"]["matchLabels"],
        agent_labels
    ));
    assert_eq!(own["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        own["spec"]["ingress"],
        json!([
            {"ports": [{"port": "https", "protocol": "TCP"}]},
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                "ports": [{"port": "metrics", "protocol": "TCP"}]
            }
        ])
    );

    // The limits tests/body_budget.rs floods under the memory limit above are the shipped ones.
    assert_eq!(
        (settings.limits.body_budget, settings.limits.max_connections),
        (64 << 20, 256),
        "--body-budget and --max-connections as tests/body_budget.rs proves them"
    );
    assert_eq!(
        limit,
        256 << 20,
        "the limit tests/body_budget.rs holds the webhook under"
    );
}

/// The namespace the base puts everything in.
fn agent_namespace(rendered: &Rendered) -> String {
    let namespaces = rendered.all("Namespace");
    assert_eq!(namespaces.len(), 1, "{:?}", rendered.names());
    namespaces[0]["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned()
}

#[test]
fn the_webhook_may_get_pods_and_read_nodes_and_nothing_else() {
    let rendered = render(&["webhook"]);
    let role = rendered.find("ClusterRole", WEBHOOK);
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule["resourceNames"].is_null() && rule["nonResourceURLs"].is_null());
        for group in rule["apiGroups"].as_array().expect("apiGroups") {
            for resource in rule["resources"].as_array().expect("resources") {
                for verb in rule["verbs"].as_array().expect("verbs") {
                    let text = |v: &Value| v.as_str().expect("a string").to_owned();
                    granted.insert((text(group), text(resource), text(verb)));
                }
            }
        }
    }
    let wanted: BTreeSet<(String, String, String)> = [
        ("", "pods", "get"),
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
    ]
    .iter()
    .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(granted, wanted);

    // Bound to the account the Deployment runs as, which mounts its token (the webhook calls
    // the API); the agent's account stays without any role.
    let deployment = rendered.find("Deployment", WEBHOOK);
    let pod = &deployment["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().expect("an account");
    let namespace = deployment["metadata"]["namespace"].clone();
    let binding = rendered.find("ClusterRoleBinding", WEBHOOK);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": WEBHOOK})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}])
    );
    let sa = rendered.find("ServiceAccount", account);
    assert_eq!(sa["metadata"]["namespace"], namespace);
    assert_ne!(sa["automountServiceAccountToken"], false);
    assert_ne!(pod["automountServiceAccountToken"], false);
    let rbac: Vec<&Value> = ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
        .iter()
        .flat_map(|kind| rendered.all(kind))
        .collect();
    assert_eq!(rbac.len(), 2, "{:?}", rendered.names());
}

#[test]
fn the_webhook_configuration_agrees_with_the_command_the_service_and_the_namespaces() {
    let rendered = render(&["webhook"]);
    let webhook = rendered.webhook();
    let settings = webhook_command(&webhook);
    let namespace = agent_namespace(&rendered);
    let service = rendered.find("Service", WEBHOOK);
    assert_eq!(service["metadata"]["namespace"], namespace.as_str());
    let labels = &rendered.find("Deployment", WEBHOOK)["spec"]["template"]["metadata"]["labels"];
    assert!(selects(&service["spec"]["selector"], labels));

    // The apiserver presents no client certificate to webhooks: the webhook must not ask one.
    assert!(settings.tls.client_ca.is_none());
    // The agents' port is the DaemonSet's hostPort.
    let agent = rendered.agent();
    let api = agent.container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "api")
        .expect("the agent's api port");
    assert_eq!(api["hostPort"], settings.agent_port);

    let configuration = rendered.find("ValidatingWebhookConfiguration", "hugepage-agent");
    let webhooks = configuration["webhooks"].as_array().expect("webhooks");
    let mut resources = Vec::new();
    for hook in webhooks {
        let name = hook["name"].as_str().expect("a name");
        assert_eq!(
            hook["failurePolicy"],
            admission_policy(settings.failure_policy),
            "{name}: failurePolicy as --failure-policy"
        );
        let timeout = hook["timeoutSeconds"].as_u64().expect("timeoutSeconds");
        assert!(
            Duration::from_secs(timeout) > settings.agent_timeout && timeout <= 30,
            "{name}: timeoutSeconds {timeout} against --agent-timeout {:?}",
            settings.agent_timeout
        );
        assert_eq!(hook["sideEffects"], "NoneOnDryRun", "{name}");
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]), "{name}");
        let client = &hook["clientConfig"];
        assert!(client["url"].is_null(), "{name}");
        let to = &client["service"];
        assert_eq!(
            (&to["name"], &to["namespace"], &to["path"]),
            (
                &json!(WEBHOOK),
                &json!(namespace),
                &json!("/admission/validate")
            ),
            "{name}"
        );
        let port = to["port"].as_u64().expect("a service port");
        assert_eq!(
            target_port(service, port, &webhook),
            settings.listen.port(),
            "{name}: the Service port leads to --listen"
        );
        // kube-system and the product's own namespace are left alone.
        let expressions = hook["namespaceSelector"]["matchExpressions"]
            .as_array()
            .expect("matchExpressions");
        assert!(hook["namespaceSelector"]["matchLabels"].is_null());
        let excluded = expressions
            .iter()
            .find(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn")
            .expect("a NotIn on the namespace's name");
        for left_alone in ["kube-system", namespace.as_str()] {
            assert!(
                excluded["values"]
                    .as_array()
                    .is_some_and(|v| v.contains(&json!(left_alone))),
                "{name}: {left_alone}"
            );
        }
        let rules = hook["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 1, "{name}");
        let rule = &rules[0];
        assert_eq!(
            (
                &rule["apiGroups"],
                &rule["apiVersions"],
                &rule["operations"]
            ),
            (&json!([""]), &json!(["v1"]), &json!(["CREATE"])),
            "{name}"
        );
        let resource = rule["resources"][0].as_str().expect("a resource");
        assert_eq!(rule["resources"].as_array().map(Vec::len), Some(1));
        // A Binding carries no pod spec: nothing to match it on, every binding is sent.
        assert_eq!(
            hook["matchConditions"].is_null(),
            resource == "pods/binding",
            "{name}"
        );
        resources.push(resource);
    }
    resources.sort_unstable();
    assert_eq!(resources, ["pods", "pods/binding"]);
}

#[test]
fn cert_manager_issues_the_webhooks_certificates_from_the_agents_ca() {
    let rendered = render(&["webhook", "cert-manager"]);
    let webhook = rendered.webhook();
    let settings = webhook_command(&webhook);
    let namespace = agent_namespace(&rendered);
    // The Secret a flag's file is in, and the file's name in it.
    let secret_of = |file: &Path| -> (String, String) {
        let dir = file.parent().and_then(Path::to_str).expect("a directory");
        let mount = webhook.mount(dir);
        let Source::Secret { name } = &mount.source else {
            panic!("{} is not from a Secret", file.display());
        };
        let key = file.file_name().and_then(|f| f.to_str()).expect("a name");
        (name.clone(), key.to_owned())
    };
    let certificate_for = |secret: &str| -> &Value {
        let found: Vec<&Value> = rendered
            .all("Certificate")
            .into_iter()
            .filter(|c| c["spec"]["secretName"] == secret)
            .collect();
        assert_eq!(found.len(), 1, "a Certificate writing {secret}");
        found[0]
    };
    let usages = |certificate: &Value| -> Vec<String> {
        certificate["spec"]["usages"]
            .as_array()
            .expect("usages")
            .iter()
            .map(|u| u.as_str().expect("a usage").to_owned())
            .collect()
    };

    // Every Secret the Deployment mounts is a certificate cert-manager writes.
    for mount in &webhook.mounts {
        if let Source::Secret { name } = &mount.source {
            certificate_for(name);
        }
    }

    // Serving: the files of one Secret, for the Service's name, as cert-manager names them.
    let tls = secret_of(&settings.tls.cert);
    let key = secret_of(&settings.tls.key);
    assert_eq!((tls.1.as_str(), key.1.as_str()), ("tls.crt", "tls.key"));
    assert_eq!(tls.0, key.0);
    let serving = certificate_for(&tls.0);
    let service_name = format!("{WEBHOOK}.{namespace}.svc");
    assert!(
        serving["spec"]["dnsNames"]
            .as_array()
            .is_some_and(|n| n.contains(&json!(service_name))),
        "{serving}"
    );
    assert!(usages(serving).contains(&"server auth".to_owned()));
    assert!(!usages(serving).contains(&"client auth".to_owned()));
    // The caBundle cert-manager injects is this certificate's CA.
    let configuration = rendered.find("ValidatingWebhookConfiguration", "hugepage-agent");
    assert_eq!(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{}/{}",
            serving["metadata"]["namespace"]
                .as_str()
                .expect("namespace"),
            serving["metadata"]["name"].as_str().expect("name")
        )
    );

    // Client: one Secret, client auth only, from the Issuer of the agent's certificate, whose
    // ca.crt (in both Secrets) the agent requires of clients and the webhook verifies agents by.
    let client = secret_of(&settings.agent_tls.cert);
    let client_key = secret_of(&settings.agent_tls.key);
    let ca = secret_of(&settings.agent_tls.ca);
    assert_eq!(
        (client.1.as_str(), client_key.1.as_str(), ca.1.as_str()),
        ("tls.crt", "tls.key", "ca.crt")
    );
    assert!(client.0 == client_key.0 && client.0 == ca.0);
    assert_ne!(
        client.0, tls.0,
        "the serving and client certificates are two"
    );
    let client = certificate_for(&client.0);
    assert!(usages(client).contains(&"client auth".to_owned()));
    assert!(!usages(client).contains(&"server auth".to_owned()));
    let agent = rendered.agent();
    let agent_tls = agent.mount("/etc/hugepage-agent/tls");
    let Source::Secret { name: agent_secret } = &agent_tls.source else {
        panic!("the agent's TLS is not a Secret");
    };
    assert_eq!(
        agent.arg("--client-ca-file"),
        Some(format!("{}/ca.crt", agent_tls.path).as_str())
    );
    let agents_certificate = certificate_for(agent_secret);
    assert_eq!(
        client["spec"]["issuerRef"], agents_certificate["spec"]["issuerRef"],
        "the agents' CA signs the webhook's client certificate"
    );
    let issuer = rendered.find(
        "Issuer",
        client["spec"]["issuerRef"]["name"]
            .as_str()
            .expect("an issuer"),
    );
    assert!(issuer["spec"]["ca"]["secretName"].is_string(), "{issuer}");
}

#[test]
fn the_match_conditions_send_only_pods_on_a_node_with_hugepages_and_never_fail() {
    let rendered = render(&["webhook"]);
    let configuration = rendered.find("ValidatingWebhookConfiguration", "hugepage-agent");
    let pods_hook = configuration["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .find(|h| h["rules"][0]["resources"] == json!(["pods"]))
        .expect("the pods webhook");
    let conditions: Vec<&str> = pods_hook["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .map(|c| c["expression"].as_str().expect("an expression"))
        .collect();
    assert!(!conditions.is_empty() && conditions.len() <= 64);

    let huge = json!({"requests": {"hugepages-2Mi": "2Gi", "memory": "1Gi", "cpu": "1"},
                      "limits": {"hugepages-2Mi": "2Gi", "memory": "1Gi", "cpu": "1"}});
    let plain = json!({"requests": {"memory": "1Gi", "cpu": "1"}, "limits": {"memory": "1Gi"}});
    let limits_only = json!({"limits": {"hugepages-1Gi": "2Gi", "memory": "1Gi"}});
    let extended = json!({"limits": {"example.com/hugepages-2Mi": "1"}});
    let empty = json!({});
    let mut mirror = pod(Some("node-1"), &[&huge], &[]);
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    let mut annotated = pod(Some("node-1"), &[&huge], &[]);
    annotated["metadata"]["annotations"] = json!({"example.com/team": "dpdk"});
    let mut no_resources_key = pod(Some("node-1"), &[&empty], &[]);
    if let Some(c) = no_resources_key["spec"]["containers"][0].as_object_mut() {
        c.remove("resources");
    }
    let mut pod_level = pod(Some("node-1"), &[&plain], &[]);
    pod_level["spec"]["resources"] = json!({"limits": {"hugepages-2Mi": "1Gi", "memory": "2Gi"}});
    let cases: Vec<(&str, Value, bool)> = vec![
        (
            "hugepages, node named",
            pod(Some("node-1"), &[&huge], &[]),
            true,
        ),
        (
            "hugepages in limits only",
            pod(Some("node-1"), &[&limits_only], &[]),
            true,
        ),
        (
            "hugepages in an init container only",
            pod(Some("node-1"), &[&empty], &[&huge]),
            true,
        ),
        (
            "hugepages in the second container",
            pod(Some("node-1"), &[&plain, &huge], &[]),
            true,
        ),
        ("hugepages at pod level", pod_level, true),
        ("annotated, not a mirror", annotated, true),
        ("no hugepages", pod(Some("node-1"), &[&plain], &[]), false),
        (
            "empty resources",
            pod(Some("node-1"), &[&empty], &[]),
            false,
        ),
        ("no resources key", no_resources_key, false),
        (
            "an extended resource",
            pod(Some("node-1"), &[&extended], &[]),
            false,
        ),
        ("hugepages, not yet bound", pod(None, &[&huge], &[]), false),
        (
            "hugepages, empty nodeName",
            pod(Some(""), &[&huge], &[]),
            false,
        ),
        ("a mirror pod", mirror, false),
    ];
    let objects: Vec<Value> = cases.iter().map(|(_, object, _)| object.clone()).collect();
    let held = all_hold(&conditions, &objects);
    for ((case, _, sent), held) in cases.iter().zip(held) {
        assert_eq!(held, *sent, "{case}");
    }

    // The evaluator does report what would fail in the API server: a compile error, and an
    // unguarded field that a pod lacks.
    let checks = cel(
        &[
            "object.spec.containers.exists(c, ",
            "object.spec.initContainers.size() > 0",
        ],
        &[pod(Some("node-1"), &[&huge], &[])],
    );
    assert!(checks[0]["compileError"].is_string(), "{}", checks[0]);
    assert!(
        checks[1]["results"][0]["error"].is_string(),
        "{}",
        checks[1]
    );
}

#[test]
fn the_scheduler_extender_configuration_has_the_go_types_fields_and_agrees_with_the_webhook() {
    let path = workspace().join("deploy/components/webhook/scheduler-extender.yaml");
    let text = std::fs::read_to_string(&path).expect("the extender configuration");
    let documents = yaml_documents(&text);
    assert_eq!(documents.len(), 1, "{}", path.display());
    let configuration = &documents[0];
    assert_eq!(
        configuration["apiVersion"],
        "kubescheduler.config.k8s.io/v1"
    );
    assert_eq!(configuration["kind"], "KubeSchedulerConfiguration");
    assert_eq!(
        unknown_fields(configuration, &CONFIGURATION_FIELDS),
        Vec::<String>::new()
    );
    assert_eq!(
        unknown_fields(
            &configuration["clientConnection"],
            &CLIENT_CONNECTION_FIELDS
        ),
        Vec::<String>::new()
    );
    let extenders = configuration["extenders"].as_array().expect("extenders");
    assert_eq!(extenders.len(), 1);
    let extender = &extenders[0];
    assert_eq!(
        unknown_fields(extender, &EXTENDER_FIELDS),
        Vec::<String>::new()
    );
    let tls = &extender["tlsConfig"];
    assert_eq!(
        unknown_fields(tls, &EXTENDER_TLS_FIELDS),
        Vec::<String>::new()
    );
    // The checks are real: a field of another type is reported.
    assert_eq!(
        unknown_fields(&json!({"urlPrefix": "x", "caFile": "y"}), &EXTENDER_FIELDS),
        ["caFile"]
    );

    let rendered = render(&["webhook", "cert-manager", "webhook-fixed-clusterip"]);
    let webhook = rendered.webhook();
    let settings = webhook_command(&webhook);
    let namespace = agent_namespace(&rendered);
    let service = rendered.find("Service", WEBHOOK);

    // The Service by the fixed ClusterIP of webhook-fixed-clusterip (kube-scheduler's host
    // network resolves no Service name), over HTTPS, verified by the name on the serving
    // certificate.
    let url = extender["urlPrefix"].as_str().expect("urlPrefix");
    let host_port = url.strip_prefix("https://").expect("an https URL");
    let (host, port) = host_port
        .trim_end_matches('/')
        .rsplit_once(':')
        .expect("host:port");
    assert_eq!(service["spec"]["clusterIP"], host, "{service}");
    assert_eq!(service["spec"]["clusterIPs"], json!([host]), "{service}");
    let ip: std::net::Ipv4Addr = host.parse().expect("an IPv4 address");
    // kubeadm's default serviceSubnet 10.96.0.0/12, in its lower 256 addresses (the band kept
    // for fixed ClusterIPs), and not kube-dns's 10.96.0.10.
    assert_eq!(ip.octets()[..3], [10, 96, 0], "{ip}");
    assert_ne!(ip.octets()[3], 10, "{ip}");
    let plain = render(&["webhook", "cert-manager"]);
    assert!(
        plain.find("Service", WEBHOOK)["spec"]["clusterIP"].is_null(),
        "without the component the API server allocates it"
    );
    let service_name = format!("{WEBHOOK}.{namespace}.svc");
    let port: u64 = port.parse().expect("a port");
    assert_eq!(target_port(service, port, &webhook), settings.listen.port());
    assert_eq!(extender["enableHTTPS"], true);
    assert_eq!(tls["serverName"], service_name.as_str());
    assert!(tls["caFile"].as_str().is_some_and(|f| f.starts_with('/')));
    assert!(tls["insecure"].is_null() || tls["insecure"] == false);
    let serving = rendered
        .all("Certificate")
        .into_iter()
        .find(|c| {
            let dir = settings.tls.cert.parent().and_then(Path::to_str);
            dir.is_some_and(|d| {
                webhook.mount(d).source
                    == Source::Secret {
                        name: c["spec"]["secretName"].as_str().unwrap_or("").to_owned(),
                    }
            })
        })
        .expect("the serving certificate");
    assert!(
        serving["spec"]["dnsNames"]
            .as_array()
            .is_some_and(|n| n.contains(&json!(service_name))),
        "{serving}"
    );

    // The webhook's routes; node names only (kubernetes issue #141781 is why).
    assert_eq!(extender["filterVerb"], "scheduler/filter");
    assert_eq!(extender["prioritizeVerb"], "scheduler/prioritize");
    assert!(extender["weight"].as_i64().is_some_and(|w| w > 0));
    assert_eq!(extender["nodeCacheCapable"], true);
    for unused in ["bindVerb", "preemptVerb"] {
        assert!(extender[unused].is_null(), "{unused}");
    }
    // kube-scheduler's validation refuses hugepages-* as managed resources (not extended
    // resource names): none are listed, and every pod is sent.
    assert!(extender["managedResources"].is_null(), "{extender}");

    // Ignorable under either --failure-policy: with every pod sent, a required extender that is
    // down would stop all scheduling, the webhook's own pods included (docs/install/scheduler-extender.md).
    assert_eq!(extender["ignorable"], true);
    let timeout = humantime::parse_duration(extender["httpTimeout"].as_str().expect("a duration"))
        .expect("httpTimeout");
    assert!(
        timeout > settings.agent_timeout,
        "httpTimeout {timeout:?} against --agent-timeout {:?}",
        settings.agent_timeout
    );
}

#[test]
fn callers_certificates_are_asked_only_with_the_opt_in_component_and_each_name_is_issued() {
    // The base: a managed API server presents no certificate, so none is asked.
    let base = render(&["cert-manager", "webhook", "scheduler"]);
    let webhook = base.webhook();
    for flag in ["--client-ca-file", "--client-names"] {
        assert!(
            webhook.arg(flag).is_none(),
            "{flag} without webhook-client-auth"
        );
    }

    let rendered = render(&[
        "cert-manager",
        "webhook",
        "scheduler",
        "webhook-client-auth",
    ]);
    let webhook = rendered.webhook();
    // The CA is the ca.crt of the webhook's serving Secret: the installation's CA.
    let ca = webhook.arg("--client-ca-file").expect("--client-ca-file");
    let (dir, file) = ca.rsplit_once('/').expect("a path");
    assert_eq!(file, "ca.crt");
    let serving = rendered.find("Certificate", "hugepage-agent-webhook-tls");
    assert_eq!(
        webhook.mount(dir).source,
        Source::Secret {
            name: serving["spec"]["secretName"]
                .as_str()
                .expect("a Secret")
                .to_owned()
        }
    );
    // Each name is a client certificate of that CA, and only the callers' are named.
    let names: BTreeSet<&str> = webhook
        .arg("--client-names")
        .expect("--client-names")
        .split(',')
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["hugepage-agent-scheduler", "hugepage-agent-apiserver"])
    );
    for name in names {
        let issued = rendered
            .all("Certificate")
            .into_iter()
            .find(|c| c["spec"]["commonName"] == name)
            .unwrap_or_else(|| panic!("no Certificate named {name}"));
        let usages = &issued["spec"]["usages"];
        assert_eq!(
            usages,
            &json!(["client auth", "digital signature"]),
            "{name}"
        );
        assert_eq!(
            issued["spec"]["issuerRef"], serving["spec"]["issuerRef"],
            "{name}"
        );
    }
}

#[test]
fn kubelet_serving_identity_serves_each_nodes_kubelet_certificate_and_the_webhook_checks_it() {
    let base = render(&["cert-manager", "webhook"]);
    assert_eq!(
        base.webhook().arg("--agent-identity"),
        None,
        "shared by default"
    );
    let rendered = render(&["cert-manager", "webhook", "kubelet-serving-identity"]);
    let agent = rendered.agent();
    // Certificate and key are the one file the kubelet rotates, a link whose target is an
    // absolute path of the host: read through a read-only mount of the host's directory at the
    // same path, where that target resolves.
    let current = "/var/lib/kubelet/pki/kubelet-server-current.pem";
    assert_eq!(agent.arg("--tls-cert-file"), Some(current));
    assert_eq!(agent.arg("--tls-private-key-file"), Some(current));
    let pki = agent.mount("/var/lib/kubelet/pki");
    assert!(pki.read_only);
    assert_eq!(pki.recursive_read_only.as_deref(), Some("IfPossible"));
    assert_eq!(
        pki.source,
        Source::HostPath {
            path: pki.path.clone(),
            kind: "Directory".to_owned()
        }
    );
    assert_eq!(agent.mounts.len(), base.agent().mounts.len() + 1);
    // The agents still take only the webhook's client certificate, by the installation's CA.
    assert_eq!(
        agent.arg("--client-ca-file"),
        base.agent().arg("--client-ca-file")
    );
    let webhook = rendered.webhook();
    assert_eq!(webhook.arg("--agent-identity"), Some("kubelet"));
    assert_eq!(
        webhook.arg("--agent-ca-file"),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    );
    assert_eq!(webhook.pod["automountServiceAccountToken"], true);
    let once = |flag: &str| webhook.args.iter().filter(|a| a.starts_with(flag)).count();
    for flag in [
        "--agent-ca-file=",
        "--agent-identity=",
        "--agent-client-cert-file=",
    ] {
        assert_eq!(once(flag), 1, "{flag} in {:?}", webhook.args);
    }
}
