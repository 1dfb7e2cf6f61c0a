//! The relay's writer thread: the only part of a relay that touches SQLite.
//!
//! It claims due events for each destination ("lane"), hands them to that lane's delivery
//! workers through a bounded channel, and writes their outcomes back, many per transaction.
//! Owning every write in one thread means the relay never fights itself for SQLite's single
//! write lock; giving each destination its own lane means one that is down or slow never
//! holds back another.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use r2d2::PooledConnection;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::TransactionBehavior;

use crate::claim::{self, ClaimRequest, WriteBack};
use crate::destination::Batching;
use crate::destination_state;
use crate::error::Result;
use crate::outbox::Outbox;
use crate::reachability::Reachability;
use crate::relay::{Completion, Counters, Outcome, ShutdownReport};
use crate::relay_config::RelayConfig;
use crate::transport::{Attempt, OutboundEvent};
use crate::wire::encoded_size_bound;

/// Outcomes written back in one transaction at most: enough to amortize the commit, few
/// enough that the write lock is held well under a millisecond, so the app's own commits
/// never wait long behind the relay.
const MAX_ACKS_PER_TX: usize = 200;
/// How long the writer may wait to gather more outcomes into one ack transaction.
const ACK_WINDOW: Duration = Duration::from_millis(1);
/// Below this many requests in flight, outcomes are recorded at once.
const ACK_GATHER_MIN_IN_FLIGHT: usize = 8;
/// How often an idle relay claims even without a sign of new work, to pick up leases that a
/// crashed relay left behind.
const IDLE_CLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// One unit of work for a delivery worker: one request's worth of events.
pub(crate) type Job = Vec<OutboundEvent>;

/// One destination as the writer drives it.
pub(crate) struct Lane {
    pub name: String,
    pub batch: Option<Batching>,
    /// Events one claim takes at most, and events this lane may have in flight.
    claim_batch: usize,
    max_in_flight: usize,
    pub reach: Arc<Reachability>,
    pub work_tx: Option<Sender<Job>>,
    pub work_rx: Receiver<Job>,
    in_flight: HashSet<i64>,
    claim_due: bool,
    /// Earliest retry this relay scheduled itself (unix ms, clock time).
    next_due_ms: Option<i64>,
    /// Why the destination is disabled, if it is (mirrored in `reach` for the workers).
    disabled: Option<String>,
}

impl Lane {
    /// A lane for one destination. A batching destination claims enough for a batch per
    /// worker at once (and may have four such claims in flight): per event, the claim and
    /// ack transactions then cost a fraction of what they cost one event at a time.
    pub fn new(
        name: String,
        batch: Option<Batching>,
        workers: usize,
        config: &RelayConfig,
        reach: Arc<Reachability>,
        work: (Sender<Job>, Receiver<Job>),
    ) -> Lane {
        let claim_batch = match batch {
            Some(b) => config.claim_batch.max(b.max_events.saturating_mul(workers)),
            None => config.claim_batch,
        };
        Lane {
            name,
            batch,
            claim_batch,
            max_in_flight: config.max_in_flight.max(claim_batch.saturating_mul(4)),
            reach,
            work_tx: Some(work.0),
            work_rx: work.1,
            in_flight: HashSet::new(),
            claim_due: true,
            next_due_ms: None,
            disabled: None,
        }
    }

    /// Whether claiming now would be pointless: the destination is closed, or the claim
    /// would be a small one. Waiting until a whole batch fits keeps claims (each a write
    /// transaction) few and large while the workers still have queued work.
    fn blocked(&self, now: i64) -> bool {
        let room = self.max_in_flight.saturating_sub(self.in_flight.len());
        let worth_it = self.claim_batch.min(self.max_in_flight / 2).max(1);
        (room < worth_it && !self.in_flight.is_empty())
            || room == 0
            || self.reach.is_closed(now)
            || (self.reach.is_suspect() && !self.in_flight.is_empty())
    }

