//! Writes that go before the relay's own: the app's transactions, and the checkpointer's
//! catching up with the WAL.
//!
//! SQLite's write lock is not fair: a waiting connection sleeps in its busy handler and
//! looks again, while a relay draining a backlog commits and begins its next transaction
//! within microseconds. So [`Outbox::transaction`](crate::Outbox::transaction) says when it
//! wants or holds the lock, and the relay's writer of the same `Outbox` waits for that
//! before each write transaction of its own: an app commit then waits for at most the one
//! relay transaction already under way. The relay's checkpointer takes the right of way
//! too, while it copies the last of the WAL into the database: with the relay's writes
//! held off it catches up, and the WAL starts over without a blocking checkpoint holding
//! the app's commits back. Apps
//! writing through connections of their own, or from other processes, are not seen here.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The writes that go before the relay's, in this process: how many took the right of way,
/// and how many of those are over.
#[derive(Debug, Default)]
pub(crate) struct RightOfWay {
    turns: Mutex<Turns>,
    one_over: Condvar,
}

#[derive(Debug, Default)]
struct Turns {
    taken: u64,
    over: u64,
}

/// The right of way of one write, from before it asks for the lock until it ends.
pub(crate) struct Turn<'a> {
    right_of_way: &'a RightOfWay,
}

impl RightOfWay {
    /// Takes the right of way until the returned guard is dropped.
    pub fn take(&self) -> Turn<'_> {
        lock(&self.turns).taken += 1;
        Turn { right_of_way: self }
    }

    /// Waits until as many turns are over as were taken when it was called, or `limit`
    /// passes; returns whether they are. Turns taken meanwhile are not waited for: an app
    /// committing flat out goes first once per relay transaction, and cannot starve the
    /// relay (waiting for no turn at all let the app's commits run 25,000 a second while
    /// the relay fell minutes behind).
    pub fn wait_until_clear(&self, limit: Duration) -> bool {
        let turns = lock(&self.turns);
        let taken = turns.taken;
        if turns.over >= taken {
            return true;
        }
        let (turns, _) = self
            .one_over
            .wait_timeout_while(turns, limit, |t| t.over < taken)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        turns.over >= taken
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).over += 1;
        self.right_of_way.one_over.notify_all();
    }
}

/// Locks the counts, also after a panic elsewhere poisoned them (counts stay counts).
fn lock(turns: &Mutex<Turns>) -> MutexGuard<'_, Turns> {
    turns
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_relay_waits_for_the_turns_already_taken_and_no_longer_than_its_limit() {
        let way = RightOfWay::default();
        assert!(way.wait_until_clear(Duration::ZERO));
        let turn = way.take();
        let started = Instant::now();
        assert!(!way.wait_until_clear(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(20));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                drop(turn);
            });
            assert!(way.wait_until_clear(Duration::from_secs(10)));
        });
        assert!(way.wait_until_clear(Duration::ZERO));
    }

    #[test]
    fn a_turn_taken_while_the_relay_waits_does_not_hold_it() {
        let way = RightOfWay::default();
        let first = way.take();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                // The next turn is taken before the first is over, as an app committing
                // flat out from two threads would.
                let second = way.take();
                drop(first);
                std::thread::sleep(Duration::from_secs(2));
                drop(second);
            });
            let started = Instant::now();
            assert!(way.wait_until_clear(Duration::from_secs(10)));
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "waited for the later turn"
            );
        });
    }
}
