//! Kernel PSI triggers: writing `some <stall µs> <window µs>` to a pressure file asks the kernel
//! to raise `POLLPRI` on that descriptor whenever tasks stalled that long within the window, so
//! the evaluation wakes the moment pressure crosses instead of polling fast.
//!
//! The kernel accepts windows of 500 ms to 10 s, one trigger per open file, and (for
//! unprivileged writers) windows that are multiples of 2 s; a refusal is returned as an error
//! naming the file, and the caller falls back to periodic reads. A pressure file on a read-only
//! mount (the DaemonSet's default) is [`PsiError::ReadOnlyMount`], the expected case, not a fault.
//!
//! Only a real pressure file takes a trigger. The file is first opened with `O_PATH` (neither
//! read nor written), the filesystem of that descriptor is checked (`fstatfs`: procfs or cgroup2,
//! whatever the path), and only then is the same file reopened for writing, through
//! `/proc/self/fd`, not by its path again. A pressure file anywhere else (a copied host or a test
//! tree under `--host-root`, whose pressure files are ordinary files) is refused naming its
//! filesystem and is never opened for writing: the agent writes nothing into a host tree.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

use super::PsiError;
use crate::sysfs::HostFs;

/// The window a trigger measures stall over: 2 s, the shortest the kernel grants a writer without
/// `CAP_SYS_RESOURCE` (it also matches the 2 s in which the kernel updates the averages).
pub const WINDOW: Duration = Duration::from_secs(2);

/// The filesystems whose pressure files take triggers (`linux/magic.h`).
const PROC_SUPER_MAGIC: u32 = 0x9fa0;
const CGROUP2_SUPER_MAGIC: u32 = 0x6367_7270;

/// Filesystems a host tree's pressure files may be copied onto, by magic (`linux/magic.h`, and
/// ZFS's own), to name them in the refusal.
const OTHER_FILESYSTEMS: [(u32, &str); 13] = [
    (0xef53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683e, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x794c_7630, "overlayfs"),
    (0x6573_5546, "fuse"),
    (0x6969, "nfs"),
    (0x0102_1997, "9p"),
    (0x2fc1_2fc1, "zfs"),
    (0x7371_7368, "squashfs"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroup v1"),
];

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

/// The magic number of the filesystem `file` is on.
fn filesystem_magic(file: &File) -> io::Result<u32> {
    // SAFETY: statfs is plain data, for which all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a statfs the call may fill.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Magics are 32 bits; `f_type` is wider and signed on some ABIs, so only its low 32 bits count.
    Ok(stat.f_type as u32)
}

/// A filesystem for messages: its name where known, and its magic.
fn filesystem_name(magic: u32) -> String {
    match OTHER_FILESYSTEMS.iter().find(|(m, _)| *m == magic) {
        Some((_, name)) => format!("{name} ({magic:#010x})"),
        None => format!("a filesystem of magic {magic:#010x}"),
    }
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
        // O_PATH: the file is located, not opened for reading or writing.
        let located = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&path)
            .map_err(|e| err(format!("opening for a trigger: {e}")))?;
        let magic =
            filesystem_magic(&located).map_err(|e| err(format!("finding its filesystem: {e}")))?;
        if magic != PROC_SUPER_MAGIC && magic != CGROUP2_SUPER_MAGIC {
            return Err(PsiError::NotKernelPressure {
                path,
                filesystem: filesystem_name(magic),
            });
        }
        // The same file, reopened for writing through the agent's own descriptor table.
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", located.as_raw_fd()))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EROFS) => PsiError::ReadOnlyMount { path: path.clone() },
                _ => err(format!("reopening for writing the trigger: {e}")),
            })?;
        drop(located);
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
    use std::{
        ffi::CString,
        io,
        os::{
            fd::{AsRawFd, FromRawFd, OwnedFd},
            unix::ffi::OsStrExt,
        },
        path::Path,
    };

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
        assert!(
            !host.exists("/proc/pressure/memory"),
            "a missing file is not created"
        );
    }

    /// Raises an event when the watched file is opened for writing and closed (`IN_CLOSE_WRITE`,
    /// written to or not) or modified.
    struct WriteWatch(OwnedFd);

    impl WriteWatch {
        fn on(path: &Path) -> WriteWatch {
            // SAFETY: no pointer is passed; the descriptor is owned at once.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
            // SAFETY: a fresh descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let name = CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
            // SAFETY: a valid descriptor and a NUL-terminated path that outlives the call.
            let wd = unsafe {
                libc::inotify_add_watch(
                    fd.as_raw_fd(),
                    name.as_ptr(),
                    libc::IN_CLOSE_WRITE | libc::IN_MODIFY,
                )
            };
            assert!(wd >= 0, "inotify_add_watch: {}", io::Error::last_os_error());
            WriteWatch(fd)
        }

        /// Whether the file was opened for writing or written since [`WriteWatch::on`].
        fn saw_a_write(&self) -> bool {
            let mut events = [0u8; 4096];
            // SAFETY: reads into a buffer of the length given; the descriptor is non-blocking.
            let n =
                unsafe { libc::read(self.0.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
            n > 0
        }
    }

    /// Issue #14: over a copied host tree the agent armed its trigger by writing
    /// `some 600000 2000000` into the tree's ordinary `proc/pressure/memory`, overwriting the
    /// readings it then failed to parse.
    #[tokio::test]
    async fn a_trigger_on_an_ordinary_file_is_refused_naming_its_filesystem_and_writes_nothing() {
        const READINGS: &str = "some avg10=60.00 avg60=55.00 avg300=20.00 total=123456\nfull avg10=1.00 avg60=1.00 avg300=0.50 total=789\n";
        // On tmpfs, so that the filesystem the reason names is known.
        let dir = tempfile::tempdir_in("/dev/shm").expect("a directory on tmpfs");
        crate::sysfs::fake::write(dir.path(), "/proc/pressure/memory", READINGS);
        let file = dir.path().join("proc/pressure/memory");
        let watch = WriteWatch::on(&file);
        let host = HostFs::new(dir.path());
        let refused = Trigger::arm(&host, "/proc/pressure/memory", 30.0);
        assert_eq!(
            std::fs::read_to_string(&file).expect("read back"),
            READINGS,
            "the file's bytes changed"
        );
        assert!(!watch.saw_a_write(), "the file was opened for writing");
        let why = refused
            .expect_err("an ordinary file takes no trigger")
            .to_string();
        assert!(
            why.starts_with(&format!(
                "{}: not a kernel pressure file: it is on tmpfs (0x01021994)",
                file.display()
            )),
            "{why}"
        );
    }

    #[tokio::test]
    async fn the_kernel_accepts_a_trigger_on_this_hosts_memory_pressure() {
        // A 2 s window is granted with or without CAP_SYS_RESOURCE (this sandbox lacks it).
        let trigger = Trigger::arm(&HostFs::new("/"), "/proc/pressure/memory", 10.0);
        assert!(trigger.is_ok(), "{:?}", trigger.err());
    }
}
