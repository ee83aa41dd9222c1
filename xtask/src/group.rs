//! Children that end with xtask. A long child (the fuzzer, behind rustup, cargo and cargo-fuzz)
//! runs in a process group of its own, and a SIGINT, SIGTERM or SIGHUP that xtask receives while
//! it runs is sent on to that whole group before xtask exits with 128 + the signal, as a shell
//! reports it. Without this, `kill` of `cargo xtask fuzz` ended xtask alone and left libFuzzer
//! running, orphaned, still writing the log that the next run of the same target opens. Ctrl-C
//! in a terminal reaches xtask (its foreground group) and so the child's group too.

use std::{
    io,
    os::unix::process::CommandExt,
    process::{Command, ExitStatus},
    sync::{
        OnceLock,
        atomic::{AtomicI32, Ordering},
    },
};

/// The signals passed on.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The process group of the child being waited for; 0 when there is none.
static GROUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_on(signal: libc::c_int) {
    let group = GROUP.load(Ordering::SeqCst);
    // SAFETY: kill(2) and _exit(2) are async-signal-safe; nothing else is called.
    unsafe {
        if group > 0 {
            libc::kill(-group, signal);
        }
        libc::_exit(128 + signal);
    }
}

/// The set of [`SIGNALS`].
fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset only adds valid signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Installs [`pass_on`] for [`SIGNALS`], once.
fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        for signal in SIGNALS {
            // SAFETY: a zeroed sigaction with a handler, an empty mask and no flags is valid;
            // the handler only calls async-signal-safe functions.
            let failed = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
            };
            if failed {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    installed.map_err(io::Error::from_raw_os_error)
}

/// Sets this thread's signal mask as `how` says with [`SIGNALS`], returning the mask before.
fn mask(how: libc::c_int) -> io::Result<libc::sigset_t> {
    let set = signal_set();
    // SAFETY: both sets are initialised (the old one by pthread_sigmask).
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        let error = libc::pthread_sigmask(how, &set, &mut old);
        if error != 0 {
            return Err(io::Error::from_raw_os_error(error));
        }
        Ok(old)
    }
}

/// Puts back the signal mask `old`.
fn restore(old: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `old` is a mask pthread_sigmask returned.
    let error = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
    if error != 0 {
        return Err(io::Error::from_raw_os_error(error));
    }
    Ok(())
}

/// Runs `command` in a process group of its own and waits for it; a signal of [`SIGNALS`] that
/// xtask receives meanwhile goes to that group too. The signals are held while the child starts,
/// so that none arrives between its start and the group's being known; the child starts with
/// the mask xtask had (a child inherits its parent's mask, and std does not reset it).
pub fn status(command: &mut Command) -> io::Result<ExitStatus> {
    install()?;
    let old = mask(libc::SIG_BLOCK)?;
    command.process_group(0);
    // SAFETY: pthread_sigmask is async-signal-safe, as code between fork and exec must be.
    unsafe {
        command.pre_exec(move || restore(&old));
    }
    let spawned = command.spawn();
    if let Ok(child) = &spawned {
        let group = libc::pid_t::try_from(child.id()).unwrap_or(0);
        GROUP.store(group, Ordering::SeqCst);
    }
    restore(&old)?;
    let status = spawned.and_then(|mut child| child.wait());
    GROUP.store(0, Ordering::SeqCst);
    status
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        process::Command,
        thread,
        time::{Duration, Instant},
    };

    const HELPER: &str = "XTASK_GROUP_TEST_PID_FILE";
    const NAME: &str = "group::tests::a_signal_to_xtask_ends_the_childs_grandchildren_too";

    /// Whether `pid` is a process that has not exited (a zombie has).
    fn alive(pid: &str) -> bool {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    }

    fn wait_for(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < deadline, "{what} within {deadline:?}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The test binary runs itself as the helper: a shell started through [`super::status`]
    /// that starts a `sleep` in the background (a grandchild, as libFuzzer is cargo-fuzz's),
    /// writes its pid and waits. SIGTERM to the helper must end the sleep too.
    #[test]
    fn a_signal_to_xtask_ends_the_childs_grandchildren_too() {
        if let Some(file) = std::env::var_os(HELPER) {
            // The helper takes the signal whatever mask the test runner inherited.
            super::mask(libc::SIG_UNBLOCK).expect("the signals unblocked");
            let script = r#"sleep 300 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; wait"#;
            let status = super::status(Command::new("sh").args(["-c", script]).arg(&file));
            panic!("the helper's shell ended before the signal: {status:?}");
        }
        let dir = std::env::temp_dir().join(format!("xtask-group-test-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a scratch directory");
        let file = dir.join("sleep.pid");
        let mut helper = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", NAME, "--test-threads=1"])
            .env(HELPER, &file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the helper starts");
        let mut pid = String::new();
        wait_for(
            "the helper's sleep started",
            Duration::from_secs(20),
            || {
                pid = fs::read_to_string(&file)
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                !pid.is_empty()
            },
        );
        assert!(alive(&pid), "the sleep {pid} runs before the signal");
        let helper_pid = libc::pid_t::try_from(helper.id()).expect("a pid");
        // SAFETY: kill(2) of a child this test started and has not yet waited for.
        assert_eq!(unsafe { libc::kill(helper_pid, libc::SIGTERM) }, 0);
        let status = helper.wait().expect("the helper ends");
        fs::remove_dir_all(&dir).expect("the scratch directory removed");
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
        let start = Instant::now();
        while alive(&pid) && start.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        if alive(&pid) {
            Command::new("kill").arg(&pid).status().expect("kill runs");
            panic!("the helper's grandchild sleep {pid} outlived the signal by 10 s");
        }
    }
}
