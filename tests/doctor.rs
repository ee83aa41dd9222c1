//! `hugepage-agent doctor` against a cluster on this host: the real webhook serving HTTPS, real
//! node agents over mTLS on loopback addresses of their own (as in `webhook.rs`), and the
//! stand-in kube-apiserver of `apiserver.rs` (the one stand-in: no API server installs here)
//! holding the Nodes, the webhook's Service and its ValidatingWebhookConfiguration in the API
//! server's wire format. kube-scheduler's configuration file is written as an operator writes it
//! from `deploy/components/webhook/scheduler-extender.yaml`.
//!
//! Each misconfiguration the doctor must find is made for real and found by a call, not by
//! reading the objects: a caBundle of another CA (the handshake fails), an extender address that
//! does not resolve on this host (the shipped Service name), a node whose agent is not running
//! (nothing listens at its InternalIP).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use base64::Engine;
use hugepage_agent_tests::{
    Agent, agent_bin,
    apiserver::StandInApiServer,
    cluster::{self, Pki, WEBHOOK_NAME, host_tree, node, start_agent, tree_agent_command},
    free_port,
};
use serde_json::{Value, json};

const CONFIGURATION: &str =
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/hugepage-agent";
const SERVICE: &str = "/api/v1/namespaces/hugepage-agent/services/hugepage-agent-webhook";

/// The ValidatingWebhookConfiguration as the API server returns it: the shipped one's two
/// webhooks, calling the Service on `port`, with `ca` (PEM) as their caBundle.
fn configuration(ca: &str, port: u16) -> Value {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let webhook = |name: &str| {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "clientConfig": {
                "service": {"namespace": "hugepage-agent", "name": "hugepage-agent-webhook", "path": "/admission/validate", "port": port},
                "caBundle": bundle,
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/binding"], "scope": "Namespaced"}],
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "hugepage-agent", "uid": "4c7e3a2b-0000-4000-8000-000000000001"},
        "webhooks": [webhook("bindings.hugepage-agent.internal"), webhook("pods.hugepage-agent.internal")],
    })
}

/// The webhook's Service, its ClusterIP this host's loopback address (where the webhook listens).
fn service(port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "hugepage-agent-webhook", "namespace": "hugepage-agent", "uid": "4c7e3a2b-0000-4000-8000-000000000002"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "127.0.0.1",
            "clusterIPs": ["127.0.0.1"],
            "selector": {"app.kubernetes.io/name": "hugepage-agent", "app.kubernetes.io/component": "webhook"},
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": "https"}],
        },
        "status": {"loadBalancer": {}},
    })
}

/// kube-scheduler's configuration file with the shipped extender, its urlPrefix `url`, its CA
/// the webhook's (copied into `dir`, as the install page says).
fn scheduler_config(pki: &Pki, dir: &Path, url: &str) -> PathBuf {
    let ca = dir.join("webhook-ca.crt");
    std::fs::write(&ca, &pki.webhook.pem).expect("the webhook's CA");
    let path = dir.join("scheduler-config.yaml");
    let text = format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: /etc/kubernetes/scheduler.conf\nextenders:\n  - urlPrefix: {url}\n    filterVerb: scheduler/filter\n    prioritizeVerb: scheduler/prioritize\n    weight: 2\n    nodeCacheCapable: true\n    enableHTTPS: true\n    tlsConfig:\n      caFile: {}\n      serverName: {WEBHOOK_NAME}\n    httpTimeout: 5s\n    ignorable: true\n",
        ca.display()
    );
    std::fs::write(&path, text).expect("the scheduler's configuration");
    path
}

