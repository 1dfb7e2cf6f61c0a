//! Kept totals of the pending rows (schema version 11), so `stats` beside a week's backlog
//! reads what it returns instead of the backlog.
//!
//! The totals cover the rows up to `outbox_stats.tallied_through`: by destination and
//! attempts spent, how many pending rows and their payload bytes (`outbox_pending_tally`),
//! and by lease, how many of them are leased (`outbox_lease_tally`). Rows above it are
//! counted when `stats` reads, and folded in by [`fold`]. Ids only rise, so an enqueue
//! always lands above it and never writes a total: the totals cost nothing until `stats`
//! has folded rows in, and then only the writes that touch those rows.
//!
//! Every write that changes a tallied row keeps the totals in its own transaction:
//!
//! - most run inside [`around`], which takes what the rows hold from the totals before the
//!   write and adds it back after, so the totals follow whatever the write did (nothing,
//!   if a lease fence turned it away);
//! - a claim that takes over no lease adds its leases with [`leased`] (one that may runs
//!   inside [`around`], see [`claim_may_take_over`]);
//! - deleting a pending row (coalescing, a storage limit, whether this crate or another
//!   program's SQL does it) runs the `outbox_events_tallied_delete` trigger.
//!
//! A lease counts as in flight until it expires, as `stats` has always counted it. Every
//! row of one lease shares its times, so any rule on them counts the totals exactly.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};

use crate::error::Result;
use crate::store::database::NotWaiting;
use crate::store::queue::{json_ids, LEASE_CLOCK_SKEW_MS};

/// The most row ids one fold transaction covers after the first: a fold holds the write
/// lock for a few milliseconds at most, however long `stats` was not called.
const FOLD_IDS: i64 = 20_000;

