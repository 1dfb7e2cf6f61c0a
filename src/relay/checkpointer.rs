//! The relay's checkpointer: a thread of its own (`outbox-ckpt`) that copies the WAL
//! back into the database file while anything is being written, so neither the app's
//! commits nor the relay's writer ever run a checkpoint themselves.
//!
//! It has its own connection, outside the pool. A PASSIVE checkpoint takes no lock a writer
//! needs, so the writer goes on claiming and acking while pages are copied; run on the
//! writer's thread, the copy of a large WAL (a backlog filled in one go) stalled claims for
//! tens of milliseconds.
//!
//! Under writes that never pause (a relay draining a backlog) a PASSIVE checkpoint never
//! reaches the end of the WAL, so the WAL never starts over by itself. A blocking reset
//! (RESTART) held every writer back while it copied and synced, 3.5 to 4.5 ms every 0.4 s
//! of a drain, and the app's commits that met one waited that long. So the checkpointer
//! catches up instead (`crate::store::right_of_way`): the relay's writer of this process holds off
//! while PASSIVE passes copy the last frames, each pass starting when no write transaction
//! seen in this process is under way, until a pass finds nothing appended since the one
//! before copied everything. The next write, the app's or the relay's, then begins on a
//! fully copied WAL and SQLite starts the WAL over with it, with no lock held for the
//! purpose. A RESTART after the last pass, as a first form did every time, found the
//! frames of app commits made in between and copied and synced them under the write lock
//! (2 to 7 ms of the app's slowest commits); and passes that ignored relay writes under
//! way let them append to the WAL after it was copied, so it did not start over and grew
//! until an app commit's automatic checkpoint (5 to 12 ms). When app commits land during
//! every pass (ten a millisecond and more) the passes stop after 3 ms and a RESTART copies
//! what the last one missed, a few frames, rather than leave thousands to the blocking
//! reset of a full WAL, which is kept for a WAL that catching up could not bound (a reader
//! in the way, or writers this process does not see).

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvTimeoutError};
use rusqlite::Connection;

use crate::outbox::Outbox;
use crate::relay::wal_file::WalFile;

/// How often at most the checkpointer looks for new writes while the writer reports some
/// (each look that finds some copies them: a shorter interval copies less at a time, and
/// keeps the WAL smaller). While nothing is written it sleeps.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// How long the checkpointer sleeps with no word from the writer before it looks anyway:
/// commits by other processes that the relay's writer never saw (it was stopped, or lost a
/// notification) are still copied back, if late.
const IDLE_LOOK_INTERVAL: Duration = Duration::from_secs(60);

/// WAL frames (pages) past which, catching up having failed (writers of other processes, or
/// the app through connections of its own, kept writing), the WAL is reset with a blocking
/// checkpoint: 16 MiB of 4 KiB pages.
const WAL_RESTART_FRAMES: i64 = 4096;

/// WAL frames past which the checkpointer catches up so that the WAL starts over: 8 MiB of
/// 4 KiB pages. Half the reset bound, so that a WAL growing by 1,500 frames between two
/// checks (a relay draining flat out) starts over well before the app's own connections
/// reach their automatic checkpoint (8,192 pages), which would run inside an app commit.
const CATCH_UP_FRAMES: i64 = WAL_RESTART_FRAMES / 2;

/// PASSIVE passes made with the relay's writes held off, to copy the last of the WAL: the
/// first copies what the relay wrote since the last look, the next ones the few app commits
/// made meanwhile, and the last finds nothing new.
const CATCH_UP_PASSES: usize = 8;

/// The longest a catch-up pass waits for the write transactions under way to end: a relay
/// transaction or an app commit takes well under a millisecond.
const CATCH_UP_WAIT: Duration = Duration::from_millis(2);

