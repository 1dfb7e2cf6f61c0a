//! What a worker tells the writer about one request: each event's decision, and what the
//! answers say about the destination. Built by the workers, read by the writer; its own file,
//! below both, so neither imports the other.

use std::time::Duration;

use crate::relay::decide::{decide, Context, Decision, GateChange, Policy, Tried};
use crate::relay::lane::Job;
use crate::store::queue::WriteBack;
use crate::transport::{Attempt, OutboundEvent};

/// The one message a worker sends back: the decisions of one request, for its lane.
///
/// The events travel back in the very vector the writer claimed them into, and one
/// decision is kept for all of them when they share it (a delivered request always does),
/// so the common report holds no memory a worker allocated. Why it matters: glibc's
/// allocator locks the arena a block came from whenever the thread that frees it cannot
/// keep it, and a worker re-collecting its events into a new vector freed the writer's
/// blocks while the writer allocated the next claim's from the same arena. Two threads
/// waiting on each other's allocator lock were most of the relay's `futex` calls.
#[derive(Debug)]
pub(crate) struct Report {
    /// The index of the lane the request came from.
    lane: usize,
    /// Every event of the request, in the order of `decisions`.
    events: Job,
    /// What to do about each event.
    pub(super) decisions: Decisions,
    /// What the request's answers tell about the destination.
    gate: Option<GateChange>,
}

/// The decisions of a request's events.
#[derive(Debug)]
pub(super) enum Decisions {
    /// One decision for every event: the request was answered one way.
    Same(Decision),
    /// One decision per event, in the events' order.
    Each(Vec<Decision>),
}

impl Decisions {
    /// Keeps `decisions` once if they are all the same, else one per event.
    fn gather(mut decisions: impl Iterator<Item = Decision>) -> Decisions {
        let Some(first) = decisions.next() else {
            return Decisions::Each(Vec::new());
        };
        let mut same = 1;
        while let Some(next) = decisions.next() {
            if next != first {
                let mut each: Vec<Decision> = std::iter::repeat_n(first, same).collect();
                each.push(next);
                each.extend(decisions);
                return Decisions::Each(each);
            }
            same += 1;
        }
        Decisions::Same(first)
    }

    /// The decision of event number `index`.
    fn of(&self, index: usize) -> &Decision {
        match self {
            Decisions::Same(decision) => decision,
            Decisions::Each(each) => &each[index],
        }
    }
}

/// The decisions of a request's events, made before they are put in a report: a panic
/// while deciding leaves the events with the caller, to hand back
/// ([`Report::released`]).
#[derive(Debug)]
pub(crate) struct Decided {
    decisions: Decisions,
    gate: Option<GateChange>,
}

impl Decided {
    /// Every event by one outcome; `down` as in [`decide`].
    pub(crate) fn by_one(
        events: &[OutboundEvent],
        tried: &Tried<'_>,
        policy: &Policy,
        now: i64,
        down: bool,
    ) -> Decided {
        let backoff = backoff(tried, events, policy);
        let context = Context {
            down,
            batch: events.len() > 1,
        };
        let decisions = Decisions::gather(
            events
                .iter()
                .map(|event| decide(tried, event.attempts, backoff, policy, now, context)),
        );
        let gate = (!events.is_empty()).then(|| decisions.of(0).gate.clone());
        Decided { decisions, gate }
    }

    /// Each event by its own outcome. One request's events usually share one (a whole HTTP
    /// batch, an MQTT connection lost): then they are decided together, as one backoff
    /// draw.
    pub(crate) fn each(
        events: &[OutboundEvent],
        attempts: &[Attempt],
        policy: &Policy,
        now: i64,
        down: bool,
    ) -> Decided {
        if let Some(first) = attempts.first() {
            if attempts.len() == events.len() && attempts.iter().all(|a| a == first) {
                return Decided::by_one(events, &Tried::Attempted(first), policy, now, down);
            }
        }
        let lost = Attempt::Failed {
            reason: "the transport reported no outcome for this event".into(),
        };
        let decisions: Vec<Decision> = events
            .iter()
            .enumerate()
            .map(|(i, event)| {
                let tried = Tried::Attempted(attempts.get(i).unwrap_or(&lost));
                let backoff = backoff(&tried, std::slice::from_ref(event), policy);
                let context = Context { down, batch: false };
                decide(&tried, event.attempts, backoff, policy, now, context)
            })
            .collect();
        // The destination's gate follows the answer that says most about it: no answer, a
        // pause or a 410 from any event; else the first event's.
        let says_more = |g: &GateChange| !matches!(g, GateChange::Unchanged | GateChange::Answered);
        let gate = decisions
            .iter()
            .map(|d| &d.gate)
            .find(|g| says_more(g))
            .or(decisions.first().map(|d| &d.gate))
            .cloned();
        Decided {
            decisions: Decisions::Each(decisions),
            gate,
        }
    }
}

