//! A delivery worker: takes a lane's jobs, sends each through the transport, decides what
//! came of it, and sends the writer one [`Report`] per request.
//!
//! Workers never touch SQLite, so a slow receiver cannot hold the database's write lock.
//! They update the destination's gate themselves, the moment a decision is known, so
//! requests already queued behind a failure are handed back instead of sent.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::clock::Clock;
use crate::relay::config::RelayConfig;
use crate::relay::decide::{decide, Decision, GateChange, Policy, Tried};
use crate::relay::gate::Gate;
use crate::relay::lane::{Job, Lane};
use crate::relay::pacer::Pacer;
use crate::relay::writer::panic_message;
use crate::transport::{Attempt, OutboundEvent, Transport};

/// The one message a worker sends back: the decisions of one request, for its lane.
#[derive(Debug)]
pub(crate) struct Report {
    /// The index of the lane the request came from.
    lane: usize,
    /// Every event of the request with what to do about it.
    decided: Vec<(OutboundEvent, Decision)>,
    /// What the request's answers tell about the destination.
    gate: Option<GateChange>,
}

impl Report {
    /// A report for `events` that were never sent (shutdown), deciding as a worker would.
    pub fn not_sent(lane: usize, events: Job, policy: &Policy, now: i64) -> Report {
        Report::decide(lane, events, &Tried::Skipped, policy, now)
    }

    fn decide(lane: usize, events: Job, tried: &Tried<'_>, policy: &Policy, now: i64) -> Report {
        // Only a failure waits out a backoff: a delivered request skips the draw (a pass over
        // its events) on the hot path.
        let delivered = matches!(
            tried,
            Tried::Attempted(Attempt::Answered {
                status: 200..=299,
                ..
            })
        );
        let backoff = if delivered {
            Duration::ZERO
        } else {
            policy.draw_backoff(&events)
        };
        let decided = events
            .into_iter()
            .map(|event| {
                let decision = decide(tried, event.attempts, backoff, policy, now);
                (event, decision)
            })
            .collect::<Vec<_>>();
        let gate = decided.first().map(|(_, d)| d.gate.clone());
        Report {
            lane,
            decided,
            gate,
        }
    }

    /// Decides each event by its own outcome. One request's events usually share one (a
    /// whole HTTP batch, an MQTT connection lost): then they are decided together, as one
    /// backoff draw.
    fn decide_each(
        lane: usize,
        events: Job,
        attempts: &[Attempt],
        policy: &Policy,
        now: i64,
    ) -> Report {
        let lost = Attempt::Failed {
            reason: "the transport reported no outcome for this event".into(),
        };
        let first = attempts.first().unwrap_or(&lost);
        if attempts.len() == events.len() && attempts.iter().all(|a| a == first) {
            return Report::decide(lane, events, &Tried::Attempted(first), policy, now);
        }
        let mut decided = Vec::with_capacity(events.len());
        for (i, event) in events.into_iter().enumerate() {
            let attempt = attempts.get(i).unwrap_or(&lost);
            let one = Report::decide(lane, vec![event], &Tried::Attempted(attempt), policy, now);
            decided.extend(one.decided);
        }
        // The destination's gate follows the answer that says most about it: no answer, a
        // pause or a 410 from any event; else the first event's.
        let says_more = |g: &GateChange| !matches!(g, GateChange::Unchanged | GateChange::Answered);
        let gate = decided
            .iter()
            .map(|(_, d)| &d.gate)
            .find(|g| says_more(g))
            .or(decided.first().map(|(_, d)| &d.gate))
            .cloned();
        Report {
            lane,
            decided,
            gate,
        }
    }

    /// How many events the report covers.
    pub fn len(&self) -> usize {
        self.decided.len()
    }

    /// Drops the outcomes whose lease has ended by `now` (another relay may hold them now,
    /// so only a new claim can deliver them); returns how many.
    pub fn drop_expired(&mut self, now: i64) -> usize {
        let before = self.decided.len();
        self.decided.retain(|(e, _)| e.lease_expires_at > now);
        before - self.decided.len()
    }

    /// The index of the lane the request came from.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// Every event of the request with what to do about it.
    pub fn decided(&self) -> &[(OutboundEvent, Decision)] {
        &self.decided
    }

    /// What the request's answer tells about the destination (the same for all its events).
    pub fn gate_change(&self) -> Option<&GateChange> {
        self.gate.as_ref()
    }
}

/// One delivery thread of one destination.
pub(crate) struct Worker {
    lane: usize,
    jobs: Receiver<Job>,
    reports: Sender<Report>,
    transport: Arc<dyn Transport>,
    gate: Arc<Gate>,
    pacer: Option<Arc<Pacer>>,
    clock: Arc<dyn Clock>,
    lease_ms: i64,
    policy: Policy,
}

impl Worker {
    /// A worker for lane number `index`, sending through `transport`.
    pub fn new(
        index: usize,
        lane: &Lane,
        transport: Arc<dyn Transport>,
        reports: Sender<Report>,
        clock: Arc<dyn Clock>,
        config: &RelayConfig,
    ) -> Worker {
        Worker {
            lane: index,
            jobs: lane.jobs(),
            reports,
            transport,
            gate: lane.gate(),
            pacer: lane.pacer(),
            clock,
            lease_ms: config.lease_ms(),
            policy: Policy::new(config),
        }
    }

