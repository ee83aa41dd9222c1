//! The second scheduler (component `scheduler`) and the two ways pods reach it (components
//! `scheduler-by-default`, a MutatingAdmissionPolicy, and `scheduler-by-default-webhook`, the
//! webhook's `/admission/mutate`), rendered by `kubectl kustomize` as an operator would apply
//! them. No kube-apiserver or kube-scheduler runs on these machines, so what is proven here is
//! what their inputs say, checked by the peers' own definitions:
//!
//! * the renderings against the official schemas (`kubernetes-validate --strict`) of every
//!   Kubernetes they claim: 1.30 to 1.37, the policy 1.36 and 1.37 (and refused by 1.35's);
//! * the KubeSchedulerConfiguration against the JSON tags of kube-scheduler's Go types, and its
//!   extender equal to the control plane's `scheduler-extender.yaml`;
//! * the RBAC against the roles kube-apiserver creates (`bootstrap-roles.yaml`, upstream's
//!   bootstrap policy test data) and the requests kube-scheduler makes
//!   (`kube-scheduler-requests.json`, read from its source): every request granted, and the
//!   project's own rules needed by one of them, no more;
//! * the policy's and the webhook configuration's CEL evaluated by CEL (`cel-expr-python`), the
//!   policy's JSONPatch included, and agreeing with the webhook's own judgement
//!   ([`hugepage_agent::webhook::mutate::judge`]), which `tests/webhook.rs` runs over HTTPS.
//!
//! What only a real cluster shows (the scheduler electing a leader, binding pods, calling the
//! extender; the API server applying the patch) is said in docs/install/managed-control-planes.md.

use std::collections::BTreeSet;

use hugepage_agent::webhook::{
    mutate::{self, Judged},
    review::AdmissionReview,
    routes::ROUTES,
};
use hugepage_agent_tests::{
    cluster,
    manifests::{
        CONFIGURATION_FIELDS, LEADER_ELECTION_FIELDS, NEWEST, OLDEST, PROFILE_FIELDS, all_hold,
        cel, pod, unknown_fields, validate, webhook_command,
    },
    peers::workspace,
    rendered::{Rendered, WEBHOOK, render, yaml_documents},
};
use serde_json::{Value, json};

/// The second scheduler's Deployment, ServiceAccount, ConfigMap, Lease and policy names.
const SCHEDULER: &str = "hugepage-agent-scheduler";
/// The kinds kubernetes-validate has no schema for (cert-manager's).
const CUSTOM_KINDS: [&str; 2] = ["Issuer", "Certificate"];

/// Whether `kubernetes-validate` checked every document of `rendered` for `version` (custom
/// kinds aside), with its report.
fn validated_all(rendered: &Rendered, version: &str) -> Result<(), String> {
    let (ok, report) = validate(rendered, version);
    if !ok {
        return Err(report);
    }
    let short = &version[..version.rfind('.').unwrap_or(version.len())];
    for document in &rendered.documents {
        let kind = document["kind"].as_str().unwrap_or_default();
        let name = document["metadata"]["name"].as_str().unwrap_or_default();
        let checked = format!(
            "passed for resource {}/{name} against version {short}",
            kind.to_lowercase()
        );
        if !CUSTOM_KINDS.contains(&kind) && !report.contains(&checked) {
            return Err(format!("{kind}/{name} not validated: {report}"));
        }
    }
    Ok(())
}

