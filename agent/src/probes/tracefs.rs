//! Makes sure tracefs is mounted where aya looks for tracepoint ids.
//!
//! aya reads `/sys/kernel/tracing` or `/sys/kernel/debug/tracing` of the agent's own mount
//! namespace (not `--host-root`: tracepoint ids are the running kernel's, wherever it is read).
//! When neither is populated the agent mounts tracefs at `/sys/kernel/tracing`, as systemd does at
//! boot; in a container the DaemonSet mounts the host's.

use std::{io, path::Path};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUG_TRACEFS: &str = "/sys/kernel/debug/tracing";

#[derive(Debug, thiserror::Error)]
#[error(
    "tracefs is not mounted at {TRACEFS} or {DEBUG_TRACEFS}, and mounting it at {TRACEFS} failed: {source}"
)]
pub struct TracefsError {
    #[source]
    source: io::Error,
}

fn populated(dir: &str) -> bool {
    Path::new(dir)
        .read_dir()
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false)
}

/// Mounts tracefs unless one of aya's locations already has it.
pub fn ensure_mounted() -> Result<(), TracefsError> {
    if populated(TRACEFS) || populated(DEBUG_TRACEFS) {
        return Ok(());
    }
    // SAFETY: NUL-terminated literals; no data argument.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError {
            source: io::Error::last_os_error(),
        });
    }
    tracing::info!(path = TRACEFS, "mounted tracefs for tracepoint attachment");
    Ok(())
}
