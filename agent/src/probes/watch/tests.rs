use std::{fs, path::Path};

use super::*;

/// A v2 hierarchy at `/sys/fs/cgroup/unified` of a temporary root, as on a hybrid host.
fn hierarchy(dirs: &[(&str, &[(&str, &str)])]) -> (tempfile::TempDir, HostFs, CgroupV2) {
    let root = tempfile::tempdir().expect("tempdir");
    let mount = root.path().join("sys/fs/cgroup/unified");
    fs::create_dir_all(&mount).expect("mkdir");
    fs::write(mount.join("cgroup.controllers"), "hugetlb\n").expect("write");
    for (dir, files) in dirs {
        let d = mount.join(dir.trim_start_matches('/'));
        fs::create_dir_all(&d).expect("mkdir");
        for (name, content) in *files {
            fs::write(d.join(name), content).expect("write");
        }
    }
    let host = HostFs::new(root.path());
    let v2 = CgroupV2::find(&host).expect("v2 found");
    (root, host, v2)
}

fn ino(root: &Path, rel: &str) -> u64 {
    let p = root
        .join("sys/fs/cgroup/unified")
        .join(rel.trim_start_matches('/'));
    fs::metadata(p).expect("stat").ino()
}

const ZERO: &[(&str, &str)] = &[
    ("hugetlb.2MB.max", "0\n"),
    ("hugetlb.1GB.max", "0\n"),
    // Reservation limits do not govern faults: "max" here must not make the cgroup watched.
    ("hugetlb.2MB.rsvd.max", "max\n"),
    ("hugetlb.1GB.rsvd.max", "max\n"),
];
const UNLIMITED: &[(&str, &str)] = &[("hugetlb.2MB.max", "max\n"), ("hugetlb.1GB.max", "max\n")];
const TWO_MB: &[(&str, &str)] = &[("hugetlb.2MB.max", "4194304\n"), ("hugetlb.1GB.max", "0\n")];

#[test]
fn pods_with_zero_limits_are_not_watched_and_the_rest_are() {
    let (root, host, v2) = hierarchy(&[
        ("/kubepods", UNLIMITED),
        ("/kubepods/besteffort/podA", ZERO),
        ("/kubepods/besteffort/podA/ctr", UNLIMITED),
        ("/kubepods/podB", TWO_MB),
        ("/kubepods/podB/ctr", UNLIMITED),
        ("/system.slice/db.service", &[]),
    ]);
    assert_eq!(v2.mount, "/sys/fs/cgroup/unified");
    let scan = v2.scan(&host).expect("scan");
    let expected: BTreeSet<u64> = [
        "",
        "/kubepods",
        "/kubepods/besteffort",
        "/kubepods/podB",
        "/kubepods/podB/ctr",
        "/system.slice",
        "/system.slice/db.service",
    ]
    .iter()
    .map(|rel| ino(root.path(), rel))
    .collect();
    assert_eq!(scan.watched, expected);
    assert_eq!(scan.cgroups, 9);
    assert!(
        !v2.can_use_hugepages(&host, "/kubepods/besteffort/podA/ctr")
            .expect("limits")
    );
    assert!(
        v2.can_use_hugepages(&host, "/kubepods/podB/ctr")
            .expect("limits")
    );
    assert!(
        v2.can_use_hugepages(&host, "/system.slice/db.service")
            .expect("limits")
    );
}

#[test]
fn a_malformed_limit_names_its_file() {
    let (_root, host, v2) = hierarchy(&[("/bad", &[("hugetlb.2MB.max", "lots\n")])]);
    let err = v2.scan(&host).unwrap_err().to_string();
    assert!(
        err.contains("bad/hugetlb.2MB.max: expected a number of bytes or \"max\""),
        "{err}"
    );
}

#[test]
fn a_host_without_cgroup_v2_has_no_hierarchy() {
    let root = tempfile::tempdir().expect("tempdir");
    assert!(CgroupV2::find(&HostFs::new(root.path())).is_none());
}

#[test]
fn the_ids_are_the_directory_inodes() {
    let (root, host, v2) = hierarchy(&[("/a/b", &[])]);
    assert_eq!(v2.id(&host, "/a/b").expect("id"), ino(root.path(), "/a/b"));
    assert!(v2.id(&host, "/gone").is_err());
}

#[test]
fn a_cgroup_is_current_while_its_directory_is_there_with_the_same_id() {
    let (root, host, v2) = hierarchy(&[("/kubepods/podA", &[])]);
    let id = ino(root.path(), "/kubepods/podA");
    assert!(v2.is_current(&host, "/kubepods/podA", id));
    assert!(
        !v2.is_current(&host, "/kubepods/podA", id + 1),
        "another cgroup of that path"
    );
    fs::remove_dir(root.path().join("sys/fs/cgroup/unified/kubepods/podA")).expect("rmdir");
    assert!(!v2.is_current(&host, "/kubepods/podA", id), "gone");
}

/// A reconcile walks while pods come and go: a file of a cgroup removed between its opening and
/// its read answers ENODEV, and that cgroup is skipped like one whose directory is gone, not
/// the walk abandoned (the soak logged "rescanning cgroups: … No such device (os error 19)").
#[test]
fn a_cgroup_removed_during_the_walk_is_skipped_whichever_error_says_so() {
    use std::io::{Error, ErrorKind};
    assert!(gone(&Error::from_raw_os_error(libc::ENODEV)));
    assert!(gone(&Error::from_raw_os_error(libc::ENOENT)));
    assert!(gone(&Error::from(ErrorKind::NotFound)));
    assert!(!gone(&Error::from_raw_os_error(libc::EACCES)));
    assert!(!gone(&Error::from_raw_os_error(libc::EIO)));
}
