//! The one seam through which the agent reads `/sys` and `/proc`: every path is taken relative to
//! `--host-root`, so the DaemonSet reads the host under `/host` and unit tests read a fake tree.
//!
//! Errors always name the file. Parsing of what is read lives in the submodules.

pub mod beneath;
pub mod cgroup_tree;
#[cfg(test)]
pub mod fake;
pub mod flags;
pub mod hugepages;
pub mod hugetlb_cgroup;
pub mod meminfo;
pub mod topology;

use std::{
    fs, io,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use tracing::warn;

#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: expected {expected}, found {found:?}")]
    Malformed {
        path: PathBuf,
        expected: &'static str,
        found: String,
    },
}

fn not_found_is_none<T>(read: Result<T, SysfsError>) -> Result<Option<T>, SysfsError> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(SysfsError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// A read at start, tried this many times, [`SETTLE_PAUSE`] apart.
const SETTLE_TRIES: u32 = 5;
const SETTLE_PAUSE: Duration = Duration::from_millis(200);

/// A first read of the host, tried again a few times when it fails (each failure logged): a
/// NUMA node that goes offline between `online` and its directory (memory hot-removal, a CXL
/// device reset) fails one read, not the next. Still failing, the host cannot be read where
/// `--host-root` says (the DaemonSet's mount of it), which nothing the agent does can work
/// without: the error names the file. For start-up only: it blocks the thread.
pub fn settled<T>(read: impl Fn() -> Result<T, SysfsError>) -> Result<T, SysfsError> {
    let mut tries = 1;
    loop {
        match read() {
            Ok(value) => return Ok(value),
            Err(err) if tries < SETTLE_TRIES => {
                warn!("{err}; reading again in {SETTLE_PAUSE:?}");
                tries += 1;
                thread::sleep(SETTLE_PAUSE);
            }
            Err(err) => return Err(err),
        }
    }
}

/// The host's file systems, rooted at `--host-root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFs {
    root: PathBuf,
}

impl HostFs {
    pub fn new(root: impl Into<PathBuf>) -> HostFs {
        HostFs { root: root.into() }
    }

    /// The host directory `abs` opened as the root of a tree that others may write, refused
    /// unless it is on device `dev`: nothing below it is opened except beneath it
    /// ([`beneath::Beneath`]).
    pub fn beneath(
        &self,
        abs: impl AsRef<Path>,
        dev: u64,
    ) -> Result<beneath::Beneath, beneath::BeneathError> {
        beneath::Beneath::open(&self.path(abs), dev)
    }

    /// The host path `abs` (written as on the host, e.g. `/sys/kernel/btf/vmlinux`) under the root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        self.root.join(abs.strip_prefix("/").unwrap_or(abs))
    }

    pub fn read_bytes(&self, abs: impl AsRef<Path>) -> Result<Vec<u8>, SysfsError> {
        let path = self.path(abs);
        fs::read(&path).map_err(|source| SysfsError::Read { path, source })
    }

    pub fn read_string(&self, abs: impl AsRef<Path>) -> Result<String, SysfsError> {
        let path = self.path(abs);
        fs::read_to_string(&path).map_err(|source| SysfsError::Read { path, source })
    }

    /// A file holding one unsigned decimal number, such as `free_hugepages`.
    pub fn read_u64(&self, abs: impl AsRef<Path>) -> Result<u64, SysfsError> {
        let abs = abs.as_ref();
        let text = self.read_string(abs)?;
        text.trim().parse().map_err(|_| SysfsError::Malformed {
            path: self.path(abs),
            expected: "an unsigned integer",
            found: text,
        })
    }

    /// [`HostFs::read_string`] of a file that may be absent: `None` when it does not exist (one
    /// syscall, no separate existence check).
    pub fn read_string_opt(&self, abs: impl AsRef<Path>) -> Result<Option<String>, SysfsError> {
        not_found_is_none(self.read_string(abs))
    }

    /// [`HostFs::read_u64`] of a file that may be absent.
    pub fn read_u64_opt(&self, abs: impl AsRef<Path>) -> Result<Option<u64>, SysfsError> {
        not_found_is_none(self.read_u64(abs))
    }

    /// Whether the host path exists (a missing optional directory is not an error).
    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        self.path(abs).exists()
    }

    /// The target of a host symbolic link (`/proc/<pid>/cwd`), as the link holds it.
    pub fn read_link(&self, abs: impl AsRef<Path>) -> Result<PathBuf, SysfsError> {
        let path = self.path(abs);
        fs::read_link(&path).map_err(|source| SysfsError::Read { path, source })
    }

    /// `lstat` of a host path; `None` when it does not exist.
    pub fn metadata(&self, abs: impl AsRef<Path>) -> Result<Option<fs::Metadata>, SysfsError> {
        let path = self.path(abs);
        not_found_is_none(
            fs::symlink_metadata(&path).map_err(|source| SysfsError::Read { path, source }),
        )
    }

    /// `stat` of a host path, following links (`/proc/<pid>/fd/<n>` to its file); `None` when
    /// it does not exist.
    pub fn stat(&self, abs: impl AsRef<Path>) -> Result<Option<fs::Metadata>, SysfsError> {
        let path = self.path(abs);
        not_found_is_none(fs::metadata(&path).map_err(|source| SysfsError::Read { path, source }))
    }

    /// `statfs` of a host path, following links: the file system's type (`f_type`) and block
    /// size (`f_bsize`, a hugetlbfs mount's page size).
    pub fn statfs(&self, abs: impl AsRef<Path>) -> Result<(i64, u64), SysfsError> {
        let path = self.path(abs);
        let read = || -> io::Result<(i64, u64)> {
            let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            // SAFETY: a zeroed `statfs` is a valid out-parameter, filled by the call.
            let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a valid out-pointer.
            if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((stat.f_type, stat.f_bsize as u64))
        };
        read().map_err(|source| SysfsError::Read { path, source })
    }

    /// Names of the entries of a host directory, sorted.
    pub fn list(&self, abs: impl AsRef<Path>) -> Result<Vec<String>, SysfsError> {
        let path = self.path(abs);
        let read = |path: &Path| -> io::Result<Vec<String>> {
            let mut names = fs::read_dir(path)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<io::Result<Vec<_>>>()?;
            names.sort();
            Ok(names)
        };
        read(&path).map_err(|source| SysfsError::Read { path, source })
    }
}
