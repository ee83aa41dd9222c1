//! The NUMA nodes of a hugetlbfs file's pages when no process maps them: the kernel shows a
//! page's node only through a mapping of it, so the agent maps the file itself, read-only and
//! private (`MAP_PRIVATE | MAP_NORESERVE`), maps its pages in (`MADV_POPULATE_READ`), asks where
//! each one is (`move_pages` without moving), and unmaps it. A private read-only mapping adds
//! no page to the file and changes no byte of it, and takes no reservation.
//!
//! Only a file with no hole is asked (its blocks cover its size): a read of a hole in a private
//! mapping would take a free page for the agent for the time of the query. The file is opened
//! `O_NOATIME` (its access time stays as it is), which the kernel allows the file's owner or a
//! holder of `CAP_FOWNER`; refused, the node stays unknown. Anything that fails leaves the
//! nodes unknown, and the answer says so.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, OwnedFd},
};

use crate::host::NumaNode;

/// Why the nodes were not learnt.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error(
        "the path no longer names the file the walk found (a regular hugetlbfs file, inode {inode})"
    )]
    Replaced { inode: u64 },
    #[error("the file has holes: {held} of {size} bytes held")]
    Holes { held: u64, size: u64 },
    #[error("{call}: {source}")]
    Call {
        call: &'static str,
        #[source]
        source: io::Error,
    },
}

fn failed(call: &'static str) -> NodesError {
    NodesError::Call {
        call,
        source: io::Error::last_os_error(),
    }
}

/// Bytes per NUMA node of the file open at `fd` (opened beneath its mount, checked to be the
/// regular file of inode `inode` the walk found: [`crate::sysfs::beneath::Beneath::open_file`]).
pub fn of_descriptor(
    fd: &OwnedFd,
    inode: u64,
    page_size: u64,
) -> Result<BTreeMap<NumaNode, u64>, NodesError> {
    query(fd.as_raw_fd(), inode, page_size)
}

fn query(
    fd: libc::c_int,
    inode: u64,
    page_size: u64,
) -> Result<BTreeMap<NumaNode, u64>, NodesError> {
    // SAFETY: a zeroed `stat` is a valid out-parameter, filled by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(failed("fstat"));
    }
    // SAFETY: a zeroed `statfs` is a valid out-parameter, filled by the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and out-pointer.
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return Err(failed("fstatfs"));
    }
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    if !regular || st.st_ino != inode || fs.f_type != super::procs::HUGETLBFS_MAGIC {
        return Err(NodesError::Replaced { inode });
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let held = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    let pages = size.div_ceil(page_size.max(1));
    if pages == 0 || held != pages * page_size {
        return Err(NodesError::Holes { held, size });
    }
    let len = usize::try_from(pages * page_size).map_err(|_| NodesError::Holes { held, size })?;
    // SAFETY: a fresh private read-only mapping of the whole file, unmapped below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            fd,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(failed("mmap"));
    }
    let placed = place(at, len, pages, page_size);
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(at, len) };
    placed
}

fn place(
    at: *mut libc::c_void,
    len: usize,
    pages: u64,
    page_size: u64,
) -> Result<BTreeMap<NumaNode, u64>, NodesError> {
    // SAFETY: the range is the mapping the caller made.
    if unsafe { libc::madvise(at, len, libc::MADV_POPULATE_READ) } != 0 {
        return Err(failed("madvise(MADV_POPULATE_READ)"));
    }
    let addresses: Vec<*mut libc::c_void> = (0..pages)
        // SAFETY: each address is within the mapping.
        .map(|i| unsafe { at.cast::<u8>().add((i * page_size) as usize).cast() })
        .collect();
    let mut status = vec![0 as libc::c_int; addresses.len()];
    // SAFETY: `move_pages` of this process with no target nodes only reports each page's node
    // into `status`, one entry per address.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            addresses.len() as libc::c_ulong,
            addresses.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0,
        )
    };
    if rc != 0 {
        return Err(failed("move_pages"));
    }
    let mut out = BTreeMap::new();
    for node in status {
        // A negative status is a page the kernel could not place: left out.
        if let Ok(node) = u32::try_from(node) {
            *out.entry(NumaNode(node)).or_default() += page_size;
        }
    }
    Ok(out)
}
