//! The listeners' limits as flags: connections at once (per peer too), handshakes at once and
//! their time-out, the head's and the body's time-outs and the body budget for every listener (`run`'s and the webhook's, each with its own defaults:
//! [`Limits::DEFAULT`], [`Limits::WEBHOOK`]), and HTTP/2's for the webhook's listener, the only
//! one that offers it (its idle time-out among them).

use clap::Args;

use super::{Limits, MAX_ABUSE_BACKOFF};
use crate::{
    api::budget,
    flags::{FlagError, above_zero, bytes, duration},
};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection limits")]
pub struct LimitArgs {
    /// Connections the listener (each of `run`'s, the webhook's) keeps open at once; one more
    /// is accepted and closed at once with a reset, and counted. Default: 1024 for `run`, 256
    /// for `webhook`.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: Option<u32>,
    /// How long a connection may take to send a request's complete head, counted from when it
    /// is ready for one: a new connection, or a keep-alive one after its last answer, so an idle
    /// connection is closed after it too. Ends slow heads (slowloris).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HEADER_READ_TIMEOUT",
        default_value = "30s"
    )]
    pub header_read_timeout: String,
    /// How long a request's body may take to arrive after its head; past it the request is
    /// answered 408 and the connection closed.
    #[arg(long, env = "HUGEPAGE_AGENT_BODY_READ_TIMEOUT", default_value = "30s")]
    pub body_read_timeout: String,
    /// Bytes of request bodies the listener holds at once, all connections together (e.g. 64Mi):
    /// a body that finds no room within a second is answered 503 with Retry-After. Default:
    /// 16Mi for `run` (sixteen of its largest bodies), 64Mi for `webhook` (within its
    /// Deployment's 256Mi memory limit).
    #[arg(long, env = "HUGEPAGE_AGENT_BODY_BUDGET", value_name = "BYTES")]
    pub body_budget: Option<String>,
    /// TLS handshakes the listener runs at once, counted apart from --max-connections (a
    /// connection counts there once its handshake is done); one more is accepted and closed at
    /// once with a reset. Default: 512 for `run`, 128 for `webhook`.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_HANDSHAKES",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_handshakes: Option<u32>,
    /// How long a TLS handshake may take, and then how long the connection may take to send its
    /// first request's complete head (a plain connection: from its accept); past either it is
    /// closed.
    #[arg(long, env = "HUGEPAGE_AGENT_HANDSHAKE_TIMEOUT", default_value = "5s")]
    pub handshake_timeout: String,
    /// Connections one source address may hold at once, handshaking and served together, so
    /// that one peer cannot take every place; one more is accepted and closed at once with a
    /// reset. Default: 256 for `run`, 64 for `webhook` (a quarter of --max-connections).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_CONNECTIONS_PER_PEER",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections_per_peer: Option<u32>,
}

impl LimitArgs {
    /// The limits the flags set over `defaults` (the command's).
    pub fn limits(&self, defaults: Limits) -> Result<Limits, FlagError> {
        Ok(Limits {
            max_connections: self.max_connections.map_or(defaults.max_connections, count),
            header_read_timeout: duration(
                "--header-read-timeout",
                &self.header_read_timeout,
                above_zero,
            )?,
            body_read_timeout: duration(
                "--body-read-timeout",
                &self.body_read_timeout,
                above_zero,
            )?,
            body_budget: match &self.body_budget {
                Some(text) => bytes("--body-budget", text, budget::MAX_BYTES)?,
                None => defaults.body_budget,
            },
            max_handshakes: self.max_handshakes.map_or(defaults.max_handshakes, count),
            handshake_timeout: duration(
                "--handshake-timeout",
                &self.handshake_timeout,
                above_zero,
            )?,
            max_connections_per_peer: self
                .max_connections_per_peer
                .map_or(defaults.max_connections_per_peer, count),
            ..defaults
        })
    }
}

fn count(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP/2 limits")]
pub struct Http2Args {
    /// HTTP/2 streams one connection may have open at once.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_CONCURRENT_STREAMS",
        default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 streams a client may reset before they are served (rapid reset,
    /// CVE-2023-44487) before the connection is ended with GOAWAY.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_PENDING_RESET_STREAMS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub http2_max_pending_reset_streams: u32,
    /// HTTP/2 streams the server may reset for a client's errors ("MadeYouReset",
    /// CVE-2025-8671) before the connection is ended with GOAWAY.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_LOCAL_RESET_STREAMS",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub http2_max_local_reset_streams: u32,
    /// How long a peer (IP address) whose HTTP/2 connection was ended for abuse (GOAWAY
    /// ENHANCE_YOUR_CALM) is refused at accept; twice as long for each further abuse, up to 64
    /// times; 0s turns it off.
    #[arg(long, env = "HUGEPAGE_AGENT_ABUSE_BACKOFF", default_value = "1s")]
    pub abuse_backoff: String,
    /// An HTTP/2 connection with no stream open for this long is closed with GOAWAY (above the
    /// 90s after which Go's HTTP/2 clients, the API server's among them, close an idle
    /// connection themselves).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_IDLE_TIMEOUT",
        default_value = "120s"
    )]
    pub http2_idle_timeout: String,
}

impl Http2Args {
    /// `limits` with these.
    pub fn over(&self, limits: Limits) -> Result<Limits, FlagError> {
        Ok(Limits {
            http2_max_concurrent_streams: self.http2_max_concurrent_streams,
            http2_max_pending_reset_streams: count(self.http2_max_pending_reset_streams),
            http2_max_local_reset_streams: count(self.http2_max_local_reset_streams),
            abuse_backoff: duration("--abuse-backoff", &self.abuse_backoff, |d| {
                (d > MAX_ABUSE_BACKOFF).then(|| {
                    format!(
                        "must be at most {}",
                        humantime::format_duration(MAX_ABUSE_BACKOFF)
                    )
                })
            })?,
            http2_idle_timeout: duration(
                "--http2-idle-timeout",
                &self.http2_idle_timeout,
                above_zero,
            )?,
            ..limits
        })
    }
}
