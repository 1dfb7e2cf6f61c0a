//! The row lifecycle: every statement that moves an outbox row from one state to another.
//!
//! One row of `outbox_events` (its columns and indexes are in `schema.sql`) is one delivery of
//! one event to one destination. This module is the only place that changes a row's state,
//! and the only place that spells out what "pending", "parked" and "due" mean:
//!
//! ```text
//!                          insert
//!                            │
//!            ┌───────────────┴──────────────┐
//!            │ an earlier event of its      │ otherwise
//!            │ key is still pending         │
//!            ▼                              ▼
//!         parked ──── unpark ─────────▶    due  ◀──── release (no attempt spent)
//!      (available_at   (the key's head      │   ◀──── retry (attempt spent, backoff)
//!       = PARKED)       left pending)       │ claim                 ▲
//!                                           ▼                       │
//!                                        leased ────────────────────┘
//!                                         │    │
//!                                    ack  │    │ dead-letter
//!                                         ▼    ▼
//!                                  delivered   dead ── admin retry ──▶ due or parked
//!                                      │         │
//!                               prune ─┘         └─ purge
//! ```
//!
//! - **pending**: neither delivered nor dead. Parked, due, leased and backing-off rows are all
//!   pending. Two more ways out of pending delete the row: a newer event with the same
//!   coalescing key replaces it, or a storage limit drops it (lossy types only); neither
//!   touches a leased row.
//! - **parked**: pending behind an earlier pending event of the same partition key and
//!   destination. Only a key's oldest pending event (its head) is ever due, so a claim never
//!   steps over a keyed backlog; the next event is unparked when the head leaves pending.
//! - **due**: pending, its `available_at` has come, and its lease is free or expired.
//!
//! Every write-back after a claim is fenced by the claim's lease owner, so a relay whose
//! lease expired (it was paused, or slow) cannot overwrite the outcome of the relay that
//! claimed the row after it.
//!
//! The transitions, by group: `insert.rs` (insert, coalesce, drop oldest for room),
//! `claim.rs` (due → leased, and the reanchor of future rows), `ack.rs` (leased → delivered,
//! due again or dead: the write-back), `retention.rs` (expiry, export, admin retry, and the
//! pages prune and purge delete), `tally.rs` (the pending totals every transition keeps).
//! This file holds what they share: the SQL that defines each state, and unpark.

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::error::Result;
use crate::outbound::OutboundEvent;

/// A row neither delivered nor dead; `$t` is the table alias with its dot, or `""`.
macro_rules! pending {
    ($t:literal) => {
        concat!($t, "delivered_at IS NULL AND ", $t, "dead_at IS NULL")
    };
}
pub(crate) use pending;

/// `PARKED` as SQL text, for statements that compare to it or set it.
macro_rules! parked {
    () => {
        "9223372036854775807"
    };
}
pub(crate) use parked;

/// A lease that is free at time `$now` (never taken, or expired).
macro_rules! lease_free {
    ($t:literal, $now:literal) => {
        concat!(
            "(",
            $t,
            "lease_expires_at IS NULL OR ",
            $t,
            "lease_expires_at <= ",
            $now,
            ")"
        )
    };
}

/// `available_at` for a row that becomes pending at `$now`: parked if an earlier event of its
/// partition key `$key` and destination `$dest` is pending (`$earlier` narrows "earlier" to
/// lower ids for a row that already has one), due at once otherwise.
macro_rules! due_or_parked {
    ($key:literal, $dest:literal, $earlier:literal, $now:literal) => {
        concat!(
            "CASE WHEN ",
            $key,
            " IS NOT NULL AND ",
            key_pending!($key, $dest, $earlier),
            " THEN ",
            parked!(),
            " ELSE ",
            $now,
            " END"
        )
    };
}

/// Whether an event of partition key `$key` for destination `$dest` is pending (`$earlier`
/// narrows it as in [`due_or_parked`]): a new event of the key parks behind it. One seek
/// in the pending-by-key index.
macro_rules! key_pending {
    ($key:literal, $dest:literal, $earlier:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM outbox_events AS k
                      WHERE k.partition_key = ",
            $key,
            " AND k.destination = ",
            $dest,
            $earlier,
            " AND ",
            pending!("k."),
            ")"
        )
    };
}

/// The id a new row takes when rows at the top were deleted (just above the highest id ever
/// given, see `keep_ids_rising`); no row (NULL as a value) otherwise, when SQLite's own
/// choice, the highest id plus one, is right. `high_water > 0` comes first so that, as long
/// as no delete took the top rows (the high water is 0), the table's last id is not looked
/// up.
macro_rules! id_after_deletes {
    () => {
        "SELECT high_water + 1 FROM outbox_stats
          WHERE id = 1 AND high_water > 0
            AND high_water >= (SELECT COALESCE(MAX(id), 0) FROM outbox_events)"
    };
}

/// A dead letter: given up on, and not delivered after all.
macro_rules! dead {
    () => {
        "dead_at IS NOT NULL AND delivered_at IS NULL AND expired_at IS NULL AND exported_at IS NULL"
    };
}
pub(crate) use dead;

/// Expired: not delivered by its deadline (stored with `dead_at` set too, so that it left
/// the pending indexes; see schema version 7).
macro_rules! expired {
    () => {
        "dead_at IS NOT NULL AND expired_at IS NOT NULL AND delivered_at IS NULL"
    };
}

