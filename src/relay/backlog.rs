//! How many of one worker's requests still wait for their outcomes, when the transport
//! reports them from a thread of its own (MQTT's connection thread answers each PUBACK).
//!
//! Such a worker does not wait for each answer: it hands the transport its next request at
//! once, and the outcome goes to the writer from the thread that settles it. The backlog
//! bounds how far ahead a worker runs ([`SETTLING_PER_WORKER`] requests), and wakes it only
//! once half of them are answered, not once per answer: on two cores a wake per PUBACK
//! preempted the very thread reading the PUBACKs.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Defined with the transport's side of the contract (a transport that queues requests
/// must have room for this many per worker).
pub(crate) use crate::transport::sending::SETTLING_PER_WORKER;

/// The count of one worker's requests whose outcomes are still to come.
#[derive(Default)]
pub(crate) struct Backlog {
    state: Mutex<State>,
    room: Condvar,
}

#[derive(Default)]
struct State {
    open: usize,
    /// The count the worker is waiting to fall to, if it is waiting.
    waiting_for: Option<usize>,
}

impl Backlog {
    /// One more request on its way.
    pub fn opened(&self) {
        self.lock().open += 1;
    }

    /// One request's outcomes were reported; wakes the worker if it waits for this count.
    pub fn closed(&self) {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        if state.waiting_for.is_some_and(|target| state.open <= target) {
            state.waiting_for = None;
            self.room.notify_one();
        }
    }

    /// Requests on their way.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Waits until at most `target` requests are open, or `deadline`.
    pub fn wait_for(&self, target: usize, deadline: Instant) {
        let mut state = self.lock();
        while state.open > target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state.waiting_for = Some(target);
            state = match self.room.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        state.waiting_for = None;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_waiting_worker_wakes_when_the_count_falls_to_its_target() {
        let backlog = Arc::new(Backlog::default());
        for _ in 0..4 {
            backlog.opened();
        }
        let closer = {
            let backlog = Arc::clone(&backlog);
            std::thread::spawn(move || {
                for _ in 0..2 {
                    std::thread::sleep(Duration::from_millis(20));
                    backlog.closed();
                }
            })
        };
        let started = Instant::now();
        backlog.wait_for(2, started + Duration::from_secs(10));
        assert_eq!(backlog.open(), 2);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "woken, not timed out"
        );
        closer.join().unwrap();
    }

    #[test]
    fn waiting_ends_at_the_deadline() {
        let backlog = Backlog::default();
        backlog.opened();
        backlog.wait_for(0, Instant::now() + Duration::from_millis(30));
        assert_eq!(backlog.open(), 1);
    }
}
