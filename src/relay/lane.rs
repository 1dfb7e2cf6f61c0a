//! A destination's lane: what the writer knows about one destination (its gate, its claimed
//! events in flight, when to claim next) and how claimed events are grouped into requests.
//!
//! Each destination has its own lane, workers and in-flight limit, so one that is down or
//! slow never holds back another.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::outbound::OutboundEvent;
use crate::relay::config::RelayConfig;
use crate::relay::destination::{Batching, Destination};
use crate::relay::gate::Gate;
use crate::relay::pacer::Pacer;
use crate::relay::spending::Spending;
use crate::relay::voice::Voice;
use crate::wire::encoded_size_bound;

/// Retry times a lane remembers at most (8 bytes each).
const MAX_RETRY_TIMES: usize = 100_000;

/// The most bytes of event data one claim takes (past its first event, which goes whatever
/// its size): with events of 200 KB a claim of a few hundred held tens of megabytes, and
/// its transaction kept the app's commits waiting.
const MAX_CLAIM_BYTES: usize = 4 << 20;

/// The most bytes of event data a lane keeps queued or in delivery at once (past one
/// claim's first event): the relay's memory for large events, whatever the count limits.
const MAX_IN_FLIGHT_BYTES: usize = 16 << 20;

/// Requests delivered in a row at a lane's learned batch cap before the cap doubles (see
/// [`Lane::split_again`]): a receiver that refuses batches over some size then costs one
/// refused request in this many, and one that refused a poison event gets full batches
/// back after a few rounds.
const SPLIT_CAP_GROWS_AFTER: u32 = 16;

/// One unit of work for a delivery worker: one request's worth of events.
pub(crate) type Job = Vec<OutboundEvent>;

/// What a paced lane may claim now, and what makes a claim worth its transaction.
struct PacedRoom {
    room: usize,
    worth_it: usize,
}

/// How long at most after a short claim, while the lane's requests are out, the writer
/// reads when the next row falls due (a retry of another relay, a row another relay's lease
/// holds): a row falling due meanwhile is claimed this late at most.
const READ_DUE_WITHIN: Duration = Duration::from_millis(100);

/// One destination as the writer drives it.
pub(crate) struct Lane {
    name: String,
    batch: Option<Batching>,
    /// Events one claim takes at most.
    claim_batch: usize,
    /// Claimed events this lane may have queued or in delivery at once.
    max_in_flight: usize,
    gate: Arc<Gate>,
    /// What the relay says of the destination's state, from its workers.
    voice: Arc<Voice>,
    /// The destination's rate and bandwidth limits, shared by its workers.
    pacer: Option<Arc<Pacer>>,
    /// The destination's data budget as this relay spends it, shared by its workers.
    spending: Option<Arc<Spending>>,
    /// How far ahead a paced lane claims: what its pacer lets out within this much time.
    /// A quarter of the lease, so a claimed event starts well before half its lease is gone
    /// (where a worker hands it back unsent).
    pace_window: Duration,
    /// Request bodies' bytes per event, as last claimed (for a bandwidth limit's share).
    bytes_per_event: Option<f64>,
    /// `None` once the lane is closed: its workers exit after their current request.
    jobs_tx: Option<Sender<Job>>,
    jobs_rx: Receiver<Job>,
    /// Claimed events queued or in delivery, by row id, with their data's size.
    in_flight: HashMap<i64, usize>,
    /// The sum of `in_flight`'s sizes.
    in_flight_bytes: usize,
    /// Whether a claim may find something: set by commits, answers and timers, cleared by a
    /// claim that came back short.
    claim_due: bool,
    /// Retries this relay scheduled itself (unix ms, clock time), soonest first: each wakes
    /// the lane when it falls due. Bounded; past the bound the idle claim finds the rest.
    retry_times: BinaryHeap<Reverse<i64>>,
    /// When the first row not yet due falls due (unix ms), as the writer last read it after
    /// a claim came back short: rows written with a delay, other relays' retries.
    due_later: Option<i64>,
    /// While `due_later` has not been read since the last short claim: that claim's time
    /// (unix ms) and when the first unread one was made (see [`Lane::due_later_to_read`]).
    due_later_unread: Option<(i64, Instant)>,
    /// How long a claim short of a batch waits for more (the destination's linger).
    linger: Option<Duration>,
    /// Claimed events waiting for a batch to fill (leased, counted in flight), and until
    /// when they wait.
    lingering: Vec<OutboundEvent>,
    lingering_until: Option<Instant>,
    /// The encoded size bound of `lingering`, kept as events join (a trickle adds one a
    /// claim, and a batch's byte limit is checked at each).
    lingering_bytes: usize,
    /// Why the destination is disabled, if it is (mirrored in the gate for the workers).
    disabled: Option<String>,
    /// The most events a request holds since the receiver refused a batch for its content:
    /// the size of the halves that bisection made (see [`Lane::split_again`]). `None` while
    /// the destination's own batch limit holds.
    split_cap: Option<usize>,
    /// Requests at `split_cap` delivered in a row since it was last lowered or raised.
    delivered_at_cap: u32,
}

