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

/// WAL frames (pages) past which the writer restarts the WAL instead of waiting for a gap in
/// the writes: 16 MiB of 4 KiB pages.
const WAL_RESTART_FRAMES: i64 = 4096;

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
    /// When retention last started, and rows pruned in the current run (if one is going on).
    last_retention: Option<Instant>,
    pruning: Option<usize>,
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
            last_retention: None,
            pruning: None,
            last_gauges: None,
        }
    }

    /// Notes a write (the relay's own, or one seen through `data_version`), so the next
    /// checkpoint is not skipped.
    pub fn note_write(&mut self) {
        self.wrote = true;
    }

    /// Runs whatever is due: a page of retention, then a checkpoint.
    pub fn tick(&mut self, conn: &mut Connection, now_ms: i64) {
        self.retention(conn, now_ms);
        self.checkpoint(conn);
    }

    /// Checkpoints the WAL in the background (PASSIVE: never waits for readers or writers).
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
        match passive {
            // Under writes that never pause, a PASSIVE checkpoint never catches up with the
            // end of the WAL, so the WAL is never restarted and grows. Past a bound, restart
            // it: this briefly holds new writers back, which is why it is the exception.
            Ok((frames, _)) if frames > WAL_RESTART_FRAMES => {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                    log::debug!("relay {}: WAL restart failed: {e}", self.relay_id);
                }
            }
            Ok(_) => {}
            Err(e) => log::debug!("relay {}: checkpoint failed: {e}", self.relay_id),
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
                if total >= database::RECLAIM_AFTER_ROWS {
                    if let Err(e) = database::reclaim(conn) {
                        log::warn!("relay {}: reclaiming space failed: {e}", self.relay_id);
                    }
                }
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
