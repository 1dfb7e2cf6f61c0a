//! A delivery worker: takes a lane's jobs, sends each through the transport, decides what
//! came of it, and sends the writer one [`Report`] per request.
//!
//! Workers never touch SQLite, so a slow receiver cannot hold the database's write lock.
//! They update the destination's gate themselves, the moment a decision is known, so
//! requests already queued behind a failure are handed back instead of sent.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::clock::Clock;
use crate::observe::spans::SendSpan;
use crate::relay::backlog::{Backlog, SETTLING_PER_WORKER};
use crate::relay::config::RelayConfig;
use crate::relay::decide::{is_sick, Policy, Tried};
use crate::relay::gate::Gate;
use crate::relay::lane::{Job, Lane};
use crate::relay::pacer::Pacer;
use crate::relay::panic::panic_message;
use crate::relay::report::{Decided, Report};
use crate::relay::spending::{Spending, Verdict};
use crate::relay::voice::Voice;
use crate::transport::sending::{Outcomes, Then};
use crate::transport::{Attempt, OutboundEvent, Sending, Transport};

/// Whether the destination was judged down before this request's answers, counting its
/// first sick answer (one request is one answer, for its first such event) towards the
/// judgement. Answers that are not sick leave the count to the gate's change.
fn judge(gate: &Gate, events: &[OutboundEvent], attempts: &[Attempt]) -> bool {
    match attempts.iter().zip(events).find(|(a, _)| is_sick(a)) {
        Some((_, event)) => gate.sick_answer(event.id),
        None => gate.is_down(),
    }
}

