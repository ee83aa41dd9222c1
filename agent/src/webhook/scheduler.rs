//! The extender's two calls, from `ExtenderArgs` to the answer: read the pod ([`super::pod`])
//! and the candidate nodes, answer a pod without hugepages at once with every node, ask the
//! agents of the others ([`super::ask`]) and decide ([`super::decide`]).
//!
//! Both forms are served, each answered in its own: `nodes` (whole `Node` objects, the
//! scheduler's `nodeCacheCapable: false`) and `nodenames` (`nodeCacheCapable: true`, the shipped
//! configuration). Either way each node is looked up by name in the [`NodeCache`], which the API
//! server's watch fills: nothing else of a `Node` the caller sent is read, so no address a caller
//! wrote is ever dialled. The `nodes` form's names are deduplicated, and a call naming more
//! distinct nodes than the cache holds is failed. A name the cache does not hold is failed with a
//! message saying so.

use std::{collections::HashSet, time::SystemTime};

use tracing::{debug, warn};

use super::{
    ask::{Ask, Heard, ask_all},
    cache::NodeCache,
    context::Context,
    decide::{self, Judged},
    extender::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList},
    node::{self, Candidate, NodeError},
    pod::{self, PodRequest},
    table,
};

const NO_NODES: &str = "the ExtenderArgs have neither nodes nor nodenames";

/// A candidate by name: found (in the arguments or the cache), or why not.
type Looked = (String, Result<Candidate, String>);

/// `POST /scheduler/filter`.
pub async fn filter(context: &Context, args: ExtenderArgs) -> ExtenderFilterResult {
    let pod = match pod::read(args.pod.as_deref()) {
        Ok(pod) => pod,
        Err(e) => return ExtenderFilterResult::failed(e.to_string()),
    };
    match (args.nodes, args.node_names) {
        (Some(list), _) if pod.need().is_empty() => ExtenderFilterResult {
            nodes: Some(list),
            ..ExtenderFilterResult::default()
        },
        (None, Some(names)) if pod.need().is_empty() => ExtenderFilterResult {
            node_names: Some(names),
            ..ExtenderFilterResult::default()
        },
        (Some(list), _) => match from_objects(&context.nodes, &list) {
            Ok((named, looked)) => {
                let sorted = sort(context, &pod, &looked).await;
                let kept: HashSet<&str> = sorted
                    .kept
                    .iter()
                    .filter_map(|i| looked.get(*i).map(|(name, _)| name.as_str()))
                    .collect();
                let keep: Vec<bool> = named.iter().map(|n| kept.contains(n.as_str())).collect();
                let items = list
                    .items
                    .into_iter()
                    .zip(keep)
                    .filter_map(|(item, keep)| keep.then_some(item))
                    .collect();
                ExtenderFilterResult {
                    nodes: Some(NodeList { items, ..list }),
                    failed_nodes: sorted.failed,
                    failed_and_unresolvable_nodes: sorted.unresolvable,
                    ..ExtenderFilterResult::default()
                }
            }
            Err(e) => ExtenderFilterResult::failed(e),
        },
        (None, Some(names)) => {
            let looked = from_cache(&context.nodes, names);
            let sorted = sort(context, &pod, &looked).await;
            let kept = sorted
                .kept
                .iter()
                .filter_map(|i| looked.get(*i).map(|(name, _)| name.clone()))
                .collect();
            ExtenderFilterResult {
                node_names: Some(kept),
                failed_nodes: sorted.failed,
                failed_and_unresolvable_nodes: sorted.unresolvable,
                ..ExtenderFilterResult::default()
            }
        }
        (None, None) => ExtenderFilterResult::failed(NO_NODES),
    }
}

/// The candidates judged and sorted by the filter's rules, agents that did not answer counted.
async fn sort(context: &Context, pod: &PodRequest, looked: &[Looked]) -> decide::Filtered {
    let judged = judge_all(context, pod, looked).await;
    let silent = judged
        .iter()
        .filter(|j| matches!(j, Judged::Silent(_)))
        .count();
    context.metrics.unanswered(context.policy, silent);
    decide::filter(
        looked.iter().map(|(name, _)| name.as_str()).zip(&judged),
        context.policy,
    )
}

