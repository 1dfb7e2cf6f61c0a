//! The relay's writer thread: the only part of a relay that touches SQLite.
//!
//! Its loop: record the workers' reports (many per transaction), notice new work, do a
//! little housekeeping, claim for every lane that wants it, and wait for the next thing to
//! happen. Owning every write in one thread means the relay never fights itself for
//! SQLite's single write lock.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use rusqlite::TransactionBehavior;

use crate::error::Result;
use crate::observe::notices::{DeliveryNotice, DeliveryOutcome};
use crate::outbound::OutboundEvent;
use crate::outbox::Outbox;
use crate::relay::barrier::Barrier;
use crate::relay::clock_watch::{ClockJump, ClockWatch};
use crate::relay::config::RelayConfig;
use crate::relay::decide::{GateChange, Policy};
use crate::relay::housekeeping::Housekeeping;
use crate::relay::lane::Lane;
use crate::relay::panic::panic_message;
use crate::relay::report::Report;
use crate::relay::spending::{HoldChange, SYNC_EVERY};
use crate::relay::stats::{Counters, ShutdownReport};
use crate::relay::wal_watch::{self, WalWatch};
use crate::store::database::PooledConnection;
use crate::store::disabled;
use crate::store::queue::numbering;
use crate::store::queue::{self, ClaimRequest, WriteBack};

/// Outcomes written back in one transaction at most: enough to amortize the commit, few
/// enough that the write lock is held well under a millisecond, so the app's own commits
/// never wait long behind the relay.
const MAX_ACKS_PER_TX: usize = 200;
/// The longest the writer lets the app's write transactions of the same `Outbox` (and the
/// checkpointer's catch-up) go first before a write of its own (see
/// [`crate::store::right_of_way`]): an app thread that keeps a transaction open must not stop the
/// relay.
const GIVE_WAY_LIMIT: Duration = Duration::from_millis(5);
/// How long at most a numbering step waits for the app's commits and the checkpointer's
/// catch-up: bulk work that writes flat out, it waits a catch-up out rather than break into
/// it (breaking in left the WAL to a blocking RESTART, 30-80 ms of the app's commits).
const STEP_GIVE_WAY_LIMIT: Duration = Duration::from_millis(50);
/// How often at most the writer looks for events past their deadline (it sleeps until the
/// earliest deadline it knows of, and looks again this soon after new commits).
const EXPIRY_INTERVAL: Duration = Duration::from_millis(100);
/// How often the writer polls `PRAGMA data_version` while a file-change notification on the
/// WAL tells it of other processes' commits: only a fallback, for a notification lost (the
/// kernel's queue overflowed) or a file system that accepts a watch and never reports.
const WATCHED_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// After a notification that the WAL changed, how many more times the writer reads
/// `data_version`, the first [`RECHECK_STEP`] later and each pause twice the one before
/// (1, 2, 4 … 128 ms: 255 ms in all): the commit's frames are written before the commit is
/// published in the wal-index, which no notification reports (see
/// [`crate::relay::wal_watch`]). Most commits show within a millisecond, but a committing
/// process the scheduler sets aside between the two (two busy cores) can take tens; a
/// commit still unseen after the last look waits for the poll. A look costs microseconds.
const RECHECKS: u32 = 8;
const RECHECK_STEP: Duration = Duration::from_millis(1);

/// The pause before the look that leaves `left` looks after it.
fn recheck_pause(left: u32) -> Duration {
    RECHECK_STEP * 2u32.pow(RECHECKS.saturating_sub(left).min(RECHECKS))
}

/// How long no request must have been out before the paused WAL watch resumes: past an
/// app's burst of commits (each woke the relay in-process), short beside the 50 ms between
/// commits at 20 a second, so another process's next commit finds the watch on.
const WATCH_AFTER_IDLE: Duration = Duration::from_millis(10);
/// How long the writer may wait to gather more outcomes into one ack transaction.
const ACK_WINDOW: Duration = Duration::from_millis(1);
/// Below this many requests in flight, outcomes are recorded at once.
const ACK_GATHER_MIN_IN_FLIGHT: usize = 8;
/// How often at most an idle relay claims without a sign of new work (at each poll), to pick
/// up leases that a crashed relay left behind.
const IDLE_CLAIM_INTERVAL: Duration = Duration::from_secs(1);
/// The first pause before a writer that panicked starts again, and the longest.
const WRITER_RESTART_PAUSE: Duration = Duration::from_millis(100);
const WRITER_RESTART_PAUSE_CAP: Duration = Duration::from_secs(30);
/// How long the writer waits before writing again outcomes whose write failed.
const RECORD_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How often at most the writer makes room on a full disk (see `Writer::recover_room`).
const ROOM_RECOVERY_PAUSE: Duration = Duration::from_millis(500);
/// How long after noticing a step of the wall clock the writer judges other relays' leases on
/// the clock of before it too (see `ClaimRequest::clock_step_ms`): time for their owners
/// to look at the clock and move them (at each poll: at most 5 s apart with the WAL watch),
/// short enough that a crashed relay's leases are not kept much longer for the step.
const STEP_GRACE_MIN: Duration = Duration::from_secs(60);
/// The page cache of the writer's connection, in KiB, while the relay runs (SQLite's own
/// default is 2,000 KiB). The writer reads the head of the pending index and the rows it
/// has just claimed, a few dozen pages a batch, so a small cache costs it nothing
/// measurable; at the default, the pages a drain passes over once filled it, and they were
/// 1.3–2 MiB of a relay's peak RSS (draining 1M events: 15.3–15.6 MiB at the default,
/// 13.4–14.2 MiB at 512 KiB, batched throughput the same within the bench's spread).
const WRITER_CACHE_KIB: i64 = 512;