/// One delivery thread of one destination.
pub(crate) struct Worker {
    lane: usize,
    jobs: Receiver<Job>,
    reports: Sender<Report>,
    transport: Arc<dyn Transport>,
    gate: Arc<Gate>,
    voice: Arc<Voice>,
    pacer: Option<Arc<Pacer>>,
    /// The destination's data budget, if it has one.
    spending: Option<Arc<Spending>>,
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
            voice: lane.voice(),
            pacer: lane.pacer(),
            spending: lane.spending().cloned(),
            clock,
            lease_ms: config.lease_ms(),
            policy: Policy::new(config),
        }
    }

    /// Delivers jobs until the lane closes (the writer dropped the job sender) or the
    /// writer stops listening.
    ///
    /// A transport may leave a request on its way (MQTT: published, PUBACKs to come):
    /// - if it settles the outcomes on a thread of its own, the report goes to the writer
    ///   from that thread, and this worker goes on to its next job at once, up to
    ///   [`SETTLING_PER_WORKER`] requests ahead (see [`backlog`](crate::relay::backlog));
    /// - else the request is awaited only once the next queued job has been handed over
    ///   too, so the connection always has this worker's next request ready behind it.
    pub fn run(self) {
        let backlog = Arc::new(Backlog::default());
        let mut settling: VecDeque<(Instant, Arc<Outcomes>)> = VecDeque::new();
        let mut on_its_way: Option<OnItsWay> = None;
        loop {
            expire_overdue(&mut settling);
            if backlog.open() >= SETTLING_PER_WORKER {
                // Woken once half are answered, or at the oldest one's deadline. (None
                // listed but some open: their reports are being sent right now.)
                let deadline = settling
                    .front()
                    .map_or_else(|| Instant::now() + REPORTING_NOW, |(d, _)| *d);
                backlog.wait_for(SETTLING_PER_WORKER / 2, deadline);
                continue;
            }
            let next = if on_its_way.is_some() {
                self.jobs.try_recv().ok()
            } else if let Some((deadline, _)) = settling.front() {
                match self.jobs.recv_deadline(*deadline) {
                    Ok(job) => Some(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match self.jobs.recv() {
                    Ok(job) => Some(job),
                    Err(_) => break,
                }
            };
            let Some(events) = next else {
                // Nothing queued (or the lane closed): the request on its way comes first.
                if let Some(request) = on_its_way.take() {
                    if self.reports.send(self.finish(request)).is_err() {
                        return;
                    }
                }
                continue;
            };
            // An event past its deadline is never sent, even before the writer's sweep has
            // marked it expired: it is handed back (no attempt spent), and the sweep takes it.
            let now = self.clock.now_ms();
            let is_late = |e: &OutboundEvent| e.expires_at.is_some_and(|deadline| deadline <= now);
            // Most requests hold no late event: split (two new vectors, every event moved)
            // only when one does.
            let (late, events): (Vec<_>, Vec<_>) = if events.iter().any(is_late) {
                events.into_iter().partition(is_late)
            } else {
                (Vec::new(), events)
            };
            if !late.is_empty() {
                let report =
                    Report::decide(self.lane, late, &Tried::Skipped, &self.policy, now, false);
                if self.reports.send(report).is_err() {
                    return;
                }
            }
            if events.is_empty() {
                continue;
            }
            // A paced request may wait long before it goes: the one on its way is reported
            // first, so its outcome (and its key's next event) does not wait with it.
            if self.pacer.is_some() {
                if let Some(request) = on_its_way.take() {
                    if self.reports.send(self.finish(request)).is_err() {
                        return;
                    }
                }
            }
            let done = match self.start(events, &backlog) {
                Started::Done(report) => Some(report),
                Started::Settling(deadline, outcomes) => {
                    settling.push_back((deadline, outcomes));
                    None
                }
                Started::OnItsWay(request) => on_its_way
                    .replace(request)
                    .map(|earlier| self.finish(earlier)),
            };
            if let Some(report) = done {
                if self.reports.send(report).is_err() {
                    return;
                }
            }
        }
        // The lane closed: every request still settling is reported before the worker
        // ends, by its answer or at its deadline.
        while backlog.open() > 0 {
            expire_overdue(&mut settling);
            let Some((deadline, _)) = settling.front() else {
                break;
            };
            backlog.wait_for(0, *deadline);
        }
    }

    /// Whether half the lease of one of `events` is gone: a request might then outlive it
    /// and race another relay's claim, so the events go back instead. Gone by either clock:
    /// the monotonic one cannot step, and other relays judge the lease by the wall clock.
    fn lease_short(&self, events: &[OutboundEvent]) -> bool {
        // The first lease to end decides (a job's events usually share one claim's), each
        // clock read once.
        let wall_end = events.iter().map(|e| e.lease_expires_at).min();
        let monotonic_end = events.iter().filter_map(|e| e.lease_ends).min();
        let half = Duration::from_millis((self.lease_ms / 2).max(0) as u64);
        wall_end.is_some_and(|end| self.clock.now_ms() + self.lease_ms / 2 > end)
            || monotonic_end.is_some_and(|end| Instant::now() + half > end)
    }

    /// Waits for the destination's rate and bandwidth limits to allow this request; false
    /// if the gate closed or the relay began to stop meanwhile (the events are then handed
    /// back, nothing spent).
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
            if self.gate.is_closed() || self.gate.is_stopping() {
                return false;
            }
            std::thread::sleep(left.min(PACE_SLICE));
        }
        true
    }

    /// Asks the destination's budget whether `events` may go now.
    fn admit(&self, events: &[OutboundEvent]) -> Admission {
        let Some(spending) = &self.spending else {
            return Admission::Unbudgeted;
        };
        let exempt = spending
            .exempt_priority()
            .is_some_and(|p| events.iter().all(|e| e.priority >= p));
        // The events' data, not the encoded body: see `spending`.
        let body: u64 = events.iter().map(|e| e.payload.len() as u64).sum();
        loop {
            match spending.admit(body, exempt) {
                Verdict::Go(reservation) => {
                    return Admission::Admitted(Admitted {
                        spending: Arc::clone(spending),
                        reservation,
                        body,
                        // Nothing else on this thread touches the network before the send.
                        wire_before: crate::transport::wire_bytes_here(),
                    });
                }
                Verdict::Hold => return Admission::Held,
                // Other workers' requests are under way: their count comes within their
                // request timeout. The events go back meanwhile if the relay stops, the
                // gate closes or half their lease is gone.
                Verdict::Wait => {
                    if self.gate.is_closed() || self.gate.is_stopping() || self.lease_short(events)
                    {
                        return Admission::Held;
                    }
                    std::thread::sleep(BUDGET_WAIT_SLICE);
                }
            }
        }
    }

    /// Hands `events` to the transport: a report if the outcome is already known (sent and
    /// answered, skipped, panicked), else the request on its way.
    fn start(&self, events: Job, backlog: &Arc<Backlog>) -> Started {
        // Judged before the pace (a job handed back takes no turn of it) and again after,
        // when the request would really start.
        let paced = !self.gate.is_closed() && !self.lease_short(&events) && self.pace(&events);
        let now = self.clock.now_ms();
        if !paced || self.gate.is_closed() || self.lease_short(&events) {
            let report =
                Report::decide(self.lane, events, &Tried::Skipped, &self.policy, now, false);
            return Started::Done(report);
        }
        // The data budget last, when the request would really start: held back, the events
        // go back unsent (no attempt spent) and the lane claims only exempt ones.
        let admitted = match self.admit(&events) {
            Admission::Unbudgeted => None,
            Admission::Admitted(spending) => Some(spending),
            Admission::Held => {
                let report =
                    Report::decide(self.lane, events, &Tried::Skipped, &self.policy, now, false);
                return Started::Done(report);
            }
        };
        // One span per attempt, current while the transport starts the request (its
        // `traceparent` header names it), ended when the outcomes are known.
        let span = SendSpan::start(&events[0].destination, &events, now);
        let sending = catch_unwind(AssertUnwindSafe(|| {
            span.in_scope(|| self.transport.start_each(&events))
        }))
        .map(Sending::into_settling);
        if let Some(Admitted {
            spending,
            reservation,
            body,
            wire_before,
        }) = admitted
        {
            // What this thread wrote to and read from the sockets meanwhile: all of an HTTP
            // request, connection and answer included (0 for a transport that does its
            // I/O elsewhere: its body counts).
            let measured = crate::transport::wire_bytes_here().wrapping_sub(wire_before);
            spending.spent(reservation, body, measured);
        }
        match sending {
            Ok(Ok((outcomes, deadline))) => {
                backlog.opened();
                outcomes.then(self.reporter(events, span, Arc::clone(backlog)));
                Started::Settling(deadline, outcomes)
            }
            Ok(Err(sending)) if sending.is_done() => Started::Done(self.finish(OnItsWay {
                events,
                span,
                sending: Ok(sending),
            })),
            Ok(Err(sending)) => Started::OnItsWay(OnItsWay {
                events,
                span,
                sending: Ok(sending),
            }),
            Err(panic) => Started::Done(self.finish(OnItsWay {
                events,
                span,
                sending: Err(panic_message(&*panic)),
            })),
        }
    }

    /// What reports a request's outcomes from the thread that settles the last of them:
    /// decides them, tells the gate, sends the report, and counts the request done.
    fn reporter(&self, events: Job, span: SendSpan, backlog: Arc<Backlog>) -> Then {
        let lane = self.lane;
        let policy = self.policy;
        let clock = Arc::clone(&self.clock);
        let gate = Arc::clone(&self.gate);
        let voice = Arc::clone(&self.voice);
        let reports = self.reports.clone();
        Box::new(move |attempts| {
            span.end(|| failure_name(&attempts));
            voice.heard(&attempts);
            // This runs on the transport's thread (MQTT's connection): a panic here (a
            // clock that panics) must not take the connection down with it, nor the events
            // with it: they are decided by reference, and handed back if that panicked.
            let decided = catch_unwind(AssertUnwindSafe(|| {
                let down = judge(&gate, &events, &attempts);
                Decided::each(&events, &attempts, &policy, clock.now_ms(), down)
            }));
            let report = match decided {
                Ok(decided) => Report::of(lane, events, decided),
                Err(panic) => {
                    log::error!(
                        "the outcomes of a request could not be decided ({}); its {} events \
                         are handed back and go out again",
                        panic_message(&*panic),
                        events.len()
                    );
                    Report::released(lane, events)
                }
            };
            if let Some(change) = report.gate_change() {
                gate.apply(change);
            }
            // A writer that stopped listening has shut down: the leases expire instead.
            let _ = reports.send(report);
            backlog.closed();
        })
    }

    /// Waits for a request's outcomes, decides them, and tells the gate.
    fn finish(&self, request: OnItsWay) -> Report {
        let OnItsWay {
            events,
            span,
            sending,
        } = request;
        let attempts = sending.and_then(|sending| {
            catch_unwind(AssertUnwindSafe(|| sending.wait()))
                .map_err(|panic| panic_message(&*panic))
        });
        match &attempts {
            Ok(attempts) => span.end(|| failure_name(attempts)),
            Err(_) => span.end(|| Some("panic".to_owned())),
        }
        let now = self.clock.now_ms();
        let report = match attempts {
            Ok(attempts) => {
                self.voice.heard(&attempts);
                let down = judge(&self.gate, &events, &attempts);
                Report::decide_each(self.lane, events, &attempts, &self.policy, now, down)
            }
            Err(msg) => {
                let first = events.first().map_or("", |e| e.event_id.as_str());
                log::error!("event {first}: transport panicked: {msg}");
                Report::decide(
                    self.lane,
                    events,
                    &Tried::Panicked(&msg),
                    &self.policy,
                    now,
                    false,
                )
            }
        };
        if let Some(change) = report.gate_change() {
            self.gate.apply(change);
        }
        report
    }
}

