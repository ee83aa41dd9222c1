//! Reading a directory tree that others can write (a hugetlbfs mount: a tenant's
//! `emptyDir: {medium: HugePages}` is one) without ever leaving it. The tree's root is opened
//! once ([`Beneath::open`]) and its device checked; everything below is opened from that
//! descriptor with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV |
//! RESOLVE_NO_MAGICLINKS` (Linux 5.6): a symbolic link anywhere in the path, a `..` that would
//! climb out, or a mount crossed fails the open with an error, so a directory swapped for a link
//! to `/proc` during a walk sends the walk nowhere. A directory's entries are `fstatat`ed from
//! the directory's own descriptor without following links, and a file opened for a query is
//! checked by device and inode against what the walk met ([`Beneath::open_file`]).

use std::{
    ffi::{CStr, CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::{OsStrExt, OsStringExt},
    },
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("{}: {call}: {source}", path.display())]
    Call {
        path: PathBuf,
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{}: device {found:#x}, not the expected {expected:#x}", path.display())]
    Device {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{}: inode {found} of device {dev:#x}, not the {expected} the walk met", path.display())]
    Replaced {
        path: PathBuf,
        dev: u64,
        found: u64,
        expected: u64,
    },
}

/// What `fstatat` tells of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStat {
    pub dev: u64,
    pub ino: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub is_dir: bool,
    pub is_file: bool,
}

/// A tree's root, opened; every open below it stays below it.
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    /// The root's path as the agent opened it, for errors.
    shown: PathBuf,
    dev: u64,
}

impl Beneath {
    /// Opens the directory at `path` (the last component not followed if a link) as a root,
    /// refused unless it is on device `dev` (`st_dev`).
    pub fn open(path: &Path, dev: u64) -> Result<Beneath, BeneathError> {
        let c_path = c_string(path.as_os_str(), path)?;
        // SAFETY: a NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(call(path, "open", io::Error::last_os_error()));
        }
        // SAFETY: a descriptor this process just opened and owns alone.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        let found = fstat(&root, path)?.dev;
        if found != dev {
            return Err(BeneathError::Device {
                path: path.to_owned(),
                found,
                expected: dev,
            });
        }
        Ok(Beneath {
            root,
            shown: path.to_owned(),
            dev,
        })
    }

    /// The entries of the directory `rel` (relative to the root; empty: the root), each with
    /// what `fstatat` tells without following a link; `.` and `..` left out.
    pub fn entries(&self, rel: &Path) -> Result<Vec<(OsString, EntryStat)>, BeneathError> {
        let dir = self.openat2(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let shown = self.shown.join(rel);
        // SAFETY: fdopendir takes the descriptor over; closedir below closes it once.
        let stream = unsafe { libc::fdopendir(dir.as_raw_fd()) };
        if stream.is_null() {
            return Err(call(&shown, "fdopendir", io::Error::last_os_error()));
        }
        let dir_fd = dir.as_raw_fd();
        std::mem::forget(dir);
        let mut out = Vec::new();
        let mut failed = None;
        loop {
            // SAFETY: a stream fdopendir returned and not yet closed.
            let entry = unsafe { libc::readdir64(stream) };
            if entry.is_null() {
                break;
            }
            // SAFETY: readdir64 returned an entry whose d_name is NUL-terminated.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            // SAFETY: an all-zero stat is a valid value for fstatat to fill.
            let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
            // SAFETY: the stream's descriptor is open; name is NUL-terminated; st is writable.
            let rc = unsafe {
                libc::fstatat64(dir_fd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
            };
            if rc != 0 {
                let err = io::Error::last_os_error();
                // Gone between the listing and the stat: not there.
                if err.kind() != io::ErrorKind::NotFound {
                    failed = Some(call(
                        &shown.join(OsStr::from_bytes(name.to_bytes())),
                        "fstatat",
                        err,
                    ));
                    break;
                }
                continue;
            }
            out.push((
                OsString::from_vec(name.to_bytes().to_vec()),
                entry_stat(&st),
            ));
        }
        // SAFETY: the stream opened above, closed once (with its descriptor).
        unsafe { libc::closedir(stream) };
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Opens the regular file `rel` read-only without blocking (a FIFO swapped in never stalls
    /// the walk), refused unless it is still inode `ino` of the root's device.
    pub fn open_file(&self, rel: &Path, ino: u64) -> Result<OwnedFd, BeneathError> {
        let fd = self.openat2(
            rel,
            libc::O_RDONLY | libc::O_NOATIME | libc::O_NONBLOCK | libc::O_NOFOLLOW,
        )?;
        let path = self.shown.join(rel);
        let st = fstat(&fd, &path)?;
        if st.dev != self.dev || st.ino != ino || !st.is_file {
            return Err(BeneathError::Replaced {
                path,
                dev: st.dev,
                found: st.ino,
                expected: ino,
            });
        }
        Ok(fd)
    }

    /// `openat2` from the root with no link followed, no climb out and no mount crossed.
    fn openat2(&self, rel: &Path, flags: libc::c_int) -> Result<OwnedFd, BeneathError> {
        let path = self.shown.join(rel);
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let c_rel = c_string(rel.as_os_str(), &path)?;
        // SAFETY: an all-zero open_how is valid; the fields are set below.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_XDEV
            | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: the root descriptor is open, the path NUL-terminated, `how` lives across the
        // call and its size is passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root.as_raw_fd(),
                c_rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(call(&path, "openat2", io::Error::last_os_error()));
        }
        let fd = libc::c_int::try_from(fd).map_err(|_| {
            call(
                &path,
                "openat2",
                io::Error::other("descriptor out of range"),
            )
        })?;
        // SAFETY: a descriptor this process just opened and owns alone.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn c_string(text: &OsStr, path: &Path) -> Result<CString, BeneathError> {
    CString::new(text.as_bytes())
        .map_err(|e| call(path, "open", io::Error::new(io::ErrorKind::InvalidInput, e)))
}

fn call(path: &Path, call: &'static str, source: io::Error) -> BeneathError {
    BeneathError::Call {
        path: path.to_owned(),
        call,
        source,
    }
}

fn fstat(fd: &OwnedFd, path: &Path) -> Result<EntryStat, BeneathError> {
    // SAFETY: an all-zero stat is a valid value for fstat to fill.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a writable stat.
    if unsafe { libc::fstat64(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(call(path, "fstat", io::Error::last_os_error()));
    }
    Ok(entry_stat(&st))
}

fn entry_stat(st: &libc::stat64) -> EntryStat {
    let kind = st.st_mode & libc::S_IFMT;
    EntryStat {
        dev: st.st_dev,
        ino: st.st_ino,
        blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        is_dir: kind == libc::S_IFDIR,
        is_file: kind == libc::S_IFREG,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn root(dir: &Path) -> Beneath {
        let dev = std::fs::metadata(dir).expect("stat").dev();
        Beneath::open(dir, dev).expect("root")
    }

    #[test]
    fn entries_are_listed_without_following_links_and_links_are_never_walked_through() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/file"), b"x").expect("write");
        std::os::unix::fs::symlink("/proc", dir.path().join("link")).expect("link");
        let tree = root(dir.path());
        let mut names: Vec<(String, bool, bool)> = tree
            .entries(Path::new(""))
            .expect("entries")
            .into_iter()
            .map(|(n, st)| (n.to_string_lossy().into_owned(), st.is_dir, st.is_file))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("link".to_owned(), false, false),
                ("sub".to_owned(), true, false)
            ]
        );
        let file = tree.entries(Path::new("sub")).expect("sub");
        assert_eq!(file.len(), 1);
        // Through the link, or climbing out: refused, whatever is there.
        for rel in ["link", "link/self", "../", "sub/../../etc"] {
            let err = tree.entries(Path::new(rel)).expect_err(rel).to_string();
            assert!(err.contains("openat2"), "{rel}: {err}");
        }
        // A file swapped for another is refused by its inode.
        let ino = file[0].1.ino;
        assert!(tree.open_file(Path::new("sub/file"), ino).is_ok());
        // Made before the first goes, so it cannot take the freed inode number.
        std::fs::write(dir.path().join("sub/other"), b"y").expect("write");
        std::fs::rename(dir.path().join("sub/other"), dir.path().join("sub/file")).expect("mv");
        let err = tree
            .open_file(Path::new("sub/file"), ino)
            .expect_err("replaced")
            .to_string();
        assert!(err.contains("not the"), "{err}");
        // A directory swapped for a link after the root was opened is not followed either.
        std::fs::remove_dir_all(dir.path().join("sub")).expect("rm sub");
        std::os::unix::fs::symlink("/proc", dir.path().join("sub")).expect("link");
        assert!(tree.entries(Path::new("sub")).is_err());
        assert!(tree.open_file(Path::new("sub/self/status"), 1).is_err());
    }

    #[test]
    fn a_root_on_another_device_than_expected_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let dev = std::fs::metadata(dir.path()).expect("stat").dev();
        let err = Beneath::open(dir.path(), dev ^ 1)
            .expect_err("device")
            .to_string();
        assert!(err.contains("not the expected"), "{err}");
    }
}
