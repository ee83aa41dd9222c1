//! What the tests of #37 leave behind on the real kernel, as an operator's host has it: a
//! hugetlbfs mount of their own ([`Mounted`]), files whose pages a process took and then kept
//! nothing of ([`left_behind`]), and SysV segments created with `SHM_HUGETLB` ([`Segment`]);
//! each guard undoes what it made when dropped, on every exit path. Used by `tests/holders.rs`
//! and by the VM's check on four nodes.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use crate::HostLock;

const MI2: u64 = 2 << 20;

fn cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

/// A hugetlbfs mount made in this process's mount namespace on a fresh directory; unmounted
/// (its files and their pages freed with it) and the directory removed when dropped.
pub struct Mounted {
    pub dir: PathBuf,
    _keep: tempfile::TempDir,
}

impl Mounted {
    /// hugetlbfs mounted with `options` on a fresh directory, or on `rel` below it (a pod's
    /// `emptyDir` path).
    pub fn new(_lock: &HostLock, options: &str, rel: Option<&str>) -> Mounted {
        let keep = tempfile::Builder::new()
            .prefix("hugepage-agent-holders-")
            .tempdir()
            .expect("a temporary directory");
        let dir = rel.map_or_else(|| keep.path().to_path_buf(), |r| keep.path().join(r));
        std::fs::create_dir_all(&dir).expect("the mount point");
        let options = CString::new(options).expect("options without NUL");
        // SAFETY: NUL-terminated strings; the result is checked.
        let rc = unsafe {
            libc::mount(
                c"hugepage-agent-test".as_ptr(),
                cstring(&dir).as_ptr(),
                c"hugetlbfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount -t hugetlbfs -o {options:?} {dir:?}: {}",
            std::io::Error::last_os_error()
        );
        Mounted { dir, _keep: keep }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::umount2(cstring(&self.dir).as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "umount {}: {}",
                self.dir.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Opens (creating) a file of a hugetlbfs mount for reading and writing.
pub fn open(path: &Path) -> OwnedFd {
    // SAFETY: a NUL-terminated path; the descriptor returned is checked and owned.
    let fd = unsafe { libc::open(cstring(path).as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
    assert!(
        fd >= 0,
        "open {path:?}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a descriptor just opened and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Hugepages this process maps; unmapped when dropped.
pub struct Mapping {
    at: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    /// `pages` pages of `page` bytes of `fd` (sized to them) mapped shared, bound to `node` when
    /// given, the first `touched` of them written.
    pub fn shared(
        fd: &OwnedFd,
        pages: u64,
        page: u64,
        touched: u64,
        node: Option<usize>,
    ) -> Mapping {
        let len = (pages * page) as usize;
        // SAFETY: a valid descriptor, sized before it is mapped.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) },
            0
        );
        Mapping::new(len, libc::MAP_SHARED, fd.as_raw_fd(), page, touched, node)
    }

    /// `pages` private anonymous hugepages of `page` bytes (`MAP_HUGETLB` of the default size),
    /// each written.
    pub fn private_anonymous(pages: u64, page: u64) -> Mapping {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
        Mapping::new((pages * page) as usize, flags, -1, page, pages, None)
    }

    fn new(
        len: usize,
        flags: i32,
        fd: i32,
        page: u64,
        touched: u64,
        node: Option<usize>,
    ) -> Mapping {
        // SAFETY: the mapping is checked, then written within its length.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            );
            assert_ne!(
                at,
                libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            let mapping = Mapping { at, len };
            if let Some(node) = node {
                crate::mbind::bind(at as usize, len, node).expect("mbind");
            }
            for i in 0..touched as usize {
                at.cast::<u8>().add(i * page as usize).write_volatile(1);
            }
            mapping
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this guard made, of its length, unmapped once.
        unsafe { libc::munmap(self.at, self.len) };
    }
}

/// Maps `pages` pages of `page` bytes of `fd` shared (bound to `node` when given), writes a
/// byte in each, and unmaps them: the file holds the pages and this process nothing.
pub fn fault_file(fd: &OwnedFd, pages: u64, page: u64, node: Option<usize>) {
    drop(Mapping::shared(fd, pages, page, pages, node));
}

/// A file of `pages` pages written through a mapping by this process, which then keeps nothing
/// of it: what a DPDK application that crashed leaves.
pub fn left_behind(path: &Path, pages: u64, page: u64, node: Option<usize>) {
    fault_file(&open(path), pages, page, node);
}

/// A SysV segment created with `SHM_HUGETLB`; removed (`IPC_RMID`) when dropped.
pub struct Segment {
    pub id: i32,
    attached: Option<*mut libc::c_void>,
}

impl Segment {
    /// A segment of `pages` 2 MiB pages, attached, with its first `touched` pages written (bound
    /// to `node` when given).
    pub fn touched(pages: u64, touched: u64, node: Option<usize>) -> Segment {
        let size = (pages * MI2) as usize;
        // SAFETY: plain system calls; results checked.
        let id = unsafe {
            libc::shmget(
                libc::IPC_PRIVATE,
                size,
                libc::IPC_CREAT | libc::SHM_HUGETLB | 0o600,
            )
        };
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        let mut segment = Segment { id, attached: None };
        // SAFETY: the segment just created; checked.
        let at = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        assert_ne!(
            at as isize,
            -1,
            "shmat: {}",
            std::io::Error::last_os_error()
        );
        segment.attached = Some(at);
        if let Some(node) = node {
            crate::mbind::bind(at as usize, size, node).expect("mbind");
        }
        for i in 0..touched as usize {
            // SAFETY: within the attached segment.
            unsafe { at.cast::<u8>().add(i * MI2 as usize).write_volatile(1) };
        }
        segment
    }

    /// Detaches it; it stays, holding its pages.
    pub fn detach(&mut self) {
        if let Some(at) = self.attached.take() {
            // SAFETY: the address shmat returned.
            assert_eq!(unsafe { libc::shmdt(at) }, 0);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // No assertion here: a panic while a test unwinds would abort it before IPC_RMID.
        if let Some(at) = self.attached.take() {
            // SAFETY: the address shmat returned.
            unsafe { libc::shmdt(at) };
        }
        // SAFETY: removing our own segment.
        if unsafe { libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut()) } != 0 {
            eprintln!(
                "shmctl({}, IPC_RMID): {}",
                self.id,
                std::io::Error::last_os_error()
            );
        }
    }
}
