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

use rusqlite::{params, Connection, Transaction, TransactionBehavior};

use crate::error::Result;
use crate::tally;
use crate::transport::OutboundEvent;

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

/// How much later than now a lease may have been taken before it counts as taken under a
/// clock that was ahead: relays that read the clock a moment before another took the
/// write lock, or processes whose clocks differ by a little, must not steal each other's
/// fresh leases (whatever lease length each uses).
pub(crate) const LEASE_CLOCK_SKEW_MS: i64 = 5_000;

/// The inner `SELECT` of [`CLAIM_SQL`]: one priority level's due rows, in due order.
macro_rules! claim_candidates {
    () => {
        concat!(
            "SELECT e.id FROM outbox_events AS e
              WHERE ",
            pending!("e."),
            " AND e.destination = ?4 AND e.priority = ?8 AND e.available_at <= ?3
              AND (e.expires_at IS NULL OR e.expires_at > ?3) AND ",
            lease_claimable!("e.", "?3", "?7"),
            " AND (e.partition_key IS NULL OR NOT EXISTS (
                     SELECT 1 FROM outbox_events AS k
                      WHERE k.partition_key = e.partition_key AND k.destination = e.destination
                        AND k.id < e.id AND ",
            pending!("k."),
            "))
              ORDER BY e.available_at, e.id
              LIMIT CAST(?5 AS INTEGER)"
        )
    };
}

