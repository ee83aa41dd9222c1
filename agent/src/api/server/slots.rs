//! The places a connection holds before and after its client is authenticated: one of its
//! peer's (`--max-connections-per-peer`, handshaking and served together, so one source address
//! cannot hold every place), one of the handshakes' (`--max-handshakes`, while its TLS
//! handshake runs, apart from the served connections, so stalled handshakes keep no served
//! connection out), then one of the served connections' (`--max-connections`). Each place is a
//! guard, given back when dropped.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

/// Connections open per peer address, the listener's threads together.
#[derive(Debug, Default)]
pub struct Peers(Mutex<HashMap<IpAddr, usize>>);

/// One of a peer's places, until dropped.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    /// A place for `ip`, or `None` if it already holds `max`.
    pub fn take(peers: &Arc<Peers>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = peers.0.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.entry(ip).or_default();
        if *held >= max {
            return None;
        }
        *held += 1;
        Some(PeerSlot {
            peers: Arc::clone(peers),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = open.get_mut(&self.ip) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Handshakes running now, the listener's threads together.
#[derive(Debug, Default)]
pub struct Handshakes(AtomicUsize);

/// One handshake's place, until dropped (the handshake ended).
#[derive(Debug)]
pub struct Handshaking(Arc<Handshakes>);

impl Handshakes {
    /// A place for one more handshake, or `None` if `max` are running.
    pub fn take(handshakes: &Arc<Handshakes>, max: usize) -> Option<Handshaking> {
        handshakes
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Handshaking(Arc::clone(handshakes)))
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_places_and_others_are_apart() {
        let peers = Arc::new(Peers::default());
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let held: Vec<_> = (0..2).filter_map(|_| Peers::take(&peers, a, 2)).collect();
        assert_eq!(held.len(), 2);
        assert!(Peers::take(&peers, a, 2).is_none());
        let other = Peers::take(&peers, b, 2);
        assert!(other.is_some());
        drop(held);
        let again: Vec<_> = (0..2).filter_map(|_| Peers::take(&peers, a, 2)).collect();
        assert_eq!(again.len(), 2, "both places given back");
    }

    #[test]
    fn handshakes_are_bounded_and_given_back() {
        let handshakes = Arc::new(Handshakes::default());
        let first = Handshakes::take(&handshakes, 1);
        assert!(first.is_some());
        assert!(Handshakes::take(&handshakes, 1).is_none());
        drop(first);
        assert!(Handshakes::take(&handshakes, 1).is_some());
    }
}
