//! A request on its way: what [`Transport::start_each`](super::Transport::start_each) returns,
//! so a worker can hand the next request to the transport before this one is answered.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Attempt;

/// The most requests one worker keeps waiting for their outcomes. A transport that queues
/// requests behind its in-flight window must have room for this many per worker. With one
/// event a request, each wake costs the connection thread a futex call between two PUBACKs:
/// 4 workers × 1 to Mosquitto delivered 32k–37k events/s with 4 (a wake per 2 PUBACKs per
/// worker), 38k–39k/s with 8, 37k–41k/s with 16.
pub(crate) const SETTLING_PER_WORKER: usize = 16;

/// The outcomes of a request, now or later. [`wait`](Self::wait) gives one outcome per
/// event, in order, as [`Transport::send_each`](super::Transport::send_each) would.
pub struct Sending {
    state: State,
}

enum State {
    /// Answered already (the transport sent and waited in `start_each`).
    Done(Vec<Attempt>),
    /// Sent; waiting for the answers blocks, bounded by the transport's own timeout.
    Waiting(Box<dyn FnOnce() -> Vec<Attempt> + Send>),
    /// Sent; the answers are filled in by a thread of the transport's (MQTT's connection
    /// thread), and the unanswered ones count as failed after `deadline`. Without the `mqtt`
    /// feature only the relay's own tests build one, but the worker's path for it stays one
    /// path whatever the features.
    #[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
    Settling {
        outcomes: Arc<Outcomes>,
        deadline: Instant,
    },
}

impl Sending {
    /// Outcomes that are already known.
    pub fn done(attempts: Vec<Attempt>) -> Sending {
        Sending {
            state: State::Done(attempts),
        }
    }

    /// A request on its way: `wait` blocks until its outcomes are known. It must return
    /// within a bounded time (the transport's timeout), like `send_each`.
    pub fn waiting(wait: impl FnOnce() -> Vec<Attempt> + Send + 'static) -> Sending {
        Sending {
            state: State::Waiting(Box::new(wait)),
        }
    }

    /// A request whose outcomes the transport settles one by one in `outcomes`; those not
    /// settled within `timeout` count as failed attempts.
    #[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
    pub(crate) fn settling(outcomes: Arc<Outcomes>, timeout: Duration) -> Sending {
        Sending {
            state: State::Settling {
                outcomes,
                deadline: Instant::now() + timeout,
            },
        }
    }

    /// Whether the outcomes are known without waiting.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done(_))
    }

    /// The outcomes, one per event in order; blocks (bounded) while the request is on its way.
    pub fn wait(self) -> Vec<Attempt> {
        match self.state {
            State::Done(attempts) => attempts,
            State::Waiting(wait) => wait(),
            State::Settling { outcomes, deadline } => outcomes.wait_until(deadline),
        }
    }

    /// The outcomes being settled and their deadline, when the transport settles them on a
    /// thread of its own: the relay then has them reported from that thread instead of
    /// waiting. Otherwise the `Sending` back.
    pub(crate) fn into_settling(self) -> std::result::Result<(Arc<Outcomes>, Instant), Sending> {
        match self.state {
            State::Settling { outcomes, deadline } => Ok((outcomes, deadline)),
            state => Err(Sending { state }),
        }
    }
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.is_done() { "done" } else { "waiting" };
        f.debug_struct("Sending").field("state", &state).finish()
    }
}

/// What to do with a request's outcomes once the last one is in.
pub(crate) type Then = Box<dyn FnOnce(Vec<Attempt>) + Send>;

/// The outcomes of one request's events, filled in one by one, from any thread, as the
/// answers come (MQTT: one PUBACK per event). Either a thread waits for them
/// ([`Sending::wait`]) or they are handed on by whoever settles the last one
/// ([`then`](Self::then)): the relay's workers use the latter, so an answer does not have
/// to wake a worker only for it to pass the answer on.
pub(crate) struct Outcomes {
    state: Mutex<Slots>,
    settled: Condvar,
    /// What an outcome not settled by the deadline says.
    timeout_reason: String,
}

struct Slots {
    waiting: usize,
    slots: Vec<Option<Attempt>>,
    then: Option<Then>,
    /// Whether a thread waits on `settled` (a notify with no waiter would still cost a
    /// system call on every request).
    watched: bool,
}

impl Outcomes {
    /// Outcomes for `events` events; `timeout_reason` is what one not settled in time says.
    #[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
    pub fn new(events: usize, timeout_reason: String) -> Arc<Outcomes> {
        Arc::new(Outcomes {
            state: Mutex::new(Slots {
                waiting: events,
                slots: vec![None; events],
                then: None,
                watched: false,
            }),
            settled: Condvar::new(),
            timeout_reason,
        })
    }

    /// Records the outcome of event `index` (the first one recorded stands). The last one
    /// runs what [`then`](Self::then) left, on this thread, after the lock is released.
    #[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
    pub fn settle(&self, index: usize, outcome: Attempt) {
        let mut state = self.lock();
        // Once every outcome is in they may have been handed on, which empties the slots:
        // an answer that comes later (a second PUBACK, or one after the deadline) changes
        // nothing, and must not count down an open outcome that is no longer there.
        if state.waiting == 0 {
            return;
        }
        if let Some(slot @ None) = state.slots.get_mut(index) {
            *slot = Some(outcome);
            state.waiting -= 1;
            self.on_last(state);
        }
    }