/// `hugepage-agent doctor --json` with `args`: its exit code and its findings.
fn doctor(args: &[&std::ffi::OsStr]) -> (i32, Vec<Value>) {
    let out = Command::new(agent_bin())
        .arg("doctor")
        .arg("--json")
        .args(["--timeout", "3s"])
        .args(args)
        .env_clear()
        .output()
        .expect("run the doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let findings = doc["findings"].as_array().cloned().unwrap_or_default();
    (out.status.code().unwrap_or(-1), findings)
}

/// The finding of `check` about `subject`.
fn finding<'a>(findings: &'a [Value], check: &str, subject: &str) -> &'a Value {
    findings
        .iter()
        .find(|f| f["check"] == check && f["subject"] == subject)
        .unwrap_or_else(|| panic!("no {check} finding for {subject}: {findings:#?}"))
}

fn verdict<'a>(findings: &'a [Value], check: &str, subject: &str) -> (&'a str, &'a str) {
    let f = finding(findings, check, subject);
    (
        f["verdict"].as_str().unwrap_or(""),
        f["detail"].as_str().unwrap_or(""),
    )
}

#[test]
fn the_doctor_walks_the_path_and_names_each_misconfiguration() {
    let pki = Pki::new();
    let agent_port = free_port();
    let tree = host_tree(2048);
    let _agent: Agent = start_agent(
        tree_agent_command(&agent_bin(), &pki, tree.path(), &[]),
        Ipv4Addr::new(127, 0, 0, 2),
        agent_port,
        |_| true,
    );
    let api = StandInApiServer::start();
    api.put_node(node("roomy", Ipv4Addr::new(127, 0, 0, 2), "8Gi"));
    api.put_node(node("plain", Ipv4Addr::new(127, 0, 0, 7), "0"));
    let webhook = cluster::webhook(&agent_bin(), &pki, &api, agent_port, "ignore", "2s", &[]);
    cluster::wait_ready(&pki, &webhook, Duration::from_secs(20));
    api.put_object(CONFIGURATION, configuration(&pki.webhook.pem, webhook.port));
    api.put_object(SERVICE, service(webhook.port));

    let dir = tempfile::tempdir().expect("a directory");
    let kubeconfig = api.kubeconfig(dir.path());
    let reachable = scheduler_config(
        &pki,
        dir.path(),
        &format!("https://127.0.0.1:{}", webhook.port),
    );
    let agents: Vec<std::ffi::OsString> = vec![
        "--agent-port".into(),
        agent_port.to_string().into(),
        "--agent-ca-file".into(),
        pki.path("agents-ca.crt").into(),
        "--agent-client-cert-file".into(),
        pki.path("client.crt").into(),
        "--agent-client-key-file".into(),
        pki.path("client.key").into(),
    ];
    let with = |config: &Path, agents: &[std::ffi::OsString]| {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--kubeconfig".into(),
            kubeconfig.clone().into(),
            "--scheduler-config".into(),
            config.into(),
        ];
        args.extend(agents.iter().cloned());
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        doctor(&refs)
    };

    // All in order: every call answers, and the exit code is 0.
    let (code, findings) = with(&reachable, &agents);
    assert_eq!(code, 0, "{findings:#?}");
    assert_eq!(
        verdict(&findings, "kubernetes-api", "version"),
        ("ok", "the API server answers: v1.35.0")
    );
    for name in [
        "bindings.hugepage-agent.internal",
        "pods.hugepage-agent.internal",
    ] {
        let (v, detail) = verdict(&findings, "webhook", name);
        assert_eq!(v, "ok", "{detail}");
        assert!(
            detail.contains(&format!("127.0.0.1:{} answers", webhook.port))
                && detail.contains(&format!(
                    "the caBundle verifies its certificate as \"{WEBHOOK_NAME}\""
                )),
            "{detail}"
        );
    }
    let url = format!("https://127.0.0.1:{}", webhook.port);
    let (v, detail) = verdict(&findings, "extender", &url);
    assert_eq!(v, "ok", "{detail}");
    assert!(
        detail.contains("POST /scheduler/filter answered 200"),
        "{detail}"
    );
    let (v, detail) = verdict(&findings, "agent", "roomy");
    assert_eq!(v, "ok", "{detail}");
    assert!(
        detail.contains(&format!("127.0.0.2:{agent_port}")) && detail.contains("admits a dry run"),
        "{detail}"
    );
    assert_eq!(
        verdict(&findings, "agent", "1 node(s) without hugepages").0,
        "ok"
    );

    // Under --agent-identity per-pod the agents' pods are listed: none on roomy yet, then one
    // whose name the agent's (shared) certificate does not carry.
    let mut per_pod = agents.clone();
    per_pod.extend(["--agent-identity".into(), "per-pod".into()]);
    let (code, findings) = with(&reachable, &per_pod);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "agent", "roomy");
    assert_eq!(v, "wrong");
    assert!(
        detail.contains("no agent pod in namespace hugepage-agent is on node roomy"),
        "{detail}"
    );
    api.put_pod(json!({
        "metadata": {
            "name": "hugepage-agent-r00my", "namespace": "hugepage-agent",
            "creationTimestamp": "2026-11-29T06:00:00Z",
            "labels": {"app.kubernetes.io/name": "hugepage-agent", "app.kubernetes.io/component": "agent"},
        },
        "spec": {"nodeName": "roomy", "containers": [{"name": "agent"}]},
        "status": {"phase": "Running"}
    }));
    let (code, findings) = with(&reachable, &per_pod);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "agent", "roomy");
    assert_eq!(v, "wrong");
    assert!(
        detail.contains("hugepage-agent-r00my.hugepage-agent.pod.hugepage-agent.internal"),
        "{detail}"
    );

    // Under --agent-identity kubelet the agent must serve roomy's kubelet certificate: the
    // shared one is refused by its subject (checked as the webhook checks it, not by name).
    let mut kubelet = agents.clone();
    kubelet.extend(["--agent-identity".into(), "kubelet".into()]);
    let (code, findings) = with(&reachable, &kubelet);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "agent", "roomy");
    assert_eq!(v, "wrong");
    assert!(
        detail.contains("roomy.kubelet.hugepage-agent.internal")
            && detail.contains("only valid for the subject CN=agent")
            && detail.contains("CN=system:node:roomy, O=system:nodes"),
        "{detail}"
    );

    // A caBundle of another CA: kube-apiserver could not verify the webhook.
    api.put_object(CONFIGURATION, configuration(&pki.agents.pem, webhook.port));
    let (code, findings) = with(&reachable, &agents);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "webhook", "bindings.hugepage-agent.internal");
    assert_eq!(v, "wrong");
    assert!(
        detail.contains("invalid peer certificate")
            && detail.contains("the caBundle does not verify the certificate the webhook serves")
            && detail.contains("failurePolicy Ignore"),
        "{detail}"
    );
    assert_eq!(verdict(&findings, "extender", &url).0, "ok");
    api.put_object(CONFIGURATION, configuration(&pki.webhook.pem, webhook.port));

    // The shipped urlPrefix, a Service name this host's resolver does not know (as on a kubeadm
    // control-plane node's host network).
    let shipped = format!("https://{WEBHOOK_NAME}:{}", webhook.port);
    let unresolvable = scheduler_config(&pki, dir.path(), &shipped);
    let (code, findings) = with(&unresolvable, &agents);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "extender", &shipped);
    assert_eq!(v, "wrong");
    let mut args = vec![
        std::ffi::OsString::from("--kubeconfig"),
        kubeconfig.clone().into(),
        "--scheduler-config".into(),
        unresolvable.clone().into(),
    ];
    args.extend(agents.iter().cloned());
    let text = Command::new(agent_bin())
        .arg("doctor")
        .args(["--timeout", "3s"])
        .args(&args)
        .env_clear()
        .output()
        .expect("run the doctor");
    let lines = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.status.code(), Some(1), "{lines}");
    assert!(
        lines.contains(&format!(
            "\nWRONG     extender       {shipped}: {WEBHOOK_NAME} does not resolve from here: "
        )) && lines.ends_with("5 ok, 1 wrong, 0 unchecked\n"),
        "{lines}"
    );
    eprintln!("{lines}");
    assert!(
        detail.starts_with(&format!("{WEBHOOK_NAME} does not resolve from here: "))
            && detail.contains("webhook-fixed-clusterip")
            && detail.contains("ignorable: true"),
        "{detail}"
    );
    assert_eq!(
        verdict(&findings, "webhook", "pods.hugepage-agent.internal").0,
        "ok"
    );

    // A node with hugepages whose agent does not run.
    api.put_node(node("down", Ipv4Addr::new(127, 0, 0, 6), "8Gi"));
    let (code, findings) = with(&reachable, &agents);
    assert_eq!(code, 1, "{findings:#?}");
    let (v, detail) = verdict(&findings, "agent", "down");
    assert_eq!(v, "wrong");
    assert!(
        detail.starts_with(&format!("cannot connect to 127.0.0.6:{agent_port}: "))
            && detail.contains("fails open for this node"),
        "{detail}"
    );
    assert_eq!(verdict(&findings, "agent", "roomy").0, "ok");

    // An account that may not read the configuration (the webhook's own, in its pod): not
    // checked, and not called wrong.
    api.forbid(CONFIGURATION, true);
    let (_, findings) = with(&reachable, &agents);
    let (v, detail) = verdict(&findings, "webhook", "hugepage-agent");
    assert_eq!(v, "unchecked");
    assert!(detail.contains("may not read"), "{detail}");
    api.forbid(CONFIGURATION, false);

    // A webhook that asks its callers for a client certificate (webhook-client-auth): its
    // certificate still verifies by the caBundle, and that is what the doctor can tell.
    let strict = cluster::webhook_with(
        &agent_bin(),
        &pki,
        &api,
        agent_port,
        ["ignore", "2s"],
        &[],
        &[
            "--client-ca-file",
            pki.path("agents-ca.crt").to_str().expect("a UTF-8 path"),
        ],
    );
    api.put_object(CONFIGURATION, configuration(&pki.webhook.pem, strict.port));
    api.put_object(SERVICE, service(strict.port));
    let (_, findings) = with(&reachable, &agents);
    let (v, detail) = verdict(&findings, "webhook", "bindings.hugepage-agent.internal");
    assert_eq!(v, "ok", "{detail}");
    assert!(
        detail.contains("asks callers for a client certificate"),
        "{detail}"
    );
    drop(strict);
    api.put_object(CONFIGURATION, configuration(&pki.webhook.pem, webhook.port));
    api.put_object(SERVICE, service(webhook.port));

    // Without the agents' certificates the agents are not called, and the doctor says so.
    let (_, findings) = with(&reachable, &[]);
    let (v, detail) = verdict(&findings, "agent", "-");
    assert_eq!(v, "unchecked");
    assert!(
        detail.contains("kubectl -n hugepage-agent exec"),
        "{detail}"
    );
    // The command it suggests names the files where the shipped Deployment has them.
    let shipped = hugepage_agent_tests::rendered::render(&["webhook"]).webhook();
    for flag in [
        "--agent-ca-file",
        "--agent-client-cert-file",
        "--agent-client-key-file",
    ] {
        let path = shipped.arg(flag).expect("the webhook's flag");
        assert!(
            detail.contains(&format!("{flag}={path}")),
            "{flag}: {detail}"
        );
    }
    // One of the three files alone is a mistake, said before anything is called.
    let half = Command::new(agent_bin())
        .arg("doctor")
        .arg("--agent-ca-file")
        .arg(pki.path("agents-ca.crt"))
        .env_clear()
        .output()
        .expect("run the doctor");
    assert_eq!(half.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&half.stderr);
    assert!(
        stderr.contains("go together: --agent-client-cert-file, --agent-client-key-file missing"),
        "{stderr}"
    );
}
