//! `POST /admission/mutate`: a pod that asks for hugepages and names no scheduler is given the
//! cluster's second scheduler (`--scheduler-name`, the `scheduler` component's
//! `hugepage-agent`), so that its nodes are filtered by the extender on clusters whose own
//! kube-scheduler cannot be configured. The `scheduler-by-default-webhook` component's
//! MutatingWebhookConfiguration sends pod `CREATE`s here, for clusters that do not serve the
//! MutatingAdmissionPolicy API (`admissionregistration.k8s.io/v1`, Kubernetes 1.36 and later)
//! that the `scheduler-by-default` component uses instead.
//!
//! [`judge`] decides, a plain function. The API server defaults a pod before mutating admission,
//! so "names no scheduler" is `spec.schedulerName` absent or `default-scheduler` (a pod that
//! names `default-scheduler` itself cannot be told apart). Left untouched: anything but a pod
//! `CREATE`, a pod created on a node (`spec.nodeName`: no scheduler places it), a pod naming
//! another scheduler, and a pod without hugepages (by the kubelet's rules, as the extender reads
//! them). The change is the JSON patch `[{"op": "add", "path": "/spec/schedulerName", "value":
//! NAME}]`, the same the policy's CEL makes (`tests/deploy.rs` evaluates both). Every request is
//! allowed: this webhook chooses a scheduler, it never judges; one it cannot read is allowed
//! unchanged, with a warning saying why.

use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::review::{AdmissionRequest, AdmissionResponse};
use crate::kube::{
    json::text_or_none,
    pod::{Pod, pod_hugepages},
};

/// The scheduler a pod without one is given by the API server's defaulting.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What [`judge`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// The pod is given the scheduler: this JSON patch.
    Assigned(serde_json::Value),
    /// Left as it is, and why.
    Untouched(String),
    /// The pod could not be read; left as it is.
    Unreadable(String),
}

/// The fields of a pod's `spec` that say who places it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Placement {
    #[serde(default, deserialize_with = "text_or_none")]
    scheduler_name: Option<String>,
    #[serde(default, deserialize_with = "text_or_none")]
    node_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Placed {
    #[serde(default)]
    spec: Placement,
}

/// Whether `request` creates a pod that should be given `scheduler`, and the patch that does.
pub fn judge(request: &AdmissionRequest, scheduler: &str) -> Judged {
    let is_pod = request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && request.resource.resource == "pods"
        && request.sub_resource.is_empty();
    if !is_pod || request.operation != "CREATE" {
        return Judged::Untouched(format!(
            "not a pod creation ({} {}{}{})",
            request.operation,
            request.resource.resource,
            if request.sub_resource.is_empty() {
                ""
            } else {
                "/"
            },
            request.sub_resource
        ));
    }
    let Some(object) = request.object.as_deref() else {
        return Judged::Unreadable("the review has no object".to_owned());
    };
    let placed: Placed = match serde_json::from_str(object.get()) {
        Ok(placed) => placed,
        Err(e) => return Judged::Unreadable(format!("the pod: {e}")),
    };
    if placed
        .spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty())
    {
        return Judged::Untouched("created on a node (spec.nodeName)".to_owned());
    }
    match placed.spec.scheduler_name.as_deref() {
        None | Some("" | DEFAULT_SCHEDULER) => {}
        Some(named) => return Judged::Untouched(format!("names the scheduler {named:?}")),
    }
    let pod: Pod = match serde_json::from_str(object.get()) {
        Ok(pod) => pod,
        Err(e) => return Judged::Unreadable(format!("the pod: {e}")),
    };
    match pod_hugepages(&pod.spec) {
        Err(e) => Judged::Unreadable(format!("the pod: {e}")),
        Ok(pages) if pages.total.is_empty() => {
            Judged::Untouched("asks for no hugepages".to_owned())
        }
        Ok(_) => Judged::Assigned(patch(scheduler)),
    }
}

/// The answer to the request `uid` judged so: always allowed; the patch when assigned, a warning
/// when the pod could not be read.
pub fn answer(uid: String, judged: &Judged) -> AdmissionResponse {
    let mut response = AdmissionResponse {
        uid,
        allowed: true,
        ..AdmissionResponse::default()
    };
    match judged {
        Judged::Assigned(patch) => {
            let text = patch.to_string();
            response.patch_type = Some("JSONPatch");
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(text));
        }
        Judged::Untouched(_) => {}
        Judged::Unreadable(why) => {
            response.warnings = vec![format!(
                "hugepage-agent webhook: scheduler not chosen for this pod: {why}"
            )];
        }
    }
    response
}

/// The JSON patch that gives a pod `scheduler`.
pub fn patch(scheduler: &str) -> serde_json::Value {
    json!([{"op": "add", "path": "/spec/schedulerName", "value": scheduler}])
}

#[cfg(test)]
mod tests;