/// Claims due rows of one destination with one `UPDATE … RETURNING`.
///
/// SQLite has one writer at a time, so the statement is atomic: two relays (threads or
/// processes) never both claim a row while its lease is valid. The `NOT EXISTS` keeps a key's
/// events in commit order even for rows that were written without parking (by hand, or by an
/// older version). Dead rows do not block their key, so one poison event stops only itself.
///
/// One priority level's claim: the inner `SELECT` walks the partial index `(destination,
/// priority, available_at, id)` as one range and stops at its first row not yet due or at
/// `limit`, so the cost depends on the due rows, not on how many rows are parked, backing
/// off or delivered (a test pins the query plan). [`claim`] runs it for each level that
/// has due rows, most urgent first.
///
/// Every `LIMIT` here is `LIMIT CAST(?n AS INTEGER)`, never a bare `LIMIT ?n`: SQLite's
/// planner reads a bare bound limit, and a statement whose plan read a bound value is
/// compiled again each time it is bound, which made every claim pay a full prepare.
pub(crate) const CLAIM_SQL: &str = concat!(
    "UPDATE outbox_events
        SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3
      WHERE id IN (",
    claim_candidates!(),
    ")
     RETURNING id, event_id, event_type, COALESCE(source, ?6), subject, partition_key,
               idempotency_key, payload, created_at, attempts, expires_at"
);

/// The rows [`CLAIM_SQL`] takes, selected alone (for a claim that keeps the pending totals
/// with [`tally::around`]).
const CLAIM_CANDIDATES_SQL: &str = claim_candidates!();

/// The ids `sql` selects with `params`, for a write that keeps the pending totals with
/// [`tally::around`]; none (without running it) while the totals cover no row.
fn tallied_candidates(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<i64>> {
    if tally::tallied_through(conn)? == 0 {
        return Ok(Vec::new());
    }
    Ok(conn
        .prepare_cached(sql)?
        .query_map(params, |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
}

/// The priority levels of a destination that have a row due (leased or not), most urgent
/// first: ten seeks into the pending index, one per level, so a claim visits only the
/// levels in use (usually just the default, 5).
pub(crate) const DUE_LEVELS_SQL: &str = concat!(
    "SELECT column1 FROM (VALUES (9), (8), (7), (6), (5), (4), (3), (2), (1), (0)) AS level
      WHERE EXISTS (SELECT 1 FROM outbox_events AS e
                     WHERE ",
    pending!("e."),
    " AND e.destination = ?1 AND e.priority = level.column1 AND e.available_at <= ?2)"
);

/// One event's row for one destination, as [`insert`] writes it.
pub(crate) struct NewRow<'a> {
    pub event_id: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub event_type: &'a str,
    pub source: Option<&'a str>,
    pub subject: Option<&'a str>,
    pub partition_key: Option<&'a str>,
    pub payload: &'a str,
    pub coalesce_key: Option<&'a str>,
    /// 0 (least urgent) to 9 (most urgent).
    pub priority: u8,
    /// Whether a storage limit may drop it (its type's policy is DropOldest).
    pub droppable: bool,
    /// When the event happened (its CloudEvents `time`): `now`, except for a redelivery,
    /// which keeps the original.
    pub created_at: i64,
    /// Its deadline (unix ms), if it has one.
    pub expires_at: Option<i64>,
    pub now: i64,
}

/// Inserts `row` once per destination, parked behind its key's pending head if it has one.
/// Calls `inserted` with each destination that took it; returns whether any did (none did
/// when its idempotency key is already taken everywhere).
///
/// Writes come before reads: SQLite cannot turn a caller's deferred transaction that has
/// only read so far into a writer while another connection writes (`SQLITE_BUSY`), but a
/// first write simply waits for the lock. So the parking check is part of the `INSERT`.
pub(crate) fn insert(
    tx: &Transaction<'_>,
    row: &NewRow<'_>,
    destinations: &[&str],
    mut inserted: impl FnMut(&str),
) -> Result<bool> {
    // The id: SQLite's own choice (the highest in the table plus one), unless rows at the
    // top were deleted (`id_after_deletes`).
    let mut stmt = tx.prepare_cached(concat!(
        "INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type,
             source, subject, partition_key, payload, created_at, available_at, coalesce_key,
             droppable, priority, expires_at)
         VALUES ((",
        id_after_deletes!(),
        "),
                 ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?13, ",
        due_or_parked!("?7", "?2", "", "?9"),
        ", ?10, ?11, ?12, ?14)
         ON CONFLICT DO NOTHING"
    ))?;
    let mut any = false;
    for destination in destinations {
        // ON CONFLICT DO NOTHING: a repeated idempotency key must not abort the caller's
        // transaction the way a constraint error would. Keys are per destination.
        let n = stmt.execute(params![
            row.event_id,
            destination,
            row.idempotency_key,
            row.event_type,
            row.source,
            row.subject,
            row.partition_key,
            row.payload,
            row.now,
            row.coalesce_key,
            row.droppable,
            row.priority,
            row.created_at,
            row.expires_at,
        ])?;
        if n == 1 {
            any = true;
            inserted(destination);
        }
    }
    Ok(any)
}

/// The most rows one `INSERT` of [`insert_run`] writes; a longer run takes several.
const RUN_STATEMENT_LONG: usize = 100;
/// The statement for the rest of a run shorter than [`RUN_STATEMENT_LONG`], ten rows at a
/// time, then one by one: three compiled statements serve every run from the cache.
const RUN_STATEMENT_SHORT: usize = 10;
/// The columns [`insert_run`] binds for each row, in order.
const RUN_COLUMNS: usize = 13;

/// The `INSERT` of `rows` rows (1, [`RUN_STATEMENT_SHORT`] or [`RUN_STATEMENT_LONG`]) of
/// [`insert_run`], each row binding [`RUN_COLUMNS`] parameters.
///
/// `OR FAIL`, as for the listed ack: under the default `OR ABORT` SQLite keeps a statement
/// journal for a statement that writes several rows, and past 64 KiB of changed pages it
/// spills to a temporary file, created and deleted for every call. Nothing these rows
/// hold can break a constraint (their ids are new, they have no idempotency key).
fn insert_run_sql(rows: usize) -> &'static str {
    static SQL: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    let listed = |n: usize| {
        let values: Vec<String> = (0..n)
            .map(|row| {
                let marks: Vec<String> = (1..=RUN_COLUMNS)
                    .map(|column| format!("?{}", row * RUN_COLUMNS + column))
                    .collect();
                format!("({})", marks.join(", "))
            })
            .collect();
        format!(
            "INSERT OR FAIL INTO outbox_events (id, event_id, destination, event_type, source, subject,
                 partition_key, payload, created_at, available_at, droppable, priority,
                 expires_at)
             VALUES {}",
            values.join(", ")
        )
    };
    let [one, short, long] = SQL.get_or_init(|| {
        [
            listed(1),
            listed(RUN_STATEMENT_SHORT),
            listed(RUN_STATEMENT_LONG),
        ]
    });
    match rows {
        RUN_STATEMENT_LONG => long,
        RUN_STATEMENT_SHORT => short,
        _ => one,
    }
}

/// Whether an event of partition key `?1` for destination `?2` is pending.
const KEY_PENDING_SQL: &str = concat!("SELECT ", key_pending!("?1", "?2", ""));

/// Inserts `rows` in order, each `(destination, row)` once, with one `INSERT` per hundred
/// rows: the same rows, ids, parking and columns as [`insert`] called for each in turn.
/// None may have an idempotency key or a coalescing key (those go through [`insert`] and
/// [`coalesce`], one event at a time).
///
/// Each `INSERT` costs SQLite a start and a halt, with a cursor opened and closed on the
/// table and on every index; a row of a listed `INSERT` costs only its own writes. So the
/// checks [`insert`] makes inside its statement are made once for the run instead:
///
/// - The write lock first, with a write that changes nothing, so that the reads below
///   cannot leave a deferred transaction unable to write (see [`insert`]).
/// - The id: the first row takes the high water's next id if rows at the top were deleted
///   (see [`keep_ids_rising`]); every later row then gets SQLite's own choice, the highest
///   id plus one, which is already above it.
/// - Parking: one seek per partition key and destination for the first of its rows; the
///   rows after it in the run park behind it.
///
/// The checks are not written into the `INSERT` itself: a statement that reads the table
/// it inserts into makes SQLite compute every row before writing the first, so a row
/// would not see the rows listed before it.
pub(crate) fn insert_run(tx: &Transaction<'_>, rows: &[(&str, NewRow<'_>)]) -> Result<()> {
    use rusqlite::OptionalExtension;
    if rows.is_empty() {
        return Ok(());
    }
    debug_assert!(rows
        .iter()
        .all(|(_, r)| r.idempotency_key.is_none() && r.coalesce_key.is_none()));
    tx.prepare_cached("UPDATE outbox_stats SET high_water = high_water WHERE 0")?
        .execute([])?;
    let first_id: Option<i64> = tx
        .prepare_cached(id_after_deletes!())?
        .query_row([], |r| r.get(0))
        .optional()?;
    // A set, not a list: a run of many thousand events may hold thousands of keys. Rows of
    // one key often come together, so the last key is checked before the set is hashed.
    let mut keys_seen: std::collections::HashSet<(&str, &str)> = Default::default();
    let mut last_key: Option<(&str, &str)> = None;
    let mut available_at = Vec::with_capacity(rows.len());
    {
        let mut key_pending = tx.prepare_cached(KEY_PENDING_SQL)?;
        for (destination, row) in rows {
            let parked = match row.partition_key {
                None => false,
                Some(key) if last_key == Some((key, destination)) => true,
                Some(key) => {
                    last_key = Some((key, destination));
                    !keys_seen.insert((key, destination))
                        || key_pending.query_row(params![key, destination], |r| r.get(0))?
                }
            };
            available_at.push(if parked { PARKED } else { row.now });
        }
    }
    let mut start = 0;
    while start < rows.len() {
        let left = rows.len() - start;
        let n = [RUN_STATEMENT_LONG, RUN_STATEMENT_SHORT, 1]
            .into_iter()
            .find(|n| *n <= left)
            .unwrap_or(1);
        let mut stmt = tx.prepare_cached(insert_run_sql(n))?;
        for (offset, (destination, row)) in rows[start..start + n].iter().enumerate() {
            let at = start + offset;
            let base = offset * RUN_COLUMNS;
            let id = if at == 0 { first_id } else { None };
            stmt.raw_bind_parameter(base + 1, id)?;
            stmt.raw_bind_parameter(base + 2, row.event_id)?;
            stmt.raw_bind_parameter(base + 3, destination)?;
            stmt.raw_bind_parameter(base + 4, row.event_type)?;
            stmt.raw_bind_parameter(base + 5, row.source)?;
            stmt.raw_bind_parameter(base + 6, row.subject)?;
            stmt.raw_bind_parameter(base + 7, row.partition_key)?;
            stmt.raw_bind_parameter(base + 8, row.payload)?;
            stmt.raw_bind_parameter(base + 9, row.created_at)?;
            stmt.raw_bind_parameter(base + 10, available_at[at])?;
            stmt.raw_bind_parameter(base + 11, row.droppable)?;
            stmt.raw_bind_parameter(base + 12, row.priority)?;
            stmt.raw_bind_parameter(base + 13, row.expires_at)?;
        }
        stmt.raw_execute()?;
        start += n;
    }
    Ok(())
}

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
fn keep_ids_rising(conn: &Connection, highest_deleted: Option<i64>) -> Result<()> {
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

/// The id of the event that holds idempotency `key` for `destination`, if any.
pub(crate) fn idempotency_holder(
    tx: &Transaction<'_>,
    destination: &str,
    key: &str,
) -> Result<Option<String>> {
    use rusqlite::OptionalExtension;
    Ok(tx
        .prepare_cached(
            "SELECT event_id FROM outbox_events WHERE destination = ?1 AND idempotency_key = ?2",
        )?
        .query_row(params![destination, key], |r| r.get(0))
        .optional()?)
}

/// Deletes the pending, unleased rows of `event_type` with coalescing `key` for each of
/// `destinations`: a new event replaces them. Returns how many; counted in `outbox_stats`.
pub(crate) fn coalesce(
    tx: &Transaction<'_>,
    event_type: &str,
    key: &str,
    destinations: &[&str],
    now: i64,
) -> Result<usize> {
    let mut replaced = 0;
    let mut highest_deleted = None;
    let mut delete = tx.prepare_cached(concat!(
        "DELETE FROM outbox_events
          WHERE event_type = ?1 AND coalesce_key = ?2 AND destination = ?3 AND ",
        pending!(""),
        " AND ",
        lease_free!("", "?4"),
        " RETURNING id, partition_key"
    ))?;
    for destination in destinations {
        let gone: Vec<(i64, Option<String>)> = delete
            .query_map(params![event_type, key, destination, now], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        replaced += gone.len();
        highest_deleted = highest_deleted.max(gone.iter().map(|(id, _)| *id).max());
        // A replaced event may have been its key's head.
        for (_, partition_key) in &gone {
            if let Some(partition_key) = partition_key {
                unpark_next(tx, partition_key, destination, now)?;
            }
        }
    }
    drop(delete);
    keep_ids_rising(tx, highest_deleted)?;
    if replaced > 0 {
        tx.prepare_cached("UPDATE outbox_stats SET coalesced = coalesced + ?1 WHERE id = 1")?
            .execute([replaced as i64])?;
    }
    Ok(replaced)
}

/// How much room a storage limit needs.
pub(crate) struct RoomNeeded {
    pub rows: i64,
    pub bytes: i64,
    pub now: i64,
}

/// The pending, unleased rows a storage limit may drop, oldest first (`?1` is now).
const DROPPABLE_OLDEST_SQL: &str = concat!(
    "SELECT id, octet_length(payload) FROM outbox_events INDEXED BY outbox_events_droppable
      WHERE droppable = 1 AND ",
    pending!(""),
    " AND ",
    lease_free!("", "?1"),
    " ORDER BY id"
);

/// Deletes the oldest pending, unleased droppable rows until `need` is met; returns how many,
/// or `None` (and deletes nothing) if all of them together are not enough.
pub(crate) fn drop_oldest(tx: &Transaction<'_>, need: &RoomNeeded) -> Result<Option<usize>> {
    // A walk of the droppable index in id order that stops once there is room: its cost is
    // the rows it drops (plus any leased ones it steps over), not the backlog.
    let mut victims = Vec::new();
    let (mut rows_freed, mut bytes_freed) = (0i64, 0i64);
    {
        let mut stmt = tx.prepare_cached(DROPPABLE_OLDEST_SQL)?;
        let mut rows = stmt.query([need.now])?;
        while rows_freed < need.rows || bytes_freed < need.bytes {
            let Some(row) = rows.next()? else { break };
            victims.push(row.get::<_, i64>(0)?);
            rows_freed += 1;
            bytes_freed += row.get::<_, i64>(1)?;
        }
    }
    if rows_freed < need.rows || bytes_freed < need.bytes {
        return Ok(None);
    }
    let mut delete = tx.prepare_cached(
        "DELETE FROM outbox_events WHERE id = ?1 RETURNING partition_key, destination",
    )?;
    let mut heads = Vec::new();
    for id in &victims {
        let (key, destination): (Option<String>, String) =
            delete.query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if let Some(key) = key {
            heads.push((key, destination));
        }
    }
    drop(delete);
    keep_ids_rising(tx, victims.iter().copied().max())?;
    // A dropped event may have been its key's head.
    for (key, destination) in heads {
        unpark_next(tx, &key, &destination, need.now)?;
    }
    tx.prepare_cached("UPDATE outbox_stats SET dropped = dropped + ?1 WHERE id = 1")?
        .execute([victims.len() as i64])?;
    Ok(Some(victims.len()))
}

/// One claim: up to `limit` due rows of `destination`, leased to `owner` until
/// `now + lease_ms`.
pub(crate) struct ClaimRequest<'a> {
    pub destination: &'a str,
    pub default_source: &'a str,
    pub owner: &'a str,
    pub now: i64,
    pub lease_ms: i64,
    pub limit: i64,
}

/// A claimed row that could not be read as an event (a BLOB payload, a REAL time, text that
/// is not UTF-8: written by hand or by another program). The claim dead-letters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    pub id: i64,
    pub error: String,
}

/// What one claim took: the events to deliver, in commit order, and the rows it found
/// unreadable and dead-lettered instead.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub events: Vec<OutboundEvent>,
    pub unreadable: Vec<Unreadable>,
}

