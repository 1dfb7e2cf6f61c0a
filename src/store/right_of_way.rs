//! Writes that go before the relay's own: the app's transactions, and the checkpointer's
//! catching up with the WAL.
//!
//! SQLite's write lock is not fair: a waiting connection sleeps in its busy handler and
//! looks again, while a relay draining a backlog commits and begins its next transaction
//! within microseconds. So [`Outbox::transaction`](crate::Outbox::transaction) says when it
//! wants or holds the lock, and the relay's writer of the same `Outbox` waits for that
//! before each write transaction of its own: an app commit then waits for at most the one
//! relay transaction already under way, and waits for it here, woken once when it ends,
//! rather than in SQLite's busy handler, which polls the lock every 25 µs. The relay's
//! checkpointer takes the right of way too, while it copies the last of the WAL into the
//! database: with the relay's writes held off (also those that began to wait before it)
//! it catches up, each pass starting when no relay transaction and no app transaction is
//! under way, so the next write starts the WAL over without a blocking checkpoint holding
//! the app's commits back. When the catch-up cannot find the WAL still (app commits landing
//! during every pass) it ends with a blocking checkpoint, which holds SQLite's write lock
//! while it copies and syncs the last frames: an app transaction that comes meanwhile waits
//! for it here too, and the relay's write that waited out the catch-up then lets it go
//! first, where before the relay, woken at once, took the lock while the app was still
//! polling for it, and the app waited for both. That closing checkpoint was most of the
//! app's slowest commits: passes that never reached the WAL's end never synced the database
//! file either, so the blocking checkpoint wrote out everything they had copied while it
//! held the lock. So after its first pass a catch-up seals the way: app transactions that
//! begin meanwhile wait at the seal, each for at most [`SEAL_WAIT`], and the passes reach
//! the WAL's end, syncing the database file with no lock held. Apps writing through
//! connections of their own, or from other processes, are not seen here.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The writes that go before the relay's, in this process: how many took the right of way,
/// and how many of those are over; the relay's write transactions; and catch-ups going on.
#[derive(Debug, Default)]
pub(crate) struct RightOfWay {
    turns: Mutex<Turns>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Turns {
    taken: u64,
    over: u64,
    /// Relay write transactions under way.
    relay_writes: u64,
    /// Checkpointer catch-ups going on (each also holds a turn).
    catching_up: u64,
    /// Blocking checkpoints under way: each holds SQLite's write lock until it ends.
    blocking: u64,
    /// Yields to other processes' writers under way (see [`RightOfWay::yield_to_others`]).
    yielding: u64,
    /// Catch-ups ended so far, and `taken` when the last one ended.
    catch_ups_ended: u64,
    taken_at_catch_up_end: u64,
    /// Seals under way (see [`CatchUp::seal`]), and the turns waiting at one.
    sealed: u64,
    at_seal: u64,
}

impl Turns {
    /// Whether nothing but the caller's own one turn wants or holds the lock (a turn
    /// waiting at a seal neither wants nor holds it yet).
    fn alone(&self) -> bool {
        self.relay_writes == 0 && self.taken - self.over - self.at_seal <= 1
    }
}

/// The right of way of one write, from before it asks for the lock until it ends.
pub(crate) struct Turn<'a> {
    right_of_way: &'a RightOfWay,
}

/// One relay write transaction, from before it asks for the lock until it ends.
pub(crate) struct RelayWrite<'a> {
    right_of_way: &'a RightOfWay,
}

/// A checkpointer's catch-up: a turn that relay writes wait for even when it was taken
/// after they began to wait.
pub(crate) struct CatchUp<'a> {
    right_of_way: &'a RightOfWay,
}

/// A yield to other processes' writers: relay writes wait for its end.
pub(crate) struct Yield<'a> {
    right_of_way: &'a RightOfWay,
    /// Turns taken in this process when it began.
    taken_at_start: u64,
}

/// The longest a relay write waits for a yield to other processes' writers.
pub(crate) const YIELD_LIMIT: Duration = Duration::from_millis(250);

/// The longest an app transaction waits at a catch-up's seal: about what the catch-up's
/// last passes take when all they copy is a few commits' frames.
pub(crate) const SEAL_WAIT: Duration = Duration::from_millis(2);

/// A catch-up's seal: app transactions of this process that begin while it holds wait for
/// its end, each for at most [`SEAL_WAIT`].
pub(crate) struct Seal<'a> {
    right_of_way: &'a RightOfWay,
}

/// A blocking checkpoint (RESTART or TRUNCATE) under way, which turn holders wait for as
/// they wait for a relay write.
pub(crate) struct BlockingCheckpoint<'a> {
    right_of_way: &'a RightOfWay,
}

