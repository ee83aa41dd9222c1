//! `POST /admission/validate`: the validating admission webhook, at the moment a pod is bound
//! to a node. What it checks ([`subject`], a plain function):
//!
//! * `pods/binding` CREATE: the `Binding`'s `target.name` is the node; the pod (the request's
//!   `name` in its `namespace`) is read through the Kubernetes API, and only a pod that exists,
//!   has the Binding's `metadata.uid` when it carries one, is not bound yet and is not being
//!   deleted ([`bindable`]) is judged: any other binding is denied (404 or 409, saying why) and
//!   reserves nothing, whatever the failure policy. What is reserved is the pod's request as the
//!   API has it, never as the review tells it;
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
//!
//! The webhook cannot tell who sent a review, so every reservation it makes is held until the
//! API confirms it ([`super::confirm`]): a review the API server never followed with the binding
//! holds its pages for `--reservation-confirm-within` at most.

use std::{net::SocketAddr, time::SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{info, warn};

use super::{
    FailurePolicy,
    ask::{Ask, Heard, ask_all},
    confirm::{self, MAX_PENDING, Made},
    context::Context,
    decide::Judged,
    metrics::{Unconfirmed, Verdict},
    pod::{self, PodRequest},
    review::{AdmissionRequest, AdmissionResponse, Status},
    table,
};
use crate::kube::json::text_or_none;

/// What a request asks the webhook to judge.
#[derive(Debug, Clone)]
pub enum Subject {
    /// A pod bound to `node` by a `pods/binding`; the pod is read through the API. `uid` is the
    /// Binding's `metadata.uid` when it carries one (kube-scheduler's binder sets the pod's).
    Binding {
        namespace: String,
        pod: String,
        uid: Option<String>,
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
                    uid,
                    node,
                },
                Subject::Binding {
                    namespace: n,
                    pod: p,
                    uid: u,
                    node: o,
                },
            ) => (namespace, pod, uid, node) == (n, p, u, o),
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
    uid: Option<String>,
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
    #[serde(default, deserialize_with = "text_or_none")]
    uid: Option<String>,
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
            uid: f.uid,
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
                uid: given(binding.metadata.uid),
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
            uid: bound_uid,
            node,
        }) => match read_pod(context, &namespace, &pod).await {
            Ok(read) => match bindable(&read, bound_uid.as_deref()) {
                Ok(()) => match serde_json::value::to_raw_value(&read) {
                    Ok(value) => (value, node),
                    Err(e) => return invalid(uid, format!("pod {namespace}/{pod}: {e}")),
                },
                Err(refusal) => return refused(uid, &node, refusal),
            },
            Err(Unread::Gone(why)) => return refused(uid, &node, Refusal::Gone(why)),
            Err(Unread::Unreadable(why)) => return unverified(context, uid, &node, &why),
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
    if !dry_run && !context.pending.has_room(&pod.uid) {
        let why = format!(
            "{MAX_PENDING} reservations await the API's confirmation (--reservation-confirm-within)"
        );
        return unverified(context, uid, &node, &why);
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
        if let (false, Some(made), Ok((_, agent))) = (dry_run, &reply.reservation, &target[0]) {
            pending(context, &pod, &node, *agent, &made.id).await;
        }
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

/// Holds the reservation `id` the agent at `agent` made for `pod` on `node` until the API
/// confirms it ([`super::confirm`]); the pod's reservation on another node is released at once.
async fn pending(context: &Context, pod: &PodRequest, node: &str, agent: SocketAddr, id: &str) {
    let meta = &pod.pod.metadata;
    let made = Made {
        uid: pod.uid.clone(),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        node: node.to_owned(),
        agent,
        id: id.to_owned(),
    };
    if let Some(earlier) = context.pending.record(made, tokio::time::Instant::now()) {
        confirm::release(
            &context.client,
            &context.metrics,
            &earlier,
            Unconfirmed::Moved,
        )
        .await;
    }
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

/// Why a bound pod was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unread {
    /// The API says there is no such pod.
    Gone(String),
    /// The API could not be asked, or did not answer: the failure policy decides.
    Unreadable(String),
}

/// Why a binding reserves nothing, whatever the failure policy: the API's pod is not the one a
/// binding may place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No pod of that name.
    Gone(String),
    /// The pod of that name has another UID than the Binding's.
    OtherUid { bound: String, api: String },
    /// The pod is already bound to `node`.
    Bound { node: String },
    /// The pod is being deleted.
    Terminating,
}

/// Whether the API's `pod` may be bound by a Binding carrying `bound_uid`:
/// it is the Binding's pod (same UID when the Binding names one), not yet bound and not being
/// deleted.
pub fn bindable(pod: &Pod, bound_uid: Option<&str>) -> Result<(), Refusal> {
    let api_uid = pod.metadata.uid.clone().unwrap_or_default();
    if let Some(bound) = bound_uid
        && bound != api_uid
    {
        return Err(Refusal::OtherUid {
            bound: bound.to_owned(),
            api: api_uid,
        });
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(Refusal::Terminating);
    }
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(node) if !node.is_empty() => Err(Refusal::Bound {
            node: node.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// The pod `namespace/name`, read through the API.
async fn read_pod(context: &Context, namespace: &str, name: &str) -> Result<Pod, Unread> {
    let pods: Api<Pod> = Api::namespaced(context.kube.clone(), namespace);
    pods.get(name).await.map_err(|e| match e {
        kube::Error::Api(status) if status.code == 404 => {
            Unread::Gone(format!("pod {namespace}/{name} does not exist in the API"))
        }
        e => Unread::Unreadable(format!(
            "pod {namespace}/{name} cannot be read through the API: {e}"
        )),
    })
}

/// A binding the API's pod does not allow: denied (code 409, or 404 for a pod that does not
/// exist) whatever the failure policy, nothing reserved.
fn refused(uid: String, node: &str, refusal: Refusal) -> (AdmissionResponse, Verdict) {
    let (code, message) = match refusal {
        Refusal::Gone(why) => (404, why),
        Refusal::OtherUid { bound, api } => (
            409,
            format!("the Binding's metadata.uid {bound} is not the pod's UID in the API ({api})"),
        ),
        Refusal::Bound { node: on } => (409, format!("the pod is already bound to node {on}")),
        Refusal::Terminating => (
            409,
            "the pod is being deleted (metadata.deletionTimestamp is set)".to_owned(),
        ),
    };
    info!(node, code, "binding denied: {message}");
    let status = Status {
        code,
        reason: "BindingNotAllowed".to_owned(),
        message: format!("hugepage-agent webhook: binding to node {node} refused: {message}"),
    };
    denied(uid, status, Verdict::Invalid)
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
