//! Children that end with xtask. A SIGINT, SIGTERM, SIGHUP or SIGQUIT that xtask receives while
//! it waits for a long child (the fuzzer, behind rustup, cargo and cargo-fuzz) is sent on to
//! every process of the child's group; xtask waits up to 5 s for them to go and exits with 128 +
//! the signal, as a shell reports it. Without this, `kill` of `cargo xtask fuzz` ended xtask
//! alone and left libFuzzer running, orphaned, still writing the log that the next run of the
//! same target opens.
//!
//! Which group: when xtask leads its own (a shell with job control started it), the child stays
//! in it, so that Ctrl-C and Ctrl-Z work on the whole job as a terminal's user expects, and a
//! signal is passed on to that group (everything in the job, a `| tee` too, as Ctrl-C would).
//! Otherwise (a script, `nohup`, a service) the child gets a group of its own, so that passing
//! the signal on reaches no one else. A signal that was ignored when xtask started (`nohup`'s
//! SIGHUP) stays ignored.

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
const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The process group a signal is passed on to; 0 when no child is being waited for.
static GROUP: AtomicI32 = AtomicI32::new(0);
/// The child being waited for; 0 when there is none.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// How long xtask waits for the group to go before it exits anyway, in steps of 100 ms.
const GRACE_STEPS: u32 = 50;

