//! Names for the errno values a BPF load or attach typically fails with.

/// `EPERM`, `EINVAL`, … or `errno <n>` for the rest.
pub fn errno_name(code: i32) -> String {
    let name = match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        // The kernel-internal ENOTSUPP that BPF loads return for unsupported features.
        524 => "ENOTSUPP",
        _ => return format!("errno {code}"),
    };
    name.to_owned()
}
