//! The manifests of `deploy/`, rendered by `kubectl kustomize` as an operator would apply them:
//! valid against the official Kubernetes schemas (`kubernetes-validate --strict`, PyPI) for the
//! oldest and the newest Kubernetes supported, the custom resources against their CRD schemas
//! (`@kubernetes-models`, npm), the PrometheusRule equal to `dashboards/alerts.yaml` and passing
//! promtool, the dashboard's ConfigMap the dashboard byte for byte, and the DaemonSet's least
//! privilege and wiring (arguments, mounts, probes, ports, network policy) consistent. Nothing
//! here changes the host; `tests/daemonset.rs` runs the agent under what these manifests declare.

use std::process::{Command, Stdio};

use hugepage_agent_tests::{
    peers::{crd_models, kubernetes_validate, promtool, workspace},
    rendered::{Rendered, Source, render},
};
use serde_json::{Value, json};

/// The oldest Kubernetes the manifests support (volume mounts' `recursiveReadOnly` first appears
/// in 1.30) and the newest the validator knows.
const OLDEST: &str = "1.30.0";
const NEWEST: &str = "1.37.0";
/// Every optional component but the cgroup layouts, which replace the same paths.
const COMPONENTS: [&str; 3] = ["prometheus-operator", "grafana-dashboard", "cert-manager"];
/// The kinds kubernetes-validate has no schema for, checked against their CRDs instead.
const CUSTOM_KINDS: [&str; 4] = ["PodMonitor", "PrometheusRule", "Issuer", "Certificate"];

/// `kubernetes-validate --strict` of a rendering for `version`: (passed, its report).
fn validate(rendered: &Rendered, version: &str) -> (bool, String) {
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

#[test]
fn every_rendering_validates_strictly_for_the_oldest_and_newest_kubernetes() {
    let mut renderings = vec![(vec![], render(&[]))];
    renderings.push((COMPONENTS.to_vec(), render(&COMPONENTS)));
    for one in [
        "cgroupfs-driver",
        "hybrid-cgroup",
        "eks-kubelet-config",
        "gke-kubelet-config",
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
    assert_eq!(custom.len(), 6, "{:?}", rendered.names());
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
        6,
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
    let rendered = render(&["prometheus-operator"]);
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
    assert!(ok && out.contains("SUCCESS: 7 rules found"), "{out}");

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

    // Host paths are read-only under --host-root, but for the state directory and the files
    // PSI triggers are written into.
    let host_root = agent.arg("--host-root").expect("--host-root");
    let state = agent.arg("--state-dir").expect("--state-dir");
    let writable: Vec<&str> = agent
        .mounts
        .iter()
        .filter(|m| !m.read_only)
        .map(|m| m.path.as_str())
        .collect();
    assert_eq!(
        writable,
        [
            "/host/proc/pressure",
            "/host/sys/fs/cgroup/kubepods.slice/memory.pressure",
            "/host/sys/fs/cgroup/kubepods.slice/io.pressure",
            state
        ]
    );
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
    assert_eq!(
        agent
            .mount("/host/sys/fs/cgroup")
            .recursive_read_only
            .as_deref(),
        Some("IfPossible")
    );
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

#[test]
fn each_cgroup_layout_moves_both_pressure_files_and_nothing_else() {
    let base = render(&[]).agent();
    for (layout, dir) in [
        ("cgroupfs-driver", "/sys/fs/cgroup/kubepods"),
        ("hybrid-cgroup", "/sys/fs/cgroup/unified/kubepods.slice"),
    ] {
        let moved = render(&[layout]).agent();
        assert_eq!(moved.mounts.len(), base.mounts.len());
        for (before, after) in base.mounts.iter().zip(&moved.mounts) {
            if before.name.starts_with("kubepods-") {
                let file = before.path.rsplit('/').next().expect("a file name");
                assert_eq!(after.path, format!("/host{dir}/{file}"), "{layout}");
                assert_eq!(
                    after.source,
                    Source::HostPath {
                        path: format!("{dir}/{file}"),
                        kind: "File".into()
                    }
                );
            } else {
                assert_eq!(before, after, "{layout}");
            }
        }
    }
}