/// The highest row id the totals cover (0: none yet).
pub(crate) fn tallied_through(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT tallied_through FROM outbox_stats WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

/// Runs `write`, which changes no tallied row but those of `ids`, and keeps the totals: what
/// those rows held before is taken out and what they hold after is added. Costs nothing
/// but one read when no row of `ids` is tallied.
pub(crate) fn around<T>(
    conn: &Connection,
    ids: &[i64],
    write: impl FnOnce() -> Result<T>,
) -> Result<T> {
    around_then(conn, ids, write, |_| ids.to_vec())
}

/// [`around`] for a write that tells, from what it returns, which of `ids` may still be
/// pending after it (an ack's delivered rows are not): only those are read again.
pub(crate) fn around_then<T>(
    conn: &Connection,
    ids: &[i64],
    write: impl FnOnce() -> Result<T>,
    still_pending: impl FnOnce(&T) -> Vec<i64>,
) -> Result<T> {
    let through = tallied_through(conn)?;
    if !ids.iter().any(|id| *id <= through) {
        return write();
    }
    let before = Held::read(conn, ids, through)?;
    let written = write()?;
    let after = Held::read(conn, &still_pending(&written), through)?;
    after.subtract(before).apply(conn)?;
    Ok(written)
}

/// What some tallied pending rows hold, summed as the totals count them. Keyed by name first,
/// so that adding a row looks its names up as `&str` and allocates nothing (this runs in
/// every ack of tallied rows, and over every row of a fold).
#[derive(Debug, Default)]
struct Held {
    /// By destination, then attempts: rows and bytes.
    pending: HashMap<String, HashMap<i64, (i64, i64)>>,
    /// By owner, then destination: the lease's end and start, and its rows.
    leases: HashMap<String, HashMap<String, (i64, i64, i64)>>,
}

/// What [`Held::add_row`] reads, in this order (as integers and text whatever a hand wrote).
const HELD_COLUMNS: &str = "CAST(destination AS TEXT), CAST(attempts AS INTEGER),
    length(CAST(payload AS BLOB)), CAST(lease_owner AS TEXT),
    CAST(lease_expires_at AS INTEGER), CAST(COALESCE(leased_at, 0) AS INTEGER)";

impl Held {
    /// What the rows `ids` that the totals cover (up to `through`) hold now: one read of
    /// those rows, which the write around it reads anyway.
    fn read(conn: &Connection, ids: &[i64], through: i64) -> Result<Held> {
        let mut held = Held::default();
        if !ids.iter().any(|id| *id <= through) {
            return Ok(held);
        }
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {HELD_COLUMNS} FROM outbox_events
              WHERE id IN (SELECT value FROM json_each(?1)) AND id <= ?2 AND {}",
            pending!("")
        ))?;
        let mut rows = stmt.query(params![json_ids(ids.iter().copied()), through])?;
        while let Some(row) = rows.next()? {
            held.add_row(row)?;
        }
        Ok(held)
    }

    /// Adds one row of [`HELD_COLUMNS`].
    fn add_row(&mut self, row: &rusqlite::Row<'_>) -> Result<()> {
        let destination = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
        let (attempts, bytes): (i64, i64) = (row.get(1)?, row.get(2)?);
        let by_attempts = match self.pending.get_mut(destination) {
            Some(by_attempts) => by_attempts,
            None => self.pending.entry(destination.to_owned()).or_default(),
        };
        let counted = by_attempts.entry(attempts).or_default();
        counted.0 += 1;
        counted.1 += bytes;
        let owner = row
            .get_ref(3)?
            .as_str_or_null()
            .map_err(rusqlite::Error::from)?;
        if let (Some(owner), Some(expires_at)) = (owner, row.get::<_, Option<i64>>(4)?) {
            let by_destination = match self.leases.get_mut(owner) {
                Some(by_destination) => by_destination,
                None => self.leases.entry(owner.to_owned()).or_default(),
            };
            match by_destination.get_mut(destination) {
                Some(lease) => lease.2 += 1,
                None => {
                    by_destination.insert(destination.to_owned(), (expires_at, row.get(5)?, 1));
                }
            }
        }
        Ok(())
    }

    /// `self` less `before`: the change to add to the totals.
    fn subtract(mut self, before: Held) -> Held {
        for (destination, by_attempts) in before.pending {
            let mine = self.pending.entry(destination).or_default();
            for (attempts, (rows, bytes)) in by_attempts {
                let counted = mine.entry(attempts).or_default();
                counted.0 -= rows;
                counted.1 -= bytes;
            }
        }
        for (owner, by_destination) in before.leases {
            let mine = self.leases.entry(owner).or_default();
            for (destination, (expires_at, leased_at, rows)) in by_destination {
                mine.entry(destination)
                    .or_insert((expires_at, leased_at, 0))
                    .2 -= rows;
            }
        }
        self
    }

    /// Adds these counts to the totals (a change of nothing writes nothing).
    fn apply(&self, conn: &Connection) -> Result<()> {
        let mut pending = conn.prepare_cached(
            "INSERT INTO outbox_pending_tally (destination, attempts, rows, bytes)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (destination, attempts)
             DO UPDATE SET rows = rows + excluded.rows, bytes = bytes + excluded.bytes",
        )?;
        for (destination, by_attempts) in &self.pending {
            for (attempts, (rows, bytes)) in by_attempts {
                if (*rows, *bytes) != (0, 0) {
                    pending.execute(params![destination, attempts, rows, bytes])?;
                }
            }
        }
        let mut leases = conn.prepare_cached(
            "INSERT INTO outbox_lease_tally (owner, destination, expires_at, leased_at, rows)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (owner, destination) DO UPDATE SET rows = rows + excluded.rows",
        )?;
        // A lease whose rows have all left it is forgotten at once: the table holds the
        // leases in use, a few rows that a claim reads whole (`claim_may_take_over`).
        let mut forget = conn.prepare_cached(
            "DELETE FROM outbox_lease_tally WHERE owner = ?1 AND destination = ?2 AND rows = 0",
        )?;
        for (owner, by_destination) in &self.leases {
            for (destination, (expires_at, leased_at, rows)) in by_destination {
                if *rows != 0 {
                    leases.execute(params![owner, destination, expires_at, leased_at, rows])?;
                    forget.execute(params![owner, destination])?;
                }
            }
        }
        Ok(())
    }
}

/// Whether a claim of `destination` at `now`, while the totals cover the rows up to
/// `through`, may take over a tallied lease (one that ran out, or was taken while the clock
/// was ahead): then the claim must run inside [`around`], so that the rows it takes leave
/// their old lease's count. Otherwise [`leased`] after it is exact. Costs the claim nothing
/// while nothing is tallied, else one read of a table of a few rows.
pub(crate) fn claim_may_take_over(
    conn: &Connection,
    through: i64,
    destination: &str,
    now: i64,
) -> Result<bool> {
    if through == 0 {
        return Ok(false);
    }
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM outbox_lease_tally
                             WHERE destination = ?1 AND rows > 0
                               AND (expires_at <= ?2 OR leased_at > ?3))",
        )?
        .query_row(
            params![destination, now, now.saturating_add(LEASE_CLOCK_SKEW_MS)],
            |r| r.get(0),
        )?)
}

