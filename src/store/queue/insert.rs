//! Insert: a new row, a run of rows in one statement, the idempotency and coalescing checks,
//! and the room a storage limit makes (drop oldest).

#[allow(unused_imports)]
use super::*;

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
    /// W3C trace context of the work that wrote it, and its CloudEvents `dataschema`.
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub dataschema: Option<&'a str>,
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
    tx: &Connection,
    row: &NewRow<'_>,
    destinations: &[&str],
    mut inserted: impl FnMut(&str),
) -> Result<bool> {
    // The id: SQLite's own choice (the highest in the table plus one), unless rows at the
    // top were deleted (`id_after_deletes`). No stream number: the relay numbers rows as it
    // takes them (see `numbering`). The text is kept without its line breaks and indents:
    // rusqlite's statement cache hashes the whole text at every take and every return.
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        compact_sql(concat!(
            "INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type,
                 source, subject, partition_key, payload, created_at, available_at,
                 coalesce_key, droppable, priority, expires_at, traceparent, tracestate,
                 dataschema)
             VALUES ((",
            id_after_deletes!(),
            "),
                     ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?13, ",
            due_or_parked!("?7", "?2", "", "?9"),
            ", ?10, ?11, ?12, ?14, ?15, ?16, ?17) ON CONFLICT DO NOTHING"
        ))
    });
    let mut stmt = tx.prepare_cached(sql)?;
    // Only the optional values an event has are bound: a statement from the cache has
    // every parameter cleared (NULL; `a_row_after_one_with_every_column_set_has_its_own_nulls`
    // holds rusqlite to it), and an event leaves most of its optional columns empty (binding
    // seven NULLs was 2% of an enqueue's instructions).
    stmt.raw_bind_parameter(1, row.event_id)?;
    bind_some(&mut stmt, 3, row.idempotency_key)?;
    stmt.raw_bind_parameter(4, row.event_type)?;
    bind_some(&mut stmt, 5, row.source)?;
    bind_some(&mut stmt, 6, row.subject)?;
    bind_some(&mut stmt, 7, row.partition_key)?;
    stmt.raw_bind_parameter(8, row.payload)?;
    stmt.raw_bind_parameter(9, row.now)?;
    bind_some(&mut stmt, 10, row.coalesce_key)?;
    stmt.raw_bind_parameter(11, row.droppable)?;
    stmt.raw_bind_parameter(12, row.priority)?;
    stmt.raw_bind_parameter(13, row.created_at)?;
    bind_some(&mut stmt, 14, row.expires_at)?;
    bind_some(&mut stmt, 15, row.traceparent)?;
    bind_some(&mut stmt, 16, row.tracestate)?;
    bind_some(&mut stmt, 17, row.dataschema)?;
    let mut any = false;
    for destination in destinations {
        // ON CONFLICT DO NOTHING: a repeated idempotency key must not abort the caller's
        // transaction the way a constraint error would. Keys are per destination.
        stmt.raw_bind_parameter(2, destination)?;
        if stmt.raw_execute()? == 1 {
            any = true;
            inserted(destination);
        }
    }
    Ok(any)
}

