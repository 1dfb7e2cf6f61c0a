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

/// How many writes that go before the relay's want or hold SQLite's write lock, in this
/// process.
#[derive(Debug, Default)]
pub(crate) struct RightOfWay {
    holders: Mutex<usize>,
    clear: Condvar,
}

/// The right of way of one write, from before it asks for the lock until it ends.
pub(crate) struct Turn<'a> {
    right_of_way: &'a RightOfWay,
}

impl RightOfWay {
    /// Takes the right of way until the returned guard is dropped.
    pub fn take(&self) -> Turn<'_> {
        *lock(&self.holders) += 1;
        Turn { right_of_way: self }
    }

    /// Waits until no write holds the right of way, or `limit` passes (a holder that keeps
    /// it must not stop the relay); returns whether the way is clear.
    pub fn wait_until_clear(&self, limit: Duration) -> bool {
        let holders = lock(&self.holders);
        if *holders == 0 {
            return true;
        }
        let (holders, _) = self
            .clear
            .wait_timeout_while(holders, limit, |n| *n > 0)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *holders == 0
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut holders = lock(&self.right_of_way.holders);
        *holders = holders.saturating_sub(1);
        if *holders == 0 {
            self.right_of_way.clear.notify_all();
        }
    }
}

/// Locks the count, also after a panic elsewhere poisoned it (a count stays a count).
fn lock(count: &Mutex<usize>) -> MutexGuard<'_, usize> {
    count
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_relay_waits_while_a_write_has_the_way_and_no_longer_than_its_limit() {
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
}
