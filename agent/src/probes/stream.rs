//! Reads the ring buffers as they fill and forwards decoded events on a bounded channel.
//!
//! A full channel makes the reader wait, the ring buffer then fills, and the kernel program counts
//! what it cannot write (`*_lost`): back-pressure ends in a counter, never in unbounded memory.

use std::os::fd::AsRawFd;

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
};

use super::{
    EventStreams,
    events::{DecodeError, ProbeEvent, decode_cgroup, decode_fault, decode_hugetlbfs},
};

/// Spawns one reader per ring buffer on the current tokio runtime.
pub fn spawn(
    streams: EventStreams,
    capacity: usize,
) -> std::io::Result<mpsc::Receiver<ProbeEvent>> {
    let (tx, rx) = mpsc::channel(capacity);
    let faults = readable(streams.faults)?;
    let cgroups = readable(streams.cgroups)?;
    tokio::spawn(pump(faults, tx.clone(), |b| {
        decode_fault(b).map(ProbeEvent::Fault)
    }));
    if let Some(files) = streams.files {
        tokio::spawn(pump(readable(files)?, tx.clone(), |b| {
            decode_hugetlbfs(b).map(ProbeEvent::File)
        }));
    }
    tokio::spawn(pump(cgroups, tx, |b| {
        decode_cgroup(b).map(ProbeEvent::Cgroup)
    }));
    Ok(rx)
}

/// Registers an object that owns its descriptor (a map or the aya-log reader) with tokio.
pub fn readable<T: AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor and keeps it open, unchanged, until it is dropped, which
    // happens only when the `AsyncFd` that owns it is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }?)
}

async fn pump(
    mut ring: AsyncFd<RingBuf<MapData>>,
    tx: mpsc::Sender<ProbeEvent>,
    decode: fn(&[u8]) -> Result<ProbeEvent, DecodeError>,
) {
    loop {
        let mut guard = match ring.readable_mut().await {
            Ok(guard) => guard,
            Err(err) => {
                tracing::error!("ring buffer poll failed, events stop: {err}");
                return;
            }
        };
        let mut batch = Vec::new();
        while let Some(item) = guard.get_inner_mut().next() {
            match decode(&item) {
                Ok(event) => batch.push(event),
                Err(err) => tracing::warn!("dropping an undecodable probe record: {err}"),
            }
        }
        guard.clear_ready();
        for event in batch {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}
