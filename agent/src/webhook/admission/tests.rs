use serde_json::{Value, json};

use super::*;
use crate::webhook::review::AdmissionReview;

/// A request as kube-apiserver sends it (`admission.k8s.io/v1`), its `request` being `request`.
fn request(request: Value) -> AdmissionRequest {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request
    });
    let review: AdmissionReview = serde_json::from_str(&review.to_string()).expect("a review");
    review.request.expect("its request")
}

fn binding(node: Value) -> Value {
    json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "binding",
        "requestKind": {"group": "", "version": "v1", "kind": "Binding"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "requestSubResource": "binding",
        "name": "dpdk-0",
        "namespace": "telco",
        "operation": "CREATE",
        "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
        "object": {
            "kind": "Binding",
            "apiVersion": "v1",
            "metadata": {"name": "dpdk-0", "namespace": "telco", "uid": "5d0c8ba2-3b1f-4f7a-9f35-6c1d2e3f4a5b", "creationTimestamp": null},
            "target": node
        },
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    })
}

#[test]
fn a_binding_names_the_pod_and_the_node() {
    let r = request(binding(json!({"kind": "Node", "name": "worker-1"})));
    assert_eq!(
        subject(&r),
        Ok(Subject::Binding {
            namespace: "telco".to_owned(),
            pod: "dpdk-0".to_owned(),
            uid: Some("5d0c8ba2-3b1f-4f7a-9f35-6c1d2e3f4a5b".to_owned()),
            node: "worker-1".to_owned()
        })
    );
    assert_eq!(r.dry_run, Some(false));
}

#[test]
fn a_binding_without_a_target_is_refused_naming_the_field() {
    let r = request(binding(json!({"kind": "Node"})));
    assert_eq!(
        subject(&r),
        Err("request.object.target.name: the Binding names no node".to_owned())
    );
}

#[test]
fn a_pod_created_on_a_node_is_judged_and_one_without_a_node_or_an_update_passes() {
    let pod = json!({"metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": "worker-2", "containers": []}});
    let create = |pod: &Value, operation: &str| {
        request(json!({
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "n",
            "operation": operation,
            "userInfo": {},
            "object": pod
        }))
    };
    assert_eq!(
        subject(&create(&pod, "CREATE")),
        Ok(Subject::Placed {
            pod: serde_json::value::to_raw_value(&pod).expect("JSON"),
            node: "worker-2".to_owned()
        })
    );
    let unplaced = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
    assert!(matches!(
        subject(&create(&unplaced, "CREATE")),
        Ok(Subject::Pass(_))
    ));
    assert!(matches!(
        subject(&create(&pod, "UPDATE")),
        Ok(Subject::Pass(_))
    ));
}

#[test]
fn other_resources_pass() {
    let r = request(json!({
        "uid": "u",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "operation": "CREATE",
        "userInfo": {},
        "object": {}
    }));
    assert_eq!(
        subject(&r),
        Ok(Subject::Pass("not the creation of a pod or of its binding"))
    );
}

/// The pod the API has: UID `uid`, bound to `node` when given, being deleted when `deleting`.
fn api_pod(uid: &str, node: Option<&str>, deleting: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": "dpdk-0", "namespace": "telco", "uid": uid,
            "deletionTimestamp": deleting.then_some("2026-11-28T15:00:00Z")
        },
        "spec": {"nodeName": node, "containers": [{"name": "c"}]}
    }))
    .expect("a pod")
}

#[test]
fn only_the_binding_s_own_pod_unbound_and_not_terminating_may_be_bound() {
    const UID: &str = "5d0c8ba2-3b1f-4f7a-9f35-6c1d2e3f4a5b";
    let pending = api_pod(UID, None, false);
    assert_eq!(bindable(&pending, Some(UID),), Ok(()));
    assert_eq!(bindable(&pending, None), Ok(()));
    assert_eq!(
        bindable(&pending, Some("other")),
        Err(Refusal::OtherUid {
            bound: "other".to_owned(),
            api: UID.to_owned()
        })
    );
    assert_eq!(
        bindable(&api_pod(UID, Some("worker-2"), false), Some(UID)),
        Err(Refusal::Bound {
            node: "worker-2".to_owned()
        })
    );
    assert_eq!(bindable(&api_pod(UID, Some(""), false), Some(UID)), Ok(()));
    assert_eq!(
        bindable(&api_pod(UID, None, true), Some(UID)),
        Err(Refusal::Terminating)
    );
}
