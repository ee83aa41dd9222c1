//! The kernel drops the new connections of peers the listener would refuse anyway: a classic
//! BPF socket filter on the listening socket (`SO_ATTACH_FILTER`, which needs no privilege)
//! drops the SYNs of each peer that waits after abuse ([`super::backoff`]), and of each that
//! holds `max_connections_per_peer` and keeps trying for more ([`HAMMERING`] refusals between
//! two looks; it stays filtered while it holds its all). Refusing them at accept costs an
//! accept, a reset and a close in this process for every attempt, and a good client's new
//! connection waits behind them in the accept queue; dropped in the kernel (`tcp_filter` runs
//! the listener's filter on each SYN), they cost the process nothing, and the peer's own stack
//! retries (after 1 s, then longer).
//!
//! Only a SYN without ACK is dropped: the connections a peer already has carry on. Accepted
//! sockets inherit the listener's filter; each sheds it at once ([`shed`]), so that no old
//! program lives on in a long connection. A peer is an IPv4 address, an IPv6 address, or for
//! back-off an IPv6 /64 as the back-off counts it. At most [`MAX_FILTERED`] peers are filtered
//! at once (a program of at most 9 instructions each; the others are refused at accept as
//! before). [`keep`] looks at both sets every [`EVERY`], at once when a peer is refused for the
//! [`HAMMERING`]th time or sent into back-off, and when a back-off wait ends, and attaches a new
//! program when they changed: a peer is filtered within a few milliseconds of hammering at its
//! limit or of abuse, and let through within [`EVERY`] of going below its limit or as its wait
//! ends. A program the kernel refuses (a socket memory limit, `net.core.optmem_max`) is counted,
//! and as many of the peers as it takes are filtered ([`settle`]), never a stale one.

use std::{
    collections::BTreeSet,
    io,
    net::IpAddr,
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, Instant},
};

use libc::{
    BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_JA, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_MEM, BPF_RET,
    BPF_RSH, BPF_ST, BPF_W, SKF_NET_OFF, sock_filter, sock_fprog,
};
use tokio::sync::watch;
use tracing::warn;

use super::Serving;

/// How often the peers to filter are sampled.
pub const EVERY: Duration = Duration::from_millis(250);
/// The most peers filtered at once: a program of at most about 600 instructions once the
/// kernel converts it (under 5 KiB), so that the new one and the one it replaces, both charged
/// to the socket while it is swapped, fit in 20 KiB, the `net.core.optmem_max` of older kernels
/// (this machine's 6.18 has 128 KiB).
pub const MAX_FILTERED: usize = 64;
/// Connections refused at accept, between two looks, that make a peer at its limit filtered:
/// a client that reaches its limit now and then is still told at once, by a reset; one that
/// keeps on trying (64 a second) is not heard any more.
pub const HAMMERING: u32 = 16;

/// `SO_ATTACH_FILTER` and `SO_DETACH_FILTER` (asm-generic, as on x86-64 and arm64).
const SO_ATTACH_FILTER: libc::c_int = 26;
const SO_DETACH_FILTER: libc::c_int = 27;

/// A peer whose new connections the kernel drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Filtered {
    V4(u32),
    /// An IPv6 /64: its first 64 bits.
    V6Prefix(u64),
    V6(u128),
}

impl Filtered {
    /// `ip` itself (an IPv4-mapped IPv6 address as IPv4, which is how its packets arrive).
    pub fn address(ip: IpAddr) -> Filtered {
        match ip {
            IpAddr::V4(v4) => Filtered::V4(v4.to_bits()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Filtered::V4(v4.to_bits()),
                None => Filtered::V6(v6.to_bits()),
            },
        }
    }

    /// The back-off's peer `key`: an IPv4 address, or an IPv6 /64 (its low bits zero).
    pub fn backoff(key: IpAddr) -> Filtered {
        match key {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
                Filtered::V6Prefix((v6.to_bits() >> 64) as u64)
            }
            other => Filtered::address(other),
        }
    }
}

