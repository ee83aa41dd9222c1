//! What the HTTP listeners' limits did: connections open now, bytes of request bodies held
//! against the listener's budget ([`crate::api::budget`]), and connections ended or requests cut
//! by a limit, by which ([`Cut`]). The listeners ([`crate::api::server`]) update one
//! [`ConnectionStats`] each; the agent's `/metrics` shows its API and metrics listeners', the
//! webhook's its own.

use std::sync::atomic::{AtomicU64, Ordering};

use super::encode::{Encoder, Kind};

/// Why a limit ended a connection or cut a request short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Accepted over `--max-connections` and closed at once.
    OverLimit,
    /// No complete request head within `--header-read-timeout` (an idle keep-alive connection
    /// included): closed.
    HeaderTimeout,
    /// A request body not received within `--body-read-timeout`: answered (HTTP/1.1: and closed).
    BodyTimeout,
    /// A request head larger than the read buffer (64 KiB): 431 and closed.
    HeadTooLarge,
    /// Bytes that are not an HTTP/1.1 request: 400 and closed.
    Malformed,
    /// An HTTP/2 connection ended by the server with GOAWAY `ENHANCE_YOUR_CALM`: streams reset
    /// over `--http2-max-pending-reset-streams` or `--http2-max-local-reset-streams` (rapid
    /// reset), or another flood h2 refuses.
    Http2Abuse,
    /// Accepted from a peer that must still wait after abuse (`--abuse-backoff`) and closed at
    /// once.
    Backoff,
    /// A request body over its endpoint's limit: 413, by its `Content-Length` before any of it
    /// is read, or as soon as it is longer.
    BodyTooLarge,
    /// A request body that found no room in `--body-budget` within its wait: 503 with
    /// `Retry-After`.
    BodyBudget,
    /// Accepted from a peer that already holds `--max-connections-per-peer` (handshaking and
    /// served) and closed at once.
    PerPeer,
    /// Accepted while `--max-handshakes` handshakes run and closed at once.
    Handshakes,
    /// No first request within `--handshake-timeout` of the handshake's end, or an HTTP/2
    /// connection with no stream open for `--http2-idle-timeout`: closed (HTTP/2: GOAWAY).
    Idle,
}

impl Cut {
    pub const ALL: [Cut; 12] = [
        Cut::OverLimit,
        Cut::HeaderTimeout,
        Cut::BodyTimeout,
        Cut::HeadTooLarge,
        Cut::Malformed,
        Cut::Http2Abuse,
        Cut::Backoff,
        Cut::BodyTooLarge,
        Cut::BodyBudget,
        Cut::PerPeer,
        Cut::Handshakes,
        Cut::Idle,
    ];

    /// The `limit` label.
    pub fn label(self) -> &'static str {
        match self {
            Cut::OverLimit => "max_connections",
            Cut::HeaderTimeout => "header_timeout",
            Cut::BodyTimeout => "body_timeout",
            Cut::HeadTooLarge => "head_too_large",
            Cut::Malformed => "malformed",
            Cut::Http2Abuse => "http2_abuse",
            Cut::Backoff => "abuse_backoff",
            Cut::BodyTooLarge => "body_too_large",
            Cut::BodyBudget => "body_budget",
            Cut::PerPeer => "max_connections_per_peer",
            Cut::Handshakes => "max_handshakes",
            Cut::Idle => "idle",
        }
    }
}

/// One listener's connections: open now, request bodies held, and cut by each limit so far.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    cut: [AtomicU64; Cut::ALL.len()],
    body_budget: AtomicU64,
    body_held: AtomicU64,
    peers_filtered: AtomicU64,
    peer_filter_failures: AtomicU64,
}

impl ConnectionStats {
    /// Counts a connection open if fewer than `max` are; false (nothing counted) if not.
    pub fn try_open(&self, max: usize) -> bool {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// A connection counted by [`ConnectionStats::try_open`] ended.
    pub fn close(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Acquire)
    }