/// What a claim took that held no lease before (see [`claim_may_take_over`]): rows `ids`
/// of `destination`, leased to `owner` from `now` until `expires_at`. Counts the leases of
/// the rows up to `through` (the totals' cover). Call it before anything else changes the
/// claimed rows.
pub(crate) struct Leased<'a> {
    pub through: i64,
    pub destination: &'a str,
    pub owner: &'a str,
    pub expires_at: i64,
    pub now: i64,
}

/// Counts `lease`'s rows `ids` that the totals cover; see [`Leased`].
pub(crate) fn leased(
    conn: &Connection,
    lease: &Leased<'_>,
    ids: impl IntoIterator<Item = i64>,
) -> Result<()> {
    let taken = ids.into_iter().filter(|id| *id <= lease.through).count() as i64;
    if taken == 0 {
        return Ok(());
    }
    conn.prepare_cached(
        "INSERT INTO outbox_lease_tally (owner, destination, expires_at, leased_at, rows)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (owner, destination) DO UPDATE SET rows = rows + excluded.rows",
    )?
    .execute(params![
        lease.owner,
        lease.destination,
        lease.expires_at,
        lease.now,
        taken
    ])?;
    Ok(())
}

/// Folds the rows above `tallied_through` into the totals, if the write lock is free right
/// now: at most [`FOLD_IDS`] ids a transaction, with a pause between them and at most
/// [`FOLD_BUDGET`] a call (the first fold of a big file takes several calls). Best effort: if
/// another writer holds the lock, or the file is read-only, [`read`] counts those rows
/// instead, as exactly.
pub(crate) fn fold(conn: &mut Connection) -> Result<()> {
    let mut not_waiting = NotWaiting::new(conn)?;
    if let Err(e) = fold_while_free(&mut not_waiting) {
        log::debug!("pending totals not folded now: {e:#}");
    }
    Ok(())
}

/// How long one call folds at most (its ranges and the pauses between them); the rows it
/// leaves are counted by [`read`] meanwhile, exactly, and folded by the next call.
const FOLD_BUDGET: Duration = Duration::from_millis(250);

/// The longest pause between two ranges.
const FOLD_PAUSE_CAP: Duration = Duration::from_millis(50);

/// The end of the fold range after `through`, with `top` the highest row id: at most
/// [`FOLD_IDS`] ids, the first fold (`through` 0, a file migrated with a backlog) too.
fn fold_range_end(through: i64, top: i64) -> i64 {
    top.min(through.saturating_add(FOLD_IDS))
}

/// Where the next fold reads its rows, and up to which id: `(rows, upto)`.
///
/// A range of at most [`FOLD_IDS`] row ids at a time, the first fold too: folding a whole
/// backlog in one transaction (2M pending rows) made an app's commit wait 1.5 s. NOT
/// INDEXED: a range of row ids, never the pending index (which the planner would otherwise
/// walk whole for the pending condition). One exception: the first fold of a file whose
/// pending rows are few (at most [`FOLD_IDS`], counted through the pending index and no
/// further) folds them all at once through that index; walking a long history of delivered
/// ids range by range to find them made the first `stats` beside 10M delivered rows take
/// 0.75 s.
fn fold_plan(conn: &Connection, through: i64, top: i64) -> Result<(&'static str, i64)> {
    if through == 0 {
        let pending: i64 = conn
            .prepare_cached(&format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM outbox_events
                   INDEXED BY outbox_events_pending WHERE {} LIMIT ?1)",
                pending!("")
            ))?
            .query_row([FOLD_IDS + 1], |r| r.get(0))?;
        if pending <= FOLD_IDS {
            return Ok(("outbox_events INDEXED BY outbox_events_pending", top));
        }
    }
    Ok(("outbox_events NOT INDEXED", fold_range_end(through, top)))
}

