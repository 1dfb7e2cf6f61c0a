//! What each destination's data budget has spent, kept in the file (`outbox_budgets`): the
//! relay adds its spending as it records outcomes, and reads back what every relay of the
//! file spent; the app and the CLI read where a budget stands ([`BudgetStatus`]).

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::Result;

/// Where a destination's data budget stands, from the file:
/// [`Outbox::budget`](crate::Outbox::budget), `outbox stats`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct BudgetStatus {
    /// The destination.
    #[serde(skip)]
    pub destination: String,
    /// The bytes a period may spend.
    pub limit_bytes: u64,
    /// The bytes spent in the current period.
    pub used_bytes: u64,
    /// When the current period began (unix ms).
    pub period_started: i64,
    /// When it ends and the budget is whole again (unix ms).
    pub period_ends: i64,
    /// When the budget runs out at the rate spent so far in the period (unix ms): `None`
    /// if nothing was spent yet or the period ends first; now, or the past, once it has.
    pub forecast: Option<i64>,
    /// Whether the relay is holding events back for the budget (only events at or above
    /// its exempt priority go).
    pub holding: bool,
    /// Events of this priority and above go even when the budget is spent (and are
    /// counted).
    pub exempt_priority: Option<u8>,
}

/// The period that `now` falls in, for a budget whose periods of `period_ms` began at
/// `started`: the same start while `now` is within the period (or before it: a clock that
/// stepped back does not start a new period), else the start of the period holding `now`,
/// counted in whole periods from `started`.
pub(crate) fn current_period(started: i64, period_ms: i64, now: i64) -> i64 {
    if period_ms <= 0 || now < started.saturating_add(period_ms) {
        return started;
    }
    let whole = (now - started) / period_ms;
    started + whole * period_ms
}

/// When a budget of `limit` runs out at the rate `used` was spent from `started` to `now`.
fn forecast(limit: u64, used: u64, started: i64, ends: i64, now: i64) -> Option<i64> {
    if used >= limit {
        return Some(now);
    }
    let elapsed = now.saturating_sub(started);
    if used == 0 || elapsed <= 0 {
        return None;
    }
    let rate = used as f64 / elapsed as f64;
    let at = now as f64 + (limit - used) as f64 / rate;
    (at < ends as f64).then_some(at as i64)
}

/// What a relay keeps of a destination's budget in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetRecord<'a> {
    pub destination: &'a str,
    pub limit_bytes: u64,
    pub period_ms: i64,
    pub exempt_priority: Option<u8>,
}

/// What the file holds of a budget's current period, after a relay's [`add_spent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeriodSpent {
    pub period_started: i64,
    pub used_bytes: u64,
}

