use super::*;

fn bytes_of<T>(value: &T) -> Vec<u8> {
    // SAFETY: reading the bytes of a plain `#[repr(C)]` value without padding.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn fault() -> HugetlbFault {
    let mut comm = [0u8; 16];
    comm[..7].copy_from_slice(b"toucher");
    HugetlbFault {
        timestamp_ns: 1_500_000_000,
        cgroup_id: 4242,
        address: 0x7f00_0020_1234,
        page_size: 2 << 20,
        error_code: 6,
        tgid: 100,
        pid: 101,
        cpu: 1,
        numa_node: 0,
        comm,
        phase: phase::STARTED,
        vm_fault: 0,
        file_ino: 0,
        file_dev: 0,
        file_flags: 0,
        ipc_ns: 0,
        _pad: 0,
    }
}

fn cgroup_event(kind: u32, path: &str) -> CgroupEvent {
    let mut buf = [0u8; PATH_LEN];
    buf[..path.len()].copy_from_slice(path.as_bytes());
    CgroupEvent {
        timestamp_ns: 7,
        cgroup_id: 99,
        kind,
        hierarchy: 0,
        level: 2,
        pid: 0,
        path_len: path.len() as u32,
        flags: 0,
        path: buf,
    }
}

#[test]
fn fault_record_decodes_every_field() {
    let event = decode_fault(&bytes_of(&fault())).expect("decode");
    assert_eq!(event.at, Duration::from_millis(1500));
    assert_eq!((event.cgroup_id, event.tgid, event.pid), (4242, 100, 101));
    assert_eq!(event.comm, "toucher");
    assert_eq!(event.page_size, Some(2 << 20));
    assert!(event.write);
    assert_eq!(event.page_address(), 0x7f00_0020_0000);
    assert_eq!(event.done, None, "seen as it started");
    assert!(!event.settled());
}

#[test]
fn a_fault_seen_done_carries_the_kernels_answer_and_an_unknown_phase_is_an_error() {
    let mut raw = fault();
    raw.phase = phase::DONE;
    raw.vm_fault = 0;
    assert!(decode_fault(&bytes_of(&raw)).expect("decode").settled());
    raw.vm_fault = 0x2;
    let failed = decode_fault(&bytes_of(&raw)).expect("decode");
    assert_eq!(failed.done, Some(2));
    assert!(
        failed.settled(),
        "VM_FAULT_SIGBUS: it failed, nothing to wait for"
    );
    raw.vm_fault = 0x400;
    assert!(
        !decode_fault(&bytes_of(&raw)).expect("decode").settled(),
        "VM_FAULT_RETRY: taken again, its page maybe not yet"
    );
    raw.phase = 7;
    assert_eq!(decode_fault(&bytes_of(&raw)), Err(DecodeError::Phase(7)));
}

#[test]
fn fault_with_unknown_page_size_has_none() {
    let mut raw = fault();
    raw.page_size = 0;
    assert_eq!(
        decode_fault(&bytes_of(&raw)).expect("decode").page_size,
        None
    );
}

#[test]
fn short_or_long_records_are_errors() {
    let bytes = bytes_of(&fault());
    let expected = bytes.len();
    assert_eq!(
        decode_fault(&bytes[..expected - 1]),
        Err(DecodeError::Size {
            record: "hugetlb fault",
            found: expected - 1,
            expected
        })
    );
    let mut long = bytes.clone();
    long.push(0);
    assert!(decode_fault(&long).is_err());
    assert!(decode_cgroup(&bytes).is_err());
}

#[test]
fn cgroup_records_decode_kind_and_path() {
    let event =
        decode_cgroup(&bytes_of(&cgroup_event(kind::MKDIR, "/kubepods/pod1"))).expect("decode");
    assert_eq!(event.change, CgroupChange::Mkdir);
    assert_eq!(event.path, "/kubepods/pod1");
    assert!(event.is_v2() && !event.truncated);
    let mut attach = cgroup_event(kind::ATTACH_TASK, "/x");
    attach.pid = 77;
    attach.hierarchy = 4;
    let event = decode_cgroup(&bytes_of(&attach)).expect("decode");
    assert_eq!(event.change, CgroupChange::AttachTask { pid: 77 });
    assert!(!event.is_v2());
}

#[test]
fn bad_kind_and_path_length_are_rejected() {
    assert_eq!(
        decode_cgroup(&bytes_of(&cgroup_event(9, "/"))),
        Err(DecodeError::Kind(9))
    );
    let mut raw = cgroup_event(kind::RMDIR, "/");
    raw.path_len = PATH_LEN as u32 + 1;
    assert_eq!(
        decode_cgroup(&bytes_of(&raw)),
        Err(DecodeError::PathLen(PATH_LEN as u32 + 1))
    );
}

#[test]
fn truncation_flag_is_carried() {
    let mut raw = cgroup_event(kind::RELEASE, "/long");
    raw.flags = FLAG_TRUNCATED;
    assert!(decode_cgroup(&bytes_of(&raw)).expect("decode").truncated);
}

#[test]
fn a_fault_s_file_is_decoded_only_when_the_program_read_it() {
    let event = decode_fault(&bytes_of(&fault())).expect("decode");
    assert_eq!(event.file, None, "no KNOWN bit: no file");
    let mut raw = fault();
    raw.file_ino = 7;
    raw.file_dev = 17;
    raw.file_flags = file::KNOWN | file::SHARED | file::SYSV;
    raw.ipc_ns = 4026531839;
    let event = decode_fault(&bytes_of(&raw)).expect("decode");
    assert_eq!(
        event.file,
        Some(FaultFile {
            dev: 17,
            ino: 7,
            shared: true,
            sysv: true,
            ipc_ns: 4026531839,
        })
    );
}

fn file_event(kind: u32) -> HugetlbfsEvent {
    let mut comm = [0u8; 16];
    comm[..9].copy_from_slice(b"fallocate");
    HugetlbfsEvent {
        timestamp_ns: 2_000_000_000,
        cgroup_id: 77,
        ino: 12345,
        offset: 2 << 20,
        len: 4 << 20,
        dev: 52,
        kind,
        tgid: 300,
        pid: 301,
        mode: 1,
        ret: 0,
        comm,
    }
}

#[test]
fn hugetlbfs_records_decode_each_kind_and_refuse_an_unknown_one() {
    let made = decode_hugetlbfs(&bytes_of(&file_event(file_kind::ALLOC_INODE))).expect("decode");
    assert_eq!(made.change, FileChange::Made { mode: 1 });
    assert_eq!(
        (made.dev, made.ino, made.tgid, made.pid),
        (52, 12345, 300, 301)
    );
    assert_eq!((made.comm.as_str(), made.cgroup_id), ("fallocate", 77));
    assert_eq!(made.at, Duration::from_secs(2));
    let fallocated =
        decode_hugetlbfs(&bytes_of(&file_event(file_kind::FALLOCATE))).expect("decode");
    assert_eq!(
        fallocated.change,
        FileChange::Fallocated {
            offset: 2 << 20,
            len: 4 << 20,
            mode: 1,
            ret: 0
        }
    );
    let evicted = decode_hugetlbfs(&bytes_of(&file_event(file_kind::EVICT_INODE))).expect("decode");
    assert_eq!(evicted.change, FileChange::Evicted);
    assert_eq!(
        decode_hugetlbfs(&bytes_of(&file_event(9))),
        Err(DecodeError::FileKind(9))
    );
    assert!(matches!(
        decode_hugetlbfs(&[0u8; 3]),
        Err(DecodeError::Size { .. })
    ));
}
