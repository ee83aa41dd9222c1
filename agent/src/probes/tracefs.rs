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
pub enum TracefsError {
    #[error("tracefs at {path} is not readable: {source}")]
    Unreadable {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "tracefs is not mounted at {TRACEFS} or {DEBUG_TRACEFS}, and mounting it at {TRACEFS} failed: {source}"
    )]
    Mount {
        #[source]
        source: io::Error,
    },
}

/// Mounts tracefs unless one of aya's locations already has it.
pub fn ensure_mounted() -> Result<(), TracefsError> {
    for path in [TRACEFS, DEBUG_TRACEFS] {
        match Path::new(path).read_dir() {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Ok(());
                }
            }
            Err(source) if source.kind() == io::ErrorKind::PermissionDenied => {
                return Err(TracefsError::Unreadable { path, source });
            }
            Err(_) => {}
        }
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
        return Err(TracefsError::Mount {
            source: io::Error::last_os_error(),
        });
    }
    tracing::info!(path = TRACEFS, "mounted tracefs for tracepoint attachment");
    Ok(())
}