impl RightOfWay {
    /// Takes the right of way until the returned guard is dropped.
    pub fn take(&self) -> Turn<'_> {
        lock(&self.turns).taken += 1;
        Turn { right_of_way: self }
    }

    /// Marks a relay write transaction under way until the returned guard is dropped, after
    /// waiting, up to `limit`, until as many turns are over as were taken when it was
    /// called and no catch-up goes on. Turns taken meanwhile are not waited for: an app
    /// committing flat out goes first once per relay transaction, and cannot starve the
    /// relay (waiting for no turn at all let the app's commits run 25,000 a second while
    /// the relay fell minutes behind). The exception is a catch-up that ends while it
    /// waits: turns taken during it waited it out too (for its closing blocking
    /// checkpoint), so they go first as well, but not the turns taken after it ended.
    pub fn relay_write(&self, limit: Duration) -> RelayWrite<'_> {
        let mut turns = lock(&self.turns);
        let taken = turns.taken;
        let catch_ups_ended = turns.catch_ups_ended;
        let held = |t: &mut Turns| {
            let bar = if t.catch_ups_ended > catch_ups_ended {
                taken.max(t.taken_at_catch_up_end)
            } else {
                taken
            };
            t.over < bar || t.catching_up > 0 || t.yielding > 0
        };
        if held(&mut turns) {
            let limit = if turns.yielding > 0 {
                limit.max(YIELD_LIMIT)
            } else {
                limit
            };
            turns = self
                .changed
                .wait_timeout_while(turns, limit, held)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        turns.relay_writes += 1;
        RelayWrite { right_of_way: self }
    }

    /// Starts a catch-up: holds relay writes off (each for at most its limit) until the
    /// returned guard is dropped.
    pub fn catch_up(&self) -> CatchUp<'_> {
        let mut turns = lock(&self.turns);
        turns.taken += 1;
        turns.catching_up += 1;
        CatchUp { right_of_way: self }
    }

    /// Holds relay writes off (each for at most [`YIELD_LIMIT`]) until the returned guard is
    /// dropped, so that another process's writer, committing flat out, finds no relay commit
    /// between its own checkpoint and its next transaction and starts the WAL over itself.
    pub fn yield_to_others(&self) -> Yield<'_> {
        let mut turns = lock(&self.turns);
        turns.yielding += 1;
        Yield {
            right_of_way: self,
            taken_at_start: turns.taken,
        }
    }

    /// Marks a blocking checkpoint under way until the returned guard is dropped: turn
    /// holders wait for it (on this condition variable, not in SQLite's busy handler).
    pub fn blocking_checkpoint(&self) -> BlockingCheckpoint<'_> {
        lock(&self.turns).blocking += 1;
        BlockingCheckpoint { right_of_way: self }
    }
}

impl Turn<'_> {
    /// Waits until no relay write transaction and no blocking checkpoint is under way, or
    /// `limit` passes. The relay's next write waits for this turn, so the lock is then the
    /// turn holder's to take; waiting here wakes it once, when the relay's transaction ends,
    /// where SQLite's busy handler would poll the lock every 25 µs, each poll a wakeup on
    /// cores the relay keeps busy.
    pub fn wait_for_relay_writes(&self, limit: Duration) {
        let mut turns = lock(&self.right_of_way.turns);
        if turns.sealed > 0 {
            turns.at_seal += 1;
            turns = self
                .right_of_way
                .changed
                .wait_timeout_while(turns, SEAL_WAIT, |t| t.sealed > 0)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
            turns.at_seal -= 1;
        }
        let held = |t: &mut Turns| t.relay_writes > 0 || t.blocking > 0;
        if held(&mut turns) {
            let _ = self
                .right_of_way
                .changed
                .wait_timeout_while(turns, limit, held)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

impl Yield<'_> {
    /// Whether a write of this process (an app transaction through the `Outbox`) took the
    /// right of way since the yield began: then the WAL's writers are not only other
    /// processes', and the checkpointer's catch-up, which sees these, is the way to bound
    /// it. (Yielding to them held the relay's writes off 200 ms at a time and left the WAL
    /// to an app commit's own automatic checkpoint: 77 ms for that commit.)
    pub fn own_writers_wrote(&self) -> bool {
        lock(&self.right_of_way.turns).taken != self.taken_at_start
    }
}

impl CatchUp<'_> {
    /// Holds the app transactions of this process that begin from now on, each for at most
    /// [`SEAL_WAIT`], until the returned guard is dropped: the catch-up's last passes then
    /// find the WAL still, where app commits landing every half millisecond kept every
    /// pass from reaching the WAL's end.
    pub fn seal(&self) -> Seal<'_> {
        lock(&self.right_of_way.turns).sealed += 1;
        Seal {
            right_of_way: self.right_of_way,
        }
    }

    /// Waits until no other write seen here is under way (no relay write transaction, no
    /// other turn), or `limit` passes; returns whether none is.
    pub fn wait_until_alone(&self, limit: Duration) -> bool {
        let turns = lock(&self.right_of_way.turns);
        let (turns, _) = self
            .right_of_way
            .changed
            .wait_timeout_while(turns, limit, |t| !t.alone())
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        turns.alone()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).over += 1;
        self.right_of_way.changed.notify_all();
    }
}