#[test]
fn the_components_validate_strictly_for_every_kubernetes_they_claim() {
    let base = ["webhook", "cert-manager"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    for components in [
        vec!["scheduler"],
        with(&["scheduler"]),
        with(&["scheduler", "scheduler-by-default-webhook"]),
    ] {
        let rendered = render(&components);
        for version in [OLDEST, NEWEST] {
            validated_all(&rendered, version)
                .unwrap_or_else(|e| panic!("{components:?} against {version}: {e}"));
        }
    }
    let policy = render(&with(&["scheduler", "scheduler-by-default"]));
    for version in ["1.36.0", NEWEST] {
        validated_all(&policy, version)
            .unwrap_or_else(|e| panic!("the policy against {version}: {e}"));
    }
    // The floor is real: admissionregistration.k8s.io/v1 has no MutatingAdmissionPolicy before
    // 1.36.
    let (_, report) = validate(&policy, "1.35.0");
    assert!(
        report.contains("Couldn't find schema for kind MutatingAdmissionPolicy with api version admissionregistration.k8s.io/v1"),
        "{report}"
    );
}

/// The KubeSchedulerConfiguration in the rendered ConfigMap, as kube-scheduler reads it.
fn configuration(rendered: &Rendered) -> Value {
    let map = rendered.find("ConfigMap", SCHEDULER);
    let text = map["data"]["config.yaml"]
        .as_str()
        .expect("data config.yaml");
    let documents = yaml_documents(text);
    assert_eq!(documents.len(), 1, "{text}");
    documents[0].clone()
}

/// The container `name` of a pod template.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of `--flag=value` in a command line.
fn flag<'a>(command: &'a Value, flag: &str) -> Option<&'a str> {
    command
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

/// The volume of `pod` mounted at `path` in `container`.
fn volume_at<'a>(pod: &'a Value, container: &Value, path: &str) -> &'a Value {
    let mount = container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    assert_eq!(mount["readOnly"], true, "{mount}");
    pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]))
}

