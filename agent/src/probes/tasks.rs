//! The task iterators (`iter/task_vma`, `iter/task_file`; the kernel side is `ebpf/src/tasks.rs`):
//! loaded with the other programs, each linked once, and read afresh at every walk of the
//! hugepages' holders: a new iterator file from the link (`BPF_ITER_CREATE`), read to its end.
//! They tell what every process maps of hugetlb and holds open on hugetlbfs, without the ptrace
//! access check `/proc/<pid>/maps` and `fd/` make: `CAP_BPF` and `CAP_PERFMON` are all they take.
//!
//! The links are made here with the `bpf(2)` call itself: aya's link gives one iterator file
//! and is gone, and a walk needs a new one each time, from any thread.

use std::{
    io::{self, Read},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
};

use aya::{Ebpf, programs::Iter};
use hugepage_agent_common::tasks::Held;

use super::{ProbeError, load_err, program};

/// The programs: name in the object, and the kernel's iterator target.
pub const TASK_PROGRAMS: [(&str, &str); 2] =
    [("holders_vma", "task_vma"), ("holders_files", "task_file")];

/// The most records one read keeps: a node with more hugetlb mappings and descriptors than this
/// is told in part, and says so ([`Read::truncated`]). 112 bytes each: 7 MiB at most.
pub const MAX_RECORDS: usize = 65_536;

/// `BPF_LINK_CREATE` and `BPF_ITER_CREATE` (`include/uapi/linux/bpf.h`).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `BPF_TRACE_ITER`, the attach type of an iterator's link.
const BPF_TRACE_ITER: u32 = 28;

#[derive(Debug, thiserror::Error)]
pub enum TasksError {
    #[error("linking the task iterator {program}: {source}")]
    Link {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the task iterator {program}: {source}")]
    Read {
        program: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The two iterators' links.
#[derive(Debug)]
pub struct TaskIterators {
    links: Vec<(&'static str, OwnedFd)>,
}

/// What one read of both iterators gave.
#[derive(Debug, Default)]
pub struct Records {
    pub held: Vec<Held>,
    /// More than [`MAX_RECORDS`] were there: the rest is not in `held`.
    pub truncated: bool,
}

impl TaskIterators {
    /// Loads both programs into the verifier with `btf` (aya's, for the targets' BTF ids) and
    /// links each. Nothing stays linked when this fails.
    pub fn load(ebpf: &mut Ebpf, btf: &aya::Btf) -> Result<TaskIterators, ProbeError> {
        let mut links = Vec::new();
        for (name, target) in TASK_PROGRAMS {
            let iter = program::<Iter>(ebpf, name)?;
            iter.load(target, btf).map_err(load_err(name))?;
            let fd = iter.fd().map_err(load_err(name))?;
            let link = link(fd.as_fd()).map_err(|source| {
                ProbeError::Tasks(TasksError::Link {
                    program: name,
                    source,
                })
            })?;
            links.push((name, link));
        }
        Ok(TaskIterators { links })
    }

    /// Runs both iterators once and reads what they write.
    pub fn read(&self) -> Result<Records, TasksError> {
        let mut records = Records::default();
        for (program, link) in &self.links {
            let file = iterate(link).map_err(|source| TasksError::Read { program, source })?;
            read_records(file, &mut records)
                .map_err(|source| TasksError::Read { program, source })?;
        }
        Ok(records)
    }
}

/// `BPF_LINK_CREATE` for an iterator program: every task, no target.
fn link(program: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct LinkCreate {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        iter_info: u64,
        iter_info_len: u32,
        pad: u32,
    }
    let attr = LinkCreate {
        prog_fd: u32::try_from(program.as_raw_fd()).map_err(|_| io::ErrorKind::InvalidInput)?,
        target_fd: 0,
        attach_type: BPF_TRACE_ITER,
        flags: 0,
        iter_info: 0,
        iter_info_len: 0,
        pad: 0,
    };
    bpf(BPF_LINK_CREATE, &attr)
}

/// `BPF_ITER_CREATE`: a new iterator file from `link`, read from its first task.
fn iterate(link: &OwnedFd) -> io::Result<std::fs::File> {
    #[repr(C)]
    struct IterCreate {
        link_fd: u32,
        flags: u32,
    }
    let attr = IterCreate {
        link_fd: u32::try_from(link.as_raw_fd()).map_err(|_| io::ErrorKind::InvalidInput)?,
        flags: 0,
    };
    bpf(BPF_ITER_CREATE, &attr).map(std::fs::File::from)
}

/// The `bpf(2)` call `cmd` with `attr`, for a command that gives a descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live `#[repr(C)]` value of the size passed; the kernel reads it only.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *const T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::ErrorKind::InvalidData)?;
    // SAFETY: the kernel gave this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads `file` to its end into `records`, whole records only, at most [`MAX_RECORDS`] in all.
fn read_records(mut file: impl Read, records: &mut Records) -> io::Result<()> {
    const SIZE: usize = std::mem::size_of::<Held>();
    let mut buf = vec![0u8; SIZE * 64];
    let mut filled = 0;
    loop {
        let n = match file.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        filled += n;
        let whole = filled - filled % SIZE;
        for chunk in buf[..whole].chunks_exact(SIZE) {
            if records.held.len() == MAX_RECORDS {
                records.truncated = true;
                return Ok(());
            }
            // SAFETY: `chunk` is `size_of::<Held>()` bytes, and every bit pattern is a `Held`
            // (integers and a byte array).
            records
                .held
                .push(unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<Held>()) });
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        if n == 0 {
            return if filled == 0 {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{filled} bytes after the last whole record"),
                ))
            };
        }
    }
}

#[cfg(test)]
mod tests;