/// The writer: every lane, the one connection, and the loop's own state.
pub(crate) struct Writer {
    outbox: Outbox,
    conn: PooledConnection,
    relay_id: String,
    lease_ms: i64,
    poll_interval: Duration,
    shutdown_timeout: Duration,
    policy: Policy,
    lanes: Vec<Lane>,
    reports: Receiver<Report>,
    stop: Receiver<()>,
    wake: Receiver<()>,
    /// Ready when the WAL changed (another process may have committed); never ready
    /// without a watch.
    wal_changed: Receiver<()>,
    /// The watch behind `wal_changed`, stopped with the writer; paused while requests are
    /// out (see [`Writer::watch_while_idle`]).
    wal_watch: Option<WalWatch>,
    /// When the writer last saw a request out.
    last_busy: Instant,
    /// The next re-read of `data_version` after a WAL notification, and how many are left.
    rechecks: Option<(Instant, u32)>,
    /// Tells the checkpointer that something was written (capacity one).
    checkpoint_kick: Sender<()>,
    /// Whether this turn wrote or saw a commit, so the checkpointer should look.
    wrote: bool,
    counters: Arc<Counters>,
    housekeeping: Housekeeping,
    barrier: Barrier,
    /// `{relay_id}:{start id}:`, the start of every lease owner this relay writes: the start
    /// id is random per start, so two relays given the same name (or one restarted, whose
    /// claim counter starts again at 1) never share a lease owner, and fencing holds.
    lease_prefix: String,
    claim_seq: u64,
    stopping: bool,
    data_version: i64,
    last_poll: Instant,
    last_claim: Instant,
    /// When the writer last made room on a full disk.
    last_room_recovery: Option<Instant>,
    /// When the writer last looked whether a full disk with nothing pending needs room
    /// given to the app.
    last_room_look: Option<Instant>,
    /// When the expiry sweep last ran, and when it is next due (`None`: no pending event
    /// has a deadline, as far as the writer knows).
    last_expiry: Instant,
    next_expiry: Option<Instant>,
    /// Steps of the wall clock (NTP's, a user's): a step noticed whose moves are not
    /// written yet (the app held the write lock) is tried again at each turn that looks at
    /// the clock; no event expires meanwhile.
    clock_watch: ClockWatch,
    /// The last step noticed (summed with those before it within the grace) and when:
    /// other relays' leases are judged on the clock of before it too, for a while.
    recent_step: Option<(Instant, i64)>,
    /// The last try to follow a jump failed: its retries log at `debug`, not again at `warn`.
    clock_follow_failed: bool,
    /// Outcomes whose write failed (the lock was held too long, the disk was full), kept
    /// and written again while their leases hold, so delivered events are not sent again.
    unrecorded: Vec<Report>,
    /// When the unrecorded outcomes may be tried again.
    retry_record_at: Instant,
    /// After a failed write of the budgets' spending, when to try again (a full disk must
    /// not turn the loop hot).
    retry_budgets_at: Instant,
    /// Whether a failure to write the budgets' spending was said and not yet followed by a
    /// write: said once a spell.
    budget_write_failing: bool,
    /// The page cache size the connection came from the pool with, given back at shutdown.
    pool_cache_size: Option<i64>,
}

