//! The agent's own memory footprint: it takes no transparent huge pages for itself, and its
//! threads share one malloc arena.
//!
//! The agent runs on the nodes that need their huge pages most, and guards them. With THP in
//! `madvise` mode an allocator that advises its arenas (`MADV_HUGEPAGE`) makes the kernel back
//! them with 2 MiB pages: an idle agent once held 72 MB of `AnonHugePages`. `PR_SET_THP_DISABLE`
//! turns THP off for this process whatever any library advises (and for the children it
//! starts), before anything is allocated in earnest.
//!
//! glibc gives threads arenas of their own as they contend (up to eight per CPU), and the
//! agent's threads come and go: the blocking threads that write reservations end after 10 s idle
//! and new ones take arenas again at the next burst of admissions. Each arena keeps what it was
//! given, fragmented, so a soak of bursts and idle phases saw the resident set grow by about
//! 60 KiB a minute with a live heap of about 0.6 MiB (heaptrack). With one arena
//! (`M_ARENA_MAX` 1) it stays where the first burst put it; small allocations still come from
//! each thread's own cache without the arena's lock.

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

/// Makes every thread allocate from glibc's main arena (`mallopt(M_ARENA_MAX, 1)`); call it
/// before the first thread starts. False when glibc refused it.
pub fn one_malloc_arena() -> bool {
    // SAFETY: mallopt takes two integers and changes only this process's allocator settings;
    // no other thread runs yet.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}
