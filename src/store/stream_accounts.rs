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

/// What, cheaply read, tells whether a destination's fates may have changed: its dead
/// letters (file-wide, from their index), its fates of deleted rows and its lost numbers
/// (counts and sums over their keys), and whether it has anything pending at all. Equal
/// fingerprints mean no new fate to tell; reading one costs no pending row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FatesFingerprint {
    dead: (i64, Option<i64>),
    fates: (i64, i64),
    lost: (i64, i64),
    any_pending: bool,
}

/// Whether any stream of `destination` was ever told a report (`report_seq` above 0).
pub(crate) fn any_report_told(conn: &Connection, destination: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM outbox_streams WHERE destination = ?1 AND report_seq > 0)",
        )?
        .query_row([destination], |r| r.get(0))?)
}

/// Reads `destination`'s [`FatesFingerprint`].
pub(crate) fn fates_fingerprint(conn: &Connection, destination: &str) -> Result<FatesFingerprint> {
    let dead = conn
        .prepare_cached(
            "SELECT count(*), max(dead_at) FROM outbox_events INDEXED BY outbox_events_dead
              WHERE dead_at IS NOT NULL AND delivered_at IS NULL",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let fates = conn
        .prepare_cached(
            "SELECT count(*), COALESCE(sum(stream_seq), 0) FROM outbox_fates
              WHERE destination = ?1",
        )?
        .query_row([destination], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let lost = conn
        .prepare_cached(
            "SELECT count(*), COALESCE(sum(stream_seq), 0) FROM outbox_lost_numbers
              WHERE destination = ?1",
        )?
        .query_row([destination], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let any_pending = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM outbox_events INDEXED BY outbox_events_pending
                             WHERE destination = ?1 AND delivered_at IS NULL AND dead_at IS NULL)",
        )?
        .query_row([destination], |r| r.get(0))?;
    Ok(FatesFingerprint {
        dead,
        fates,
        lost,
        any_pending,
    })
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
    let newest = crate::store::queue::top_id(&tx)?;
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
    // Pending numbers: the rows neither delivered nor out of pending, as ranges, in one
    // walk of ids from the lowest pending one (found in the pending rows' index, which
    // holds the ids: no row is read for it). A stream's numbers rise with its ids, so each
    // row extends its stream's last range or starts the next one: no sort, memory by
    // ranges, not rows. The rows not numbered yet (committed since the relay's last claim)
    // take the numbers the plan gives them.
    {
        let lowest: Option<i64> = tx
            .prepare_cached(
                "SELECT MIN(id) FROM outbox_events INDEXED BY outbox_events_pending
                  WHERE destination = ?1 AND delivered_at IS NULL AND dead_at IS NULL",
            )?
            .query_row([destination], |r| r.get(0))?;
        let mut pending: BTreeMap<String, (Ranges, bool)> = BTreeMap::new();
        if let Some(lowest) = lowest {
            let mut stmt = tx.prepare_cached(
                "SELECT source, id, stream_seq FROM outbox_events NOT INDEXED
                  WHERE id >= ?1 AND destination = ?2 AND delivered_at IS NULL
                    AND dead_at IS NULL AND source IS NOT NULL
                  ORDER BY id",
            )?;
            let mut rows = stmt.query(params![lowest, destination])?;
            while let Some(row) = rows.next()? {
                let Some(number) = number_of(row.get(1)?, row.get(2)?) else {
                    continue;
                };
                let Ok(source) = row.get_ref(0)?.as_str() else {
                    continue;
                };
                let (ranges, unordered) = match pending.get_mut(source) {
                    Some(entry) => entry,
                    None => pending.entry(source.to_string()).or_default(),
                };
                match ranges.last_mut() {
                    Some([_, last]) if number == *last + 1 => *last = number,
                    Some([_, last]) if number <= *last => {
                        *unordered = true;
                        ranges.push([number, number]);
                    }
                    _ => ranges.push([number, number]),
                }
            }
        }
        for (source, (mut ranges, unordered)) in pending {
            if let Some((account, _)) = streams.get_mut(&source) {
                if unordered {
                    // Numbers out of id order (a hand's update): joined the long way.
                    ranges.sort_unstable();
                    ranges = union(&ranges, &Vec::new());
                }
                account.pending = ranges;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pending_row(conn: &Connection, destination: &str) -> i64 {
        conn.execute(
            "INSERT INTO outbox_events (event_id, destination, source, event_type, payload,
                                        created_at, available_at)
             VALUES (lower(hex(randomblob(8))), ?1, 'app', 't', 'null', 1, 1)",
            [destination],
        )
        .unwrap();
        conn.last_insert_rowid()
    }

    /// The fingerprint the accountant compares moves with every kind of fate (so a fate is
    /// told at once) and when the last pending row leaves, and stays put while rows are
    /// only delivered (so a draining relay's rounds read no pending row).
    #[test]
    fn the_fates_fingerprint_moves_with_each_fate_and_not_with_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = crate::Outbox::open(dir.path().join("o.db")).unwrap();
        let conn = outbox.connection().unwrap();
        let ids: Vec<i64> = (0..5).map(|_| pending_row(&conn, "a")).collect();
        let first = fates_fingerprint(&conn, "a").unwrap();
        assert!(first.any_pending);
        conn.execute(
            "UPDATE outbox_events SET delivered_at = 2 WHERE id = ?1",
            [ids[0]],
        )
        .unwrap();
        assert_eq!(fates_fingerprint(&conn, "a").unwrap(), first);
        // A dead letter.
        conn.execute(
            "UPDATE outbox_events SET dead_at = 3 WHERE id = ?1",
            [ids[1]],
        )
        .unwrap();
        let dead = fates_fingerprint(&conn, "a").unwrap();
        assert_ne!(dead, first);
        // A fate of a deleted row (coalesced), then one taken and forgotten.
        conn.execute(
            "INSERT INTO outbox_fates (destination, source, stream_seq, fate)
             VALUES ('a', 'app', 3, 'coalesced')",
            [],
        )
        .unwrap();
        let fated = fates_fingerprint(&conn, "a").unwrap();
        assert_ne!(fated, dead);
        // Another destination's fate does not move it.
        conn.execute(
            "INSERT INTO outbox_fates (destination, source, stream_seq, fate)
             VALUES ('b', 'app', 1, 'dropped')",
            [],
        )
        .unwrap();
        assert_eq!(fates_fingerprint(&conn, "a").unwrap(), fated);
        // A lost number.
        conn.execute(
            "INSERT INTO outbox_lost_numbers (destination, source, stream_seq)
             VALUES ('a', 'app', 4)",
            [],
        )
        .unwrap();
        let lost = fates_fingerprint(&conn, "a").unwrap();
        assert_ne!(lost, fated);
        // The last pending rows delivered.
        conn.execute(
            "UPDATE outbox_events SET delivered_at = 4 WHERE delivered_at IS NULL AND dead_at IS NULL",
            [],
        )
        .unwrap();
        let drained = fates_fingerprint(&conn, "a").unwrap();
        assert!(!drained.any_pending);
        assert_ne!(drained, lost);
    }
}