impl Writer {
    /// A writer for `lanes` on `conn`; returns it with the sender that stops it (by being
    /// dropped).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        outbox: Outbox,
        conn: PooledConnection,
        config: &RelayConfig,
        relay_id: &str,
        lanes: Vec<Lane>,
        reports: Receiver<Report>,
        counters: Arc<Counters>,
        checkpoint_kick: Sender<()>,
    ) -> (Writer, Sender<()>) {
        let (stop_tx, stop) = bounded(0);
        let wake = outbox.register_relay();
        let (wal_watch, wal_changed) = match wal_watch::watch(outbox.path()) {
            Some((watch, changed)) => (Some(watch), changed),
            None => (None, crossbeam_channel::never()),
        };
        let pool_cache_size = shrink_page_cache(&conn, relay_id);
        let writer = Writer {
            conn,
            pool_cache_size,
            relay_id: relay_id.to_string(),
            lease_ms: config.lease_ms(),
            poll_interval: config.poll_interval,
            shutdown_timeout: config.shutdown_timeout,
            policy: Policy::new(config),
            lanes,
            reports,
            stop,
            wake,
            wal_changed,
            wal_watch,
            last_busy: Instant::now(),
            rechecks: None,
            checkpoint_kick,
            wrote: false,
            counters,
            housekeeping: Housekeeping::new(config, relay_id),
            barrier: Barrier::new(outbox.synchronous(), config.durability_barrier),
            lease_prefix: new_lease_prefix(relay_id),
            claim_seq: 0,
            stopping: false,
            data_version: 0,
            last_poll: Instant::now(),
            last_claim: Instant::now(),
            last_room_recovery: None,
            last_room_look: None,
            last_expiry: Instant::now(),
            next_expiry: Some(Instant::now()),
            clock_watch: ClockWatch::new(outbox.now_ms(), outbox.clock().elapsed_ms(), 0),
            recent_step: None,
            clock_follow_failed: false,
            unrecorded: Vec::new(),
            retry_record_at: Instant::now(),
            retry_budgets_at: Instant::now(),
            budget_write_failing: false,
            outbox,
        };
        (writer, stop_tx)
    }

    /// Runs until stopped, then shuts down (bounded) and reports.
    ///
    /// A panic in the loop (a bug, or a panicking clock) is caught: it is logged, counted in
    /// [`RelayStats::writer_restarts`](crate::RelayStats::writer_restarts), and the loop
    /// starts again after a pause that doubles up to 30 s. Outcomes it held are lost; their
    /// leases expire and the events are delivered again.
    pub fn run(mut self) -> ShutdownReport {
        let mut pause = WRITER_RESTART_PAUSE;
        let mut reports = Vec::new();
        loop {
            let turn = catch_unwind(AssertUnwindSafe(|| self.run_loop(&mut reports)));
            let Err(panic) = turn else { break };
            let message = panic_message(&*panic);
            log::error!(
                "relay {}: the writer panicked ({message}); restarting it in {pause:?}",
                self.relay_id
            );
            self.counters.record_writer_restart();
            // The outcomes it held are lost (their leases expire and the events are claimed
            // again), so their lanes no longer count them in flight: else the slots stay
            // taken for events this relay may never see again (delivered by another relay,
            // expired), and shutdown would wait for them.
            for report in reports.drain(..) {
                if let Some(lane) = self.lanes.get_mut(report.lane()) {
                    lane.finished(report.events());
                }
            }
            // A new incarnation, a new lease prefix: the relay spares its own leases from
            // expiry and from its claims (see `queue::expire`), so leases the lost state held
            // would otherwise never run out while this relay lives, and their events would
            // wait for it to stop. With the old prefix foreign, they expire and come back.
            self.lease_prefix = new_lease_prefix(&self.relay_id);
            // Wait out the pause unless the relay is being stopped.
            if !matches!(
                self.stop.recv_timeout(pause),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ) {
                self.stopping = true;
                break;
            }
            pause = (pause * 2).min(WRITER_RESTART_PAUSE_CAP);
        }
        self.shut_down(reports)
    }

    /// The writer's loop, until the relay is stopped.
    fn run_loop(&mut self, reports: &mut Vec<Report>) {
        self.data_version = self.data_version().unwrap_or(0);
        self.load_disabled();
        self.load_budgets();
        // Rows may carry due times from a boot whose clock was ahead; re-anchored now, or
        // as soon as the write lock is free (an app migrating at boot may hold it).
        self.clock_watch = ClockWatch::new(
            self.outbox.now_ms(),
            self.outbox.clock().elapsed_ms(),
            queue::top_id(&self.conn).unwrap_or(0),
        );
        self.follow_the_clock();
        while !self.stopping {
            self.drain_reports(reports);
            if !reports.is_empty() {
                self.gather_more(reports);
            }
            self.take_unrecorded(reports);
            if !reports.is_empty() {
                self.record(reports);
                self.wrote = true;
            }
            self.poll_for_work();
            self.expire_due();
            // Pruning and handing pages back write too: a catch-up must see them.
            let outbox = &self.outbox;
            let room = outbox.disk_room();
            self.wrote |= self
                .housekeeping
                .tick(&mut self.conn, outbox.now_ms(), room, || {
                    outbox.right_of_way().relay_write(GIVE_WAY_LIMIT)
                });
            self.give_room_to_the_app();
            self.keep_budgets(Instant::now());
            self.announce_budgets();
            for lane in 0..self.lanes.len() {
                if let Err(e) = self.claim(lane) {
                    log::warn!("relay {}: claim failed, will retry: {e:#}", self.relay_id);
                    // Not at once: a broken disk would otherwise turn this into a hot loop.
                    // The idle claim at the next poll tries again; at once only if a full
                    // disk just got the reserve back.
                    if !self.gave_room_for(&e) {
                        self.lanes[lane].rest();
                    }
                }
            }
            self.read_due_times();
            if std::mem::take(&mut self.wrote) {
                // Never blocks: a kick not yet taken covers this one.
                let _ = self.checkpoint_kick.try_send(());
            }
            self.watch_while_idle();
            self.wait(reports);
        }
    }

    fn drain_reports(&self, into: &mut Vec<Report>) {
        while into.len() < MAX_ACKS_PER_TX {
            match self.reports.try_recv() {
                Ok(r) => into.push(r),
                Err(_) => break,
            }
        }
    }

    /// While many requests are in flight, waits a moment for more of them to finish, so one
    /// transaction records many outcomes instead of one each: commits are the writer's main
    /// cost. Bounded by `ACK_WINDOW`; with little in flight it does not wait at all.
    fn gather_more(&self, reports: &mut Vec<Report>) {
        let done = |r: &Vec<Report>| r.iter().map(Report::len).sum::<usize>();
        let pending = self.in_flight().saturating_sub(done(reports));
        if pending < ACK_GATHER_MIN_IN_FLIGHT {
            return;
        }
        if done(reports) >= (pending / 2).min(MAX_ACKS_PER_TX) {
            return;
        }
        // A plain sleep, not a timed receive per report: on two cores the receive's spinning
        // would take CPU from the very workers it waits for.
        std::thread::sleep(ACK_WINDOW);
        self.drain_reports(reports);
    }

    /// How often the writer polls `data_version` and claims without a sign of new work:
    /// [`WATCHED_POLL_INTERVAL`] (or the poll interval, if longer) while the WAL watch
    /// reports commits, on a system whose watch reports writes to the open WAL (Linux,
    /// Android); the poll interval otherwise, and everywhere else (a watch set up on macOS,
    /// Windows or iOS reports no such write: another process's commit would wait 5 s).
    fn poll_period(&self) -> Duration {
        match &self.wal_watch {
            Some(watch) if watch.is_watching() && crate::platform::watch_reports_writes_here() => {
                WATCHED_POLL_INTERVAL.max(self.poll_interval)
            }
            _ => self.poll_interval,
        }
    }

    /// Pauses the WAL watch while requests are out and resumes it once none has been for
    /// [`WATCH_AFTER_IDLE`]. While delivering, the relay's own claims and acks (and the
    /// app's commits, which wake it in-process anyway) would notify the watch on every
    /// commit: 5–7% of a batched drain's rate on two cores, and a quarter fewer commits for
    /// an app committing flat out beside it. A busy writer claims again anyway, and the poll
    /// covers other lanes meanwhile. On resuming, `data_version` is read at once and a few times shortly
    /// after, for commits made while paused (a commit is visible a moment after its write,
    /// see `RECHECKS`).
    fn watch_while_idle(&mut self) {
        let busy = self.lanes.iter().any(|lane| lane.sent_in_flight() > 0);
        if busy {
            self.last_busy = Instant::now();
        }
        let Some(watch) = &mut self.wal_watch else {
            return;
        };
        if busy && watch.is_watching() {
            watch.pause();
        } else if !busy && !watch.is_watching() && self.last_busy.elapsed() >= WATCH_AFTER_IDLE {
            if !watch.resume() {
                // Polled from now on, at the poll interval.
                self.wal_watch = None;
                self.wal_changed = crossbeam_channel::never();
            } else {
                self.look_for_commits_and_recheck();
            }
        }
    }

    /// Blocks until there is something to do or the next timer falls due.
    fn wait(&mut self, reports: &mut Vec<Report>) {
        let timeout = self.next_wake();
        select! {
            recv(self.stop) -> _ => self.stopping = true,
            recv(self.wake) -> _ => self.new_work(),
            recv(self.wal_changed) -> _ => self.look_for_commits_and_recheck(),
            recv(self.reports) -> msg => {
                if let Ok(r) = msg {
                    reports.push(r);
                }
            },
            default(timeout) => {},
        }
    }

    /// How long the writer may sleep: until the soonest of its timers (the poll, a re-read
    /// after a notification, a retry or a delayed row falling due, a deadline, a gate
    /// reopening, housekeeping), and not at all while a lane wants to claim. Nothing is
    /// looked at on a fixed beat while idle: an idle relay wakes for its poll alone.
    fn next_wake(&self) -> Duration {
        if self.lanes.iter().any(Lane::wants_claim) {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let now_ms = self.outbox.now_ms();
        let mut at = self.last_poll + self.poll_period();
        let mut soon = |t: Instant| at = at.min(t);
        if let Some((t, _)) = self.rechecks {
            soon(t);
        }
        // Work under way (answers to record, a prune going a page a turn, outcomes to write
        // again) keeps the writer on the poll interval, as it was before timers.
        let sent: usize = self.lanes.iter().map(Lane::sent_in_flight).sum();
        if sent > 0 || self.housekeeping.busy() {
            soon(now + self.poll_interval);
        }
        if sent == 0 && self.wal_watch.as_ref().is_some_and(|w| !w.is_watching()) {
            soon(self.last_busy + WATCH_AFTER_IDLE);
        }
        if !self.unrecorded.is_empty() {
            soon(self.retry_record_at);
        }
        for lane in &self.lanes {
            if let Some(look) = lane.held_back_for(self.poll_interval) {
                soon(now + look);
            }
            if let Some(t) = lane.lingering_until() {
                soon(t);
            }
            if let Some(renews) = lane.budget_renews_in() {
                soon(now + renews);
            }
            if let Some(due) = lane.spending().and_then(|s| s.sync_due()) {
                soon(due.max(self.retry_budgets_at));
            }
            if let Some(t) = lane.due_later_read_by() {
                soon(t);
            }
            if let Some(due) = lane.next_due() {
                soon(now + Duration::from_millis(due.saturating_sub(now_ms).max(0) as u64));
            }
        }
        if let Some(t) = self.next_expiry {
            soon(t);
        }
        if let Some(t) = self.housekeeping.next_due() {
            soon(t);
        }
        at.saturating_duration_since(now)
    }

    /// Something may be due that was not: every lane is worth a claim, the checkpointer
    /// should look, and new rows may carry deadlines sooner than the sweep's next.
    fn new_work(&mut self) {
        self.lanes.iter_mut().for_each(Lane::wake);
        self.wrote = true;
        let sweep = self.last_expiry + EXPIRY_INTERVAL;
        self.next_expiry = Some(self.next_expiry.map_or(sweep, |t| t.min(sweep)));
    }

    /// Reads `data_version`; returns whether another connection committed since the last
    /// read (and if so, wakes the lanes and re-reads the disabled destinations).
    fn look_for_commits(&mut self) -> bool {
        match self.data_version() {
            Ok(v) if v != self.data_version => {
                self.data_version = v;
                self.rechecks = None;
                self.load_disabled();
                self.new_work();
                true
            }
            Ok(_) => false,
            Err(e) => {
                log::warn!("relay {}: data_version poll failed: {e:#}", self.relay_id);
                false
            }
        }
    }

    /// Reads `data_version` now and, if no commit shows yet, [`RECHECKS`] more times, further
    /// apart each time: after a WAL notification, or after the watch was paused, a commit
    /// may be written and not yet published.
    fn look_for_commits_and_recheck(&mut self) {
        if !self.look_for_commits() {
            self.rechecks = Some((Instant::now() + recheck_pause(RECHECKS), RECHECKS));
        }
    }

    /// Notices work that no channel announced: retries and delayed rows falling due, and at
    /// each poll, commits by other connections or processes, leases of crashed relays
    /// expiring, destinations re-enabled, the clock jumping.
    fn poll_for_work(&mut self) {
        let now = self.outbox.now_ms();
        for lane in &mut self.lanes {
            lane.wake_if_retry_due(now);
            lane.release_lingering(false);
        }
        if let Some((at, left)) = self.rechecks {
            if Instant::now() >= at && !self.look_for_commits() {
                self.rechecks =
                    (left > 1).then(|| (Instant::now() + recheck_pause(left - 1), left - 1));
            }
        }
        self.housekeeping
            .gauges(&self.conn, now, self.outbox.disk_room());
        let elapsed = self.last_poll.elapsed();
        if elapsed < self.poll_period() {
            return;
        }
        self.last_poll = Instant::now();
        self.follow_the_clock();
        self.look_for_commits();
        if self.last_claim.elapsed() >= IDLE_CLAIM_INTERVAL {
            self.last_claim = Instant::now();
            self.lanes.iter_mut().for_each(Lane::wake);
        }
    }

    /// Notices a step of the wall clock since the last look (see [`ClockWatch`]) and moves
    /// what the old clock wrote with it; a move that could not be written (the app held the
    /// write lock past the busy timeout, as a migration at boot does) is tried again at the
    /// next look, and no event expires until it is written. Returns whether every step
    /// noticed is followed.
    fn follow_the_clock(&mut self) -> bool {
        let clock = self.outbox.clock();
        let top_id = queue::top_id(&self.conn).ok();
        if let Some(jump) = self
            .clock_watch
            .look(clock.now_ms(), clock.elapsed_ms(), top_id)
        {
            log::warn!(
                "relay {}: the wall clock stepped {} by about {} s; following it",
                self.relay_id,
                if jump < 0 { "back" } else { "forward" },
                jump.unsigned_abs() / 1000
            );
            let before = self.clock_step_ms();
            self.recent_step = Some((Instant::now(), before.saturating_add(jump)));
        }
        let Some(owed) = self.clock_watch.owed() else {
            return true;
        };
        if self.reanchor(owed) {
            self.clock_watch.followed();
            self.next_expiry = Some(Instant::now());
            true
        } else {
            false
        }
    }

    /// The step of the wall clock noticed within the grace (0: none), for the claims.
    fn clock_step_ms(&self) -> i64 {
        let grace = STEP_GRACE_MIN.max(self.poll_interval * 2);
        match self.recent_step {
            Some((at, by_ms)) if at.elapsed() < grace => by_ms,
            _ => 0,
        }
    }

    /// Follows a step of `jump.by_ms`: the deadlines of the pending events committed before
    /// it move by as much (a step back keeps none alive longer than it was given, a step
    /// forward expires none early), so do this relay's own leases, and due times written
    /// while the clock was ahead are re-anchored on now (see `queue::move_with_clock` for
    /// why due times do not move forward). Forgets retry times this relay scheduled under
    /// the old clock (the idle claim finds them again). Returns whether all was written.
    fn reanchor(&mut self, jump: ClockJump) -> bool {
        let now = self.outbox.now_ms();
        // Said once per jump at `warn`; the retries at each look, at `debug`.
        let retrying = self.clock_follow_failed;
        let say = |text: String| {
            if retrying {
                log::debug!("{text}");
            } else {
                log::warn!("{text}");
            }
        };
        // No write transaction when there is nothing to move (the start's re-anchoring).
        let moved = if jump.by_ms != 0 {
            (|| -> Result<usize> {
                let _write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
                let tx = self
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                let moved = queue::move_with_clock(&tx, jump.by_ms, jump.top_id, now)?;
                // Its own leases too, for the other relays that judge them on the wall clock.
                let _ = queue::move_own_leases(&tx, jump.by_ms, &self.lease_prefix)?;
                tx.commit()?;
                Ok(moved)
            })()
        } else {
            Ok(0)
        };
        let mut written = match moved {
            Ok(0) => true,
            Ok(n) => {
                log::info!(
                    "relay {}: moved the deadlines of {n} events with the clock",
                    self.relay_id
                );
                true
            }
            Err(e) => {
                say(format!(
                    "relay {}: moving deadlines with the clock failed, trying again at \
                     each poll (nothing expires meanwhile): {e:#}",
                    self.relay_id
                ));
                false
            }
        };
        for lane in &mut self.lanes {
            match queue::reanchor_future(&self.conn, lane.name(), now) {
                Ok(0) => {}
                Ok(n) => log::info!(
                    "relay {}: {n} events of {} were due in the future of a clock that was \
                     ahead; re-anchored on now",
                    self.relay_id,
                    lane.name()
                ),
                Err(e) => {
                    written = false;
                    say(format!(
                        "relay {}: re-anchoring due times failed, trying again at each poll: \
                         {e:#}",
                        self.relay_id
                    ));
                }
            }
            lane.forget_retry_times();
            lane.wake();
        }
        if written && retrying {
            log::warn!("relay {}: the clock's step is followed now", self.relay_id);
        }
        self.clock_follow_failed = !written;
        written
    }

    /// The disk is full, the reserve still held and nothing pending: gives the reserve back
    /// and starts the WAL over (see [`Writer::recover_room`]), at most every
    /// [`ROOM_RECOVERY_PAUSE`], and leaves the room free for the app. With nothing pending
    /// the relay's own writes may never fail (it keeps up), while every commit of the app's,
    /// in its process or another, does: the WAL cannot be copied back into a file that
    /// cannot grow, so it cannot start over, and a commit needs it to grow. The reserve is
    /// taken again only once the disk has room for it twice over (`DiskRoom::take`). While
    /// events are pending it stays the relay's, given back when one of its own writes
    /// fails ([`Writer::gave_room_for`]): given back sooner, another program filling the
    /// disk takes it, and nothing pending goes out.
    fn give_room_to_the_app(&mut self) {
        let room = self.outbox.disk_room();
        // Its own pause (sharing `gave_room_for`'s, a look that found events pending would
        // turn away the recovery the relay's own failing claim asks for right after), looked
        // at first: the reserve's size and the free space are system calls.
        if !room.under_pressure()
            || self
                .last_room_look
                .is_some_and(|t| t.elapsed() < ROOM_RECOVERY_PAUSE)
        {
            return;
        }
        self.last_room_look = Some(Instant::now());
        if room.held_bytes() == 0 || !room.is_full() {
            return;
        }
        match queue::any_pending(&self.conn) {
            Ok(false) => {}
            Ok(true) => return,
            Err(e) => {
                log::warn!(
                    "relay {}: cannot read what is pending: {e:#}",
                    self.relay_id
                );
                return;
            }
        }
        if let Err(e) = self.recover_room(false) {
            log::warn!(
                "relay {}: making room on the full disk failed: {e:#}",
                self.relay_id
            );
        }
    }

    /// If `e` says the disk is full, makes the room the relay's next writes need (see
    /// [`Writer::recover_room`]); returns whether it did just now, so the write is tried
    /// again at once.
    fn gave_room_for(&mut self, e: &crate::Error) -> bool {
        if !e.is_disk_full() {
            return false;
        }
        self.outbox.disk_room().mark_full();
        if self
            .last_room_recovery
            .is_some_and(|t| t.elapsed() < ROOM_RECOVERY_PAUSE)
        {
            return false;
        }
        self.last_room_recovery = Some(Instant::now());
        match self.recover_room(true) {
            Ok(recovered) => recovered,
            Err(e) => {
                log::warn!(
                    "relay {}: making room on the full disk failed: {e:#}",
                    self.relay_id
                );
                false
            }
        }
    }

    /// The disk is full: takes SQLite's write lock, gives the reserve back to the file
    /// system, and copies the WAL into the database (PASSIVE, on a connection of its own)
    /// while it holds the lock. The commits that filled the disk may need the file to grow
    /// when they are copied into it: the reserve's room is for that, and with the lock held
    /// no other writer takes it first (given back before the lock, an app committing flat
    /// out grew the WAL into it, the copy then found no room to grow the file, and no writer
    /// of the file could write again: tests/full_disk.rs, 1 run in 4 under load). With every
    /// frame copied the next write, the relay's or the app's, starts the WAL over, into the
    /// room the WAL file already has, which needs no free byte. With `keep`, for events
    /// pending, it then takes back (the lock still held) whatever is still free, up to the
    /// reserve's size, so the room the copy did not need stays the outbox's; without, the
    /// room stays free for the app's commits until the disk has room again. Returns whether
    /// every frame was copied. When the lock cannot be had (another writer holds it past
    /// the busy timeout) nothing is given back.
    fn recover_room(&mut self, keep: bool) -> Result<bool> {
        let room = self.outbox.disk_room();
        let (mut locked, mut given, mut kept) = (false, 0, None);
        let copied: std::result::Result<bool, crate::Error> = (|| {
            let checkpoint = self.outbox.unpooled_connection()?;
            let lock = self.outbox.unpooled_connection()?;
            let _blocking = self.outbox.right_of_way().blocking_checkpoint();
            lock.execute_batch("BEGIN IMMEDIATE")?;
            locked = true;
            given = room.disk_full();
            let (busy, frames, copied): (i64, i64, i64) =
                checkpoint.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            if keep {
                kept = Some(room.refill());
            }
            lock.execute_batch("ROLLBACK")?;
            Ok(busy == 0 && copied >= frames)
        })();
        if !locked {
            let why = copied
                .as_ref()
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            log::warn!(
                "relay {}: the disk is full, and SQLite's write lock was not had to make room \
                 ({why}): the outbox's reserve ({} bytes, {}) is kept for the next try",
                self.relay_id,
                room.held_bytes(),
                room.reserve_path().display(),
            );
            return copied;
        }
        let kept = match kept {
            Some(bytes) => format!("kept {bytes} bytes back; delivering on"),
            None if keep => "delivering on".to_owned(),
            None => "nothing pending: the room is left to the app's commits until the disk has \
                     room"
                .to_owned(),
        };
        log::warn!(
            "relay {}: the disk is full: gave back the outbox's reserve ({given} bytes, {}); \
             WAL checkpoint: {}; {kept}",
            self.relay_id,
            room.reserve_path().display(),
            match &copied {
                Ok(true) => "every frame copied".to_owned(),
                Ok(false) => "not every frame copied (a reader holds an older snapshot, or \
                              another checkpoint was under way)"
                    .to_owned(),
                Err(e) => format!("failed: {e:#}"),
            }
        );
        copied
    }

    /// Reads which destinations are disabled (an operator may have changed it).
    fn load_disabled(&mut self) {
        match disabled::reasons(&self.conn) {
            Ok(mut disabled) => {
                for lane in &mut self.lanes {
                    lane.set_disabled(disabled.remove(lane.name()));
                }
            }
            Err(e) => log::warn!("relay {}: cannot read destinations: {e:#}", self.relay_id),
        }
    }

    fn data_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?)
    }

    fn claim(&mut self, index: usize) -> Result<()> {
        let lane = &self.lanes[index];
        if self.stopping || !lane.wants_claim() {
            return Ok(());
        }
        let limit = lane.claim_limit();
        self.claim_seq += 1;
        let owner = format!("{}{}", self.lease_prefix, self.claim_seq);
        let default_source = self.outbox.default_source();
        let request = ClaimRequest {
            destination: lane.name(),
            default_source: &default_source,
            owner: &owner,
            spare_leases: &self.lease_prefix,
            clock_step_ms: self.clock_step_ms(),
            lease_ms: self.lease_ms,
            limit: limit as i64,
            max_bytes: lane.claim_max_bytes() as i64,
            numbering_bound: Some(numbering::CATCH_UP_CHUNK),
            min_priority: lane.claim_min_priority(),
            // Read under the write lock, below.
            now: 0,
        };
        let write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
        // The lease as this relay counts it: from before the claim, on the monotonic clock.
        let lease_ends = Instant::now() + Duration::from_millis(self.lease_ms.max(0) as u64);
        // Nothing is sent before its commit is on disk (see `barrier`).
        let outbox = &self.outbox;
        let mut now = 0;
        let mut claimed = self.barrier.claim(&mut self.conn, write, |conn| {
            // The time is read once the claim holds the write lock: read before, while an
            // app's transaction held it, the events that transaction stamped later than
            // that were not due yet, and a claim of its 250 events took 61 (the rest went
            // in requests of their own, one of a single event under load).
            now = outbox.now_ms();
            queue::claim(conn, &ClaimRequest { now, ..request })
        })?;
        // A claim that would number more than a bound of rows not numbered yet under the
        // write lock (an urgent event behind a backlog committed offline) took nothing of
        // them: the backlog is numbered in steps of its own transactions (the app's commits
        // go between them), then claimed again, numbering at most what was committed since.
        // A backlog drained oldest first is never stepped: each claim numbers its own rows.
        if let Some(through) = claimed.numbering_needed {
            // Each step's writes are the checkpointer's to copy: unseen, a million rows
            // numbered grew the WAL to the app's automatic checkpoint, run inside an app
            // commit (100-150 ms, every second or so of the steps).
            let right_of_way = self.outbox.right_of_way();
            let kick = &self.checkpoint_kick;
            numbering::catch_up_through(&mut self.conn, through, numbering::RELAY_STEP, || {
                let _ = kick.try_send(());
                right_of_way.relay_write(STEP_GIVE_WAY_LIMIT)
            })?;
            if claimed.is_empty() {
                let write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
                claimed = self.barrier.claim(&mut self.conn, write, |conn| {
                    now = outbox.now_ms();
                    let again = ClaimRequest {
                        numbering_bound: None,
                        now,
                        ..request
                    };
                    queue::claim(conn, &again)
                })?;
            }
        }
        self.last_claim = Instant::now();
        for row in &claimed.unreadable {
            self.counters.record(&WriteBack::Dead {
                error: row.error.clone(),
            });
            log::warn!(
                "row {} of {}: dead-lettered: {}",
                row.id,
                lane.name(),
                row.error
            );
        }
        let more_due = claimed.events.len() + claimed.unreadable.len() == limit;
        let urgent = claimed.urgent;
        if !claimed.events.is_empty() || !claimed.unreadable.is_empty() {
            self.wrote = true;
        }
        for event in &mut claimed.events {
            event.lease_ends = Some(lease_ends);
        }
        let events = claimed.events;
        for event in &events {
            log::debug!(
                "event {}: claimed by {owner} for {}",
                event.event_id,
                lane.name()
            );
        }
        self.lanes[index].dispatch(events, more_due, urgent);
        if !more_due {
            // Caught up: sleep until the first row not yet due falls due, not on a timer.
            self.lanes[index].caught_up_at(now);
        }
        Ok(())
    }

    /// Reads when each caught-up lane's first row not yet due falls due, once none of its
    /// requests is out (see [`Lane::due_later_to_read`]).
    fn read_due_times(&mut self) {
        for lane in &mut self.lanes {
            let Some(since) = lane.due_later_to_read() else {
                continue;
            };
            match queue::next_due_after(&self.conn, lane.name(), since, &self.lease_prefix) {
                Ok(at) => lane.set_due_later(at),
                Err(e) => {
                    log::warn!("relay {}: next due time unknown: {e:#}", self.relay_id);
                    lane.skip_due_later_read();
                }
            }
        }
    }

    /// Adds the outcomes whose write failed before, once their pause is over. They are kept
    /// however long that takes: the write is fenced by each event's lease, so an outcome
    /// whose lease another relay took over meanwhile is discarded then, and one whose lease
    /// nobody took is still this relay's to record (its claims spare its own leases).
    fn take_unrecorded(&mut self, reports: &mut Vec<Report>) {
        if self.unrecorded.is_empty() || Instant::now() < self.retry_record_at {
            return;
        }
        reports.append(&mut self.unrecorded);
    }

    /// Records a batch of reports in one transaction and books them in their lanes.
    fn record(&mut self, reports: &mut Vec<Report>) {
        let now = self.outbox.now_ms();
        // Batches refused for their content go out again in halves, nothing recorded; the
        // events that cannot (the lane closed) are handed back as not sent.
        let mut not_sent = Vec::new();
        for report in reports.iter_mut() {
            let split = report.take_split();
            if split.is_empty() {
                continue;
            }
            let lane = report.lane();
            log::info!(
                "relay {}: a batch of {} to {} was refused for its content; sending it again in halves",
                self.relay_id,
                split.len(),
                self.lanes[lane].name()
            );
            let left = self.lanes[lane].split_again(split);
            if !left.is_empty() {
                not_sent.push(Report::not_sent(lane, left, &self.policy, now));
            }
        }
        reports.retain(|r| r.len() > 0);
        reports.append(&mut not_sent);
        if reports.is_empty() {
            return;
        }
        for report in reports.iter() {
            self.lanes[report.lane()].finished(report.events());
            if report.all_delivered() {
                self.lanes[report.lane()].delivered_request(report.len());
            }
            if let Some(GateChange::Disable { reason }) = report.gate_change() {
                self.disable(report.lane(), reason, now);
            }
        }
        let outcomes: Vec<(&OutboundEvent, &WriteBack)> = reports
            .iter()
            .flat_map(|r| r.decided().map(|(e, d)| (e, &d.write_back)))
            .collect();
        let recorded = match self.write(&outcomes, now) {
            Ok(recorded) => recorded,
            Err(e) => {
                // Kept and written again shortly: the leases are still ours, and dropping
                // the outcomes would send delivered events again once they expire.
                log::warn!(
                    "relay {}: could not record {} outcomes, writing them again shortly: {e:#}",
                    self.relay_id,
                    outcomes.len()
                );
                drop(outcomes);
                self.unrecorded.append(reports);
                // At once if a full disk just got the reserve back.
                self.retry_record_at = if self.gave_room_for(&e) {
                    Instant::now()
                } else {
                    Instant::now() + RECORD_RETRY_PAUSE
                };
                return;
            }
        };
        let lanes = reports
            .iter()
            .flat_map(|r| r.events().iter().map(|_| r.lane()));
        for (((event, write_back), recorded), lane) in outcomes.iter().zip(recorded).zip(lanes) {
            if !recorded {
                self.counters.record_lease_lost();
                log::warn!(
                    "event {}: lease {} was taken over; outcome discarded",
                    event.event_id,
                    event.lease_owner
                );
                continue;
            }
            self.counters.record(write_back);
            self.booked(lane, event, write_back, now);
        }
        reports.clear();
    }

    /// Takes events past their deadline out of pending (never one in flight), at most every
    /// [`EXPIRY_INTERVAL`]: a seek in the expiring index when there is nothing to do.
    fn expire_due(&mut self) {
        if self.next_expiry.is_none_or(|t| Instant::now() < t) {
            return;
        }
        // A jump of the clock since the last look is followed first: deadlines written on
        // the clock of before move with it, and none expires while that move is owed.
        if !self.follow_the_clock() {
            self.next_expiry = Some(Instant::now() + EXPIRY_INTERVAL);
            return;
        }
        self.last_expiry = Instant::now();
        self.next_expiry = Some(self.last_expiry + EXPIRY_INTERVAL);
        let now = self.outbox.now_ms();
        // Read first: the write transaction only when there is something to expire.
        match queue::earliest_deadline(&self.conn) {
            Ok(Some(deadline)) if deadline <= now => {}
            Ok(later) => {
                // Sleep until the earliest deadline (no sooner than the sweep's interval).
                self.next_expiry = later.map(|deadline| {
                    let left = Duration::from_millis((deadline - now) as u64);
                    self.last_expiry + left.max(EXPIRY_INTERVAL)
                });
                return;
            }
            Err(e) => {
                log::warn!(
                    "relay {}: looking for expired events failed: {e:#}",
                    self.relay_id
                );
                return;
            }
        }
        let swept = (|| -> Result<Vec<queue::ExpiredRow>> {
            let _write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let rows = queue::expire(&tx, now, MAX_ACKS_PER_TX as i64, &self.lease_prefix)?;
            tx.commit()?;
            Ok(rows)
        })();
        match swept {
            Ok(rows) => {
                if !rows.is_empty() {
                    // Their keys' next events were unparked.
                    self.lanes.iter_mut().for_each(Lane::wake);
                    self.wrote = true;
                }
                if rows.len() >= MAX_ACKS_PER_TX {
                    // A full page: more are past their deadline, and a claim steps over
                    // each of them until it is marked. Sweep again on the next turn.
                    self.next_expiry = Some(Instant::now());
                }
                for row in rows {
                    crate::observe::telemetry::expired(&row.event_type, &row.destination);
                    log::info!("event {}: expired before delivery", row.event_id);
                    self.outbox.subscribers().publish(|| DeliveryNotice {
                        event_id: row.event_id,
                        destination: row.destination,
                        outcome: DeliveryOutcome::Expired,
                        at_ms: now,
                    });
                }
            }
            Err(e) => {
                log::warn!("relay {}: expiring events failed: {e:#}", self.relay_id);
                self.gave_room_for(&e);
            }
        }
    }

    /// Tells the app's subscribers, if any (never waiting for them).
    fn notify(&self, event: &OutboundEvent, outcome: DeliveryOutcome, now: i64) {
        self.outbox.subscribers().publish(|| DeliveryNotice {
            event_id: event.event_id.clone(),
            destination: event.destination.clone(),
            outcome,
            at_ms: now,
        });
    }

    /// Logs and counts one recorded outcome, and remembers a retry's due time.
    fn booked(&mut self, lane: usize, event: &OutboundEvent, write_back: &WriteBack, now: i64) {
        match write_back {
            WriteBack::Delivered => {
                crate::observe::telemetry::delivered(
                    &event.event_type,
                    &event.destination,
                    now - event.created_at,
                );
                log::debug!("event {}: delivered", event.event_id);
                self.notify(event, DeliveryOutcome::Delivered, now);
            }
            WriteBack::Retry {
                available_at,
                error,
            } => {
                crate::observe::telemetry::retried(&event.event_type, &event.destination);
                self.lanes[lane].retry_at(*available_at);
                log::info!(
                    "event {}: attempt {} failed ({error:#}), retrying in {} ms",
                    event.event_id,
                    event.attempts + 1,
                    available_at - now
                );
            }
            WriteBack::Dead { error } => {
                crate::observe::telemetry::dead(&event.event_type, &event.destination);
                log::warn!("event {}: dead-lettered: {error:#}", event.event_id);
                let outcome = DeliveryOutcome::Dead {
                    error: error.clone(),
                };
                self.notify(event, outcome, now);
            }
            WriteBack::Release { error: Some(e), .. } => {
                log::debug!("event {}: released ({e:#})", event.event_id)
            }
            WriteBack::Release { error: None, .. } => {}
        }
    }

    /// Persists a 410's disabling of a destination (the worker has already closed its gate).
    fn disable(&mut self, lane: usize, reason: &str, now: i64) {
        let lane = &mut self.lanes[lane];
        if !lane.disable(reason) {
            return;
        }
        log::warn!("destination {}: {reason}", lane.name());
        if let Err(e) = disabled::disable(&self.conn, lane.name(), reason, now) {
            log::error!("destination {}: cannot record 410: {e:#}", lane.name());
        }
    }

    /// Records every outcome in one transaction; returns, per outcome, whether its lease was
    /// still ours (and so whether it was recorded).
    fn write(&mut self, outcomes: &[(&OutboundEvent, &WriteBack)], now: i64) -> Result<Vec<bool>> {
        let _write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let recorded = queue::record(&tx, outcomes, now)?;
        sync_budgets(
            &self.lanes,
            &self.relay_id,
            &tx,
            Instant::now(),
            &mut self.budget_write_failing,
        );
        tx.commit()?;
        Ok(recorded)
    }

    /// Writes the spending of the budgets whose write is due by `by` in a transaction of its
    /// own (when no outcomes came to carry it).
    fn keep_budgets(&mut self, by: Instant) {
        let due = self.lanes.iter().any(|lane| {
            lane.spending()
                .and_then(|s| s.sync_due())
                .is_some_and(|due| due <= by)
        });
        if !due || Instant::now() < self.retry_budgets_at {
            return;
        }
        let _write = self.outbox.right_of_way().relay_write(GIVE_WAY_LIMIT);
        let written = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(crate::Error::from)
            .and_then(|tx| {
                sync_budgets(
                    &self.lanes,
                    &self.relay_id,
                    &tx,
                    by,
                    &mut self.budget_write_failing,
                );
                tx.commit().map_err(crate::Error::from)
            });
        match written {
            Ok(()) => self.wrote = true,
            Err(e) => {
                say_budget_write(&self.relay_id, Err(&e), &mut self.budget_write_failing);
                self.retry_budgets_at = Instant::now() + RECORD_RETRY_PAUSE;
            }
        }
    }

    /// Takes each data budget's period from the file (a relay restarted within a period
    /// spends on from what it had spent) and writes the relay's limits there.
    fn load_budgets(&mut self) {
        for lane in &self.lanes {
            let Some(spending) = lane.spending() else {
                continue;
            };
            if let Err(e) = spending.load(&self.conn) {
                log::warn!(
                    "relay {}: cannot read what the budget of {} has spent: {e:#}",
                    self.relay_id,
                    lane.name()
                );
            }
        }
    }

    /// Tells the app (a notice, and the log) when a destination starts holding events for
    /// its data budget and when a new period lets them go; wakes a lane whose budget is
    /// whole again.
    fn announce_budgets(&mut self) {
        let now = self.outbox.now_ms();
        for lane in &mut self.lanes {
            let Some(spending) = lane.spending() else {
                continue;
            };
            let Some(change) = spending.take_change() else {
                continue;
            };
            let outcome = match change {
                HoldChange::Holding { used, period_ends } => {
                    let which = spending.exempt_priority().map_or_else(
                        || "its events".to_string(),
                        |p| format!("its events below priority {p}"),
                    );
                    log::warn!(
                        "relay {}: {} has spent its data budget ({used} of {} bytes); {which} \
                         wait until the period ends ({})",
                        self.relay_id,
                        lane.name(),
                        spending.used_and_limit().1,
                        crate::wire::rfc3339_millis(period_ends)
                    );
                    DeliveryOutcome::BudgetSpent {
                        period_ends_ms: period_ends,
                    }
                }
                HoldChange::Resumed => {
                    log::info!(
                        "relay {}: a new period of {}'s data budget: events go again",
                        self.relay_id,
                        lane.name()
                    );
                    lane.wake();
                    DeliveryOutcome::BudgetRenewed
                }
            };
            let destination = lane.name().to_string();
            self.outbox.subscribers().publish(|| DeliveryNotice {
                event_id: String::new(),
                destination,
                outcome,
                at_ms: now,
            });
        }
    }

    fn in_flight(&self) -> usize {
        self.lanes.iter().map(Lane::in_flight).sum()
    }

    /// Stops claiming, hands back events no worker started, and waits (bounded) for the rest.
    fn shut_down(mut self, mut reports: Vec<Report>) -> ShutdownReport {
        let deadline = Instant::now() + self.shutdown_timeout;
        // One more try for outcomes whose write failed.
        reports.append(&mut self.unrecorded);
        let now = self.outbox.now_ms();
        let mut unstarted = Vec::new();
        for (index, lane) in self.lanes.iter_mut().enumerate() {
            for job in lane.close() {
                unstarted.push(Report::not_sent(index, job, &self.policy, now));
            }
        }
        let released = unstarted.iter().map(Report::len).sum();
        self.record(&mut unstarted);
        let mut finished = 0;
        while self.in_flight() > 0 || !reports.is_empty() {
            if !reports.is_empty() {
                finished += reports.iter().map(Report::len).sum::<usize>();
                self.record(&mut reports);
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok(r) => {
                    reports.push(r);
                    self.drain_reports(&mut reports);
                }
                Err(_) => break,
            }
        }
        // Outcomes whose write failed (the app held the write lock, the disk was full) are
        // written again until the deadline: dropped, as they were while the summary said
        // nothing was left, their events went out again once their leases ended.
        while !self.unrecorded.is_empty() && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(RECORD_RETRY_PAUSE.min(left));
            let mut again = std::mem::take(&mut self.unrecorded);
            self.record(&mut again);
        }
        let unrecorded: usize = self.unrecorded.iter().map(Report::len).sum();
        if unrecorded > 0 {
            log::warn!(
                "relay {}: {unrecorded} outcomes could not be written by the shutdown \
                 deadline; their events go out again once their leases end",
                self.relay_id
            );
        }
        let abandoned = self.in_flight();
        if abandoned > 0 {
            log::warn!(
                "relay {}: {abandoned} deliveries still running at shutdown; their leases \
                 expire and the events will be delivered again",
                self.relay_id
            );
        }
        // What the budgets spent since their last write: all of it, so the next relay of
        // the period spends on from here.
        self.keep_budgets(Instant::now() + SYNC_EVERY);
        let restarts = self.counters.writer_restarts();
        if let Some(size) = self.pool_cache_size {
            restore_page_cache(&self.conn, size, &self.relay_id);
        }
        ShutdownReport::new(released, finished, abandoned, restarts).with_unrecorded(unrecorded)
    }
}