#[test]
fn the_second_scheduler_is_the_upstream_image_restricted_and_highly_available() {
    let rendered = render(&["webhook", "cert-manager", "scheduler"]);
    let deployment = rendered.find("Deployment", SCHEDULER);
    let namespace = deployment["metadata"]["namespace"].clone();
    let pod = &deployment["spec"]["template"]["spec"];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let scheduler = container(pod, "kube-scheduler");

    // The upstream image, by default the newest minor the manifests are validated against.
    let image = scheduler["image"].as_str().expect("an image");
    let (name, tag) = image.rsplit_once(':').expect("a tagged image");
    assert_eq!(name, "registry.k8s.io/kube-scheduler");
    let minor = &NEWEST[..NEWEST.rfind('.').unwrap_or(NEWEST.len())];
    assert!(tag.starts_with(&format!("v{minor}.")), "{image}");

    // Two replicas on different nodes, a disruption budget that keeps one.
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "scheduler"
    );
    for (k, v) in deployment["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[k], v, "{k}");
    }
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(spread["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(spread["maxSkew"], 1);
    assert_eq!(
        spread["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let budget = rendered.find("PodDisruptionBudget", SCHEDULER);
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(budget["metadata"]["namespace"], namespace);

    // Pod Security "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
    // each of its controls as the standard words it.
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[host], true, "{host}");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let context = &scheduler["securityContext"];
    assert_ne!(context["privileged"], true);
    assert_eq!(context["allowPrivilegeEscalation"], false);
    assert_eq!(context["capabilities"]["drop"], json!(["ALL"]));
    assert!(context["capabilities"]["add"].is_null());
    assert_eq!(context["readOnlyRootFilesystem"], true);
    for port in scheduler["ports"].as_array().expect("ports") {
        assert!(port["hostPort"].is_null(), "{port}");
    }
    let allowed = [
        "configMap",
        "secret",
        "emptyDir",
        "projected",
        "downwardAPI",
    ];
    for volume in pod["volumes"].as_array().expect("volumes") {
        let kinds: Vec<&String> = volume
            .as_object()
            .expect("a volume")
            .keys()
            .filter(|k| *k != "name")
            .collect();
        assert!(
            kinds.iter().all(|k| allowed.contains(&k.as_str())),
            "{volume}"
        );
    }

    // The probes reach its secure port (10259) over HTTPS, on paths it serves to anyone.
    let https = scheduler["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "https")
        .expect("the https port");
    assert_eq!(https["containerPort"], 10259);
    for (probe, path) in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &scheduler[probe]["httpGet"];
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert_eq!(get["port"], "https", "{probe}");
        assert_eq!(get["path"], path, "{probe}");
    }

    // Its configuration is the ConfigMap's config.yaml, mounted where --config says.
    let config = flag(&scheduler["command"], "--config").expect("--config");
    let (dir, file) = config.rsplit_once('/').expect("a path");
    let volume = volume_at(pod, scheduler, dir);
    assert_eq!(volume["configMap"]["name"], SCHEDULER);
    let map = rendered.find("ConfigMap", SCHEDULER);
    assert!(map["data"][file].is_string(), "{map}");
    assert_eq!(map["metadata"]["namespace"], namespace);

    // It runs as its own account, whose token is mounted (it calls the API).
    assert_eq!(pod["serviceAccountName"], SCHEDULER);
    assert_ne!(pod["automountServiceAccountToken"], false);
    let account = rendered.find("ServiceAccount", SCHEDULER);
    assert_eq!(account["metadata"]["namespace"], namespace);
}

#[test]
fn the_configuration_is_the_go_types_one_profile_and_the_control_planes_extender() {
    let rendered = render(&["webhook", "cert-manager", "scheduler"]);
    let config = configuration(&rendered);
    assert_eq!(config["apiVersion"], "kubescheduler.config.k8s.io/v1");
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    assert_eq!(
        unknown_fields(&config, &CONFIGURATION_FIELDS),
        Vec::<String>::new()
    );
    let election = &config["leaderElection"];
    assert_eq!(
        unknown_fields(election, &LEADER_ELECTION_FIELDS),
        Vec::<String>::new()
    );
    let profiles = config["profiles"].as_array().expect("profiles");
    assert_eq!(profiles.len(), 1);
    let profile = &profiles[0];
    assert_eq!(
        unknown_fields(profile, &PROFILE_FIELDS),
        Vec::<String>::new()
    );
    // The checks are real: a field of another type is reported.
    assert_eq!(
        unknown_fields(
            &json!({"schedulerName": "s", "resourceLock": "leases"}),
            &PROFILE_FIELDS
        ),
        ["resourceLock"]
    );

    // The default plugins, unchanged; the name the webhook gives pods.
    assert!(
        profile["plugins"].is_null() && profile["pluginConfig"].is_null(),
        "{profile}"
    );
    let settings = webhook_command(&rendered.webhook());
    assert_eq!(profile["schedulerName"], settings.scheduler_name.as_str());

    // Leader election on a Lease of its own name, in its own namespace.
    let deployment = rendered.find("Deployment", SCHEDULER);
    assert_eq!(election["leaderElect"], true);
    assert_eq!(election["resourceLock"], "leases");
    assert_eq!(election["resourceName"], SCHEDULER);
    assert_eq!(
        election["resourceNamespace"],
        deployment["metadata"]["namespace"]
    );

    // The extender is the control plane's, field for field, but its address: the control
    // plane's host-network kube-scheduler dials the fixed ClusterIP, this pod the Service's name
    // (checked below).
    let path = workspace().join("deploy/components/webhook/scheduler-extender.yaml");
    let text = std::fs::read_to_string(&path).expect("the extender configuration");
    let control_plane = &yaml_documents(&text)[0];
    let mut expected = control_plane["extenders"].clone();
    expected[0]["urlPrefix"] = config["extenders"][0]["urlPrefix"].clone();
    assert_eq!(config["extenders"], expected);
    assert_ne!(
        config["extenders"][0]["urlPrefix"],
        control_plane["extenders"][0]["urlPrefix"]
    );

    // Its CA file is the ca.crt of the Secret holding the webhook's serving certificate.
    let extender = &config["extenders"][0];
    let ca = extender["tlsConfig"]["caFile"].as_str().expect("caFile");
    let (dir, file) = ca.rsplit_once('/').expect("a path");
    let pod = &deployment["spec"]["template"]["spec"];
    let volume = volume_at(pod, container(pod, "kube-scheduler"), dir);
    let serving = rendered.find("Certificate", "hugepage-agent-webhook-tls");
    assert_eq!(
        volume["secret"]["secretName"],
        serving["spec"]["secretName"]
    );
    assert_eq!(
        volume["secret"]["items"],
        json!([{"key": "ca.crt", "path": file}])
    );
    // Its client certificate and key are those of the Certificate named hugepage-agent-scheduler
    // (the webhook's --client-names with webhook-client-auth).
    let client = rendered
        .all("Certificate")
        .into_iter()
        .find(|c| c["spec"]["commonName"] == SCHEDULER)
        .expect("the scheduler's client certificate");
    let cert = extender["tlsConfig"]["certFile"]
        .as_str()
        .expect("certFile");
    let key = extender["tlsConfig"]["keyFile"].as_str().expect("keyFile");
    let (cert_dir, cert_file) = cert.rsplit_once('/').expect("a path");
    let (key_dir, key_file) = key.rsplit_once('/').expect("a path");
    assert_eq!(cert_dir, key_dir);
    let volume = volume_at(pod, container(pod, "kube-scheduler"), cert_dir);
    assert_eq!(volume["secret"]["secretName"], client["spec"]["secretName"]);
    assert_eq!(
        volume["secret"]["items"],
        json!([{"key": "tls.crt", "path": cert_file}, {"key": "tls.key", "path": key_file}])
    );
    assert!(
        client["spec"]["usages"]
            .as_array()
            .is_some_and(|u| u.contains(&json!("client auth"))),
        "{client}"
    );
    // And the name it dials is the webhook's Service, on the certificate.
    let service = rendered.find("Service", WEBHOOK);
    let host = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().expect("a name"),
        service["metadata"]["namespace"]
            .as_str()
            .expect("a namespace")
    );
    let port = &service["spec"]["ports"][0]["port"];
    assert_eq!(
        extender["urlPrefix"],
        json!(format!("https://{host}:{port}")),
        "{extender}"
    );
    assert!(
        serving["spec"]["dnsNames"]
            .as_array()
            .is_some_and(|n| n.contains(&json!(host)))
    );
}

/// One RBAC rule, its lists as sets.
#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn of(rule: &Value) -> Rule {
        let list = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        Rule {
            groups: list("apiGroups"),
            resources: list("resources"),
            verbs: list("verbs"),
            names: list("resourceNames"),
        }
    }

    /// Whether the rule allows `request`, as the RBAC authorizer matches
    /// (`k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/rbac.go`: `RuleAllows`).
    fn allows(&self, request: &Request) -> bool {
        let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        any(&self.groups, &request.group)
            && any(&self.resources, &request.resource)
            && any(&self.verbs, &request.verb)
            && (self.names.is_empty()
                || request
                    .name
                    .as_ref()
                    .is_some_and(|n| self.names.contains(n)))
    }
}