fn fold_while_free(conn: &mut Connection) -> Result<()> {
    let started = Instant::now();
    loop {
        let range_started = Instant::now();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let through = tallied_through(&tx)?;
        let top = crate::store::queue::top_id(&tx)?;
        if top <= through {
            return Ok(());
        }
        let (rows, upto) = fold_plan(&tx, through, top)?;
        // One read of the rows, summed here: the totals' two tables from one pass.
        let mut held = Held::default();
        {
            let mut stmt = tx.prepare(&format!(
                "SELECT {HELD_COLUMNS} FROM {rows} WHERE id > ?1 AND id <= ?2 AND {}",
                pending!("")
            ))?;
            let mut found = stmt.query(params![through, upto])?;
            while let Some(row) = found.next()? {
                held.add_row(row)?;
            }
        }
        held.apply(&tx)?;
        tx.execute(
            "UPDATE outbox_stats SET tallied_through = ?1 WHERE id = 1",
            [upto],
        )?;
        // Counts of nothing are dropped. A lease that ran out stays until its rows leave it:
        // a clock set back would make it hold again.
        tx.execute("DELETE FROM outbox_lease_tally WHERE rows = 0", [])?;
        tx.execute("DELETE FROM outbox_pending_tally WHERE rows = 0", [])?;
        tx.commit()?;
        if upto == top || started.elapsed() >= FOLD_BUDGET {
            return Ok(());
        }
        // Room for the app between ranges, as long as the range held the lock: an app in
        // another process (Python's sqlite3) re-checks a busy lock only every few
        // milliseconds, and ranges back to back would lock it out.
        std::thread::sleep(range_started.elapsed().min(FOLD_PAUSE_CAP));
    }
}

/// The pending rows of one destination, as [`read`] counts them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    pub rows: i64,
    pub bytes: i64,
    /// Rows leased until after `now`.
    pub leased: i64,
    /// Rows by attempts spent (none left out, zero included).
    pub by_attempts: BTreeMap<i64, i64>,
}

/// The pending rows by destination at `now`: the totals, and the rows above them counted
/// here. Call it inside one read transaction, so both are of one moment.
pub(crate) fn read(conn: &Connection, now: i64) -> Result<BTreeMap<String, Pending>> {
    let mut by_destination: BTreeMap<String, Pending> = BTreeMap::new();
    let through = tallied_through(conn)?;
    let mut add = |destination: String, attempts: i64, rows: i64, bytes: i64, leased: i64| {
        let p = by_destination.entry(destination).or_default();
        p.rows += rows;
        p.bytes += bytes;
        p.leased += leased;
        *p.by_attempts.entry(attempts).or_default() += rows;
    };
    let mut tallied = conn.prepare_cached(
        "SELECT destination, attempts, rows, bytes FROM outbox_pending_tally WHERE rows <> 0",
    )?;
    for row in tallied.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))? {
        let (destination, attempts, rows, bytes) = row?;
        add(destination, attempts, rows, bytes, 0);
    }
    let mut leases = conn.prepare_cached(
        "SELECT destination, SUM(rows) FROM outbox_lease_tally
          WHERE expires_at > ?1 GROUP BY destination",
    )?;
    for row in leases.query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))? {
        let (destination, leased) = row?;
        add(destination, 0, 0, 0, leased);
    }
    // Summed here, not by a GROUP BY: after a first fold cut short by its budget the rows
    // above are most of a backlog, and sorting them for the groups made the first `stats`
    // beside 1M pending take 1.4 s.
    let mut above: HashMap<String, HashMap<i64, (i64, i64, i64)>> = HashMap::new();
    let top = crate::store::queue::top_id(conn)?;
    let mut counted = conn.prepare_cached(&counted_above_sql(through, top))?;
    let mut rows = counted.query(params![through, now])?;
    while let Some(row) = rows.next()? {
        let destination = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
        let (attempts, bytes, leased): (i64, i64, i64) = (row.get(1)?, row.get(2)?, row.get(3)?);
        let by_attempts = match above.get_mut(destination) {
            Some(by_attempts) => by_attempts,
            None => above.entry(destination.to_owned()).or_default(),
        };
        let counted = by_attempts.entry(attempts).or_default();
        counted.0 += 1;
        counted.1 += bytes;
        counted.2 += leased;
    }
    for (destination, by_attempts) in above {
        for (attempts, (rows, bytes, leased)) in by_attempts {
            add(destination.clone(), attempts, rows, bytes, leased);
        }
    }
    by_destination.retain(|_, p| p.rows != 0);
    for p in by_destination.values_mut() {
        p.by_attempts.retain(|_, n| *n != 0);
    }
    Ok(by_destination)
}

