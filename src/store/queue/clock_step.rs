//! Moving what the wall clock wrote when it is set back (NTP correcting a clock that ran
//! ahead, a user changing it): the deadlines of the pending events committed before the
//! step, so that it keeps none of them alive longer than it was given. The relay's writer
//! notices the step (the wall clock moved less far than the monotonic one) and calls this in
//! one write transaction.

use rusqlite::{params, Connection};

use crate::error::Result;

/// The highest row id (0: none): the rows written so far, on the clock of now.
pub(crate) fn top_id(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM outbox_events")?
        .query_row([], |r| r.get(0))?)
}

/// After the wall clock stepped back by `-by_ms` (`by_ms` negative), moves by as much the
/// deadlines of the pending rows up to `top_id` (those committed before the step), so an
/// event set to expire in an hour on the clock of before does not live a day longer; their
/// due times are `reanchor_future`'s. A step forward moves nothing: the monotonic clock the
/// writer measures against stops while a device sleeps, so a forward step cannot be told
/// from hours that really passed in a suspend, and those must expire what they expire.
/// Returns the rows moved.
pub(crate) fn move_with_clock(conn: &Connection, by_ms: i64, top_id: i64) -> Result<usize> {
    if by_ms >= 0 || top_id == 0 {
        return Ok(0);
    }
    Ok(conn
        .prepare_cached(concat!(
            "UPDATE outbox_events SET expires_at = expires_at + ?1
              WHERE id <= ?2 AND expires_at IS NOT NULL AND ",
            pending!("")
        ))?
        .execute(params![by_ms, top_id])?)
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
    fn a_step_back_moves_the_deadlines_of_the_rows_before_it_and_a_step_forward_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let day = 86_400_000;
        let clock = ManualClock::new(10 * day);
        let outbox = Outbox::builder()
            .clock(clock.clone())
            .open(dir.path().join("step.db"))
            .unwrap();
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
        assert_eq!(
            move_with_clock(&conn, day, top).unwrap(),
            0,
            "forward: nothing"
        );
        assert_eq!(move_with_clock(&conn, -day, top).unwrap(), 1);
        let after = times(&outbox);
        assert_eq!(after[0], (before[0].0, before[0].1.map(|d| d - day)));
        assert_eq!(after[1], before[1], "no deadline");
        assert_eq!(after[2].1, Some(9 * day + 3_600_000));
    }
}
