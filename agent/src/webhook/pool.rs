//! The webhook's idle connections to the agents, by the name the agent was verified as and its
//! address (under `--agent-identity per-node` the name is the node's: a connection verified for
//! one node is never handed to a call for another, even at the same address): a call takes one (the most
//! recently parked) or dials, and parks it again after a complete answer. At most
//! [`IDLE_PER_AGENT`] are kept per agent and none longer than [`IDLE_TIMEOUT`]; [`Idle::sweep`]
//! closes the expired ones (the client runs it every [`SWEEP_EVERY`]).
//!
//! A parked connection holds its TLS state and socket only. Before one is handed out it is
//! checked without blocking: if the agent closed it (end of stream) or sent anything while it was
//! idle (a TLS alert), it is closed instead; a connection that idles must have nothing to read.
//! The check reads the TCP socket under TLS, which is safe for exactly that reason: any byte
//! there means the connection is not reused.

use std::{
    collections::HashMap,
    io::ErrorKind,
    net::SocketAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use rustls_pki_types::ServerName;

use super::dial::Stream;

/// Whom a connection was dialled to: the name the agent was verified as, and its address.
pub type Key = (ServerName<'static>, SocketAddr);

/// Idle connections kept per agent: a filter call asks each agent once, and calls overlap
/// little.
pub const IDLE_PER_AGENT: usize = 4;
/// How long an idle connection is kept: under the agents' `--header-read-timeout` (30 s by
/// default), which also closes a kept-alive connection idle that long. The webhook closes first,
/// so an agent never closes a connection as the webhook sends on it, and never counts the
/// webhook's idle connections as slow heads (`limit="header_timeout"`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How often expired connections are closed: an idle connection is closed within 25 s.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

struct Parked {
    stream: Stream,
    since: Instant,
}

/// The idle connections of one client config.
#[derive(Default)]
pub struct Idle {
    parked: Mutex<HashMap<Key, Vec<Parked>>>,
}

impl Idle {
    /// An idle connection to `key` that is still open, if there is one; those found closed or
    /// expired on the way are closed.
    pub fn take(&self, key: &Key, now: Instant) -> Option<Stream> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let list = parked.get_mut(key)?;
        let mut found = None;
        while let Some(p) = list.pop() {
            if now.saturating_duration_since(p.since) < IDLE_TIMEOUT && quiet(&p.stream) {
                found = Some(p.stream);
                break;
            }
        }
        if list.is_empty() {
            parked.remove(key);
        }
        found
    }

    /// Parks `stream` to `key` at `now`, unless [`IDLE_PER_AGENT`] already are (it is closed).
    pub fn park(&self, key: Key, stream: Stream, now: Instant) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let list = parked.entry(key).or_default();
        if list.len() < IDLE_PER_AGENT {
            list.push(Parked { stream, since: now });
        }
    }

    /// Closes the connections idle for [`IDLE_TIMEOUT`] at `now`; how many were.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let mut closed = 0;
        parked.retain(|_, list| {
            let before = list.len();
            list.retain(|p| now.saturating_duration_since(p.since) < IDLE_TIMEOUT);
            closed += before - list.len();
            !list.is_empty()
        });
        closed
    }
}

/// Whether an idle connection has nothing to read: not closed by the agent, no alert.
fn quiet(stream: &Stream) -> bool {
    let (tcp, _) = stream.get_ref();
    let mut byte = [0u8; 1];
    matches!(tcp.try_read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock)
}