impl Claimed {
    /// Whether the claim took no row at all (and so wrote nothing).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.unreadable.is_empty()
    }
}

/// Runs the claim. Rows are decoded one by one, so one unreadable row costs only itself:
/// it is dead-lettered (fenced by this claim's lease) with the decoding error kept, and the
/// rest of the batch goes out.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest<'_>) -> Result<Claimed> {
    let mut claimed = Claimed::default();
    let through = tally::tallied_through(conn)?;
    let takes_over = tally::claim_may_take_over(conn, through, req.destination, req.now)?;
    // The levels are read one at a time, and reading stops once the claim is full: with a
    // backlog at the default priority the levels below it are never even looked at.
    let mut probe = conn.prepare_cached(DUE_LEVELS_SQL)?;
    let mut levels = probe.query(params![req.destination, req.now])?;
    while let Some(row) = levels.next()? {
        let level: i64 = row.get(0)?;
        let taken = claimed.events.len() + claimed.unreadable.len();
        let left = req.limit - taken as i64;
        if left <= 0 {
            break;
        }
        let first = claimed.events.len();
        claim_level(conn, req, level, left, takes_over, &mut claimed)?;
        // RETURNING order is unspecified; hand a level's events to workers oldest first.
        claimed.events[first..].sort_unstable_by_key(|e| e.id);
        if claimed.events.len() + claimed.unreadable.len() >= req.limit as usize {
            break;
        }
    }
    drop(levels);
    drop(probe);
    if !takes_over {
        let lease = tally::Leased {
            through,
            destination: req.destination,
            owner: req.owner,
            expires_at: req.now.saturating_add(req.lease_ms),
            now: req.now,
        };
        let ids = claimed.events.iter().map(|e| e.id);
        tally::leased(
            conn,
            &lease,
            ids.chain(claimed.unreadable.iter().map(|u| u.id)),
        )?;
    }
    for row in &claimed.unreadable {
        tally::around(conn, &[row.id], || {
            dead_letter_unreadable(conn, row, req.owner, req.now)
        })?;
    }
    Ok(claimed)
}

