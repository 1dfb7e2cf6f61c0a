//! The relay's writer thread: the only part of a relay that touches SQLite.
//!
//! It claims due events, hands them to the delivery workers through a bounded channel, and
//! writes their outcomes back, many per transaction. Owning every write in one thread means
//! the relay never fights itself for SQLite's single write lock.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use r2d2::PooledConnection;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::TransactionBehavior;

use crate::claim::{self, ClaimRequest, WriteBack};
use crate::error::Result;
use crate::outbox::{Outbox, DEFAULT_DESTINATION};
use crate::reachability::Reachability;
use crate::relay::{Completion, Counters, Outcome, ShutdownReport};
use crate::relay_config::RelayConfig;
use crate::transport::{Attempt, OutboundEvent};

/// Outcomes written back in one transaction at most.
const MAX_ACKS_PER_TX: usize = 1_000;
/// How often an idle relay claims even without a sign of new work, to pick up leases that a
/// crashed relay left behind.
const IDLE_CLAIM_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) struct Writer {
    pub outbox: Outbox,
    pub conn: PooledConnection<SqliteConnectionManager>,
    pub config: RelayConfig,
    pub relay_id: String,
    pub work_tx: Option<Sender<OutboundEvent>>,
    pub work_rx: Receiver<OutboundEvent>,
    pub done_rx: Receiver<Completion>,
    pub stop_rx: Receiver<()>,
    pub reach: Arc<Reachability>,
    pub counters: Arc<Counters>,
}

/// Loop state that only the writer sees.
struct State {
    claim_seq: u64,
    in_flight: HashSet<i64>,
    claim_due: bool,
    stopping: bool,
    /// Earliest retry this relay scheduled itself (unix ms, clock time).
    next_due_ms: Option<i64>,
    data_version: i64,
    last_poll: Instant,
    last_claim: Instant,
}

impl Writer {
    pub fn run(mut self) -> ShutdownReport {
        let mut state = State {
            claim_seq: 0,
            in_flight: HashSet::new(),
            claim_due: true,
            stopping: false,
            next_due_ms: None,
            data_version: self.data_version().unwrap_or(0),
            last_poll: Instant::now(),
            last_claim: Instant::now(),
        };
        let mut completions = Vec::new();
        while !state.stopping {
            self.drain_completions(&mut completions);
            if !completions.is_empty() {
                self.apply(&mut state, &mut completions);
            }
            self.poll_for_work(&mut state);
            if let Err(e) = self.claim(&mut state) {
                // Not at once: a broken disk would otherwise turn this into a hot loop. The
                // idle claim tries again within a second.
                state.claim_due = false;
                log::warn!("relay {}: claim failed, will retry: {e}", self.relay_id);
            }
            self.wait(&mut state, &mut completions);
        }
        self.shut_down(state, completions)
    }

    fn drain_completions(&self, into: &mut Vec<Completion>) {
        while into.len() < MAX_ACKS_PER_TX {
            match self.done_rx.try_recv() {
                Ok(c) => into.push(c),
                Err(_) => break,
            }
        }
    }

    /// Blocks until there is something to do, or the poll interval passes.
    fn wait(&self, state: &mut State, completions: &mut Vec<Completion>) {
        let mut timeout = self.config.poll_interval;
        if state.claim_due && !self.claim_blocked(state) {
            // More work is waiting to be claimed: only look at the channels.
            timeout = Duration::ZERO;
        }
        select! {
            recv(self.stop_rx) -> _ => state.stopping = true,
            recv(self.outbox.inner.wake_rx) -> _ => state.claim_due = true,
            recv(self.done_rx) -> msg => {
                if let Ok(c) = msg {
                    completions.push(c);
                }
            },
            default(timeout) => {},
        }
    }

    /// Whether claiming now would be pointless: the destination is offline, or nothing more
    /// may be in flight.
    fn claim_blocked(&self, state: &State) -> bool {
        let now = self.outbox.now_ms();
        state.in_flight.len() >= self.config.max_in_flight
            || self.reach.is_offline(now)
            || (self.reach.is_suspect() && !state.in_flight.is_empty())
    }

    /// Notices work that no channel announced: commits by other connections or processes,
    /// retries falling due, leases of crashed relays expiring.
    fn poll_for_work(&mut self, state: &mut State) {
        if state.last_poll.elapsed() < self.config.poll_interval {
            return;
        }
        state.last_poll = Instant::now();
        match self.data_version() {
            Ok(v) if v != state.data_version => {
                state.data_version = v;
                state.claim_due = true;
            }
            Ok(_) => {}
            Err(e) => log::warn!("relay {}: data_version poll failed: {e}", self.relay_id),
        }
        if let Some(due) = state.next_due_ms {
            if due <= self.outbox.now_ms() {
                state.next_due_ms = None;
                state.claim_due = true;
            }
        }
        if state.last_claim.elapsed() >= IDLE_CLAIM_INTERVAL {
            state.claim_due = true;
        }
    }

