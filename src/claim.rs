//! The lease SQL: claim due events with one `UPDATE … RETURNING`, and fenced write-backs.
//!
//! SQLite has one writer at a time, so the claim statement is atomic: two relays (threads or
//! processes) can never both claim a row while its lease is valid. Every write-back names the
//! lease owner it came from, so a relay whose lease expired (it was paused, or slow) cannot
//! overwrite the outcome of the relay that claimed the row after it.

use rusqlite::{params, Connection};

/// `available_at` of an event parked behind an earlier pending event of its partition key.
///
/// Only the oldest pending event of a key (its head) is ever due; the others wait here, out
/// of the claim's way, and the next one is made due when the head is delivered or
/// dead-lettered. Without parking, a claim would have to step over every queued event of
/// every busy key, and its cost would grow with the backlog.
pub const PARKED: i64 = i64::MAX;

use crate::error::Result;
use crate::transport::OutboundEvent;

/// Claims up to `limit` due events of `destination` for `owner` until `now + lease_ms`.
///
/// A row is due when it is neither delivered nor dead, its `available_at` has come, its lease
/// is free or expired, and (for rows with a partition key) no older undelivered row of the same
/// key and destination exists: that last rule is what keeps a key's events in commit order.
/// Dead rows do not block their key, so one poison event parks only itself.
///
/// The inner `SELECT` walks the partial index `(available_at, id)` and stops at `limit`, so the
/// cost depends on the due rows, not on how many delivered rows the table keeps.
pub(crate) const CLAIM_SQL: &str = "
UPDATE outbox_events
   SET lease_owner = ?1, lease_expires_at = ?2
 WHERE id IN (
    SELECT e.id FROM outbox_events AS e
     WHERE e.delivered_at IS NULL AND e.dead_at IS NULL
       AND e.available_at <= ?3
       AND e.destination = ?4
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= ?3)
       AND (e.partition_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM outbox_events AS h
             WHERE h.partition_key = e.partition_key
               AND h.destination = e.destination
               AND h.id < e.id
               AND h.delivered_at IS NULL AND h.dead_at IS NULL))
     ORDER BY e.available_at, e.id
     LIMIT ?5)
RETURNING id, event_id, destination, event_type, COALESCE(source, ?6), subject, partition_key,
          idempotency_key, payload, created_at, attempts, lease_owner, lease_expires_at";

/// What to record for one delivered, failed or released row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteBack {
    /// The receiver accepted it.
    Delivered,
    /// The receiver answered with a retryable failure: spend an attempt, try again later.
    Retry { available_at: i64, error: String },
    /// Give up: keep the error for the operator.
    Dead { error: String },
    /// Hand the row back without spending an attempt (destination unreachable, shutdown).
    Release { error: Option<String> },
}

/// One claim request.
pub(crate) struct ClaimRequest<'a> {
    pub destination: &'a str,
    pub default_source: &'a str,
    pub owner: &'a str,
    pub now: i64,
    pub lease_ms: i64,
    pub limit: i64,
}

/// Runs the claim; rows come back in commit order.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest<'_>) -> Result<Vec<OutboundEvent>> {
    let mut stmt = conn.prepare_cached(CLAIM_SQL)?;
    let rows = stmt.query_map(
        params![
            req.owner,
            req.now + req.lease_ms,
            req.now,
            req.destination,
            req.limit,
            req.default_source
        ],
        |r| {
            Ok(OutboundEvent {
                id: r.get(0)?,
                event_id: r.get(1)?,
                destination: r.get(2)?,
                event_type: r.get(3)?,
                source: r.get(4)?,
                subject: r.get(5)?,
                partition_key: r.get(6)?,
                idempotency_key: r.get(7)?,
                payload: r.get(8)?,
                created_at: r.get(9)?,
                attempts: r.get(10)?,
                lease_owner: r.get(11)?,
                lease_expires_at: r.get(12)?,
            })
        },
    )?;
    let mut events = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    // RETURNING order is unspecified; hand events to workers oldest first.
    events.sort_unstable_by_key(|e| e.id);
    Ok(events)
}

