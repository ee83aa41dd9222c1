//! What differs between the kernels the VM test boots, found rather than assumed:
//!
//! * the layout the agent reads from this kernel's BTF (the offsets it hands its programs:
//!   `vm_area_struct.vm_flags`, the cgroup tracepoints' records, the page-size chain), each
//!   tracepoint field checked against the tracepoint's own `format` in tracefs;
//! * the attach path each of the running agent's programs took, as the kernel reports its BPF
//!   links (`/proc/<agent>/fdinfo`: `raw_tracepoint` with its name, `perf` for a classic
//!   tracepoint, `tracing` with its attach type for fentry and fexit): the fault program's fexit
//!   twin wherever this kernel runs fexit programs, else its fentry twin on PREEMPT_RT and the
//!   raw tracepoint elsewhere;
//! * whether fentry and fexit programs load and attach here: a minimal program (`r0 = 0; exit`)
//!   on `hugetlb_fault`, loaded with the bpf syscall, its target's BTF id from the kernel's BTF,
//!   attached, then closed.

use std::{fs, os::fd::FromRawFd};

use hugepage_agent::probes::{btf::Btf, offsets};
use hugepage_agent_tests::Agent;

use crate::CheckResult;

/// The kernel function the fentry and fexit trials attach to.
const FENTRY_TARGET: &str = "hugetlb_fault";

/// A tracepoint's fields the programs read: (field in its format, offset the agent resolved).
type Fields<'a> = [(&'a str, u64)];

pub fn probes(agent: &Agent) -> CheckResult {
    let data = fs::read("/sys/kernel/btf/vmlinux").map_err(|e| format!("BTF: {e}"))?;
    let btf = Btf::parse_with_functions(&data).map_err(|e| format!("BTF: {e}"))?;
    let resolved = offsets::resolve(&btf, 4096).map_err(|e| format!("offsets: {e}"))?;
    let o = resolved.offsets;
    let mkdir: &Fields = &[
        ("root", o.cgroup_root),
        ("id", o.cgroup_id),
        ("level", o.cgroup_level),
        ("path", o.cgroup_path),
    ];
    let migrate: &Fields = &[
        ("dst_root", o.migrate_dst_root),
        ("dst_id", o.migrate_dst_id),
        ("dst_level", o.migrate_dst_level),
        ("pid", o.migrate_pid),
        ("dst_path", o.migrate_dst_path),
    ];
    for (event, fields) in [
        ("cgroup/cgroup_mkdir", mkdir),
        ("cgroup/cgroup_rmdir", mkdir),
        ("cgroup/cgroup_release", mkdir),
        ("cgroup/cgroup_attach_task", migrate),
    ] {
        let format = tracefs_format(event)?;
        for (field, offset) in fields.iter() {
            let found = format
                .iter()
                .find(|(name, _)| name == field)
                .map(|(_, at)| *at)
                .ok_or_else(|| format!("{event}: no field {field} in its format"))?;
            if found != *offset {
                return Err(format!(
                    "{event}.{field}: offset {found} in tracefs, {offset} from BTF"
                ));
            }
        }
    }
    let page_size = match &resolved.page_size_unavailable {
        None => format!(
            "page size from vm_file({})->f_inode({})->i_sb({})->s_fs_info({})->hstate({})->order({})",
            o.vma_vm_file,
            o.file_f_inode,
            o.inode_i_sb,
            o.super_block_s_fs_info,
            o.hugetlbfs_sb_info_hstate,
            o.hstate_order
        ),
        Some(why) => format!("no page size: {why}"),
    };
    let links = links(agent.pid())?;
    let fentry = trial(&btf, Attach::Fentry);
    let fexit = trial(&btf, Attach::Fexit);
    // Where this kernel runs fexit programs, the fault program is the fexit on hugetlb_fault,
    // which sees each fault done; else the fentry on PREEMPT_RT (bpf_find_vma always gives up in
    // the page-fault tracepoint there), the raw tracepoint elsewhere.
    let realtime = fs::read_to_string("/sys/kernel/realtime").is_ok_and(|r| r.trim() == "1");
    let fault_link = match (&fexit, realtime) {
        (Ok(_), _) => "tracing fexit",
        (Err(_), true) => "tracing fentry",
        (Err(_), false) => "raw_tracepoint page_fault_user",
    };
    if !links.iter().any(|l| l == fault_link) {
        return Err(format!(
            "the fault program is not the {fault_link} link expected here: {links:?}"
        ));
    }
    Ok(format!(
        "BTF offsets: vm_flags {} (VM_HUGETLB {:#x}), cgroup record root {} id {} level {} path {}, migrate dst_root {} dst_id {} dst_level {} pid {} dst_path {}, {page_size}; the tracefs formats agree; the agent's links: {}; fentry on {FENTRY_TARGET}: {}; fexit: {}",
        o.vma_vm_flags,
        o.vm_hugetlb,
        o.cgroup_root,
        o.cgroup_id,
        o.cgroup_level,
        o.cgroup_path,
        o.migrate_dst_root,
        o.migrate_dst_id,
        o.migrate_dst_level,
        o.migrate_pid,
        o.migrate_dst_path,
        links.join(", "),
        fentry.unwrap_or_else(|e| format!("refused ({e})")),
        fexit.unwrap_or_else(|e| format!("refused ({e})")),
    ))
}

