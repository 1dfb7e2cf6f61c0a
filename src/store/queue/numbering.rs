//! Stream numbers: the gapless sequence per destination and source that every event takes
//! when its transaction commits (`outbox_streams`, schema versions 15 and 16).
//!
//! A stream's numbers follow its rows' ids, which follow commit order (the writer holding
//! SQLite's one write lock takes the next id), so a row's number is fixed when it commits:
//! one above its stream's high water plus its place among the stream's rows not yet
//! numbered. A rolled-back transaction or a repeated idempotency key leaves no row and so
//! takes no number, and a deleted row's number stays given (`outbox_streams.high_water`).
//!
//! The number is written into the row when first needed, not by the app's `INSERT` (any read
//! of the table inside it costs about a tenth of the insert; schema version 16):
//!
//! - by the relay's claim, for every row up to the newest it claims ([`plan`], then
//!   the claim's lease writes the claimed rows' numbers with their lease when they run on, as
//!   they do when one stream's backlog drains oldest first, and [`Plan::write`] the rest);
//! - by an export ([`catch_up`], then [`number_all`] for each page), and before a coalescing
//!   or a storage limit deletes pending rows ([`number_all`]), so that their fates keep
//!   their numbers;
//! - by `Outbox::stream_numbers` ([`number_up_to`]);
//! - by the schema's delete trigger, for a row deleted before it was numbered (the rows
//!   before it first), so its number stays given and the fleet names it missing.
//!
//! No relay's claim numbers more than [`CATCH_UP_CHUNK`] rows up to the newest row it takes
//! (and the rows committed since): a claim past that bound (an urgent event behind a backlog
//! a device committed offline for weeks) takes nothing, and the relay numbers the backlog
//! in transactions of its own of [`RELAY_STEP`] ids ([`catch_up_through`]), then claims
//! again, so an urgent event behind a million offline ones does not hold the app's commits
//! for the whole walk. A backlog drained oldest first takes no step: each claim numbers the
//! rows it takes, in its own statement.
//!
//! The streams' accounts read the numbers of rows not numbered yet ([`plan`]) without
//! writing them. Rows at or below `outbox_stats.numbered_through` are numbered.

#[allow(unused_imports)]
use super::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Set by the bench only (`internal::set_stream_numbers`), to measure what numbering costs
/// in the same run: no row is then numbered, and claims send none.
static OFF_FOR_BENCH: AtomicBool = AtomicBool::new(false);

/// The most rows one transaction of this process numbered: what the tests and the bench read
/// to show that no transaction numbers an unbounded backlog under the write lock.
static LARGEST_STEP: AtomicUsize = AtomicUsize::new(0);

/// The most rows one transaction of this process numbered so far.
pub(crate) fn largest_step() -> usize {
    LARGEST_STEP.load(Ordering::Relaxed)
}

/// Turns numbering off (`false`) or on for every outbox of the process: benches only.
pub(crate) fn set_on(on: bool) {
    OFF_FOR_BENCH.store(!on, Ordering::Relaxed);
}

/// Whether the bench turned numbering off.
pub(crate) fn is_off() -> bool {
    OFF_FOR_BENCH.load(Ordering::Relaxed)
}

/// How many rows one transaction of [`catch_up`] numbers, and how many it leaves to the
/// transaction that claims or reads after it: a backlog of weeks is numbered without
/// holding the write lock for long. Also the most a relay's claim numbers (its
/// `numbering_bound`).
pub(crate) const CATCH_UP_CHUNK: i64 = 10_000;

/// The step of the relay's own catching up when a claim passed its bound: small enough
/// that the app's commits beside it wait a few milliseconds per step (10,000 rows a step
/// held them about 250 ms at a time on the 2-core VM; 1,000 rows about 5 ms, which left the
/// app's worst commit up to 2.1 times that beside the same backlog drained alone; 500
/// rows 0.65-1.15 times).
pub(crate) const RELAY_STEP: i64 = 500;

