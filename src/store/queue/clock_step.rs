//! Moving what the wall clock wrote when it is stepped (NTP correcting a clock that was
//! wrong, a user setting it): the deadlines of the pending events committed before the
//! step, so that it neither keeps one alive longer than it was given (a step back) nor
//! expires one early (a step forward); and the relay's own leases, for the other relays
//! that judge them on the wall clock. The relay's writer notices the step (`ClockWatch`)
//! and calls these in one write transaction.

use rusqlite::{params, Connection};

use crate::error::Result;

/// The highest row id (0: none): the rows written so far, on the clock of now.
pub(crate) fn top_id(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM outbox_events")?
        .query_row([], |r| r.get(0))?)
}

/// After the wall clock stepped by `by_ms` (negative: back), now `now` on the new clock,
/// moves by as much the deadlines of the pending rows committed before the step: a step
/// back keeps none alive longer than it was given, a step forward expires none early. Due
/// times written while a clock stepped back was ahead are `reanchor_future`'s. Returns the
/// rows moved.
///
/// Which rows the old clock wrote: after a step back, those up to `top_id` (the highest
/// row id at the last look before the step), as the times of the two clocks overlap; after
/// a step forward, those committed before `now - by_ms`, which is later than any commit
/// time the old clock wrote and earlier than any the new one did.
///
/// Due times are not moved forward: a row's due time is rewritten by every attempt and
/// every hand-back, and nothing in the row tells one written on the new clock between the
/// step and the look that saw it (moved a week with the rest, such a retry was lost for a
/// week: the test of a step forward caught it) from one the old clock wrote. A retry
/// waiting when the clock steps forward so comes due early, once; its backoff goes on from
/// that attempt.
pub(crate) fn move_with_clock(
    conn: &Connection,
    by_ms: i64,
    top_id: i64,
    now: i64,
) -> Result<usize> {
    if by_ms < 0 && top_id > 0 {
        return Ok(conn
            .prepare_cached(concat!(
                "UPDATE outbox_events SET expires_at = expires_at + ?1
                  WHERE id <= ?2 AND expires_at IS NOT NULL AND ",
                pending!("")
            ))?
            .execute(params![by_ms, top_id])?);
    }
    if by_ms <= 0 {
        return Ok(0);
    }
    Ok(conn
        .prepare_cached(concat!(
            "UPDATE outbox_events SET expires_at = expires_at + ?1
              WHERE created_at < ?2 AND expires_at IS NOT NULL AND ",
            pending!("")
        ))?
        .execute(params![by_ms, now.saturating_sub(by_ms)])?)
}

