//! The oldest pending event of each destination, found with a few index seeks instead of a
//! pass over the pending rows, so `stats` and `health` beside a week's backlog do not read
//! the backlog to learn its age.
//!
//! Why seeks suffice (schema version 10): a row is enqueued due at its commit time
//! (`available_at = created_at`) or parked behind an older event of its key, and a parked row
//! is never the oldest. Only a later write moves a row's due time off its commit time (a
//! retry's backoff, an unparking, an operator's retry, a re-anchoring), and such a row is in
//! the `outbox_events_moved` index, ordered by commit time. So a destination's oldest
//! pending row is the first row of that index, or a row still due at its commit time; among
//! those, due time is commit time, so each priority level's range of the pending index
//! (ordered by due time) gives its oldest with its first such row. The moved index's first
//! row bounds that walk: a moved row is due after its own commit (clocks permitting), so no
//! moved row comes before the bound, and the walk stops at the first row it reads.

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::Result;
use crate::store::queue::{parked, pending};

/// The commit time of `?1`'s oldest pending row whose due time was moved.
const OLDEST_MOVED_SQL: &str = concat!(
    "SELECT created_at FROM outbox_events INDEXED BY outbox_events_moved
      WHERE destination = ?1 AND ",
    pending!(""),
    " AND available_at <> created_at AND available_at < ",
    parked!(),
    " ORDER BY created_at LIMIT 1"
);

/// The commit time of `?1`'s oldest pending row still due at its commit time and committed
/// before `?2`: one seek per priority level of the pending index.
const OLDEST_AT_COMMIT_TIME_SQL: &str = concat!(
    "SELECT MIN((SELECT e.available_at FROM outbox_events AS e INDEXED BY outbox_events_pending
                  WHERE ",
    pending!("e."),
    " AND e.destination = ?1 AND e.priority = level.column1
                    AND e.available_at < ?2 AND e.available_at = e.created_at
                  ORDER BY e.available_at, e.id LIMIT 1))
       FROM (VALUES (9), (8), (7), (6), (5), (4), (3), (2), (1), (0)) AS level"
);

/// The first destination, by name, that has a pending row.
const FIRST_DESTINATION_SQL: &str = concat!(
    "SELECT destination FROM outbox_events INDEXED BY outbox_events_pending
      WHERE ",
    pending!(""),
    " ORDER BY destination LIMIT 1"
);

/// The destination after `?1`, by name, that has a pending row.
const NEXT_DESTINATION_SQL: &str = concat!(
    "SELECT destination FROM outbox_events INDEXED BY outbox_events_pending
      WHERE ",
    pending!(""),
    " AND destination > ?1 ORDER BY destination LIMIT 1"
);

/// The commit time (unix ms) of `destination`'s oldest pending row, if it has one.
pub(crate) fn oldest_pending(conn: &Connection, destination: &str) -> Result<Option<i64>> {
    let moved: Option<i64> = conn
        .prepare_cached(OLDEST_MOVED_SQL)?
        .query_row([destination], |r| r.get(0))
        .optional()?;
    let bound = moved.unwrap_or(i64::MAX);
    let at_commit_time: Option<i64> = conn
        .prepare_cached(OLDEST_AT_COMMIT_TIME_SQL)?
        .query_row(params![destination, bound], |r| r.get(0))?;
    Ok([moved, at_commit_time].into_iter().flatten().min())
}