/// One request kube-scheduler makes of the API server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    group: String,
    resource: String,
    verb: String,
    /// `None`: cluster-wide, or in every namespace.
    namespace: Option<String>,
    name: Option<String>,
}

/// The requests of `tests/fixtures/kubernetes/kube-scheduler-requests.json`, one per verb.
fn requests() -> Vec<Request> {
    fixture_list("requests")
}

/// What the API server authorizes of kube-scheduler beyond its requests themselves (a write to
/// a claim's status is also checked as `resourceclaims/binding`), one per verb.
fn authorization_checks() -> Vec<Request> {
    fixture_list("authorizationChecksWithoutOwnRequest")
        .into_iter()
        .filter(|r| r.resource == "resourceclaims/binding")
        .collect()
}

/// The list `key` of the requests fixture, one request per verb.
fn fixture_list(key: &str) -> Vec<Request> {
    let path = workspace().join("tests/fixtures/kubernetes/kube-scheduler-requests.json");
    let text = std::fs::read_to_string(&path).expect("the requests fixture");
    let fixture: Value = serde_json::from_str(&text).expect("JSON");
    let text_of = |v: &Value| v.as_str().map(str::to_owned);
    let mut out = Vec::new();
    for r in fixture[key].as_array().expect("a list") {
        for verb in r["verbs"].as_array().expect("verbs") {
            out.push(Request {
                group: text_of(&r["group"]).expect("a group"),
                resource: text_of(&r["resource"]).expect("a resource"),
                verb: text_of(verb).expect("a verb"),
                namespace: text_of(&r["namespace"]),
                name: text_of(&r["resourceName"]),
            });
        }
    }
    out
}