    /// Splits claimed events into requests: one event each, or batches within both limits.
    fn group_into_jobs(&self, events: Vec<OutboundEvent>) -> Vec<Job> {
        let Some(batch) = self.batch else {
            return events.into_iter().map(|e| vec![e]).collect();
        };
        let mut jobs: Vec<Job> = Vec::new();
        let mut bytes = 0;
        for event in events {
            let size = encoded_size_bound(&event) + 1;
            match jobs.last_mut() {
                Some(job) if job.len() < batch.max_events && bytes + size <= batch.max_bytes => {
                    bytes += size;
                    job.push(event);
                }
                _ => {
                    bytes = size + 2;
                    jobs.push(vec![event]);
                }
            }
        }
        jobs
    }
}

pub(crate) struct Writer {
    pub outbox: Outbox,
    pub conn: PooledConnection<SqliteConnectionManager>,
    pub config: RelayConfig,
    pub relay_id: String,
    pub lanes: Vec<Lane>,
    pub done_rx: Receiver<Completion>,
    pub stop_rx: Receiver<()>,
    pub counters: Arc<Counters>,
    /// Whether anything was written since the last checkpoint.
    pub wrote: bool,
}

/// Loop state that only the writer sees.
pub(crate) struct State {
    pub last_gauges: Option<Instant>,
    /// When the WAL was last checkpointed.
    pub last_checkpoint: Instant,
    pub claim_seq: u64,
    /// When retention last started, and rows pruned in the current run (if one is going on).
    pub last_retention: Option<Instant>,
    pub pruning: Option<usize>,
    pub stopping: bool,
    pub data_version: i64,
    pub last_poll: Instant,
    pub last_claim: Instant,
}

impl Writer {
    pub fn run(mut self) -> ShutdownReport {
        let mut state = State {
            last_gauges: None,
            last_checkpoint: Instant::now(),
            claim_seq: 0,
            last_retention: None,
            pruning: None,
            stopping: false,
            data_version: self.data_version().unwrap_or(0),
            last_poll: Instant::now(),
            last_claim: Instant::now(),
        };
        self.load_disabled();
        let mut completions = Vec::new();
        while !state.stopping {
            self.drain_completions(&mut completions);
            if !completions.is_empty() {
                self.gather_more(&mut completions);
                self.apply(&mut completions);
            }
            self.poll_for_work(&mut state);
            self.retention(&mut state);
            self.checkpoint(&mut state);
            for lane in 0..self.lanes.len() {
                if let Err(e) = self.claim(&mut state, lane) {
                    // Not at once: a broken disk would otherwise turn this into a hot loop.
                    // The idle claim tries again within a second.
                    self.lanes[lane].claim_due = false;
                    log::warn!("relay {}: claim failed, will retry: {e}", self.relay_id);
                }
            }
            self.wait(&mut state, &mut completions);
        }
        self.shut_down(completions)
    }

    fn drain_completions(&self, into: &mut Vec<Completion>) {
        while into.len() < MAX_ACKS_PER_TX {
            match self.done_rx.try_recv() {
                Ok(c) => into.push(c),
                Err(_) => break,
            }
        }
    }

    /// While many requests are in flight, waits a moment for more of them to finish, so one
    /// transaction records many outcomes instead of one each: commits are the writer's main
    /// cost. Bounded by `ACK_WINDOW`; with little in flight it does not wait at all.
    fn gather_more(&self, completions: &mut Vec<Completion>) {
        let done = |c: &Vec<Completion>| c.iter().map(|c| c.events.len()).sum::<usize>();
        let pending = self.in_flight().saturating_sub(done(completions));
        if pending < ACK_GATHER_MIN_IN_FLIGHT {
            return;
        }
        if done(completions) >= (pending / 2).min(MAX_ACKS_PER_TX) {
            return;
        }
        // A plain sleep, not a timed receive per completion: on two cores the receive's
        // spinning would take CPU from the very workers it waits for.
        std::thread::sleep(ACK_WINDOW);
        self.drain_completions(completions);
    }

    /// Blocks until there is something to do, or the poll interval passes.
    fn wait(&mut self, state: &mut State, completions: &mut Vec<Completion>) {
        let now = self.outbox.now_ms();
        let more_to_claim = self.lanes.iter().any(|l| l.claim_due && !l.blocked(now));
        // More work is waiting to be claimed: only look at the channels.
        let timeout = if more_to_claim {
            Duration::ZERO
        } else {
            self.config.poll_interval
        };
        let mut woken = false;
        select! {
            recv(self.stop_rx) -> _ => state.stopping = true,
            recv(self.outbox.inner.wake_rx) -> _ => woken = true,
            recv(self.done_rx) -> msg => {
                if let Ok(c) = msg {
                    completions.push(c);
                }
            },
            default(timeout) => {},
        }
        if woken {
            self.lanes.iter_mut().for_each(|l| l.claim_due = true);
        }
    }

