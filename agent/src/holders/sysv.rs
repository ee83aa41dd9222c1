//! The SysV shared memory segments of the host's IPC namespace, from `/proc/sysvipc/shm`, read
//! by the names of its header's columns.
//!
//! The file does not say which segments hugepages back (`perms` holds only the permission bits
//! and `SHM_DEST`/`SHM_LOCKED`), so [`super`] learns it from the mappings of the processes that
//! attach them (`/SYSV<key>` with the `huge` mark of `numa_maps`) and, for those no process
//! attaches, from `rss` where it shows it: the kernel counts a hugetlb segment's resident memory
//! as the pages of its file times the base pages of one hugepage (`shm_add_rss_swap`), and
//! where the page cache counts a hugepage in base pages (seen on 6.18; not on 6.1 or 6.12) that
//! counts each one twice over and comes out above the segment's size, which no segment of
//! ordinary pages can show. Elsewhere the accounts decide ([`super`]).

use std::collections::HashMap;

/// One segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub key: i32,
    pub shmid: u64,
    pub size: u64,
    /// The creator's pid, in the reader's PID namespace (the kernel translates it; 0 when the
    /// creator is not in it).
    pub cpid: u32,
    /// The pid of the last `shmat` or `shmdt`.
    pub lpid: u32,
    pub nattch: u64,
    pub uid: u32,
    /// `rss` in bytes, as the kernel reports it (see the module's note for hugetlb segments).
    pub rss: u64,
    /// `ctime`: when it was created or last changed by `shmctl`, seconds since the epoch.
    pub ctime: u64,
}

impl Segment {
    /// The kernel's `rss` can only exceed the segment's size (rounded up to a base page) when
    /// hugepages back it, on kernels that count a hugepage's base pages twice over (see the
    /// module's note).
    pub fn rss_shows_hugetlb(&self) -> bool {
        self.rss > self.size.div_ceil(BASE_PAGE) * BASE_PAGE
    }
}

impl Segment {
    /// Whether `bytes` are a whole number of pages of `page_size` that the segment can hold (its
    /// size rounded up to that page).
    pub fn holds_pages(&self, bytes: u64, page_size: u64) -> bool {
        page_size > 0
            && bytes.is_multiple_of(page_size)
            && self
                .size
                .div_ceil(page_size)
                .checked_mul(page_size)
                .is_some_and(|most| bytes <= most)
    }
}

/// The base page size `rss` is counted in (x86-64, arm64 with 4 KiB pages).
const BASE_PAGE: u64 = 4096;

/// The segments of a `/proc/sysvipc/shm` text, or `None` when its header lacks a column they
/// need. A line that does not parse is passed over.
pub fn parse(text: &str) -> Option<Vec<Segment>> {
    let mut lines = text.lines();
    let header: HashMap<&str, usize> = lines
        .next()?
        .split_whitespace()
        .enumerate()
        .map(|(i, name)| (name, i))
        .collect();
    let column = |name: &str| header.get(name).copied();
    let columns = [
        "key", "shmid", "size", "cpid", "lpid", "nattch", "uid", "rss", "ctime",
    ]
    .map(column);
    let [key, shmid, size, cpid, lpid, nattch, uid, rss, ctime] = columns;
    let (key, shmid, size, cpid, lpid, nattch, uid, ctime) =
        (key?, shmid?, size?, cpid?, lpid?, nattch?, uid?, ctime?);
    let segments = lines
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let get = |i: usize| fields.get(i).copied();
            Some(Segment {
                key: get(key)?.parse().ok()?,
                shmid: get(shmid)?.parse().ok()?,
                size: get(size)?.parse().ok()?,
                cpid: get(cpid)?.parse().ok()?,
                lpid: get(lpid)?.parse().ok()?,
                nattch: get(nattch)?.parse().ok()?,
                uid: get(uid)?.parse().ok()?,
                // Older kernels print no rss column: nothing resident is known then.
                rss: rss.and_then(get).and_then(|r| r.parse().ok()).unwrap_or(0),
                ctime: get(ctime)?.parse().ok()?,
            })
        })
        .collect();
    Some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHM: &str = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
         0          3  1600               6291456  4242  4243      0     0     0     0     0 1764284000 1764284001 1764283999            3221225472                     0
      4660          4   600               4194304  4250  4250      1  1000  1000  1000  1000 1764284000          0 1764283999               2097152                     0
garbage
";

    #[test]
    fn reads_segments_by_the_header_s_column_names() {
        let segments = parse(SHM).expect("a header");
        assert_eq!(segments.len(), 2, "the garbage line is passed over");
        assert_eq!(
            segments[0],
            Segment {
                key: 0,
                shmid: 3,
                size: 6 << 20,
                cpid: 4242,
                lpid: 4243,
                nattch: 0,
                uid: 0,
                rss: 3 << 30,
                ctime: 1_764_283_999,
            }
        );
        assert_eq!(segments[1].key, 0x1234);
        assert!(segments[0].rss_shows_hugetlb());
        assert!(!segments[1].rss_shows_hugetlb());
    }

    #[test]
    fn a_header_without_a_needed_column_is_refused() {
        assert_eq!(parse("key shmid size\n1 2 3\n"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn rss_up_to_the_size_rounded_to_a_base_page_shows_nothing() {
        let mut s = parse(SHM).expect("a header").remove(1);
        s.size = 4097;
        s.rss = 8192;
        assert!(!s.rss_shows_hugetlb());
        s.rss = 8193;
        assert!(s.rss_shows_hugetlb());
    }
}