/// The longest a catch-up goes on, whatever its passes found, before a RESTART copies what
/// the last pass missed. Each relay write waits for it at most its own give-way limit
/// (5 ms), so an app committing flat out, which leaves few moments with no write under way,
/// does not hold the relay back for this long. At 3 ms the first pass alone (copying what
/// a relay numbering a backlog wrote since the last look, 10-20 ms) overran it, and the
/// RESTART that closed the catch-up held the app's commits 30-80 ms; at 30 ms those
/// catch-ups end still (an urgent event behind a 1M backlog: the app's worst commit 63-90
/// ms to 8 ms), and the app's p99.9 beside a draining relay did not rise.
const CATCH_UP_LIMIT: Duration = Duration::from_millis(30);

/// WAL file size past which a reset also truncates the file: four times what the frame
/// bound lets it reach in normal operation, so only a WAL a long reader let grow is cut
/// (truncating on every reset would make each one re-grow the file, and cost the app's
/// commits their latency).
const WAL_TRUNCATE_BYTES: i64 = 4 * WAL_RESTART_FRAMES * 4096;

/// The longest the checkpointer holds this relay's writes off, past the bound, for the
/// writers of other processes to start the WAL over. A writer starts it over when its
/// transaction begins on a WAL fully copied back, which an app in another process,
/// checkpointing after its own commits, would find every time, were it not for the relay's
/// claims and acks, which follow each of its commits and land between that checkpoint and
/// its next transaction. Nothing this process does can start the WAL over against such a
/// writer: a RESTART has to wait for its write lock, and SQLite's locks are not fair (an
/// app in another process committing 100 KB flat out held it 78% of the time, and a
/// RESTART with 50 ms of patience won 3 times in 47). Without the yield that app's WAL grew
/// to 73-248 MiB in 6-8 s beside a relay (4-7 MiB with no relay); with it, 19-23 MiB
/// (`cli/tests/wal_bound.rs`), the frames counted in the WAL file when a PASSIVE
/// checkpoint meets the app's own and counts nothing.
const YIELD_FOR: Duration = Duration::from_millis(200);

/// How often the WAL is looked at during a yield.
const YIELD_LOOK: Duration = Duration::from_millis(2);

/// How long without a new frame a yield waits before it concludes nobody else writes.
const YIELD_QUIET: Duration = Duration::from_millis(20);

/// Longest pause between tries to reset the WAL while a reader keeps it busy.
const WAL_RESET_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// The checkpointer's state; [`run`](Self::run) is the thread's body.
pub(crate) struct Checkpointer {
    relay_id: String,
    conn: Connection,
    /// The outbox whose writes the checkpointer holds off while it catches up.
    outbox: Outbox,
    stop: Receiver<()>,
    /// Ready when the relay's writer wrote or saw a commit.
    kick: Receiver<()>,
    /// `PRAGMA data_version` at the last look: it changes when another connection commits.
    data_version: Option<i64>,
    /// A reset failed (a reader was in the way) and is owed even if nothing more is written.
    reset_owed: bool,
    /// The WAL file, read without a lock (`None`: an in-memory database).
    wal: Option<WalFile>,
    /// The WAL file was said to be past [`WAL_TRUNCATE_BYTES`]: said again only once it
    /// has been cut back.
    said_oversized: bool,
    /// When the WAL may next be reset, and the pause after the next busy try.
    next_reset: Instant,
    reset_backoff: Duration,
}

/// How a catch-up ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CaughtUp {
    /// Every frame copied with no write under way: the next write starts the WAL over.
    Copied,
    /// Writes kept landing; a RESTART copied the rest and reset the WAL.
    Restarted,
    /// Neither: a reader or a writer was in the way, or a checkpoint failed.
    No,
}