impl Report {
    /// A report for `events` that were never sent (shutdown), deciding as a worker would.
    pub fn not_sent(lane: usize, events: Job, policy: &Policy, now: i64) -> Report {
        Report::decide(lane, events, &Tried::Skipped, policy, now, false)
    }

    /// Decides every event of a request by one outcome; `down` as in [`decide`].
    pub(crate) fn decide(
        lane: usize,
        events: Job,
        tried: &Tried<'_>,
        policy: &Policy,
        now: i64,
        down: bool,
    ) -> Report {
        let decided = Decided::by_one(&events, tried, policy, now, down);
        Report::of(lane, events, decided)
    }

    /// Decides each event by its own outcome (see [`Decided::each`]).
    pub(crate) fn decide_each(
        lane: usize,
        events: Job,
        attempts: &[Attempt],
        policy: &Policy,
        now: i64,
        down: bool,
    ) -> Report {
        let decided = Decided::each(&events, attempts, policy, now, down);
        Report::of(lane, events, decided)
    }

    /// The report of `events` with the decisions made for them.
    pub(crate) fn of(lane: usize, events: Job, decided: Decided) -> Report {
        Report {
            lane,
            events,
            decisions: decided.decisions,
            gate: decided.gate,
        }
    }

    /// A report that hands `events` back without recording anything of them, as if they
    /// had not been sent: for outcomes that could not be decided (a panic). Their leases
    /// end now and they go out again; nothing here reads a clock or the policy.
    pub(crate) fn released(lane: usize, events: Job) -> Report {
        Report {
            lane,
            events,
            decisions: Decisions::Same(Decision {
                write_back: WriteBack::Release {
                    error: None,
                    available_at: None,
                },
                gate: GateChange::Unchanged,
                split: false,
            }),
            gate: None,
        }
    }

    /// Whether every event of the request was delivered.
    pub fn all_delivered(&self) -> bool {
        let delivered = |d: &Decision| matches!(d.write_back, WriteBack::Delivered);
        match &self.decisions {
            Decisions::Same(decision) => delivered(decision),
            Decisions::Each(each) => each.iter().all(delivered),
        }
    }

    /// How many events the report covers.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Takes out the events to be sent again in smaller requests (their batch was refused
    /// for its content), in their order; the rest stay in the report.
    pub fn take_split(&mut self) -> Job {
        match &mut self.decisions {
            Decisions::Same(decision) if decision.split => std::mem::take(&mut self.events),
            Decisions::Same(_) => Vec::new(),
            Decisions::Each(each) => {
                if !each.iter().any(|d| d.split) {
                    return Vec::new();
                }
                let (mut split, mut kept_events, mut kept) = (Vec::new(), Vec::new(), Vec::new());
                for (event, decision) in std::mem::take(&mut self.events)
                    .into_iter()
                    .zip(each.drain(..))
                {
                    if decision.split {
                        split.push(event);
                    } else {
                        kept_events.push(event);
                        kept.push(decision);
                    }
                }
                self.events = kept_events;
                *each = kept;
                split
            }
        }
    }

    /// The index of the lane the request came from.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// The request's events.
    pub fn events(&self) -> &[OutboundEvent] {
        &self.events
    }

    /// Every event of the request with what to do about it.
    pub fn decided(&self) -> impl Iterator<Item = (&OutboundEvent, &Decision)> {
        let decisions = &self.decisions;
        self.events
            .iter()
            .enumerate()
            .map(move |(i, event)| (event, decisions.of(i)))
    }

    /// What the request's answer tells about the destination (the same for all its events).
    pub fn gate_change(&self) -> Option<&GateChange> {
        self.gate.as_ref()
    }
}

/// The backoff that `tried` makes `events` wait out, drawn once for all of them. Only a
/// failure waits: a delivered request skips the draw (a pass over its events) on the hot
/// path.
fn backoff(tried: &Tried<'_>, events: &[OutboundEvent], policy: &Policy) -> Duration {
    let delivered = matches!(
        tried,
        Tried::Attempted(Attempt::Answered {
            status: 200..=299,
            ..
        })
    );
    if delivered {
        Duration::ZERO
    } else {
        policy.draw_backoff(events)
    }
}
