//! A destination's streams as the file knows them: each stream's high water, its pending
//! numbers and the fates of the numbers that left undelivered (schema version 15), read in
//! one transaction, as the [`StreamAccount`]s a relay sends and `Outbox::stream_accounts`
//! returns.

use std::collections::BTreeMap;

use rusqlite::{params, Connection};

use crate::error::Result;
use crate::wire::{ranges_of, StreamAccount};

/// Every stream of `destination`, by source, in one read transaction.
pub(crate) fn read(
    conn: &mut Connection,
    destination: &str,
) -> Result<Vec<(String, StreamAccount)>> {
    let tx = conn.transaction()?;
    let mut streams: BTreeMap<String, (StreamAccount, BTreeMap<&'static str, Vec<i64>>)> =
        BTreeMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT source, high_water FROM outbox_streams WHERE destination = ?1",
        )?;
        let mut rows = stmt.query([destination])?;
        while let Some(row) = rows.next()? {
            let source: String = row.get(0)?;
            let account = StreamAccount::new(destination, row.get(1)?);
            streams.insert(source, (account, BTreeMap::new()));
        }
    }
    // Pending numbers: the rows neither delivered nor out of pending.
    {
        let mut stmt = tx.prepare_cached(
            "SELECT source, stream_seq FROM outbox_events
              WHERE destination = ?1 AND delivered_at IS NULL AND dead_at IS NULL
                AND stream_seq IS NOT NULL
              ORDER BY source, stream_seq",
        )?;
        let mut rows = stmt.query([destination])?;
        let mut numbers: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        while let Some(row) = rows.next()? {
            numbers.entry(row.get(0)?).or_default().push(row.get(1)?);
        }
        for (source, numbers) in numbers {
            if let Some((account, _)) = streams.get_mut(&source) {
                account.pending = ranges_of(numbers);
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
            "SELECT source, stream_seq,
                    CASE WHEN expired_at IS NOT NULL THEN 'expired'
                         WHEN exported_at IS NOT NULL THEN 'exported' ELSE 'dead' END
               FROM outbox_events INDEXED BY outbox_events_dead
              WHERE dead_at IS NOT NULL AND delivered_at IS NULL
                AND destination = ?1 AND stream_seq IS NOT NULL",
        )?;
        let mut rows = stmt.query(params![destination])?;
        while let Some(row) = rows.next()? {
            fated(row.get(0)?, row.get(1)?, row.get(2)?);
        }
        let mut stmt = tx.prepare_cached(
            "SELECT source, stream_seq, fate FROM outbox_fates WHERE destination = ?1",
        )?;
        let mut rows = stmt.query(params![destination])?;
        while let Some(row) = rows.next()? {
            fated(row.get(0)?, row.get(1)?, row.get(2)?);
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
            (source, account)
        })
        .collect())
}
