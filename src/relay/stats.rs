//! What a relay has done: running totals shared by its threads, and the shutdown report.

use portable_atomic::AtomicU64;
use std::sync::atomic::Ordering;

use crate::store::queue::WriteBack;

/// Running totals of one relay, written by its writer thread and read through the handle.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    delivered: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
    writer_restarts: AtomicU64,
}

impl Counters {
    /// Counts one recorded write-back.
    pub fn record(&self, write_back: &WriteBack) {
        let counter = match write_back {
            WriteBack::Delivered => &self.delivered,
            WriteBack::Retry { .. } => &self.retried,
            WriteBack::Dead { .. } => &self.dead,
            WriteBack::Release { .. } => &self.released,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a restart of the writer after it panicked.
    pub fn record_writer_restart(&self) {
        self.writer_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Restarts of the writer so far.
    pub fn writer_restarts(&self) -> u64 {
        self.writer_restarts.load(Ordering::Relaxed)
    }

    /// Counts one outcome discarded because another claim had taken the lease over.
    pub fn record_lease_lost(&self) {
        self.lease_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// The totals so far, with the destinations' clock offset estimate.
    pub fn snapshot(&self, clock_offset_ms: Option<i64>) -> RelayStats {
        RelayStats {
            clock_offset_ms,
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            lease_lost: self.lease_lost.load(Ordering::Relaxed),
            writer_restarts: self.writer_restarts.load(Ordering::Relaxed),
        }
    }
}

/// What a relay has done since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RelayStats {
    /// Events the receiver accepted (2xx).
    pub delivered: u64,
    /// Answered failures scheduled for another attempt.
    pub retried: u64,
    /// Events dead-lettered.
    pub dead: u64,
    /// Claims handed back without spending an attempt (unreachable destination, shutdown).
    pub released: u64,
    /// Outcomes discarded because another relay had taken the lease over.
    pub lease_lost: u64,
    /// Times the writer thread panicked and was started again (each is logged as an error):
    /// anything above zero is a bug worth reporting.
    pub writer_restarts: u64,
    /// How far a receiver's clock is from this machine's (receiver minus local, in ms),
    /// estimated from the `Date` headers of its answers; requests are signed with the
    /// corrected time once it passes 30 s. `None` until an answer carried a `Date`.
    pub clock_offset_ms: Option<i64>,
}

/// How a relay's shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
#[must_use = "the report says which events were abandoned in flight"]
pub struct ShutdownReport {
    /// Claimed events no worker had started, handed back at once.
    pub released: usize,
    /// In-flight deliveries that finished during shutdown.
    pub finished: usize,
    /// Deliveries still running at the deadline: their leases expire and another relay (or
    /// the next start) delivers them again.
    pub abandoned: usize,
    /// Threads still blocked at the deadline (in a request that had not timed out yet),
    /// left to end on their own.
    pub detached_threads: usize,
    /// Times the writer panicked and was started again while the relay ran.
    pub writer_restarts: u64,
    /// Outcomes (delivered, to retry, dead) that could not be written by the deadline (the
    /// app held the write lock, the disk was full): their events go out again once their
    /// leases end.
    pub unrecorded: usize,
}

impl ShutdownReport {
    /// A report of a writer that ended in time; its thread counts are the handle's to add.
    pub(crate) fn new(
        released: usize,
        finished: usize,
        abandoned: usize,
        writer_restarts: u64,
    ) -> ShutdownReport {
        ShutdownReport {
            released,
            finished,
            abandoned,
            detached_threads: 0,
            writer_restarts,
            unrecorded: 0,
        }
    }

    /// The same report, with `unrecorded` outcomes left unwritten at the deadline.
    pub(crate) fn with_unrecorded(self, unrecorded: usize) -> ShutdownReport {
        ShutdownReport { unrecorded, ..self }
    }

    /// A report of a writer that could not be joined (it panicked, or is still running).
    pub(crate) fn writer_lost(still_running: bool) -> ShutdownReport {
        ShutdownReport {
            detached_threads: usize::from(still_running),
            ..ShutdownReport::default()
        }
    }
}
