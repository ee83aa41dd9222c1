//! The agent's own memory footprint: it takes no transparent huge pages for itself.
//!
//! The agent runs on the nodes that need their huge pages most, and guards them. With THP in
//! `madvise` mode an allocator that advises its arenas (`MADV_HUGEPAGE`) makes the kernel back
//! them with 2 MiB pages: an idle agent once held 72 MB of `AnonHugePages`. `PR_SET_THP_DISABLE`
//! turns THP off for this process whatever any library advises (and for the children it
//! starts), before anything is allocated in earnest.

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`).
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes integer arguments only and changes only this
    // process's THP setting.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
