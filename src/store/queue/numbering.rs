//! Stream numbers: the gapless sequence per destination and source that every event takes
//! when its transaction commits (`outbox_streams`, schema version 15).
//!
//! A row's number is one above the highest its stream holds or ever held, read inside the
//! writer's own transaction (SQLite has one writer at a time): a rolled-back transaction or
//! a repeated idempotency key leaves no row and so takes no number, two transactions never
//! take the same one, and a number whose row was deleted is never given again (the schema's
//! delete trigger keeps it in `outbox_streams`). `Outbox::enqueue` and `enqueue_many` number
//! their rows here, in commit order; the SQL contract's trigger does the same.

#[allow(unused_imports)]
use super::*;

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the bench only (`internal::set_stream_numbers`), to measure what numbering costs
/// in the same run: rows are then written without a number.
static OFF_FOR_BENCH: AtomicBool = AtomicBool::new(false);

/// Turns numbering off (`false`) or on for every outbox of the process: benches only.
pub(crate) fn set_on(on: bool) {
    OFF_FOR_BENCH.store(!on, Ordering::Relaxed);
}

/// Whether the bench turned numbering off.
pub(crate) fn is_off() -> bool {
    OFF_FOR_BENCH.load(Ordering::Relaxed)
}

/// The SQL of a stream's next number, for destination `$destination` and source `$source`
/// (parameters or columns): one above the highest number the stream holds (a seek of
/// `outbox_events_stream`) or ever held (`outbox_streams.high_water`, kept as rows leave).
macro_rules! next_stream_seq {
    ($destination:literal, $source:literal) => {
        concat!(
            "max(COALESCE((SELECT MAX(n.stream_seq) FROM outbox_events AS n
                            WHERE n.destination = ",
            $destination,
            " AND n.source = ",
            $source,
            " AND n.stream_seq IS NOT NULL), 0),
                 COALESCE((SELECT t.high_water FROM outbox_streams AS t
                            WHERE t.destination = ",
            $destination,
            " AND t.source = ",
            $source,
            "), 0)) + 1"
        )
    };
}
pub(crate) use next_stream_seq;

/// The next number of the stream (`destination`, `source`): for a run of rows written by
/// one statement, which cannot read its own rows (see `insert_run`).
pub(crate) fn next(tx: &Connection, destination: &str, source: &str) -> Result<i64> {
    Ok(tx
        .prepare_cached(concat!("SELECT ", next_stream_seq!("?1", "?2")))?
        .query_row(params![destination, source], |r| r.get(0))?)
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
    for (destination, source, seq) in gone {
        if let Some(seq) = seq {
            insert.execute(params![destination, source, seq, fate])?;
        }
    }
    Ok(())
}