/// What handing a request to the transport came to.
enum Started {
    /// Its outcome is known.
    Done(Report),
    /// Its outcomes are settled by the transport and reported from there; they count as
    /// failed if not all are in by the deadline.
    Settling(Instant, Arc<Outcomes>),
    /// It is on its way; its outcome is awaited later.
    OnItsWay(OnItsWay),
}

/// A request handed to the transport, and what to wait on for its outcomes (or the
/// transport's panic message).
struct OnItsWay {
    events: Job,
    span: SendSpan,
    sending: std::result::Result<Sending, String>,
}

/// Forgets the requests at the front that are answered, and settles as failed those past
/// their deadline (their report then goes out from this thread).
fn expire_overdue(settling: &mut VecDeque<(Instant, Arc<Outcomes>)>) {
    while let Some((deadline, outcomes)) = settling.front() {
        if !outcomes.is_settled() && Instant::now() < *deadline {
            break;
        }
        outcomes.expire();
        settling.pop_front();
    }
}

/// What an attempt's failure is called on its span (`error.type`): the first event's
/// outcome that is not a delivery, as an HTTP status or the kind of failure. None when every
/// event was delivered.
fn failure_name(attempts: &[Attempt]) -> Option<String> {
    attempts.iter().find_map(|attempt| match attempt {
        Attempt::Answered { status, .. } if (200..300).contains(status) => None,
        Attempt::Answered { status, .. } => Some(status.to_string()),
        Attempt::Unreachable { .. } => Some("unreachable".to_owned()),
        Attempt::Failed { .. } => Some("no_answer".to_owned()),
        Attempt::Unsendable { .. } => Some("unsendable".to_owned()),
    })
}

