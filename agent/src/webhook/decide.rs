//! From the agents' answers to the scheduler's: plain functions, no I/O.
//!
//! **filter.** A node whose allocatable hugepages of some size are less than the pod needs can
//! never take it, whatever is preempted: it goes to `failedAndUnresolvableNodes` without asking
//! its agent. The others are asked: a node whose agent admits the dry run stays; one it refuses
//! goes to `failedNodes` with the agent's message (KEP-5759's, or the kubelet's
//! `TopologyAffinityError`); one whose agent did not answer in time (or answered nonsense, or
//! cannot be found) stays under `--failure-policy ignore` and goes to `failedNodes` with why
//! under `fail`. A node the webhook does not know (a name its Node cache does not hold) goes to
//! `failedNodes` with that said, whatever the policy.
//!
//! **prioritize** ([`score`], 0 to 10): a pod that fits on one NUMA node scores 6 to 10, one
//! that must span several 1 to 5; within each band, 4 points of headroom: `floor(4 × h)` where
//! `h` is the smallest, over the page sizes checked, of `(available − requested) / available`.
//! A node that does not fit, or whose agent did not answer, scores 0.

use super::{FailurePolicy, agents::Reply, ask::Heard, extender::FailedNodes, metrics::Outcome};
use crate::{kube::pod::Hugepages, quantity::format_binary};

/// One candidate, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// The agent admits the dry run.
    Fits(Reply),
    /// The agent refuses it; the message says why.
    Misfit(String),
    /// The node's pools are smaller than the pod's need: preemption cannot help.
    Unresolvable(String),
    /// No usable answer, and why.
    Silent(String),
    /// The node is not known (not in the Node cache): failed, whatever the failure policy.
    Unknown(String),
}

impl Judged {
    /// What the metrics count it as.
    pub fn outcome(&self) -> Outcome {
        match self {
            Judged::Fits(_) => Outcome::Fit,
            Judged::Misfit(_) => Outcome::Misfit,
            Judged::Unresolvable(_) => Outcome::Unresolvable,
            Judged::Silent(_) => Outcome::NoAnswer,
            Judged::Unknown(_) => Outcome::Unknown,
        }
    }
}

/// Why a node with `allocatable` hugepages can never hold `need`, if it cannot; `None` when its
/// allocatable is unknown (then only its agent can say).
pub fn unresolvable(need: &Hugepages, allocatable: Option<&Hugepages>) -> Option<String> {
    let allocatable = allocatable?;
    need.iter().find_map(|(&size, &bytes)| {
        let has = allocatable.get(&size).copied().unwrap_or(0);
        (has < bytes).then(|| {
            format!(
                "the node's allocatable {} is {}, less than the pod's {}: preemption cannot help",
                size.resource_name(),
                format_binary(has),
                format_binary(bytes)
            )
        })
    })
}

/// An agent's answer, judged.
pub fn judge(heard: Heard) -> Judged {
    match heard {
        Heard::Answer(reply) if reply.allowed => Judged::Fits(reply),
        Heard::Answer(reply) => Judged::Misfit(reply.message.unwrap_or_else(|| {
            format!(
                "refused by the hugepage agent ({})",
                reply.reason.as_deref().unwrap_or("no reason given")
            )
        })),
        Heard::Silent(why) => Judged::Silent(why),
    }
}

/// The filter's verdict on candidates `(name, judged)`: the indices kept, and the failed nodes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    pub kept: Vec<usize>,
    pub failed: FailedNodes,
    pub unresolvable: FailedNodes,
}

/// Sorts the judged candidates, agents that did not answer by `policy`.
pub fn filter<'a>(
    judged: impl IntoIterator<Item = (&'a str, &'a Judged)>,
    policy: FailurePolicy,
) -> Filtered {
    let mut out = Filtered::default();
    for (i, (name, judged)) in judged.into_iter().enumerate() {
        match (judged, policy) {
            (Judged::Fits(_), _) | (Judged::Silent(_), FailurePolicy::Ignore) => out.kept.push(i),
            (Judged::Misfit(message) | Judged::Unknown(message), _) => {
                out.failed.insert(name.to_owned(), message.clone());
            }
            (Judged::Unresolvable(message), _) => {
                out.unresolvable.insert(name.to_owned(), message.clone());
            }
            (Judged::Silent(why), FailurePolicy::Fail) => {
                let message =
                    format!("hugepage verification unavailable (--failure-policy fail): {why}");
                out.failed.insert(name.to_owned(), message);
            }
        }
    }
    out
}

/// A node's score for the pod (see the module's documentation).
pub fn score(judged: &Judged) -> i64 {
    let Judged::Fits(reply) = judged else {
        return 0;
    };
    let band = if reply.numa_nodes.len() <= 1 { 6 } else { 1 };
    let headroom = reply
        .checks
        .iter()
        .map(|c| {
            let spare = u128::from(c.available_bytes.saturating_sub(c.requested_bytes));
            match u128::from(c.available_bytes) {
                0 => 0,
                available => 4 * spare / available,
            }
        })
        .min()
        .unwrap_or(0);
    band + i64::try_from(headroom.min(4)).unwrap_or(0)
}

#[cfg(test)]
mod tests;