fn op(code: u32, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Loads the 32-bit word at `offset` of the network header.
fn net_word(offset: i32) -> sock_filter {
    op(
        BPF_LD | BPF_W | BPF_ABS,
        0,
        0,
        (SKF_NET_OFF + offset) as u32,
    )
}

const ACCEPT: u32 = u32::MAX;
const DROP: u32 = 0;
/// The offset of the flags byte in the TCP header (the socket filter's data starts there).
const TCP_FLAGS: u32 = 13;
const SYN: u32 = 0x02;
const SYN_ACK: u32 = 0x12;

/// The program dropping the bare SYNs of `peers` (at most [`MAX_FILTERED`] of them are used)
/// and accepting every other segment.
pub fn program(peers: &BTreeSet<Filtered>) -> Vec<sock_filter> {
    let peers: Vec<Filtered> = peers.iter().copied().take(MAX_FILTERED).collect();
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for peer in &peers {
        match *peer {
            Filtered::V4(address) => {
                // Equal: fall into the drop; not: skip it.
                v4.push(op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, address));
                v4.push(op(BPF_RET | BPF_K, 0, 0, DROP));
            }
            Filtered::V6Prefix(prefix) => v6.extend(words(&[(prefix >> 32) as u32, prefix as u32])),
            Filtered::V6(address) => v6.extend(words(&[
                (address >> 96) as u32,
                (address >> 64) as u32,
                (address >> 32) as u32,
                address as u32,
            ])),
        }
    }
    let mut code = vec![
        // A bare SYN, or anything else accepted.
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, TCP_FLAGS),
        op(BPF_ALU | BPF_AND | BPF_K, 0, 0, SYN_ACK),
        op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, SYN),
        op(BPF_RET | BPF_K, 0, 0, ACCEPT),
        // The IP version.
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, SKF_NET_OFF as u32),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4),
        op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 4),
        // IPv4: to the IPv4 block, past this test of IPv6, its accept and its jump.
        op(BPF_JMP | BPF_JA, 0, 0, 3),
        op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 6),
        op(BPF_RET | BPF_K, 0, 0, ACCEPT),
    ];
    // At IPv6: jump over the IPv4 block (its load, its tests, its accept).
    let over_v4 = u32::try_from(v4.len() + 2).unwrap_or(u32::MAX);
    code.push(op(BPF_JMP | BPF_JA, 0, 0, over_v4));
    code.push(net_word(12));
    code.extend(v4);
    code.push(op(BPF_RET | BPF_K, 0, 0, ACCEPT));
    // IPv6: the source's four words into the scratch memory once (each load of the network
    // header is a helper call of 8 instructions once the kernel converts the program; a load of
    // the scratch memory is one).
    for i in 0..4 {
        code.push(net_word(8 + 4 * i as i32));
        code.push(op(BPF_ST, 0, 0, i));
    }
    code.extend(v6);
    code.push(op(BPF_RET | BPF_K, 0, 0, ACCEPT));
    code
}

/// The test of one IPv6 source against `words` (its first ones, held in the scratch memory
/// `M[0..4]`): each loaded and compared, the first that differs skipping to the next test, all
/// equal falling into the drop.
fn words(words: &[u32]) -> Vec<sock_filter> {
    let mut code = Vec::with_capacity(words.len() * 2 + 1);
    for (i, word) in (0u32..).zip(words) {
        // Instructions left after this comparison, the drop included.
        let rest = u8::try_from((words.len() - i as usize - 1) * 2 + 1).unwrap_or(u8::MAX);
        code.push(op(BPF_LD | BPF_MEM, 0, 0, i));
        code.push(op(BPF_JMP | BPF_JEQ | BPF_K, 0, rest, *word));
    }
    code.push(op(BPF_RET | BPF_K, 0, 0, DROP));
    code
}