    /// Notices work that no channel announced: commits by other connections or processes,
    /// retries falling due, leases of crashed relays expiring, destinations re-enabled.
    fn poll_for_work(&mut self, state: &mut State) {
        if state.last_poll.elapsed() < self.config.poll_interval {
            return;
        }
        state.last_poll = Instant::now();
        match self.data_version() {
            Ok(v) if v != state.data_version => {
                state.data_version = v;
                self.wrote = true;
                self.load_disabled();
                self.lanes.iter_mut().for_each(|l| l.claim_due = true);
            }
            Ok(_) => {}
            Err(e) => log::warn!("relay {}: data_version poll failed: {e}", self.relay_id),
        }
        let now = self.outbox.now_ms();
        for lane in &mut self.lanes {
            if lane.next_due_ms.is_some_and(|due| due <= now) {
                lane.next_due_ms = None;
                lane.claim_due = true;
            }
        }
        if state.last_claim.elapsed() >= IDLE_CLAIM_INTERVAL {
            state.last_claim = Instant::now();
            self.lanes.iter_mut().for_each(|l| l.claim_due = true);
        }
        self.gauges(state);
    }

    /// Reads which destinations are disabled (an operator may have changed it).
    fn load_disabled(&mut self) {
        match destination_state::reasons(&self.conn) {
            Ok(mut disabled) => {
                for lane in &mut self.lanes {
                    lane.disabled = disabled.remove(&lane.name);
                    lane.reach.set_disabled(lane.disabled.is_some());
                }
            }
            Err(e) => log::warn!("relay {}: cannot read destinations: {e}", self.relay_id),
        }
    }