    fn data_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?)
    }

    fn claim(&mut self, state: &mut State) -> Result<()> {
        if !state.claim_due || state.stopping || self.claim_blocked(state) {
            return Ok(());
        }
        let Some(work_tx) = &self.work_tx else {
            return Ok(());
        };
        // After unanswered attempts, send a single probe rather than a batch that would only
        // time out request by request.
        let limit = if self.reach.is_suspect() {
            1
        } else {
            (self.config.max_in_flight - state.in_flight.len()).min(self.config.claim_batch)
        };
        state.claim_seq += 1;
        let owner = format!("{}:{}", self.relay_id, state.claim_seq);
        let now = self.outbox.now_ms();
        let events = claim::claim(
            &self.conn,
            &ClaimRequest {
                destination: DEFAULT_DESTINATION,
                default_source: &self.outbox.inner.default_source,
                owner: &owner,
                now,
                lease_ms: self.config.lease.as_millis() as i64,
                limit: limit as i64,
            },
        )?;
        state.last_claim = Instant::now();
        state.claim_due = events.len() == limit;
        for event in events {
            log::debug!("event {}: claimed by {owner}", event.event_id);
            state.in_flight.insert(event.id);
            // The channel holds max_in_flight events, so this never blocks.
            if let Err(e) = work_tx.try_send(event) {
                let event = e.into_inner();
                state.in_flight.remove(&event.id);
                log::error!("event {}: work queue full, releasing", event.event_id);
            }
        }
        Ok(())
    }

    /// Decides what an outcome means for its row.
    fn classify(&self, completion: &Completion, now: i64) -> WriteBack {
        let event = &completion.event;
        let retry_or_dead = |error: String, retry_after: Option<Duration>| {
            let attempts = event.attempts.saturating_add(1);
            if attempts >= i64::from(self.config.max_attempts) {
                return WriteBack::Dead {
                    error: format!("{error} (gave up after {attempts} attempts)"),
                };
            }
            let backoff = self.config.retry.full_jitter(attempts as u32);
            let asked = retry_after.map(|d| d.min(self.config.retry_after_cap));
            let wait = asked.map_or(backoff, |a| a.max(backoff));
            WriteBack::Retry {
                available_at: now.saturating_add(wait.as_millis() as i64),
                error,
            }
        };
        match &completion.outcome {
            Outcome::Attempted(Attempt::Answered {
                status,
                retry_after,
                detail,
            }) => match *status {
                200..=299 => WriteBack::Delivered,
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

    /// Writes a batch of outcomes back in one transaction.
    fn apply(&mut self, state: &mut State, completions: &mut Vec<Completion>) {
        let now = self.outbox.now_ms();
        let mut decided = Vec::with_capacity(completions.len());
        for c in completions.drain(..) {
            state.in_flight.remove(&c.event.id);
            match &c.outcome {
                Outcome::Attempted(Attempt::Answered { .. }) => self.reach.mark_answered(),
                Outcome::Attempted(Attempt::Unreachable { .. }) => {
                    self.reach.mark_unreachable(now, &self.config.offline)
                }
                _ => {}
            }
            let write_back = self.classify(&c, now);
            decided.push((c.event, write_back));
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
        for ((event, write_back), recorded) in decided.iter().zip(recorded) {
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
                WriteBack::Delivered => log::debug!("event {}: delivered", event.event_id),
                WriteBack::Retry {
                    available_at,
                    error,
                } => {
                    state.next_due_ms = Some(
                        state
                            .next_due_ms
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
                    log::warn!("event {}: dead-lettered: {error}", event.event_id)
                }
                WriteBack::Release { error: Some(e) } => {
                    log::debug!("event {}: released ({e})", event.event_id)
                }
                WriteBack::Release { error: None } => {}
            }
        }
        state.claim_due = true;
    }

    /// Records every outcome in one transaction; returns, per outcome, whether its lease was
    /// still ours (and so whether it was recorded).
    fn write_all(&mut self, decided: &[(OutboundEvent, WriteBack)], now: i64) -> Result<Vec<bool>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut recorded = Vec::with_capacity(decided.len());
        for (event, write_back) in decided {
            recorded.push(claim::write_back(
                &tx,
                event.id,
                &event.lease_owner,
                now,
                write_back,
            )?);
        }
        tx.commit()?;
        Ok(recorded)
    }

    /// Stops claiming, hands back events no worker started, and waits (bounded) for the rest.
    fn shut_down(mut self, mut state: State, mut completions: Vec<Completion>) -> ShutdownReport {
        let deadline = Instant::now() + self.config.shutdown_timeout;
        let mut unstarted = Vec::new();
        while let Ok(event) = self.work_rx.try_recv() {
            unstarted.push(Completion {
                event,
                outcome: Outcome::Skipped,
            });
        }
        // Dropping the only sender lets workers exit after their current request.
        self.work_tx = None;
        let released = unstarted.len();
        self.apply(&mut state, &mut unstarted);
        let mut finished = 0;
        while !state.in_flight.is_empty() || !completions.is_empty() {
            if !completions.is_empty() {
                finished += completions.len();
                self.apply(&mut state, &mut completions);
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
        let abandoned = state.in_flight.len();
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
