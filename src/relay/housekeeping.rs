//! The writer's housekeeping between claims and acks: WAL checkpoints, retention, and the
//! metrics gauges. Each runs on a timer and costs the delivery path nothing in between.

use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::database;
use crate::error::Result;
use crate::queue::{self, Finished, DELETE_PAGE_ROWS, PENDING};
use crate::relay::config::RelayConfig;

/// How often the writer checkpoints the WAL while the database is being written, so that the
/// app's commits never run a checkpoint themselves.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL frames (pages) past which the writer resets the WAL instead of waiting for a gap in
/// the writes: 16 MiB of 4 KiB pages.
const WAL_RESTART_FRAMES: i64 = 4096;

/// WAL file size past which a reset also truncates the file: four times what the frame
/// bound lets it reach in normal operation, so only a WAL a long reader let grow is cut
/// (truncating on every reset would make each one re-grow the file, and cost the app's
/// commits their latency).
const WAL_TRUNCATE_BYTES: i64 = 4 * WAL_RESTART_FRAMES * 4096;

/// Longest pause between tries to reset the WAL while a reader keeps it busy.
const WAL_RESTART_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// How often the pending, age and size gauges are refreshed (they cost a query).
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);

/// Timers and progress of the writer's housekeeping.
pub(crate) struct Housekeeping {
    relay_id: String,
    retention: Option<Duration>,
    retention_interval: Duration,
    /// Whether anything was written since the last checkpoint.
    wrote: bool,
    last_checkpoint: Instant,
    /// When the WAL may next be reset, and the pause after the next busy try.
    next_restart: Instant,
    restart_backoff: Duration,
    /// When retention last started, and rows pruned in the current run (if one is going on).
    last_retention: Option<Instant>,
    pruning: Option<usize>,
    /// Whether free pages are being handed back, and how many were left at the last step
    /// (a step that frees nothing ends it).
    reclaiming: bool,
    last_free: Option<i64>,
    last_gauges: Option<Instant>,
}

impl Housekeeping {
    pub fn new(config: &RelayConfig, relay_id: &str) -> Housekeeping {
        Housekeeping {
            relay_id: relay_id.to_string(),
            retention: config.retention,
            retention_interval: config.retention_interval,
            wrote: true,
            last_checkpoint: Instant::now(),
            next_restart: Instant::now(),
            restart_backoff: CHECKPOINT_INTERVAL,
            last_retention: None,
            pruning: None,
            reclaiming: false,
            last_free: None,
            last_gauges: None,
        }
    }

    /// Notes a write (the relay's own, or one seen through `data_version`), so the next
    /// checkpoint is not skipped.
    pub fn note_write(&mut self) {
        self.wrote = true;
    }

    /// Runs whatever is due: a page of retention or a step of reclaiming, then a checkpoint.
    pub fn tick(&mut self, conn: &mut Connection, now_ms: i64) {
        if self.reclaiming {
            self.reclaim_step(conn);
        } else {
            self.retention(conn, now_ms);
        }
        self.checkpoint(conn);
    }

    /// Hands a bounded step of free pages back to the file system.
    fn reclaim_step(&mut self, conn: &Connection) {
        match database::reclaim_step(conn) {
            Ok(left) => {
                let progressed = self.last_free.is_none_or(|before| left < before);
                self.reclaiming = left > 0 && progressed;
                self.last_free = Some(left);
            }
            Err(e) => {
                self.reclaiming = false;
                log::warn!("relay {}: reclaiming space failed: {e}", self.relay_id);
            }
        }
        if !self.reclaiming {
            self.last_free = None;
        }
        self.wrote = true;
    }