impl Drop for RelayWrite<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).relay_writes -= 1;
        self.right_of_way.changed.notify_all();
    }
}

impl Drop for Yield<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).yielding -= 1;
        self.right_of_way.changed.notify_all();
    }
}

impl Drop for Seal<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).sealed -= 1;
        self.right_of_way.changed.notify_all();
    }
}

impl Drop for BlockingCheckpoint<'_> {
    fn drop(&mut self) {
        lock(&self.right_of_way.turns).blocking -= 1;
        self.right_of_way.changed.notify_all();
    }
}

impl Drop for CatchUp<'_> {
    fn drop(&mut self) {
        let mut turns = lock(&self.right_of_way.turns);
        turns.catching_up -= 1;
        turns.over += 1;
        turns.catch_ups_ended += 1;
        turns.taken_at_catch_up_end = turns.taken;
        drop(turns);
        self.right_of_way.changed.notify_all();
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
    fn a_yield_tells_when_this_processs_own_writers_took_the_right_of_way() {
        // The checkpointer yielded to "other processes' writers" for 200 ms at a time while
        // the writers were the app's own, in this process (their commits kept the WAL file
        // changing), and one app commit then ran the WAL's automatic checkpoint (77 ms).
        let way = RightOfWay::default();
        let earlier = way.take();
        let yielding = way.yield_to_others();
        drop(earlier);
        assert!(
            !yielding.own_writers_wrote(),
            "a turn taken before the yield"
        );
        drop(way.take());
        assert!(yielding.own_writers_wrote());
    }

    /// Whether the relay's write got in within `limit`, as seen from its own thread.
    fn relay_writes_within(way: &RightOfWay, limit: Duration) -> Duration {
        let started = Instant::now();
        drop(way.relay_write(limit));
        started.elapsed()
    }

    /// Runs `wait` while another thread drops `guard` after 10 ms, and checks that it
    /// returned once the guard was gone: not at once, and not at its (long) limit.
    fn waits_until_released<G: Send>(guard: G, wait: impl FnOnce()) {
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                drop(guard);
            });
            let started = Instant::now();
            wait();
            let waited = started.elapsed();
            assert!(
                waited >= Duration::from_millis(5),
                "did not wait: {waited:?}"
            );
            assert!(
                waited < Duration::from_secs(5),
                "waited to the limit: {waited:?}"
            );
        });
    }

    #[test]
    fn the_relay_waits_for_the_turns_already_taken_and_no_longer_than_its_limit() {
        let way = RightOfWay::default();
        assert!(relay_writes_within(&way, Duration::from_secs(10)) < Duration::from_secs(1));
        let turn = way.take();
        assert!(relay_writes_within(&way, Duration::from_millis(20)) >= Duration::from_millis(20));
        waits_until_released(turn, || {
            relay_writes_within(&way, Duration::from_secs(10));
        });
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
            let waited = relay_writes_within(&way, Duration::from_secs(10));
            assert!(waited < Duration::from_secs(1), "waited for the later turn");
        });
    }

    #[test]
    fn a_catch_up_holds_relay_writes_that_began_to_wait_before_it() {
        let way = RightOfWay::default();
        let app = way.take();
        std::thread::scope(|s| {
            let catch_up = s.spawn(|| {
                // Taken while the relay already waits for the app's turn.
                std::thread::sleep(Duration::from_millis(10));
                let catch_up = way.catch_up();
                drop(app);
                std::thread::sleep(Duration::from_millis(50));
                drop(catch_up);
            });
            let waited = relay_writes_within(&way, Duration::from_secs(10));
            assert!(
                waited >= Duration::from_millis(50),
                "went in during the catch-up"
            );
            catch_up.join().unwrap();
        });
        // And no longer than the relay's limit.
        let _catch_up = way.catch_up();
        let waited = relay_writes_within(&way, Duration::from_millis(20));
        assert!(waited >= Duration::from_millis(20) && waited < Duration::from_secs(5));
    }

    #[test]
    fn a_turn_taken_during_a_catch_up_goes_before_the_relay_write_that_waited_it_out() {
        let way = RightOfWay::default();
        let catch_up = way.catch_up();
        let relay_went_in = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let relay = s.spawn(|| {
                let write = way.relay_write(Duration::from_secs(10));
                relay_went_in.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(write);
            });
            std::thread::sleep(Duration::from_millis(10));
            // The app comes while the catch-up (and its blocking checkpoint) goes on.
            let app = way.take();
            drop(catch_up);
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                !relay_went_in.load(std::sync::atomic::Ordering::SeqCst),
                "the relay went in before the turn that waited out the catch-up with it"
            );
            drop(app);
            relay.join().unwrap();
        });
        assert!(relay_went_in.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn after_a_catch_up_the_relay_waits_for_one_round_of_turns_only() {
        let way = RightOfWay::default();
        let catch_up = way.catch_up();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Long enough for the relay below to be waiting already.
                std::thread::sleep(Duration::from_millis(50));
                let app = way.take();
                std::thread::sleep(Duration::from_millis(10));
                drop(catch_up);
                std::thread::sleep(Duration::from_millis(10));
                // The next turn is taken before this one is over: an app committing flat
                // out must not hold the relay off again.
                let next = way.take();
                drop(app);
                std::thread::sleep(Duration::from_secs(2));
                drop(next);
            });
            let waited = relay_writes_within(&way, Duration::from_secs(10));
            assert!(
                waited >= Duration::from_millis(65),
                "did not wait: {waited:?}"
            );
            assert!(waited < Duration::from_secs(1), "waited for a later turn");
        });
    }

    #[test]
    fn a_turn_holder_waits_for_a_blocking_checkpoint_and_no_longer_than_its_limit() {
        let way = RightOfWay::default();
        let turn = way.take();
        let blocking = way.blocking_checkpoint();
        let started = Instant::now();
        turn.wait_for_relay_writes(Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(20));
        waits_until_released(blocking, || {
            turn.wait_for_relay_writes(Duration::from_secs(10))
        });
    }

    #[test]
    fn a_turn_waits_at_a_catch_ups_seal_no_longer_than_the_seals_limit() {
        let way = RightOfWay::default();
        let catch_up = way.catch_up();
        let seal = catch_up.seal();
        let turn = way.take();
        let started = Instant::now();
        turn.wait_for_relay_writes(Duration::from_secs(10));
        let waited = started.elapsed();
        assert!(waited >= SEAL_WAIT, "did not wait at the seal: {waited:?}");
        assert!(
            waited < Duration::from_secs(5),
            "waited past the seal's limit: {waited:?}"
        );
        assert_eq!(lock(&way.turns).at_seal, 0, "left the seal");
        drop(seal);
        let started = Instant::now();
        turn.wait_for_relay_writes(Duration::from_secs(10));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited with no seal"
        );
    }

    #[test]
    fn a_turn_waiting_at_a_seal_does_not_keep_the_catch_up_from_being_alone() {
        // The catch-up's own turn and one app turn, taken: not alone while the app's turn
        // may be asking for the lock, alone while it waits at the seal.
        let under_way = Turns {
            taken: 2,
            ..Turns::default()
        };
        assert!(!under_way.alone());
        let at_seal = Turns {
            taken: 2,
            at_seal: 1,
            sealed: 1,
            ..Turns::default()
        };
        assert!(at_seal.alone());
    }

    #[test]
    fn a_catch_up_is_alone_once_relay_writes_and_other_turns_are_over() {
        let way = RightOfWay::default();
        let write = way.relay_write(Duration::ZERO);
        let app = way.take();
        let catch_up = way.catch_up();
        assert!(!catch_up.wait_until_alone(Duration::from_millis(10)));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                drop(write);
                std::thread::sleep(Duration::from_millis(10));
                drop(app);
            });
            let started = Instant::now();
            assert!(catch_up.wait_until_alone(Duration::from_secs(10)));
            assert!(started.elapsed() >= Duration::from_millis(15));
        });
    }

    #[test]
    fn a_turn_holder_waits_for_the_relay_write_under_way_and_no_longer_than_its_limit() {
        let way = RightOfWay::default();
        let turn = way.take();
        let started = Instant::now();
        turn.wait_for_relay_writes(Duration::from_secs(10));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited with none under way"
        );
        let write = way.relay_write(Duration::ZERO);
        let started = Instant::now();
        turn.wait_for_relay_writes(Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(20));
        waits_until_released(write, || {
            turn.wait_for_relay_writes(Duration::from_secs(10))
        });
    }
}