    /// Settles every outcome still open as failed for want of an answer in time.
    pub fn expire(&self) {
        let mut state = self.lock();
        if state.waiting == 0 {
            return;
        }
        for slot in state.slots.iter_mut().filter(|s| s.is_none()) {
            *slot = Some(Attempt::Failed {
                reason: self.timeout_reason.clone(),
            });
        }
        state.waiting = 0;
        self.on_last(state);
    }

    /// Once every outcome is in: hands them to `then`, or wakes the waiter.
    fn on_last(&self, mut state: MutexGuard<'_, Slots>) {
        if state.waiting > 0 {
            return;
        }
        if let Some(then) = state.then.take() {
            let outcomes = take_all(&mut state.slots);
            drop(state);
            then(outcomes);
        } else if state.watched {
            self.settled.notify_all();
        }
    }

    /// Hands the outcomes to `then` once all are in: at once if they are, else on the
    /// thread that settles the last one.
    pub fn then(&self, then: Then) {
        let mut state = self.lock();
        if state.waiting == 0 {
            let outcomes = take_all(&mut state.slots);
            drop(state);
            then(outcomes);
        } else {
            state.then = Some(then);
        }
    }

    /// Whether every outcome is in.
    pub fn is_settled(&self) -> bool {
        self.lock().waiting == 0
    }

    /// Waits until every outcome is in, or `deadline`: then the open ones count as failed.
    fn wait_until(&self, deadline: Instant) -> Vec<Attempt> {
        let mut state = self.lock();
        state.watched = true;
        while state.waiting > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                self.expire();
                state = self.lock();
                break;
            }
            state = match self.settled.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        take_all(&mut state.slots)
    }

    /// Locks the slots, also after a panic elsewhere poisoned the lock (every change under
    /// it is one assignment).
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn take_all(slots: &mut [Option<Attempt>]) -> Vec<Attempt> {
    slots
        .iter_mut()
        .map(|slot| {
            slot.take().unwrap_or_else(|| Attempt::Failed {
                reason: "the outcome was already taken".into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered() -> Attempt {
        Attempt::Answered {
            status: 200,
            retry_after: None,
            detail: String::new(),
        }
    }

    #[test]
    fn a_waiter_gets_every_outcome_settled_from_another_thread() {
        let outcomes = Outcomes::new(2, "no answer in time".into());
        let sending = Sending::settling(Arc::clone(&outcomes), Duration::from_secs(10));
        let settler = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            outcomes.settle(1, delivered());
            outcomes.settle(0, Attempt::Unsendable { reason: "x".into() });
            // A second outcome for a slot is ignored: the first one stands.
            outcomes.settle(0, delivered());
        });
        let started = Instant::now();
        let got = sending.wait();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "woken, not timed out"
        );
        assert_eq!(
            got,
            [Attempt::Unsendable { reason: "x".into() }, delivered()]
        );
        settler.join().unwrap();
    }

    #[test]
    fn answers_after_the_outcomes_were_handed_on_change_nothing() {
        let outcomes = Outcomes::new(2, "no answer in time".into());
        outcomes.settle(0, delivered());
        outcomes.settle(1, delivered());
        let handed_on = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&handed_on);
        outcomes.then(Box::new(move |got| into.lock().unwrap().extend(got)));
        assert_eq!(*handed_on.lock().unwrap(), [delivered(), delivered()]);
        // A second answer for a slot already handed on: no count below zero, no panic.
        outcomes.settle(0, Attempt::Unsendable { reason: "x".into() });
        assert!(outcomes.is_settled());

        // The same after the deadline failed the open outcomes and a waiter took them.
        let late = Outcomes::new(2, "no answer in time".into());
        late.settle(0, delivered());
        let got = Sending::settling(Arc::clone(&late), Duration::from_millis(10)).wait();
        assert_eq!(got[0], delivered());
        late.settle(1, delivered());
        late.settle(0, delivered());
        assert!(late.is_settled());
    }

    #[test]
    fn what_is_not_settled_by_the_deadline_fails() {
        let outcomes = Outcomes::new(2, "no answer in time".into());
        outcomes.settle(0, delivered());
        let got = Sending::settling(outcomes, Duration::from_millis(30)).wait();
        assert_eq!(
            got,
            [
                delivered(),
                Attempt::Failed {
                    reason: "no answer in time".into()
                }
            ]
        );
    }

    #[test]
    fn then_runs_once_with_every_outcome_on_the_thread_that_settles_the_last() {
        let outcomes = Outcomes::new(2, "no answer in time".into());
        let (tx, rx) = crossbeam_channel::unbounded();
        outcomes.then(Box::new(move |attempts| {
            let name = std::thread::current().name().map(str::to_string);
            tx.send((attempts, name)).unwrap();
        }));
        outcomes.settle(0, delivered());
        assert!(rx.try_recv().is_err(), "not before the last outcome");
        let last = Arc::clone(&outcomes);
        std::thread::Builder::new()
            .name("settler".into())
            .spawn(move || last.settle(1, delivered()))
            .unwrap()
            .join()
            .unwrap();
        let (attempts, thread) = rx.try_recv().unwrap();
        assert_eq!(attempts, [delivered(), delivered()]);
        assert_eq!(thread.as_deref(), Some("settler"));
        outcomes.expire();
        assert!(rx.try_recv().is_err(), "once only");
    }

    #[test]
    fn then_on_settled_outcomes_runs_at_once() {
        let outcomes = Outcomes::new(1, "no answer in time".into());
        outcomes.expire();
        let (tx, rx) = crossbeam_channel::unbounded();
        outcomes.then(Box::new(move |attempts| tx.send(attempts).unwrap()));
        assert_eq!(
            rx.try_recv().unwrap(),
            [Attempt::Failed {
                reason: "no answer in time".into()
            }]
        );
    }
}