    /// A limit acted.
    pub fn cut(&self, why: Cut) {
        if let Some(i) = Cut::ALL.iter().position(|c| *c == why) {
            self.cut[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The listener's budget for request bodies, in bytes.
    pub fn set_body_budget(&self, bytes: usize) {
        self.body_budget.store(bytes as u64, Ordering::Relaxed);
    }

    pub fn body_budget(&self) -> u64 {
        self.body_budget.load(Ordering::Relaxed)
    }

    /// Bytes of request bodies charged to the budget.
    pub fn body_taken(&self, bytes: usize) {
        self.body_held.fetch_add(bytes as u64, Ordering::AcqRel);
    }

    /// Bytes a request held, given back.
    pub fn body_given_back(&self, bytes: usize) {
        self.body_held.fetch_sub(bytes as u64, Ordering::AcqRel);
    }

    /// Bytes of request bodies held now.
    pub fn body_held(&self) -> u64 {
        self.body_held.load(Ordering::Acquire)
    }

    /// Peers whose new connections the kernel drops now (the listener's socket filter).
    pub fn set_peers_filtered(&self, peers: usize) {
        self.peers_filtered.store(peers as u64, Ordering::Relaxed);
    }

    pub fn peers_filtered(&self) -> u64 {
        self.peers_filtered.load(Ordering::Relaxed)
    }

    /// The kernel refused a new socket filter.
    pub fn peer_filter_failed(&self) {
        self.peer_filter_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn peer_filter_failures(&self) -> u64 {
        self.peer_filter_failures.load(Ordering::Relaxed)
    }

    /// How often `why` acted so far.
    pub fn cuts(&self, why: Cut) -> u64 {
        Cut::ALL
            .iter()
            .position(|c| *c == why)
            .map_or(0, |i| self.cut[i].load(Ordering::Relaxed))
    }
}

/// Writes `<prefix>_http_connections{listener}`, `<prefix>_http_body_bytes{listener}`,
/// `<prefix>_http_body_budget_bytes{listener}` and `<prefix>_http_limited_total{listener,limit}`
/// for each listener.
pub fn encode(prefix: &str, listeners: &[(&str, &ConnectionStats)], e: &mut Encoder) {
    let open = format!("{prefix}_http_connections");
    e.family(
        &open,
        Kind::Gauge,
        "Connections open on the listener (at most --max-connections).",
    );
    for (listener, stats) in listeners {
        e.sample(&open, &[("listener", listener)], stats.open() as f64);
    }
    let held = format!("{prefix}_http_body_bytes");
    e.family(
        &held,
        Kind::Gauge,
        "Bytes of request bodies the listener holds now, charged to --body-budget.",
    );
    for (listener, stats) in listeners {
        e.sample(&held, &[("listener", listener)], stats.body_held() as f64);
    }
    let budget = format!("{prefix}_http_body_budget_bytes");
    e.family(
        &budget,
        Kind::Gauge,
        "Bytes of request bodies the listener may hold at once (--body-budget).",
    );
    for (listener, stats) in listeners {
        e.sample(
            &budget,
            &[("listener", listener)],
            stats.body_budget() as f64,
        );
    }
    let filtered = format!("{prefix}_http_peers_filtered");
    e.family(
        &filtered,
        Kind::Gauge,
        "Peers whose new connections the kernel drops at the listening socket (a socket filter on their SYNs): those waiting after abuse (--abuse-backoff), and those holding --max-connections-per-peer that kept trying for more (16 refused between two looks), at most 64.",
    );
    for (listener, stats) in listeners {
        e.sample(
            &filtered,
            &[("listener", listener)],
            stats.peers_filtered() as f64,
        );
    }
    let failures = format!("{prefix}_http_peer_filter_failures_total");
    e.family(
        &failures,
        Kind::Counter,
        "Socket filters the kernel refused to attach to the listening socket (the previous one stays; those peers are refused at accept).",
    );
    for (listener, stats) in listeners {
        e.sample(
            &failures,
            &[("listener", listener)],
            stats.peer_filter_failures() as f64,
        );
    }
    let limited = format!("{prefix}_http_limited_total");
    e.family(&limited, Kind::Counter, "Connections closed or requests cut short by a limit of the listener: max_connections (refused at accept), header_timeout, body_timeout, head_too_large (431), malformed (400), http2_abuse (GOAWAY ENHANCE_YOUR_CALM), abuse_backoff (refused at accept: the peer abused a connection and must wait), body_too_large (413), body_budget (503: no room in --body-budget).");
    for (listener, stats) in listeners {
        for why in Cut::ALL {
            let labels = [("listener", *listener), ("limit", why.label())];
            e.sample(&limited, &labels, stats.cuts(why) as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::encode::Format;

    #[test]
    fn at_most_max_are_open_and_a_closed_one_frees_its_place() {
        let stats = ConnectionStats::default();
        assert!(stats.try_open(2));
        assert!(stats.try_open(2));
        assert!(!stats.try_open(2), "a third over a limit of two");
        assert_eq!(stats.open(), 2);
        stats.close();
        assert!(stats.try_open(2));
        assert_eq!(stats.open(), 2);
    }

    #[test]
    fn every_limit_has_its_series_from_the_start() {
        let stats = ConnectionStats::default();
        stats.cut(Cut::HeaderTimeout);
        let mut e = Encoder::new(Format::Prometheus);
        encode("x", &[("api", &stats)], &mut e);
        let text = e.finish();
        assert!(
            text.contains("x_http_connections{listener=\"api\"} 0"),
            "{text}"
        );
        for why in Cut::ALL {
            let n = u8::from(why == Cut::HeaderTimeout);
            let series = format!(
                "x_http_limited_total{{listener=\"api\",limit=\"{}\"}} {n}",
                why.label()
            );
            assert!(text.contains(&series), "{series} in {text}");
        }
    }
}