/// Claims up to `limit` due rows of priority `level` into `claimed`; inside
/// [`tally::around`] if it `takes_over` tallied leases.
fn claim_level(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    level: i64,
    limit: i64,
    takes_over: bool,
    claimed: &mut Claimed,
) -> Result<()> {
    let lease = Lease {
        destination: req.destination,
        owner: req.owner,
        expires_at: req.now.saturating_add(req.lease_ms),
    };
    let params = params![
        req.owner,
        lease.expires_at,
        req.now,
        req.destination,
        limit,
        req.default_source,
        req.now.saturating_add(LEASE_CLOCK_SKEW_MS),
        level,
    ];
    if takes_over {
        let ids = tallied_candidates(conn, CLAIM_CANDIDATES_SQL, params)?;
        return tally::around(conn, &ids, || {
            claim_level_rows(conn, &lease, params, claimed)
        });
    }
    claim_level_rows(conn, &lease, params, claimed)
}

/// Runs [`CLAIM_SQL`] with `params`, decoding the rows it took into `claimed`.
fn claim_level_rows(
    conn: &Connection,
    lease: &Lease<'_>,
    params: &[&dyn rusqlite::ToSql],
    claimed: &mut Claimed,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(CLAIM_SQL)?;
    let rows = stmt.query_map(params, |r| {
        // The row id is an INTEGER PRIMARY KEY: always readable.
        let id: i64 = r.get(0)?;
        Ok(decode_event(r, lease).map_err(|e| Unreadable {
            id,
            error: format!("unreadable row: {e}"),
        }))
    })?;
    for row in rows {
        match row? {
            Ok(event) => claimed.events.push(event),
            Err(unreadable) => claimed.unreadable.push(unreadable),
        }
    }
    Ok(())
}

/// The lease a claim writes, which every row it returns carries: known before the claim,
/// so not read back from each row.
struct Lease<'a> {
    destination: &'a str,
    owner: &'a str,
    expires_at: i64,
}

/// Reads one row of the claim's `RETURNING` list (what the claim did not write itself).
fn decode_event(r: &rusqlite::Row<'_>, lease: &Lease<'_>) -> rusqlite::Result<OutboundEvent> {
    Ok(OutboundEvent {
        id: r.get(0)?,
        event_id: r.get(1)?,
        destination: lease.destination.to_string(),
        event_type: r.get(2)?,
        source: r.get(3)?,
        subject: r.get(4)?,
        partition_key: r.get(5)?,
        idempotency_key: r.get(6)?,
        payload: r.get(7)?,
        created_at: r.get(8)?,
        attempts: r.get(9)?,
        lease_owner: lease.owner.to_string(),
        lease_expires_at: lease.expires_at,
        expires_at: r.get(10)?,
    })
}

/// Dead-letters a claimed row that could not be read, and lets its key's next event go
/// (found in SQL, since the row's own key may be what is unreadable).
fn dead_letter_unreadable(
    conn: &Connection,
    row: &Unreadable,
    owner: &str,
    now: i64,
) -> Result<()> {
    let changed = conn
        .prepare_cached(
            "UPDATE outbox_events
                SET dead_at = ?3, last_error = ?4, last_attempted_at = ?3,
                    lease_owner = NULL, lease_expires_at = NULL
              WHERE id = ?1 AND lease_owner = ?2",
        )?
        .execute(params![row.id, owner, now, row.error])?;
    if changed == 1 {
        conn.prepare_cached(concat!(
            "UPDATE outbox_events SET available_at = ?2
              WHERE available_at = ",
            parked!(),
            " AND id = (
                    SELECT MIN(k.id) FROM outbox_events AS k, outbox_events AS d
                     WHERE d.id = ?1 AND k.partition_key = d.partition_key
                       AND k.destination = d.destination AND ",
            pending!("k."),
            ")"
        ))?
        .execute(params![row.id, now])?;
    }
    Ok(())
}

/// Re-anchors rows of `destination` whose due time was written while the clock was ahead:
/// a row whose anchor (its last attempt, or its commit for a fresh row) lies after `now`
/// keeps the wait it was given, counted from `now` instead. A fresh row is due at once; a
/// retry scheduled 5 minutes after an attempt "tomorrow" is due 5 minutes from now. Returns
/// how many rows moved. Walks only rows not yet due (the pending index), so the writer runs
/// it at start and when it sees the clock jump, not on every turn.
pub(crate) fn reanchor_future(conn: &Connection, destination: &str, now: i64) -> Result<usize> {
    Ok(conn
        .prepare_cached(REANCHOR_SQL)?
        .execute(params![destination, now])?)
}

/// [`reanchor_future`]'s statement, `?1` the destination and `?2` now. It runs under the
/// write lock at every relay start, so it seeks the rows due after now instead of walking
/// the destination's backlog: the pending index orders by priority before due time, so
/// only `priority IN (…)` (every level, as the column's CHECK allows) lets the due-time
/// bound narrow it. Without it, 2M pending rows held the lock 160 ms and an app's commit
/// from another process waited 130 to 230 ms at each relay start.
const REANCHOR_SQL: &str = concat!(
    "UPDATE outbox_events
        SET available_at = ?2 + MAX(0, available_at - COALESCE(last_attempted_at, created_at))
      WHERE destination = ?1 AND priority IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) AND ",
    pending!(""),
    " AND available_at > ?2 AND available_at < ",
    parked!(),
    " AND COALESCE(last_attempted_at, created_at) > ?2"
);

