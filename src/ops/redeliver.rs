//! Replay: send delivered events again to a destination, with their original ids, to fill a
//! destination added later or one that lost data. Receivers de-duplicate by id, so a replay
//! to one that already has them changes nothing there.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::params;

use crate::error::{Error, Result};
use crate::store::queue::{self, NewRow};
use crate::store::route::validate_name;
use crate::store::type_pattern::type_matches;
use crate::Outbox;

/// Row ids one page of a replay reads at most (one short transaction each).
const REDELIVER_PAGE_ROWS: usize = 500;

/// The longest pause between pages.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Which delivered events to send again, and where.
#[derive(Debug, Clone)]
#[must_use = "a Redelivery does nothing until `Outbox::redeliver`"]
pub struct Redelivery {
    destination: String,
    types: Option<String>,
    since_ms: i64,
    until_ms: i64,
}

impl Redelivery {
    /// Every delivered event still kept (pruning removes them), to `destination`.
    pub fn to(destination: impl Into<String>) -> Redelivery {
        Redelivery {
            destination: destination.into(),
            types: None,
            since_ms: i64::MIN,
            until_ms: i64::MAX,
        }
    }

    /// Only types matching `pattern`, as routes match them: an exact type, `prefix.*`, `*`.
    pub fn types(mut self, pattern: impl Into<String>) -> Redelivery {
        self.types = Some(pattern.into());
        self
    }

    /// Only events delivered at or after `time`.
    pub fn delivered_since(mut self, time: SystemTime) -> Redelivery {
        self.since_ms = unix_ms(time);
        self
    }

    /// Only events delivered at or before `time`.
    pub fn delivered_until(mut self, time: SystemTime) -> Redelivery {
        self.until_ms = unix_ms(time);
        self
    }
}

fn unix_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A delivered event, as the replay reads it.
struct Delivered {
    event_id: String,
    event_type: String,
    source: Option<String>,
    subject: Option<String>,
    partition_key: Option<String>,
    payload: String,
    created_at: i64,
    priority: u8,
    traceparent: Option<String>,
    tracestate: Option<String>,
    dataschema: Option<String>,
}

impl Outbox {
    /// Sends the delivered events `redelivery` selects again to its destination: one new
    /// pending delivery each, with the event's original id, data and time, in commit order
    /// (a key's events parked behind each other as usual). Events delivered to several
    /// destinations are sent once; events already pending for that destination are skipped.
    /// Returns how many were queued; a relay for that destination then sends them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a bad destination name or type pattern (nothing is
    /// written); [`Error::OutboxFull`] when a storage limit leaves no room (nothing is
    /// written); SQLite errors.
    pub fn redeliver(&self, redelivery: &Redelivery) -> Result<u64> {
        self.redeliver_with_progress(redelivery, |_| {})
    }