impl Lane {
    /// A lane for `destination` with `workers` delivery threads. A batching destination
    /// claims at least a batch per worker at once, and up to four while that stays within
    /// four times the configured claim (400 events by default, which hold the write lock
    /// about a millisecond); it may have four such claims in flight. Per event, the claim
    /// and ack transactions then cost a fraction of what they cost one event at a time,
    /// and a claim's fixed cost (its transaction, the probe of the priority levels) is
    /// shared by more events: 4 workers × 25 to Mosquitto delivered 54k–58k events/s with
    /// claims of 100, 66k/s with claims of 400.
    pub fn new(destination: &Destination, workers: usize, config: &RelayConfig) -> Lane {
        let batch = destination.batching();
        let claim_batch = match batch {
            Some(b) => {
                let round = b.max_events.saturating_mul(workers);
                let rounds = round
                    .saturating_mul(4)
                    .min(config.claim_batch.saturating_mul(4));
                config.claim_batch.max(round).max(rounds)
            }
            None => config.claim_batch,
        };
        let max_in_flight = config.max_in_flight.max(claim_batch.saturating_mul(4));
        // Every job holds at least one event, so this many jobs never fills the channel.
        let (jobs_tx, jobs_rx) = bounded(max_in_flight);
        Lane {
            name: destination.name().to_string(),
            batch,
            claim_batch,
            max_in_flight,
            gate: Arc::new(Gate::new(config.offline)),
            voice: Arc::new(Voice::new(destination.name())),
            pacer: {
                let (rate, bandwidth) = destination.pacing();
                Pacer::new(rate, bandwidth).map(Arc::new)
            },
            spending: None,
            pace_window: config.lease / 4,
            bytes_per_event: None,
            jobs_tx: Some(jobs_tx),
            jobs_rx,
            in_flight: HashMap::new(),
            in_flight_bytes: 0,
            claim_due: true,
            retry_times: BinaryHeap::new(),
            due_later: None,
            due_later_unread: None,
            linger: destination.linger_time(),
            lingering: Vec::new(),
            lingering_until: None,
            lingering_bytes: 0,
            disabled: None,
            split_cap: None,
            delivered_at_cap: 0,
        }
    }

    /// The lane spends `spending`, its destination's data budget.
    pub fn with_spending(mut self, spending: Option<Arc<Spending>>) -> Lane {
        self.spending = spending;
        self
    }

    /// The destination's data budget, for this lane's workers and the writer.
    pub fn spending(&self) -> Option<&Arc<Spending>> {
        self.spending.as_ref()
    }

    /// The least priority a claim takes now: the budget's exempt priority while the
    /// destination holds events for its budget, else every priority (0).
    pub fn claim_min_priority(&self) -> i64 {
        match &self.spending {
            Some(s) if s.holding() => s.exempt_priority().map_or(i64::MAX, i64::from),
            _ => 0,
        }
    }

    /// While the destination holds events for its budget, how long until the next period
    /// (at most a minute): the writer looks then, and the lane claims everything again.
    pub fn budget_renews_in(&self) -> Option<Duration> {
        self.spending.as_ref().and_then(|s| s.renews_in())
    }

    /// Whether the budget holds every event back (spent, and no priority exempt).
    fn held_for_budget(&self) -> bool {
        self.claim_min_priority() > 9
    }

    /// The destination's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The destination's voice, for this lane's workers.
    pub fn voice(&self) -> Arc<Voice> {
        self.voice.clone()
    }