/// `sql` with every run of white space made one space (no statement here quotes a string
/// with white space in it).
fn compact_sql(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Binds `value` to parameter `index` if there is one. Only for a statement just taken from
/// the cache (or just prepared), whose parameters are all NULL: rusqlite clears them when
/// it puts a statement back.
fn bind_some<T: rusqlite::ToSql>(
    stmt: &mut rusqlite::CachedStatement<'_>,
    index: usize,
    value: Option<T>,
) -> Result<()> {
    if let Some(value) = value {
        stmt.raw_bind_parameter(index, value)?;
    }
    Ok(())
}

/// The most rows one `INSERT` of [`insert_run`] writes; a longer run takes several.
pub(super) const RUN_STATEMENT_LONG: usize = 100;
/// The statement for the rest of a run shorter than [`RUN_STATEMENT_LONG`], ten rows at a
/// time, then one by one: three compiled statements serve every run from the cache.
pub(super) const RUN_STATEMENT_SHORT: usize = 10;
/// The columns [`insert_run`] binds for each row, in order.
const RUN_COLUMNS: usize = 16;

/// The `INSERT` of `rows` rows (1, [`RUN_STATEMENT_SHORT`] or [`RUN_STATEMENT_LONG`]) of
/// [`insert_run`], each row binding [`RUN_COLUMNS`] parameters.
///
/// `OR FAIL`, as for the listed ack: under the default `OR ABORT` SQLite keeps a statement
/// journal for a statement that writes several rows, and past 64 KiB of changed pages it
/// spills to a temporary file, created and deleted for every call. Nothing these rows
/// hold can break a constraint (their ids are new, they have no idempotency key).
pub(super) fn insert_run_sql(rows: usize) -> &'static str {
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
                 expires_at, traceparent, tracestate, dataschema)
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
pub(super) const KEY_PENDING_SQL: &str = concat!("SELECT ", key_pending!("?1", "?2", ""));

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
pub(crate) fn insert_run(tx: &Connection, rows: &[(&str, NewRow<'_>)]) -> Result<()> {
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
        // Each chunk takes its statement from the cache again: every parameter is NULL
        // until bound, so the empty ones are left alone (`bind_some`).
        let mut stmt = tx.prepare_cached(insert_run_sql(n))?;
        for (offset, (destination, row)) in rows[start..start + n].iter().enumerate() {
            let at = start + offset;
            let base = offset * RUN_COLUMNS;
            let id = if at == 0 { first_id } else { None };
            bind_some(&mut stmt, base + 1, id)?;
            stmt.raw_bind_parameter(base + 2, row.event_id)?;
            stmt.raw_bind_parameter(base + 3, destination)?;
            stmt.raw_bind_parameter(base + 4, row.event_type)?;
            bind_some(&mut stmt, base + 5, row.source)?;
            bind_some(&mut stmt, base + 6, row.subject)?;
            bind_some(&mut stmt, base + 7, row.partition_key)?;
            stmt.raw_bind_parameter(base + 8, row.payload)?;
            stmt.raw_bind_parameter(base + 9, row.created_at)?;
            stmt.raw_bind_parameter(base + 10, available_at[at])?;
            stmt.raw_bind_parameter(base + 11, row.droppable)?;
            stmt.raw_bind_parameter(base + 12, row.priority)?;
            bind_some(&mut stmt, base + 13, row.expires_at)?;
            bind_some(&mut stmt, base + 14, row.traceparent)?;
            bind_some(&mut stmt, base + 15, row.tracestate)?;
            bind_some(&mut stmt, base + 16, row.dataschema)?;
        }
        stmt.raw_execute()?;
        start += n;
    }
    Ok(())
}

/// The id of the event that holds idempotency `key` for `destination`, if any.
pub(crate) fn idempotency_holder(
    tx: &Connection,
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
///
/// "Unleased" means no lease at all, not a lease that looks expired: the app's clock is the
/// wall clock, which steps, and a row still leased may be in flight right now (a relay
/// answers for its own leases by a monotonic clock). A lease left by a crashed relay keeps
/// its row until a relay takes it over and sends it; the new event then follows it.
pub(crate) fn coalesce(
    tx: &Connection,
    event_type: &str,
    key: &str,
    destinations: &[&str],
    now: i64,
) -> Result<usize> {
    // The rows it replaces leave with their numbers, so every row is numbered first.
    numbering::number_all(tx)?;
    let mut replaced = 0;
    let mut highest_deleted = None;
    let mut delete = tx.prepare_cached(concat!(
        "DELETE FROM outbox_events
          WHERE event_type = ?1 AND coalesce_key = ?2 AND destination = ?3 AND ",
        pending!(""),
        " AND lease_owner IS NULL RETURNING id, partition_key, source, stream_seq"
    ))?;
    for destination in destinations {
        let mut fates = Vec::new();
        let gone: Vec<(i64, Option<String>)> = delete
            .query_map(params![event_type, key, destination], |r| {
                fates.push((destination.to_string(), r.get(2)?, r.get(3)?));
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        numbering::record_fates(tx, "coalesced", &fates)?;
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

/// The pending rows with no lease (see [`coalesce`]) a storage limit may drop, oldest
/// first.
pub(super) const DROPPABLE_OLDEST_SQL: &str = concat!(
    "SELECT id, octet_length(payload) FROM outbox_events INDEXED BY outbox_events_droppable
      WHERE droppable = 1 AND ",
    pending!(""),
    " AND lease_owner IS NULL ORDER BY id"
);

/// Deletes the oldest pending, unleased droppable rows until `need` is met; returns how many,
/// or `None` (and deletes nothing) if all of them together are not enough.
pub(crate) fn drop_oldest(tx: &Connection, need: &RoomNeeded) -> Result<Option<usize>> {
    // A walk of the droppable index in id order that stops once there is room: its cost is
    // the rows it drops (plus any leased ones it steps over), not the backlog.
    let mut victims = Vec::new();
    let (mut rows_freed, mut bytes_freed) = (0i64, 0i64);
    {
        let mut stmt = tx.prepare_cached(DROPPABLE_OLDEST_SQL)?;
        let mut rows = stmt.query([])?;
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
    // The rows it drops leave with their numbers, so every row is numbered first.
    numbering::number_all(tx)?;
    let mut delete = tx.prepare_cached(
        "DELETE FROM outbox_events WHERE id = ?1
         RETURNING partition_key, destination, source, stream_seq",
    )?;
    let mut heads = Vec::new();
    let mut fates = Vec::with_capacity(victims.len());
    for id in &victims {
        let (key, destination): (Option<String>, String) = delete.query_row([id], |r| {
            fates.push((r.get(1)?, r.get(2)?, r.get(3)?));
            Ok((r.get(0)?, r.get(1)?))
        })?;
        if let Some(key) = key {
            heads.push((key, destination));
        }
    }
    drop(delete);
    numbering::record_fates(tx, "dropped", &fates)?;
    keep_ids_rising(tx, victims.iter().copied().max())?;
    // A dropped event may have been its key's head.
    for (key, destination) in heads {
        unpark_next(tx, &key, &destination, need.now)?;
    }
    tx.prepare_cached("UPDATE outbox_stats SET dropped = dropped + ?1 WHERE id = 1")?
        .execute([victims.len() as i64])?;
    Ok(Some(victims.len()))
}
