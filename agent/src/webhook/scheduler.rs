//! The extender's two calls, from `ExtenderArgs` to the answer: read the pod ([`super::pod`])
//! and the candidate nodes ([`super::node`]), answer a pod without hugepages at once with every
//! node, ask the agents of the others ([`super::ask`]) and decide ([`super::decide`]).
//!
//! Only the `nodes` form (`nodeCacheCapable: false`) is served for pods with hugepages; the
//! `nodenames` form needs the Node cache, which is not built yet: such a call fails with an
//! `error` saying so (a pod without hugepages is still answered with every node name).

use std::{sync::Arc, time::Duration};

use tracing::{debug, warn};

use super::{
    FailurePolicy,
    agents::Client,
    ask::{Heard, ask_all},
    decide::{self, Judged},
    extender::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList},
    metrics::Metrics,
    node::{self, Candidate},
    pod::{self, PodRequest},
};

/// What a call needs besides its arguments.
#[derive(Debug, Clone)]
pub struct Context {
    pub client: Client,
    pub policy: FailurePolicy,
    /// One deadline for all the agent calls of one scheduler call.
    pub timeout: Duration,
    pub metrics: Arc<Metrics>,
}

const NODENAMES_NOT_SERVED: &str = "the nodenames form of ExtenderArgs (nodeCacheCapable: true) is not served yet: configure the extender with nodeCacheCapable: false";

/// `POST /scheduler/filter`.
pub async fn filter(context: &Context, args: ExtenderArgs) -> ExtenderFilterResult {
    let pod = match pod::read(args.pod.as_ref()) {
        Ok(pod) => pod,
        Err(e) => return ExtenderFilterResult::failed(e.to_string()),
    };
    let Some(list) = args.nodes else {
        return match args.node_names {
            Some(names) if pod.need.is_empty() => ExtenderFilterResult {
                node_names: Some(names),
                ..ExtenderFilterResult::default()
            },
            Some(_) => ExtenderFilterResult::failed(NODENAMES_NOT_SERVED),
            None => {
                ExtenderFilterResult::failed("the ExtenderArgs have neither nodes nor nodenames")
            }
        };
    };
    if pod.need.is_empty() {
        return ExtenderFilterResult {
            nodes: Some(list),
            ..ExtenderFilterResult::default()
        };
    }
    let candidates = match candidates(&list, context.client.port()) {
        Ok(c) => c,
        Err(e) => return ExtenderFilterResult::failed(e),
    };
    let judged = judge_all(context, &pod, &candidates).await;
    let silent = judged
        .iter()
        .filter(|j| matches!(j, Judged::Silent(_)))
        .count();
    context.metrics.unanswered(context.policy, silent);
    let sorted = decide::filter(
        candidates.iter().map(|c| c.name.as_str()).zip(&judged),
        context.policy,
    );
    let mut keep = vec![false; list.items.len()];
    for i in sorted.kept {
        if let Some(k) = keep.get_mut(i) {
            *k = true;
        }
    }
    let NodeList { items, rest } = list;
    let items = items
        .into_iter()
        .zip(keep)
        .filter_map(|(item, keep)| keep.then_some(item))
        .collect();
    ExtenderFilterResult {
        nodes: Some(NodeList { items, rest }),
        failed_nodes: sorted.failed,
        failed_and_unresolvable_nodes: sorted.unresolvable,
        ..ExtenderFilterResult::default()
    }
}

/// `POST /scheduler/prioritize`: every candidate with its score, or why the call cannot be
/// answered.
pub async fn prioritize(
    context: &Context,
    args: ExtenderArgs,
) -> Result<Vec<HostPriority>, String> {
    let pod = pod::read(args.pod.as_ref()).map_err(|e| e.to_string())?;
    let Some(list) = args.nodes else {
        return match args.node_names {
            Some(names) if pod.need.is_empty() => Ok(names
                .into_iter()
                .map(|host| HostPriority { host, score: 0 })
                .collect()),
            Some(_) => Err(NODENAMES_NOT_SERVED.to_owned()),
            None => Err("the ExtenderArgs have neither nodes nor nodenames".to_owned()),
        };
    };
    let candidates = candidates(&list, context.client.port())?;
    let judged = if pod.need.is_empty() {
        vec![Judged::Silent("the pod asks for no hugepages".to_owned()); candidates.len()]
    } else {
        judge_all(context, &pod, &candidates).await
    };
    Ok(candidates
        .into_iter()
        .zip(&judged)
        .map(|(c, j)| HostPriority {
            host: c.name,
            score: decide::score(j),
        })
        .collect())
}

fn candidates(list: &NodeList, port: u16) -> Result<Vec<Candidate>, String> {
    list.items
        .iter()
        .enumerate()
        .map(|(i, item)| node::candidate(i, item, port).map_err(|e| e.to_string()))
        .collect()
}

/// Each candidate judged: by its allocatable hugepages first, then by its agent.
async fn judge_all(context: &Context, pod: &PodRequest, candidates: &[Candidate]) -> Vec<Judged> {
    let settled: Vec<Option<Judged>> = candidates
        .iter()
        .map(|c| decide::unresolvable(&pod.need, c.allocatable.as_ref()).map(Judged::Unresolvable))
        .collect();
    let targets: Vec<_> = candidates
        .iter()
        .zip(&settled)
        .filter(|(_, s)| s.is_none())
        .map(|(c, _)| c.agent.clone())
        .collect();
    let mut heard = ask_all(
        &context.client,
        &pod.body,
        &targets,
        context.timeout,
        &context.metrics,
    )
    .await
    .into_iter();
    let judged: Vec<Judged> = settled
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| decide::judge(heard.next().unwrap_or(Heard::Silent(String::new()))))
        })
        .collect();
    let mut silent = candidates.iter().zip(&judged).filter_map(|(c, j)| match j {
        Judged::Silent(why) => Some((c.name.as_str(), why.as_str())),
        _ => None,
    });
    if let Some((node, why)) = silent.next() {
        let others = silent.count();
        warn!(pod = %pod.name, node, others, policy = ?context.policy, "a node's agent did not answer: {why}");
    }
    for j in &judged {
        context.metrics.node(j.outcome());
    }
    debug!(pod = %pod.name, judged = ?judged, "candidates judged");
    judged
}
