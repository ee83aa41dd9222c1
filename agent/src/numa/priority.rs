//! The map thread's real-time priority (`--map-thread-priority`): SCHED_FIFO for the calling
//! thread alone. A thread of the default policy that sleeps on an idle CPU waits, once its event
//! comes, for that CPU to be woken; on a virtual machine whose idle vCPUs halt, that is up to a
//! few milliseconds, which alone is over the fault-to-map target. A real-time thread preempts
//! what runs instead. The kernel's real-time throttling (`kernel.sched_rt_runtime_us`, 95 % of
//! each second by default) bounds what a burst of faults can take from other threads.

use std::io;

/// Why the priority could not be set.
#[derive(Debug, thiserror::Error)]
#[error(
    "--map-thread-priority {priority}: the kernel refused SCHED_FIFO for the map's thread: {source} (it needs CAP_SYS_NICE, or an RLIMIT_RTPRIO of at least {priority}; with real-time group scheduling, a cgroup with real-time time: cpu.rt_runtime_us)"
)]
pub struct PriorityError {
    pub priority: u8,
    #[source]
    pub source: io::Error,
}

/// Runs the calling thread under SCHED_FIFO at `priority` (1 to 99).
pub fn realtime(priority: u8) -> Result<(), PriorityError> {
    set(libc::SCHED_FIFO, i32::from(priority)).map_err(|source| PriorityError { priority, source })
}

/// The calling thread at the default policy until dropped, then under SCHED_FIFO at its
/// priority again; nothing when it was not under SCHED_FIFO.
pub struct Lowered(Option<u8>);

impl Lowered {
    /// Lowers the calling thread if it runs under SCHED_FIFO (a thread may always lower
    /// itself).
    pub fn for_the_scan() -> Lowered {
        let Some(priority) = fifo_priority() else {
            return Lowered(None);
        };
        if let Err(err) = set(libc::SCHED_OTHER, 0) {
            tracing::warn!("the map thread stays real-time during the reconcile: {err}");
            return Lowered(None);
        }
        Lowered(Some(priority))
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if let Some(priority) = self.0
            && let Err(err) = realtime(priority)
        {
            tracing::warn!("{err}: the map thread goes on at the default policy");
        }
    }
}

/// The calling thread's SCHED_FIFO priority, if it runs under SCHED_FIFO.
fn fifo_priority() -> Option<u8> {
    // SAFETY: pid 0 is the calling thread; no pointer argument.
    if unsafe { libc::sched_getscheduler(0) } != libc::SCHED_FIFO {
        return None;
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param the call writes; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getparam(0, &mut param) };
    (rc == 0)
        .then(|| u8::try_from(param.sched_priority).ok())
        .flatten()
}

/// `sched_setscheduler` for the calling thread.
fn set(policy: i32, priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