impl Checkpointer {
    /// A checkpointer of `outbox` on `conn` that runs until `stop`'s sender is dropped.
    pub fn new(
        conn: Connection,
        outbox: Outbox,
        relay_id: &str,
        stop: Receiver<()>,
        kick: Receiver<()>,
    ) -> Checkpointer {
        Checkpointer {
            relay_id: relay_id.to_string(),
            wal: conn_wal(&conn),
            said_oversized: false,
            conn,
            outbox,
            stop,
            kick,
            data_version: None,
            reset_owed: false,
            next_reset: Instant::now(),
            reset_backoff: CHECKPOINT_INTERVAL,
        }
    }

    /// Checkpoints at most every `CHECKPOINT_INTERVAL` while the writer reports writes,
    /// until stopped; sleeps while nothing is written.
    pub fn run(mut self) {
        // Nothing here may wait for a lock: a checkpoint that cannot go ahead is skipped
        // and tried again on the next turn.
        if let Err(e) = self
            .conn
            .busy_handler(crate::store::database::NO_BUSY_HANDLER)
        {
            log::warn!("relay {}: checkpointer not started: {e:#}", self.relay_id);
            return;
        }
        loop {
            let idle = if self.reset_owed {
                self.next_reset
                    .saturating_duration_since(Instant::now())
                    .max(CHECKPOINT_INTERVAL)
            } else {
                IDLE_LOOK_INTERVAL
            };
            select! {
                recv(self.stop) -> _ => return,
                recv(self.kick) -> kicked => {
                    if kicked.is_err() {
                        // The writer has ended: only the stop is left to wait for.
                        self.kick = crossbeam_channel::never();
                    }
                },
                default(idle) => {},
            }
            if self.wrote() || self.reset_owed {
                self.checkpoint();
            }
            // However often the writer kicks, look at most this often.
            if !matches!(
                self.stop.recv_timeout(CHECKPOINT_INTERVAL),
                Err(RecvTimeoutError::Timeout)
            ) {
                return;
            }
        }
    }

    /// Whether any connection committed since the last look (true when it cannot tell).
    fn wrote(&mut self) -> bool {
        let now = self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .ok();
        let changed = now.is_none() || now != self.data_version;
        self.data_version = now;
        changed
    }

    /// PASSIVE never waits for readers or writers.
    ///
    /// Past a bound the WAL is brought to start over: by catching up (see the module's
    /// notes), or, when that fails and the WAL has grown to twice that bound, by a reset
    /// (RESTART; TRUNCATE, which also gives the file's space back, once a long reader let
    /// the file grow past 64 MiB). A reset must wait for every reader to leave the old
    /// snapshot and holds new writers back while it waits, so it is tried without a busy
    /// handler: if a reader (a backup, a report query) is in the way it fails at once, and
    /// is tried again after a growing pause.
    fn checkpoint(&mut self) {
        let passive = self.passive();
        let oversized = self
            .wal
            .as_ref()
            .is_some_and(|wal| wal.bytes() > WAL_TRUNCATE_BYTES);
        self.say_oversized(oversized);
        let frames = match passive {
            // Another connection checkpoints (an app's automatic checkpoint): the frames
            // are counted in the WAL file instead (not in `-shm`: see `WalFile`).
            Ok((-1, _)) => self.wal.as_ref().and_then(WalFile::frames).unwrap_or(-1),
            Ok((frames, _)) => frames,
            Err(e) => {
                log::debug!("relay {}: checkpoint failed: {e:#}", self.relay_id);
                return;
            }
        };
        if frames > CATCH_UP_FRAMES {
            if frames > WAL_RESTART_FRAMES && self.yield_to_others() {
                self.reset_owed = false;
            } else if oversized {
                // A long reader let the file grow: cut it, not just start it over.
                self.reset_wal("TRUNCATE")
            } else if self.catch_up() != CaughtUp::No {
                self.reset_owed = false;
            } else if frames > WAL_RESTART_FRAMES {
                self.reset_wal("RESTART")
            } else {
                self.reset_owed = true;
            }
        } else if oversized {
            // Writers reuse a fully checkpointed WAL from its start, so its frame count
            // drops while the file keeps the size a long reader let it grow to: cut it.
            self.reset_wal("TRUNCATE")
        } else {
            self.reset_owed = false;
        }
    }

