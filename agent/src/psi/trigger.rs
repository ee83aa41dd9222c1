//! Kernel PSI triggers: writing `some <stall µs> <window µs>` to a pressure file asks the kernel
//! to raise `POLLPRI` on that descriptor whenever tasks stalled that long within the window, so
//! the evaluation wakes the moment pressure crosses instead of polling fast.
//!
//! The kernel accepts windows of 500 ms to 10 s, one trigger per open file, and (for
//! unprivileged writers) windows that are multiples of 2 s; a refusal is returned as an error
//! naming the file, and the caller falls back to periodic reads.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

use super::PsiError;
use crate::sysfs::HostFs;

/// The window a trigger measures stall over: 2 s, the shortest the kernel grants a writer without
/// `CAP_SYS_RESOURCE` (it also matches the 2 s in which the kernel updates the averages).
pub const WINDOW: Duration = Duration::from_secs(2);

/// An armed trigger on one pressure file.
#[derive(Debug)]
pub struct Trigger {
    fd: AsyncFd<File>,
    /// The host path, for messages.
    pub file: String,
}

/// The text written to arm a trigger: a stall of `percent` of [`WINDOW`], NUL-terminated (the
/// kernel overwrites the last byte it copies with a NUL).
pub fn spec(percent: f64) -> String {
    let window = WINDOW.as_micros() as u64;
    let stall = ((percent / 100.0) * window as f64)
        .round()
        .clamp(1.0, window as f64) as u64;
    format!("some {stall} {window}\0")
}

impl Trigger {
    /// Arms a trigger on `file` (a host path) that fires when tasks stall `percent` of a window.
    /// Must run inside a tokio runtime.
    pub fn arm(host: &HostFs, file: &str, percent: f64) -> Result<Trigger, PsiError> {
        let path = host.path(file);
        let err = |why: String| PsiError::Trigger {
            path: path.clone(),
            why,
        };
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| err(format!("opening for a trigger: {e}")))?;
        let spec = spec(percent);
        f.write_all(spec.as_bytes()).map_err(|e| {
            err(format!(
                "the kernel refused the trigger {:?}: {e}",
                spec.trim_end_matches('\0')
            ))
        })?;
        // SAFETY: the `File` owns its descriptor and keeps it open, unchanged, until it is
        // dropped, which happens only with the `AsyncFd` that owns it.
        let fd = unsafe { AsyncFd::register_with_interest(f, Interest::PRIORITY) }
            .map_err(|e| err(format!("registering with epoll: {e}")))?;
        Ok(Trigger {
            fd,
            file: file.to_owned(),
        })
    }

    /// Waits until the kernel raises the trigger.
    pub async fn fired(&self) -> Result<(), PsiError> {
        let mut guard = self
            .fd
            .ready(Interest::PRIORITY)
            .await
            .map_err(|e| PsiError::Trigger {
                path: self.file.clone().into(),
                why: format!("waiting for the trigger: {e}"),
            })?;
        let ready = guard.ready();
        guard.clear_ready();
        if ready.is_error() {
            return Err(PsiError::Trigger {
                path: self.file.clone().into(),
                why: "the pressure file went away (its cgroup was removed)".to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_a_share_of_the_window_and_nul_terminated() {
        assert_eq!(spec(10.0), "some 200000 2000000\0");
        assert_eq!(spec(15.0), "some 300000 2000000\0");
        assert_eq!(spec(0.00001), "some 1 2000000\0");
        assert_eq!(spec(100.0), "some 2000000 2000000\0");
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_pressure_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostFs::new(dir.path());
        let err = Trigger::arm(&host, "/proc/pressure/memory", 10.0).unwrap_err();
        assert!(
            err.to_string()
                .contains("proc/pressure/memory: opening for a trigger"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_kernel_accepts_a_trigger_on_this_hosts_memory_pressure() {
        // A 2 s window is granted with or without CAP_SYS_RESOURCE (this sandbox lacks it).
        let trigger = Trigger::arm(&HostFs::new("/"), "/proc/pressure/memory", 10.0);
        assert!(trigger.is_ok(), "{:?}", trigger.err());
    }
}
