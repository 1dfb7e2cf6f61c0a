//! Bounded storage: limits on pending events and bytes, and which event types give way when
//! they are hit (the rows themselves are dropped by [`queue::drop_oldest`]).

use rusqlite::Connection;

use crate::error::{Error, Limit, Result};
use crate::store::queue::{self, pending, RoomNeeded, PENDING};

/// How events of a type are treated when the outbox is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoragePolicy {
    /// Never dropped: when the outbox is full and nothing droppable can make room, enqueue
    /// returns [`Error::OutboxFull`] and the caller decides. The default, for business events.
    #[default]
    Reject,
    /// Lossy telemetry: the oldest pending events of such types are removed to make room for
    /// any new event, counted in [`Stats::dropped`](crate::admin::Stats::dropped) and logged.
    DropOldest,
}

/// The limits and which types may be dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StorageLimits {
    pub max_pending: Option<i64>,
    pub max_pending_bytes: Option<i64>,
    /// Policies by type pattern (exact, `prefix*`, `*`); the most specific match wins, and a
    /// type no pattern matches is `Reject`.
    pub policies: Vec<(String, StoragePolicy)>,
}

/// Triggers that keep `outbox_stats.pending_count` and `pending_bytes` exact whoever writes
/// the table (the app, a relay, the CLI, another process), so that enforcing a limit costs one
/// row read instead of a count over every pending event. Created, with the totals recounted,
/// the first time the file is opened with a limit; they then stay. They run in whatever
/// SQLite the writing process links (an app in Python on Debian 12 links 3.40), so they use
/// only functions of 3.40: `length(CAST(x AS BLOB))`, not `octet_length` (3.43).
const TOTALS_TRIGGERS: &str = concat!(
    "
CREATE TRIGGER IF NOT EXISTS outbox_events_pending_insert AFTER INSERT ON outbox_events
WHEN ",
    pending!("NEW."),
    "
BEGIN
    UPDATE outbox_stats
       SET pending_count = pending_count + 1,
           pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB))
     WHERE id = 1;
END;

CREATE TRIGGER IF NOT EXISTS outbox_events_pending_delete AFTER DELETE ON outbox_events
WHEN ",
    pending!("OLD."),
    "
BEGIN
    UPDATE outbox_stats
       SET pending_count = pending_count - 1,
           pending_bytes = pending_bytes - length(CAST(OLD.payload AS BLOB))
     WHERE id = 1;
END;

CREATE TRIGGER IF NOT EXISTS outbox_events_pending_update
AFTER UPDATE OF delivered_at, dead_at ON outbox_events
WHEN (",
    pending!("OLD."),
    ") <> (",
    pending!("NEW."),
    ")
BEGIN
    UPDATE outbox_stats
       SET pending_count = pending_count
               + CASE WHEN ",
    pending!("NEW."),
    " THEN 1 ELSE -1 END,
           pending_bytes = pending_bytes
               + CASE WHEN ",
    pending!("NEW."),
    " THEN length(CAST(NEW.payload AS BLOB)) ELSE -length(CAST(OLD.payload AS BLOB)) END
     WHERE id = 1;
END;
"
);

/// Installs the totals triggers if they are missing, recounting the totals in the same
/// transaction so they start exact.
pub(crate) fn ensure_totals(conn: &mut rusqlite::Connection) -> Result<()> {
    // Triggers of earlier versions used `octet_length`, which SQLite before 3.43 lacks:
    // those are replaced.
    let installed: bool = conn.query_row(
        "SELECT COUNT(*) = 3 AND SUM(instr(sql, 'octet_length')) = 0 FROM sqlite_master
          WHERE type = 'trigger' AND name LIKE 'outbox_events_pending_%'",
        [],
        |r| r.get(0),
    )?;
    if installed {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "DROP TRIGGER IF EXISTS outbox_events_pending_insert;
         DROP TRIGGER IF EXISTS outbox_events_pending_delete;
         DROP TRIGGER IF EXISTS outbox_events_pending_update;",
    )?;
    tx.execute_batch(TOTALS_TRIGGERS)?;
    tx.execute(
        &format!(
            "UPDATE outbox_stats SET (pending_count, pending_bytes) = (
                 SELECT COUNT(*), COALESCE(SUM(length(CAST(payload AS BLOB))), 0) FROM outbox_events
                  WHERE {PENDING})
              WHERE id = 1"
        ),
        [],
    )?;
    tx.commit()?;
    Ok(())
}

