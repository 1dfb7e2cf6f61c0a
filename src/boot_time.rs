//! The time since the system started, the time it spent asleep included: the clock against
//! which the relay tells a step of the wall clock (NTP correcting it, a user setting it) from
//! time that really passed. `Instant` cannot: on Linux, Android, macOS and iOS it stops while
//! the device sleeps, so after a suspend the wall clock seems to have stepped forward by the
//! hours slept. Each system's clock that counts them:
//!
//! - Linux and Android: `CLOCK_BOOTTIME`.
//! - macOS and iOS: `CLOCK_MONOTONIC` (there, unlike Linux's, it counts sleep; `Instant`
//!   reads `CLOCK_UPTIME_RAW`, which does not).
//! - Windows: `Instant` (QueryPerformanceCounter counts standby and hibernation).
//! - Elsewhere (the BSDs among others): none known, and the relay follows only steps back.

use std::time::Duration;

/// Time since boot, sleep included; `None` where the system has no such clock.
pub(crate) fn since_boot() -> Option<Duration> {
    imp::since_boot()
}

#[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
mod imp {
    use rustix::time::{clock_gettime, ClockId};
    use std::time::Duration;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    const COUNTS_SLEEP: ClockId = ClockId::Boottime;
    #[cfg(target_vendor = "apple")]
    const COUNTS_SLEEP: ClockId = ClockId::Monotonic;

    pub(super) fn since_boot() -> Option<Duration> {
        let now = clock_gettime(COUNTS_SLEEP);
        Some(Duration::new(
            u64::try_from(now.tv_sec).ok()?,
            u32::try_from(now.tv_nsec).ok()?,
        ))
    }
}

#[cfg(windows)]
mod imp {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// The first reading: the process's own origin (only differences are used).
    static ORIGIN: OnceLock<Instant> = OnceLock::new();

    pub(super) fn since_boot() -> Option<Duration> {
        Some(ORIGIN.get_or_init(Instant::now).elapsed())
    }
}

#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_vendor = "apple",
    windows
)))]
mod imp {
    use std::time::Duration;

    pub(super) fn since_boot() -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn it_moves_with_instant_while_the_device_is_awake() {
        let (Some(first), started) = (since_boot(), Instant::now()) else {
            return; // no such clock on this system
        };
        std::thread::sleep(Duration::from_millis(50));
        let passed = since_boot().unwrap() - first;
        let measured = started.elapsed();
        assert!(passed >= Duration::from_millis(50), "{passed:?}");
        let gap = passed.abs_diff(measured);
        assert!(
            gap < Duration::from_millis(200),
            "{passed:?} against {measured:?}"
        );
    }
}
