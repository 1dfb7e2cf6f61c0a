//! Delivering what is pending within a deadline: for the few seconds of background time a
//! phone gives an app (Android's WorkManager, iOS's BGTaskScheduler), a desktop app about
//! to quit, or a cron job.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::relay::config::RelayConfig;
use crate::Outbox;

/// How often a drain looks whether anything is left.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// The share of the time given that a drain keeps for stopping its relay: requests still out
/// at the end get this long to finish before their events are handed back.
const STOP_SHARE: u32 = 4;

/// Why a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrainEnd {
    /// Nothing was left pending.
    Empty,
    /// The deadline came first; what is left stays pending, for the next drain or relay.
    Deadline,
}

/// What [`Outbox::deliver_pending`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Why it ended.
    pub ended: DrainEnd,
    /// Events delivered during the drain.
    pub delivered: u64,
    /// Events dead-lettered during the drain (out of attempts, or refused for good).
    pub dead: u64,
    /// Events still pending when it returned.
    pub pending: i64,
    /// The last error recorded on an event still pending (why it is left: `unreachable: …`
    /// while offline, a receiver's answer), if any.
    pub last_error: Option<String>,
}

impl Outbox {
    /// Delivers what is pending with a relay of `config`, and returns by `deadline`: as soon
    /// as nothing is pending, or when the deadline comes, whichever is first.
    ///
    /// A quarter of the time given (at most the config's
    /// [`shutdown_timeout`](RelayConfig::shutdown_timeout)) is kept for stopping: the relay
    /// stops claiming then, lets requests still out finish within it, and hands back the
    /// rest; an event whose request was still out then stays leased until its lease runs out
    /// (the config's [`lease`](RelayConfig::lease)), and the next drain takes it after that.
    /// Safe in a background task the system may end at any moment: events are taken
    /// by leases, not locks, so a process killed mid-drain leaves them to come back to the
    /// next drain or relay once their leases run out (each delivered at least once, as
    /// always), and nothing is held that another process waits for.
    ///
    /// ```no_run
    /// use std::time::{Duration, Instant};
    /// use sqlite_outbox::{Destination, DrainEnd, Outbox, RelayConfig};
    /// # fn main() -> Result<(), sqlite_outbox::Error> {
    /// let outbox = Outbox::open("app.db")?;
    /// // The system gave this background task 25 seconds.
    /// let report = outbox.deliver_pending(
    ///     RelayConfig::new().destination(Destination::http("default", "https://example.com/in")),
    ///     Instant::now() + Duration::from_secs(25),
    /// )?;
    /// if report.ended == DrainEnd::Deadline {
    ///     // ask the system for another slot; `report.pending` are waiting, safely
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Relay::start`](crate::Relay::start) for the config; SQLite errors reading what is
    /// pending.
    pub fn deliver_pending(&self, config: RelayConfig, deadline: Instant) -> Result<DrainReport> {
        let given = deadline.saturating_duration_since(Instant::now());
        let stop_budget = (given / STOP_SHARE).min(config.shutdown_timeout);
        let handle = self.relay(config.shutdown_timeout(stop_budget)).start()?;
        let stop_at = deadline.checked_sub(stop_budget).unwrap_or(deadline);
        let ended = loop {
            if self.pending_count(None)? == 0 {
                break DrainEnd::Empty;
            }
            let now = Instant::now();
            if now >= stop_at {
                break DrainEnd::Deadline;
            }
            std::thread::sleep(LOOK_EVERY.min(stop_at - now));
        };
        // Requests still out finish (or are handed back) within the stop budget.
        let _ = handle.shutdown_by(Some(deadline));
        let stats = handle.stats();
        let pending = self.pending_count(None)?;
        Ok(DrainReport {
            ended,
            delivered: stats.delivered,
            dead: stats.dead,
            pending,
            last_error: if pending > 0 {
                crate::store::queue::last_pending_error(&*self.connection()?)?
            } else {
                None
            },
        })
    }
}
