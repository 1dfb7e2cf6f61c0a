//! The relay: a writer thread and delivery workers, started and stopped as one.
//!
//! ```text
//!  writer ──claim──▶ lane's job queue ──▶ workers ──transport──▶ receiver
//!    ▲                                      │ decide, update the gate
//!    └──────────────── reports ◀────────────┘
//! ```
//!
//! Who owns which thread: [`RelayHandle`] owns every thread of a relay. The writer thread
//! (`outbox-relay`, [`writer`]) owns the relay's one writing SQLite connection and every
//! lane ([`lane`]); the checkpointer (`outbox-ckpt`, [`checkpointer`]) owns a second
//! connection that only checkpoints the WAL; each destination's workers (`outbox-<destination>-<n>`, [`worker`]) own
//! nothing but their transport handle and a clone of their lane's gate ([`gate`]). Workers
//! never touch SQLite and the writer never waits on the network, so a slow receiver cannot
//! hold the database's write lock and a busy database cannot stall a request.
//!
//! The layer: the relay uses the `outbox` handle, the store, the transport, the wire and
//! `observe`; nothing below it knows it. What only the relay uses lives here too: its
//! destinations, backoff, the WAL watch, and the report a worker sends the writer
//! ([`report`]), below both so neither imports the other.
//!
//! Stopping: the handle drops the writer's stop sender; the writer closes every lane's job
//! queue (so the workers exit after their current request), hands back the jobs nobody
//! started, records what finishes before the deadline, and returns its report. The handle
//! then joins every thread that has ended by the deadline and counts the rest as detached.

mod accounting;
pub(crate) mod backlog;
pub(crate) mod backoff;
mod barrier;
pub(crate) mod budget;
mod checkpointer;
mod clock_watch;
pub(crate) mod config;
pub(crate) mod decide;
pub(crate) mod destination;
pub(crate) mod drain;
pub(crate) mod gate;
mod housekeeping;
pub(crate) mod lane;
mod pacer;
mod panic;
mod report;
pub(crate) mod spending;
pub(crate) mod stats;
mod voice;
mod wal_file;
mod wal_watch;
mod worker;
mod writer;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::error::Result;
use crate::outbox::Outbox;
use crate::transport::Transport;
use checkpointer::Checkpointer;
use config::RelayConfig;
use lane::Lane;
use report::Report;
use spending::Spending;
use stats::{Counters, RelayStats, ShutdownReport};
use worker::Worker;
use writer::Writer;

/// The longest a stopping relay waits for the accountant's last round.
const ACCOUNTING_AT_STOP: Duration = Duration::from_secs(5);
/// The least time before a drain's deadline for which the accountant's last round is tried.
const ACCOUNTING_AT_STOP_LEAST: Duration = Duration::from_millis(250);

/// A relay, configured but not yet running. Made by [`Outbox::relay`].
#[derive(Debug)]
#[must_use = "a Relay does nothing until `.start()`"]
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