    /// Past the bound, with the WAL grown all the same: gives way to the writers of other
    /// processes (see [`YIELD_FOR`]). Holds this relay's writes off and watches the WAL
    /// file (without a lock: see [`WalFile`]) until it has started over (true), or until
    /// nobody else writes (the file untouched for [`YIELD_QUIET`]: a RESTART of its own
    /// will do) or [`YIELD_FOR`] has passed (false).
    fn yield_to_others(&self) -> bool {
        let Some(wal) = &self.wal else {
            return false;
        };
        let Some(sequence) = wal.sequence() else {
            return false;
        };
        let yielding = self.outbox.right_of_way().yield_to_others();
        let started = Instant::now();
        let deadline = started + YIELD_FOR;
        let said = |how: &str| {
            log::debug!(
                "relay {}: gave way to other writers for {:?}: {how}",
                self.relay_id,
                started.elapsed()
            )
        };
        let (mut written, mut quiet_since) = (wal.modified(), Instant::now());
        while Instant::now() < deadline {
            if !matches!(
                self.stop.recv_timeout(YIELD_LOOK),
                Err(RecvTimeoutError::Timeout)
            ) {
                return false;
            }
            if wal.sequence().is_some_and(|now| now != sequence) {
                said("the WAL started over");
                return true;
            }
            if yielding.own_writers_wrote() {
                said("this process's own writers write");
                return false;
            }
            let now = wal.modified();
            if now != written {
                (written, quiet_since) = (now, Instant::now());
            } else if quiet_since.elapsed() >= YIELD_QUIET {
                said("nobody else writes");
                return false;
            }
        }
        said("the WAL did not start over");
        false
    }

    /// Says once, at `warn`, that the WAL file has grown past [`WAL_TRUNCATE_BYTES`] (the disk
    /// it takes, and why), and once at `info` that it was cut back.
    fn say_oversized(&mut self, oversized: bool) {
        if oversized == self.said_oversized {
            return;
        }
        self.said_oversized = oversized;
        if oversized {
            log::warn!(
                "relay {}: the WAL file has grown past {} MiB: a reader holds an old snapshot \
                 (a backup, a long query) or another process writes without pause; it is cut \
                 back once that ends",
                self.relay_id,
                WAL_TRUNCATE_BYTES >> 20
            );
        } else {
            log::info!("relay {}: the WAL file is cut back", self.relay_id);
        }
    }