/// What to record for one claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteBack {
    /// The receiver accepted it.
    Delivered,
    /// A failure that spends an attempt: try again at `available_at`.
    Retry { available_at: i64, error: String },
    /// Give up: keep the error for the operator.
    Dead { error: String },
    /// Hand the row back without spending an attempt (destination unreachable, shutdown),
    /// due again at `available_at` if given (else when it was due).
    Release {
        error: Option<String>,
        available_at: Option<i64>,
    },
}

/// What an ack writes on a row `owner` (`?2`) still holds, at `?3` (now).
///
/// `OR FAIL`: nothing an ack writes can break a constraint (the columns it sets are
/// nullable but for `attempts`, which it only raises), and with the default `OR ABORT`
/// SQLite keeps a statement journal for every statement that changes several rows, so that
/// it could undo them; past 64 KiB that journal spills to a temporary file, and acks of
/// 100 rows opened and deleted one for almost every statement (`strace -c`: 162 files in
/// 200 acks).
macro_rules! ack_set {
    () => {
        "UPDATE OR FAIL outbox_events
            SET delivered_at = ?3, last_attempted_at = ?3, attempts = attempts + 1,
                lease_owner = NULL, lease_expires_at = NULL"
    };
}

/// Marks one row (`?1`) delivered if `owner` still holds its lease; see [`ack`].
const ACK_SQL: &str = concat!(ack_set!(), " WHERE id = ?1 AND lease_owner = ?2");

/// The most rows one listed ack statement marks; a longer ack takes several.
const ACK_LIST_LONG: usize = 100;
/// The list of the statements for shorter acks, so that a few rows do not bind a hundred.
const ACK_LIST_SHORT: usize = 10;

/// The two statements of a listed ack, for rows listed in `?4 …`, all claimed by `?2`.
struct ListedAck {
    /// How many of the listed rows `?2` still holds.
    held: String,
    /// Marks the listed rows delivered at `?3`.
    mark: String,
}

/// The listed ack for up to `len` rows. A shorter list pads with NULL, which matches no
/// row, so two pairs of compiled statements (see [`ACK_LIST_SHORT`]) serve every ack from
/// the statement cache.
fn listed_ack(len: usize) -> &'static ListedAck {
    static LISTED: std::sync::OnceLock<[ListedAck; 2]> = std::sync::OnceLock::new();
    let listed = |n: usize| {
        let marks: Vec<String> = (4..4 + n).map(|i| format!("?{i}")).collect();
        let rows = format!("WHERE id IN ({}) AND lease_owner = ?2", marks.join(", "));
        ListedAck {
            held: format!("SELECT COUNT(*) FROM outbox_events {rows}"),
            mark: format!("{} {rows}", ack_set!()),
        }
    };
    let [short, long] = LISTED.get_or_init(|| [listed(ACK_LIST_SHORT), listed(ACK_LIST_LONG)]);
    if len <= ACK_LIST_SHORT {
        short
    } else {
        long
    }
}

/// Marks `events`, all claimed by `owner`, delivered and unparks the next event of each of
/// their keys; returns, per event, whether `owner` still held its lease (the others were
/// taken over and are left alone). Runs inside the caller's write transaction.
///
/// One statement per hundred rows, which lists their ids (`id IN (?4, ?5, …)`). Each
/// statement costs SQLite a start and a halt, with a cursor opened and closed on the table
/// and on each index the ack changes; listed, a row costs only its seek and its writes.
/// `valgrind --tool=callgrind target/release/examples/bench probe-claim outbox` counted
/// claim + ack of batches of 100 at 47.0k instructions a row with a statement per row,
/// 41.2k listed (with the count below); the same list read from a JSON array (`id IN
/// (SELECT value FROM json_each(?))`) cost 1.8k a row more, and with `RETURNING id` to
/// learn which rows it marked (an earlier form) it was slower than a statement per row.
///
/// The fence stays exact: a count of the listed rows `owner` still holds comes first
/// (inside the transaction, so nothing changes between the two), and only if it holds them
/// all are they marked in one statement; if a lease was taken over, or an id is listed
/// twice, the rows are acked one by one, each telling whether it was still ours. The count
/// reads the pages the statement then writes: over 8 alternating runs its cost did not
/// show. The owner and the time are bound once per statement: bound per row, SQLite copied
/// the owner's text into a fresh allocation for every row.
pub(crate) fn ack(
    conn: &Connection,
    owner: &str,
    events: &[&OutboundEvent],
    now: i64,
) -> Result<Vec<bool>> {
    let mut acked = Vec::with_capacity(events.len());
    for chunk in events.chunks(ACK_LIST_LONG) {
        if chunk.len() > 1 && ack_listed(conn, owner, chunk, now)? {
            acked.extend(std::iter::repeat_n(true, chunk.len()));
        } else {
            acked.extend(ack_each(conn, owner, chunk, now)?);
        }
    }
    // One claim is for one destination, so this is one totals statement per ack in practice.
    let mut by_destination: Vec<(&str, i64)> = Vec::new();
    for (event, _) in events.iter().zip(&acked).filter(|(_, acked)| **acked) {
        if let Some(key) = &event.partition_key {
            unpark_next(conn, key, &event.destination, now)?;
        }
        match by_destination
            .iter_mut()
            .find(|(d, _)| *d == event.destination)
        {
            Some((_, n)) => *n += 1,
            None => by_destination.push((&event.destination, 1)),
        }
    }
    for (destination, n) in by_destination {
        add_delivered(conn, destination, n)?;
    }
    Ok(acked)
}

/// Acks `chunk` (at most [`ACK_LIST_LONG`] rows) with one listed statement if `owner` still
/// holds every one of them; otherwise changes nothing and returns false.
fn ack_listed(conn: &Connection, owner: &str, chunk: &[&OutboundEvent], now: i64) -> Result<bool> {
    let sql = listed_ack(chunk.len());
    let mut held = conn.prepare_cached(&sql.held)?;
    bind_listed(&mut held, owner, chunk)?;
    let count: i64 = {
        let mut rows = held.raw_query();
        match rows.next()? {
            Some(row) => row.get(0)?,
            None => 0,
        }
    };
    // The cached statements keep their bindings: clear the owner's text off them.
    held.clear_bindings();
    if count != chunk.len() as i64 {
        return Ok(false);
    }
    let mut mark = conn.prepare_cached(&sql.mark)?;
    bind_listed(&mut mark, owner, chunk)?;
    mark.raw_bind_parameter(3, now)?;
    let marked = mark.raw_execute();
    mark.clear_bindings();
    debug_assert_eq!(marked.as_ref().ok(), Some(&chunk.len()));
    marked?;
    Ok(true)
}