extern "C" fn pass_on(signal: libc::c_int) {
    let group = GROUP.load(Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    // SAFETY: kill, waitpid, getpid, nanosleep and _exit are async-signal-safe; nothing else is
    // called, and nothing is allocated.
    unsafe {
        if group > 0 {
            libc::kill(-group, signal);
            let step = libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            let own = group == libc::getpid();
            let mut reaped = false;
            for _ in 0..GRACE_STEPS {
                reaped = reaped || libc::waitpid(child, std::ptr::null_mut(), libc::WNOHANG) != 0;
                // xtask's own group holds xtask: there, the child's going is enough.
                if reaped && (own || libc::kill(-group, 0) != 0) {
                    break;
                }
                libc::nanosleep(&step, std::ptr::null_mut());
            }
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

/// Installs [`pass_on`] for each of [`SIGNALS`] not ignored, once; while it runs, the others
/// wait.
fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        for signal in SIGNALS {
            // SAFETY: sigaction reads a valid action (zeroed, a handler that only calls
            // async-signal-safe functions, an initialised mask) and writes the old one.
            let failed = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
                    true
                } else if old.sa_sigaction == libc::SIG_IGN {
                    false
                } else {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction =
                        pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
                    action.sa_mask = signal_set();
                    action.sa_flags = libc::SA_RESTART;
                    libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
                }
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

/// Waits for `pid` to exit without reaping it (its pid and group stay taken until it is).
fn exited(pid: libc::pid_t) -> io::Result<()> {
    let Ok(id) = libc::id_t::try_from(pid) else {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    };
    loop {
        // SAFETY: waitid writes the siginfo it is given; WNOWAIT leaves the child unreaped.
        let done = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if done == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Runs `command` and waits for it; a signal of [`SIGNALS`] that xtask receives meanwhile goes
/// to the child's group too (see the module's paragraph for which group). The signals are held
/// while the child starts, so that none arrives before the group is known; the child starts
/// with the mask xtask had (a child inherits its parent's mask; std does not reset it).
pub fn status(command: &mut Command) -> io::Result<ExitStatus> {
    install()?;
    // SAFETY: getpgrp cannot fail.
    let own_group = unsafe { libc::getpgrp() };
    let leader = libc::pid_t::try_from(std::process::id()).ok() == Some(own_group);
    if !leader {
        command.process_group(0);
    }
    let old = mask(libc::SIG_BLOCK)?;
    // SAFETY: pthread_sigmask is async-signal-safe, as code between fork and exec must be.
    unsafe {
        command.pre_exec(move || restore(&old));
    }
    let spawned = command.spawn();
    let pid = spawned
        .as_ref()
        .map_or(0, |child| libc::pid_t::try_from(child.id()).unwrap_or(0));
    if pid > 0 {
        CHILD.store(pid, Ordering::SeqCst);
        GROUP.store(if leader { own_group } else { pid }, Ordering::SeqCst);
    }
    restore(&old)?;
    let mut child = spawned?;
    let waited = exited(pid);
    GROUP.store(0, Ordering::SeqCst);
    CHILD.store(0, Ordering::SeqCst);
    waited?;
    child.wait()
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::process::CommandExt,
        path::PathBuf,
        process::{Child, Command, Stdio},
        thread,
        time::{Duration, Instant},
    };

    const HELPER: &str = "XTASK_GROUP_TEST_PID_FILE";
    const NAME: &str = "group::tests::a_signal_to_xtask_ends_the_childs_child_too";

    /// Whether `pid` is a process that has not exited (a zombie has).
    fn alive(pid: &str) -> bool {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    }

    /// What `ready` gives once it gives something, asked every 20 ms; fails the test naming
    /// `what` when `seconds` pass first.
    fn within<T>(seconds: u64, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(value) = ready() {
                return value;
            }
            assert!(
                start.elapsed() < Duration::from_secs(seconds),
                "not within {seconds} s: {what}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills what a failed case would leave: the helper and its shells' `sleep`.
    struct Leftovers {
        helper: Child,
        sleep: String,
        dir: PathBuf,
    }

    impl Drop for Leftovers {
        fn drop(&mut self) {
            let _ = self.helper.kill();
            let _ = self.helper.wait();
            if !self.sleep.is_empty() && alive(&self.sleep) {
                let _ = Command::new("kill").args(["-9", &self.sleep]).status();
            }
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// One case: the helper (this test binary run again, the leader of its own group or not)
    /// runs, through [`super::status`], a shell that runs a shell in the foreground that writes
    /// its pid and becomes `sleep 300`: a grandchild, as libFuzzer is cargo-fuzz's. `signal`
    /// to the helper alone must end the sleep too, and the helper with 128 + `signal`. With
    /// `ignored`, that signal, ignored when the helper started (`nohup`), first changes nothing.
    fn case(leader: bool, signal: libc::c_int, ignored: Option<libc::c_int>) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-group-test-{}-{leader}-{signal}-{ignored:?}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).expect("a scratch directory");
        let file = dir.join("sleep.pid");
        let mut helper = Command::new(std::env::current_exe().expect("the test binary"));
        helper
            .args(["--exact", NAME, "--test-threads=1"])
            .env(HELPER, &file)
            .stdout(Stdio::null());
        if leader {
            helper.process_group(0);
        }
        // The helper starts with the signals held: its test thread takes them (below), not
        // libtest's main thread, which could take one before the helper's child is known. And
        // with their default actions, as an xtask started from a terminal has them: a test run
        // started in the background by a script ignores SIGINT, which the helper would keep.
        // `ignored` is ignored, as `nohup` ignores SIGHUP.
        // SAFETY: signal(2) and pthread_sigmask are async-signal-safe.
        unsafe {
            helper.pre_exec(move || {
                for signal in super::SIGNALS {
                    libc::signal(signal, libc::SIG_DFL);
                }
                if let Some(signal) = ignored {
                    libc::signal(signal, libc::SIG_IGN);
                }
                super::mask(libc::SIG_BLOCK).map(|_| ())
            });
        }
        let mut left = Leftovers {
            helper: helper.spawn().expect("the helper starts"),
            sleep: String::new(),
            dir,
        };
        left.sleep = within(20, "the helper's sleep started", || {
            let pid = fs::read_to_string(&file).unwrap_or_default();
            Some(pid.trim().to_owned()).filter(|pid| !pid.is_empty())
        });
        assert!(
            alive(&left.sleep),
            "the sleep {} runs before the signal",
            left.sleep
        );
        let helper_pid = libc::pid_t::try_from(left.helper.id()).expect("a pid");
        if let Some(ignored) = ignored {
            // SAFETY: kill(2) of a child this test started and has not yet waited for.
            assert_eq!(unsafe { libc::kill(helper_pid, ignored) }, 0);
            thread::sleep(Duration::from_millis(500));
            let ended = left.helper.try_wait().expect("the helper's state");
            assert!(
                ended.is_none(),
                "signal {ignored} ignored at start ended it: {ended:?}"
            );
            assert!(
                alive(&left.sleep),
                "signal {ignored} ignored at start ended the sleep"
            );
        }
        // SAFETY: kill(2) of a child this test started and has not yet waited for.
        assert_eq!(unsafe { libc::kill(helper_pid, signal) }, 0);
        let status = within(
            20,
            &format!("leader {leader}: the helper ended by signal {signal}"),
            || left.helper.try_wait().expect("the helper's state"),
        );
        assert_eq!(
            status.code(),
            Some(128 + signal),
            "leader {leader}: {status:?}"
        );
        within(
            10,
            &format!(
                "leader {leader}, signal {signal}: the grandchild sleep {} ended",
                left.sleep
            ),
            || (!alive(&left.sleep)).then_some(()),
        );
    }

    /// The `SigBlk:` line of a status file.
    fn blocked(status: &str) -> String {
        status
            .lines()
            .find(|l| l.starts_with("SigBlk:"))
            .unwrap_or("no SigBlk line")
            .to_owned()
    }

    /// A child starts with the mask of the thread that started it, not with the signals held
    /// while it starts (std leaves a child the mask it inherits; rustup, cargo and libFuzzer
    /// then keep it).
    #[test]
    fn a_child_starts_with_the_mask_xtask_had() {
        let dir = std::env::temp_dir().join(format!("xtask-group-mask-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a scratch directory");
        let out = dir.join("status");
        let file = fs::File::create(&out).expect("the child's output file");
        let ours = blocked(&fs::read_to_string("/proc/thread-self/status").expect("our status"));
        let status = super::status(
            Command::new("grep")
                .args(["SigBlk", "/proc/self/status"])
                .stdout(file),
        )
        .expect("grep runs");
        let theirs = blocked(&fs::read_to_string(&out).expect("the child's output"));
        fs::remove_dir_all(&dir).expect("the scratch directory removed");
        assert!(status.success(), "{status:?}");
        assert_eq!(theirs, ours);
    }

    #[test]
    fn a_signal_to_xtask_ends_the_childs_child_too() {
        if let Some(file) = std::env::var_os(HELPER) {
            super::mask(libc::SIG_UNBLOCK).expect("the signals taken by this thread");
            let inner = r#"echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300"#;
            let outer = format!("sh -c '{inner}' \"$0\"; exit 0");
            let status = super::status(Command::new("sh").args(["-c", &outer]).arg(&file));
            panic!("the helper's shell ended before the signal: {status:?}");
        }
        for leader in [false, true] {
            for signal in [libc::SIGTERM, libc::SIGINT] {
                case(leader, signal, None);
            }
        }
        case(false, libc::SIGTERM, Some(libc::SIGHUP));
    }
}
