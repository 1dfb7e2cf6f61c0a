//! A destination's streams as the file knows them: each stream's high water, its pending
//! numbers and the fates of the numbers that left undelivered (schema version 15), read in
//! one transaction, as the [`StreamAccount`]s a relay sends and `Outbox::stream_accounts`
//! returns.

use std::collections::BTreeMap;

use rusqlite::{params, Connection};

use crate::error::Result;
use crate::store::queue::numbering;
use crate::wire::{ranges_of, subtract, union, Fates, Ranges, StreamAccount};

/// A stream as the file knows it: what a relay tells its destination, and the numbers that
/// left pending with no fate (`outbox_lost_numbers`: deleted by a hand before any
/// destination took them), which the destination is never told of and never gets.
#[derive(Debug, Clone)]
pub(crate) struct StreamState {
    pub source: String,
    pub account: StreamAccount,
    pub lost: Ranges,
}

/// The number through which every event of a stream is delivered or accounted with the
/// destination's acknowledgement: one below the first number still pending, lost (`lost`:
/// a gap stops it for good), or whose fate the destination has not taken yet (`told`: the
/// fates of the last accounting it took); the high water when there is none.
pub(crate) fn synced_candidate(
    account: &StreamAccount,
    lost: &Ranges,
    told: Option<&Fates>,
) -> i64 {
    let mut unsynced = union(&account.pending, lost);
    for (name, ranges) in account.accounted.each() {
        let taken = told
            .and_then(|t| t.each().into_iter().find(|(n, _)| *n == name))
            .map_or_else(Vec::new, |(_, r)| r.clone());
        unsynced = union(&unsynced, &subtract(ranges, &taken));
    }
    unsynced
        .first()
        .map_or(account.high_water, |[first, _]| first - 1)
}

/// Moves a stream's synced-through number up to `through` (never down), stamped `now`.
pub(crate) fn advance_synced(
    conn: &Connection,
    destination: &str,
    source: &str,
    through: i64,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO outbox_streams (destination, source, high_water, synced_through, synced_at)
         VALUES (?1, ?2, 0, ?3, ?4)
         ON CONFLICT (destination, source) DO UPDATE
            SET synced_through = excluded.synced_through, synced_at = excluded.synced_at
          WHERE synced_through < excluded.synced_through",
    )?
    .execute(params![destination, source, through, now])?;
    Ok(())
}

/// The next report number of a stream (`seq` on the wire): counted in the file, so it keeps
/// rising across restarts.
pub(crate) fn next_report_seq(conn: &Connection, destination: &str, source: &str) -> Result<i64> {
    Ok(conn
        .prepare_cached(
            "INSERT INTO outbox_streams (destination, source, high_water, report_seq)
             VALUES (?1, ?2, 0, 1)
             ON CONFLICT (destination, source) DO UPDATE SET report_seq = report_seq + 1
             RETURNING report_seq",
        )?
        .query_row(params![destination, source], |r| r.get(0))?)
}