    /// A PASSIVE checkpoint: the WAL's frames, and how many of them are now copied.
    fn passive(&self) -> rusqlite::Result<(i64, i64)> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(1)?, r.get(2)?))
            })
    }

    /// Copies the last of the WAL with the relay's writes held off, until a PASSIVE pass,
    /// begun with no write under way, finds every frame copied and none appended since the
    /// pass before: the next write transaction, the app's or the relay's, then begins on a
    /// fully copied WAL and starts it over (SQLite does so when no reader still reads from
    /// the WAL). A reader that kept it from starting over shows as frames still growing at
    /// the next look, which catches up again. After the first pass the app's transactions
    /// of this process wait at a seal (`RightOfWay`), so the last passes find the WAL
    /// still. If they never do, a RESTART copies what the last one missed.
    fn catch_up(&self) -> CaughtUp {
        let catch_up = self.outbox.right_of_way().catch_up();
        // The WAL's frames after the last pass that copied them all.
        let mut copied_all: Option<i64> = None;
        let deadline = Instant::now() + CATCH_UP_LIMIT;
        let mut seal = None;
        for pass in 0..CATCH_UP_PASSES {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            // The first pass copies what the relay wrote since the last look, with the app's
            // commits going on; what is left after it is a few app commits' frames. SQLite
            // syncs the database file only in a pass that reaches the WAL's end, which app
            // commits landing every half millisecond kept any pass from doing, so the RESTART
            // that closed the catch-up wrote out every page copied before, with the write
            // lock held (1-17 ms). From here on the app's transactions of this process wait
            // at a seal, each for at most `SEAL_WAIT`, the WAL's own data written out
            // first so that the passes' syncs of it are short: a pass then reaches the end
            // and syncs with no lock held.
            if pass == 1 {
                if let Some(wal) = &self.wal {
                    wal.write_out();
                }
                seal = Some(catch_up.seal());
            }
            // A write transaction under way read from the WAL, so its commit would append
            // to it, not start it over: each pass starts once none is.
            if !catch_up.wait_until_alone(left.min(CATCH_UP_WAIT)) {
                copied_all = None;
                continue;
            }
            match self.passive() {
                // Another connection checkpoints: this pass copied nothing.
                Ok((-1, _)) => copied_all = None,
                // Nothing was appended since the last pass copied everything, and nothing
                // was under way when this one began: the next write starts the WAL over.
                Ok((frames, copied)) if copied >= frames && copied_all == Some(frames) => {
                    return CaughtUp::Copied;
                }
                Ok((frames, copied)) => copied_all = (copied >= frames).then_some(frames),
                Err(e) => {
                    log::debug!("relay {}: checkpoint failed: {e:#}", self.relay_id);
                    return CaughtUp::No;
                }
            }
        }
        drop(seal);
        // App commits kept landing during every pass (ten a millisecond and more). Left to
        // grow, the WAL would meet the blocking reset of a full WAL, which copies thousands
        // of frames under the write lock; a RESTART now copies only what the last pass
        // missed.
        match self.blocking_checkpoint("RESTART") {
            Ok(0) => CaughtUp::Restarted,
            _ => CaughtUp::No,
        }
    }

    /// A RESTART or TRUNCATE checkpoint; 0 once done, 1 when a reader or a writer was in
    /// the way (no busy handler: it fails at once rather than hold writers back). It holds
    /// the write lock while it copies and syncs, so it is marked on the right of way: the
    /// app's transactions of this `Outbox` wait for it there, woken once it ends, and so
    /// go before a relay write that waited out the catch-up it closes.
    fn blocking_checkpoint(&self, mode: &str) -> rusqlite::Result<i64> {
        let _blocking = self.outbox.right_of_way().blocking_checkpoint();
        self.conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get(0))
    }

    /// Resets the WAL if no reader is in the way; otherwise backs off.
    fn reset_wal(&mut self, mode: &str) {
        // Until the reset succeeds (the reader leaves, the pause ends) there is still a WAL
        // to cut, even if nothing else is written.
        self.reset_owed = true;
        if Instant::now() < self.next_reset {
            return;
        }
        if let Ok(0) = self.blocking_checkpoint(mode) {
            self.reset_backoff = CHECKPOINT_INTERVAL;
            self.reset_owed = false;
            return;
        }
        self.next_reset = Instant::now() + self.reset_backoff;
        self.reset_backoff = (self.reset_backoff * 2).min(WAL_RESET_BACKOFF_CAP);
        log::debug!(
            "relay {}: WAL reset busy (a reader is open), next try in {:?}",
            self.relay_id,
            self.reset_backoff
        );
    }
}

