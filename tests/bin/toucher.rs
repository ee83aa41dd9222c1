//! Test helper: joins a cgroup, faults huge and ordinary pages, reports, and holds them.
//!
//! `toucher [--cgroup DIR] [--cpu C] [--huge K] [--small N] [--hold]`: writes its pid to
//! `DIR/cgroup.procs`, pins itself to CPU C, maps K 2 MiB pages with `MAP_HUGETLB` and N 4 KiB
//! pages (transparent hugepages refused, so each is its own fault), writes one byte in each, prints
//! `touched <pid> <first huge address> <ns of CPU time spent touching the small pages> <CLOCK_MONOTONIC
//! ns just before the first huge page's touch, or 0>` and, with `--hold`, keeps the memory until
//! stdin closes.
//!
//! `--reserve R`: also map R 2 MiB hugetlb pages without touching them (reserved, still free).
//!
//! `--node N`: bind the huge pages to NUMA node N (`mbind`, `MPOL_BIND`) before touching them.
//! `--huge-size BYTES`: the huge pages' size (default 2 MiB; 1073741824 maps 1 GiB pages).
//!
//! `--spin`: before the huge pages, print `spinning` and keep faulting 4 KiB pages (the same
//! 16 MiB, discarded and touched again) until a line arrives on stdin, so that this process's
//! faults never stop on its CPU while the test changes something.

use std::io::{BufRead, Write};

fn main() {
    if let Err(err) = run() {
        eprintln!("toucher: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut cgroup, mut cpu, mut huge, mut small) = (None, None, 0usize, 0usize);
    let (mut hold, mut spin, mut reserve) = (false, false, 0usize);
    let (mut node, mut huge_size) = (None, 2usize << 20);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cgroup" => cgroup = args.next(),
            "--cpu" => cpu = Some(number(args.next())?),
            "--huge" => huge = number(args.next())?,
            "--small" => small = number(args.next())?,
            "--hold" => hold = true,
            "--spin" => spin = true,
            "--reserve" => reserve = number(args.next())?,
            "--node" => node = Some(number(args.next())?),
            "--huge-size" => huge_size = number(args.next())?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if let Some(dir) = cgroup {
        std::fs::write(
            format!("{dir}/cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("joining {dir}: {e}"))?;
    }
    if let Some(cpu) = cpu {
        pin(cpu)?;
    }
    if spin {
        spin_until_stdin()?;
    }
    let huge_flags =
        libc::MAP_HUGETLB | ((huge_size.trailing_zeros() as i32) << libc::MAP_HUGE_SHIFT);
    let (huge_addr, first_touch) = touch(huge, huge_size, huge_flags, node)?;
    map_only(reserve)?;
    let start = hugepage_agent_tests::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    touch(small, 4096, 0, None)?;
    let small_ns = hugepage_agent_tests::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start;
    println!(
        "touched {} {:#x} {small_ns} {first_touch}",
        std::process::id(),
        huge_addr
    );
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    if hold {
        let _ = std::io::stdin().lock().lines().count();
    }
    Ok(())
}

fn number(arg: Option<String>) -> Result<usize, String> {
    arg.ok_or("missing number")?
        .parse()
        .map_err(|e| format!("{e}"))
}

/// Maps `count` pages of `page` bytes (bound to `node` if given) and writes one byte in each;
/// returns the mapping address and the CLOCK_MONOTONIC time just before the first write.
fn touch(
    count: usize,
    page: usize,
    flags: i32,
    node: Option<usize>,
) -> Result<(usize, u64), String> {
    if count == 0 {
        return Ok((0, 0));
    }
    let len = count * page;
    // SAFETY: anonymous private mapping; no file, no fixed address.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(format!(
            "mmap of {count} pages of {page} bytes: {}",
            std::io::Error::last_os_error()
        ));
    }
    if flags & libc::MAP_HUGETLB == 0 {
        // SAFETY: the mapping just created; advice only.
        unsafe { libc::madvise(addr, len, libc::MADV_NOHUGEPAGE) };
    }
    if let Some(node) = node {
        hugepage_agent_tests::mbind::bind(addr as usize, len, node)?;
    }
    let base = addr.cast::<u8>();
    let first = hugepage_agent_tests::clock_ns(libc::CLOCK_MONOTONIC);
    for i in 0..count {
        // SAFETY: inside the mapping just created.
        unsafe { base.add(i * page).write_volatile(1) };
    }
    Ok((addr as usize, first))
}

/// Runs this process on `cpu` only.
fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays within it for cpu < 1024.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "pinning to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Faults 4 KiB pages without pause until stdin has a line.
fn spin_until_stdin() -> Result<(), String> {
    const PAGES: usize = 4096;
    let (addr, _) = touch(PAGES, 4096, 0, None)?;
    println!("spinning");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut stdin = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, no wait.
        if unsafe { libc::poll(&mut stdin, 1, 0) } > 0 {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            return Ok(());
        }
        // SAFETY: the region mapped above; discarding makes the next touches fault again.
        unsafe { libc::madvise(addr as *mut libc::c_void, PAGES * 4096, libc::MADV_DONTNEED) };
        for i in 0..PAGES {
            // SAFETY: inside the mapping.
            unsafe { (addr as *mut u8).add(i * 4096).write_volatile(1) };
        }
    }
}

/// Maps `count` 2 MiB hugetlb pages and leaves them untouched: the kernel reserves them at mmap.
fn map_only(count: usize) -> Result<(), String> {
    if count == 0 {
        return Ok(());
    }
    // SAFETY: anonymous private mapping; no file, no fixed address.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            count * (2 << 20),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(format!(
            "reserving {count} huge pages: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