/// Adds what each data budget spent since it was last written to the file, for those whose
/// write is due by `by` ([`Spending::sync_due`]: a change of holding at once, spending at
/// most every second), inside the caller's transaction (the outcomes' when there are
/// some), and reads back what every relay of the file has spent. A failure is logged and
/// tried again: it must not keep the outcomes from being recorded.
fn sync_budgets(
    lanes: &[Lane],
    relay_id: &str,
    tx: &rusqlite::Connection,
    by: Instant,
    failing: &mut bool,
) {
    for lane in lanes {
        let Some(spending) = lane.spending() else {
            continue;
        };
        if spending.sync_due().is_none_or(|due| due > by) {
            continue;
        }
        let written = spending.sync(tx);
        if written.is_ok() {
            let (used, limit) = spending.used_and_limit();
            crate::observe::telemetry::budget(lane.name(), used, limit);
        }
        say_budget_write(relay_id, written.as_ref().map(|_| ()), failing);
    }
}

/// Says a failure to write the budgets' spending once a spell (a warning: the spending is
/// kept in memory and written at the next success, but a crash meanwhile loses it), and
/// its end.
fn say_budget_write(
    relay_id: &str,
    written: std::result::Result<(), &crate::Error>,
    failing: &mut bool,
) {
    match written {
        Err(e) if !*failing => {
            *failing = true;
            log::warn!(
                "relay {relay_id}: cannot keep what the data budgets have spent in the file \
                 ({e:#}); counted in memory and written again each second (said once)"
            );
        }
        Err(e) => log::debug!("relay {relay_id}: budgets' spending still not written: {e:#}"),
        Ok(()) if *failing => {
            *failing = false;
            log::info!("relay {relay_id}: the data budgets' spending is written again");
        }
        Ok(()) => {}
    }
}

