//! Asking every candidate's agent at once: one task per agent, all under one deadline for the
//! whole call (`--agent-timeout`). What an agent answered in time is its [`Heard::Answer`];
//! a failed call, a node whose agent cannot be found, and an agent still silent at the deadline
//! are [`Heard::Silent`] with the reason. A call still running at the deadline is not waited for,
//! but it is not cancelled either: it finishes in the background within the dial's and the
//! answer's own limits ([`super::agents`]), so that its connection is kept. Cancelled, a cold
//! start's thousand calls whose handshakes outlast the deadline would each throw away a
//! connection the next call must dial again, and the calls after it as well. Calls share one
//! bound, every scheduler call and binding of the process together ([`MAX_CALLS`] in flight,
//! those in the background included): a call that has no place by its caller's deadline is
//! never made, and is silent saying so, so a burst of calls, or one call naming every node,
//! holds at most that many dials. Each call that completes
//! is timed in the [`Metrics`]. The calls run in the caller's span and trace context, so that
//! each is a child of the scheduler's call ([`super::trace`]).

use std::{net::SocketAddr, time::Duration};

use hyper::body::Bytes;
use tokio::{sync::Semaphore, task::JoinSet, time::Instant};

use super::{
    agents::{Client, Reply},
    metrics::Metrics,
    trace,
};

/// The most agent calls in flight at once in the process: five times the calls of a filter of
/// the largest shipped `nodenames` list the streams cannot answer, well within the descriptors
/// and the memory limit of the Deployment (a connection is a few tens of KiB).
pub const MAX_CALLS: usize = 1024;

/// The places of [`MAX_CALLS`].
static CALLS: Semaphore = Semaphore::const_new(MAX_CALLS);

/// An agent to ask: its node's name and where it listens, or why it is not known.
pub type Target = Result<(String, SocketAddr), String>;

/// What became of one agent's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    Answer(Reply),
    /// No usable answer, and why.
    Silent(String),
}

/// What the agents are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// A dry run (the extender's, or an admission request's that is one), else the real
    /// admission, which reserves (a binding).
    pub dry_run: bool,
}

/// Asks each agent of `targets` (an address, or why there is none) for `ask` of `body`; the
/// answers in the same order, within `timeout` of the start.
pub async fn ask_all(
    client: &Client,
    body: &Bytes,
    targets: &[Target],
    ask: Ask,
    timeout: Duration,
    metrics: &Metrics,
) -> Vec<Heard> {
    let deadline = Instant::now() + timeout;
    let mut heard: Vec<Option<Heard>> = vec![None; targets.len()];
    let mut calls = JoinSet::new();
    for (i, target) in targets.iter().enumerate() {
        match target {
            Ok((node, addr)) => {
                let (client, body) = (client.clone(), body.clone());
                let (node, addr) = (node.clone(), *addr);
                calls.spawn(trace::carried(async move {
                    let Ok(Ok(_place)) = tokio::time::timeout_at(deadline, CALLS.acquire()).await
                    else {
                        let why = format!(
                            "agent at {addr}: not asked: {MAX_CALLS} agent calls were in flight until the deadline"
                        );
                        return (i, Err(why), None);
                    };
                    let started = Instant::now();
                    let result = client.admit(&node, addr, body, ask.dry_run).await;
                    (i, result.map_err(|e| e.to_string()), Some(started.elapsed()))
                }));
            }
            Err(why) => heard[i] = Some(Heard::Silent(why.clone())),
        }
    }
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, calls.join_next()).await {
        if let Ok((i, result, took)) = done {
            if let Some(took) = took {
                metrics.agent_call(took);
            }
            heard[i] = Some(match result {
                Ok(reply) => Heard::Answer(reply),
                Err(why) => Heard::Silent(why),
            });
        }
    }
    calls.detach_all();
    heard
        .into_iter()
        .zip(targets)
        .map(|(h, target)| {
            h.unwrap_or_else(|| {
                let at = target
                    .as_ref()
                    .map_or_else(|_| "?".to_owned(), |(_, a)| a.to_string());
                Heard::Silent(format!("agent at {at}: no answer within {timeout:?}"))
            })
        })
        .collect()
}