/// The fields of a tracepoint's `format` file and their offsets in its record
/// (`field:int level;\toffset:12;\tsize:4;\tsigned:1;`; a `__data_loc` field by its name).
fn tracefs_format(event: &str) -> Result<Vec<(String, u64)>, String> {
    let path = format!("/sys/kernel/tracing/events/{event}/format");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("field:")?;
            let (declaration, rest) = rest.split_once(';')?;
            let name = declaration
                .split_whitespace()
                .last()?
                .split('[')
                .next()?
                .to_owned();
            let offset = rest.trim().strip_prefix("offset:")?.split(';').next()?;
            Some((name, offset.parse().ok()?))
        })
        .collect())
}

/// The BPF links `pid` holds, as `<link_type> <tp_name>` (the name where the kernel shows one),
/// equal ones counted (`4× perf`).
fn links(pid: u32) -> Result<Vec<String>, String> {
    let dir = format!("/proc/{pid}/fd");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))? {
        let Ok(entry) = entry else { continue };
        let is_link =
            fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf_link");
        if !is_link {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let value = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        let kind = value("link_type").unwrap_or_else(|| "?".to_owned());
        // A tracing link's attach type (BPF_TRACE_FENTRY 24, BPF_TRACE_FEXIT 25).
        let traced = match value("attach_type").as_deref() {
            Some("24") => Some("fentry".to_owned()),
            Some("25") => Some("fexit".to_owned()),
            _ => None,
        };
        out.push(match value("tp_name").or(traced) {
            Some(name) => format!("{kind} {name}"),
            None => kind,
        });
    }
    out.sort();
    let mut counted: Vec<String> = Vec::new();
    for link in out.iter() {
        let n = out.iter().filter(|l| *l == link).count();
        let shown = if n > 1 {
            format!("{n}× {link}")
        } else {
            link.clone()
        };
        if !counted.contains(&shown) {
            counted.push(shown);
        }
    }
    Ok(counted)
}

#[derive(Clone, Copy)]
enum Attach {
    Fentry,
    Fexit,
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `attach_prog_fd` (include/uapi/linux/bpf.h).
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    pad: [u8; 12],
}

/// `union bpf_attr` for `BPF_RAW_TRACEPOINT_OPEN`.
#[repr(C)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    pad: [u8; 116],
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;
const BPF_TRACE_FEXIT: u32 = 25;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> Result<std::os::fd::OwnedFd, std::io::Error> {
    // SAFETY: `attr` is a `union bpf_attr` prefix of the size passed, zero-padded, valid for
    // the call; the kernel returns a new file descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("fd out of range"))?;
    // SAFETY: the kernel just returned this descriptor, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Loads and attaches a minimal fentry or fexit program on [`FENTRY_TARGET`]; what happened.
fn trial(btf: &Btf, attach: Attach) -> Result<String, String> {
    let id = btf.function(FENTRY_TARGET).map_err(|e| e.to_string())?;
    // r0 = 0; exit
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    let license = b"GPL\0";
    let mut log = vec![0u8; 64 << 10];
    let mut load = ProgLoad {
        prog_type: BPF_PROG_TYPE_TRACING,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: *b"vm_check_trial\0\0",
        prog_ifindex: 0,
        expected_attach_type: match attach {
            Attach::Fentry => BPF_TRACE_FENTRY,
            Attach::Fexit => BPF_TRACE_FEXIT,
        },
        prog_btf_fd: 0,
        func_info_rec_size: 0,
        func_info: 0,
        func_info_cnt: 0,
        line_info_rec_size: 0,
        line_info: 0,
        line_info_cnt: 0,
        attach_btf_id: id,
        attach_prog_fd: 0,
        pad: [0; 12],
    };
    let prog = bpf(BPF_PROG_LOAD, &mut load).map_err(|e| {
        let text = String::from_utf8_lossy(&log);
        let last = text
            .trim_end_matches('\0')
            .lines()
            .last()
            .unwrap_or_default();
        format!("load: {e}; verifier: {last}")
    })?;
    let mut open = RawTracepointOpen {
        name: 0,
        prog_fd: std::os::fd::AsRawFd::as_raw_fd(&prog) as u32,
        pad: [0; 116],
    };
    let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open).map_err(|e| format!("attach: {e}"))?;
    drop(link);
    drop(prog);
    Ok(format!("loads and attaches (BTF id {id})"))
}