/// Above this many row ids past the totals, [`read`] finds the pending rows among them
/// through the pending index rather than reading every row of the range.
const ABOVE_RANGE_READ_IDS: i64 = 20_000;

/// How many rows are pending, as [`read`] counts them but without reading each row above
/// the totals (their destination, attempts and size): what the relay's pending gauge
/// needs. Beside a backlog no `stats` has folded, [`read`] reads every one of its rows,
/// which the relay did at its start and every ten seconds.
pub(crate) fn pending_rows(conn: &Connection) -> Result<i64> {
    let through = tallied_through(conn)?;
    let tallied: i64 = conn
        .prepare_cached("SELECT COALESCE(SUM(rows), 0) FROM outbox_pending_tally")?
        .query_row([], |r| r.get(0))?;
    let top = crate::store::queue::top_id(conn)?;
    let above: i64 = conn
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM {} WHERE id > ?1 AND {}",
            above_source(through, top),
            pending!("")
        ))?
        .query_row([through], |r| r.get(0))?;
    Ok(tallied + above)
}

/// Where the rows above the totals are read from; see [`counted_above_sql`].
fn above_source(through: i64, top: i64) -> &'static str {
    if through == 0 || top.saturating_sub(through) > ABOVE_RANGE_READ_IDS {
        "outbox_events INDEXED BY outbox_events_pending"
    } else {
        "outbox_events NOT INDEXED"
    }
}

