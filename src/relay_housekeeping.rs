//! The relay writer's housekeeping between claims and acks: WAL checkpoints, retention, and
//! the metrics gauges. Each runs on a timer and costs the delivery path nothing in between.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::relay_writer::{State, Writer};

/// How often the writer checkpoints the WAL while the database is being written, so that the
/// app's commits never run a checkpoint themselves.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL frames (pages) past which the writer restarts the WAL instead of waiting for a gap in
/// the writes: 16 MiB of 4 KiB pages.
const WAL_RESTART_FRAMES: i64 = 4096;

/// How often the pending, age and size gauges are refreshed (they cost a query).
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);

impl Writer {
    /// Checkpoints the WAL in the background (PASSIVE: never waits for readers or writers).
    pub(crate) fn checkpoint(&mut self, state: &mut State) {
        if !self.wrote || state.last_checkpoint.elapsed() < CHECKPOINT_INTERVAL {
            return;
        }
        state.last_checkpoint = Instant::now();
        self.wrote = false;
        // (busy, frames in the WAL, frames checkpointed)
        let passive = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            });
        match passive {
            // Under writes that never pause, a PASSIVE checkpoint never catches up with the
            // end of the WAL, so the WAL is never restarted and grows. Past a bound, restart
            // it: this briefly holds new writers back, which is why it is the exception.
            Ok((frames, _)) if frames > WAL_RESTART_FRAMES => {
                if let Err(e) =
                    self.conn
                        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                {
                    log::debug!("relay {}: WAL restart failed: {e}", self.relay_id);
                }
            }
            Ok(_) => {}
            Err(e) => log::debug!("relay {}: checkpoint failed: {e}", self.relay_id),
        }
    }

    /// Prunes delivered events past the retention, one small page per loop turn so claims
    /// and acks go on in between.
    pub(crate) fn retention(&mut self, state: &mut State) {
        let Some(keep) = self.config.retention else {
            return;
        };
        if state.pruning.is_none()
            && state
                .last_retention
                .is_none_or(|t| t.elapsed() >= self.config.retention_interval)
        {
            state.last_retention = Some(Instant::now());
            state.pruning = Some(0);
        }
        let Some(total) = state.pruning else { return };
        let cutoff = self.outbox.now_ms().saturating_sub(keep.as_millis() as i64);
        match crate::admin::prune_page(&mut self.conn, cutoff) {
            Ok(n) if n == crate::admin::PRUNE_PAGE_ROWS => state.pruning = Some(total + n),
            Ok(n) => {
                state.pruning = None;
                let total = total + n;
                if total > 0 {
                    log::info!("relay {}: pruned {total} delivered events", self.relay_id);
                }
                if total >= crate::admin::RECLAIM_AFTER_ROWS {
                    if let Err(e) = crate::admin::reclaim(&self.conn) {
                        log::warn!("relay {}: reclaiming space failed: {e}", self.relay_id);
                    }
                }
            }
            Err(e) => {
                state.pruning = None;
                log::warn!("relay {}: pruning failed, will retry: {e}", self.relay_id);
            }
        }
    }

    /// Refreshes the pending, age and size gauges every `GAUGE_INTERVAL` (metrics only).
    pub(crate) fn gauges(&self, state: &mut State) {
        if crate::telemetry::GAUGES_ENABLED
            && state
                .last_gauges
                .is_none_or(|t| t.elapsed() >= GAUGE_INTERVAL)
        {
            state.last_gauges = Some(Instant::now());
            if let Err(e) = self.update_gauges() {
                log::debug!("relay {}: gauges not updated: {e}", self.relay_id);
            }
        }
    }

    fn update_gauges(&self) -> Result<()> {
        let (pending, oldest, pages, page_size): (i64, Option<i64>, i64, i64) =
            self.conn.query_row(
                "SELECT (SELECT COUNT(*) FROM outbox_events
                          WHERE delivered_at IS NULL AND dead_at IS NULL),
                        (SELECT MIN(created_at) FROM outbox_events
                          WHERE delivered_at IS NULL AND dead_at IS NULL),
                        (SELECT * FROM pragma_page_count()), (SELECT * FROM pragma_page_size())",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
        let now = self.outbox.now_ms();
        crate::telemetry::gauges(pending, oldest.map(|t| now - t), pages * page_size);
        Ok(())
    }
}
