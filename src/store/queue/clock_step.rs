//! Moving what the wall clock wrote when it is stepped (NTP setting a device's clock right
//! after a boot without a real-time clock, a user changing it): the deadlines and due times
//! of the pending events committed before the step, so that a step changes neither what
//! expires nor what is due. The relay's writer notices the step (the wall clock moved
//! further or less far than the monotonic one) and calls this in one write transaction.

use rusqlite::{params, Connection};

use crate::error::Result;

/// The highest row id (0: none): the rows written so far, on the clock of now.
pub(crate) fn top_id(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM outbox_events")?
        .query_row([], |r| r.get(0))?)
}

/// After the wall clock stepped by `by_ms` (forward if positive), moves by as much the
/// deadlines of the pending rows up to `top_id` (those committed before the step) and,
/// for a step forward, their due times that were not yet due on the clock of before
/// (`now - by_ms`; parked rows keep their mark). A step back leaves due times to
/// `reanchor_future`, which re-anchors on now those written in the future. Returns the
/// rows moved.
pub(crate) fn move_with_clock(
    conn: &Connection,
    by_ms: i64,
    top_id: i64,
    now: i64,
) -> Result<usize> {
    if by_ms == 0 || top_id == 0 {
        return Ok(0);
    }
    let deadlines = conn
        .prepare_cached(concat!(
            "UPDATE outbox_events SET expires_at = expires_at + ?1
              WHERE id <= ?2 AND expires_at IS NOT NULL AND ",
            pending!("")
        ))?
        .execute(params![by_ms, top_id])?;
    let due = if by_ms > 0 {
        conn.prepare_cached(concat!(
            "UPDATE outbox_events SET available_at = available_at + ?1
              WHERE id <= ?2 AND available_at > ?3 AND available_at < ",
            parked!(),
            " AND ",
            pending!("")
        ))?
        .execute(params![by_ms, top_id, now.saturating_sub(by_ms)])?
    } else {
        0
    };
    Ok(deadlines.max(due))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Event, Outbox};

    fn times(outbox: &Outbox) -> Vec<(i64, Option<i64>)> {
        let conn = outbox.connection().unwrap();
        let mut stmt = conn
            .prepare("SELECT available_at, expires_at FROM outbox_events ORDER BY id")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn a_step_forward_moves_deadlines_and_future_due_times_of_the_rows_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let outbox = Outbox::builder()
            .clock(clock.clone())
            .open(dir.path().join("step.db"))
            .unwrap();
        let hour = std::time::Duration::from_secs(3600);
        outbox
            .transaction(|tx| {
                // Due now, expiring in an hour; due in a minute; no deadline.
                let _ =
                    outbox.enqueue(tx, Event::new("a", serde_json::json!(1)).expires_in(hour))?;
                let _ = outbox.enqueue(tx, Event::new("b", serde_json::json!(2)))?;
                tx.execute(
                    "UPDATE outbox_events SET available_at = available_at + 60000
                      WHERE event_type = 'b'",
                    [],
                )?;
                let _ = outbox.enqueue(tx, Event::new("c", serde_json::json!(3)))?;
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        let before = times(&outbox);
        let week = 7 * 86_400_000;
        let conn = outbox.connection().unwrap();
        let top = top_id(&conn).unwrap();
        // A row committed after the step, on the new clock: not moved.
        clock.set_ms(1_000_000 + week);
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(tx, Event::new("d", serde_json::json!(4)).expires_in(hour))
            })
            .unwrap();
        let moved = move_with_clock(&conn, week, top, 1_000_000 + week).unwrap();
        assert_eq!(moved, 1, "one deadline; one future due time");
        let after = times(&outbox);
        assert_eq!(after[0], (before[0].0, before[0].1.map(|d| d + week)));
        assert_eq!(after[1], (before[1].0 + week, None));
        assert_eq!(after[2], before[2], "due already, no deadline");
        assert_eq!(after[3].1, Some(1_000_000 + week + 3_600_000));
        // A step back moves the deadlines back, and leaves due times to the re-anchoring.
        let moved = move_with_clock(&conn, -week, top, 1_000_000).unwrap();
        assert_eq!(moved, 1);
        let back = times(&outbox);
        let deadlines = |t: &[(i64, Option<i64>)]| t.iter().map(|r| r.1).collect::<Vec<_>>();
        assert_eq!(deadlines(&back[..3]), deadlines(&before));
        assert_eq!(back[1].0, before[1].0 + week, "left to reanchor_future");
    }
}
