//! A request on its way: what [`Transport::start_each`](super::Transport::start_each) returns,
//! so a worker can hand the next request to the transport before this one is answered.

use super::Attempt;

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

    /// Whether the outcomes are known without waiting.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done(_))
    }

    /// The outcomes, one per event in order; blocks (bounded) while the request is on its way.
    pub fn wait(self) -> Vec<Attempt> {
        match self.state {
            State::Done(attempts) => attempts,
            State::Waiting(wait) => wait(),
        }
    }
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.is_done() { "done" } else { "waiting" };
        f.debug_struct("Sending").field("state", &state).finish()
    }
}