/// The condition "pending", for queries that read (stats, gauges, listings).
pub(crate) const PENDING: &str = pending!("");

/// The last error recorded on a pending event: the one tried most recently (its next try
/// is the latest), for saying why events are left.
pub(crate) fn last_pending_error(conn: &Connection) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        &format!(
            "SELECT last_error FROM outbox_events WHERE {PENDING} AND last_error IS NOT NULL
              ORDER BY available_at DESC LIMIT 1"
        ),
        [],
        |r| r.get(0),
    )
    .optional()
}

/// The condition "dead", for queries that read.
pub(crate) const DEAD: &str = dead!();

/// The condition "expired", for queries that read.
pub(crate) const EXPIRED: &str = expired!();

/// The condition "exported" (into an offline bundle), for queries that read; like expired
/// rows, exported ones carry `dead_at` and so sit in the dead index.
pub(crate) const EXPORTED: &str =
    "dead_at IS NOT NULL AND exported_at IS NOT NULL AND delivered_at IS NULL";

/// `available_at` of a parked row: later than any real time, so it is never due.
///
/// Without parking, a claim would have to step over every queued event of every busy key,
/// and its cost would grow with the backlog.
pub(crate) const PARKED: i64 = i64::MAX;

/// Rows deleted per transaction by pruning and purging, so the app's own writes never wait
/// long for the lock.
pub(crate) const DELETE_PAGE_ROWS: usize = 500;

/// A lease that is free at `$now`, or that was taken after `$latest` (now plus a few
/// seconds of skew): taken while the clock was ahead.
macro_rules! lease_claimable {
    ($t:literal, $now:literal, $latest:literal) => {
        concat!(
            "(",
            lease_free!($t, $now),
            " OR ",
            $t,
            "leased_at > ",
            $latest,
            ")"
        )
    };
}

/// A row not leased by an owner whose name starts with `$prefix` (a relay's own leases:
/// `''` spares none). A relay answers for its own leases by its monotonic clock, so a step
/// of the wall clock, which makes them look expired or taken in the future, never lets
/// it claim or expire one of its own events in flight.
macro_rules! not_spared {
    ($t:literal, $prefix:literal) => {
        concat!(
            "(",
            $prefix,
            " = '' OR ",
            $t,
            "lease_owner IS NULL OR substr(",
            $t,
            "lease_owner, 1, length(",
            $prefix,
            ")) <> ",
            $prefix,
            ")"
        )
    };
}

/// How much later than now a lease may have been taken before it counts as taken under a
/// clock that was ahead: relays that read the clock a moment before another took the
/// write lock, or processes whose clocks differ by a little, must not steal each other's
/// fresh leases (whatever lease length each uses).
pub(crate) const LEASE_CLOCK_SKEW_MS: i64 = 5_000;

mod ack;
mod claim;
mod clock_step;
mod insert;
pub(crate) mod numbering;
mod retention;
pub(crate) mod tally;

pub(crate) use ack::*;
pub(crate) use claim::*;
pub(crate) use clock_step::*;
pub(crate) use insert::*;
pub(crate) use retention::*;

/// Whether any event is pending, for any destination: one step into the pending index.
pub(crate) fn any_pending(conn: &Connection) -> Result<bool> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT EXISTS (SELECT 1 FROM outbox_events INDEXED BY outbox_events_pending WHERE ",
            pending!(""),
            ")"
        ))?
        .query_row([], |r| r.get(0))?)
}

// The transitions every group of them shares.

/// Keeps ids (the `sequence` receivers order by) from going back after a delete whose
/// highest deleted id was `highest_deleted`: called by every function here that deletes,
/// after it deleted, in its transaction.
///
/// Every id given so far is at most the larger of the high water and the table's highest
/// id (the insert keeps that true). If the delete took the top rows, the high water becomes
/// the highest id they had, and the next insert continues above it. If the table still
/// holds a row at or above the high water, the high water says nothing the table does not,
/// so it goes back to 0, where the insert need not look up the table's last id at all.
/// The row is written only when the high water changes.
pub(crate) fn keep_ids_rising(conn: &Connection, highest_deleted: Option<i64>) -> Result<()> {
    let Some(highest_deleted) = highest_deleted else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE outbox_stats SET high_water = kept.high_water
           FROM (SELECT CASE WHEN max(s.high_water, ?1)
                                  > (SELECT COALESCE(MAX(id), 0) FROM outbox_events)
                             THEN max(s.high_water, ?1) ELSE 0 END AS high_water
                   FROM outbox_stats AS s WHERE s.id = 1) AS kept
          WHERE outbox_stats.id = 1 AND outbox_stats.high_water <> kept.high_water",
    )?
    .execute([highest_deleted])?;
    Ok(())
}

/// Row ids as a JSON array, for `id IN (SELECT value FROM json_each(?))`: one statement for
/// a whole batch, whatever its size.
pub(crate) fn json_ids(ids: impl Iterator<Item = i64>) -> String {
    use std::fmt::Write;
    let mut list = String::from("[");
    for (i, id) in ids.enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{id}");
    }
    list.push(']');
    list
}

/// Keeps `outbox_delivered_totals`, so stats never count delivered history. (Rows marked
/// delivered by hand are not counted; their pruning cannot take a total below zero.)
pub(crate) fn add_delivered(conn: &Connection, destination: &str, n: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO outbox_delivered_totals (destination, delivered) VALUES (?1, MAX(0, ?2))
         ON CONFLICT (destination) DO UPDATE SET delivered = MAX(0, delivered + ?2)",
    )?
    .execute(params![destination, n])?;
    Ok(())
}