/// The commit time (unix ms) of the oldest pending row of any destination.
pub(crate) fn oldest_pending_anywhere(conn: &Connection) -> Result<Option<i64>> {
    let mut oldest: Option<i64> = None;
    for destination in destinations_with_pending(conn)? {
        if let Some(t) = oldest_pending(conn, &destination)? {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
    }
    Ok(oldest)
}

/// The destinations that have pending rows, by name: one seek each.
pub(crate) fn destinations_with_pending(conn: &Connection) -> Result<Vec<String>> {
    let first: Option<String> = conn
        .prepare_cached(FIRST_DESTINATION_SQL)?
        .query_row([], |r| r.get(0))
        .optional()?;
    let mut names: Vec<String> = first.into_iter().collect();
    let mut next = conn.prepare_cached(NEXT_DESTINATION_SQL)?;
    while let Some(name) = names
        .last()
        .map(|last| next.query_row([last], |r| r.get::<_, String>(0)).optional())
        .transpose()?
        .flatten()
    {
        names.push(name);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queue::PARKED;

    fn file() -> (tempfile::TempDir, crate::Outbox) {
        let dir = tempfile::tempdir().unwrap();
        let outbox = crate::Outbox::open(dir.path().join("o.db")).unwrap();
        (dir, outbox)
    }

    /// A pending row of `destination` committed at `created_at`, due at `available_at`.
    fn row(conn: &Connection, destination: &str, priority: i64, created_at: i64, due: i64) {
        conn.execute(
            "INSERT INTO outbox_events (event_id, destination, event_type, payload, created_at,
                                        available_at, priority)
             VALUES (lower(hex(randomblob(8))), ?1, 't', 'null', ?2, ?3, ?4)",
            params![destination, created_at, due, priority],
        )
        .unwrap();
    }

    /// The oldest by a pass over every pending row: what the seeks must agree with.
    fn oldest_by_pass(conn: &Connection, destination: &str) -> Option<i64> {
        conn.query_row(
            concat!(
                "SELECT MIN(created_at) FROM outbox_events WHERE destination = ?1 AND ",
                pending!("")
            ),
            [destination],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn finds_the_oldest_whichever_way_its_due_time_moved() {
        let (_dir, outbox) = file();
        let conn = outbox.connection().unwrap();
        assert_eq!(oldest_pending(&conn, "a").unwrap(), None);
        // Due at commit time, at two priorities: the older one is at the lower priority.
        row(&conn, "a", 5, 2_000, 2_000);
        row(&conn, "a", 2, 1_500, 1_500);
        assert_eq!(oldest_pending(&conn, "a").unwrap(), Some(1_500));
        // A retry moved an older row's due time later: it is still the oldest.
        row(&conn, "a", 5, 1_000, 9_000);
        assert_eq!(oldest_pending(&conn, "a").unwrap(), Some(1_000));
        // A row due earlier than its commit (a clock that went back) is found too.
        row(&conn, "a", 7, 800, 100);
        assert_eq!(oldest_pending(&conn, "a").unwrap(), Some(800));
        // Delivered, dead and parked rows do not count; other destinations do not either.
        row(&conn, "a", 5, 10, 10);
        conn.execute(
            "UPDATE outbox_events SET delivered_at = 1 WHERE created_at = 10",
            [],
        )
        .unwrap();
        row(&conn, "a", 5, 20, 9_000);
        conn.execute(
            "UPDATE outbox_events SET dead_at = 1 WHERE created_at = 20",
            [],
        )
        .unwrap();
        row(&conn, "a", 5, 30, PARKED);
        row(&conn, "b", 5, 40, 40);
        assert_eq!(oldest_pending(&conn, "a").unwrap(), Some(800));
        assert_eq!(oldest_pending(&conn, "b").unwrap(), Some(40));
        for destination in ["a", "b", "c"] {
            let seeks = oldest_pending(&conn, destination).unwrap();
            let pass = oldest_by_pass(&conn, destination);
            // The parked row (30) is older than everything but is not counted: a real parked
            // row always has an older pending event of its key.
            let pass = pass.filter(|_| destination != "a").or(seeks);
            assert_eq!(seeks, pass, "{destination}");
        }
    }

    #[test]
    fn agrees_with_a_pass_over_random_rows() {
        let (_dir, outbox) = file();
        let conn = outbox.connection().unwrap();
        let mut rng = fastrand::Rng::with_seed(16);
        for _ in 0..2_000 {
            let created = rng.i64(0..100_000);
            let due = match rng.u8(0..4) {
                0 => created + rng.i64(1..50_000),
                1 => created - rng.i64(1..1_000),
                _ => created,
            };
            let destination = ["a", "b", "c"][rng.usize(0..3)];
            row(&conn, destination, rng.i64(0..10), created, due);
        }
        conn.execute(
            "UPDATE outbox_events SET delivered_at = 1 WHERE id % 3 = 0",
            [],
        )
        .unwrap();
        conn.execute("UPDATE outbox_events SET dead_at = 1 WHERE id % 7 = 0", [])
            .unwrap();
        for destination in ["a", "b", "c"] {
            assert_eq!(
                oldest_pending(&conn, destination).unwrap(),
                oldest_by_pass(&conn, destination),
                "{destination}"
            );
        }
        assert_eq!(destinations_with_pending(&conn).unwrap(), ["a", "b", "c"]);
    }

    #[test]
    fn seeks_without_a_pass() {
        let (_dir, outbox) = file();
        let conn = outbox.connection().unwrap();
        for sql in [
            OLDEST_MOVED_SQL,
            OLDEST_AT_COMMIT_TIME_SQL,
            FIRST_DESTINATION_SQL,
            NEXT_DESTINATION_SQL,
        ] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            for at in 1..=stmt.parameter_count() {
                stmt.raw_bind_parameter(at, "a").unwrap();
            }
            let mut rows = stmt.raw_query();
            let mut plan = Vec::new();
            while let Some(r) = rows.next().unwrap() {
                plan.push(r.get::<_, String>(3).unwrap());
            }
            let text = plan.join("\n");
            // Every read of the table is a seek into an index, never a sort: the first
            // destination is the pending index's first entry (a scan in its order that
            // stops at the first row).
            assert!(!text.contains("TEMP B-TREE"), "{sql}\n{text}");
            for line in plan
                .iter()
                .filter(|l| l.contains("outbox_events") || l.contains(" e "))
            {
                let first_entry = sql == FIRST_DESTINATION_SQL && line.contains("USING INDEX");
                assert!(line.starts_with("SEARCH") || first_entry, "{sql}\n{text}");
            }
        }
    }
}