/// The WAL file of `conn`'s database (`None`: in memory).
fn conn_wal(conn: &Connection) -> Option<WalFile> {
    conn.path()
        .filter(|p| !p.is_empty())
        .map(|p| WalFile::of(std::path::Path::new(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::TransactionBehavior;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A relay's writes (each marked as a relay write, with a pause for the workers between
    /// them) and an app's commits (one every half millisecond, each with its turn) on
    /// `outbox`, until `done`.
    fn write_like_a_relay_and_an_app<'scope>(
        s: &'scope std::thread::Scope<'scope, '_>,
        outbox: &'scope Outbox,
        done: &'scope AtomicBool,
    ) {
        s.spawn(move || {
            let mut conn = outbox.connection().unwrap();
            while !done.load(Ordering::Relaxed) {
                let write = outbox.right_of_way().relay_write(Duration::from_millis(5));
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .unwrap();
                tx.execute("INSERT INTO filler VALUES (randomblob(3000))", [])
                    .unwrap();
                tx.commit().unwrap();
                drop(write);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                outbox
                    .transaction(|tx| {
                        Ok::<_, crate::Error>(
                            tx.execute("INSERT INTO filler VALUES (randomblob(100))", [])?,
                        )
                    })
                    .unwrap();
                std::thread::sleep(Duration::from_micros(500));
            }
        });
    }

    /// Sets its flag when dropped.
    struct SetOnDrop<'a>(&'a AtomicBool);

    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// The WAL header's first salt, which SQLite changes whenever the WAL starts over.
    fn wal_salt(outbox: &Outbox) -> [u8; 4] {
        let conn = outbox.connection().unwrap();
        let path = format!("{}-wal", conn.path().unwrap());
        let header = std::fs::read(path).unwrap();
        header[16..20].try_into().unwrap()
    }

    #[test]
    fn after_a_catch_up_under_relay_and_app_writes_the_next_write_starts_the_wal_over() {
        // Three rounds are usually enough, even with the two cores busy; the bound keeps a
        // checkpointer that never copies from running forever. (200 rounds, about 5 s,
        // were not enough in a CI run where the library's other tests kept both cores busy
        // meanwhile: it copied once. The loop ends at the third copy, so a quiet run takes
        // as long as before.)
        const MOST_ROUNDS: usize = 1_500;
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("catch-up.db")).unwrap();
        outbox
            .transaction(|tx| {
                Ok::<_, crate::Error>(tx.execute_batch("CREATE TABLE filler (b BLOB)")?)
            })
            .unwrap();
        let (_stop, stop) = crossbeam_channel::bounded::<()>(0);
        let conn = outbox.unpooled_connection().unwrap();
        conn.busy_handler(crate::store::database::NO_BUSY_HANDLER)
            .unwrap();
        let checkpointer = Checkpointer::new(
            conn,
            outbox.clone(),
            "test",
            stop,
            crossbeam_channel::never(),
        );
        let done = AtomicBool::new(false);
        let (mut caught_up, mut copied, mut started_over) = (0, 0, 0);
        let mut rounds = 0;
        std::thread::scope(|s| {
            write_like_a_relay_and_an_app(s, &outbox, &done);
            // Stops the writers however this closure ends: the scope joins them before it
            // passes a panic on, so writers left running would turn a failure into a hang.
            let _stop_writers = SetOnDrop(&done);
            // A catch-up that a busy machine keeps off the CPU past its 3 ms falls back to
            // the RESTART (as it should); rounds go on until three copied without it.
            while copied < 3 && rounds < MOST_ROUNDS {
                rounds += 1;
                std::thread::sleep(Duration::from_millis(20));
                let salt = wal_salt(&outbox);
                // As `checkpoint` does: a pass with nothing held off, then the catch-up.
                checkpointer.passive().unwrap();
                let outcome = checkpointer.catch_up();
                if outcome == CaughtUp::Copied {
                    copied += 1;
                }
                if outcome != CaughtUp::No {
                    caught_up += 1;
                    // The writers go on at once; give them a moment, not long enough to
                    // fill the WAL to the app's automatic checkpoint.
                    let deadline = Instant::now() + Duration::from_millis(100);
                    while wal_salt(&outbox) == salt && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if wal_salt(&outbox) != salt {
                        started_over += 1;
                    }
                }
            }
        });
        // Catch-ups do copy without the RESTART, whose copy holds the write lock.
        assert!(copied >= 3, "copied all {copied} times in {rounds}");
        assert_eq!(started_over, caught_up, "the WAL did not always start over");
    }
}
