//! A one-shot timer of microsecond resolution for the map's re-reads ([`super::refresh`]): a
//! `timerfd` on CLOCK_MONOTONIC, waited for through tokio's reactor. tokio's own timers count
//! whole milliseconds and round every deadline up to the next one, so a re-read repeated "after
//! 100 µs" would wait one to two milliseconds, which alone is over the fault-to-map target. One
//! timer serves one waiter at a time: each wait for a new deadline arms it anew (which clears an
//! expiry not read yet), so a wait that was dropped before its deadline leaves nothing behind;
//! a wait for the deadline it is armed for (the run loop waits again after every event it takes
//! in) makes no system call.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Mutex,
};

use tokio::{
    io::{Interest, unix::AsyncFd},
    time::Instant,
};

#[derive(Debug)]
pub struct Timer {
    fd: AsyncFd<OwnedFd>,
    /// The deadline it is armed for: a wait for the same one (the run loop waits again after
    /// every event it takes in) does not arm it again.
    armed: Mutex<Option<Instant>>,
}

impl Timer {
    /// A new, disarmed timer; an error when the kernel refuses a `timerfd` or the reactor its
    /// registration.
    pub fn new() -> io::Result<Timer> {
        // SAFETY: no pointer arguments; the result is checked before use.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just created and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the timer owns `fd`: it stays open, the same descriptor, for the AsyncFd's
        // life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        Ok(Timer {
            fd,
            armed: Mutex::new(None),
        })
    }

    /// Returns at `at` (at once when it has come).
    pub async fn sleep_until(&self, at: Instant) -> io::Result<()> {
        let Some(left) = at
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Ok(());
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
            },
        };
        {
            let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
            if *armed != Some(at) {
                let fd = self.fd.as_raw_fd();
                // SAFETY: a valid descriptor and itimerspec; the old value is not asked for.
                if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
                    return Err(io::Error::last_os_error());
                }
                *armed = Some(at);
            }
        }
        loop {
            let mut ready = self.fd.readable().await?;
            let read = ready.try_io(|fd| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads 8 bytes into a buffer of 8.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(result) => {
                    *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    return result;
                }
                // Readiness from an earlier expiry, read since: wait for this one.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_and_one_already_past_at_once() {
        let timer = Timer::new().expect("a timerfd");
        for micros in [50, 200, 700] {
            let start = Instant::now();
            let at = start + Duration::from_micros(micros);
            timer.sleep_until(at).await.expect("the wait");
            assert!(Instant::now() >= at, "woke before {micros} µs");
        }
        let past = Instant::now() - Duration::from_millis(1);
        timer.sleep_until(past).await.expect("no wait");
    }

    #[tokio::test]
    async fn a_wait_dropped_and_taken_up_again_for_the_same_deadline_ends_at_it() {
        let timer = Timer::new().expect("a timerfd");
        let at = Instant::now() + Duration::from_millis(3);
        let cut = tokio::time::timeout(Duration::from_micros(1), timer.sleep_until(at)).await;
        assert!(cut.is_err(), "cut before its deadline");
        timer.sleep_until(at).await.expect("the wait");
        assert!(Instant::now() >= at);
        let again = Instant::now() + Duration::from_millis(2);
        timer.sleep_until(again).await.expect("a new deadline");
        assert!(
            Instant::now() >= again,
            "armed again after the expiry was read"
        );
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_no_early_wake_up_for_the_next() {
        let timer = Timer::new().expect("a timerfd");
        // Armed for 2 ms, dropped by the time-out's first tick (tokio's: a millisecond), then
        // left to expire unread.
        let start = Instant::now();
        let dropped = timer.sleep_until(start + Duration::from_millis(2));
        let cut = tokio::time::timeout(Duration::from_micros(1), dropped).await;
        assert!(cut.is_err(), "the wait was cut before its deadline");
        tokio::time::sleep(Duration::from_millis(3)).await;
        let again = Instant::now();
        timer
            .sleep_until(again + Duration::from_millis(5))
            .await
            .expect("the wait");
        assert!(again.elapsed() >= Duration::from_millis(5));
    }
}