    /// As [`redeliver`](Self::redeliver), calling `progress` with the count queued so far
    /// after each page of 500 row ids read (for a terminal's
    /// progress line). Each page is a transaction of its own: on an error, the pages before
    /// it stay queued (a second run skips what is already pending).
    ///
    /// # Errors
    ///
    /// As [`redeliver`](Self::redeliver).
    pub fn redeliver_with_progress(
        &self,
        redelivery: &Redelivery,
        mut progress: impl FnMut(u64),
    ) -> Result<u64> {
        validate_name(&redelivery.destination)?;
        if let Some(pattern) = &redelivery.types {
            let inner = pattern.strip_suffix('*').unwrap_or(pattern);
            if pattern.is_empty() || inner.contains('*') {
                return Err(Error::InvalidConfig(format!(
                    "type pattern {pattern:?}: use an exact type, prefix.* or *"
                )));
            }
        }
        // Pages of bounded size, each its own short transaction, with room for the app's
        // own commits between them: memory and lock time do not grow with history. Rows
        // above the highest id at the start are left out, so the copies a relay delivers
        // meanwhile are never replayed again.
        let (first_id, last_id): (i64, i64) = self.connection()?.query_row(
            "SELECT COALESCE(MIN(id), 0), COALESCE(MAX(id), 0) FROM outbox_events",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let mut after = first_id.saturating_sub(1);
        let mut count = 0;
        while after < last_id {
            let started = Instant::now();
            let through = after
                .saturating_add(REDELIVER_PAGE_ROWS as i64)
                .min(last_id);
            let queued = self.transaction(|tx| {
                let chosen = select_page(tx, redelivery, after, through)?;
                let now = self.now_ms();
                let limits = &self.current_settings().limits;
                if limits.is_set() {
                    let bytes = chosen.iter().map(|d| d.payload.len() as i64).sum();
                    limits.make_room(tx, chosen.len() as i64, bytes, now)?;
                }
                // One listed INSERT per hundred rows, as `enqueue_many` writes them.
                let rows: Vec<(&str, NewRow<'_>)> = chosen
                    .iter()
                    .map(|d| {
                        let row = NewRow {
                            event_id: &d.event_id,
                            // The destination may hold the key already: a replay must not
                            // collide.
                            idempotency_key: None,
                            event_type: &d.event_type,
                            source: d.source.as_deref(),
                            subject: d.subject.as_deref(),
                            partition_key: d.partition_key.as_deref(),
                            payload: &d.payload,
                            coalesce_key: None,
                            priority: d.priority,
                            droppable: false,
                            created_at: d.created_at,
                            // A replay is sent whenever it can be: the original deadline is
                            // long gone.
                            expires_at: None,
                            // The same event, so the same trace it was written in.
                            traceparent: d.traceparent.as_deref(),
                            tracestate: d.tracestate.as_deref(),
                            dataschema: d.dataschema.as_deref(),
                            now,
                        };
                        (redelivery.destination.as_str(), row)
                    })
                    .collect();
                queue::insert_run(tx, &rows)?;
                Ok::<_, crate::Error>(rows.len() as u64)
            })?;
            count += queued;
            after = through;
            progress(count);
            // Give way: as long again as the page held the lock, so an app that re-checks a
            // busy lock only every few milliseconds (Python's sqlite3) gets its turn.
            std::thread::sleep(started.elapsed().min(MAX_PAUSE));
        }
        log::info!(
            "queued {count} delivered events again for destination {}",
            redelivery.destination
        );
        Ok(count)
    }
}

/// One page of the delivered events to send again: of the delivered rows with ids in
/// `(after, through]` (at most `REDELIVER_PAGE_ROWS` ids), in id order, the first delivery
/// row of each event id (no earlier row of it was delivered in the window, on this page or
/// an earlier one), without those already pending for the destination.
fn select_page(
    tx: &rusqlite::Transaction<'_>,
    r: &Redelivery,
    after: i64,
    through: i64,
) -> Result<Vec<Delivered>> {
    let mut stmt = tx.prepare_cached(
        "SELECT e.id, e.event_id, e.event_type, e.source, e.subject, e.partition_key, e.payload,
                e.created_at, e.priority, e.traceparent, e.tracestate, e.dataschema,
                EXISTS (SELECT 1 FROM outbox_events AS p INDEXED BY outbox_events_event_id
                         WHERE p.event_id = e.event_id
                           AND ((p.destination = ?3 AND p.delivered_at IS NULL
                                 AND p.dead_at IS NULL)
                                OR (p.id < e.id AND p.delivered_at BETWEEN ?1 AND ?2)))
           FROM outbox_events AS e
          WHERE e.id > ?4 AND e.id <= ?5 AND e.delivered_at BETWEEN ?1 AND ?2
          ORDER BY e.id",
    )?;
    let rows = stmt.query_map(
        params![r.since_ms, r.until_ms, r.destination, after, through],
        |row| {
            Ok((
                row.get::<_, bool>(12)?,
                Delivered {
                    event_id: row.get(1)?,
                    event_type: row.get(2)?,
                    source: row.get(3)?,
                    subject: row.get(4)?,
                    partition_key: row.get(5)?,
                    payload: row.get(6)?,
                    created_at: row.get(7)?,
                    priority: row.get::<_, i64>(8)?.clamp(0, 9) as u8,
                    traceparent: row.get(9)?,
                    tracestate: row.get(10)?,
                    dataschema: row.get(11)?,
                },
            ))
        },
    )?;
    let mut chosen = Vec::new();
    for row in rows {
        let (skipped, d) = row?;
        let wanted = r
            .types
            .as_deref()
            .is_none_or(|pattern| type_matches(pattern, &d.event_type));
        if wanted && !skipped {
            chosen.push(d);
        }
    }
    Ok(chosen)
}