/// `(numbered_through, newest id)`: the rows in between are not numbered yet.
fn unnumbered(conn: &Connection) -> Result<(i64, i64)> {
    Ok(conn
        .prepare_cached(
            "SELECT numbered_through, COALESCE((SELECT MAX(id) FROM outbox_events), 0)
               FROM outbox_stats WHERE id = 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Numbers every row not numbered yet, inside the caller's transaction (a write: call it
/// before the transaction's reads, see `insert`). Costs a read when there is none.
pub(crate) fn number_all(tx: &Connection) -> Result<()> {
    if is_off() {
        return Ok(());
    }
    // The write lock first: a deferred transaction that has only read cannot become a
    // writer while another connection writes.
    tx.prepare_cached("UPDATE outbox_stats SET numbered_through = numbered_through WHERE 0")?
        .execute([])?;
    let (through, newest) = unnumbered(tx)?;
    if newest > through {
        number_through(tx, newest)?;
    }
    Ok(())
}

/// The numbers of the rows not numbered yet up to `limit`, as [`plan`] reads them: written
/// by [`Plan::write`] (the rows a claim takes are written by the claim itself).
pub(crate) struct Plan {
    /// `(id, number)` of every row numbered, in id order.
    pub numbered: Vec<(i64, i64)>,
    /// Each stream met and the last number it now gave.
    streams: Vec<((String, String), i64)>,
    limit: i64,
}

/// The plan of a claim that takes exactly the rows not numbered yet: `count` ids running
/// on from `first`, just above `numbered_through`, all of the stream `(destination,
/// source)`. Their numbers follow the stream's high water, without the walk [`plan`] makes
/// to learn each row's stream: a backlog drained oldest first claims so. `None` when `first`
/// is not the next row to number (the caller then asks [`plan`]).
pub(crate) fn plan_run(
    tx: &Connection,
    (destination, source): (&str, &str),
    first: i64,
    count: i64,
) -> Result<Option<Plan>> {
    if is_off() || count <= 0 || numbered_from(tx)? != first - 1 {
        return Ok(None);
    }
    let high = high_water(tx, destination, source)?;
    Ok(Some(Plan {
        numbered: (0..count).map(|n| (first + n, high + 1 + n)).collect(),
        streams: vec![((destination.to_owned(), source.to_owned()), high + count)],
        limit: first + count - 1,
    }))
}

/// The last number stream `(destination, source)` gave (0 for a stream not met yet).
fn high_water(tx: &Connection, destination: &str, source: &str) -> Result<i64> {
    use rusqlite::OptionalExtension;
    Ok(tx
        .prepare_cached(
            "SELECT high_water FROM outbox_streams WHERE destination = ?1 AND source = ?2",
        )?
        .query_row(params![destination, source], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Reads the rows not numbered yet with ids up to `limit` (a walk of ids, no index) and
/// gives them their numbers, in id order per stream; `None` if there are none. Nothing is
/// written until [`Plan::write`].
pub(crate) fn plan(tx: &Connection, limit: i64) -> Result<Option<Plan>> {
    if is_off() {
        return Ok(None);
    }
    let from = numbered_from(tx)?;
    if limit <= from {
        return Ok(None);
    }
    // (destination, source) and the stream's last number given; streams come few.
    let mut streams: Vec<((String, String), i64)> = Vec::new();
    let mut numbered = Vec::new();
    let mut rows_stmt = tx.prepare_cached(
        "SELECT id, destination, source FROM outbox_events NOT INDEXED
          WHERE id > ?1 AND id <= ?2 AND stream_seq IS NULL AND source IS NOT NULL
          ORDER BY id",
    )?;
    let mut rows = rows_stmt.query(params![from, limit])?;
    let mut last = 0;
    while let Some(row) = rows.next()? {
        let id: i64 = row.get(0)?;
        // A row whose destination or source is not text (written by hand) belongs to no
        // stream: the claim dead-letters it as unreadable.
        let (Ok(destination), Ok(source)) = (row.get_ref(1)?.as_str(), row.get_ref(2)?.as_str())
        else {
            continue;
        };
        let at = if streams
            .get(last)
            .is_some_and(|((d, s), _)| d == destination && s == source)
        {
            last
        } else if let Some(at) = streams
            .iter()
            .position(|((d, s), _)| d == destination && s == source)
        {
            at
        } else {
            let high = high_water(tx, destination, source)?;
            streams.push(((destination.to_owned(), source.to_owned()), high));
            streams.len() - 1
        };
        last = at;
        streams[at].1 += 1;
        numbered.push((id, streams[at].1));
    }
    Ok(Some(Plan {
        numbered,
        streams,
        limit,
    }))
}

impl Plan {
    /// The number row `id` takes, if this plan numbers it.
    pub(crate) fn number_of(&self, id: i64) -> Option<i64> {
        self.numbered
            .binary_search_by_key(&id, |(n, _)| *n)
            .ok()
            .map(|at| self.numbered[at].1)
    }

    /// Each stream met, `(destination, source)`, and the last number it now gives.
    pub(crate) fn highs(&self) -> &[((String, String), i64)] {
        &self.streams
    }

    /// Writes the numbers into their rows, except `written` (ascending ids a claim wrote
    /// them into itself), then the streams' high water and `numbered_through`.
    pub(crate) fn write(&self, tx: &Connection, written: &[i64]) -> Result<()> {
        LARGEST_STEP.fetch_max(self.numbered.len(), Ordering::Relaxed);
        let rest: Vec<(i64, i64)> = self
            .numbered
            .iter()
            .filter(|(id, _)| written.binary_search(id).is_err())
            .copied()
            .collect();
        if !rest.is_empty() {
            tx.prepare_cached(
                "UPDATE outbox_events SET stream_seq = n.value ->> 1
                   FROM json_each(?1) AS n
                  WHERE outbox_events.id = n.value ->> 0",
            )?
            .execute([number_pairs(&rest)])?;
        }
        let mut keep = tx.prepare_cached(
            "INSERT INTO outbox_streams (destination, source, high_water) VALUES (?1, ?2, ?3)
             ON CONFLICT (destination, source)
             DO UPDATE SET high_water = max(high_water, excluded.high_water)",
        )?;
        for ((destination, source), high) in &self.streams {
            keep.execute(params![destination, source, high])?;
        }
        tx.prepare_cached(
            "UPDATE outbox_stats SET numbered_through = ?1 WHERE id = 1 AND numbered_through < ?1",
        )?
        .execute([self.limit])?;
        Ok(())
    }
}

/// `(id, number)` pairs as a JSON array of `[id, number]`, for one statement whatever
/// their count.
fn number_pairs(pairs: &[(i64, i64)]) -> String {
    use std::fmt::Write;
    let mut list = String::from("[");
    for (i, (id, number)) in pairs.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "[{id},{number}]");
    }
    list.push(']');
    list
}

/// Numbers the rows not numbered yet with ids up to `limit`.
fn number_through(tx: &Connection, limit: i64) -> Result<()> {
    if let Some(plan) = plan(tx, limit)? {
        plan.write(tx, &[])?;
    }
    Ok(())
}

/// `numbered_through`: every row at or below it is numbered.
pub(crate) fn numbered_from(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT numbered_through FROM outbox_stats WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

/// Numbers every row up to `id`, in transactions of at most [`CATCH_UP_CHUNK`] rows.
/// Outside any transaction of `conn`.
pub(crate) fn number_up_to(conn: &mut Connection, id: i64) -> Result<()> {
    catch_up(conn, CATCH_UP_CHUNK, CATCH_UP_CHUNK)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    number_through(&tx, id)?;
    tx.commit()?;
    Ok(())
}

/// Numbers the rows not numbered yet in transactions of at most `chunk` rows each, until
/// no more than `leave` are left (of those there were when it began). Outside any
/// transaction of `conn`; costs a read when there are no more than `leave`.
pub(crate) fn catch_up(conn: &mut Connection, chunk: i64, leave: i64) -> Result<()> {
    if is_off() {
        return Ok(());
    }
    let (mut through, newest) = unnumbered(conn)?;
    while newest - through > leave {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        through = unnumbered(&tx)?.0;
        if through < newest {
            number_through(&tx, newest.min(through + chunk.max(1)))?;
        }
        through = unnumbered(&tx)?.0;
        tx.commit()?;
    }
    Ok(())
}

/// Numbers every row up to `through` in transactions of at most `step` ids each (what a
/// claim past its numbering bound needs first), each inside what `turn` returns (the
/// relay's right of way: the app's commits waiting go between two steps, not after the
/// last). Outside any transaction of `conn`.
pub(crate) fn catch_up_through<T>(
    conn: &mut Connection,
    through: i64,
    step: i64,
    mut turn: impl FnMut() -> T,
) -> Result<()> {
    if is_off() {
        return Ok(());
    }
    loop {
        let _turn = turn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let from = numbered_from(&tx)?;
        if from >= through {
            return Ok(());
        }
        // Sets `numbered_through` to the step's end whatever it found: each turn moves on.
        number_through(&tx, through.min(from.saturating_add(step.max(1))))?;
        tx.commit()?;
    }
}

/// Records that the numbered rows `gone` (`(destination, source, stream_seq)`) left the file
/// undelivered as `fate` (`coalesced` or `dropped`: the deletes of this crate that take
/// pending rows, which the schema's trigger does not see as finished).
pub(crate) fn record_fates(
    tx: &Connection,
    fate: &str,
    gone: &[(String, Option<String>, Option<i64>)],
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO outbox_fates (destination, source, stream_seq, fate)
         VALUES (?1, COALESCE(?2, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                              '/sqlite-outbox'), ?3, ?4)",
    )?;
    // The schema's trigger took them for lost as they left pending; they have a fate.
    let mut found = tx.prepare_cached(
        "DELETE FROM outbox_lost_numbers
          WHERE destination = ?1
            AND source = COALESCE(?2, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                                  '/sqlite-outbox')
            AND stream_seq = ?3",
    )?;
    for (destination, source, seq) in gone {
        if let Some(seq) = seq {
            insert.execute(params![destination, source, seq, fate])?;
            found.execute(params![destination, source, seq])?;
        }
    }
    Ok(())
}
