//! Ack and write-back: a claim's outcomes written back, fenced by its lease owner
//! (delivered, retried with backoff, released, dead-lettered).

#[allow(unused_imports)]
use super::*;

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
pub(super) const ACK_SQL: &str = concat!(ack_set!(), " WHERE id = ?1 AND lease_owner = ?2");

/// The most rows one listed ack statement marks; a longer ack takes several.
pub(super) const ACK_LIST_LONG: usize = 100;
/// The list of the statements for shorter acks, so that a few rows do not bind a hundred.
const ACK_LIST_SHORT: usize = 10;

/// The two statements of a listed ack, for rows listed in `?4 …`, all claimed by `?2`.
pub(super) struct ListedAck {
    /// How many of the listed rows `?2` still holds.
    pub(super) held: String,
    /// Marks the listed rows delivered at `?3`.
    pub(super) mark: String,
}

/// The listed ack for up to `len` rows. A shorter list pads with NULL, which matches no
/// row, so two pairs of compiled statements (see [`ACK_LIST_SHORT`]) serve every ack from
/// the statement cache.
pub(super) fn listed_ack(len: usize) -> &'static ListedAck {
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
    // A failed write (a full disk) is the caller's to handle, in debug builds too: only
    // what a write that went through marked is checked (it asserted on the failure and
    // panicked the writer, whose outcomes then waited for their leases to end).
    let marked = marked?;
    debug_assert_eq!(marked, chunk.len());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queue::{self, ClaimRequest};
    use crate::{Event, Outbox};

    #[test]
    fn a_listed_ack_whose_write_fails_returns_the_error_in_debug_builds_too() {
        // Issue 67, item 10: a debug assertion on the mark's result panicked the writer when
        // the write failed (a full disk); the failure must come back as an error. A trigger
        // of this connection's fails the mark as a full disk would.
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("ack.db")).unwrap();
        outbox
            .transaction(|tx| {
                for n in 0..3 {
                    let _ = outbox.enqueue(tx, Event::new("t", serde_json::json!(n)))?;
                }
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        let conn = outbox.connection().unwrap();
        let claimed = queue::claim(
            &conn,
            &ClaimRequest {
                destination: "default",
                default_source: "/test",
                owner: "relay-a",
                spare_leases: "",
                now: outbox.now_ms(),
                clock_step_ms: 0,
                lease_ms: 60_000,
                max_bytes: i64::MAX,
                numbering_bound: None,
                min_priority: 0,
                limit: 10,
            },
        )
        .unwrap()
        .events;
        assert_eq!(claimed.len(), 3);
        conn.execute_batch(
            "CREATE TEMP TRIGGER fail_the_mark BEFORE UPDATE OF delivered_at ON outbox_events
             BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END;",
        )
        .unwrap();
        let events: Vec<&OutboundEvent> = claimed.iter().collect();
        let failed = ack(&conn, "relay-a", &events, outbox.now_ms());
        assert!(failed.is_err(), "{failed:?}");
    }
}
