//! Issue #23: a request's identifiers are checked as the API server checks them before anything
//! is reserved or written, and both request bodies are read exactly as the OpenAPI document
//! describes them (what schemathesis found: `{"spec": null}`, `"topologyPolicy": null`,
//! `"numaNodes": []`), the same way by `POST /v1/admit` and `POST /v1/hints`.

use super::*;

/// The endpoints that read a request body.
const BODIES: [&str; 2] = ["/v1/admit", "/v1/hints"];

async fn post(state: &AppState, uri: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, answer) = send(
        state,
        "POST",
        uri,
        Some("application/json"),
        body.to_string(),
    )
    .await;
    (status, answer)
}

/// Posts `body` to both endpoints: each must refuse it with a 400 naming `field`, with a detail
/// containing `says`; the detail is returned.
async fn refused_by_both(state: &AppState, body: &Value, field: &str, says: &str) -> String {
    let mut detail = String::new();
    for uri in BODIES {
        let (status, problem) = post(state, uri, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {problem}");
        assert_eq!(problem["field"], field, "{uri} {body}: {problem}");
        detail = problem["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains(says), "{uri} {body}: {problem}");
    }
    detail
}

/// 1 GiB on node 0 for the pod `uid` (batch/job-b): admitted and reserved when `uid` is valid.
fn fits(uid: &str) -> Value {
    with_uid(short("1Gi", Some(json!([0]))), uid)
}

/// A Guaranteed `v1.Pod` asking 1 GiB of 2 MiB pages.
fn whole_pod(metadata: Value, init: Value, containers: Value) -> Value {
    json!({"metadata": metadata, "spec": {"initContainers": init, "containers": containers}})
}

fn container(name: &str) -> Value {
    let list = json!({"hugepages-2Mi": "1Gi", "memory": "1Gi", "cpu": "1"});
    json!({"name": name, "resources": {"requests": list, "limits": list}})
}

/// Nothing is reserved, and the reservation file was never written.
async fn nothing_reserved(dir: &tempfile::TempDir, state: &AppState) {
    let (_, _, listed) = send(state, "GET", "/v1/reservations", None, "").await;
    assert_eq!(listed["reservations"], json!([]), "{listed}");
    let file = dir.path().join("state/reservations.json");
    assert!(!file.exists(), "{} was written", file.display());
}

#[tokio::test]
async fn a_pod_uid_of_dot_dot_etc_passwd_is_a_400_naming_it_and_nothing_is_reserved_or_written() {
    let (dir, state) = state();
    let hostile = "../../etc/passwd";
    refused_by_both(&state, &fits(hostile), "pod.uid", "is not a pod UID").await;
    let pod = whole_pod(
        json!({"uid": hostile}),
        json!([]),
        json!([container("app")]),
    );
    refused_by_both(&state, &pod, "metadata.uid", "is not a pod UID").await;
    // Uppercase is not what the API server writes (nor what the kubelet's cgroup paths hold).
    let upper = "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5c".to_uppercase();
    refused_by_both(&state, &fits(&upper), "pod.uid", "is not a pod UID").await;
    nothing_reserved(&dir, &state).await;
    // The same request with a UID the API server would assign is admitted and reserved.
    let (status, answer) = post(&state, "/v1/admit", &fits(POD_1)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(answer["reservation"]["id"].is_string(), "{answer}");
    assert!(dir.path().join("state/reservations.json").exists());
}

#[tokio::test]
async fn a_pod_uid_of_100000_characters_is_a_400_that_does_not_repeat_it() {
    let (dir, state) = state();
    let huge = "a".repeat(100_000);
    let detail = refused_by_both(&state, &fits(&huge), "pod.uid", "is 100000 bytes long").await;
    assert!(detail.len() < 300, "the detail is short: {detail}");
    nothing_reserved(&dir, &state).await;
}

#[tokio::test]
async fn a_namespace_with_uppercase_and_other_names_the_api_server_refuses_are_400s() {
    let (dir, state) = state();
    let label = "is not a DNS-1123 label";
    let subdomain = "is not a DNS-1123 subdomain";
    let mut cases = Vec::new();
    for (field, value, says) in [
        ("namespace", "Batch".to_owned(), label),
        ("namespace", "team.a".to_owned(), label),
        ("namespace", "a".repeat(64), "must be no more than 63"),
        ("name", "Job_B".to_owned(), subdomain),
        ("name", "../job".to_owned(), subdomain),
        ("name", "a".repeat(254), "must be no more than 253"),
    ] {
        let mut short_form = fits(POD_1);
        short_form["pod"][field] = json!(value);
        cases.push((short_form, format!("pod.{field}"), says));
        let pod = whole_pod(
            json!({ field: value, "uid": POD_1 }),
            json!([]),
            json!([container("app")]),
        );
        cases.push((pod, format!("metadata.{field}"), says));
    }
    let mut bad_container = fits(POD_1);
    bad_container["containers"][0]["name"] = json!("Main");
    cases.push((bad_container, "containers[0].name".to_owned(), label));
    let pod = whole_pod(
        json!({}),
        json!([container("set.up")]),
        json!([container("app")]),
    );
    cases.push((pod, "spec.initContainers[0].name".to_owned(), label));
    let pod = whole_pod(json!({}), json!([]), json!([container(&"a".repeat(64))]));
    cases.push((
        pod,
        "spec.containers[0].name".to_owned(),
        "must be no more than 63",
    ));
    let mut qos = fits(POD_1);
    qos["pod"]["qosClass"] = json!("Platinum");
    cases.push((
        qos,
        "pod.qosClass".to_owned(),
        "is not Guaranteed, Burstable or BestEffort",
    ));
    for (body, field, says) in &cases {
        refused_by_both(&state, body, field, says).await;
    }
    nothing_reserved(&dir, &state).await;
}

#[tokio::test]
async fn duplicate_container_names_are_a_400_naming_the_second() {
    let (dir, state) = state();
    let mut twice = fits(POD_1);
    twice["containers"] = json!([{"name": "main"}, {"name": "main"}]);
    refused_by_both(
        &state,
        &twice,
        "containers[1].name",
        "duplicate value \"main\": also the name of containers[0].name",
    )
    .await;
    // Init containers and containers share one set of names.
    let pod = whole_pod(
        json!({"uid": POD_1}),
        json!([container("setup")]),
        json!([container("setup")]),
    );
    refused_by_both(
        &state,
        &pod,
        "spec.containers[0].name",
        "also the name of spec.initContainers[0].name",
    )
    .await;
    // An unnamed container is named container-<index>, which counts too.
    let mut taken = fits(POD_1);
    taken["containers"] = json!([{"name": "container-1"}, {}]);
    refused_by_both(&state, &taken, "containers[1].name", "duplicate value").await;
    nothing_reserved(&dir, &state).await;
}

#[tokio::test]
async fn identifiers_left_out_or_empty_are_not_given_and_unnamed_containers_are_named() {
    let (dir, state) = state();
    for body in [
        json!({"containers": [{"resources": {"hugepages-2Mi": "1Gi"}}], "numaNodes": [0]}),
        json!({"pod": {"namespace": "", "name": "", "uid": ""}, "containers": [{"name": ""}], "numaNodes": [0]}),
        json!({"pod": null, "containers": [{"name": null}], "numaNodes": [0]}),
    ] {
        let (status, answer) = post(&state, "/v1/admit", &body).await;
        assert_eq!(status, StatusCode::OK, "{body}: {answer}");
        assert_eq!(answer["allowed"], true, "{body}: {answer}");
    }
    // Without a UID nothing is reserved.
    nothing_reserved(&dir, &state).await;
    let unnamed = json!({"resources": {}});
    let pod = whole_pod(
        json!(null),
        json!([unnamed]),
        json!([unnamed, {"name": "app"}]),
    );
    let (status, answer) = post(&state, "/v1/hints", &pod).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let names: Vec<&str> = answer["containers"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        ["init-container-0", "container-0", "app"],
        "{answer}"
    );
}

#[tokio::test]
async fn spec_null_is_a_400_naming_spec_from_both_bodies_not_an_unknown_field() {
    let (_d, state) = state();
    refused_by_both(&state, &json!({"spec": null}), "spec", "expected an object").await;
    // Serde reads a struct from an array of its fields; the document says object, and so does
    // the server now.
    let array = json!({"spec": [null, null]});
    refused_by_both(&state, &array, "spec", "expected an object").await;
    let array = json!({"containers": [["main", {}]]});
    refused_by_both(&state, &array, "containers[0]", "expected an object").await;
}

#[tokio::test]
async fn numa_nodes_empty_or_unknown_is_a_400_from_both_bodies() {
    let (_d, state) = state();
    let empty = json!({"containers": [], "numaNodes": []});
    refused_by_both(&state, &empty, "numaNodes", "at least one NUMA node").await;
    let unknown = json!({"containers": [], "numaNodes": [0, 7]});
    refused_by_both(&state, &unknown, "numaNodes", "NUMA node 7 does not exist").await;
}

#[tokio::test]
async fn null_for_an_optional_field_is_that_field_left_out_in_both_bodies() {
    let (_d, state) = state();
    let bodies = [
        json!({"containers": [{"name": "main", "resources": null}], "topologyPolicy": null, "scope": null, "numaNodes": null, "pod": null}),
        json!({"containers": [{"name": "main"}], "pod": {"qosClass": null, "uid": null}}),
        json!({"metadata": null, "status": null, "spec": {"initContainers": null, "containers": [{"name": "app", "resources": null, "restartPolicy": null}], "overhead": null, "resources": null}}),
        json!({"spec": {"containers": [{"name": "app", "resources": {"requests": null, "limits": null}}]}, "status": {"qosClass": null}}),
    ];
    for body in bodies {
        for uri in BODIES {
            let (status, answer) = post(&state, uri, &body).await;
            assert_eq!(status, StatusCode::OK, "{uri} {body}: {answer}");
        }
    }
}

#[tokio::test]
async fn a_whole_number_written_with_a_fraction_is_that_number() {
    let (_d, state) = state();
    for amount in [
        json!(1_073_741_824),
        json!(1_073_741_824.0),
        json!(1.073741824e9),
    ] {
        let body =
            json!({"containers": [{"resources": {"hugepages-2Mi": amount}}], "numaNodes": [0]});
        let (status, answer) = post(&state, "/v1/admit", &body).await;
        assert_eq!(status, StatusCode::OK, "{body}: {answer}");
        assert_eq!(
            answer["checks"][0]["requestedBytes"],
            1u64 << 30,
            "{answer}"
        );
    }
    let half = json!({"containers": [{"resources": {"hugepages-2Mi": 0.5}}], "numaNodes": [0]});
    let (status, _) = post(&state, "/v1/admit", &half).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_document_states_the_identifier_rules_and_this_machines_nodes() {
    let (_d, state) = state();
    let (status, _, doc) = send(&state, "GET", "/openapi.json", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    let schemas = &doc["components"]["schemas"];
    let pod = &schemas["ShortPod"]["properties"];
    let meta = &schemas["Pod"]["properties"]["metadata"]["properties"];
    use crate::kube::identifiers as ids;
    for (field, pattern, max) in [
        ("uid", ids::UID_PATTERN, ids::UID_LENGTH),
        ("namespace", ids::LABEL_PATTERN, ids::LABEL_MAX),
        ("name", ids::SUBDOMAIN_PATTERN, ids::SUBDOMAIN_MAX),
    ] {
        for schema in [&pod[field], &meta[field]] {
            assert_eq!(schema["pattern"], format!("^$|{pattern}"), "{field}");
            assert_eq!(schema["maxLength"], max, "{field}");
        }
    }
    let container = &schemas["Container"]["properties"]["name"];
    assert_eq!(container["pattern"], format!("^$|{}", ids::LABEL_PATTERN));
    let short = &schemas["AdmitShort"]["properties"];
    assert_eq!(short["numaNodes"]["minItems"], 1);
    assert_eq!(short["numaNodes"]["items"]["enum"], json!([0, 1]));
    assert!(
        short["topologyPolicy"]["enum"]
            .as_array()
            .is_some_and(|e| e.contains(&Value::Null))
    );
    assert_eq!(schemas["Pod"]["properties"]["spec"]["type"], "object");
}
