//! Which capability an `EPERM` from loading or attaching the probes points at, so that the
//! warning names it: the kernel says only "operation not permitted".
//!
//! Creating maps takes `CAP_BPF`; loading tracing programs takes `CAP_BPF` and `CAP_PERFMON`, and
//! attaching the classic tracepoints (`perf_event_open`) `CAP_PERFMON`; `CAP_SYS_ADMIN` stands in
//! for both, as it did before Linux 5.8. When the process has what it needs, the refusal came
//! from elsewhere (a seccomp profile, a security module, lockdown), and the hint says that.

/// `CAP_SYS_ADMIN`, `CAP_PERFMON`, `CAP_BPF` (`linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process as a bit mask, or `None` when `capget` fails.
pub fn effective() -> Option<u64> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: 64-bit sets, as two 32-bit halves.
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes at most two `Data` for version 3, which `data` holds.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    (rc == 0).then(|| u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// What an `EPERM` means for a process whose effective set is `effective`.
pub fn eperm_hint(effective: u64) -> String {
    let has = |cap: u32| effective & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) {
        return "CAP_SYS_ADMIN is in effect, so the kernel's capability checks passed: a seccomp profile, a security module or lockdown refused it".to_owned();
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| !has(cap))
        .map(|(_, name)| name)
        .collect();
    if missing.is_empty() {
        "CAP_BPF and CAP_PERFMON are in effect, so something else refused it: a seccomp profile without bpf or perf_event_open (older container runtimes' defaults), a security module or lockdown".to_owned()
    } else {
        format!(
            "the agent lacks {} (the probes take CAP_BPF and CAP_PERFMON)",
            missing.join(" and ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_capability_is_named() {
        let bpf = 1 << CAP_BPF;
        let perfmon = 1 << CAP_PERFMON;
        assert_eq!(
            eperm_hint(bpf),
            "the agent lacks CAP_PERFMON (the probes take CAP_BPF and CAP_PERFMON)"
        );
        assert_eq!(
            eperm_hint(perfmon),
            "the agent lacks CAP_BPF (the probes take CAP_BPF and CAP_PERFMON)"
        );
        assert!(eperm_hint(0).starts_with("the agent lacks CAP_BPF and CAP_PERFMON"));
        assert!(eperm_hint(bpf | perfmon).contains("a seccomp profile"));
        assert!(eperm_hint(1 << CAP_SYS_ADMIN).contains("CAP_SYS_ADMIN is in effect"));
    }

    #[test]
    fn this_process_has_an_effective_set() {
        let own = effective().expect("capget works on this kernel");
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let listed = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .expect("CapEff in /proc/self/status");
        assert_eq!(own, listed);
    }
}