    /// Checkpoints the WAL in the background. PASSIVE never waits for readers or writers.
    ///
    /// Under writes that never pause, a PASSIVE checkpoint never catches up with the end of
    /// the WAL, so the WAL is never reset and grows; past a bound the writer resets it
    /// (RESTART; TRUNCATE, which also gives the file's space back, once a long reader let the
    /// file grow past 64 MiB). A reset must wait for every
    /// reader to leave the old snapshot and holds new writers back while it waits, so it is
    /// tried without the busy handler: if a reader (a backup, a report query) is in the way
    /// it fails at once, and is tried again after a growing pause.
    fn checkpoint(&mut self, conn: &Connection) {
        if !self.wrote || self.last_checkpoint.elapsed() < CHECKPOINT_INTERVAL {
            return;
        }
        self.last_checkpoint = Instant::now();
        self.wrote = false;
        // (busy, frames in the WAL, frames checkpointed)
        let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        });
        let oversized = || wal_file_bytes(conn) > WAL_TRUNCATE_BYTES;
        match passive {
            Ok((frames, _)) if frames > WAL_RESTART_FRAMES => {
                let mode = if oversized() { "TRUNCATE" } else { "RESTART" };
                self.reset_wal(conn, mode)
            }
            // Writers reuse a fully checkpointed WAL from its start, so its frame count drops
            // while the file keeps the size a long reader let it grow to: cut it.
            Ok(_) if oversized() => self.reset_wal(conn, "TRUNCATE"),
            Ok(_) => {}
            Err(e) => log::debug!("relay {}: checkpoint failed: {e}", self.relay_id),
        }
    }

    /// Resets the WAL if no reader is in the way; otherwise backs off.
    fn reset_wal(&mut self, conn: &Connection, mode: &str) {
        // Come back next turn even if nothing else is written: until the reset succeeds
        // (the reader leaves, the pause ends) there is still a WAL to truncate.
        self.wrote = true;
        if Instant::now() < self.next_restart {
            return;
        }
        let busy = database::without_busy_wait(conn, |c| {
            c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                r.get::<_, i64>(0)
            })
        });
        match busy {
            Ok(0) => {
                self.restart_backoff = CHECKPOINT_INTERVAL;
                self.wrote = false;
            }
            Ok(_) | Err(_) => {
                self.next_restart = Instant::now() + self.restart_backoff;
                self.restart_backoff = (self.restart_backoff * 2).min(WAL_RESTART_BACKOFF_CAP);
                log::debug!(
                    "relay {}: WAL reset busy (a reader is open), next try in {:?}",
                    self.relay_id,
                    self.restart_backoff
                );
            }
        }
    }

    /// Prunes delivered events past the retention, one small page per loop turn so claims
    /// and acks go on in between.
    fn retention(&mut self, conn: &mut Connection, now_ms: i64) {
        let Some(keep) = self.retention else {
            return;
        };
        if self.pruning.is_none()
            && self
                .last_retention
                .is_none_or(|t| t.elapsed() >= self.retention_interval)
        {
            self.last_retention = Some(Instant::now());
            self.pruning = Some(0);
        }
        let Some(total) = self.pruning else { return };
        let cutoff = now_ms.saturating_sub(keep.as_millis() as i64);
        match queue::delete_page(conn, Finished::DeliveredBefore(cutoff)) {
            Ok(n) if n == DELETE_PAGE_ROWS => self.pruning = Some(total + n),
            Ok(n) => {
                self.pruning = None;
                let total = total + n;
                if total > 0 {
                    log::info!("relay {}: pruned {total} delivered events", self.relay_id);
                }
                // The pages the prune freed go back to the file system a step per turn.
                self.reclaiming = total > 0;
            }
            Err(e) => {
                self.pruning = None;
                log::warn!("relay {}: pruning failed, will retry: {e}", self.relay_id);
            }
        }
    }

    /// Refreshes the pending, age and size gauges every `GAUGE_INTERVAL` (metrics only).
    pub fn gauges(&mut self, conn: &Connection, now_ms: i64) {
        if crate::telemetry::GAUGES_ENABLED
            && self
                .last_gauges
                .is_none_or(|t| t.elapsed() >= GAUGE_INTERVAL)
        {
            self.last_gauges = Some(Instant::now());
            if let Err(e) = update_gauges(conn, now_ms) {
                log::debug!("relay {}: gauges not updated: {e}", self.relay_id);
            }
        }
    }
}

/// The size of `conn`'s WAL file (0 if it cannot be read).
fn wal_file_bytes(conn: &Connection) -> i64 {
    let Some(path) = conn.path().filter(|p| !p.is_empty()) else {
        return 0;
    };
    std::fs::metadata(format!("{path}-wal")).map_or(0, |m| m.len() as i64)
}

fn update_gauges(conn: &Connection, now_ms: i64) -> Result<()> {
    let (pending, oldest, pages, page_size): (i64, Option<i64>, i64, i64) = conn.query_row(
        &format!(
            "SELECT (SELECT COUNT(*) FROM outbox_events WHERE {PENDING}),
                    (SELECT MIN(created_at) FROM outbox_events WHERE {PENDING}),
                    (SELECT * FROM pragma_page_count()), (SELECT * FROM pragma_page_size())"
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    crate::telemetry::gauges(pending, oldest.map(|t| now_ms - t), pages * page_size);
    Ok(())
}
