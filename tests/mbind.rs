//! `mbind(2)` for the test binaries that place hugepages on a NUMA node (`toucher --node`, the
//! VM's strict check): a mapping bound with `MPOL_BIND` takes its pages from that node alone.

/// Binds the mapping of `len` bytes at address `addr` to NUMA node `node` (`MPOL_BIND`); an
/// address that is not a mapping is the kernel's error (`EFAULT`), never a memory access here.
pub fn bind(addr: usize, len: usize, node: usize) -> Result<(), String> {
    const MPOL_BIND: libc::c_long = 2;
    if node >= 64 {
        return Err(format!("node {node}: only nodes 0 to 63 can be bound"));
    }
    let mask: u64 = 1 << node;
    // SAFETY: the kernel checks the range; the mask is one word of 64 bits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            &mask as *const u64,
            64 as libc::c_ulong,
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(format!(
            "mbind to node {node}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