/// Sets the writer's connection to [`WRITER_CACHE_KIB`] of page cache; returns the size it
/// had, to give back to the pool. A failure only costs memory, so it is logged, not fatal.
fn shrink_page_cache(conn: &rusqlite::Connection, relay_id: &str) -> Option<i64> {
    let shrink = || -> rusqlite::Result<i64> {
        let before: i64 = conn.query_row("PRAGMA cache_size", [], |r| r.get(0))?;
        conn.execute_batch(&format!("PRAGMA cache_size = -{WRITER_CACHE_KIB}"))?;
        Ok(before)
    };
    match shrink() {
        Ok(before) => Some(before),
        Err(e) => {
            log::warn!("relay {relay_id}: could not shrink the writer's page cache: {e:#}");
            None
        }
    }
}

/// Gives the writer's connection back the page cache size it had in the pool.
fn restore_page_cache(conn: &rusqlite::Connection, size: i64, relay_id: &str) {
    if let Err(e) = conn.execute_batch(&format!("PRAGMA cache_size = {size}")) {
        log::warn!("relay {relay_id}: could not restore the connection's page cache: {e:#}");
    }
}

/// The owner prefix of this writer's leases: the relay's id and a random part, new for each
/// incarnation of the writer.
fn new_lease_prefix(relay_id: &str) -> String {
    format!("{relay_id}:{:016x}:", fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_size(conn: &rusqlite::Connection) -> i64 {
        conn.query_row("PRAGMA cache_size", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn looks_after_a_notification_double_their_pause_and_span_a_quarter_second() {
        // The first look after the immediate one leaves RECHECKS - 1 after it … the last none.
        let pauses: Vec<u128> = (0..RECHECKS)
            .rev()
            .map(|left| recheck_pause(left + 1).as_millis())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(pauses.iter().sum::<u128>(), 255);
    }

    #[test]
    fn the_writer_runs_on_a_small_page_cache_and_gives_the_pools_size_back() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("PRAGMA cache_size = -3000").unwrap();
        assert_eq!(shrink_page_cache(&conn, "test"), Some(-3000));
        assert_eq!(cache_size(&conn), -WRITER_CACHE_KIB);
        restore_page_cache(&conn, -3000, "test");
        assert_eq!(cache_size(&conn), -3000);
    }
}
