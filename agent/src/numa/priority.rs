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
    "--map-thread-priority {priority}: the kernel refused SCHED_FIFO for the map's thread: {source} (it needs CAP_SYS_NICE, or an RLIMIT_RTPRIO of at least {priority})"
)]
pub struct PriorityError {
    pub priority: u8,
    #[source]
    pub source: io::Error,
}

/// Runs the calling thread under SCHED_FIFO at `priority` (1 to 99).
pub fn realtime(priority: u8) -> Result<(), PriorityError> {
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(PriorityError {
            priority,
            source: io::Error::last_os_error(),
        })
    }
}