/// Forgets the fates of `told` that the destination acknowledged: rows of `outbox_fates`
/// only (the fates of rows still in the file go with their rows), so that the fates a
/// device keeps, and so what it tells after a restart, stay bounded by what the
/// destination has not taken yet.
pub(crate) fn forget_told(
    conn: &mut Connection,
    destination: &str,
    source: &str,
    told: &Fates,
) -> Result<()> {
    let all = told.all();
    if all.is_empty() {
        return Ok(());
    }
    // One seek per range in the table's key, in one transaction.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    {
        let mut forget = tx.prepare_cached(
            "DELETE FROM outbox_fates
              WHERE destination = ?1 AND source = ?2 AND stream_seq BETWEEN ?3 AND ?4",
        )?;
        for [first, last] in all {
            forget.execute(params![destination, source, first, last])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// A stream's synced-through number and when it last moved (unix ms), once it has moved.
pub(crate) fn synced(
    conn: &Connection,
    destination: &str,
    source: &str,
) -> Result<Option<(i64, i64)>> {
    use rusqlite::OptionalExtension;
    Ok(conn
        .prepare_cached(
            "SELECT synced_through, synced_at FROM outbox_streams
              WHERE destination = ?1 AND source = ?2 AND synced_at IS NOT NULL",
        )?
        .query_row(params![destination, source], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// Every stream of `destination`, by source, in one read transaction. Rows not numbered
/// yet count with the numbers their commits fixed, read and not written: an accountant
/// beside a relay never writes the rows its relay is about to claim (and number).
pub(crate) fn read(conn: &mut Connection, destination: &str) -> Result<Vec<StreamState>> {
    let tx = conn.transaction()?;
    let newest: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM outbox_events")?
        .query_row([], |r| r.get(0))?;
    let plan = numbering::plan(&tx, newest)?;
    let number_of = |id: i64, seq: Option<i64>| -> Option<i64> {
        seq.or_else(|| plan.as_ref().and_then(|p| p.number_of(id)))
    };
    let mut streams: BTreeMap<String, (StreamAccount, BTreeMap<&'static str, Vec<i64>>)> =
        BTreeMap::new();
    {
        // The highest number each stream gave: kept as rows are numbered, or about to be.
        let mut highs: BTreeMap<String, i64> = BTreeMap::new();
        let mut stmt = tx.prepare_cached(
            "SELECT source, high_water FROM outbox_streams
              WHERE destination = ?1 AND high_water > 0",
        )?;
        let mut rows = stmt.query([destination])?;
        while let Some(row) = rows.next()? {
            highs.insert(row.get(0)?, row.get(1)?);
        }
        for ((d, source), high) in plan.iter().flat_map(|p| p.highs()) {
            if d == destination {
                let kept = highs.entry(source.clone()).or_default();
                *kept = (*kept).max(*high);
            }
        }
        for (source, high) in highs {
            streams.insert(
                source,
                (StreamAccount::new(destination, high), BTreeMap::new()),
            );
        }
    }
    // Pending numbers: the rows neither delivered nor out of pending, as ranges. The
    // numbered rows are joined into ranges by SQLite (gaps and islands: a number minus its
    // rank is constant along a run), so a backlog of a million costs the relay no memory
    // of its own; the rows not numbered yet (those committed since the relay's last
    // claim) take the numbers the plan gives them.
    {
        let mut pending: BTreeMap<String, Ranges> = BTreeMap::new();
        let mut stmt = tx.prepare_cached(
            "SELECT source, MIN(stream_seq), MAX(stream_seq)
               FROM (SELECT source, stream_seq,
                            stream_seq - row_number() OVER (PARTITION BY source ORDER BY stream_seq)
                                AS island
                       FROM outbox_events
                      WHERE destination = ?1 AND delivered_at IS NULL AND dead_at IS NULL
                        AND source IS NOT NULL AND stream_seq IS NOT NULL)
              GROUP BY source, island",
        )?;
        let mut rows = stmt.query([destination])?;
        while let Some(row) = rows.next()? {
            pending
                .entry(row.get(0)?)
                .or_default()
                .push([row.get(1)?, row.get(2)?]);
        }
        if let Some(plan) = &plan {
            let mut stmt = tx.prepare_cached(
                "SELECT source, id FROM outbox_events
                  WHERE id > ?1 AND destination = ?2 AND delivered_at IS NULL AND dead_at IS NULL
                    AND source IS NOT NULL AND stream_seq IS NULL",
            )?;
            let first = plan.numbered.first().map_or(i64::MAX, |(id, _)| *id - 1);
            let mut rows = stmt.query(params![first, destination])?;
            let mut unnumbered: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            while let Some(row) = rows.next()? {
                if let Some(number) = plan.number_of(row.get(1)?) {
                    unnumbered.entry(row.get(0)?).or_default().push(number);
                }
            }
            for (source, mut numbers) in unnumbered {
                numbers.sort_unstable();
                let ranges = pending.entry(source).or_default();
                *ranges = union(ranges, &ranges_of(numbers));
            }
        }
        for (source, mut ranges) in pending {
            if let Some((account, _)) = streams.get_mut(&source) {
                ranges.sort_unstable();
                account.pending = union(&ranges, &Vec::new());
            }
        }
    }
    // Fates: rows still in the file (expired, exported, dead) and rows deleted since.
    let mut fated = |source: String, seq: i64, fate: String| {
        if let Some((_, fates)) = streams.get_mut(&source) {
            let name = match fate.as_str() {
                "expired" => "expired",
                "exported" => "exported",
                "dropped" => "dropped",
                "coalesced" => "coalesced",
                "purged" => "purged",
                _ => "dead",
            };
            fates.entry(name).or_default().push(seq);
        }
    };
    {
        let mut stmt = tx.prepare_cached(
            "SELECT source, id, stream_seq,
                    CASE WHEN expired_at IS NOT NULL THEN 'expired'
                         WHEN exported_at IS NOT NULL THEN 'exported' ELSE 'dead' END
               FROM outbox_events INDEXED BY outbox_events_dead
              WHERE dead_at IS NOT NULL AND delivered_at IS NULL
                AND destination = ?1 AND source IS NOT NULL",
        )?;
        let mut rows = stmt.query(params![destination])?;
        while let Some(row) = rows.next()? {
            if let Some(number) = number_of(row.get(1)?, row.get(2)?) {
                fated(row.get(0)?, number, row.get(3)?);
            }
        }
        let mut stmt = tx.prepare_cached(
            "SELECT source, stream_seq, fate FROM outbox_fates WHERE destination = ?1",
        )?;
        let mut rows = stmt.query(params![destination])?;
        while let Some(row) = rows.next()? {
            fated(row.get(0)?, row.get(1)?, row.get(2)?);
        }
    }
    // Lost numbers: they stop the stream's synced-through number for good.
    let mut lost: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT source, stream_seq FROM outbox_lost_numbers WHERE destination = ?1",
        )?;
        let mut rows = stmt.query(params![destination])?;
        while let Some(row) = rows.next()? {
            lost.entry(row.get(0)?).or_default().push(row.get(1)?);
        }
    }
    tx.commit()?;
    Ok(streams
        .into_iter()
        .map(|(source, (mut account, fates))| {
            for (name, mut numbers) in fates {
                numbers.sort_unstable();
                if let Some(ranges) = account.accounted.named_mut(name) {
                    *ranges = ranges_of(numbers);
                }
            }
            let mut lost = lost.remove(&source).unwrap_or_default();
            lost.sort_unstable();
            StreamState {
                source,
                account,
                lost: ranges_of(lost),
            }
        })
        .collect())
}