/// A role's rules and where they apply (`None`: everywhere, bound by a ClusterRoleBinding).
struct Grant {
    role: String,
    namespace: Option<String>,
    rules: Vec<Rule>,
}

/// What the rendered bindings give the account `account` in `namespace`: the roles they name,
/// from the rendering or from `bootstrap` (the roles kube-apiserver creates itself).
fn grants(rendered: &Rendered, bootstrap: &[Value], account: &str, namespace: &str) -> Vec<Grant> {
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    let mut out = Vec::new();
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for binding in rendered.all(kind) {
            if binding["subjects"] != subject {
                continue;
            }
            let role_kind = binding["roleRef"]["kind"].as_str().expect("a roleRef kind");
            let role_name = binding["roleRef"]["name"].as_str().expect("a roleRef name");
            let where_ = binding["metadata"]["namespace"].as_str().map(str::to_owned);
            let same = |r: &&Value| {
                r["kind"] == role_kind
                    && r["metadata"]["name"] == role_name
                    && (role_kind == "ClusterRole"
                        || r["metadata"]["namespace"].as_str() == where_.as_deref())
            };
            let role = rendered
                .documents
                .iter()
                .chain(bootstrap)
                .find(same)
                .unwrap_or_else(|| panic!("{kind} names the {role_kind} {role_name}: not found"));
            out.push(Grant {
                role: format!("{role_kind}/{role_name}"),
                namespace: if kind == "ClusterRoleBinding" {
                    None
                } else {
                    where_
                },
                rules: role["rules"]
                    .as_array()
                    .expect("rules")
                    .iter()
                    .map(Rule::of)
                    .collect(),
            });
        }
    }
    out
}

/// Whether `grants` allow `request`.
fn allowed(grants: &[Grant], request: &Request) -> bool {
    grants.iter().any(|g| {
        (g.namespace.is_none() || g.namespace == request.namespace)
            && g.rules.iter().any(|r| r.allows(request))
    })
}

#[test]
fn the_second_scheduler_may_make_every_request_kube_scheduler_makes_and_no_more() {
    let rendered = render(&["webhook", "cert-manager", "scheduler"]);
    let bootstrap_text =
        std::fs::read_to_string(workspace().join("tests/fixtures/kubernetes/bootstrap-roles.yaml"))
            .expect("the bootstrap roles fixture");
    let bootstrap = yaml_documents(&bootstrap_text);
    let deployment = rendered.find("Deployment", SCHEDULER);
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .expect("a namespace");
    let granted = grants(&rendered, &bootstrap, SCHEDULER, namespace);
    let bound: BTreeSet<&str> = granted.iter().map(|g| g.role.as_str()).collect();
    assert_eq!(
        bound,
        BTreeSet::from([
            "ClusterRole/hugepage-agent-scheduler",
            "Role/extension-apiserver-authentication-reader",
            "Role/hugepage-agent-scheduler",
        ])
    );
    let requests = requests();
    assert!(requests.len() > 20, "{} requests", requests.len());
    let checks = authorization_checks();
    assert_eq!(checks.len(), 2, "resourceclaims/binding update and patch");
    let denied: Vec<&Request> = requests
        .iter()
        .chain(&checks)
        .filter(|r| !allowed(&granted, r))
        .collect();
    assert!(denied.is_empty(), "not granted: {denied:#?}");

    // The project's own rules: each allows only requests kube-scheduler makes (or the API server
    // checks of them), scoped to its own Lease where a name can scope it.
    let own: Vec<&Value> = ["Role", "ClusterRole"]
        .iter()
        .flat_map(|kind| rendered.all(kind))
        .filter(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler")
        .collect();
    assert_eq!(own.len(), 2, "{:?}", rendered.names());
    for role in own {
        for rule in role["rules"].as_array().expect("rules") {
            let rule = Rule::of(rule);
            assert!(rule.names.iter().all(|n| n == SCHEDULER), "{rule:?}");
            for group in &rule.groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        let asked = requests.iter().chain(&checks).any(|r| {
                            &r.group == group && &r.resource == resource && &r.verb == verb
                        });
                        assert!(
                            asked,
                            "{group}/{resource} {verb}: kube-scheduler never asks it"
                        );
                    }
                }
            }
        }
    }
    let without: Vec<Grant> = granted
        .iter()
        .filter(|g| g.role != "Role/hugepage-agent-scheduler")
        .map(|g| Grant {
            role: g.role.clone(),
            namespace: g.namespace.clone(),
            rules: g.rules.clone(),
        })
        .collect();
    let needing: Vec<&Request> = requests.iter().filter(|r| !allowed(&without, r)).collect();
    assert!(
        !needing.is_empty()
            && needing
                .iter()
                .all(|r| r.resource == "leases" && r.namespace.as_deref() == Some(namespace)),
        "{needing:#?}"
    );

    // Nothing reaches the control plane's own scheduler's Lease, nor any Lease or lease
    // candidate in kube-system.
    let lease = |resource: &str, verb: &str, name: Option<&str>| Request {
        group: "coordination.k8s.io".to_owned(),
        resource: resource.to_owned(),
        verb: verb.to_owned(),
        namespace: Some("kube-system".to_owned()),
        name: name.map(str::to_owned),
    };
    for verb in [
        "get", "list", "watch", "update", "patch", "delete", "create",
    ] {
        for request in [
            lease("leases", verb, Some("kube-scheduler")),
            lease("leases", verb, None),
            lease("leasecandidates", verb, None),
        ] {
            assert!(!allowed(&granted, &request), "granted: {request:?}");
        }
    }
}