/// Binds `owner` (`?2`) and the ids of `chunk` (`?4 …`, NULL past its end) to a listed
/// ack statement.
fn bind_listed(
    stmt: &mut rusqlite::CachedStatement<'_>,
    owner: &str,
    chunk: &[&OutboundEvent],
) -> Result<()> {
    stmt.raw_bind_parameter(2, owner)?;
    let slots = stmt.parameter_count() - 3;
    for slot in 0..slots {
        match chunk.get(slot) {
            Some(event) => stmt.raw_bind_parameter(4 + slot, event.id)?,
            None => stmt.raw_bind_parameter(4 + slot, rusqlite::types::Null)?,
        }
    }
    Ok(())
}

/// Acks `chunk` a row at a time; returns, per event, whether `owner` still held its lease.
fn ack_each(
    conn: &Connection,
    owner: &str,
    chunk: &[&OutboundEvent],
    now: i64,
) -> Result<Vec<bool>> {
    let mut stmt = conn.prepare_cached(ACK_SQL)?;
    stmt.raw_bind_parameter(2, owner)?;
    stmt.raw_bind_parameter(3, now)?;
    let mut acked = Vec::with_capacity(chunk.len());
    for event in chunk {
        stmt.raw_bind_parameter(1, event.id)?;
        acked.push(stmt.raw_execute()? == 1);
    }
    // The cached statement keeps its bindings: clear the owner's text off it.
    stmt.clear_bindings();
    Ok(acked)
}

/// Row ids as a JSON array, for `id IN (SELECT value FROM json_each(?))`: one statement for
/// a whole batch, whatever its size.
pub(crate) fn json_ids(ids: impl Iterator<Item = i64>) -> String {
    let list: Vec<String> = ids.map(|id| id.to_string()).collect();
    format!("[{}]", list.join(","))
}

/// Keeps `outbox_delivered_totals`, so stats never count delivered history. (Rows marked
/// delivered by hand are not counted; their pruning cannot take a total below zero.)
fn add_delivered(conn: &Connection, destination: &str, n: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO outbox_delivered_totals (destination, delivered) VALUES (?1, MAX(0, ?2))
         ON CONFLICT (destination) DO UPDATE SET delivered = MAX(0, delivered + ?2)",
    )?
    .execute(params![destination, n])?;
    Ok(())
}

/// Records `write_back` for `event` if, and only if, its claim still holds the lease; a row
/// that leaves pending (dead) lets its key's next event go. Returns whether it was recorded.
pub(crate) fn write_back(
    conn: &Connection,
    event: &OutboundEvent,
    now: i64,
    write_back: &WriteBack,
) -> Result<bool> {
    let (id, owner) = (event.id, &event.lease_owner);
    let changed = match write_back {
        WriteBack::Delivered => return Ok(ack(conn, owner, &[event], now)? == [true]),
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
        WriteBack::Release {
            error,
            available_at,
        } => conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET last_error = COALESCE(?3, last_error),
                        available_at = COALESCE(?4, available_at),
                        lease_owner = NULL, lease_expires_at = NULL
                  WHERE id = ?1 AND lease_owner = ?2",
            )?
            .execute(params![id, owner, error, available_at])?,
    };
    let recorded = changed == 1;
    if let (true, WriteBack::Dead { .. }, Some(key)) = (recorded, write_back, &event.partition_key)
    {
        unpark_next(conn, key, &event.destination, now)?;
    }
    Ok(recorded)
}

/// Records many outcomes (call inside one transaction); returns, per outcome, whether its
/// lease was still held. Deliveries of one claim go through [`ack`] together: the common
/// case, and the hot path.
pub(crate) fn record(
    conn: &Connection,
    outcomes: &[(&OutboundEvent, &WriteBack)],
    now: i64,
) -> Result<Vec<bool>> {
    let ids: Vec<i64> = outcomes.iter().map(|(e, _)| e.id).collect();
    // Rows it marked delivered left pending: only the others are read again for the totals.
    let still_pending = |recorded: &Vec<bool>| {
        outcomes
            .iter()
            .zip(recorded)
            .filter(|((_, w), done)| !(**done && **w == WriteBack::Delivered))
            .map(|((e, _), _)| e.id)
            .collect()
    };
    tally::around_then(
        conn,
        &ids,
        || record_untallied(conn, outcomes, now),
        still_pending,
    )
}

/// [`record`], leaving the pending totals to it.
fn record_untallied(
    conn: &Connection,
    outcomes: &[(&OutboundEvent, &WriteBack)],
    now: i64,
) -> Result<Vec<bool>> {
    let mut recorded = vec![false; outcomes.len()];
    let mut i = 0;
    while i < outcomes.len() {
        let (event, write_back) = outcomes[i];
        if *write_back != WriteBack::Delivered {
            recorded[i] = self::write_back(conn, event, now, write_back)?;
            i += 1;
            continue;
        }
        let owner = &event.lease_owner;
        let end = outcomes[i..]
            .iter()
            .position(|(e, w)| **w != WriteBack::Delivered || e.lease_owner != *owner)
            .map_or(outcomes.len(), |n| i + n);
        let events: Vec<&OutboundEvent> = outcomes[i..end].iter().map(|(e, _)| *e).collect();
        let acked = ack(conn, owner, &events, now)?;
        recorded[i..end].copy_from_slice(&acked);
        i = end;
    }
    Ok(recorded)
}

/// Whether some pending row's deadline has passed: one seek in the expiring index, a read,
/// so that an idle relay's sweep never takes the write lock for nothing.
pub(crate) fn any_past_deadline(conn: &Connection, now: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT EXISTS (SELECT 1 FROM outbox_events INDEXED BY outbox_events_expiring
                             WHERE expires_at IS NOT NULL AND expires_at <= ?1 AND ",
            pending!(""),
            ")"
        ))?
        .query_row([now], |r| r.get(0))?)
}

/// One row the expiry sweep took out of pending.
pub(crate) struct ExpiredRow {
    pub event_id: String,
    pub destination: String,
    pub event_type: String,
}

/// The rows [`EXPIRE_SQL`] takes (`?1` now, `?2` the limit, `?3` the latest lease time that
/// holds).
macro_rules! expire_candidates {
    () => {
        concat!(
            "SELECT e.id FROM outbox_events AS e INDEXED BY outbox_events_expiring
              WHERE e.expires_at IS NOT NULL AND e.expires_at <= ?1 AND ",
            pending!("e."),
            " AND ",
            lease_claimable!("e.", "?1", "?3"),
            // In index order, so that selected alone it finds the rows the update takes.
            " ORDER BY e.expires_at, e.id LIMIT CAST(?2 AS INTEGER)"
        )
    };
}

