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

/// Connections open per peer address, the listener's threads together, and how many more it
/// tried while it held its all (since [`Peers::hammering`] last looked).
#[derive(Debug, Default)]
pub struct Peers(Mutex<HashMap<IpAddr, Held>>);

#[derive(Debug, Default, Clone, Copy)]
struct Held {
    open: usize,
    refused: u32,
}

/// One of a peer's places, until dropped.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    /// A place for `ip`, or, if it already holds `max`, how many it was refused since
    /// [`Peers::hammering`] last looked, this one included.
    pub fn take(peers: &Arc<Peers>, ip: IpAddr, max: usize) -> Result<PeerSlot, u32> {
        let mut open = peers.0.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.entry(ip).or_default();
        if held.open >= max {
            held.refused = held.refused.saturating_add(1);
            return Err(held.refused);
        }
        held.open += 1;
        Ok(PeerSlot {
            peers: Arc::clone(peers),
            ip,
        })
    }
}

impl Peers {
    /// The peers that hold `max` places now and either tried `at_least` more since the last
    /// look or are `kept` (filtered already); the tries are counted afresh from here.
    pub fn hammering(
        &self,
        max: usize,
        at_least: u32,
        kept: impl Fn(IpAddr) -> bool,
    ) -> Vec<IpAddr> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = Vec::new();
        for (ip, held) in open.iter_mut() {
            if held.open >= max && (held.refused >= at_least || kept(*ip)) {
                found.push(*ip);
            }
            held.refused = 0;
        }
        found
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = open.get_mut(&self.ip) {
            held.open -= 1;
            if held.open == 0 {
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
        let held: Vec<_> = (0..2)
            .filter_map(|_| Peers::take(&peers, a, 2).ok())
            .collect();
        assert_eq!(held.len(), 2);
        assert!(Peers::take(&peers, a, 2).is_err());
        let other = Peers::take(&peers, b, 2);
        assert!(other.is_ok());
        drop(held);
        let again: Vec<_> = (0..2)
            .filter_map(|_| Peers::take(&peers, a, 2).ok())
            .collect();
        assert_eq!(again.len(), 2, "both places given back");
    }

    #[test]
    fn a_peer_is_hammering_while_it_holds_its_all_and_tries_for_more() {
        let peers = Arc::new(Peers::default());
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let held: Vec<_> = (0..2)
            .filter_map(|_| Peers::take(&peers, a, 2).ok())
            .collect();
        let _b = Peers::take(&peers, b, 2);
        assert!(peers.hammering(2, 1, |_| false).is_empty(), "no try yet");
        for tried in 1..=3 {
            assert_eq!(Peers::take(&peers, a, 2).err(), Some(tried));
        }
        assert_eq!(peers.hammering(2, 4, |_| false), Vec::<IpAddr>::new());
        for tried in 1..=3 {
            assert_eq!(
                Peers::take(&peers, a, 2).err(),
                Some(tried),
                "counted afresh"
            );
        }
        assert_eq!(peers.hammering(2, 3, |_| false), vec![a]);
        // Counted afresh: no new try, so only as one already filtered.
        assert!(peers.hammering(2, 3, |_| false).is_empty());
        assert_eq!(peers.hammering(2, 3, |ip| ip == a), vec![a]);
        drop(held);
        assert!(
            peers.hammering(2, 3, |_| true).is_empty(),
            "below its limit"
        );
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