/// Moves the leases of the rows leased by owners starting with `prefix` (the relay's own, in
/// flight) by `by_ms` with a step of the wall clock, so other relays, which judge them on
/// the wall clock, see them as long as they were given, neither expired by a step forward
/// nor taken in the future by a step back. Returns the rows moved.
pub(crate) fn move_own_leases(conn: &Connection, by_ms: i64, prefix: &str) -> Result<usize> {
    if by_ms == 0 || prefix.is_empty() {
        return Ok(0);
    }
    Ok(conn
        .prepare_cached(concat!(
            "UPDATE outbox_events
                SET leased_at = leased_at + ?1, lease_expires_at = lease_expires_at + ?1
              WHERE lease_expires_at IS NOT NULL
                AND substr(lease_owner, 1, length(?2)) = ?2 AND ",
            pending!("")
        ))?
        .execute(params![by_ms, prefix])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Event, Outbox};

    /// Two columns of every row, in id order.
    fn columns<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql>(
        outbox: &Outbox,
        a: &str,
        b: &str,
    ) -> Vec<(A, B)> {
        let conn = outbox.connection().unwrap();
        let mut stmt = conn
            .prepare(&format!("SELECT {a}, {b} FROM outbox_events ORDER BY id"))
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    fn times(outbox: &Outbox) -> Vec<(i64, Option<i64>)> {
        columns(outbox, "available_at", "expires_at")
    }

    /// An outbox on a manual clock reading `start_ms`, in a folder of its own.
    fn outbox_at(start_ms: i64) -> (tempfile::TempDir, ManualClock, Outbox) {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(start_ms);
        let outbox = Outbox::builder()
            .clock(clock.clone())
            .open(dir.path().join("step.db"))
            .unwrap();
        (dir, clock, outbox)
    }

    #[test]
    fn a_step_back_moves_the_deadlines_of_the_rows_before_it() {
        let day = 86_400_000;
        let (_dir, clock, outbox) = outbox_at(10 * day);
        let hour = std::time::Duration::from_secs(3600);
        let expiring = |name: &str| Event::new(name, serde_json::json!(1)).expires_in(hour);
        outbox
            .transaction(|tx| {
                let _ = outbox.enqueue(tx, expiring("a"))?;
                let _ = outbox.enqueue(tx, Event::new("b", serde_json::json!(2)))?;
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        let before = times(&outbox);
        let conn = outbox.connection().unwrap();
        let top = top_id(&conn).unwrap();
        // Set back a day; a row committed after the step, on the new clock, is not moved.
        clock.set_ms(9 * day);
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, expiring("c")))
            .unwrap();
        assert_eq!(move_with_clock(&conn, -day, top, 9 * day).unwrap(), 1);
        let after = times(&outbox);
        assert_eq!(after[0], (before[0].0, before[0].1.map(|d| d - day)));
        assert_eq!(after[1], before[1], "no deadline");
        assert_eq!(after[2].1, Some(9 * day + 3_600_000));
    }

    #[test]
    fn a_step_forward_moves_the_deadlines_of_the_rows_committed_before_it() {
        let (day, week) = (86_400_000, 7 * 86_400_000);
        let (_dir, clock, outbox) = outbox_at(10 * day);
        let hour = std::time::Duration::from_secs(3600);
        outbox
            .transaction(|tx| {
                let expiring = Event::new("due", serde_json::json!(1)).expires_in(hour);
                let _ = outbox.enqueue(tx, expiring)?;
                let _ = outbox.enqueue(tx, Event::new("retry", serde_json::json!(2)))?;
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        let conn = outbox.connection().unwrap();
        // The second is a retry due in 30 s.
        conn.execute(
            "UPDATE outbox_events SET available_at = available_at + 30000 WHERE id = 2",
            [],
        )
        .unwrap();
        let top = top_id(&conn).unwrap();
        // A third row never due (parked); after the step, before the relay sees it, a
        // fourth committed and tried on the new clock, due again in 30 s: no deadline moves
        // but the first's, no due time at all.
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("parked", serde_json::json!(3))))
            .unwrap();
        conn.execute(
            "UPDATE outbox_events SET available_at = 9223372036854775807 WHERE id = 3",
            [],
        )
        .unwrap();
        clock.set_ms(10 * day + week);
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(tx, Event::new("new", serde_json::json!(4)).expires_in(hour))
            })
            .unwrap();
        conn.execute(
            "UPDATE outbox_events SET available_at = available_at + 30000,
                    last_attempted_at = created_at WHERE id = 4",
            [],
        )
        .unwrap();
        let before = times(&outbox);
        let now = 10 * day + week + 1_000;
        assert_eq!(move_with_clock(&conn, week, top, now).unwrap(), 1);
        let after = times(&outbox);
        assert_eq!(after[0], (before[0].0, before[0].1.map(|d| d + week)));
        assert_eq!(after[1..], before[1..], "no deadline; due times stay");
    }

    #[test]
    fn a_relay_moves_only_its_own_leases_with_the_clock() {
        let (_dir, _clock, outbox) = outbox_at(1_000_000);
        for i in 0..3 {
            let _ = outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!(i))))
                .unwrap();
        }
        let conn = outbox.connection().unwrap();
        conn.execute_batch(
            "UPDATE outbox_events SET leased_at = 1000000, lease_expires_at = 1030000,
                    lease_owner = CASE id WHEN 1 THEN 'me:a1' WHEN 2 THEN 'other:b1' END
              WHERE id < 3",
        )
        .unwrap();
        assert_eq!(move_own_leases(&conn, -3_600_000, "me:a").unwrap(), 1);
        let leases: Vec<(Option<i64>, Option<i64>)> =
            columns(&outbox, "leased_at", "lease_expires_at");
        assert_eq!(
            leases,
            [
                (Some(1_000_000 - 3_600_000), Some(1_030_000 - 3_600_000)),
                (Some(1_000_000), Some(1_030_000)),
                (None, None)
            ]
        );
    }
}