impl StorageLimits {
    pub fn is_set(&self) -> bool {
        self.max_pending.is_some() || self.max_pending_bytes.is_some()
    }

    /// Whether events of `event_type` may be dropped to make room.
    pub fn is_droppable(&self, event_type: &str) -> bool {
        crate::store::type_pattern::most_specific(&self.policies, event_type)
            == Some(&StoragePolicy::DropOldest)
    }

    /// Whether any type may be dropped at all.
    fn any_droppable(&self) -> bool {
        self.policies
            .iter()
            .any(|(_, p)| *p == StoragePolicy::DropOldest)
    }

    /// Records these policies on the pending rows (enqueued under other settings, or before
    /// the flag existed), so the drop order follows the policy in force: one statement per
    /// pending type whose flag is wrong.
    pub fn mark_pending(&self, conn: &mut rusqlite::Connection) -> Result<()> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let types: Vec<String> = tx
            .prepare(&format!(
                "SELECT DISTINCT event_type FROM outbox_events WHERE {PENDING}"
            ))?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for event_type in types {
            let droppable = self.is_droppable(&event_type);
            tx.execute(
                &format!(
                    "UPDATE outbox_events SET droppable = ?2
                      WHERE event_type = ?1 AND {PENDING} AND droppable IS NOT ?2"
                ),
                rusqlite::params![event_type, droppable],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Makes room in `tx` for `add_count` new rows carrying `add_bytes`, dropping the oldest
    /// pending droppable events if needed. Returns how many were dropped.
    ///
    /// Nothing is deleted unless enough room can be made, so a refused enqueue leaves the
    /// caller's transaction exactly as it was.
    pub fn make_room(
        &self,
        tx: &Connection,
        add_count: i64,
        add_bytes: i64,
        now: i64,
    ) -> Result<usize> {
        // Read through a write: a first read in the caller's deferred transaction would make
        // the later writes fail with SQLITE_BUSY_SNAPSHOT when another connection commits in
        // between; a write waits for the lock instead.
        let (count, bytes): (i64, i64) = tx
            .prepare_cached(
                "UPDATE outbox_stats SET pending_count = pending_count WHERE id = 1
                 RETURNING pending_count, pending_bytes",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let over_count = self.max_pending.map_or(0, |m| count + add_count - m).max(0);
        let over_bytes = self
            .max_pending_bytes
            .map_or(0, |m| bytes + add_bytes - m)
            .max(0);
        if over_count == 0 && over_bytes == 0 {
            return Ok(0);
        }
        let full = || {
            let (limit, max, current) = if over_count > 0 {
                (Limit::PendingEvents, self.max_pending.unwrap_or(0), count)
            } else {
                (
                    Limit::PendingBytes,
                    self.max_pending_bytes.unwrap_or(0),
                    bytes,
                )
            };
            Error::OutboxFull {
                limit,
                max,
                current,
            }
        };
        // A single event larger than the whole byte budget can never fit.
        if !self.any_droppable() || self.max_pending_bytes.is_some_and(|m| add_bytes > m) {
            return Err(full());
        }
        // Oldest first, skipping events a relay is delivering right now.
        let need = RoomNeeded {
            rows: over_count,
            bytes: over_bytes,
            now,
        };
        let Some(dropped) = queue::drop_oldest(tx, &need)? else {
            return Err(full());
        };
        crate::observe::telemetry::dropped(dropped);
        log::warn!(
            "outbox full: dropped the {dropped} oldest pending droppable events to make room"
        );
        Ok(dropped)
    }
}
