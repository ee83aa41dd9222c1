//! `POST /admission/validate`: the validating admission webhook, at the moment a pod is bound
//! to a node. What it checks ([`subject`], a plain function):
//!
//! * `pods/binding` CREATE: the `Binding`'s `target.name` is the node; the pod (the request's
//!   `name` in its `namespace`) is read through the Kubernetes API;
//! * `pods` CREATE with `spec.nodeName` set (a pod that bypasses the scheduler): the pod is the
//!   request's object;
//! * anything else is allowed at once, as is a pod that asks for no hugepages.
//!
//! The node's agent (found in the Node cache) is asked through [`super::ask`], as the
//! extender's are (one deadline, the call timed and traced), for the real admission, which reserves
//! the pod's hugepages by its UID — or for a dry run when the request is one (`dryRun`), so a
//! dry run never reserves. A refusal denies the request with the agent's `reason` and exact
//! message (code 403). When the agent cannot be asked or does not answer within
//! `--agent-timeout` (or the pod cannot be read), `--failure-policy` decides: `ignore` allows
//! with an admission warning saying why, `fail` denies saying why. A request the webhook cannot
//! read is denied with code 400 naming what is wrong. A refusal of a node whose streamed state
//! ([`super::table`]) fits the pod is counted: the table was behind the kernel.

use std::{net::SocketAddr, time::SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{info, warn};

use super::{
    FailurePolicy,
    ask::{Ask, Heard, ask_all},
    context::Context,
    decide::Judged,
    metrics::Verdict,
    pod::{self, PodRequest},
    review::{AdmissionRequest, AdmissionResponse, Status},
    table,
};
use crate::kube::json::text_or_none;

/// What a request asks the webhook to judge.
#[derive(Debug, Clone)]
pub enum Subject {
    /// A pod bound to `node` by a `pods/binding`; the pod is read through the API.
    Binding {
        namespace: String,
        pod: String,
        node: String,
    },
    /// A pod created with `spec.nodeName` already set, as sent.
    Placed { pod: Box<RawValue>, node: String },
    /// Not for the webhook to judge, and why.
    Pass(&'static str),
}

impl PartialEq for Subject {
    fn eq(&self, other: &Subject) -> bool {
        match (self, other) {
            (
                Subject::Binding {
                    namespace,
                    pod,
                    node,
                },
                Subject::Binding {
                    namespace: n,
                    pod: p,
                    node: o,
                },
            ) => (namespace, pod, node) == (n, p, o),
            (Subject::Placed { pod, node }, Subject::Placed { pod: p, node: o }) => {
                (pod.get(), node) == (p.get(), o)
            }
            (Subject::Pass(why), Subject::Pass(w)) => why == w,
            _ => false,
        }
    }
}

/// What the webhook reads of a request's object, a `Binding` or a `Pod`: the names that are
/// text, nothing else kept.
#[derive(Debug, Default, Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Named,
    #[serde(default)]
    target: Named,
    #[serde(default)]
    spec: Placement,
}

#[derive(Debug, Default)]
struct Named {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Debug, Default)]
struct Placement {
    node_name: Option<String>,
}