    /// Delivers jobs until the lane closes (the writer dropped the job sender) or the
    /// writer stops listening.
    pub fn run(self) {
        while let Ok(events) = self.jobs.recv() {
            // An event past its deadline is never sent, even before the writer's sweep has
            // marked it expired: it is handed back (no attempt spent), and the sweep takes it.
            let now = self.clock.now_ms();
            let (late, events): (Vec<_>, Vec<_>) = events
                .into_iter()
                .partition(|e| e.expires_at.is_some_and(|deadline| deadline <= now));
            if !late.is_empty() {
                let report = Report::decide(self.lane, late, &Tried::Skipped, &self.policy, now);
                if self.reports.send(report).is_err() {
                    break;
                }
            }
            if events.is_empty() {
                continue;
            }
            if self.reports.send(self.deliver(events)).is_err() {
                break;
            }
        }
    }

    /// Waits for the destination's rate and bandwidth limits to allow this request; false
    /// if the gate closed meanwhile (the events are then handed back, nothing spent).
    fn pace(&self, events: &[OutboundEvent]) -> bool {
        let Some(pacer) = &self.pacer else {
            return true;
        };
        let bytes = if pacer.counts_bytes() {
            body_len(events)
        } else {
            0
        };
        // `Instant`, not the wall clock: waiting is not data.
        let until = Instant::now() + pacer.reserve(bytes);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if left.is_zero() {
                break;
            }
            if self.gate.is_closed() {
                return false;
            }
            std::thread::sleep(left.min(PACE_SLICE));
        }
        true
    }

    fn deliver(&self, events: Job) -> Report {
        // Paced first, so that the lease is judged when the request would really start.
        let paced = !self.gate.is_closed() && self.pace(&events);
        let now = self.clock.now_ms();
        // Once half the lease is gone a request might outlive it and race another relay's
        // claim; hand the events back instead.
        let lease_short = events
            .iter()
            .any(|e| now + self.lease_ms / 2 > e.lease_expires_at);
        if !paced || self.gate.is_closed() || lease_short {
            return Report::decide(self.lane, events, &Tried::Skipped, &self.policy, now);
        }
        let report = match catch_unwind(AssertUnwindSafe(|| self.transport.send_each(&events))) {
            Ok(attempts) => {
                let now = self.clock.now_ms();
                Report::decide_each(self.lane, events, &attempts, &self.policy, now)
            }
            Err(panic) => {
                let msg = panic_message(&*panic);
                let first = events.first().map_or("", |e| e.event_id.as_str());
                log::error!("event {first}: transport panicked: {msg}");
                let now = self.clock.now_ms();
                Report::decide(self.lane, events, &Tried::Panicked(&msg), &self.policy, now)
            }
        };
        if let Some(change) = report.gate_change() {
            self.gate.apply(change);
        }
        report
    }
}

/// How long a pacing worker sleeps before it looks at the gate again.
const PACE_SLICE: Duration = Duration::from_millis(50);

/// The size of the request body `events` make: one structured event, or a batch.
fn body_len(events: &[OutboundEvent]) -> usize {
    let body = match events {
        [one] => crate::wire::structured_body(one),
        many => crate::wire::batch_body(many),
    };
    body.map_or(0, |b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64) -> OutboundEvent {
        let mut e = crate::internal::sample_event(&serde_json::json!({"n": id}));
        e.id = id;
        e
    }

    fn delivered() -> Attempt {
        Attempt::Answered {
            status: 200,
            retry_after: None,
            detail: String::new(),
        }
    }

    #[test]
    fn each_event_of_a_request_is_decided_by_its_own_outcome() {
        let policy = Policy::new(&RelayConfig::new());
        let too_big = Attempt::Unsendable {
            reason: "too big".into(),
        };
        let report = Report::decide_each(
            0,
            vec![event(1), event(2), event(3)],
            &[delivered(), too_big, delivered()],
            &policy,
            1_000,
        );
        let write_backs: Vec<_> = report
            .decided()
            .iter()
            .map(|(e, d)| (e.id, d.write_back.clone()))
            .collect();
        assert_eq!(write_backs[0], (1, crate::queue::WriteBack::Delivered));
        assert!(matches!(
            write_backs[1],
            (2, crate::queue::WriteBack::Dead { .. })
        ));
        assert_eq!(write_backs[2], (3, crate::queue::WriteBack::Delivered));
        assert_eq!(report.gate_change(), Some(&GateChange::Answered));
    }

    #[test]
    fn a_destination_wide_outcome_of_any_event_sets_the_gate() {
        let policy = Policy::new(&RelayConfig::new());
        let lost = Attempt::Unreachable {
            reason: "connection lost".into(),
        };
        let report = Report::decide_each(
            0,
            vec![event(1), event(2)],
            &[delivered(), lost],
            &policy,
            1_000,
        );
        assert_eq!(report.gate_change(), Some(&GateChange::Unreachable));
    }
}