    fn data_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?)
    }

    fn claim(&mut self, state: &mut State, index: usize) -> Result<()> {
        let now = self.outbox.now_ms();
        let lane = &self.lanes[index];
        if !lane.claim_due || state.stopping || lane.blocked(now) {
            return Ok(());
        }
        if lane.work_tx.is_none() {
            return Ok(());
        }
        // After unanswered attempts, send a single probe rather than a batch that would only
        // time out request by request.
        let limit = if lane.reach.is_suspect() {
            1
        } else {
            (lane.max_in_flight - lane.in_flight.len()).min(lane.claim_batch)
        };
        state.claim_seq += 1;
        let owner = format!("{}:{}", self.relay_id, state.claim_seq);
        let events = claim::claim(
            &self.conn,
            &ClaimRequest {
                destination: &lane.name,
                default_source: &self.outbox.inner.default_source,
                owner: &owner,
                now,
                lease_ms: self.config.lease.as_millis() as i64,
                limit: limit as i64,
            },
        )?;
        state.last_claim = Instant::now();
        let lane = &mut self.lanes[index];
        lane.claim_due = events.len() == limit;
        for job in lane.group_into_jobs(events) {
            for event in &job {
                log::debug!(
                    "event {}: claimed by {owner} for {}",
                    event.event_id,
                    lane.name
                );
                lane.in_flight.insert(event.id);
            }
            let Some(work_tx) = &lane.work_tx else { break };
            // The channel holds max_in_flight jobs, so this never blocks.
            if let Err(e) = work_tx.try_send(job) {
                for event in e.into_inner() {
                    lane.in_flight.remove(&event.id);
                    log::error!(
                        "event {}: work queue full, left to its lease",
                        event.event_id
                    );
                }
            }
        }
        Ok(())
    }

    /// Decides what an outcome means for one event of a request. `backoff` is drawn once
    /// per request, so the events of a failed batch come back together.
    fn classify(
        &self,
        outcome: &Outcome,
        event: &OutboundEvent,
        backoff: Duration,
        now: i64,
    ) -> WriteBack {
        let retry_or_dead = |error: String, retry_after: Option<Duration>| {
            let attempts = event.attempts.saturating_add(1);
            if attempts >= i64::from(self.config.max_attempts) {
                return WriteBack::Dead {
                    error: format!("{error} (gave up after {attempts} attempts)"),
                };
            }
            let wait = self
                .asked_wait(retry_after)
                .map_or(backoff, |a| a.max(backoff));
            WriteBack::Retry {
                available_at: now.saturating_add(wait.as_millis() as i64),
                error,
            }
        };
        match outcome {
            Outcome::Attempted(Attempt::Answered {
                status,
                retry_after,
                detail,
            }) => match *status {
                200..=299 => WriteBack::Delivered,
                // The destination is disabled; its events wait without spending attempts.
                410 => WriteBack::Release {
                    error: Some(detail.clone()),
                },
                408 | 429 | 500..=599 => retry_or_dead(detail.clone(), *retry_after),
                400..=499 if self.config.dead_letter_client_errors => WriteBack::Dead {
                    error: detail.clone(),
                },
                _ => retry_or_dead(detail.clone(), *retry_after),
            },
            Outcome::Attempted(Attempt::Unreachable { reason }) => WriteBack::Release {
                error: Some(format!("unreachable: {reason}")),
            },
            Outcome::Attempted(Attempt::Unsendable { reason }) => WriteBack::Dead {
                error: reason.clone(),
            },
            Outcome::Skipped => WriteBack::Release { error: None },
            Outcome::Panicked(msg) => retry_or_dead(format!("transport panicked: {msg}"), None),
        }
    }

    /// A `Retry-After`, capped.
    fn asked_wait(&self, retry_after: Option<Duration>) -> Option<Duration> {
        retry_after.map(|d| d.min(self.config.retry_after_cap))
    }

    /// Books a finished request: frees its in-flight slots and persists a 410. (The worker
    /// has already closed the destination's gate for 410, 429 and unreachable answers, so
    /// queued events are not sent meanwhile.)
    fn update_lane(&mut self, completion: &Completion, now: i64) {
        let lane = &mut self.lanes[completion.lane];
        for event in &completion.events {
            lane.in_flight.remove(&event.id);
        }
        if let Outcome::Attempted(Attempt::Answered {
            status: 410,
            detail,
            ..
        }) = &completion.outcome
        {
            if lane.disabled.is_none() {
                let reason = format!("disabled after {detail}");
                log::warn!("destination {}: {reason}", lane.name);
                if let Err(e) = destination_state::disable(&self.conn, &lane.name, &reason, now) {
                    log::error!("destination {}: cannot record 410: {e}", lane.name);
                }
                lane.disabled = Some(reason);
                lane.reach.set_disabled(true);
            }
        }
    }

    /// Writes a batch of outcomes back in one transaction.
    fn apply(&mut self, completions: &mut Vec<Completion>) {
        let now = self.outbox.now_ms();
        let mut decided = Vec::with_capacity(completions.len());
        for c in completions.drain(..) {
            self.update_lane(&c, now);
            let attempt = c.events.iter().map(|e| e.attempts).max().unwrap_or(0) + 1;
            let backoff = self
                .config
                .retry
                .full_jitter(u32::try_from(attempt).unwrap_or(u32::MAX));
            for event in c.events {
                let write_back = self.classify(&c.outcome, &event, backoff, now);
                decided.push((c.lane, event, write_back));
            }
        }
        let recorded = match self.write_all(&decided, now) {
            Ok(recorded) => recorded,
            Err(e) => {
                // The leases stay with us until they expire; then the events are claimed
                // again.
                log::error!(
                    "relay {}: could not record {} outcomes, they will be retried after the \
                     lease: {e}",
                    self.relay_id,
                    decided.len()
                );
                return;
            }
        };
        for ((lane, event, write_back), recorded) in decided.iter().zip(recorded) {
            let lane = &mut self.lanes[*lane];
            lane.claim_due = true;
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
            match write_back {
                WriteBack::Delivered => {
                    crate::telemetry::delivered(
                        &event.event_type,
                        &event.destination,
                        now - event.created_at,
                    );
                    log::debug!("event {}: delivered", event.event_id)
                }
                WriteBack::Retry {
                    available_at,
                    error,
                } => {
                    crate::telemetry::retried(&event.event_type, &event.destination);
                    lane.next_due_ms = Some(
                        lane.next_due_ms
                            .map_or(*available_at, |d| d.min(*available_at)),
                    );
                    log::info!(
                        "event {}: attempt {} failed ({error}), retrying in {} ms",
                        event.event_id,
                        event.attempts + 1,
                        available_at - now
                    );
                }
                WriteBack::Dead { error } => {
                    crate::telemetry::dead(&event.event_type, &event.destination);
                    log::warn!("event {}: dead-lettered: {error}", event.event_id)
                }
                WriteBack::Release { error: Some(e) } => {
                    log::debug!("event {}: released ({e})", event.event_id)
                }
                WriteBack::Release { error: None } => {}
            }
        }
    }

    /// Records every outcome in one transaction; returns, per outcome, whether its lease was
    /// still ours (and so whether it was recorded).
    fn write_all(
        &mut self,
        decided: &[(usize, OutboundEvent, WriteBack)],
        now: i64,
    ) -> Result<Vec<bool>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut recorded = vec![false; decided.len()];
        // Deliveries of one claim go in one statement (the common case, and the hot path);
        // anything else row by row.
        let mut i = 0;
        while i < decided.len() {
            let (_, event, write_back) = &decided[i];
            if *write_back != WriteBack::Delivered {
                recorded[i] =
                    claim::write_back(&tx, event.id, &event.lease_owner, now, write_back)?;
                i += 1;
                continue;
            }
            let owner = &event.lease_owner;
            let end = decided[i..]
                .iter()
                .position(|(_, e, w)| *w != WriteBack::Delivered || e.lease_owner != *owner)
                .map_or(decided.len(), |n| i + n);
            let ids: Vec<i64> = decided[i..end].iter().map(|(_, e, _)| e.id).collect();
            let done: HashSet<i64> = claim::mark_delivered(&tx, owner, &ids, now)?
                .into_iter()
                .collect();
            for (slot, (_, e, _)) in recorded[i..end].iter_mut().zip(&decided[i..end]) {
                *slot = done.contains(&e.id);
            }
            i = end;
        }
        // A key whose head left the pending set lets its next event go.
        for ((_, event, write_back), recorded) in decided.iter().zip(&recorded) {
            let left = matches!(write_back, WriteBack::Delivered | WriteBack::Dead { .. });
            if let (true, true, Some(key)) = (left, *recorded, &event.partition_key) {
                claim::unpark_next(&tx, key, &event.destination, now)?;
            }
        }
        tx.commit()?;
        self.wrote = true;
        Ok(recorded)
    }

    fn in_flight(&self) -> usize {
        self.lanes.iter().map(|l| l.in_flight.len()).sum()
    }

    /// Stops claiming, hands back events no worker started, and waits (bounded) for the rest.
    fn shut_down(mut self, mut completions: Vec<Completion>) -> ShutdownReport {
        let deadline = Instant::now() + self.config.shutdown_timeout;
        let mut unstarted = Vec::new();
        for (index, lane) in self.lanes.iter_mut().enumerate() {
            while let Ok(events) = lane.work_rx.try_recv() {
                unstarted.push(Completion {
                    lane: index,
                    events,
                    outcome: Outcome::Skipped,
                });
            }
            // Dropping the only sender lets the lane's workers exit after their request.
            lane.work_tx = None;
        }
        let released = unstarted.iter().map(|c| c.events.len()).sum();
        self.apply(&mut unstarted);
        let mut finished = 0;
        while self.in_flight() > 0 || !completions.is_empty() {
            if !completions.is_empty() {
                finished += completions.iter().map(|c| c.events.len()).sum::<usize>();
                self.apply(&mut completions);
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done_rx.recv_timeout(left) {
                Ok(c) => {
                    completions.push(c);
                    self.drain_completions(&mut completions);
                }
                Err(_) => break,
            }
        }
        let abandoned = self.in_flight();
        if abandoned > 0 {
            log::warn!(
                "relay {}: {abandoned} deliveries still running at shutdown; their leases \
                 expire and the events will be delivered again",
                self.relay_id
            );
        }
        ShutdownReport {
            released,
            finished,
            abandoned,
            detached_threads: 0,
        }
    }
}