/// The `matchConditions` expressions of an admission configuration or policy.
fn conditions(holder: &Value) -> Vec<(String, String)> {
    holder["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().expect("text").to_owned();
            (text("name"), text("expression"))
        })
        .collect()
}

/// A pod `CREATE` review of `pod`, as the webhook is sent it.
fn review_of(pod: &Value) -> hugepage_agent::webhook::review::AdmissionRequest {
    let review = cluster::creation_review(pod, "u", false);
    let review: AdmissionReview = serde_json::from_value(review).expect("a review");
    review.request.expect("a request")
}

#[test]
fn the_policy_and_the_webhook_give_the_same_pods_the_same_scheduler_and_leave_the_rest() {
    let rendered = render(&[
        "webhook",
        "cert-manager",
        "scheduler",
        "scheduler-by-default",
        "scheduler-by-default-webhook",
    ]);
    let settings = webhook_command(&rendered.webhook());
    let name = settings.scheduler_name.as_str();
    let policy = rendered.find("MutatingAdmissionPolicy", SCHEDULER);
    let configuration = rendered.find("MutatingWebhookConfiguration", SCHEDULER);
    let hook = &configuration["webhooks"][0];

    // One set of conditions for both, its hugepages test the binding webhook's.
    let from_policy = conditions(&policy["spec"]);
    assert_eq!(from_policy, conditions(hook));
    let validating = rendered.find("ValidatingWebhookConfiguration", "hugepage-agent");
    let huge = |c: &[(String, String)]| {
        c.iter()
            .find(|(n, _)| n == "requests-hugepages")
            .map(|(_, e)| e.clone())
            .expect("requests-hugepages")
    };
    let pods_hook = validating["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .find(|h| h["rules"][0]["resources"] == json!(["pods"]))
        .expect("the pods webhook");
    assert_eq!(huge(&from_policy), huge(&conditions(pods_hook)));

    // Pod creations only, outside kube-system and the project's own namespace.
    let agent_namespace = rendered.find("Deployment", SCHEDULER)["metadata"]["namespace"].clone();
    let excluded = json!({"matchExpressions": [{
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", agent_namespace]
    }]});
    let rule = json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]});
    let constraints = &policy["spec"]["matchConstraints"];
    assert_eq!(constraints["namespaceSelector"], excluded);
    assert_eq!(constraints["resourceRules"], json!([rule]));
    assert_eq!(hook["namespaceSelector"], excluded);
    let mut hook_rule = rule.clone();
    hook_rule["scope"] = json!("Namespaced");
    assert_eq!(hook["rules"], json!([hook_rule]));
    let binding = rendered.find("MutatingAdmissionPolicyBinding", SCHEDULER);
    assert_eq!(binding["spec"]["policyName"], SCHEDULER);

    // Never blocking: a failure leaves the pod to the default scheduler.
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(policy["spec"]["reinvocationPolicy"], "Never");
    assert_eq!(hook["reinvocationPolicy"], "Never");

    // The webhook's own endpoint, through its Service, with the serving certificate's CA.
    let service = &hook["clientConfig"]["service"];
    assert_eq!(service["name"], WEBHOOK);
    assert_eq!(service["namespace"], agent_namespace);
    assert!(
        ROUTES
            .iter()
            .any(|r| r.method == "POST" && service["path"] == r.path)
    );
    assert_eq!(service["path"], "/admission/mutate");
    assert_eq!(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{}/hugepage-agent-webhook-tls",
            agent_namespace.as_str().expect("a namespace")
        )
    );

    // The cases, by CEL and by the webhook's own judgement.
    let hugepages = json!({"limits": {"hugepages-2Mi": "1Gi", "memory": "1Gi"}, "requests": {"hugepages-2Mi": "1Gi", "memory": "1Gi"}});
    let plain = json!({"requests": {"cpu": "1"}});
    let empty = json!({});
    let with = |mut pod: Value, key: &str, value: Value| {
        pod["spec"][key] = value;
        pod
    };
    let without_name = {
        let mut pod = pod(None, &[&hugepages], &[]);
        pod["spec"]
            .as_object_mut()
            .map(|s| s.remove("schedulerName"));
        pod
    };
    let cases = [
        (
            "hugepages, the default scheduler",
            pod(None, &[&hugepages], &[]),
            true,
        ),
        ("hugepages, no schedulerName", without_name, true),
        (
            "hugepages in an init container",
            pod(None, &[&empty], &[&hugepages]),
            true,
        ),
        (
            "pod-level hugepages",
            with(pod(None, &[&empty], &[]), "resources", hugepages.clone()),
            true,
        ),
        (
            "hugepages, another scheduler",
            with(
                pod(None, &[&hugepages], &[]),
                "schedulerName",
                json!("volcano"),
            ),
            false,
        ),
        (
            "hugepages, already the second scheduler",
            with(pod(None, &[&hugepages], &[]), "schedulerName", json!(name)),
            false,
        ),
        (
            "hugepages, created on a node",
            pod(Some("worker-1"), &[&hugepages], &[]),
            false,
        ),
        ("no hugepages", pod(None, &[&plain], &[]), false),
    ];
    let expressions: Vec<&str> = from_policy.iter().map(|(_, e)| e.as_str()).collect();
    let objects: Vec<Value> = cases.iter().map(|(_, p, _)| p.clone()).collect();
    let held = all_hold(&expressions, &objects);
    for ((case, pod, changed), held) in cases.iter().zip(held) {
        assert_eq!(held, *changed, "CEL: {case}");
        let judged = mutate::judge(&review_of(pod), name);
        assert_eq!(
            matches!(judged, Judged::Assigned(_)),
            *changed,
            "webhook: {case}: {judged:?}"
        );
    }

    // The policy's patch, evaluated by CEL, is the webhook's.
    let patch = policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
        .as_str()
        .expect("a JSONPatch expression");
    assert_eq!(policy["spec"]["mutations"][0]["patchType"], "JSONPatch");
    let plain_patch = format!("({patch}).map(p, {{'op': p.op, 'path': p.path, 'value': p.value}})");
    let evaluated = cel(&[&plain_patch], &objects[..1]);
    assert_eq!(
        evaluated[0]["results"][0]["value"],
        mutate::patch(name),
        "{evaluated:?}"
    );
}
