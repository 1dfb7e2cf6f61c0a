//! Retention and the operator's transitions: expiry, export to a bundle and its release,
//! retry of dead rows, and the pages of finished rows that prune and purge delete.

#[allow(unused_imports)]
use super::*;

/// The earliest deadline of a pending event (unix ms), if any: one seek in the expiring
/// index, a read, so that an idle relay's sweep never takes the write lock for nothing and
/// knows when to look next.
pub(crate) fn earliest_deadline(conn: &Connection) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT expires_at FROM outbox_events INDEXED BY outbox_events_expiring
              WHERE expires_at IS NOT NULL AND ",
            pending!(""),
            " ORDER BY expires_at LIMIT 1"
        ))?
        .query_row([], |r| r.get(0))
        .optional()?)
}

/// One row the expiry sweep took out of pending.
pub(crate) struct ExpiredRow {
    pub event_id: String,
    pub destination: String,
    pub event_type: String,
}

/// The rows [`EXPIRE_SQL`] takes (`?1` now, `?2` the limit, `?3` the latest lease time that
/// holds, `?4` the lease owners spared).
macro_rules! expire_candidates {
    () => {
        concat!(
            "SELECT e.id FROM outbox_events AS e INDEXED BY outbox_events_expiring
              WHERE e.expires_at IS NOT NULL AND e.expires_at <= ?1 AND ",
            pending!("e."),
            " AND ",
            lease_claimable!("e.", "?1", "?3"),
            " AND ",
            not_spared!("e.", "?4"),
            // In index order, so that selected alone it finds the rows the update takes.
            " ORDER BY e.expires_at, e.id LIMIT CAST(?2 AS INTEGER)"
        )
    };
}
#[cfg(test)]
pub(super) use expire_candidates;

/// Expires due rows; see [`expire`].
pub(super) const EXPIRE_SQL: &str = concat!(
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
/// one's key, and counts them. Leases whose owner starts with `spare_leases` (the expiring
/// relay's own, `""` for none) are never taken, whatever the wall clock says. Walks the
/// expiring index only.
pub(crate) fn expire(
    conn: &Connection,
    now: i64,
    limit: i64,
    spare_leases: &str,
) -> Result<Vec<ExpiredRow>> {
    let params = params![
        now,
        limit,
        now.saturating_add(LEASE_CLOCK_SKEW_MS),
        spare_leases
    ];
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

/// One page of an export: which rows [`lease_for_export`] leases.
pub(crate) struct ExportPage<'a> {
    pub destination: &'a str,
    /// The export's lease owner, the same for all its pages.
    pub owner: &'a str,
    pub now: i64,
    pub lease_ms: i64,
    /// Rows at most.
    pub limit: i64,
    /// Bytes of event data at most (past the first row, which goes whatever its size).
    pub max_bytes: i64,
    /// The highest row id the export's earlier pages took (0 for the first page).
    pub after: i64,
    pub default_source: &'a str,
}

/// Leases one page of `destination`'s pending rows after `page.after`, oldest first
/// (parked ones too: a bundle keeps a key's order by itself), for an export: the lease
/// keeps relays off them while the file is written. An export leases page by page, each in
/// its own short transaction, so the app's commits never wait for a whole bundle.
pub(crate) fn lease_for_export(
    conn: &Connection,
    page: &ExportPage<'_>,
) -> Result<Vec<crate::outbound::OutboundEvent>> {
    let ExportPage {
        destination,
        owner,
        now,
        lease_ms,
        limit,
        max_bytes,
        after,
        default_source,
    } = *page;
    // A bundle carries each event's number.
    super::numbering::number_all(conn)?;
    // The rows first, then the lease on them, inside `tally::around`: an export may take
    // over leases that ran out, which the pending totals must see leave.
    let mut bytes = 0i64;
    let ids: Vec<i64> = conn
        .prepare_cached(concat!(
            "SELECT e.id, octet_length(e.payload) FROM outbox_events AS e
                    INDEXED BY outbox_events_pending
              WHERE ",
            pending!("e."),
            " AND e.destination = ?1 AND e.id > ?5 AND ",
            lease_claimable!("e.", "?2", "?3"),
            // Per-key order: not while an older pending row of its key stays behind, else
            // the bundle would deliver the key's successors before its head. Behind means
            // not this export's: its lease held by a relay (in flight, or left by a crash),
            // or passed over by an earlier page. The rows a page takes are the oldest after
            // the last page's, so an older claimable row of the key after it is in the
            // bundle too.
            " AND (e.partition_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM outbox_events AS k
                 WHERE k.partition_key = e.partition_key AND k.destination = e.destination
                   AND k.id < e.id AND ",
            pending!("k."),
            " AND k.lease_owner IS NOT ?6
                   AND (k.id <= ?5 OR NOT COALESCE(",
            // (COALESCE: a lease with no leased_at still holds.)
            lease_claimable!("k.", "?2", "?3"),
            ", 0))))",
            " ORDER BY e.id LIMIT CAST(?4 AS INTEGER)"
        ))?
        .query_map(
            params![
                destination,
                now,
                now.saturating_add(LEASE_CLOCK_SKEW_MS),
                limit,
                after,
                owner
            ],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )?
        .map(|row| row.map_err(crate::error::Error::from))
        .take_while(|row| {
            let Ok((_, len)) = row else { return true };
            let fits = bytes < max_bytes;
            bytes = bytes.saturating_add(*len);
            fits
        })
        .map(|row| row.map(|(id, _)| id))
        .collect::<Result<_>>()?;
    let lease = Lease {
        destination,
        owner,
        expires_at: now.saturating_add(lease_ms),
        // An export leases rows of every level; a bundle carries no priority.
        priority: crate::outbound::DEFAULT_PRIORITY,
    };
    let mut events = tally::around(conn, &ids, || {
        Ok(conn
            .prepare_cached(
                "UPDATE outbox_events SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3
                  WHERE id IN (SELECT value FROM json_each(?4))
                 RETURNING id, event_id, event_type, COALESCE(source, ?5), subject, partition_key,
                           idempotency_key, payload, created_at, attempts, expires_at,
                           traceparent, tracestate, dataschema, stream_seq",
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
    delete_page_counted(conn, which, false)
}

/// Deletes one page of delivered history, whatever its age, to make room on a full disk:
/// delivered rows first, then expired and exported ones, oldest first; counted in
/// `outbox_stats.pruned_for_room`. Returns how many (fewer than [`DELETE_PAGE_ROWS`]: no
/// more). Dead letters stay: an operator has yet to see them.
pub(crate) fn delete_page_for_room(conn: &mut Connection) -> Result<usize> {
    let delivered = delete_page_counted(conn, Finished::DeliveredBefore(i64::MAX), true)?;
    if delivered == DELETE_PAGE_ROWS {
        return Ok(delivered);
    }
    let settled = delete_page_counted(conn, Finished::SettledBefore(i64::MAX), true)?;
    Ok(delivered + settled)
}

/// [`delete_page`], also counting the rows in `outbox_stats.pruned_for_room` if `for_room`.
fn delete_page_counted(conn: &mut Connection, which: Finished, for_room: bool) -> Result<usize> {
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
    if for_room && !gone.is_empty() {
        tx.prepare_cached(
            "UPDATE outbox_stats SET pruned_for_room = pruned_for_room + ?1 WHERE id = 1",
        )?
        .execute([gone.len() as i64])?;
    }
    tx.commit()?;
    Ok(gone.len())
}