    /// The gate, for this lane's workers.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// The rate and bandwidth limits, for this lane's workers.
    pub fn pacer(&self) -> Option<Arc<Pacer>> {
        self.pacer.clone()
    }

    /// The job queue, for this lane's workers.
    pub fn jobs(&self) -> Receiver<Job> {
        self.jobs_rx.clone()
    }

    /// Claimed events not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether a claim is worth its transaction at `now`: something may be due, the gate is
    /// open, and a whole batch fits. Waiting until a whole batch fits keeps claims (each a
    /// write transaction) few and large while the workers still have queued work.
    pub fn wants_claim(&self) -> bool {
        let paced = self.paced_room();
        let room = self
            .max_in_flight
            .saturating_sub(self.in_flight.len())
            .min(paced.room);
        let worth_it = self
            .claim_batch
            .min(self.max_in_flight / 2)
            .min(paced.worth_it)
            .max(1);
        let full_of_bytes = self.in_flight_bytes >= MAX_IN_FLIGHT_BYTES;
        let blocked = ((room < worth_it || full_of_bytes) && !self.in_flight.is_empty())
            || room == 0
            || self.gate.is_closed()
            || (self.gate.is_suspect() && !self.in_flight.is_empty())
            || self.held_for_budget();
        self.claim_due && self.jobs_tx.is_some() && !blocked
    }

    /// How many bytes of event data the next claim takes at most (past its first event):
    /// what is left of [`MAX_IN_FLIGHT_BYTES`], and no more than [`MAX_CLAIM_BYTES`].
    pub fn claim_max_bytes(&self) -> usize {
        MAX_IN_FLIGHT_BYTES
            .saturating_sub(self.in_flight_bytes)
            .min(MAX_CLAIM_BYTES)
    }

    /// Marks `event` queued or in delivery.
    fn take_in_flight(&mut self, event: &OutboundEvent) {
        let size = event.payload.len();
        if let Some(old) = self.in_flight.insert(event.id, size) {
            self.in_flight_bytes -= old;
        }
        self.in_flight_bytes += size;
    }

    /// Marks the event of row `id` no longer queued nor in delivery.
    fn drop_in_flight(&mut self, id: i64) {
        if let Some(size) = self.in_flight.remove(&id) {
            self.in_flight_bytes -= size;
        }
    }

    /// How many events the next claim takes. After unanswered attempts, a single probe
    /// rather than a batch that would only time out request by request.
    pub fn claim_limit(&self) -> usize {
        if self.gate.is_suspect() {
            1
        } else {
            (self.max_in_flight - self.in_flight.len())
                .min(self.claim_batch)
                .min(self.paced_room().room)
        }
    }

    /// How many more events a paced lane may claim: what its pacer lets out within the
    /// pace window beyond what workers reserved, less the jobs still queued. Without this a
    /// lane queued its whole in-flight limit; at a low rate the last jobs outwaited half
    /// their lease, went back unsent and were claimed again behind the rest, for ever.
    fn paced_room(&self) -> PacedRoom {
        let unpaced = PacedRoom {
            room: usize::MAX,
            worth_it: usize::MAX,
        };
        let Some(pacer) = &self.pacer else {
            return unpaced;
        };
        let per_request = self.max_events_per_request() as f64;
        let queued_jobs = self.jobs_rx.len() as f64;
        let allowance = pacer.allowance(self.pace_window);
        let window_secs = self.pace_window.as_secs_f64();
        let mut room = f64::INFINITY;
        let mut worth_it = f64::INFINITY;
        if let Some(requests) = allowance.requests {
            room = room.min((requests - queued_jobs).floor() * per_request);
            // Half a window's worth per claim keeps claims few without starving workers.
            worth_it = worth_it.min(pacer.requests_per_second() * window_secs * per_request / 2.0);
        }
        if let Some(bytes) = allowance.bytes {
            match self.bytes_per_event {
                Some(per_event) => {
                    let queued = queued_jobs * per_request * per_event;
                    let mut fits = ((bytes - queued) / per_event).floor();
                    // The size learnt may be one large event's: once its debt is paid and
                    // nothing is claimed, one event goes (and teaches its own size), else
                    // the events after a large one would wait for ever.
                    let paid = bytes >= pacer.bytes_per_second() * window_secs;
                    if fits < 1.0 && paid && queued_jobs == 0.0 && self.in_flight.is_empty() {
                        fits = 1.0;
                    }
                    room = room.min(fits);
                    worth_it =
                        worth_it.min(pacer.bytes_per_second() * window_secs / per_event / 2.0);
                }
                // Nothing learnt yet: one event, to learn its size.
                None => {
                    room = room.min(if bytes > 0.0 && queued_jobs == 0.0 {
                        1.0
                    } else {
                        0.0
                    });
                    worth_it = 1.0;
                }
            }
        }
        let to_count = |x: f64| {
            if x.is_nan() || x <= 0.0 {
                0
            } else if x >= usize::MAX as f64 {
                usize::MAX
            } else {
                x as usize
            }
        };
        PacedRoom {
            room: to_count(room),
            worth_it: to_count(worth_it).max(1),
        }
    }