/// The pending rows above the totals (`?1` is `through`), counted as [`read`] adds them up.
/// A short range of ids since the totals (what a relay leaves between two `stats`) is read
/// row by row, NOT INDEXED: never the history below it, nor the whole pending index, which
/// the planner would otherwise walk for the pending condition. Nothing tallied yet, or a
/// long range (months of delivered history since the last fold, which a read-only `stats`
/// cannot fold), and the pending index is walked instead (its entries, not the rows: about
/// a tenth of a row's read) and only the pending rows above the totals are read: a read-only
/// `stats` on 1M delivered rows since its last fold read them all (0.6 s).
fn counted_above_sql(through: i64, top: i64) -> String {
    let above = above_source(through, top);
    format!(
        "SELECT CAST(destination AS TEXT), CAST(attempts AS INTEGER),
                length(CAST(payload AS BLOB)), COALESCE(lease_expires_at > ?2, 0)
           FROM {above} WHERE id > ?1 AND {}",
        pending!("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::outbound::OutboundEvent;
    use crate::store::queue::{self, ClaimRequest, WriteBack};
    use crate::{Event, Outbox, StoragePolicy};

    /// The pending rows by destination counted the slow way, a pass over every row: what
    /// the totals must always agree with.
    fn by_pass(conn: &Connection, now: i64) -> BTreeMap<String, Pending> {
        let mut by_destination: BTreeMap<String, Pending> = BTreeMap::new();
        let mut stmt = conn
            .prepare(concat!(
                "SELECT destination, attempts, COUNT(*), SUM(length(CAST(payload AS BLOB))),
                        SUM(COALESCE(lease_expires_at > ?1, 0))
                   FROM outbox_events WHERE ",
                pending!(""),
                " GROUP BY destination, attempts"
            ))
            .unwrap();
        let rows = stmt
            .query_map([now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap();
        for row in rows {
            let (destination, attempts, rows, bytes, leased): (String, i64, i64, i64, i64) =
                row.unwrap();
            let p = by_destination.entry(destination).or_default();
            p.rows += rows;
            p.bytes += bytes;
            p.leased += leased;
            *p.by_attempts.entry(attempts).or_default() += rows;
        }
        by_destination
    }

    fn in_tx<T>(outbox: &Outbox, f: impl FnOnce(&Connection) -> Result<T>) -> T {
        try_in_tx(outbox, f).unwrap()
    }

    /// Runs `f` in a write transaction, committed if `f` succeeds and rolled back if not.
    fn try_in_tx<T>(outbox: &Outbox, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut conn = outbox.connection().unwrap();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let out = f(&tx)?;
        tx.commit().unwrap();
        Ok(out)
    }

    #[test]
    fn the_first_fold_of_a_backlog_goes_in_bounded_ranges_and_ends_exact() {
        // Every fold transaction covers at most FOLD_IDS ids, the first one too.
        assert_eq!(fold_range_end(0, 2_000_000), FOLD_IDS);
        assert_eq!(fold_range_end(FOLD_IDS, 2_000_000), 2 * FOLD_IDS);
        assert_eq!(fold_range_end(0, 10), 10);
        // A file whose totals start from nothing with a backlog of several ranges (as a
        // file migrated to the totals): after folds, exact.
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("first.db")).unwrap();
        outbox
            .transaction(|tx| {
                for i in 0..(FOLD_IDS * 2 + 500) {
                    let _ = outbox.enqueue(tx, crate::Event::new("t", serde_json::json!(i)))?;
                }
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        in_tx(&outbox, |c| {
            c.execute_batch(
                "DELETE FROM outbox_pending_tally; DELETE FROM outbox_lease_tally;
                 UPDATE outbox_stats SET tallied_through = 0 WHERE id = 1;",
            )?;
            Ok(())
        });
        let mut conn = outbox.connection().unwrap();
        for _ in 0..10 {
            fold(&mut conn).unwrap();
        }
        let top: i64 = conn
            .query_row("SELECT MAX(id) FROM outbox_events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tallied_through(&conn).unwrap(), top);
        assert_eq!(read(&conn, 0).unwrap(), by_pass(&conn, 0));
    }

    #[test]
    fn a_first_fold_of_few_pending_rows_beside_a_long_history_goes_at_once() {
        // Pending rows far apart in ids (a long delivered history between them): the first
        // fold takes them through the pending index in one transaction, not range by range.
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("sparse.db")).unwrap();
        in_tx(&outbox, |c| {
            for id in [5_i64, 100_000] {
                c.execute(
                    "INSERT INTO outbox_events (id, event_id, event_type, payload, destination,
                         created_at, available_at)
                     VALUES (?1, 'e' || ?1, 't', '{}', 'default', 0, 0)",
                    [id],
                )?;
            }
            c.execute_batch(
                "DELETE FROM outbox_pending_tally; DELETE FROM outbox_lease_tally;
                 UPDATE outbox_stats SET tallied_through = 0 WHERE id = 1;",
            )?;
            Ok(())
        });
        let conn = outbox.connection().unwrap();
        let (rows, upto) = fold_plan(&conn, 0, 100_000).unwrap();
        assert_eq!(upto, 100_000, "read from {rows}");
        let mut conn = conn;
        fold(&mut conn).unwrap();
        assert_eq!(tallied_through(&conn).unwrap(), 100_000);
        assert_eq!(read(&conn, 0).unwrap(), by_pass(&conn, 0));
        // Later folds, and first folds of a big backlog, stay ranges of ids.
        assert_eq!(fold_plan(&conn, 5, 100_000).unwrap().1, 5 + FOLD_IDS);
    }

    #[test]
    fn pending_rows_past_a_long_history_since_the_totals_are_counted_exactly() {
        // Folded at id 2; then a long delivered history and a few pending rows, leased and
        // not, above it: read() takes them through the pending index and agrees with a pass.
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("long.db")).unwrap();
        let pending_row = |c: &Connection, id: i64, lease: Option<i64>| {
            c.execute(
                "INSERT INTO outbox_events (id, event_id, event_type, payload, destination,
                     created_at, available_at, attempts, lease_expires_at)
                 VALUES (?1, 'e' || ?1, 't', '{\"n\":1}', 'default', 0, 0, ?1 % 3, ?2)",
                params![id, lease],
            )
        };
        in_tx(&outbox, |c| {
            pending_row(c, 1, None)?;
            pending_row(c, 2, None)?;
            Ok(())
        });
        let mut conn = outbox.connection().unwrap();
        fold(&mut conn).unwrap();
        assert_eq!(tallied_through(&conn).unwrap(), 2);
        in_tx(&outbox, |c| {
            c.execute(
                "WITH RECURSIVE k(i) AS (SELECT 3 UNION ALL SELECT i + 1 FROM k WHERE i < ?1)
                 INSERT INTO outbox_events (id, event_id, event_type, payload, destination,
                     created_at, available_at, delivered_at)
                 SELECT i, 'd' || i, 't', '{}', 'default', 0, 0, 1 FROM k",
                [3 + ABOVE_RANGE_READ_IDS],
            )?;
            let top = 4 + ABOVE_RANGE_READ_IDS;
            pending_row(c, top, None)?;
            pending_row(c, top + 1, Some(10))?;
            pending_row(c, top + 2, Some(10_000))?;
            Ok(())
        });
        for now in [0, 100, 20_000] {
            let counted = read(&conn, now).unwrap();
            assert_eq!(counted, by_pass(&conn, now), "at {now}");
            assert_eq!(counted["default"].rows, 5);
            assert_eq!(pending_rows(&conn).unwrap(), 5);
        }
    }

    #[test]
    fn rows_above_the_totals_are_a_range_of_row_ids() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("plan.db")).unwrap();
        let conn = outbox.connection().unwrap();
        let plan = |sql: &str| {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = stmt
                .query_map(params![1, 2], |r| r.get::<_, String>(3))
                .unwrap();
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .unwrap()
                .join("\n")
        };
        let above = plan(&counted_above_sql(10, 10 + ABOVE_RANGE_READ_IDS));
        assert!(above.contains("INTEGER PRIMARY KEY (rowid>?)"), "{above}");
        let first = plan(&counted_above_sql(0, 10));
        assert!(first.contains("outbox_events_pending"), "{first}");
        // A long history since the totals: its pending rows through the pending index.
        let long = plan(&counted_above_sql(10, 11 + ABOVE_RANGE_READ_IDS));
        assert!(long.contains("outbox_events_pending"), "{long}");
    }

    /// Random writes of every kind that touches pending rows, through the crate's own
    /// functions, with folds at random moments: after each, the totals and the rows above
    /// them must count exactly what a pass over the table counts.
    #[test]
    fn the_totals_agree_with_a_pass_through_every_kind_of_write() {
        for seed in 0..20 {
            run_random_writes(seed);
        }
    }

    fn run_random_writes(seed: u64) {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let outbox = Outbox::builder()
            .clock(clock.clone())
            .route("a.*", "a")
            .route("b.*", "b")
            .route("b.*", "a")
            .max_pending(60)
            .storage_policy("b.*", StoragePolicy::DropOldest)
            .open(dir.path().join("tally.db"))
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut claimed: Vec<OutboundEvent> = Vec::new();
        let mut exports: Vec<(String, Vec<i64>)> = Vec::new();
        let mut folds = 0;
        for step in 0..400 {
            let now = clock.now_ms();
            let op = rng.u8(0..14);
            match op {
                0..=2 => {
                    let kind = if rng.bool() { "a.x" } else { "b.y" };
                    let mut event = Event::new(kind, serde_json::json!({ "n": rng.u32(..) }));
                    if rng.u8(0..3) == 0 {
                        event = event.partition_key(format!("k{}", rng.u8(0..3)));
                    }
                    if rng.u8(0..4) == 0 {
                        event = event.coalesce_key(format!("c{}", rng.u8(0..3)));
                    }
                    if rng.u8(0..4) == 0 {
                        event =
                            event.expires_in(std::time::Duration::from_millis(rng.u64(1..5_000)));
                    }
                    // Full is a refusal, which changes nothing.
                    let _ = outbox.transaction(|tx| outbox.enqueue(tx, event));
                }
                3 => {
                    // The SQL contract, as another program writes it.
                    let conn = outbox.connection().unwrap();
                    let _ = conn.execute(
                        "INSERT INTO outbox_enqueue (type, data, key, coalesce_key)
                         VALUES ('a.sql', json_object('n', ?1), ?2, ?3)",
                        params![
                            rng.u32(..),
                            (rng.u8(0..3) == 0).then_some("k1"),
                            (rng.u8(0..3) == 0).then_some("c1")
                        ],
                    );
                }
                4 | 5 => {
                    let destination = if rng.bool() { "a" } else { "b" };
                    let owner = format!("relay-{step}");
                    let request = ClaimRequest {
                        destination,
                        default_source: "/t",
                        owner: &owner,
                        spare_leases: "",
                        now,
                        clock_step_ms: 0,
                        lease_ms: rng.i64(1..20_000),
                        max_bytes: rng.i64(1..2_000),
                        numbering_bound: None,
                        min_priority: 0,
                        limit: rng.i64(1..8),
                    };
                    let got = in_tx(&outbox, |tx| queue::claim(tx, &request));
                    claimed.extend(got.events);
                }
                6 | 7 if !claimed.is_empty() => {
                    let n = rng.usize(1..=claimed.len().min(6));
                    let batch: Vec<OutboundEvent> = claimed.drain(..n).collect();
                    let outcomes: Vec<WriteBack> = batch
                        .iter()
                        .map(|_| match rng.u8(0..5) {
                            0 | 1 => WriteBack::Delivered,
                            2 => WriteBack::Retry {
                                available_at: now + rng.i64(0..3_000),
                                error: "HTTP 503".into(),
                            },
                            3 => WriteBack::Dead {
                                error: "HTTP 400".into(),
                            },
                            _ => WriteBack::Release {
                                error: None,
                                available_at: None,
                            },
                        })
                        .collect();
                    let pairs: Vec<(&OutboundEvent, &WriteBack)> =
                        batch.iter().zip(outcomes.iter()).collect();
                    in_tx(&outbox, |tx| queue::record(tx, &pairs, now));
                }
                8 => {
                    in_tx(&outbox, |tx| queue::expire(tx, now, 50, ""));
                }
                9 => {
                    let dead: Vec<String> = outbox
                        .list(Some(crate::ops::admin::State::Dead), 3)
                        .unwrap()
                        .into_iter()
                        .map(|r| r.event_id)
                        .collect();
                    let refs: Vec<&str> = dead.iter().map(String::as_str).collect();
                    outbox.retry(&refs).unwrap();
                    if rng.bool() {
                        outbox
                            .retry_dead(&crate::ops::admin::DeadFilter::default())
                            .unwrap();
                    }
                }
                10 => {
                    let owner = format!("export-{step}");
                    // An export refuses a file with a badly written row (below): nothing
                    // is leased then.
                    let page = queue::ExportPage {
                        destination: "a",
                        owner: &owner,
                        now,
                        lease_ms: 60_000,
                        limit: 4,
                        max_bytes: rng.i64(1..2_000),
                        after: 0,
                        default_source: "/t",
                    };
                    let leased = try_in_tx(&outbox, |tx| queue::lease_for_export(tx, &page));
                    if let Ok(events) = leased {
                        exports.push((owner, events.iter().map(|e| e.id).collect()));
                    }
                }
                11 if !exports.is_empty() => {
                    let (owner, ids) = exports.remove(0);
                    if rng.bool() {
                        in_tx(&outbox, |tx| queue::mark_exported(tx, &owner, &ids, now));
                    } else {
                        in_tx(&outbox, |tx| queue::release_export(tx, &owner, &ids));
                    }
                }
                12 if rng.u8(0..4) == 0 => {
                    // A row another program wrote badly (a REAL time): the next claim that
                    // takes it dead-letters it. Nothing the totals count changes here.
                    let conn = outbox.connection().unwrap();
                    conn.execute(
                        "UPDATE outbox_events SET created_at = created_at + 0.5
                          WHERE id = (SELECT id FROM outbox_events
                                       WHERE delivered_at IS NULL AND dead_at IS NULL
                                       ORDER BY random() LIMIT 1)",
                        [],
                    )
                    .unwrap();
                }
                12 => {
                    let mut conn = outbox.connection().unwrap();
                    fold(&mut conn).unwrap();
                    folds += 1;
                }
                _ => {
                    // Time passes (leases and deadlines run out), or the clock steps back.
                    if rng.u8(0..6) == 0 {
                        clock.advance_ms(-rng.i64(1..10_000));
                    } else {
                        clock.advance_ms(rng.i64(1..4_000));
                    }
                }
            }
            let now = clock.now_ms();
            let mut conn = outbox.connection().unwrap();
            let tx = conn.transaction().unwrap();
            let counted = read(&tx, now).unwrap();
            assert_eq!(counted, by_pass(&tx, now), "seed {seed}, step {step}");
            // The relay's pending gauge counts the same rows without reading them.
            let rows: i64 = counted.values().map(|p| p.rows).sum();
            assert_eq!(pending_rows(&tx).unwrap(), rows, "seed {seed}, step {step}");
        }
        assert!(folds > 0);
        let conn = outbox.connection().unwrap();
        assert!(
            tallied_through(&conn).unwrap() > 0,
            "seed {seed}: nothing was tallied"
        );
    }
}