/// Attaches the program of `peers` to `socket`, replacing the one it had; with no peer,
/// detaches it.
pub fn attach(socket: &OwnedFd, peers: &BTreeSet<Filtered>) -> io::Result<()> {
    let fd = socket.as_raw_fd();
    if peers.is_empty() {
        return match detach(socket) {
            // ENOENT: no filter was attached.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        };
    }
    let mut code = program(peers);
    let fprog = sock_fprog {
        len: u16::try_from(code.len()).map_err(|_| io::Error::other("program too long"))?,
        filter: code.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `code`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_FILTER,
            std::ptr::addr_of!(fprog).cast(),
            std::mem::size_of::<sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The peers to filter at `now`, the first [`MAX_FILTERED`] of: those in back-off; those at
/// their limit that tried [`HAMMERING`] more connections since the last look, or were filtered
/// (in `attached`) and still hold their all.
pub fn refused(
    serving: &Serving,
    now: Instant,
    attached: &BTreeSet<Filtered>,
) -> BTreeSet<Filtered> {
    let waiting = serving
        .backoff
        .waiting(now)
        .into_iter()
        .map(Filtered::backoff);
    let max = serving.limits.max_connections_per_peer;
    let kept = |ip| attached.contains(&Filtered::address(ip));
    let full = serving
        .peers
        .hammering(max, HAMMERING, kept)
        .into_iter()
        .map(Filtered::address);
    let all: BTreeSet<Filtered> = waiting.chain(full).collect();
    all.into_iter().take(MAX_FILTERED).collect()
}

/// Every [`EVERY`], at once when woken, and when a back-off wait ends, until `stop` turns true:
/// keeps `socket`'s filter to the peers refused then.
pub async fn keep(socket: OwnedFd, serving: Serving, mut stop: watch::Receiver<bool>) {
    let mut attached = BTreeSet::new();
    let mut failing = false;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wait_ends = serving.backoff.next_end(Instant::now());
        tokio::select! {
            _ = tick.tick() => {}
            _ = serving.gate.notified() => {}
            _ = until(wait_ends) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let wanted = refused(&serving, Instant::now(), &attached);
        if wanted == attached {
            continue;
        }
        let (now, err) = settle(&socket, wanted);
        serving.stats.set_peers_filtered(now.len());
        attached = now;
        match err {
            None => failing = false,
            Some(err) => {
                serving.stats.peer_filter_failed();
                if !failing {
                    warn!(
                        "the kernel refused the listener's filter: {err}; {} peer(s) filtered, the others are refused at accept",
                        attached.len()
                    );
                }
                failing = true;
            }
        }
    }
}

/// Sleeps until `at`, or for ever.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// Attaches the filter of `wanted` to `socket`, or of as many of them as the kernel takes: the
/// program replaced by a detach first (both are charged to the socket while one replaces the
/// other), then halves of the set, down to none (detached, so that no stale peer stays
/// filtered). What is attached, and the kernel's first refusal if any.
fn settle(socket: &OwnedFd, wanted: BTreeSet<Filtered>) -> (BTreeSet<Filtered>, Option<io::Error>) {
    let first = match attach(socket, &wanted) {
        Ok(()) => return (wanted, None),
        Err(err) => err,
    };
    let mut trying = wanted;
    loop {
        if attach(socket, &BTreeSet::new()).is_ok() && attach(socket, &trying).is_ok() {
            return (trying, Some(first));
        }
        if trying.is_empty() {
            return (trying, Some(first));
        }
        let half = trying.len() / 2;
        trying = trying.into_iter().take(half).collect();
    }
}

/// Takes off an accepted connection the filter it inherited from the listener: its segments
/// are never bare SYNs, and the program it holds would otherwise stay in memory (and charged)
/// for as long as it lives, one copy per version of the listener's filter. A failure (ENOENT:
/// it has none) leaves the connection as it was.
pub fn shed(connection: &impl AsRawFd) {
    let _ = detach(connection);
}

/// `SO_DETACH_FILTER` on `socket`.
fn detach(socket: &impl AsRawFd) -> io::Result<()> {
    // The kernel reads no value but wants an int's length (EINVAL below it).
    let unused: libc::c_int = 0;
    // SAFETY: a valid descriptor, and a value that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_DETACH_FILTER,
            std::ptr::addr_of!(unused).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