    /// Claimed events that wait for a batch to fill, until when, if any do.
    pub fn lingering_until(&self) -> Option<Instant> {
        self.lingering_until
    }

    /// In-flight events handed to workers (not waiting for a batch to fill).
    pub fn sent_in_flight(&self) -> usize {
        self.in_flight.len() - self.lingering.len()
    }

    /// Queues the events waiting for a batch to fill, if their wait is over or `now_anyway`.
    pub fn release_lingering(&mut self, now_anyway: bool) {
        if self.lingering.is_empty()
            || !(now_anyway || self.lingering_until.is_none_or(|t| Instant::now() >= t))
        {
            return;
        }
        self.lingering_until = None;
        self.lingering_bytes = 0;
        let events = std::mem::take(&mut self.lingering);
        self.queue_jobs(events);
    }

    /// Queues claimed `events` for the workers, as requests; `more_due` says whether the
    /// claim filled its limit, so more may be due. With a linger, events short of a full
    /// batch wait (in flight) until it fills, the linger ends, or an `urgent` one comes.
    pub fn dispatch(&mut self, events: Vec<OutboundEvent>, more_due: bool, urgent: bool) {
        self.claim_due = more_due;
        let (Some(linger), Some(batch)) = (self.linger, self.batch) else {
            self.queue_jobs(events);
            return;
        };
        if events.is_empty() {
            return;
        }
        for event in &events {
            self.take_in_flight(event);
            self.lingering_bytes += encoded_size_bound(event) + 1;
        }
        self.lingering.extend(events);
        if urgent
            || self.lingering.len() >= batch.max_events
            || self.lingering_bytes >= batch.max_bytes
        {
            self.release_lingering(true);
        } else if self.lingering_until.is_none() {
            self.lingering_until = Some(Instant::now() + linger);
        }
    }

    /// Groups `events` into requests and hands them to the workers.
    fn queue_jobs(&mut self, events: Vec<OutboundEvent>) {
        if self.pacer.as_ref().is_some_and(|p| p.counts_bytes()) && !events.is_empty() {
            let bytes: usize = events.iter().map(|e| encoded_size_bound(e) + 1).sum();
            self.bytes_per_event = Some(bytes as f64 / events.len() as f64);
        }
        for job in self.group_into_jobs(events) {
            for event in &job {
                self.take_in_flight(event);
            }
            let Some(jobs_tx) = &self.jobs_tx else { break };
            // The channel holds max_in_flight jobs, so this never blocks.
            if let Err(e) = jobs_tx.try_send(job) {
                for event in e.into_inner() {
                    self.drop_in_flight(event.id);
                    log::error!(
                        "event {}: work queue full, left to its lease",
                        event.event_id
                    );
                }
            }
        }
    }

    /// Queues `events` of a batch the receiver refused for its content again, as two
    /// requests (halves, in order), so that only an event refused alone is dead-lettered:
    /// a bisection that spends no attempt. They stay in flight. Hands back the events it
    /// could not queue (the lane closed).
    ///
    /// The lane also remembers the halves' size as the most a request holds from now on,
    /// and doubles it back after [`SPLIT_CAP_GROWS_AFTER`] requests delivered at it. So a
    /// bisection survives a hand-back (a paced lane's halves wait their turn, and once half
    /// the lease is gone a worker hands them back unsent: the next claim groups them no
    /// larger than they had become), and a receiver that refuses batches over some size is
    /// not sent a refused batch with every claim.
    pub fn split_again(&mut self, mut events: Job) -> Job {
        let Some(jobs_tx) = &self.jobs_tx else {
            return events;
        };
        let half = events.len().div_ceil(2);
        self.split_cap = Some(self.split_cap.map_or(half, |cap| cap.min(half)));
        self.delivered_at_cap = 0;
        let second = events.split_off(half);
        let mut left = Vec::new();
        for job in [events, second] {
            if job.is_empty() {
                continue;
            }
            // Each slot of the channel is an in-flight event's, and these are in flight.
            if let Err(e) = jobs_tx.try_send(job) {
                left.extend(e.into_inner());
            }
        }
        left
    }