/// An object's fields that are text; any other value of the field (or of the object) is none.
#[derive(Deserialize)]
struct NamedFields {
    #[serde(default, deserialize_with = "text_or_none")]
    name: Option<String>,
    #[serde(default, deserialize_with = "text_or_none")]
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlacementFields {
    #[serde(default, deserialize_with = "text_or_none")]
    node_name: Option<String>,
}

/// `T` when the value is an object that reads as `F`; else its default (the value skipped, not
/// kept).
fn or_default<'de, D, T, F>(d: D, into: impl FnOnce(F) -> T) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default,
    F: serde::de::DeserializeOwned,
{
    let raw = <&RawValue>::deserialize(d)?;
    Ok(serde_json::from_str(raw.get()).map_or_else(|_| T::default(), into))
}

impl<'de> Deserialize<'de> for Named {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Named, D::Error> {
        or_default(d, |f: NamedFields| Named {
            name: f.name,
            namespace: f.namespace,
        })
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Placement, D::Error> {
        or_default(d, |f: PlacementFields| Placement {
            node_name: f.node_name,
        })
    }
}

/// What `request` asks to be judged, or what is wrong with it.
pub fn subject(request: &AdmissionRequest) -> Result<Subject, String> {
    if !request.resource.group.is_empty()
        || request.resource.resource != "pods"
        || request.operation != "CREATE"
    {
        return Ok(Subject::Pass("not the creation of a pod or of its binding"));
    }
    let raw = || {
        request
            .object
            .as_deref()
            .ok_or_else(|| "request.object: missing".to_owned())
    };
    let object = |raw: &RawValue| -> Object {
        // Not an object at all: none of its names are there.
        serde_json::from_str(raw.get()).unwrap_or_default()
    };
    let given = |text: Option<String>| text.filter(|t| !t.is_empty());
    match request.sub_resource.as_str() {
        "binding" => {
            let binding = object(raw()?);
            let node = given(binding.target.name).ok_or_else(|| {
                "request.object.target.name: the Binding names no node".to_owned()
            })?;
            let pod = given(Some(request.name.clone()))
                .or_else(|| given(binding.metadata.name))
                .ok_or_else(|| "request.name: the binding names no pod".to_owned())?;
            let namespace = given(Some(request.namespace.clone()))
                .or_else(|| given(binding.metadata.namespace))
                .ok_or_else(|| "request.namespace: the binding names no namespace".to_owned())?;
            Ok(Subject::Binding {
                namespace,
                pod,
                node,
            })
        }
        "" => {
            let pod = raw()?;
            Ok(match given(object(pod).spec.node_name) {
                Some(node) => Subject::Placed {
                    pod: pod.to_owned(),
                    node,
                },
                None => {
                    Subject::Pass("the pod names no node yet: the scheduler's extender checks it")
                }
            })
        }
        _ => Ok(Subject::Pass("another subresource of pods")),
    }
}

/// Judges `request` (see the module's documentation).
pub async fn validate(
    context: &Context,
    request: AdmissionRequest,
) -> (AdmissionResponse, Verdict) {
    let uid = request.uid.clone();
    let dry_run = request.dry_run.unwrap_or(false);
    let (value, node) = match subject(&request) {
        Ok(Subject::Pass(_)) => return allowed(uid, Verdict::NotChecked),
        Ok(Subject::Placed { pod, node }) => (pod, node),
        Ok(Subject::Binding {
            namespace,
            pod,
            node,
        }) => match read_pod(context, &namespace, &pod).await {
            Ok(value) => (value, node),
            Err(why) => return unverified(context, uid, &node, &why),
        },
        Err(why) => return invalid(uid, why),
    };
    let pod = match pod::read(Some(&*value)) {
        Ok(pod) => pod,
        Err(e) => return invalid(uid, e.to_string()),
    };
    if pod.need().is_empty() {
        return allowed(uid, Verdict::NotChecked);
    }
    let target = [context
        .nodes
        .candidate(&node)
        .and_then(|c| c.agent.map(|addr| (c.name, addr)))];
    let heard = ask_all(
        &context.client,
        &pod.body,
        &target,
        Ask { dry_run },
        context.timeout,
        &context.metrics,
    )
    .await
    .into_iter()
    .next();
    let reply = match heard {
        Some(Heard::Answer(reply)) => reply,
        Some(Heard::Silent(why)) => return unverified(context, uid, &node, &why),
        None => return unverified(context, uid, &node, "the agent was not asked"),
    };
    if reply.allowed {
        info!(pod = %pod.name, node, dry_run, numa_nodes = ?reply.numa_nodes, "binding admitted by the node's agent");
        return allowed(uid, Verdict::Allowed);
    }
    if table_fits(
        context,
        &node,
        target[0].as_ref().ok().map(|(_, addr)| addr),
        &pod,
    ) {
        context.metrics.table_disagreement();
        info!(pod = %pod.name, node, "the node's agent refused a binding that its streamed state fits: the state was behind the kernel");
    }
    let reason = reply
        .reason
        .unwrap_or_else(|| "FailedHugepagesVerification".to_owned());
    let message = reply
        .message
        .unwrap_or_else(|| format!("refused by the hugepage agent of node {node}"));
    info!(pod = %pod.name, node, reason, "binding denied: {message}");
    let status = Status {
        code: 403,
        reason,
        message,
    };
    denied(uid, status, Verdict::Denied)
}

/// Whether the table has a fresh state of `node` (its agent at `addr`) that `pod` fits.
fn table_fits(context: &Context, node: &str, addr: Option<&SocketAddr>, pod: &PodRequest) -> bool {
    let (Some(table), Some(addr)) = (context.table.as_ref(), addr) else {
        return false;
    };
    table.fresh(node, *addr).is_some_and(|streamed| {
        matches!(
            table::judge(&streamed, pod, SystemTime::now()),
            Some(Judged::Fits(_))
        )
    })
}

/// The pod `namespace/name`, read through the API, as JSON text.
async fn read_pod(context: &Context, namespace: &str, name: &str) -> Result<Box<RawValue>, String> {
    let pods: Api<Pod> = Api::namespaced(context.kube.clone(), namespace);
    let pod = pods
        .get(name)
        .await
        .map_err(|e| format!("pod {namespace}/{name} cannot be read through the API: {e}"))?;
    serde_json::value::to_raw_value(&pod).map_err(|e| format!("pod {namespace}/{name}: {e}"))
}

fn allowed(uid: String, verdict: Verdict) -> (AdmissionResponse, Verdict) {
    let response = AdmissionResponse {
        uid,
        allowed: true,
        ..AdmissionResponse::default()
    };
    (response, verdict)
}

fn denied(uid: String, status: Status, verdict: Verdict) -> (AdmissionResponse, Verdict) {
    let response = AdmissionResponse {
        uid,
        allowed: false,
        status: Some(status),
        ..AdmissionResponse::default()
    };
    (response, verdict)
}

fn invalid(uid: String, why: String) -> (AdmissionResponse, Verdict) {
    let status = Status {
        code: 400,
        reason: "BadRequest".to_owned(),
        message: format!("hugepage-agent webhook: {why}"),
    };
    denied(uid, status, Verdict::Invalid)
}

/// The pod's hugepages on `node` could not be verified (`why`): the failure policy decides.
fn unverified(
    context: &Context,
    uid: String,
    node: &str,
    why: &str,
) -> (AdmissionResponse, Verdict) {
    warn!(node, policy = ?context.policy, "a binding could not be verified: {why}");
    match context.policy {
        FailurePolicy::Ignore => {
            let warning = format!(
                "hugepages not verified on node {node} (admitted under --failure-policy ignore): {why}"
            );
            let response = AdmissionResponse {
                uid,
                allowed: true,
                warnings: vec![warning],
                ..AdmissionResponse::default()
            };
            (response, Verdict::FailOpen)
        }
        FailurePolicy::Fail => {
            let status = Status {
                code: 500,
                reason: "HugepagesVerificationUnavailable".to_owned(),
                message: format!(
                    "hugepage verification unavailable on node {node} (--failure-policy fail): {why}"
                ),
            };
            denied(uid, status, Verdict::FailClosed)
        }
    }
}

#[cfg(test)]
mod tests;
