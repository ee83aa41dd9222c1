use serde_json::{Value, json};

use super::*;
use crate::webhook::review::AdmissionReview;

/// A pod `CREATE` as kube-apiserver sends it to a mutating webhook (`admission.k8s.io/v1`), the
/// pod defaulted (`schedulerName: default-scheduler`, every container's `resources`), with
/// `spec` changed by `edit`.
fn creation(edit: impl FnOnce(&mut Value)) -> AdmissionRequest {
    let mut pod = json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "dpdk-0", "namespace": "telco", "creationTimestamp": null},
        "spec": {
            "containers": [{
                "name": "fwd",
                "image": "registry.example.com/fwd:1",
                "resources": {
                    "limits": {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "512Mi"},
                    "requests": {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "512Mi"}
                },
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {}
    });
    edit(&mut pod["spec"]);
    review(json!({
        "uid": "8f7c2a3e-1b4d-4e5f-9a6b-7c8d9e0f1a2b",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "telco",
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod,
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    }))
}

fn review(request: Value) -> AdmissionRequest {
    let review =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
    let review: AdmissionReview = serde_json::from_str(&review.to_string()).expect("a review");
    review.request.expect("its request")
}

const NAME: &str = "hugepage-agent";

fn assigned() -> Judged {
    Judged::Assigned(json!([{"op": "add", "path": "/spec/schedulerName", "value": NAME}]))
}

#[test]
fn a_pod_with_hugepages_and_the_default_scheduler_is_given_the_second_one() {
    assert_eq!(judge(&creation(|_| {}), NAME), assigned());
    // Not defaulted (as a test client may send it): the same.
    let request = creation(|spec| {
        spec.as_object_mut().map(|s| s.remove("schedulerName"));
    });
    assert_eq!(judge(&request, NAME), assigned());
    // The name is the flag's.
    assert_eq!(
        judge(&creation(|_| {}), "numa-aware"),
        Judged::Assigned(patch("numa-aware"))
    );
}

#[test]
fn hugepages_anywhere_the_kubelet_counts_them_are_enough() {
    let init = creation(|spec| {
        spec["initContainers"] = spec["containers"].clone();
        spec["containers"][0]["resources"] = json!({});
    });
    assert_eq!(judge(&init, NAME), assigned());
    let limits_only = creation(|spec| {
        spec["containers"][0]["resources"] = json!({"limits": {"hugepages-1Gi": "2Gi"}});
    });
    assert_eq!(judge(&limits_only, NAME), assigned());
    let pod_level = creation(|spec| {
        spec["containers"][0]["resources"] = json!({});
        spec["resources"] = json!({"limits": {"hugepages-2Mi": "64Mi", "memory": "1Gi"}});
    });
    assert_eq!(judge(&pod_level, NAME), assigned());
}

#[test]
fn pods_that_name_a_scheduler_a_node_or_no_hugepages_are_untouched() {
    let named = creation(|spec| spec["schedulerName"] = json!("volcano"));
    assert_eq!(
        judge(&named, NAME),
        Judged::Untouched("names the scheduler \"volcano\"".to_owned())
    );
    let already = creation(|spec| spec["schedulerName"] = json!(NAME));
    assert!(matches!(judge(&already, NAME), Judged::Untouched(_)));
    let placed = creation(|spec| spec["nodeName"] = json!("worker-3"));
    assert_eq!(
        judge(&placed, NAME),
        Judged::Untouched("created on a node (spec.nodeName)".to_owned())
    );
    let plain = creation(|spec| {
        spec["containers"][0]["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
    });
    assert_eq!(
        judge(&plain, NAME),
        Judged::Untouched("asks for no hugepages".to_owned())
    );
}

#[test]
fn anything_but_a_pod_creation_is_untouched() {
    let mut update = creation(|_| {});
    update.operation = "UPDATE".to_owned();
    assert_eq!(
        judge(&update, NAME),
        Judged::Untouched("not a pod creation (UPDATE pods)".to_owned())
    );
    let mut binding = creation(|_| {});
    binding.sub_resource = "binding".to_owned();
    binding.kind.kind = "Binding".to_owned();
    assert_eq!(
        judge(&binding, NAME),
        Judged::Untouched("not a pod creation (CREATE pods/binding)".to_owned())
    );
}

#[test]
fn a_pod_that_cannot_be_read_is_left_as_it_is_saying_why() {
    let broken = creation(|spec| spec["containers"] = json!("fwd"));
    assert!(
        matches!(judge(&broken, NAME), Judged::Unreadable(why) if why.starts_with("the pod: ")),
    );
    let bad_quantity = creation(|spec| {
        spec["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = json!("lots");
    });
    assert!(matches!(judge(&bad_quantity, NAME), Judged::Unreadable(_)));
    let mut empty = creation(|_| {});
    empty.object = None;
    assert_eq!(
        judge(&empty, NAME),
        Judged::Unreadable("the review has no object".to_owned())
    );
}

#[test]
fn the_answer_allows_and_carries_the_patch_as_base64_json() {
    let answer = answer("u-1".to_owned(), &assigned());
    let review = serde_json::to_value(answer.into_review()).expect("JSON");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["response"]["uid"], "u-1");
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(review["response"]["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch: Value = serde_json::from_slice(&patch).expect("JSON");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/schedulerName", "value": NAME}])
    );
    let untouched = serde_json::to_value(answer_of(&Judged::Untouched("x".into()))).expect("JSON");
    assert_eq!(untouched, json!({"uid": "u-2", "allowed": true}));
    let unreadable = answer_of(&Judged::Unreadable("the pod: nonsense".into()));
    assert!(unreadable.allowed && unreadable.patch.is_none());
    assert_eq!(
        unreadable.warnings,
        ["hugepage-agent webhook: scheduler not chosen for this pod: the pod: nonsense"]
    );
}

fn answer_of(judged: &Judged) -> AdmissionResponse {
    answer("u-2".to_owned(), judged)
}
