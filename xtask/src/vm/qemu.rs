//! One boot of the guest under QEMU's TCG (these machines' `/dev/kvm` cannot run a guest
//! kernel): q35, the machine of [`super::machine`], the kernel's bzImage and the initramfs,
//! two 9p shares (`bin`, read-only: the binaries; `work`, read-write: what goes in and what
//! comes out), the serial console on QEMU's stdout and `isa-debug-exit` to power off with a
//! status. The console is kept whole in a file; the checks' lines are printed as they come.
//! The run is killed when it outlasts its time limit.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::machine;

/// What the guest writes to port 0xf4 becomes QEMU's exit status `(value << 1) | 1`.
pub const EXIT_PORT: &str = "0xf4";

pub struct Boot<'a> {
    pub bzimage: &'a Path,
    pub initramfs: &'a Path,
    pub bin: &'a Path,
    pub work: &'a Path,
    pub console: &'a Path,
    pub limit: Duration,
}

/// How a boot ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest wrote this value to the exit port.
    Exited(u8),
    /// QEMU ended otherwise (a guest that panicked reboots, and `-no-reboot` ends QEMU with 0).
    Ended(Option<i32>),
    TimedOut,
}

pub fn run(boot: &Boot) -> Result<Outcome> {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max"])
        .args(machine::qemu_arguments())
        .arg("-kernel")
        .arg(boot.bzimage)
        .arg("-initrd")
        .arg(boot.initramfs)
        .args(["-append", &machine::kernel_parameters()])
        .args(["-nodefaults", "-no-reboot", "-display", "none"])
        .args(["-chardev", "stdio,id=console,signal=off"])
        .args(["-serial", "chardev:console"])
        .args([
            "-device",
            &format!("isa-debug-exit,iobase={EXIT_PORT},iosize=0x04"),
        ])
        .args(["-virtfs", &share("bin", boot.bin, true)])
        .args(["-virtfs", &share("work", boot.work, false)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = qemu.spawn().context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("qemu's stdout")?;
    let mut log = fs::File::create(boot.console)
        .with_context(|| format!("creating {}", boot.console.display()))?;
    let (done_tx, done_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\r');
            let _ = writeln!(log, "{line}");
            if let Some(check) = line.strip_prefix("vm-check: ") {
                println!("  {check}");
            }
        }
        let _ = done_tx.send(());
    });
    let deadline = Instant::now() + boot.limit;
    let outcome = loop {
        if let Some(status) = child.try_wait()? {
            break match status.code() {
                Some(code) if code % 2 == 1 => Outcome::Exited((code >> 1) as u8),
                code => Outcome::Ended(code),
            };
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break Outcome::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = done_rx.recv_timeout(Duration::from_secs(5));
    drop(reader);
    Ok(outcome)
}

fn share(tag: &str, path: &Path, readonly: bool) -> String {
    let path: PathBuf = path.into();
    format!(
        "local,path={},mount_tag={tag},security_model=none,id={tag}{}",
        path.display(),
        if readonly { ",readonly=on" } else { "" }
    )
}
