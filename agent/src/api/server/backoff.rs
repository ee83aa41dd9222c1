//! Peers that abused a listener wait before it serves them again.
//!
//! HTTP/2's own limits end a connection that resets streams in a loop (GOAWAY
//! `ENHANCE_YOUR_CALM`), but the peer may open the next one at once, and every new connection
//! costs a TLS handshake and the streams it gets through before the limit acts again. So a peer
//! whose connection a limit ended for abuse is refused at accept for `--abuse-backoff` (default
//! 1 s, at most [`MAX_BASE`]); a connection it opens after that wait and abuses again doubles it,
//! up to 64 times the base; a peer that stays quiet for as long as it last waited starts again
//! from the base. Connections it had open before are the same episode: several of them ended
//! together, or during the wait, do not double it. A refused connection costs an accept and a
//! reset. Connections the peer already has are left alone: the kube-apiserver's connection that
//! carries admissions is not cut because another of its connections misbehaved.
//!
//! A peer is its IPv4 address, or the /64 prefix of its IPv6 address (one host's addresses, as
//! SLAAC and privacy addresses give them: an attacker with a /64 does not get a fresh base for
//! each). At most [`MAX_PEERS`] peers are remembered, about 60 bytes each: those forgiven are
//! forgotten at each abuse, and when the table is still full, the one whose wait ends first. A
//! base of zero turns the back-off off.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