/// Expires due rows; see [`expire`].
const EXPIRE_SQL: &str = concat!(
    "UPDATE outbox_events
        SET dead_at = ?1, expired_at = ?1, lease_owner = NULL, lease_expires_at = NULL,
            last_error = 'expired: not delivered by its deadline'
      WHERE id IN (",
    expire_candidates!(),
    ")
     RETURNING event_id, destination, event_type, partition_key"
);

/// Marks up to `limit` pending rows whose deadline is past as expired, except rows leased
/// to a relay right now (a delivery in flight is never expired under it), unparks each
/// one's key, and counts them. Walks the expiring index only.
pub(crate) fn expire(conn: &Connection, now: i64, limit: i64) -> Result<Vec<ExpiredRow>> {
    let params = params![now, limit, now.saturating_add(LEASE_CLOCK_SKEW_MS)];
    let ids = tallied_candidates(conn, expire_candidates!(), params)?;
    let rows = tally::around(conn, &ids, || {
        Ok(conn
            .prepare_cached(EXPIRE_SQL)?
            .query_map(params, |r| {
                Ok((
                    ExpiredRow {
                        event_id: r.get(0)?,
                        destination: r.get(1)?,
                        event_type: r.get(2)?,
                    },
                    r.get::<_, Option<String>>(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for (row, key) in &rows {
        if let Some(key) = key {
            unpark_next(conn, key, &row.destination, now)?;
        }
    }
    if !rows.is_empty() {
        conn.prepare_cached("UPDATE outbox_stats SET expired = expired + ?1 WHERE id = 1")?
            .execute([rows.len() as i64])?;
    }
    Ok(rows.into_iter().map(|(row, _)| row).collect())
}

/// Leases up to `limit` pending rows of `destination`, oldest first (parked ones too: a
/// bundle keeps a key's order by itself), for an export: the lease keeps relays off them
/// while the file is written.
pub(crate) fn lease_for_export(
    conn: &Connection,
    destination: &str,
    owner: &str,
    now: i64,
    lease_ms: i64,
    limit: i64,
    default_source: &str,
) -> Result<Vec<crate::transport::OutboundEvent>> {
    // The rows first, then the lease on them, inside `tally::around`: an export may take
    // over leases that ran out, which the pending totals must see leave.
    let ids: Vec<i64> = conn
        .prepare_cached(concat!(
            "SELECT e.id FROM outbox_events AS e INDEXED BY outbox_events_pending
              WHERE ",
            pending!("e."),
            " AND e.destination = ?1 AND ",
            lease_claimable!("e.", "?2", "?3"),
            // Per-key order: not while an older pending row of its key stays behind (its
            // lease held by a relay, in flight or left by a crash), else the bundle would
            // deliver the key's successors before its head. The rows taken are the oldest,
            // so an older claimable row of the key is in the bundle too.
            " AND (e.partition_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM outbox_events AS k
                 WHERE k.partition_key = e.partition_key AND k.destination = e.destination
                   AND k.id < e.id AND ",
            pending!("k."),
            // (COALESCE: a lease with no leased_at still holds.)
            " AND NOT COALESCE(",
            lease_claimable!("k.", "?2", "?3"),
            ", 0)))",
            " ORDER BY e.id LIMIT CAST(?4 AS INTEGER)"
        ))?
        .query_map(
            params![
                destination,
                now,
                now.saturating_add(LEASE_CLOCK_SKEW_MS),
                limit
            ],
            |r| r.get(0),
        )?
        .collect::<rusqlite::Result<_>>()?;
    let lease = Lease {
        destination,
        owner,
        expires_at: now.saturating_add(lease_ms),
    };
    let mut events = tally::around(conn, &ids, || {
        Ok(conn
            .prepare_cached(
                "UPDATE outbox_events SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3
                  WHERE id IN (SELECT value FROM json_each(?4))
                 RETURNING id, event_id, event_type, COALESCE(source, ?5), subject, partition_key,
                           idempotency_key, payload, created_at, attempts, expires_at",
            )?
            .query_map(
                params![
                    owner,
                    lease.expires_at,
                    now,
                    json_ids(ids.iter().copied()),
                    default_source
                ],
                |r| decode_event(r, &lease),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    events.sort_unstable_by_key(|e| e.id);
    Ok(events)
}

/// Marks rows leased by `owner` as exported (fenced by the lease), unparking their keys;
/// returns how many.
pub(crate) fn mark_exported(
    conn: &Connection,
    owner: &str,
    ids: &[i64],
    now: i64,
) -> Result<usize> {
    let list = json_ids(ids.iter().copied());
    let rows = tally::around(conn, ids, || {
        Ok(conn
            .prepare_cached(
                "UPDATE outbox_events
                    SET dead_at = ?3, exported_at = ?3, lease_owner = NULL, lease_expires_at = NULL
                  WHERE id IN (SELECT value FROM json_each(?1)) AND lease_owner = ?2
                 RETURNING partition_key, destination",
            )?
            .query_map(params![list, owner, now], |r| {
                Ok((r.get::<_, Option<String>>(0)?, r.get::<_, String>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for (key, destination) in &rows {
        if let Some(key) = key {
            unpark_next(conn, key, destination, now)?;
        }
    }
    Ok(rows.len())
}

/// Hands back rows `ids` leased by `owner` (an export that failed): pending as before.
pub(crate) fn release_export(conn: &Connection, owner: &str, ids: &[i64]) -> Result<()> {
    let list = json_ids(ids.iter().copied());
    tally::around(conn, ids, || {
        conn.prepare_cached(
            "UPDATE outbox_events SET lease_owner = NULL, lease_expires_at = NULL
              WHERE id IN (SELECT value FROM json_each(?1)) AND lease_owner = ?2",
        )?
        .execute(params![list, owner])?;
        Ok(())
    })
}

/// Makes the oldest pending event of `key` due if it is parked: called whenever a key's head
/// leaves pending (delivered, dead-lettered, dropped, replaced).
fn unpark_next(conn: &Connection, key: &str, destination: &str, now: i64) -> Result<()> {
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

/// The reset of an operator's retry: a fresh attempt budget, due now, or parked if an older
/// event of its key is still pending (so retrying cannot break the key's order).
macro_rules! retry_reset {
    () => {
        concat!(
            "SET dead_at = NULL, attempts = 0, available_at = ",
            due_or_parked!(
                "outbox_events.partition_key",
                "outbox_events.destination",
                " AND k.id < outbox_events.id",
                "?2"
            )
        )
    };
}

/// Resets every undelivered row of `event_id` for an operator's retry; returns how many.
pub(crate) fn retry_event(tx: &Transaction<'_>, event_id: &str, now: i64) -> Result<usize> {
    let ids: Vec<i64> = tx
        .prepare_cached(
            "SELECT id FROM outbox_events WHERE event_id = ?1 AND delivered_at IS NULL
                AND expired_at IS NULL AND exported_at IS NULL",
        )?
        .query_map([event_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    tally::around(tx, &ids, || {
        Ok(tx
            .prepare_cached(concat!(
                "UPDATE outbox_events ",
                retry_reset!(),
                // Pending or dead only: an expired event is past its deadline, an exported
                // one travels in a bundle; neither is sent again.
                " WHERE event_id = ?1 AND delivered_at IS NULL
                    AND expired_at IS NULL AND exported_at IS NULL"
            ))?
            .execute(params![event_id, now])?)
    })
}

/// Resets one dead row (by row id) for an operator's retry; returns how many (0 or 1).
pub(crate) fn retry_row(tx: &Transaction<'_>, id: i64, now: i64) -> Result<usize> {
    tally::around(tx, &[id], || {
        Ok(tx
            .prepare_cached(concat!(
                "UPDATE outbox_events ",
                retry_reset!(),
                " WHERE id = ?1"
            ))?
            .execute(params![id, now])?)
    })
}

/// One page of the dead rows committed in `[since, until)`: at most `limit` of them in the
/// dead index's order, after the row `after` (`(dead_at, id)`, `None` for the first page),
/// as `(dead_at, row id, event type)`.
pub(crate) fn dead_rows_page(
    tx: &Transaction<'_>,
    since: i64,
    until: i64,
    after: Option<(i64, i64)>,
    limit: usize,
) -> Result<Vec<(i64, i64, String)>> {
    let (after_dead_at, after_id) = after.unwrap_or((i64::MIN, i64::MIN));
    Ok(tx
        .prepare_cached(concat!(
            "SELECT dead_at, id, event_type FROM outbox_events INDEXED BY outbox_events_dead WHERE ",
            dead!(),
            " AND created_at >= ?1 AND created_at < ?2 AND (dead_at, id) > (?3, ?4)
             ORDER BY dead_at, id LIMIT ?5"
        ))?
        .query_map(
            params![since, until, after_dead_at, after_id, limit as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?
        .collect::<rusqlite::Result<_>>()?)
}

/// Which finished rows a page deletes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Finished {
    /// Delivered before the cutoff (unix ms).
    DeliveredBefore(i64),
    /// Dead at or before the cutoff (unix ms).
    DeadSince(i64),
    /// Expired or exported before the cutoff (unix ms): finished like a delivered row.
    SettledBefore(i64),
}

/// Deletes one page of finished rows in its own transaction; returns how many (fewer than
/// [`DELETE_PAGE_ROWS`] means there are no more). Never touches pending rows.
pub(crate) fn delete_page(conn: &mut Connection, which: Finished) -> Result<usize> {
    let (sql, cutoff) = match which {
        Finished::DeliveredBefore(cutoff) => (
            "DELETE FROM outbox_events WHERE id IN (
                 SELECT id FROM outbox_events INDEXED BY outbox_events_delivered
                  WHERE delivered_at IS NOT NULL AND delivered_at < ?1 LIMIT CAST(?2 AS INTEGER))
             RETURNING destination, delivered_at IS NOT NULL, id",
            cutoff,
        ),
        Finished::SettledBefore(cutoff) => (
            "DELETE FROM outbox_events WHERE id IN (
                 SELECT id FROM outbox_events INDEXED BY outbox_events_dead
                  WHERE dead_at IS NOT NULL AND delivered_at IS NULL
                    AND (expired_at IS NOT NULL OR exported_at IS NOT NULL)
                    AND dead_at < ?1 LIMIT CAST(?2 AS INTEGER))
             RETURNING destination, 0, id",
            cutoff,
        ),
        Finished::DeadSince(cutoff) => (
            concat!(
                "DELETE FROM outbox_events WHERE id IN (
                     SELECT id FROM outbox_events INDEXED BY outbox_events_dead WHERE ",
                dead!(),
                " AND dead_at <= ?1 LIMIT CAST(?2 AS INTEGER)) RETURNING destination, 0, id"
            ),
            cutoff,
        ),
    };
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let gone: Vec<(String, bool, i64)> = tx
        .prepare_cached(sql)?
        .query_map(params![cutoff, DELETE_PAGE_ROWS as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    keep_ids_rising(&tx, gone.iter().map(|(_, _, id)| *id).max())?;
    let mut pruned: Vec<(&str, i64)> = Vec::new();
    for (destination, _, _) in gone.iter().filter(|(_, delivered, _)| *delivered) {
        match pruned.iter_mut().find(|(d, _)| d == destination) {
            Some((_, n)) => *n += 1,
            None => pruned.push((destination, 1)),
        }
    }
    for (destination, n) in pruned {
        add_delivered(&tx, destination, -n)?;
    }
    tx.commit()?;
    Ok(gone.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database;

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
            now,
            lease_ms: 1_000,
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
        assert_eq!(got[0].source, "/test");
        // Leased rows are not claimable by anyone else while the lease holds.
        assert!(claim_events(&conn, &req("r2", 500, 10)).is_empty());
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
            assert!(error.starts_with("unreadable row: "), "{error}");
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
            assert_eq!(expire(&conn, round, limit).unwrap().len(), 0);
            delete_page(&mut conn, Finished::DeliveredBefore(round)).unwrap();
        }
        let (short, long) = (listed_ack(2), listed_ack(ACK_LIST_LONG));
        for sql in [CLAIM_SQL, DUE_LEVELS_SQL, ACK_SQL, EXPIRE_SQL]
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
            .query_map([0], |r| r.get(3))
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
                .query_map(params![0, 10, 5_000], |r| r.get(3))
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
            .prepare(&format!("EXPLAIN QUERY PLAN {CLAIM_SQL}"))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map(params!["o", 0, 0, "default", 10, "/s", 5_000, 5], |r| {
                r.get(3)
            })
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
            now: 1,
        }
    }
}
