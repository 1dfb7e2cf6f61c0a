//! The relay: a writer thread and delivery workers, started and stopped as one.
//!
//! ```text
//!  writer ──claim──▶ bounded work channel ──▶ workers ──HTTP──▶ receiver
//!    ▲                                           │
//!    └──────────── completions channel ◀─────────┘
//! ```
//!
//! Workers never touch SQLite and the writer never waits on the network, so a slow receiver
//! cannot hold the database's write lock and a busy database cannot stall a request.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::claim::WriteBack;
use crate::clock::Clock;
use crate::error::Result;
use crate::outbox::Outbox;
use crate::reachability::{GatePolicy, Reachability};
use crate::relay_config::RelayConfig;
use crate::relay_writer::{Job, Lane, Writer};
use crate::transport::{Attempt, OutboundEvent, Transport};

/// What a worker did with one claimed event.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It was sent; here is what came of it.
    Attempted(Attempt),
    /// Not sent: the destination is offline, or too much of the lease had passed.
    Skipped,
    /// The transport panicked; the message is kept as the event's error.
    Panicked(String),
}

/// A worker's report on one request (one event, or a batch), sent back to the writer.
#[derive(Debug)]
pub(crate) struct Completion {
    /// Which destination lane it came from.
    pub lane: usize,
    pub events: Vec<OutboundEvent>,
    pub outcome: Outcome,
}

/// Running totals of one relay, shared by its threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    delivered: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
}