/// Makes the oldest pending event of `key` due if it is parked: called whenever a key's head
/// leaves pending (delivered, dead-lettered, dropped, replaced).
pub(crate) fn unpark_next(conn: &Connection, key: &str, destination: &str, now: i64) -> Result<()> {
    conn.prepare_cached(concat!(
        "UPDATE outbox_events SET available_at = ?3
          WHERE available_at = ",
        parked!(),
        " AND id = (
                SELECT MIN(id) FROM outbox_events
                 WHERE partition_key = ?1 AND destination = ?2 AND ",
        pending!(""),
        ")"
    ))?
    .execute(params![key, destination, now])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database;

    fn db() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.db");
        let mut conn = Connection::open(&path).unwrap();
        database::migrate(&mut conn, &path).unwrap();
        (dir, conn)
    }

    fn insert_raw(conn: &Connection, key: Option<&str>, available_at: i64) -> i64 {
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
            spare_leases: "",
            now,
            clock_step_ms: 0,
            lease_ms: 1_000,
            max_bytes: i64::MAX,
            numbering_bound: None,
            min_priority: 0,
            limit,
        }
    }

    fn ids(events: &[OutboundEvent]) -> Vec<i64> {
        events.iter().map(|e| e.id).collect()
    }

    /// Claims and returns the events (these tests write only readable rows).
    fn claim_events(conn: &Connection, req: &ClaimRequest<'_>) -> Vec<OutboundEvent> {
        let claimed = claim(conn, req).unwrap();
        assert!(claimed.unreadable.is_empty(), "{:?}", claimed.unreadable);
        claimed.events
    }

    fn claimed(conn: &Connection, id: i64, owner: &str) -> OutboundEvent {
        let mut all = claim_events(conn, &req(owner, 0, 100));
        all.retain(|e| e.id == id);
        all.pop().expect("claimable")
    }

    #[test]
    fn ids_never_go_back_whatever_is_deleted() {
        let (_d, mut conn) = db();
        let insert = |conn: &mut Connection, key: &str| -> i64 {
            let tx = conn.transaction().unwrap();
            let row = NewRow {
                event_id: key,
                idempotency_key: None,
                event_type: "t",
                source: None,
                subject: None,
                partition_key: None,
                payload: "{}",
                coalesce_key: Some(key),
                priority: 5,
                created_at: 0,
                expires_at: None,
                traceparent: None,
                tracestate: None,
                dataschema: None,
                droppable: false,
                now: 0,
            };
            assert!(insert(&tx, &row, &["default"], |_| {}).unwrap());
            let id = tx.last_insert_rowid();
            tx.commit().unwrap();
            id
        };
        let first = insert(&mut conn, "a");
        let second = insert(&mut conn, "b");
        assert_eq!(high_water(&conn), 0, "nothing deleted yet");
        // The newest row is replaced by coalescing: its id is not given out again.
        let tx = conn.transaction().unwrap();
        assert_eq!(coalesce(&tx, "t", "b", &["default"], 0).unwrap(), 1);
        tx.commit().unwrap();
        assert_eq!(high_water(&conn), second);
        let third = insert(&mut conn, "c");
        assert!(third > second, "{third} after {second}");
        // Every row delivered and pruned: the table is empty, the ids go on.
        conn.execute("UPDATE outbox_events SET delivered_at = 0", [])
            .unwrap();
        assert_eq!(
            delete_page(&mut conn, Finished::DeliveredBefore(1)).unwrap(),
            2
        );
        assert_eq!(high_water(&conn), third);
        let fourth = insert(&mut conn, "d");
        assert!(fourth > third && third > first, "{fourth} after {third}");
        // A delete that leaves the top row in place sets the high water back to 0: the
        // table's own highest id says as much, and the insert then skips the lookup.
        let fifth = insert(&mut conn, "e");
        conn.execute(
            "UPDATE outbox_events SET delivered_at = 0 WHERE id = ?1",
            [fourth],
        )
        .unwrap();
        assert_eq!(
            delete_page(&mut conn, Finished::DeliveredBefore(1)).unwrap(),
            1
        );
        assert_eq!(high_water(&conn), 0);
        let sixth = insert(&mut conn, "f");
        assert_eq!(sixth, fifth + 1);
        // A storage limit drops the newest rows: the ids still go on above them.
        conn.execute("UPDATE outbox_events SET droppable = 1", [])
            .unwrap();
        let tx = conn.transaction().unwrap();
        let need = RoomNeeded {
            rows: 2,
            bytes: 0,
            now: 0,
        };
        assert_eq!(drop_oldest(&tx, &need).unwrap(), Some(2));
        tx.commit().unwrap();
        assert_eq!(high_water(&conn), sixth);
        let seventh = insert(&mut conn, "g");
        assert_eq!(seventh, sixth + 1);
    }

    fn high_water(conn: &Connection) -> i64 {
        conn.query_row("SELECT high_water FROM outbox_stats", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn parked_sql_text_is_the_parked_value() {
        assert_eq!(parked!(), PARKED.to_string());
    }

    #[test]
    fn claim_takes_due_rows_in_order_and_leases_them() {
        let (_d, conn) = db();
        let a = insert_raw(&conn, None, 0);
        let b = insert_raw(&conn, None, 0);
        insert_raw(&conn, None, 10_000); // not yet due
        let got = claim_events(&conn, &req("r1", 100, 10));
        assert_eq!(ids(&got), vec![a, b]);
        assert!(got
            .iter()
            .all(|e| e.lease_owner == "r1" && e.lease_expires_at == 1_100));
        // A row written by hand without a source takes the claim's default, and no number
        // (only this crate's writers and the SQL contract number rows).
        assert_eq!(got[0].source, "/test");
        assert!(got.iter().all(|e| e.stream_seq.is_none()));
        // Leased rows are not claimable by anyone else while the lease holds.
        assert!(claim_events(&conn, &req("r2", 500, 10)).is_empty());
    }

    #[test]
    fn a_claim_takes_rows_in_order_while_their_data_fits_its_bytes_and_always_one() {
        let (_d, conn) = db();
        let ids: Vec<i64> = (0..5).map(|_| insert_raw(&conn, None, 0)).collect();
        // Data of 100 bytes each (`"…"`), one level urgent.
        conn.execute(
            "UPDATE outbox_events SET payload = json_quote(printf('%.98c', 'x'))",
            [],
        )
        .unwrap();
        conn.execute(
            "UPDATE outbox_events SET priority = 9 WHERE id = ?1",
            [ids[4]],
        )
        .unwrap();
        let mut bounded = req("r1", 100, 10);
        bounded.max_bytes = 250;
        // The urgent row first, then two more: 300 bytes, the last started below 250.
        assert_eq!(ids_of(&conn, &bounded), vec![ids[4], ids[0], ids[1]]);
        // One row however small the bound.
        let mut tiny = req("r2", 100, 10);
        tiny.max_bytes = 1;
        assert_eq!(ids_of(&conn, &tiny), vec![ids[2]]);
    }

    fn ids_of(conn: &Connection, req: &ClaimRequest<'_>) -> Vec<i64> {
        ids(&claim_events(conn, req))
    }

    #[test]
    fn an_export_page_never_takes_a_key_s_event_whose_elder_an_earlier_page_passed_over() {
        let (_d, conn) = db();
        let head = insert_raw(&conn, Some("k"), 0);
        let second = insert_raw(&conn, Some("k"), PARKED);
        let loose = insert_raw(&conn, None, 0);
        let third = insert_raw(&conn, Some("k"), PARKED);
        // A relay holds the key's head while the first page is read.
        let _ = claim_events(&conn, &req("relay", 100, 1));
        let page = |after: i64| ExportPage {
            destination: "default",
            owner: "export",
            now: 100,
            lease_ms: 60_000,
            limit: 2,
            max_bytes: i64::MAX,
            after,
            default_source: "/t",
        };
        let first: Vec<i64> = ids(&lease_for_export(&conn, &page(0)).unwrap());
        assert_eq!(
            first,
            vec![loose],
            "the key waits behind its head in flight"
        );
        // The relay hands the head back; the next page starts after the first.
        conn.execute(
            "UPDATE outbox_events SET lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
            [head],
        )
        .unwrap();
        let next: Vec<i64> = ids(&lease_for_export(&conn, &page(loose)).unwrap());
        assert!(
            next.is_empty(),
            "{next:?}: the key's later events would reach the receiver before {head} and {second}"
        );
        let _ = third;
    }

    #[test]
    fn a_relay_never_takes_over_its_own_leases_whatever_the_wall_clock_says() {
        let (_d, conn) = db();
        let mine = insert_raw(&conn, None, 0);
        let theirs = insert_raw(&conn, None, 0);
        let _ = claim_events(&conn, &req("me:1", 0, 1));
        let _ = claim_events(&conn, &req("them:1", 0, 1));
        // A day later by the wall clock both leases look expired; the relay whose prefix is
        // "me:" takes only the other relay's.
        let mut again = req("me:2", 86_400_000, 10);
        again.spare_leases = "me:";
        assert_eq!(ids(&claim_events(&conn, &again)), vec![theirs]);
        // Nor does its expiry sweep take its own lease.
        conn.execute("UPDATE outbox_events SET expires_at = 1", [])
            .unwrap();
        let expired = expire(&conn, 2 * 86_400_000, 10, "me:").unwrap();
        assert!(expired.is_empty(), "own leases spared");
        let expired = expire(&conn, 2 * 86_400_000, 10, "other:").unwrap();
        assert_eq!(
            expired.len(),
            2,
            "{mine} and {theirs} expire for anyone else"
        );
    }

    #[test]
    fn expired_lease_is_claimed_again_and_stale_owner_is_fenced_off() {
        let (_d, conn) = db();
        let id = insert_raw(&conn, None, 0);
        let old = claim_events(&conn, &req("old", 0, 10)).remove(0);
        // The old owner's lease (until 1_000) has expired: a new relay takes the row.
        let new = claim_events(&conn, &req("new", 1_000, 10)).remove(0);
        assert_eq!(new.lease_owner, "new");
        // The old owner's late outcome is rejected; the new owner's is recorded.
        let stale = WriteBack::Dead {
            error: "late".into(),
        };
        assert!(!write_back(&conn, &old, 1_100, &stale).unwrap());
        assert!(write_back(&conn, &new, 1_100, &WriteBack::Delivered).unwrap());
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
        let k1 = insert_raw(&conn, Some("k"), 0);
        let k2 = insert_raw(&conn, Some("k"), 0);
        let other = insert_raw(&conn, Some("j"), 0);
        let got = claim_events(&conn, &req("r", 0, 10));
        assert_eq!(ids(&got), vec![k1, other]);
        write_back(&conn, &got[0], 1, &WriteBack::Delivered).unwrap();
        assert_eq!(ids(&claim_events(&conn, &req("r", 1, 10))), vec![k2]);
    }

    #[test]
    fn a_head_waiting_for_retry_holds_back_its_key() {
        let (_d, conn) = db();
        let k1 = insert_raw(&conn, Some("k"), 0);
        insert_raw(&conn, Some("k"), 0);
        let head = claimed(&conn, k1, "r");
        let retry = WriteBack::Retry {
            available_at: 5_000,
            error: "HTTP 500".into(),
        };
        assert!(write_back(&conn, &head, 10, &retry).unwrap());
        assert!(claim_events(&conn, &req("r", 20, 10)).is_empty());
        let got = claim_events(&conn, &req("r", 5_000, 10));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id, got[0].attempts), (k1, 1));
    }

    #[test]
    fn a_dead_head_does_not_block_its_key() {
        let (_d, conn) = db();
        let k1 = insert_raw(&conn, Some("k"), 0);
        let k2 = insert_raw(&conn, Some("k"), 0);
        let head = claimed(&conn, k1, "r");
        let dead = WriteBack::Dead {
            error: "HTTP 400".into(),
        };
        write_back(&conn, &head, 1, &dead).unwrap();
        assert_eq!(ids(&claim_events(&conn, &req("r", 2, 10))), vec![k2]);
    }

    #[test]
    fn an_unreadable_row_is_dead_lettered_and_the_rest_of_its_batch_claimed() {
        let (_d, conn) = db();
        let good = insert_raw(&conn, None, 0);
        let blob = insert_raw(&conn, Some("k"), 0);
        conn.execute(
            "UPDATE outbox_events SET payload = x'00ff' WHERE id = ?1",
            [blob],
        )
        .unwrap();
        let behind_blob = insert_raw(&conn, Some("k"), PARKED);
        let real = insert_raw(&conn, None, 0);
        conn.execute(
            "UPDATE outbox_events SET created_at = 1.5 WHERE id = ?1",
            [real],
        )
        .unwrap();
        let not_utf8 = insert_raw(&conn, None, 0);
        conn.execute(
            "UPDATE outbox_events SET event_type = CAST(x'c328' AS TEXT) WHERE id = ?1",
            [not_utf8],
        )
        .unwrap();
        let last = insert_raw(&conn, None, 0);
        let claimed = claim(&conn, &req("r", 0, 10)).unwrap();
        assert_eq!(ids(&claimed.events), vec![good, last]);
        let bad: Vec<i64> = claimed.unreadable.iter().map(|u| u.id).collect();
        assert_eq!(bad.len(), 3);
        for id in [blob, real, not_utf8] {
            assert!(bad.contains(&id));
            let (dead, error): (Option<i64>, String) = conn
                .query_row(
                    "SELECT dead_at, last_error FROM outbox_events WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            assert_eq!(dead, Some(0));
            assert!(error.starts_with("unreadable row: "), "{error:#}");
        }
        // The dead row was its key's head: the next event of the key is due now.
        assert_eq!(
            ids(&claim_events(&conn, &req("r", 1, 10))),
            vec![behind_blob]
        );
    }

    #[test]
    fn a_lease_taken_while_the_clock_was_a_day_ahead_counts_as_expired() {
        let (_d, conn) = db();
        let id = insert_raw(&conn, None, 0);
        let day = 86_400_000;
        assert_eq!(claim_events(&conn, &req("ahead", day, 10)).len(), 1);
        // The clock is back to the real time: a lease ending a day from now is not real.
        let again = claim_events(&conn, &req("now", 10, 10));
        assert_eq!(ids(&again), vec![id]);
        // A lease inside one lease from now still holds.
        assert!(claim_events(&conn, &req("third", 20, 10)).is_empty());
    }

    #[test]
    fn due_times_written_while_the_clock_was_ahead_are_re_anchored_on_now() {
        let (_d, conn) = db();
        let day = 86_400_000;
        // Committed "tomorrow": due then.
        conn.execute(
            "INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at)
             VALUES ('fresh', 't', '{}', ?1, ?1)",
            [day],
        )
        .unwrap();
        // Attempted "tomorrow" and told to wait 5 minutes.
        conn.execute(
            "INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at,
                                        last_attempted_at, attempts)
             VALUES ('retry', 't', '{}', 0, ?1 + 300000, ?1, 1)",
            [day],
        )
        .unwrap();
        // Waiting out a real backoff from an attempt in the past: left alone.
        conn.execute(
            "INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at,
                                        last_attempted_at, attempts)
             VALUES ('honest', 't', '{}', 0, 60000, 900, 1)",
            [],
        )
        .unwrap();
        assert_eq!(reanchor_future(&conn, "default", 1_000).unwrap(), 2);
        let due: Vec<(String, i64)> = conn
            .prepare("SELECT event_id, available_at FROM outbox_events ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            due,
            vec![
                ("fresh".into(), 1_000),
                ("retry".into(), 301_000),
                ("honest".into(), 60_000)
            ]
        );
    }

    /// How often SQLite compiled `sql` again since the connection cached it.
    fn reprepares(conn: &Connection, sql: &str) -> i32 {
        conn.prepare_cached(sql)
            .unwrap()
            .get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn the_hot_statements_are_compiled_once_whatever_they_are_given() {
        // SQLite compiles a statement again on every run when its plan looked at a bound
        // value (a `LIMIT ?`, for one): a claim then cost a full prepare each time.
        let (_d, mut conn) = db();
        for _ in 0..10 {
            insert_raw(&conn, Some("k"), 0);
        }
        for _ in 0..30 {
            insert_raw(&conn, None, 0);
        }
        // Acks of 3, 12, 2 and 1 rows: the short and the long listed ack, and one row alone.
        for (round, limit) in [(0, 3), (1, 12), (2, 2), (3, 1)] {
            let owner = format!("relay-{round}");
            let got = claim_events(&conn, &req(&owner, round, limit));
            assert!(!got.is_empty());
            let refs: Vec<&OutboundEvent> = got.iter().collect();
            assert_eq!(
                ack(&conn, &owner, &refs, round).unwrap(),
                vec![true; got.len()]
            );
            assert_eq!(expire(&conn, round, limit, "").unwrap().len(), 0);
            delete_page(&mut conn, Finished::DeliveredBefore(round)).unwrap();
        }
        let (short, long) = (listed_ack(2), listed_ack(ACK_LIST_LONG));
        for sql in [
            CLAIM_CANDIDATES_SQL,
            CLAIM_CANDIDATES_AFTER_STEP_SQL,
            LEASE_LIST_SQL,
            LEASE_RANGE_SQL,
            DUE_LEVELS_SQL,
            ACK_SQL,
            EXPIRE_SQL,
        ]
        .into_iter()
        .chain([&short.held, &short.mark, &long.held, &long.mark].map(String::as_str))
        {
            assert_eq!(reprepares(&conn, sql), 0, "{sql}");
        }
    }

    /// `(attempts, last_attempted_at, delivered_at, lease_owner)` of row `id`.
    fn ack_columns(conn: &Connection, id: i64) -> (i64, Option<i64>, Option<i64>, Option<String>) {
        conn.query_row(
            "SELECT attempts, last_attempted_at, delivered_at, lease_owner FROM outbox_events
              WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    }

    fn delivered_total(conn: &Connection) -> i64 {
        conn.query_row(
            "SELECT COALESCE(SUM(delivered), 0) FROM outbox_delivered_totals",
            [],
            |r| r.get(0),
        )
        .unwrap()
    }

    /// `n` unkeyed rows, written and then claimed by `owner`.
    fn claim_new_rows(conn: &Connection, n: usize, owner: &str) -> Vec<OutboundEvent> {
        for _ in 0..n {
            insert_raw(conn, None, 0);
        }
        let got = claim_events(conn, &req(owner, 0, n as i64 + 50));
        assert_eq!(got.len(), n);
        got
    }

    #[test]
    fn a_long_ack_marks_every_row_in_statements_of_a_hundred() {
        let (_d, conn) = db();
        let got = claim_new_rows(&conn, 253, "mine");
        let refs: Vec<&OutboundEvent> = got.iter().collect();
        // Chunks of 100, 100 and 53 rows.
        assert_eq!(ack(&conn, "mine", &refs, 7).unwrap(), vec![true; 253]);
        for event in &got {
            assert_eq!(ack_columns(&conn, event.id), (1, Some(7), Some(7), None));
        }
        assert_eq!(delivered_total(&conn), 253);
        // Acked again (a lost answer, say), no row is ours any more: nothing changes.
        assert_eq!(ack(&conn, "mine", &refs, 9).unwrap(), vec![false; 253]);
        assert_eq!(ack_columns(&conn, got[0].id), (1, Some(7), Some(7), None));
        assert_eq!(delivered_total(&conn), 253);
    }

    #[test]
    fn a_lease_taken_over_inside_a_long_ack_is_left_to_its_new_owner() {
        let (_d, conn) = db();
        let got = claim_new_rows(&conn, 150, "mine");
        let taken = got[120].id;
        conn.execute(
            "UPDATE outbox_events SET lease_owner = 'theirs' WHERE id = ?1",
            [taken],
        )
        .unwrap();
        // The first event twice: a duplicate in the list is acked once.
        let refs: Vec<&OutboundEvent> = got.iter().chain([&got[0]]).collect();
        let acked = ack(&conn, "mine", &refs, 7).unwrap();
        let mut expected = vec![true; 151];
        expected[120] = false;
        expected[150] = false;
        assert_eq!(acked, expected);
        assert_eq!(
            ack_columns(&conn, taken),
            (0, None, None, Some("theirs".into()))
        );
        assert_eq!(ack_columns(&conn, got[0].id), (1, Some(7), Some(7), None));
        assert_eq!(delivered_total(&conn), 149);
    }

    #[test]
    fn ack_is_fenced_per_row() {
        let (_d, conn) = db();
        let a = insert_raw(&conn, None, 0);
        let b = insert_raw(&conn, None, 0);
        let got = claim_events(&conn, &req("mine", 0, 10));
        // b's lease expires and another relay takes it.
        conn.execute(
            "UPDATE outbox_events SET lease_owner = 'theirs' WHERE id = ?1",
            [b],
        )
        .unwrap();
        let refs: Vec<&OutboundEvent> = got.iter().collect();
        let acked = ack(&conn, "mine", &refs, 5).unwrap();
        let ids: Vec<i64> = refs
            .iter()
            .zip(&acked)
            .filter(|(_, acked)| **acked)
            .map(|(e, _)| e.id)
            .collect();
        assert_eq!(ids, [a]);
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
        let head = insert_raw(&conn, Some("k"), 0);
        let next = insert_raw(&conn, Some("k"), PARKED);
        let last = insert_raw(&conn, Some("k"), PARKED);
        let got = claim_events(&conn, &req("r", 0, 10));
        assert_eq!(ids(&got), vec![head]);
        let refs: Vec<&OutboundEvent> = got.iter().collect();
        ack(&conn, "r", &refs, 1).unwrap();
        assert_eq!(ids(&claim_events(&conn, &req("r", 2, 10))), vec![next]);
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
        insert_raw(&conn, None, 0);
        let got = claim_events(&conn, &req("r", 0, 10));
        let release = WriteBack::Release {
            error: Some("connection refused".into()),
            available_at: None,
        };
        assert!(write_back(&conn, &got[0], 1, &release).unwrap());
        let got = claim_events(&conn, &req("r2", 2, 10));
        assert_eq!(got[0].attempts, 0);
    }

    #[test]
    fn record_groups_deliveries_of_one_claim_and_fences_each_outcome() {
        let (_d, conn) = db();
        for _ in 0..3 {
            insert_raw(&conn, None, 0);
        }
        let got = claim_events(&conn, &req("r", 0, 10));
        conn.execute(
            "UPDATE outbox_events SET lease_owner = 'theirs' WHERE id = ?1",
            [got[1].id],
        )
        .unwrap();
        let retry = WriteBack::Retry {
            available_at: 9,
            error: "HTTP 503".into(),
        };
        let outcomes = [
            (&got[0], &WriteBack::Delivered),
            (&got[1], &WriteBack::Delivered),
            (&got[2], &retry),
        ];
        assert_eq!(
            record(&conn, &outcomes, 5).unwrap(),
            vec![true, false, true]
        );
    }

    #[test]
    fn an_operator_retry_parks_behind_an_older_pending_event_of_the_key() {
        let (_d, conn) = db();
        let head = insert_raw(&conn, Some("k"), 0);
        let second = insert_raw(&conn, Some("k"), PARKED);
        conn.execute(
            "UPDATE outbox_events SET dead_at = 1, available_at = 0 WHERE id = ?1",
            [second],
        )
        .unwrap();
        let mut conn = conn;
        let tx = conn.transaction().unwrap();
        assert_eq!(retry_row(&tx, second, 7).unwrap(), 1);
        assert_eq!(retry_row(&tx, head, 7).unwrap(), 1);
        tx.commit().unwrap();
        let available: Vec<i64> = conn
            .prepare("SELECT available_at FROM outbox_events ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(available, vec![7, PARKED]);
    }

    /// A full outbox finds its victims by walking the droppable index in id order and
    /// stopping: no scan of the backlog, no sort.
    #[test]
    fn dropping_to_make_room_walks_the_droppable_index_without_sorting() {
        let (_d, conn) = db();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {DROPPABLE_OLDEST_SQL}"))
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(text.contains("outbox_events_droppable"), "{text}");
        assert!(!text.contains("TEMP B-TREE"), "{text}");
    }

    /// The expiry sweep walks the expiring index in its own order, whether it runs inside
    /// the update or alone (to keep the pending totals): no sort, so both take the same rows.
    #[test]
    fn expiry_walks_the_expiring_index_in_order() {
        let (_d, conn) = db();
        for sql in [EXPIRE_SQL, expire_candidates!()] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(params![0, 10, 5_000, ""], |r| r.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let text = plan.join("\n");
            assert!(text.contains("outbox_events_expiring"), "{text}");
            assert!(!text.contains("TEMP B-TREE"), "{text}");
        }
    }

    /// Re-anchoring at a relay start seeks the rows due in the future; walking a backlog
    /// of millions under the write lock made the app wait at every start.
    #[test]
    fn reanchor_plan_seeks_by_due_time() {
        let (_d, conn) = db();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {REANCHOR_SQL}"))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map(params!["default", 0], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(
            text.contains("(destination=? AND priority=? AND available_at>? AND available_at<?)"),
            "{text}"
        );
    }

    /// The claim must not scan the table or sort all pending rows: its cost would then grow
    /// with history.
    #[test]
    fn claim_plan_uses_partial_indexes_without_table_scan() {
        let (_d, conn) = db();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {CLAIM_CANDIDATES_SQL}"))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map(
                params!["o", 0, 0, "default", 10, "/s", 5_000, 5, "o:"],
                |r| r.get(3),
            )
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(text.contains("outbox_events_pending"), "{text}");
        assert!(text.contains("outbox_events_pending_by_key"), "{text}");
        assert!(
            !plan
                .iter()
                .any(|l| l.starts_with("SCAN e") || l.starts_with("SCAN k")),
            "{text}"
        );
        assert!(
            text.contains("USING INDEX outbox_events_pending (destination=? AND priority=? AND available_at<?)"),
            "{text}"
        );
        assert!(!text.contains("TEMP B-TREE"), "{text}");
        // The levels' probe: one seek per level, no scan of the table.
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {DUE_LEVELS_SQL}"))
            .unwrap()
            .query_map(params!["default", 0], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(
            text.contains("USING COVERING INDEX outbox_events_pending (destination=? AND priority=? AND available_at<?)")
                || text.contains("USING INDEX outbox_events_pending (destination=? AND priority=? AND available_at<?)"),
            "{text}"
        );
        assert!(!plan.iter().any(|l| l.starts_with("SCAN e")), "{text}");
    }

    /// A run's parking check is one seek per key in the pending-by-key index, and its
    /// `INSERT`s neither read the table (which would make SQLite compute every row before
    /// writing the first) nor compile again.
    #[test]
    fn a_run_seeks_each_keys_head_and_compiles_its_inserts_once() {
        let (_d, mut conn) = db();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {KEY_PENDING_SQL}"))
            .unwrap()
            .query_map(params!["k", "default"], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let text = plan.join("\n");
        assert!(
            text.contains("SEARCH k USING INDEX outbox_events_pending_by_key (partition_key=? AND destination=?)"),
            "{text}"
        );
        for rows in [1, RUN_STATEMENT_SHORT, RUN_STATEMENT_LONG] {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {}", insert_run_sql(rows)))
                .unwrap();
            // Unbound parameters read as NULL, which a plan does not need.
            let mut explained = stmt.raw_query();
            let mut plan: Vec<String> = Vec::new();
            while let Some(row) = explained.next().unwrap() {
                plan.push(row.get(3).unwrap());
            }
            assert!(
                !plan.iter().any(|l| l.contains("outbox_events")),
                "{plan:?}"
            );
        }
        // Runs of 123 and 7 rows: every statement size, twice or more.
        let event_ids: Vec<String> = (0..130).map(|i| format!("e{i}")).collect();
        let tx = conn.transaction().unwrap();
        for (start, end) in [(0, 123), (123, 130)] {
            let rows: Vec<(&str, NewRow<'_>)> = event_ids[start..end]
                .iter()
                .map(|id| ("default", plain_row(id, Some("k"))))
                .collect();
            insert_run(&tx, &rows).unwrap();
        }
        for sql in [KEY_PENDING_SQL]
            .into_iter()
            .chain([1, RUN_STATEMENT_SHORT, RUN_STATEMENT_LONG].map(insert_run_sql))
        {
            assert_eq!(reprepares(&tx, sql), 0, "{sql}");
        }
        let (rows, parked): (i64, i64) = tx
            .query_row(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE available_at = ?1) FROM outbox_events",
                [PARKED],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (rows, parked),
            (130, 129),
            "the key's first is due, the rest parked"
        );
    }

    /// `insert` and `insert_run` bind only the optional values a row has, relying on
    /// rusqlite to clear a statement's parameters when it goes back to the cache: a row
    /// written after one with every optional column set must not take any of them.
    #[test]
    fn a_row_after_one_with_every_column_set_has_its_own_nulls() {
        let (_d, mut conn) = db();
        let full = NewRow {
            event_id: "full",
            idempotency_key: Some("i"),
            event_type: "t",
            source: Some("/s"),
            subject: Some("sub"),
            partition_key: Some("k"),
            payload: "{}",
            coalesce_key: Some("c"),
            priority: 5,
            droppable: false,
            created_at: 1,
            expires_at: Some(9),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            tracestate: Some("a=b"),
            dataschema: Some("https://example.com/s"),
            now: 1,
        };
        let bare = |event_id| NewRow {
            idempotency_key: None,
            source: None,
            subject: None,
            partition_key: None,
            coalesce_key: None,
            expires_at: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
            event_id,
            ..full
        };
        let full_run = NewRow {
            event_id: "full-run",
            idempotency_key: None,
            coalesce_key: None,
            ..full
        };
        let tx = conn.transaction().unwrap();
        assert!(insert(&tx, &full, &["default"], |_| {}).unwrap());
        assert!(
            insert(&tx, &bare("after"), &["default"], |_| {}).unwrap(),
            "written as a duplicate: it took the idempotency key of the row before it"
        );
        insert_run(&tx, &[("default", full_run)]).unwrap();
        insert_run(&tx, &[("default", bare("after-run"))]).unwrap();
        tx.commit().unwrap();
        for event_id in ["after", "after-run"] {
            let set: i64 = conn
                .query_row(
                    "SELECT (idempotency_key IS NOT NULL) + (source IS NOT NULL)
                          + (subject IS NOT NULL) + (partition_key IS NOT NULL)
                          + (coalesce_key IS NOT NULL) + (expires_at IS NOT NULL)
                          + (traceparent IS NOT NULL) + (tracestate IS NOT NULL)
                          + (dataschema IS NOT NULL)
                     FROM outbox_events WHERE event_id = ?1",
                    [event_id],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(set, 0, "{event_id} took a column of the row before it");
        }
    }

    /// A row [`insert_run`] may take: no idempotency or coalescing key.
    fn plain_row<'a>(event_id: &'a str, key: Option<&'a str>) -> NewRow<'a> {
        NewRow {
            event_id,
            idempotency_key: None,
            event_type: "t",
            source: Some("/s"),
            subject: None,
            partition_key: key,
            payload: "{}",
            coalesce_key: None,
            priority: 5,
            droppable: false,
            created_at: 1,
            expires_at: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
            now: 1,
        }
    }
}