/// The longest a worker waits for reports that are being sent as it looks.
const REPORTING_NOW: Duration = Duration::from_millis(10);

/// How long a pacing worker sleeps before it looks at the gate again.
const PACE_SLICE: Duration = Duration::from_millis(50);

/// The size of the request body `events` make: one structured event, or a batch.
/// How long a worker waits before asking the budget again while other workers' requests
/// are under way.
const BUDGET_WAIT_SLICE: Duration = Duration::from_millis(5);

/// What a destination's data budget says of a request.
enum Admission {
    /// The destination has no budget.
    Unbudgeted,
    /// It may go: count it against its reservation once sent.
    Admitted(Admitted),
    /// It waits for the next period (or the relay stops, the gate closed, its lease is half
    /// gone): it goes back unsent.
    Held,
}

/// A request the budget let go: what it reserved, its events' data's size, and this
/// thread's bytes on the wire before it (read only for a budget: a request without one
/// pays nothing for the count).
struct Admitted {
    spending: Arc<Spending>,
    reservation: u64,
    body: u64,
    wire_before: u64,
}

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
    use crate::relay::decide::GateChange;
    use crate::relay::report::Decisions;

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

    /// A transport that logs when each request starts and when its answers are awaited;
    /// `pipelined` says whether it leaves requests on their way (as MQTT does).
    struct Logging {
        log: Arc<std::sync::Mutex<Vec<String>>>,
        pipelined: bool,
    }

    impl Transport for Logging {
        fn send(&self, _: &[OutboundEvent]) -> Attempt {
            delivered()
        }

        fn start_each(&self, events: &[OutboundEvent]) -> Sending {
            let id = events[0].id;
            self.log.lock().unwrap().push(format!("start {id}"));
            let answers = vec![delivered(); events.len()];
            if !self.pipelined {
                return Sending::done(answers);
            }
            let log = Arc::clone(&self.log);
            Sending::waiting(move || {
                log.lock().unwrap().push(format!("wait {id}"));
                answers
            })
        }
    }

    /// A worker of lane 0 sending through `transport`, with jobs of one event each (ids
    /// 1..=n, leases that never end) queued and the lane closed behind them.
    fn worker_over(n: i64, transport: Arc<dyn Transport>) -> (Worker, Receiver<Report>) {
        let config = RelayConfig::new();
        let (jobs_tx, jobs) = crossbeam_channel::unbounded();
        let (reports, reports_rx) = crossbeam_channel::unbounded();
        for id in 1..=n {
            let mut e = event(id);
            e.lease_expires_at = i64::MAX;
            jobs_tx.send(vec![e]).unwrap();
        }
        drop(jobs_tx);
        let worker = Worker {
            lane: 0,
            jobs,
            reports,
            transport,
            gate: Arc::new(Gate::new(config.offline)),
            voice: Arc::new(Voice::new("default")),
            pacer: None,
            spending: None,
            clock: Arc::new(crate::clock::SystemClock),
            lease_ms: config.lease_ms(),
            policy: Policy::new(&config),
        };
        (worker, reports_rx)
    }

    /// The id of a single-event report's event, which must have been delivered.
    fn delivered_id(report: Report) -> i64 {
        let (event, decision) = report.decided().next().expect("one event");
        assert_eq!(
            decision.write_back,
            crate::store::queue::WriteBack::Delivered
        );
        event.id
    }

    /// Runs one worker over jobs of one event each (ids 1..=n, all queued before it starts)
    /// and returns the transport's log and the ids of the reports in the order they came.
    fn run_worker(n: i64, pipelined: bool) -> (Vec<String>, Vec<i64>) {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let transport = Logging {
            log: Arc::clone(&log),
            pipelined,
        };
        let (worker, reports_rx) = worker_over(n, Arc::new(transport));
        worker.run();
        let reported = reports_rx.try_iter().map(delivered_id).collect();
        let log = log.lock().unwrap().clone();
        (log, reported)
    }

    #[test]
    fn a_request_on_its_way_is_awaited_after_the_next_one_is_handed_over() {
        let (log, reported) = run_worker(3, true);
        assert_eq!(
            log,
            ["start 1", "start 2", "wait 1", "start 3", "wait 2", "wait 3"],
            "the next request goes to the transport before the last one is awaited"
        );
        assert_eq!(reported, [1, 2, 3], "one report per request, in order");
    }

    #[test]
    fn a_transport_that_answers_at_once_is_reported_at_once() {
        let (log, reported) = run_worker(3, false);
        assert_eq!(log, ["start 1", "start 2", "start 3"]);
        assert_eq!(reported, [1, 2, 3]);
    }

    /// The outcomes a [`Settled`] transport left open, in the order it started them.
    type Open = Arc<std::sync::Mutex<Vec<Arc<Outcomes>>>>;

    /// A transport that leaves each request's outcomes open for the test to settle, as
    /// MQTT's connection thread does with PUBACKs.
    struct Settled {
        open: Open,
        timeout: Duration,
    }

    impl Transport for Settled {
        fn send(&self, _: &[OutboundEvent]) -> Attempt {
            delivered()
        }

        fn start_each(&self, events: &[OutboundEvent]) -> Sending {
            let outcomes = Outcomes::new(events.len(), "no answer in time".into());
            self.open.lock().unwrap().push(Arc::clone(&outcomes));
            Sending::settling(outcomes, self.timeout)
        }
    }

    /// Starts a worker on `jobs` single-event jobs through a [`Settled`] transport.
    fn settled_worker(
        jobs: i64,
        timeout: Duration,
    ) -> (Open, Receiver<Report>, std::thread::JoinHandle<()>) {
        let open = Arc::new(std::sync::Mutex::new(Vec::new()));
        let transport = Settled {
            open: Arc::clone(&open),
            timeout,
        };
        let (worker, reports_rx) = worker_over(jobs, Arc::new(transport));
        let thread = std::thread::spawn(move || worker.run());
        (open, reports_rx, thread)
    }

    fn wait_for_started(open: &std::sync::Mutex<Vec<Arc<Outcomes>>>, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while open.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "{n} requests were never started");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn outcomes_settled_elsewhere_are_reported_from_there_and_the_worker_runs_ahead() {
        let bound = SETTLING_PER_WORKER;
        let jobs = 2 * bound;
        let (open, reports, worker) = settled_worker(jobs as i64, Duration::from_secs(60));
        // The worker hands over requests without waiting for answers, up to its bound.
        wait_for_started(&open, bound);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(open.lock().unwrap().len(), bound, "bounded");
        assert!(
            reports.try_recv().is_err(),
            "nothing is reported before it is answered"
        );
        // One answer is not enough room: the worker waits until half are answered.
        open.lock().unwrap()[0].settle(0, delivered());
        let first = reports.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first.events()[0].id, 1, "reported by the settling thread");
        for answered in 1..bound / 2 - 1 {
            open.lock().unwrap()[answered].settle(0, delivered());
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            open.lock().unwrap().len(),
            bound,
            "one answer short of half: still waiting"
        );
        open.lock().unwrap()[bound / 2 - 1].settle(0, delivered());
        wait_for_started(&open, bound + bound / 2);
        // Answer the rest as they come; every request is reported once.
        let mut answered = bound / 2;
        while answered < jobs {
            wait_for_started(&open, answered + 1);
            open.lock().unwrap()[answered].settle(0, delivered());
            answered += 1;
        }
        worker.join().unwrap();
        let mut ids: Vec<i64> = std::iter::once(first)
            .chain(reports.try_iter())
            .map(delivered_id)
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (1..=jobs as i64).collect::<Vec<_>>());
    }

    #[test]
    fn outcomes_never_settled_fail_at_their_deadline_and_the_worker_still_ends() {
        let (open, reports, worker) = settled_worker(2, Duration::from_millis(100));
        worker.join().unwrap();
        assert_eq!(open.lock().unwrap().len(), 2);
        let reports: Vec<Report> = reports.try_iter().collect();
        assert_eq!(reports.len(), 2, "each unanswered request is reported");
        for report in reports {
            assert!(
                matches!(
                    &report.decided().next().expect("one event").1.write_back,
                    crate::store::queue::WriteBack::Retry { error, .. } if error.contains("no answer in time")
                ),
                "{:?}",
                report.decided().next().expect("one event").1.write_back
            );
        }
    }

    /// A wall clock that panics when read from a thread named "settler".
    struct PanicsOnSettler;

    impl crate::clock::Clock for PanicsOnSettler {
        fn now_ms(&self) -> i64 {
            assert_ne!(
                std::thread::current().name(),
                Some("settler"),
                "clock broke"
            );
            crate::clock::SystemClock.now_ms()
        }
    }

    #[test]
    fn a_panic_deciding_outcomes_spares_the_settling_thread_and_frees_the_worker() {
        let open: Open = Arc::new(std::sync::Mutex::new(Vec::new()));
        let transport = Settled {
            open: Arc::clone(&open),
            timeout: Duration::from_secs(60),
        };
        let (mut worker, reports) = worker_over(1, Arc::new(transport));
        worker.clock = Arc::new(PanicsOnSettler);
        let worker = std::thread::spawn(move || worker.run());
        wait_for_started(&open, 1);
        let outcomes = Arc::clone(&open.lock().unwrap()[0]);
        let settler = std::thread::Builder::new()
            .name("settler".into())
            .spawn(move || outcomes.settle(0, delivered()))
            .unwrap();
        assert!(settler.join().is_ok(), "the panic stayed in the report");
        // The worker is not left waiting for a report that will never come.
        worker.join().unwrap();
        // The events come back handed back, nothing recorded: before, no report came, and
        // the leases, under the relay's own prefix, held until it stopped.
        let report = reports.try_recv().expect("a report handing the event back");
        let (_, decision) = report.decided().next().expect("one event");
        assert!(
            matches!(
                decision.write_back,
                crate::store::queue::WriteBack::Release {
                    error: None,
                    available_at: None
                }
            ),
            "{:?}",
            decision.write_back
        );
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
            false,
        );
        let write_backs: Vec<_> = report
            .decided()
            .map(|(e, d)| (e.id, d.write_back.clone()))
            .collect();
        assert_eq!(
            write_backs[0],
            (1, crate::store::queue::WriteBack::Delivered)
        );
        assert!(matches!(
            write_backs[1],
            (2, crate::store::queue::WriteBack::Dead { .. })
        ));
        assert_eq!(
            write_backs[2],
            (3, crate::store::queue::WriteBack::Delivered)
        );
        assert_eq!(report.gate_change(), Some(&GateChange::Answered));
    }

    #[test]
    fn a_request_answered_one_way_keeps_one_decision_and_hands_back_the_claimed_vector() {
        let policy = Policy::new(&RelayConfig::new());
        let events = vec![event(1), event(2), event(3)];
        let claimed_at = events.as_ptr();
        let answers = [delivered(), delivered(), delivered()];
        let report = Report::decide_each(0, events, &answers, &policy, 1_000, false);
        assert!(matches!(report.decisions, Decisions::Same(_)));
        assert_eq!(
            report.events().as_ptr(),
            claimed_at,
            "the writer frees the vector it claimed into"
        );
        let ids: Vec<_> = report
            .decided()
            .map(|(e, d)| (e.id, d.write_back.clone()))
            .collect();
        let delivered = crate::store::queue::WriteBack::Delivered;
        assert_eq!(
            ids,
            [
                (1, delivered.clone()),
                (2, delivered.clone()),
                (3, delivered)
            ]
        );
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
            false,
        );
        assert_eq!(report.gate_change(), Some(&GateChange::Unreachable));
    }
}