/// Peers remembered at once.
pub const MAX_PEERS: usize = 4096;
/// The longest base `--abuse-backoff` takes (a longest wait of 64 hours).
pub const MAX_BASE: Duration = Duration::from_secs(3600);
/// The longest wait, as a multiple of the base.
const MOST: u32 = 64;
/// Below this many peers the table is not swept at each abuse.
const SWEEP_FROM: usize = 64;

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
    /// A back-off of `base` (at most [`MAX_BASE`]; zero: off).
    pub fn new(base: Duration) -> Backoff {
        Backoff {
            base: base.min(MAX_BASE),
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// A connection of `peer` was ended for abuse at `now`: it waits the base; twice its last
    /// wait if this connection came after that wait and before it had passed once more; its
    /// wait unchanged if it still waits (a connection of the same episode). How long it waits.
    pub fn abused(&self, peer: IpAddr, now: Instant) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        let key = key(peer);
        let mut peers = self.table();
        let earlier = peers.get(&key).copied();
        let wait = match earlier {
            Some(w) if now < w.until => return w.wait,
            Some(w) if now < w.until + w.wait => (w.wait * 2).min(self.base * MOST),
            _ => self.base,
        };
        if peers.len() >= SWEEP_FROM {
            sweep(&mut peers, now);
        }
        peers.insert(
            key,
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
        self.table().get(&key(peer)).is_some_and(|w| now < w.until)
    }

    /// The peers that must still wait at `now` (IPv4 addresses and IPv6 /64s, low bits zero).
    pub fn waiting(&self, now: Instant) -> Vec<IpAddr> {
        if self.base.is_zero() {
            return Vec::new();
        }
        let peers = self.table();
        peers
            .iter()
            .filter(|(_, w)| now < w.until)
            .map(|(ip, _)| *ip)
            .collect()
    }

    /// When the first wait still running at `now` ends.
    pub fn next_end(&self, now: Instant) -> Option<Instant> {
        if self.base.is_zero() {
            return None;
        }
        let peers = self.table();
        peers
            .values()
            .map(|w| w.until)
            .filter(|until| now < *until)
            .min()
    }

    /// The table; a thread that panicked holding it left it whole (each change is one insert or
    /// one removal), so a poisoned lock is taken as it is.
    fn table(&self) -> MutexGuard<'_, HashMap<IpAddr, Waiting>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The peer an address belongs to: an IPv4 address (IPv4-mapped ones too), or an IPv6 /64.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

/// Forgets the peers forgiven at `now` (their wait and as long again over); if the table is
/// still full, the one whose wait ends first; gives back the room a crowd of peers left.
fn sweep(peers: &mut HashMap<IpAddr, Waiting>, now: Instant) {
    peers.retain(|_, w| now < w.until + w.wait);
    if peers.len() >= MAX_PEERS
        && let Some(first) = peers.iter().min_by_key(|(_, w)| w.until).map(|(ip, _)| *ip)
    {
        peers.remove(&first);
    }
    if peers.capacity() > 4 * peers.len().max(SWEEP_FROM) {
        peers.shrink_to(2 * peers.len().max(SWEEP_FROM));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const BASE: Duration = Duration::from_secs(1);

    impl Backoff {
        fn remembered(&self) -> usize {
            self.table().len()
        }

        fn room(&self) -> usize {
            self.table().capacity()
        }
    }

    fn v6(text: &str) -> IpAddr {
        text.parse().expect("an IPv6 address")
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
    fn the_waiting_peers_and_the_first_end_are_those_still_waiting() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        assert_eq!(backoff.next_end(t0), None);
        backoff.abused(ip(1), t0);
        backoff.abused(v6("2001:db8:1:2::9"), t0 + BASE / 2);
        assert_eq!(backoff.next_end(t0), Some(t0 + BASE));
        let mut waiting = backoff.waiting(t0 + BASE / 2);
        waiting.sort();
        assert_eq!(waiting, vec![ip(1), v6("2001:db8:1:2::")]);
        // ip(1)'s wait is over: the /64's is the next to end.
        assert_eq!(backoff.waiting(t0 + BASE), vec![v6("2001:db8:1:2::")]);
        assert_eq!(backoff.next_end(t0 + BASE), Some(t0 + BASE * 3 / 2));
        assert_eq!(backoff.next_end(t0 + BASE * 2), None);
        assert!(Backoff::new(Duration::ZERO).waiting(t0).is_empty());
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

    #[test]
    fn connections_of_one_episode_do_not_double_the_wait() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        // Three connections opened before the first GOAWAY, ended one after the other.
        for ms in [0, 5, 300] {
            assert_eq!(backoff.abused(ip(1), t0 + Duration::from_millis(ms)), BASE);
        }
        assert!(
            !backoff.waits(ip(1), t0 + BASE),
            "the first wait still ends on time"
        );
        // A connection served after the wait abuses again: that doubles it.
        assert_eq!(backoff.abused(ip(1), t0 + BASE + BASE / 2), 2 * BASE);
    }

    #[test]
    fn an_ipv6_peer_is_its_64_prefix_and_a_mapped_ipv4_its_address() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        backoff.abused(v6("2001:db8:0:7::1"), t0);
        assert!(backoff.waits(v6("2001:db8:0:7:ffff:ffff:ffff:fffe"), t0));
        assert!(!backoff.waits(v6("2001:db8:0:8::1"), t0), "another /64");
        backoff.abused(ip(5), t0);
        assert!(backoff.waits(v6("::ffff:10.0.0.5"), t0));
        assert!(!backoff.waits(v6("::ffff:10.0.0.6"), t0));
    }

    #[test]
    fn a_base_past_the_most_is_taken_as_the_most_and_never_overflows() {
        let backoff = Backoff::new(Duration::MAX);
        let mut now = Instant::now();
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            last = backoff.abused(ip(1), now);
            now += last;
        }
        assert_eq!(backoff.abused(ip(2), now), MAX_BASE);
        assert_eq!(last, MAX_BASE * MOST);
    }

    #[test]
    fn forgiven_peers_are_forgotten_and_their_room_given_back() {
        let backoff = Backoff::new(BASE);
        let t0 = Instant::now();
        for n in 0..2000 {
            backoff.abused(ip(n), t0);
        }
        let crowded = backoff.room();
        assert!(crowded >= 2000);
        backoff.abused(ip(9999), t0 + 3 * BASE);
        assert_eq!(backoff.remembered(), 1);
        assert!(
            backoff.room() <= crowded / 4,
            "room {} after {crowded}",
            backoff.room()
        );
    }
}