/// `POST /scheduler/prioritize`: every candidate with its score, or why the call cannot be
/// answered.
pub async fn prioritize(
    context: &Context,
    args: ExtenderArgs,
) -> Result<Vec<HostPriority>, String> {
    let pod = pod::read(args.pod.as_deref()).map_err(|e| e.to_string())?;
    let looked = match (args.nodes, args.node_names) {
        (Some(list), _) if pod.need().is_empty() => return Ok(unscored(names_of(&list)?)),
        (Some(list), _) => from_objects(&context.nodes, &list)?.1,
        (None, Some(names)) if pod.need().is_empty() => return Ok(unscored(names)),
        (None, Some(names)) => from_cache(&context.nodes, names),
        (None, None) => return Err(NO_NODES.to_owned()),
    };
    if pod.need().is_empty() {
        return Ok(unscored(looked.into_iter().map(|(name, _)| name)));
    }
    let judged = judge_all(context, &pod, &looked).await;
    Ok(looked
        .into_iter()
        .zip(&judged)
        .map(|((host, _), j)| HostPriority {
            host,
            score: decide::score(j),
        })
        .collect())
}

/// Every node scored 0: a pod without hugepages has no preference here.
fn unscored(hosts: impl IntoIterator<Item = String>) -> Vec<HostPriority> {
    hosts
        .into_iter()
        .map(|host| HostPriority { host, score: 0 })
        .collect()
}

/// The `nodes` form: each item's name, and the candidates of the distinct names, from the
/// cache (nothing else of the objects sent is read). A Node without a name fails the call, as
/// does a list of more distinct names than the cache holds.
fn from_objects(cache: &NodeCache, list: &NodeList) -> Result<(Vec<String>, Vec<Looked>), String> {
    let named = names_of(list)?;
    let distinct = distinct(&named, cache.count())?;
    Ok((named, from_cache(cache, distinct)))
}

/// The name of each Node of `list`; a Node without one fails the call.
fn names_of(list: &NodeList) -> Result<Vec<String>, String> {
    list.items
        .iter()
        .enumerate()
        .map(|(index, item)| node::name_of(item).ok_or(NodeError::NoName { index }))
        .collect::<Result<Vec<String>, NodeError>>()
        .map_err(|e| e.to_string())
}

/// `names` without repeats, in their first order; more than `bound` distinct names is an error
/// saying so.
pub fn distinct(names: &[String], bound: usize) -> Result<Vec<String>, String> {
    let mut seen = HashSet::new();
    let mut distinct = Vec::new();
    for name in names {
        if seen.insert(name.as_str()) {
            if distinct.len() == bound {
                return Err(format!(
                    "nodes.items names more distinct nodes than the {bound} the webhook's Node cache holds"
                ));
            }
            distinct.push(name.clone());
        }
    }
    Ok(distinct)
}

/// The `nodenames` form's candidates, from the cache.
fn from_cache(cache: &NodeCache, names: Vec<String>) -> Vec<Looked> {
    names
        .into_iter()
        .map(|name| {
            let found = cache.candidate(&name);
            (name, found)
        })
        .collect()
}

/// Each candidate judged: by its allocatable hugepages first, then by its agent's streamed state
/// where that is fresh and decides alone ([`table`]), else by its agent, asked.
async fn judge_all(context: &Context, pod: &PodRequest, looked: &[Looked]) -> Vec<Judged> {
    let now = SystemTime::now();
    let streamed = |c: &Candidate| -> Option<Judged> {
        let table = context.table.as_ref()?;
        let streamed = table.fresh(&c.name, *c.agent.as_ref().ok()?)?;
        table::judge(&streamed, pod, now)
    };
    let mut from_table = 0;
    let settled: Vec<Option<Judged>> = looked
        .iter()
        .map(|(_, found)| match found {
            Ok(c) => decide::unresolvable(pod.need(), c.allocatable.as_ref())
                .map(Judged::Unresolvable)
                .or_else(|| {
                    let judged = streamed(c);
                    from_table += usize::from(judged.is_some());
                    judged
                }),
            Err(why) => Some(Judged::Unknown(why.clone())),
        })
        .collect();
    context.metrics.table_answers(from_table);
    let targets: Vec<_> = looked
        .iter()
        .zip(&settled)
        .filter(|(_, s)| s.is_none())
        .filter_map(|((_, found), _)| {
            let c = found.as_ref().ok()?;
            Some(c.agent.clone().map(|addr| (c.name.clone(), addr)))
        })
        .collect();
    let mut heard = ask_all(
        &context.client,
        &pod.body,
        &targets,
        Ask { dry_run: true },
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
    let mut silent = looked
        .iter()
        .zip(&judged)
        .filter_map(|((name, _), j)| match j {
            Judged::Silent(why) => Some((name.as_str(), why.as_str())),
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

#[cfg(test)]
mod tests;