/// Adds `spent` bytes to the budget's period that began at `period_started` (the relay's
/// view), writes the relay's limit, period and whether it holds, and returns the file's
/// period and total: another relay of the file may have spent too, or begun a later period
/// (this relay's spending then counts in it). A record of a period before the relay's is
/// replaced; a new budget's period begins at `period_started`.
pub(crate) fn add_spent(
    conn: &Connection,
    record: &BudgetRecord<'_>,
    period_started: i64,
    spent: u64,
    holding: bool,
) -> Result<PeriodSpent> {
    let spent = i64::try_from(spent).unwrap_or(i64::MAX);
    let (started, used): (i64, i64) = conn
        .prepare_cached(
            "INSERT INTO outbox_budgets (destination, limit_bytes, period_ms, period_started,
                 used_bytes, exempt_priority, holding)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (destination) DO UPDATE SET
                 limit_bytes = excluded.limit_bytes,
                 period_ms = excluded.period_ms,
                 exempt_priority = excluded.exempt_priority,
                 holding = excluded.holding,
                 used_bytes = CASE WHEN period_started >= excluded.period_started
                                   THEN used_bytes + excluded.used_bytes
                                   ELSE excluded.used_bytes END,
                 period_started = max(period_started, excluded.period_started)
             RETURNING period_started, used_bytes",
        )?
        .query_row(
            params![
                record.destination,
                i64::try_from(record.limit_bytes).unwrap_or(i64::MAX),
                record.period_ms,
                period_started,
                spent,
                record.exempt_priority,
                holding
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
    Ok(PeriodSpent {
        period_started: started,
        used_bytes: u64::try_from(used).unwrap_or(0),
    })
}

/// The period a budget's record in the file is in, if it has one: for a relay starting.
pub(crate) fn stored_period(conn: &Connection, destination: &str) -> Result<Option<PeriodSpent>> {
    Ok(conn
        .prepare_cached(
            "SELECT period_started, used_bytes FROM outbox_budgets WHERE destination = ?1",
        )?
        .query_row([destination], |r| {
            Ok(PeriodSpent {
                period_started: r.get(0)?,
                used_bytes: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
            })
        })
        .optional()?)
}

/// Where the budget of `destination` stands at `now`, if a relay has kept one for it: a
/// record whose period is over reads as the new period's (nothing spent yet, not holding).
pub(crate) fn status(
    conn: &Connection,
    destination: &str,
    now: i64,
) -> Result<Option<BudgetStatus>> {
    Ok(all(conn, Some(destination), now)?.into_iter().next())
}

/// Where every kept budget stands at `now` (or the one of `only`), by destination.
pub(crate) fn all(conn: &Connection, only: Option<&str>, now: i64) -> Result<Vec<BudgetStatus>> {
    let mut stmt = conn.prepare_cached(
        "SELECT destination, limit_bytes, period_ms, period_started, used_bytes,
                exempt_priority, holding
           FROM outbox_budgets WHERE ?1 IS NULL OR destination = ?1 ORDER BY destination",
    )?;
    let rows = stmt.query_map([only], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, Option<i64>>(5)?,
            r.get::<_, bool>(6)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (destination, limit, period_ms, started, used, exempt, holding) = row?;
        let limit = u64::try_from(limit).unwrap_or(0);
        let current = current_period(started, period_ms, now);
        let (used, holding) = if current == started {
            (u64::try_from(used).unwrap_or(0), holding)
        } else {
            (0, false)
        };
        let ends = current.saturating_add(period_ms);
        out.push(BudgetStatus {
            destination,
            limit_bytes: limit,
            used_bytes: used,
            period_started: current,
            period_ends: ends,
            forecast: forecast(limit, used, current, ends, now),
            holding,
            exempt_priority: exempt.and_then(|p| u8::try_from(p).ok()),
        });
    }
    Ok(out)
}

/// An in-memory file with the budgets' table as the schema makes it, for unit tests.
#[cfg(test)]
pub(crate) fn file_for_tests() -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    let schema = include_str!("../../schema.sql");
    let table = schema
        .find("CREATE TABLE outbox_budgets")
        .and_then(|start| {
            schema[start..]
                .find(';')
                .map(|end| &schema[start..=start + end])
        })
        .expect("schema.sql makes outbox_budgets");
    conn.execute_batch(table).unwrap();
    conn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_begins_in_whole_periods_from_the_first_and_never_on_a_clock_stepped_back() {
        let minute = 60_000;
        assert_eq!(current_period(1_000, minute, 1_000), 1_000);
        assert_eq!(current_period(1_000, minute, 60_999), 1_000);
        assert_eq!(current_period(1_000, minute, 61_000), 61_000);
        assert_eq!(
            current_period(1_000, minute, 1_000 + 10 * minute + 5),
            1_000 + 10 * minute
        );
        assert_eq!(current_period(1_000, minute, -5_000_000), 1_000);
    }

    #[test]
    fn the_forecast_is_when_the_rate_so_far_spends_the_rest_or_none_past_the_period() {
        // 100 of 1,000 bytes in 10 s: the rest in 90 s more.
        assert_eq!(forecast(1_000, 100, 0, 1_000_000, 10_000), Some(100_000));
        // The period ends first.
        assert_eq!(forecast(1_000, 100, 0, 50_000, 10_000), None);
        assert_eq!(forecast(1_000, 0, 0, 50_000, 10_000), None);
        // Spent: now.
        assert_eq!(forecast(1_000, 1_000, 0, 50_000, 10_000), Some(10_000));
    }

    #[test]
    fn relays_add_their_spending_and_a_later_period_replaces_an_earlier_one() {
        let conn = file_for_tests();
        let record = BudgetRecord {
            destination: "d",
            limit_bytes: 1_000,
            period_ms: 60_000,
            exempt_priority: Some(8),
        };
        let first = add_spent(&conn, &record, 0, 300, false).unwrap();
        assert_eq!((first.period_started, first.used_bytes), (0, 300));
        // Another relay, same period.
        let second = add_spent(&conn, &record, 0, 200, true).unwrap();
        assert_eq!(second.used_bytes, 500);
        // A relay still on the earlier period's view adds to the file's later one.
        add_spent(&conn, &record, 60_000, 50, false).unwrap();
        let late = add_spent(&conn, &record, 0, 10, false).unwrap();
        assert_eq!((late.period_started, late.used_bytes), (60_000, 60));
        let shown = status(&conn, "d", 61_000).unwrap().unwrap();
        assert_eq!(
            (shown.used_bytes, shown.period_ends, shown.exempt_priority),
            (60, 120_000, Some(8))
        );
        // Read after the period ended: the new period's, nothing spent.
        let later = status(&conn, "d", 200_000).unwrap().unwrap();
        assert_eq!((later.period_started, later.used_bytes), (180_000, 0));
        assert!(status(&conn, "other", 0).unwrap().is_none());
    }
}
