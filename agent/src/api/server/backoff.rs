//! Peers that abused a listener wait before it serves them again.
//!
//! HTTP/2's own limits end a connection that resets streams in a loop (GOAWAY
//! `ENHANCE_YOUR_CALM`), but the peer may open the next one at once, and every new connection
//! costs a TLS handshake and the streams it gets through before the limit acts again. So a peer
//! (its IP address) whose connection a limit ended for abuse is refused at accept for
//! `--abuse-backoff` (default 1 s), twice as long for each further abuse within the time it
//! waited last, up to 64 times; a peer that stays quiet for as long as it last waited starts
//! again from the base. A refused connection costs an accept and a reset. Connections the
//! peer already has are left alone: the kube-apiserver's connection that carries admissions is
//! not cut because another of its connections misbehaved.
//!
//! At most [`MAX_PEERS`] peers are remembered; when full, those whose wait is over are
//! forgotten first, then the one that waits least. A base of zero turns the back-off off.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Peers remembered at once (about 40 bytes each).
pub const MAX_PEERS: usize = 4096;
/// The longest wait, as a multiple of the base.
const MOST: u32 = 64;

/// When one peer may connect again, and how long it waited last.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    until: Instant,
    wait: Duration,
}

/// The listener's peers that must wait (one table for all of its threads).
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    peers: Mutex<HashMap<IpAddr, Waiting>>,
}

impl Backoff {
    pub fn new(base: Duration) -> Backoff {
        Backoff {
            base,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// A connection of `peer` was ended for abuse at `now`: it waits the base, or twice its
    /// last wait if it abused again before that wait had passed once more. How long it waits.
    pub fn abused(&self, peer: IpAddr, now: Instant) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        let Ok(mut peers) = self.peers.lock() else {
            return Duration::ZERO;
        };
        let wait = match peers.get(&peer) {
            Some(w) if now < w.until + w.wait => (w.wait * 2).min(self.base * MOST),
            _ => self.base,
        };
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            make_room(&mut peers, now);
        }
        peers.insert(
            peer,
            Waiting {
                until: now + wait,
                wait,
            },
        );
        wait
    }

    /// Whether `peer` must still wait at `now`.
    pub fn waits(&self, peer: IpAddr, now: Instant) -> bool {
        if self.base.is_zero() {
            return false;
        }
        self.peers
            .lock()
            .is_ok_and(|peers| peers.get(&peer).is_some_and(|w| now < w.until))
    }
}

/// Forgets the peers whose wait and quiet time are over; if none, the one that waits least.
fn make_room(peers: &mut HashMap<IpAddr, Waiting>, now: Instant) {
    peers.retain(|_, w| now < w.until + w.wait);
    if peers.len() < MAX_PEERS {
        return;
    }
    if let Some(first) = peers.iter().min_by_key(|(_, w)| w.until).map(|(ip, _)| *ip) {
        peers.remove(&first);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const BASE: Duration = Duration::from_secs(1);

    impl Backoff {
        fn remembered(&self) -> usize {
            self.peers.lock().expect("not poisoned").len()
        }
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn an_abuser_waits_the_base_then_is_served_again() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        assert!(!backoff.waits(ip(1), t0), "nobody waits before abusing");
        assert_eq!(backoff.abused(ip(1), t0), BASE);
        assert!(backoff.waits(ip(1), t0 + BASE / 2));
        assert!(!backoff.waits(ip(2), t0 + BASE / 2), "only the abuser");
        assert!(!backoff.waits(ip(1), t0 + BASE));
    }

    #[test]
    fn abusing_again_soon_doubles_the_wait_up_to_64_times() {
        let backoff = Backoff::new(BASE);
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..9 {
            let wait = backoff.abused(ip(1), now);
            waits.push(wait.as_secs());
            // Back as soon as it may, and abusing at once.
            now += wait;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
    }

    #[test]
    fn a_peer_quiet_for_as_long_as_it_waited_starts_again_from_the_base() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        backoff.abused(ip(1), t0);
        let second = backoff.abused(ip(1), t0 + BASE);
        assert_eq!(second, 2 * BASE);
        // Its wait ends at t0 + 3 s; quiet for 2 s more, it is forgiven.
        assert_eq!(backoff.abused(ip(1), t0 + 5 * BASE), BASE);
    }

    #[test]
    fn zero_turns_it_off() {
        let backoff = Backoff::new(Duration::ZERO);
        let t0 = Instant::now();
        assert_eq!(backoff.abused(ip(1), t0), Duration::ZERO);
        assert!(!backoff.waits(ip(1), t0));
        assert_eq!(backoff.remembered(), 0);
    }

    #[test]
    fn the_table_is_bounded_and_forgets_those_done_waiting_first() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        let count = u32::try_from(MAX_PEERS).expect("small");
        for n in 0..count {
            backoff.abused(ip(n), t0);
        }
        assert_eq!(backoff.remembered(), MAX_PEERS);
        // Long after: every earlier peer is done waiting and quiet; one more makes room.
        backoff.abused(ip(count), t0 + 10 * BASE);
        assert_eq!(backoff.remembered(), 1);
        assert!(backoff.waits(ip(count), t0 + 10 * BASE));
    }

    #[test]
    fn when_all_still_wait_the_one_that_waits_least_makes_room() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        let count = u32::try_from(MAX_PEERS).expect("small");
        for n in 0..count {
            backoff.abused(ip(n), t0 + Duration::from_micros(u64::from(n)));
        }
        let now = t0 + Duration::from_millis(500);
        backoff.abused(ip(count), now);
        assert_eq!(backoff.remembered(), MAX_PEERS);
        assert!(!backoff.waits(ip(0), now), "the earliest was forgotten");
        assert!(backoff.waits(ip(1), now));
        assert!(backoff.waits(ip(count), now));
    }
}
