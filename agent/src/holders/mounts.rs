//! The hugetlbfs mounts of the host's mount namespace, from `/proc/1/mountinfo`: where each is
//! mounted, its superblock's device, its page size and its size limit. A superblock mounted in
//! several places (a bind mount, the kubelet's `emptyDir` seen by its containers) is one
//! [`Mount`], named by its mount whose root is the superblock's own.

use std::collections::BTreeMap;

/// One hugetlbfs superblock as the host's mount namespace sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the superblock, as `/proc/<pid>/maps` and `stat` show it.
    pub dev: Dev,
    /// Where it is mounted (the first mount of its own root, else the first mount of it).
    pub mount_point: String,
    /// `pagesize=`: the page size in bytes; `None` when the options do not name one (the
    /// default hugepage size).
    pub page_size: Option<u64>,
    /// `size=`: the limit of bytes its files may hold, when it has one.
    pub size_limit: Option<u64>,
}

/// A device number as `major:minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dev {
    pub major: u32,
    pub minor: u32,
}

impl Dev {
    /// `8:1`.
    pub fn parse(text: &str) -> Option<Dev> {
        let (major, minor) = text.split_once(':')?;
        Some(Dev {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }

    /// From `st_dev`, as glibc's `major()` and `minor()` split it.
    pub fn from_st_dev(dev: u64) -> Dev {
        Dev {
            major: (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)) as u32,
            minor: (((dev >> 12) & 0xffff_ff00) | (dev & 0xff)) as u32,
        }
    }

    /// From a `dev_t` as the kernel keeps it inside (`super_block.s_dev`, the probes' records):
    /// `major << 20 | minor`.
    pub fn from_kernel(dev: u32) -> Dev {
        let (major, minor) = crate::probes::events::split_dev(dev);
        Dev { major, minor }
    }
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The hugetlbfs superblocks in a `mountinfo` text, sorted by mount point. Lines that are not
/// hugetlbfs, or not in `mountinfo`'s form, are passed over.
pub fn hugetlbfs(mountinfo: &str) -> Vec<Mount> {
    let mut by_dev: BTreeMap<Dev, (bool, Mount)> = BTreeMap::new();
    for line in mountinfo.lines() {
        let Some((root, mount)) = parse_line(line) else {
            continue;
        };
        let own_root = root == "/";
        match by_dev.get(&mount.dev) {
            Some((true, _)) => {}
            Some((false, _)) if !own_root => {}
            _ => {
                by_dev.insert(mount.dev, (own_root, mount));
            }
        }
    }
    let mut mounts: Vec<Mount> = by_dev.into_values().map(|(_, m)| m).collect();
    mounts.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    mounts
}

/// The devices of every mount in a `mountinfo` text that is not hugetlbfs: a mapping of a file
/// on one of them is no hugetlb mapping.
pub fn others(mountinfo: &str) -> Vec<Dev> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let dev = Dev::parse(before.split(' ').nth(2)?)?;
            (after.split(' ').next()? != "hugetlbfs").then_some(dev)
        })
        .collect()
}

/// `36 35 0:32 / /dev/hugepages rw,relatime shared:20 - hugetlbfs hugetlbfs rw,pagesize=2M`:
/// the mount's root in its superblock, and the mount when it is hugetlbfs.
fn parse_line(line: &str) -> Option<(String, Mount)> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let mut after = after.split(' ');
    if after.next()? != "hugetlbfs" {
        return None;
    }
    let options = after.nth(1).unwrap_or("");
    let dev = Dev::parse(fields.get(2)?)?;
    let root = unescape(fields.get(3)?);
    let mount_point = unescape(fields.get(4)?);
    let option = |name: &str| {
        options
            .split(',')
            .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
    };
    Some((
        root,
        Mount {
            dev,
            mount_point,
            page_size: option("pagesize").and_then(size_option),
            size_limit: option("size").and_then(size_option),
        },
    ))
}

/// `2M`, `1024M`, `1G`, `4194304`, as hugetlbfs prints its options (a `size=` given as a
/// percentage of the pool at mount is printed in bytes).
fn size_option(text: &str) -> Option<u64> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// `mountinfo` writes space, tab, newline and backslash as `\040`, `\011`, `\012`, `\134`.
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:32 / /dev/hugepages rw,relatime shared:20 - hugetlbfs hugetlbfs rw,pagesize=2M
40 22 0:45 / /mnt/huge\\0401G rw,relatime shared:22 - hugetlbfs nodev rw,pagesize=1024M,size=2147483648
41 22 0:45 /sub /var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/h rw - hugetlbfs nodev rw,pagesize=1024M,size=2147483648
42 22 0:46 /sub /bound rw - hugetlbfs nodev rw
43 22 0:47 / /limited rw - hugetlbfs nodev rw,pagesize=2M,size=8M,min_size=4M
";

    #[test]
    fn finds_each_hugetlbfs_superblock_once_by_its_own_root() {
        let mounts = hugetlbfs(MOUNTINFO);
        let points: Vec<_> = mounts.iter().map(|m| m.mount_point.as_str()).collect();
        assert_eq!(
            points,
            ["/bound", "/dev/hugepages", "/limited", "/mnt/huge 1G"]
        );
        let one_gig = &mounts[3];
        assert_eq!(
            one_gig.dev,
            Dev {
                major: 0,
                minor: 45
            }
        );
        assert_eq!(one_gig.page_size, Some(1 << 30));
        assert_eq!(one_gig.size_limit, Some(2 << 30));
        assert_eq!(mounts[0].page_size, None, "no pagesize= option");
        assert_eq!(mounts[2].size_limit, Some(8 << 20));
        assert_eq!(mounts[1].page_size, Some(2 << 20));
    }

    #[test]
    fn the_other_file_systems_devices_are_listed() {
        assert_eq!(others(MOUNTINFO), [Dev { major: 8, minor: 1 }]);
    }

    #[test]
    fn lines_that_are_not_mountinfo_are_passed_over() {
        assert!(hugetlbfs("garbage\n1 2 3 - hugetlbfs\n- hugetlbfs x y\n").is_empty());
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        assert_eq!(
            Dev::from_st_dev(0x2d),
            Dev {
                major: 0,
                minor: 45
            }
        );
        assert_eq!(Dev::from_st_dev(0x801), Dev { major: 8, minor: 1 });
        assert_eq!(
            Dev::from_kernel((259 << 20) | 0x1_0003),
            Dev {
                major: 259,
                minor: 0x1_0003
            }
        );
        assert_eq!(
            Dev::from_st_dev((259 << 8) | 3 | (0x1_0000 << 12)),
            Dev {
                major: 259,
                minor: 3 | 0x1_0000
            }
        );
        assert_eq!(
            Dev::parse("0:45").map(|d| d.to_string()),
            Some("0:45".into())
        );
    }
}
