//! Bounded storage: limits on pending events and bytes, and which event types give way when
//! they are hit (the rows themselves are dropped by [`queue::drop_oldest`]).

use rusqlite::Transaction;

use crate::error::{Error, Result};
use crate::queue::{self, pending, RoomNeeded, PENDING};

/// How events of a type are treated when the outbox is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
#[derive(Debug, Clone, Default)]
pub(crate) struct StorageLimits {
    pub max_pending: Option<i64>,
    pub max_pending_bytes: Option<i64>,
    /// Patterns (exact, `prefix*`, `*`) of types whose policy is `DropOldest`.
    pub lossy: Vec<String>,
}

/// Which limit an enqueue ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The number of pending deliveries.
    PendingEvents,
    /// The bytes of pending event data.
    PendingBytes,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::PendingEvents => "pending events",
            Limit::PendingBytes => "pending bytes",
        })
    }
}

/// Triggers that keep `outbox_stats.pending_count` and `pending_bytes` exact whoever writes
/// the table (the app, a relay, the CLI, another process), so that enforcing a limit costs one
/// row read instead of a count over every pending event. Created, with the totals recounted,
/// the first time the file is opened with a limit; they then stay.
const TOTALS_TRIGGERS: &str = concat!(
    "
CREATE TRIGGER IF NOT EXISTS outbox_events_pending_insert AFTER INSERT ON outbox_events
WHEN ",
    pending!("NEW."),
    "
BEGIN
    UPDATE outbox_stats
       SET pending_count = pending_count + 1,
           pending_bytes = pending_bytes + octet_length(NEW.payload)
     WHERE id = 1;
END;

CREATE TRIGGER IF NOT EXISTS outbox_events_pending_delete AFTER DELETE ON outbox_events
WHEN ",
    pending!("OLD."),
    "
BEGIN
    UPDATE outbox_stats
       SET pending_count = pending_count - 1,
           pending_bytes = pending_bytes - octet_length(OLD.payload)
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
    " THEN octet_length(NEW.payload) ELSE -octet_length(OLD.payload) END
     WHERE id = 1;
END;
"
);

/// Installs the totals triggers if they are missing, recounting the totals in the same
/// transaction so they start exact.
pub(crate) fn ensure_totals(conn: &mut rusqlite::Connection) -> Result<()> {
    let installed: bool = conn.query_row(
        "SELECT COUNT(*) = 3 FROM sqlite_master
          WHERE type = 'trigger' AND name LIKE 'outbox_events_pending_%'",
        [],
        |r| r.get(0),
    )?;
    if installed {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(TOTALS_TRIGGERS)?;
    tx.execute(
        &format!(
            "UPDATE outbox_stats SET (pending_count, pending_bytes) = (
                 SELECT COUNT(*), COALESCE(SUM(octet_length(payload)), 0) FROM outbox_events
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
        self.lossy
            .iter()
            .any(|p| crate::destination::type_matches(p, event_type))
    }

    /// Records this outbox's policies on the pending rows (enqueued under other settings, or
    /// before the flag existed), so the drop order follows the policy in force.
    pub fn mark_pending(&self, conn: &mut rusqlite::Connection) -> Result<()> {
        let (predicate, values) = if self.lossy.is_empty() {
            ("(0)".to_string(), Vec::new())
        } else {
            self.lossy_predicate()
        };
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            &format!(
                "UPDATE outbox_events SET droppable = {predicate}
                  WHERE {PENDING} AND droppable IS NOT {predicate}"
            ),
            rusqlite::params_from_iter(values.iter()),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The SQL condition selecting droppable types, and its parameters.
    fn lossy_predicate(&self) -> (String, Vec<String>) {
        let mut terms = Vec::new();
        let mut values = Vec::new();
        for pattern in &self.lossy {
            match pattern.strip_suffix('*') {
                Some("") => terms.push("1".to_string()),
                Some(prefix) => {
                    values.push(prefix.to_string());
                    // substr, not LIKE/GLOB: no wildcard characters to escape in the prefix.
                    terms.push(format!(
                        "substr(event_type, 1, length(?{n})) = ?{n}",
                        n = values.len()
                    ));
                }
                None => {
                    values.push(pattern.clone());
                    terms.push(format!("event_type = ?{}", values.len()));
                }
            }
        }
        (format!("({})", terms.join(" OR ")), values)
    }

    /// Makes room in `tx` for `add_count` new rows carrying `add_bytes`, dropping the oldest
    /// pending droppable events if needed. Returns how many were dropped.
    ///
    /// Nothing is deleted unless enough room can be made, so a refused enqueue leaves the
    /// caller's transaction exactly as it was.
    pub fn make_room(
        &self,
        tx: &Transaction<'_>,
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
        if self.lossy.is_empty() || self.max_pending_bytes.is_some_and(|m| add_bytes > m) {
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
        crate::telemetry::dropped(dropped);
        log::warn!(
            "outbox full: dropped the {dropped} oldest pending droppable events to make room"
        );
        Ok(dropped)
    }
}