impl Counters {
    pub fn record(&self, write_back: &WriteBack) {
        let counter = match write_back {
            WriteBack::Delivered => &self.delivered,
            WriteBack::Retry { .. } => &self.retried,
            WriteBack::Dead { .. } => &self.dead,
            WriteBack::Release { .. } => &self.released,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_lease_lost(&self) {
        self.lease_lost.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> RelayStats {
        RelayStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            lease_lost: self.lease_lost.load(Ordering::Relaxed),
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
}

/// How a relay's shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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
}

/// A relay, configured but not yet running. Made by [`Outbox::relay`].
#[derive(Debug)]
pub struct Relay {
    outbox: Outbox,
    config: RelayConfig,
}

/// A thread and a way to wait for it with a deadline: the thread holds the sender, so the
/// receiver disconnects the moment the thread ends, however it ends.
struct Watched<T> {
    handle: JoinHandle<T>,
    exited: Receiver<()>,
}

impl<T> Watched<T> {
    fn spawn(name: String, f: impl FnOnce() -> T + Send + 'static) -> Result<Self>
    where
        T: Send + 'static,
    {
        let (exit_tx, exited) = bounded::<()>(0);
        let handle = thread::Builder::new().name(name).spawn(move || {
            let _exit_tx = exit_tx;
            f()
        })?;
        Ok(Watched { handle, exited })
    }

    /// Joins the thread if it ends before `deadline`; otherwise leaves it running.
    fn join_by(self, deadline: Instant) -> Option<thread::Result<T>> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.exited.recv_timeout(left) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            _ => Some(self.handle.join()),
        }
    }
}

impl Relay {
    pub(crate) fn new(outbox: Outbox, config: RelayConfig) -> Self {
        Relay { outbox, config }
    }

    /// Starts the writer and the delivery workers.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for settings out of range or a
    /// URL that is not HTTP; [`Error::Pool`](crate::Error::Pool) if no connection is free for
    /// the writer; [`Error::Io`](crate::Error::Io) if a thread cannot be spawned.
    pub fn start(self) -> Result<RelayHandle> {
        let transports = self.config.build_transports()?;
        let relay_id = self
            .config
            .name
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let conn = self.outbox.connection()?;
        let (done_tx, done_rx) = unbounded::<Completion>();
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let counters = Arc::new(Counters::default());

        let mut lanes = Vec::with_capacity(transports.len());
        let mut workers = Vec::new();
        for (index, (destination, transport)) in
            self.config.destinations.iter().zip(transports).enumerate()
        {
            let worker_count = destination.workers.unwrap_or(self.config.workers);
            let reach = Arc::new(Reachability::default());
            // Every job holds at least one event, so this many jobs never fills the channel.
            let capacity = self.config.max_in_flight.max(
                self.config
                    .claim_batch
                    .max(destination.batch.map_or(0, |b| b.max_events * worker_count))
                    * 4,
            );
            let work = bounded::<Job>(capacity);
            for n in 0..worker_count {
                let worker = Worker {
                    lane: index,
                    work_rx: work.1.clone(),
                    done_tx: done_tx.clone(),
                    transport: transport.clone(),
                    reach: reach.clone(),
                    clock: self.outbox.inner.clock.clone(),
                    lease_ms: self.config.lease.as_millis() as i64,
                    policy: GatePolicy {
                        offline: self.config.offline,
                        retry_after_cap: self.config.retry_after_cap,
                        default_pause: self.config.retry.base,
                    },
                };
                let name = format!("outbox-{}-{n}", destination.name);
                workers.push(Watched::spawn(name, move || worker.run())?);
            }
            lanes.push(Lane::new(
                destination.name.clone(),
                destination.batch,
                worker_count,
                &self.config,
                reach,
                work,
            ));
        }
        drop(done_tx);
        let shutdown_timeout = self.config.shutdown_timeout;
        let writer = Writer {
            outbox: self.outbox,
            conn,
            config: self.config,
            relay_id: relay_id.clone(),
            lanes,
            done_rx,
            stop_rx,
            counters: counters.clone(),
            wrote: true,
        };
        let writer = Watched::spawn("outbox-relay".to_string(), move || writer.run())?;
        log::info!("relay {relay_id}: started");
        Ok(RelayHandle {
            relay_id,
            stop_tx: Some(stop_tx),
            writer: Some(writer),
            workers,
            shutdown_timeout,
            counters,
        })
    }
}

/// A running relay. [`shutdown`](Self::shutdown) stops it; dropping the handle does the same.
pub struct RelayHandle {
    relay_id: String,
    stop_tx: Option<Sender<()>>,
    writer: Option<Watched<ShutdownReport>>,
    workers: Vec<Watched<()>>,
    shutdown_timeout: Duration,
    counters: Arc<Counters>,
}

impl fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayHandle")
            .field("relay_id", &self.relay_id)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl RelayHandle {
    /// The relay's id, as used in lease owners and logs.
    pub fn id(&self) -> &str {
        &self.relay_id
    }

    /// What the relay has done so far.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Stops claiming, hands back events no worker started, waits up to the shutdown timeout
    /// for in-flight deliveries, and joins every thread that has ended by then.
    ///
    /// Returns within the shutdown timeout plus a small margin, even when the receiver hangs.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.stop()
    }

    fn stop(&mut self) -> ShutdownReport {
        let Some(stop_tx) = self.stop_tx.take() else {
            return ShutdownReport::default();
        };
        // Dropping the sender disconnects the channel: the writer sees it on its next wait.
        drop(stop_tx);
        // The writer spends at most the shutdown timeout waiting for in-flight work, plus one
        // SQLite write; give it that and a margin.
        let deadline = Instant::now() + self.shutdown_timeout + Duration::from_secs(2);
        let mut report = match self.writer.take().map(|w| w.join_by(deadline)) {
            Some(Some(Ok(report))) => report,
            Some(Some(Err(_))) => {
                log::error!("relay {}: writer thread panicked", self.relay_id);
                ShutdownReport::default()
            }
            _ => ShutdownReport {
                detached_threads: 1,
                ..ShutdownReport::default()
            },
        };
        // Workers stuck in a request get until the same deadline, then are left to time out.
        let worker_deadline = Instant::now().min(deadline) + Duration::from_millis(200);
        for worker in self.workers.drain(..) {
            if worker.join_by(worker_deadline).is_none() {
                report.detached_threads += 1;
            }
        }
        log::info!("relay {}: stopped: {report:?}", self.relay_id);
        report
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One delivery thread of one destination: takes jobs, sends them, reports back.
struct Worker {
    lane: usize,
    work_rx: Receiver<Job>,
    done_tx: Sender<Completion>,
    transport: Arc<dyn Transport>,
    reach: Arc<Reachability>,
    clock: Arc<dyn Clock>,
    lease_ms: i64,
    policy: GatePolicy,
}

impl Worker {
    fn run(self) {
        // Ends when the writer drops the work sender (shutdown) or the completion receiver.
        while let Ok(events) = self.work_rx.recv() {
            let outcome = self.deliver(&events);
            let done = Completion {
                lane: self.lane,
                events,
                outcome,
            };
            if self.done_tx.send(done).is_err() {
                break;
            }
        }
    }

    fn deliver(&self, events: &[OutboundEvent]) -> Outcome {
        let now = self.clock.now_ms();
        // Once half the lease is gone a request might outlive it and race another relay's
        // claim; hand the events back instead.
        let lease_short = events
            .iter()
            .any(|e| now + self.lease_ms / 2 > e.lease_expires_at);
        if self.reach.is_closed(now) || lease_short {
            return Outcome::Skipped;
        }
        match catch_unwind(AssertUnwindSafe(|| self.transport.send(events))) {
            Ok(attempt) => {
                self.reach
                    .observe(&attempt, self.clock.now_ms(), &self.policy);
                Outcome::Attempted(attempt)
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                let first = events.first().map_or("", |e| e.event_id.as_str());
                log::error!("event {first}: transport panicked: {msg}");
                Outcome::Panicked(msg)
            }
        }
    }
}