/// Marks the rows `ids`, all claimed by `owner`, delivered in one statement; returns the ids
/// whose lease `owner` still held (the others were taken over and are left alone).
pub(crate) fn mark_delivered(
    conn: &Connection,
    owner: &str,
    ids: &[i64],
    now: i64,
) -> Result<Vec<i64>> {
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let mut stmt = conn.prepare_cached(
        "UPDATE outbox_events
            SET delivered_at = ?3, last_attempted_at = ?3, attempts = attempts + 1,
                lease_owner = NULL, lease_expires_at = NULL
          WHERE id IN (SELECT value FROM json_each(?1)) AND lease_owner = ?2
         RETURNING id",
    )?;
    let rows = stmt.query_map(params![format!("[{list}]"), owner, now], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Makes the oldest pending event of `key` due if it is parked: called whenever a key's head
/// leaves the pending set (delivered, dead-lettered, dropped, replaced).
pub(crate) fn unpark_next(conn: &Connection, key: &str, destination: &str, now: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE outbox_events SET available_at = ?3
          WHERE available_at = ?4 AND id = (
                SELECT MIN(id) FROM outbox_events
                 WHERE partition_key = ?1 AND destination = ?2
                   AND delivered_at IS NULL AND dead_at IS NULL)",
    )?
    .execute(params![key, destination, now, PARKED])?;
    Ok(())
}

/// Records the outcome of row `id` if, and only if, `owner` still holds its lease.
///
/// Returns whether the row was updated: `false` means the lease was taken over by another
/// claim (or the row is gone), and the outcome was discarded.
pub(crate) fn write_back(
    conn: &Connection,
    id: i64,
    owner: &str,
    now: i64,
    outcome: &WriteBack,
) -> Result<bool> {
    let changed = match outcome {
        WriteBack::Delivered => conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET delivered_at = ?3, last_attempted_at = ?3, attempts = attempts + 1,
                        lease_owner = NULL, lease_expires_at = NULL
                  WHERE id = ?1 AND lease_owner = ?2",
            )?
            .execute(params![id, owner, now])?,
        WriteBack::Retry {
            available_at,
            error,
        } => conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET available_at = ?4, last_error = ?5, last_attempted_at = ?3,
                        attempts = attempts + 1, lease_owner = NULL, lease_expires_at = NULL
                  WHERE id = ?1 AND lease_owner = ?2",
            )?
            .execute(params![id, owner, now, available_at, error])?,
        WriteBack::Dead { error } => conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET dead_at = ?3, last_error = ?4, last_attempted_at = ?3,
                        attempts = attempts + 1, lease_owner = NULL, lease_expires_at = NULL
                  WHERE id = ?1 AND lease_owner = ?2",
            )?
            .execute(params![id, owner, now, error])?,
        WriteBack::Release { error } => conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET last_error = COALESCE(?3, last_error),
                        lease_owner = NULL, lease_expires_at = NULL
                  WHERE id = ?1 AND lease_owner = ?2",
            )?
            .execute(params![id, owner, error])?,
    };
    Ok(changed == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store;

    fn db() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claim.db");
        let mut conn = Connection::open(&path).unwrap();
        store::migrate(&mut conn, &path).unwrap();
        (dir, conn)
    }

    fn insert(conn: &Connection, key: Option<&str>, available_at: i64) -> i64 {
        conn.execute(
            "INSERT INTO outbox_events (event_id, event_type, partition_key, payload,
                                        created_at, available_at)
             VALUES (lower(hex(randomblob(16))), 't', ?1, '{}', 0, ?2)",
            params![key, available_at],
        )
        .unwrap();
        conn.last_insert_rowid()
    }

    fn req<'a>(owner: &'a str, now: i64, limit: i64) -> ClaimRequest<'a> {
        ClaimRequest {
            destination: "default",
            default_source: "/test",
            owner,
            now,
            lease_ms: 1_000,
            limit,
        }
    }

    #[test]
    fn claim_takes_due_rows_in_order_and_leases_them() {
        let (_d, conn) = db();
        let a = insert(&conn, None, 0);
        let b = insert(&conn, None, 0);
        insert(&conn, None, 10_000); // not yet due
        let got = claim(&conn, &req("r1", 100, 10)).unwrap();
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a, b]);
        assert!(got
            .iter()
            .all(|e| e.lease_owner == "r1" && e.lease_expires_at == 1_100));
        assert_eq!(got[0].source, "/test");
        // Leased rows are not claimable by anyone else while the lease holds.
        assert!(claim(&conn, &req("r2", 500, 10)).unwrap().is_empty());
    }

    #[test]
    fn expired_lease_is_claimed_again_and_stale_owner_is_fenced_off() {
        let (_d, conn) = db();
        let id = insert(&conn, None, 0);
        assert_eq!(claim(&conn, &req("old", 0, 10)).unwrap().len(), 1);
        // The old owner's lease (until 1_000) has expired: a new relay takes the row.
        let again = claim(&conn, &req("new", 1_000, 10)).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].lease_owner, "new");
        // The old owner's late outcome is rejected; the new owner's is recorded.
        let stale = WriteBack::Dead {
            error: "late".into(),
        };
        assert!(!write_back(&conn, id, "old", 1_100, &stale).unwrap());
        assert!(write_back(&conn, id, "new", 1_100, &WriteBack::Delivered).unwrap());
        let (delivered, dead): (Option<i64>, Option<i64>) = conn
            .query_row(
                "SELECT delivered_at, dead_at FROM outbox_events WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((delivered, dead), (Some(1_100), None));
    }

    #[test]
    fn only_the_head_of_a_partition_key_is_claimable() {
        let (_d, conn) = db();
        let k1 = insert(&conn, Some("k"), 0);
        let k2 = insert(&conn, Some("k"), 0);
        let other = insert(&conn, Some("j"), 0);
        let got: Vec<i64> = claim(&conn, &req("r", 0, 10))
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got, vec![k1, other]);
        write_back(&conn, k1, "r", 1, &WriteBack::Delivered).unwrap();
        let got: Vec<i64> = claim(&conn, &req("r", 1, 10))
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got, vec![k2]);
    }

    #[test]
    fn a_head_waiting_for_retry_holds_back_its_key() {
        let (_d, conn) = db();
        let k1 = insert(&conn, Some("k"), 0);
        insert(&conn, Some("k"), 0);
        claim(&conn, &req("r", 0, 10)).unwrap();
        let retry = WriteBack::Retry {
            available_at: 5_000,
            error: "HTTP 500".into(),
        };
        assert!(write_back(&conn, k1, "r", 10, &retry).unwrap());
        assert!(claim(&conn, &req("r", 20, 10)).unwrap().is_empty());
        let got = claim(&conn, &req("r", 5_000, 10)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id, got[0].attempts), (k1, 1));
    }

    #[test]
    fn a_dead_head_does_not_block_its_key() {
        let (_d, conn) = db();
        let k1 = insert(&conn, Some("k"), 0);
        let k2 = insert(&conn, Some("k"), 0);
        claim(&conn, &req("r", 0, 10)).unwrap();
        let dead = WriteBack::Dead {
            error: "HTTP 400".into(),
        };
        write_back(&conn, k1, "r", 1, &dead).unwrap();
        let got = claim(&conn, &req("r", 2, 10)).unwrap();
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![k2]);
    }

    #[test]
    fn mark_delivered_is_fenced_per_row() {
        let (_d, conn) = db();
        let a = insert(&conn, None, 0);
        let b = insert(&conn, None, 0);
        claim(&conn, &req("mine", 0, 10)).unwrap();
        // b's lease expires and another relay takes it.
        conn.execute(
            "UPDATE outbox_events SET lease_owner = 'theirs' WHERE id = ?1",
            [b],
        )
        .unwrap();
        let done = mark_delivered(&conn, "mine", &[a, b], 5).unwrap();
        assert_eq!(done, vec![a]);
        let owner: String = conn
            .query_row(
                "SELECT lease_owner FROM outbox_events WHERE id = ?1",
                [b],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(owner, "theirs");
    }

    #[test]
    fn only_heads_are_due_and_the_next_is_unparked_when_the_head_leaves() {
        let (_d, conn) = db();
        let head = insert(&conn, Some("k"), 0);
        let next = insert(&conn, Some("k"), PARKED);
        let last = insert(&conn, Some("k"), PARKED);
        let got = claim(&conn, &req("r", 0, 10)).unwrap();
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![head]);
        write_back(&conn, head, "r", 1, &WriteBack::Delivered).unwrap();
        unpark_next(&conn, "k", "default", 1).unwrap();
        let got = claim(&conn, &req("r", 2, 10)).unwrap();
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![next]);
        let available: i64 = conn
            .query_row(
                "SELECT available_at FROM outbox_events WHERE id = ?1",
                [last],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(available, PARKED, "only one event per key is unparked");
    }

    #[test]
    fn release_keeps_attempts() {
        let (_d, conn) = db();
        let id = insert(&conn, None, 0);
        claim(&conn, &req("r", 0, 10)).unwrap();
        let release = WriteBack::Release {
            error: Some("connection refused".into()),
        };
        assert!(write_back(&conn, id, "r", 1, &release).unwrap());
        let got = claim(&conn, &req("r2", 2, 10)).unwrap();
        assert_eq!(got[0].attempts, 0);
    }

    /// The claim must not scan the table or sort all pending rows: its cost would then grow
    /// with history.
    #[test]
    fn claim_plan_uses_partial_indexes_without_table_scan() {
        let (_d, conn) = db();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {CLAIM_SQL}"))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map(params!["o", 0, 0, "default", 10, "/s"], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(text.contains("outbox_events_pending"), "{text}");
        assert!(text.contains("outbox_events_pending_by_key"), "{text}");
        assert!(
            !plan
                .iter()
                .any(|l| l.starts_with("SCAN e") || l.starts_with("SCAN h")),
            "{text}"
        );
        assert!(!text.contains("TEMP B-TREE"), "{text}");
    }
}
