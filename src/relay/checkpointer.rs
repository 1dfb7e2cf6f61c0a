//! The relay's checkpointer: a thread of its own (`outbox-checkpoint`) that copies the WAL
//! back into the database file while anything is being written, so neither the app's
//! commits nor the relay's writer ever run a checkpoint themselves.
//!
//! It has its own connection, outside the pool. A PASSIVE checkpoint takes no lock a writer
//! needs, so the writer goes on claiming and acking while pages are copied; run on the
//! writer's thread, the copy of a large WAL (a backlog filled in one go) stalled claims for
//! tens of milliseconds.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use rusqlite::Connection;

/// How often the checkpointer looks for new writes.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL frames (pages) past which the WAL is reset instead of waiting for a gap in the
/// writes: 16 MiB of 4 KiB pages.
const WAL_RESTART_FRAMES: i64 = 4096;

/// WAL file size past which a reset also truncates the file: four times what the frame
/// bound lets it reach in normal operation, so only a WAL a long reader let grow is cut
/// (truncating on every reset would make each one re-grow the file, and cost the app's
/// commits their latency).
const WAL_TRUNCATE_BYTES: i64 = 4 * WAL_RESTART_FRAMES * 4096;

/// Longest pause between tries to reset the WAL while a reader keeps it busy.
const WAL_RESET_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// The checkpointer's state; [`run`](Self::run) is the thread's body.
pub(crate) struct Checkpointer {
    relay_id: String,
    conn: Connection,
    stop: Receiver<()>,
    /// `PRAGMA data_version` at the last look: it changes when another connection commits.
    data_version: Option<i64>,
    /// A reset failed (a reader was in the way) and is owed even if nothing more is written.
    reset_owed: bool,
    /// When the WAL may next be reset, and the pause after the next busy try.
    next_reset: Instant,
    reset_backoff: Duration,
}

impl Checkpointer {
    /// A checkpointer on `conn` that runs until `stop`'s sender is dropped.
    pub fn new(conn: Connection, relay_id: &str, stop: Receiver<()>) -> Checkpointer {
        Checkpointer {
            relay_id: relay_id.to_string(),
            conn,
            stop,
            data_version: None,
            reset_owed: false,
            next_reset: Instant::now(),
            reset_backoff: CHECKPOINT_INTERVAL,
        }
    }

    /// Checkpoints every `CHECKPOINT_INTERVAL` while writes go on, until stopped.
    pub fn run(mut self) {
        // Nothing here may wait for a lock: a checkpoint that cannot go ahead is skipped
        // and tried again on the next turn.
        if let Err(e) = self.conn.busy_handler(None) {
            log::warn!("relay {}: checkpointer not started: {e}", self.relay_id);
            return;
        }
        while let Err(RecvTimeoutError::Timeout) = self.stop.recv_timeout(CHECKPOINT_INTERVAL) {
            if self.wrote() || self.reset_owed {
                self.checkpoint();
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
    /// Under writes that never pause, a PASSIVE checkpoint never catches up with the end of
    /// the WAL, so the WAL is never reset and grows; past a bound it is reset (RESTART;
    /// TRUNCATE, which also gives the file's space back, once a long reader let the file
    /// grow past 64 MiB). A reset must wait for every reader to leave the old snapshot and
    /// holds new writers back while it waits, so it is tried without a busy handler: if a
    /// reader (a backup, a report query) is in the way it fails at once, and is tried again
    /// after a growing pause.
    fn checkpoint(&mut self) {
        // (busy, frames in the WAL, frames checkpointed)
        let passive = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1));
        let oversized = || wal_file_bytes(&self.conn) > WAL_TRUNCATE_BYTES;
        match passive {
            Ok(frames) if frames > WAL_RESTART_FRAMES => {
                let mode = if oversized() { "TRUNCATE" } else { "RESTART" };
                self.reset_wal(mode)
            }
            // Writers reuse a fully checkpointed WAL from its start, so its frame count drops
            // while the file keeps the size a long reader let it grow to: cut it.
            Ok(_) if oversized() => self.reset_wal("TRUNCATE"),
            Ok(_) => self.reset_owed = false,
            Err(e) => log::debug!("relay {}: checkpoint failed: {e}", self.relay_id),
        }
    }

    /// Resets the WAL if no reader is in the way; otherwise backs off.
    fn reset_wal(&mut self, mode: &str) {
        // Until the reset succeeds (the reader leaves, the pause ends) there is still a WAL
        // to cut, even if nothing else is written.
        self.reset_owed = true;
        if Instant::now() < self.next_reset {
            return;
        }
        let busy = self
            .conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                r.get::<_, i64>(0)
            });
        if let Ok(0) = busy {
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

/// The size of `conn`'s WAL file (0 if it cannot be read).
fn wal_file_bytes(conn: &Connection) -> i64 {
    let Some(path) = conn.path().filter(|p| !p.is_empty()) else {
        return 0;
    };
    std::fs::metadata(format!("{path}-wal")).map_or(0, |m| m.len() as i64)
}