impl<T: Send + 'static> Watched<T> {
    fn spawn(name: String, f: impl FnOnce() -> T + Send + 'static) -> Result<Self> {
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

impl Outbox {
    /// Prepares a relay that delivers this outbox's events as `config` says; call
    /// [`Relay::start`] to run it.
    pub fn relay(&self, config: RelayConfig) -> Relay {
        Relay::new(self.clone(), config)
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
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the setting that is out
    /// of range (a URL that is not HTTP, a malformed secret, a lease shorter than twice a
    /// request timeout, …); [`Error::Pool`](crate::Error::Pool) if no connection is free for
    /// the writer; [`Error::Io`](crate::Error::Io) if a thread cannot be spawned.
    pub fn start(self) -> Result<RelayHandle> {
        let Relay { outbox, config } = self;
        let transports = config.build_transports()?;
        let relay_id = config
            .name
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let conn = outbox.connection()?;
        let checkpoint_conn = outbox.unpooled_connection()?;
        // The room for a full disk, if it was given back and the disk has room again.
        outbox.disk_room().take();
        let (reports_tx, reports_rx) = unbounded::<Report>();
        let counters = Arc::new(Counters::default());

        let mut lanes = Vec::with_capacity(transports.len());
        let clocks = transports.clone();
        let mut told = Vec::new();
        let mut workers = Vec::new();
        let mut voices = Vec::new();
        let mut budgets = Vec::new();
        for (index, (destination, transport)) in
            config.destinations.iter().zip(transports).enumerate()
        {
            let worker_count = destination.worker_count().unwrap_or(config.workers);
            let spending = destination.budget_checked()?.map(|(budget, exempt)| {
                Arc::new(Spending::new(
                    destination.name(),
                    budget,
                    exempt,
                    destination.first_request_overhead(),
                    outbox.clock(),
                ))
            });
            let lane = Lane::new(destination, worker_count, &config).with_spending(spending);
            voices.push(lane.voice());
            if let Some(spending) = lane.spending() {
                budgets.push((destination.name().to_string(), Arc::clone(spending)));
            }
            say_what_will_not_work(&outbox, destination);
            told.push(accounting::Told {
                name: destination.name().to_string(),
                tells: destination.sends_accounting(),
                transport: transport.clone(),
                gate: lane.gate(),
                spending: lane.spending().cloned(),
            });
            for n in 0..worker_count {
                let worker = Worker::new(
                    index,
                    &lane,
                    transport.clone(),
                    reports_tx.clone(),
                    outbox.clock(),
                    &config,
                );
                // Linux keeps 15 bytes of a thread's name: the lane's number, not the
                // destination's name (cut, two destinations' workers looked alike).
                let name = format!("outbox-w{index}-{n}");
                workers.push(Watched::spawn(name, move || worker.run())?);
            }
            lanes.push(lane);
        }
        // The workers hold the only senders: once they are gone, the writer knows.
        drop(reports_tx);
        let shutdown_timeout = config.shutdown_timeout;
        let checkpointed = outbox.clone();
        let accountant = {
            let (stop_tx, stop) = bounded::<bool>(1);
            let accountant =
                accounting::Accountant::new(outbox.clone(), told, stop, config.accounting_interval);
            Some((
                stop_tx,
                Watched::spawn("outbox-account".to_string(), move || accountant.run())?,
            ))
        };
        // The writer tells the checkpointer when something was written, so that neither
        // looks on a timer while nothing is.
        let (kick_tx, kick_rx) = bounded::<()>(1);
        let (writer, stop_tx) = Writer::new(
            outbox,
            conn,
            &config,
            &relay_id,
            lanes,
            reports_rx,
            counters.clone(),
            kick_tx,
        );
        let writer = Watched::spawn("outbox-relay".to_string(), move || writer.run())?;
        let (checkpoint_stop_tx, checkpoint_stop) = bounded::<()>(0);
        let checkpointer = Checkpointer::new(
            checkpoint_conn,
            checkpointed,
            &relay_id,
            checkpoint_stop,
            kick_rx,
        );
        let checkpointer = Watched::spawn("outbox-ckpt".to_string(), move || checkpointer.run())?;
        log::info!("relay {relay_id}: started");
        Ok(RelayHandle {
            relay_id,
            threads: Mutex::new(Threads {
                stop_tx: Some(stop_tx),
                writer: Some(writer),
                checkpointer: Some((checkpoint_stop_tx, checkpointer)),
                accountant,
                workers,
            }),
            shutdown_timeout,
            counters,
            transports: clocks,
            voices,
            budgets,
        })
    }
}

/// Says at once, as a warning, what about `destination` will silently not work: no route
/// of the file sends events to it (and none is pending for it), so it will never have
/// anything to deliver; or its requests are not signed.
fn say_what_will_not_work(outbox: &Outbox, destination: &destination::Destination) {
    let name = destination.name();
    let settings = outbox.current_settings();
    let routed = if settings.routes.is_empty() {
        name == destination::Destination::DEFAULT
    } else {
        settings
            .routes
            .iter()
            .any(|route| route.destination() == name)
    };
    if !routed && outbox.pending_count(Some(name)).unwrap_or(0) == 0 {
        let routes: Vec<String> = settings
            .routes
            .iter()
            .map(|route| format!("{} -> {}", route.pattern(), route.destination()))
            .collect();
        log::warn!(
            "destination {name}: no route sends events to it and none is pending for it, so \
             it will deliver nothing (routes: {}); route event types to it with \
             Outbox::builder().route(pattern, \"{name}\")",
            if routes.is_empty() {
                "none: every event goes to \"default\"".to_owned()
            } else {
                routes.join(", ")
            }
        );
    }
    if destination.is_unsigned_http() {
        log::warn!(
            "destination {name}: requests are not signed (no secret, signing key or \
             Authorization header): its receiver cannot tell them from anyone else's"
        );
    }
}

/// A running relay. [`shutdown`](Self::shutdown) stops it; dropping the handle does the same.
#[must_use = "dropping the RelayHandle stops the relay at once; keep it for as long as the relay should run"]
pub struct RelayHandle {
    relay_id: String,
    /// Behind a lock, so that [`shutdown`](Self::shutdown) takes `&self`: the handle can sit
    /// in the app's shared state (an `Arc`, a `static`) and be stopped from there.
    threads: Mutex<Threads>,
    shutdown_timeout: Duration,
    counters: Arc<Counters>,
    /// The destinations' transports, for their clock offset estimates.
    transports: Vec<Arc<dyn Transport>>,
    /// What the relay says of each destination's state.
    voices: Vec<Arc<voice::Voice>>,
    /// The destinations' data budgets, by destination, for [`trouble`](Self::trouble).
    budgets: Vec<(String, Arc<Spending>)>,
}

/// The threads a running relay owns, taken (and joined) once by the first shutdown.
struct Threads {
    stop_tx: Option<Sender<()>>,
    writer: Option<Watched<ShutdownReport>>,
    /// The checkpointer thread and the sender whose drop stops it.
    checkpointer: Option<(Sender<()>, Watched<()>)>,
    /// The accountant thread and the sender that stops it (`true`: tell a last time first).
    accountant: Option<(Sender<bool>, Watched<()>)>,
    workers: Vec<Watched<()>>,
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

    /// Whether the relay's writer thread is running (it ends only at shutdown: a panic in it
    /// is caught and the writer started again, counted in [`RelayStats::writer_restarts`]).
    pub fn is_running(&self) -> bool {
        self.threads()
            .writer
            .as_ref()
            .is_some_and(|w| !w.handle.is_finished())
    }

    /// The relay's threads; a panic while they were locked left nothing half-changed that
    /// matters here (each field is taken whole), so a poisoned lock is used as it is.
    fn threads(&self) -> std::sync::MutexGuard<'_, Threads> {
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is wrong with the first destination that is not delivering, as the relay last
    /// logged it (its state and the answer: `destination orders: refuses the relay's
    /// credentials …: 401 Unauthorized`), else the first holding its events for its data
    /// budget (`destination orders: holds its events for its data budget …, until …`), or
    /// `None` while every destination delivers (or has not been tried yet).
    pub fn trouble(&self) -> Option<String> {
        self.voices
            .iter()
            .find_map(|voice| voice.trouble())
            .or_else(|| {
                self.budgets.iter().find_map(|(name, spending)| {
                    let until = spending.holding_until()?;
                    let (used, limit) = spending.used_and_limit();
                    Some(format!(
                        "destination {name}: holds its events for its data budget ({used} of \
                         {limit} bytes spent) until the period ends at {}",
                        crate::wire::rfc3339_millis(until)
                    ))
                })
            })
    }

    /// What the relay has done so far.
    pub fn stats(&self) -> RelayStats {
        let offset = self.transports.iter().find_map(|t| t.clock_offset_ms());
        self.counters.snapshot(offset)
    }

    /// Stops claiming, hands back events no worker started, waits up to the shutdown timeout
    /// for in-flight deliveries, and joins every thread that has ended by then.
    ///
    /// Then, once every outcome is written, tells each destination that takes accounting
    /// ([`Destination::accounting`](crate::Destination::accounting)) its streams' final state: one request per stream that
    /// changed, waited for 5 s at most, and skipped when a request was left hanging.
    ///
    /// Returns within the shutdown timeout plus a small margin (plus that last accounting,
    /// when the receiver answers), even when the receiver hangs. Takes `&self`, so a handle kept in shared state (`Arc<RelayHandle>`, a `static
    /// OnceLock`) can be shut down from wherever the app exits; the first call stops the
    /// relay and reports, later calls (and the drop) find it stopped and return an empty
    /// report.
    pub fn shutdown(&self) -> ShutdownReport {
        self.shutdown_by(None)
    }

    /// [`shutdown`](Self::shutdown), returning by `deadline` if one is given (a drain's, whose
    /// caller's time is up then): the waits for the writer and the accountant's last round
    /// end there at the latest, and that last round is skipped when too little is left.
    pub(crate) fn shutdown_by(&self, deadline: Option<Instant>) -> ShutdownReport {
        let by = |wanted: Instant| deadline.map_or(wanted, |d| wanted.min(d));
        let mut threads = self.threads();
        let Some(stop_tx) = threads.stop_tx.take() else {
            return ShutdownReport::default();
        };
        // Dropping the sender disconnects the channel: the writer sees it on its next wait.
        drop(stop_tx);
        // The writer spends at most the shutdown timeout waiting for in-flight work, plus one
        // SQLite write; give it that and a margin.
        let writer_deadline = by(Instant::now() + self.shutdown_timeout + Duration::from_secs(2));
        let mut report = match threads.writer.take().map(|w| w.join_by(writer_deadline)) {
            Some(Some(Ok(report))) => report,
            Some(Some(Err(_))) => {
                log::error!("relay {}: writer thread panicked", self.relay_id);
                ShutdownReport::writer_lost(false)
            }
            _ => ShutdownReport::writer_lost(true),
        };
        // Workers stuck in a request get until the same deadline, then are left to time out.
        let worker_deadline = by(Instant::now().min(writer_deadline) + Duration::from_millis(200));
        for worker in threads.workers.drain(..) {
            if worker.join_by(worker_deadline).is_none() {
                report.detached_threads += 1;
            }
        }
        // The checkpointer stops between checkpoints; one under way copies at most the
        // WAL's bounded size.
        if let Some((stop, checkpointer)) = threads.checkpointer.take() {
            drop(stop);
            if checkpointer.join_by(worker_deadline).is_none() {
                report.detached_threads += 1;
            }
        }
        // Last, once every outcome is written: the accountant tells each destination the
        // streams' final state (one request per stream that changed), within a bound; not
        // when a request was left hanging, which the last word would only join.
        if let Some((stop, accountant)) = threads.accountant.take() {
            let time_left = deadline.map_or(ACCOUNTING_AT_STOP, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let tell_last = report.abandoned == 0
                && report.detached_threads == 0
                && time_left >= ACCOUNTING_AT_STOP_LEAST;
            let _ = stop.try_send(tell_last);
            drop(stop);
            let bound = if tell_last {
                by(Instant::now() + ACCOUNTING_AT_STOP)
            } else {
                worker_deadline
            };
            if accountant.join_by(bound).is_none() {
                report.detached_threads += 1;
            }
        }
        log::info!("relay {}: stopped: {report:?}", self.relay_id);
        report
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