    /// Counts a request of `len` events that was delivered whole: at the learned cap, it
    /// brings the cap's doubling nearer (see [`Lane::split_again`]).
    pub fn delivered_request(&mut self, len: usize) {
        let (Some(cap), Some(batch)) = (self.split_cap, self.batch) else {
            return;
        };
        if len < cap {
            return;
        }
        self.delivered_at_cap += 1;
        if self.delivered_at_cap >= SPLIT_CAP_GROWS_AFTER {
            self.delivered_at_cap = 0;
            let grown = cap.saturating_mul(2);
            self.split_cap = (grown < batch.max_events).then_some(grown);
        }
    }

    /// The most events one request holds: 1 without batching, else the batch limit or the
    /// cap a refused batch taught (see [`Lane::split_again`]), whichever is lower.
    fn max_events_per_request(&self) -> usize {
        match (self.batch, self.split_cap) {
            (None, _) => 1,
            (Some(batch), None) => batch.max_events,
            (Some(batch), Some(cap)) => cap.min(batch.max_events),
        }
    }

    /// Splits claimed events into requests: one event each, or batches of one source within
    /// both limits (and within the cap a refused batch taught, see [`Lane::split_again`]).
    fn group_into_jobs(&self, events: Vec<OutboundEvent>) -> Vec<Job> {
        let Some(batch) = self.batch else {
            return events.into_iter().map(|e| vec![e]).collect();
        };
        let max_events = self.max_events_per_request();
        let mut jobs: Vec<Job> = Vec::new();
        let mut bytes = 0;
        for event in events {
            let size = encoded_size_bound(&event) + 1;
            match jobs.last_mut() {
                // One source a request: a receiver picks the keys of the request's
                // `outbox-source` before it reads the body.
                Some(job)
                    if job.len() < max_events
                        && bytes + size <= batch.max_bytes
                        && job[0].source == event.source =>
                {
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

    /// Frees the slots of finished events; their answers may have made room or news.
    pub fn finished<'a>(&mut self, events: impl IntoIterator<Item = &'a OutboundEvent>) {
        for event in events {
            self.drop_in_flight(event.id);
        }
        self.claim_due = true;
    }

    /// Remembers a retry this relay scheduled, to claim it when it falls due.
    pub fn retry_at(&mut self, available_at: i64) {
        if self.retry_times.len() < MAX_RETRY_TIMES {
            self.retry_times.push(Reverse(available_at));
        }
    }

    /// Forgets the retry times it scheduled (they were on a clock that jumped).
    pub fn forget_retry_times(&mut self) {
        self.retry_times.clear();
    }

    /// Marks the lane worth a claim (a commit, a timer, new settings).
    pub fn wake(&mut self) {
        self.claim_due = true;
    }

    /// Wakes the lane if a retry it scheduled, or the row it knows to be due later, has
    /// fallen due by `now` (every retry, not only the soonest: each one falling due is worth
    /// a claim).
    pub fn wake_if_retry_due(&mut self, now: i64) {
        while self.retry_times.peek().is_some_and(|Reverse(t)| *t <= now) {
            self.retry_times.pop();
            self.claim_due = true;
        }
        if self.due_later.is_some_and(|t| t <= now) {
            self.due_later = None;
            self.claim_due = true;
        }
    }

    /// Notes that a claim at `now` (unix ms) came back short: the lane is caught up, and
    /// when its first row not yet due falls due is to be read again.
    pub fn caught_up_at(&mut self, now: i64) {
        let first = self
            .due_later_unread
            .map_or_else(Instant::now, |(_, first)| first);
        self.due_later_unread = Some((now, first));
    }

    /// The time of the last short claim, after which to look for the next row falling due,
    /// if that is to be read now: once none of the lane's requests is out, or
    /// [`READ_DUE_WITHIN`] after the first claim left unread. Read at once, while the
    /// claim's request was out, the query took CPU from it on two cores and added about
    /// 0.05 ms to an idle relay's commit → receipt; read once the answer is in, it costs the
    /// next event nothing. Meanwhile the lane keeps the time it knew.
    pub fn due_later_to_read(&self) -> Option<i64> {
        let (since, first) = self.due_later_unread?;
        (self.sent_in_flight() == 0 || first.elapsed() >= READ_DUE_WITHIN).then_some(since)
    }

    /// When the writer must wake to read the next due time while requests are out.
    pub fn due_later_read_by(&self) -> Option<Instant> {
        self.due_later_unread
            .map(|(_, first)| first + READ_DUE_WITHIN)
    }

    /// Gives up reading the next due time after a failed read, keeping the time known
    /// before: the writer would otherwise try again on every turn, a hot loop on a broken
    /// disk. The next short claim asks again; the poll's claims find what falls due meanwhile.
    pub fn skip_due_later_read(&mut self) {
        self.due_later_unread = None;
    }

    /// Remembers when the first row not yet due falls due (`None`: no such row), as read
    /// after the last short claim.
    pub fn set_due_later(&mut self, at: Option<i64>) {
        self.due_later = at;
        self.due_later_unread = None;
    }

    /// When this lane next has something falling due (unix ms): a retry it scheduled or
    /// the row due later; the writer sleeps until then.
    pub fn next_due(&self) -> Option<i64> {
        let retry = self.retry_times.peek().map(|Reverse(t)| *t);
        [retry, self.due_later].into_iter().flatten().min()
    }

    /// How soon a lane with a claim due that it cannot make now should be looked at again:
    /// when its gate reopens, or after `poll` while its pacer or its in-flight limit holds
    /// it back. `None` when nothing holds a claim back, or only a disabling does (enabling
    /// writes to the file, which wakes the writer).
    pub fn held_back_for(&self, poll: Duration) -> Option<Duration> {
        if !self.claim_due || self.jobs_tx.is_none() || self.disabled.is_some() {
            return None;
        }
        if self.wants_claim() {
            return None;
        }
        Some(
            self.gate
                .reopens_in()
                .or_else(|| self.paced_wait())
                .unwrap_or(poll)
                .max(poll),
        )
    }

    /// How long until the pacer lets out what the next claim needs, while pacing alone holds
    /// the lane back: the writer sleeps that long rather than looking on every poll.
    fn paced_wait(&self) -> Option<Duration> {
        let pacer = self.pacer.as_ref()?;
        if self.paced_room().room > 0 {
            return None;
        }
        let window_secs = self.pace_window.as_secs_f64();
        let queued_jobs = self.jobs_rx.len() as f64;
        let allowance = pacer.allowance(self.pace_window);
        let mut wait = 0.0_f64;
        if let Some(requests) = allowance.requests {
            let need = queued_jobs + 1.0;
            wait = wait.max((need - requests) / pacer.requests_per_second());
        }
        if let Some(bytes) = allowance.bytes {
            // Until the debt is paid (see `paced_room`); more only with a claim under way.
            let paid_at = pacer.bytes_per_second() * window_secs;
            wait = wait.max((paid_at - bytes) / pacer.bytes_per_second());
        }
        (wait.is_finite() && wait > 0.0).then(|| Duration::from_secs_f64(wait.min(3600.0)))
    }

    /// Stops claiming until something wakes the lane (after a failed claim, so a broken disk
    /// does not turn the loop hot).
    pub fn rest(&mut self) {
        self.claim_due = false;
    }

    /// Takes the disabled state read from the database (an operator may have changed it).
    pub fn set_disabled(&mut self, reason: Option<String>) {
        self.gate.set_disabled(reason.is_some());
        self.disabled = reason;
    }

    /// Disables the lane for `reason`; returns whether it was enabled until now (and so the
    /// change needs persisting).
    pub fn disable(&mut self, reason: &str) -> bool {
        self.gate.set_disabled(true);
        if self.disabled.is_some() {
            return false;
        }
        self.disabled = Some(reason.to_string());
        true
    }

    /// Closes the lane: takes back the jobs no worker started and lets the workers exit
    /// after their current request.
    pub fn close(&mut self) -> Vec<Job> {
        self.gate.stop();
        let unstarted = self.jobs_rx.try_iter().collect();
        // Events waiting for a batch to fill are sent, not handed back: the workers take
        // what is queued before they see the queue closed.
        self.release_lingering(true);
        self.jobs_tx = None;
        unstarted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_size(batch: Option<usize>, workers: usize, claim_batch: usize) -> usize {
        let mut destination = Destination::http("d", "http://127.0.0.1:9/events");
        if let Some(n) = batch {
            destination = destination.batch(n, 1 << 20);
        }
        let config = RelayConfig::new().claim_batch(claim_batch);
        Lane::new(&destination, workers, &config).claim_batch
    }

    #[test]
    fn a_batching_destination_claims_whole_rounds_of_batches_within_four_claims() {
        // One event a request: the configured claim.
        assert_eq!(claim_size(None, 4, 100), 100);
        // Four batches per worker when that stays within four claims' worth.
        assert_eq!(claim_size(Some(25), 4, 100), 400);
        assert_eq!(claim_size(Some(60), 2, 100), 400, "capped at four claims");
        // One batch per worker at least, however large.
        assert_eq!(claim_size(Some(100), 4, 100), 400);
        assert_eq!(claim_size(Some(500), 4, 100), 2000);
        // Never below the configured claim; a smaller configured claim keeps claims small.
        assert_eq!(claim_size(Some(5), 1, 100), 100);
        assert_eq!(claim_size(Some(25), 4, 10), 100);
    }

    fn events(n: i64) -> Vec<OutboundEvent> {
        (1..=n)
            .map(|id| {
                let mut e = OutboundEvent::new("t", &serde_json::json!(id));
                e.id = id;
                e
            })
            .collect()
    }

    fn job_sizes(lane: &Lane, n: i64) -> Vec<usize> {
        lane.group_into_jobs(events(n))
            .iter()
            .map(Vec::len)
            .collect()
    }

    #[test]
    fn a_refused_batch_teaches_the_lane_its_halves_size_until_enough_deliveries_double_it() {
        let destination = Destination::http("d", "http://127.0.0.1:9/events").batch(100, 1 << 20);
        let mut lane = Lane::new(&destination, 1, &RelayConfig::new());
        assert_eq!(job_sizes(&lane, 100), [100]);
        // A batch of 100 refused, then a half of 50: the next claims group by 25.
        assert!(lane.split_again(events(100)).is_empty());
        assert!(lane.split_again(events(50)).is_empty());
        assert_eq!(job_sizes(&lane, 60), [25, 25, 10]);
        // Smaller requests delivered do not count; full ones do, and double it.
        for _ in 0..SPLIT_CAP_GROWS_AFTER {
            lane.delivered_request(10);
        }
        assert_eq!(job_sizes(&lane, 60), [25, 25, 10]);
        for _ in 0..SPLIT_CAP_GROWS_AFTER {
            lane.delivered_request(25);
        }
        assert_eq!(job_sizes(&lane, 60), [50, 10]);
        for _ in 0..SPLIT_CAP_GROWS_AFTER {
            lane.delivered_request(50);
        }
        assert_eq!(
            job_sizes(&lane, 120),
            [100, 20],
            "back to the destination's limit"
        );
    }

    #[test]
    fn the_next_due_time_is_read_once_after_a_short_claim_unless_the_read_fails() {
        let destination = Destination::http("d", "http://127.0.0.1:9/events");
        let mut lane = Lane::new(&destination, 1, &RelayConfig::new());
        assert_eq!(lane.due_later_to_read(), None, "nothing claimed yet");
        lane.caught_up_at(1_000);
        lane.caught_up_at(2_000);
        // Nothing is out: read at once, after the last short claim.
        assert_eq!(lane.due_later_to_read(), Some(2_000));
        lane.set_due_later(Some(5_000));
        assert_eq!(lane.due_later_to_read(), None);
        assert_eq!(lane.due_later_read_by(), None, "no timer left");
        assert_eq!(lane.next_due(), Some(5_000));
        // A failed read is not tried again on every turn; the known time stays.
        lane.caught_up_at(3_000);
        lane.skip_due_later_read();
        assert_eq!(lane.due_later_to_read(), None);
        assert_eq!(lane.due_later_read_by(), None);
        assert_eq!(lane.next_due(), Some(5_000));
    }
}
