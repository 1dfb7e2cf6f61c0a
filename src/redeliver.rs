//! Replay: send delivered events again to a destination, with their original ids, to fill a
//! destination added later or one that lost data. Receivers de-duplicate by id, so a replay
//! to one that already has them changes nothing there.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::params;

use crate::destination::{type_matches, validate_name};
use crate::error::{Error, Result};
use crate::queue::{self, NewRow};
use crate::Outbox;

/// Which delivered events to send again, and where.
#[derive(Debug, Clone)]
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
        validate_name(&redelivery.destination)?;
        if let Some(pattern) = &redelivery.types {
            let inner = pattern.strip_suffix('*').unwrap_or(pattern);
            if pattern.is_empty() || inner.contains('*') {
                return Err(Error::InvalidConfig(format!(
                    "type pattern {pattern:?}: use an exact type, prefix.* or *"
                )));
            }
        }
        let count = self.transaction(|tx| {
            let chosen = select(tx, redelivery)?;
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
                        // The destination may hold the key already: a replay must not collide.
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
                        // A replay is sent whenever it can be: the original deadline is long gone.
                        expires_at: None,
                        now,
                    };
                    (redelivery.destination.as_str(), row)
                })
                .collect();
            queue::insert_run(tx, &rows)?;
            Ok(rows.len() as u64)
        })?;
        log::info!(
            "queued {count} delivered events again for destination {}",
            redelivery.destination
        );
        Ok(count)
    }
}

/// The delivered events to send again, first delivery row of each event id, in commit
/// order, without those already pending for the destination.
fn select(tx: &rusqlite::Transaction<'_>, r: &Redelivery) -> Result<Vec<Delivered>> {
    let mut stmt = tx.prepare(
        "SELECT e.event_id, e.event_type, e.source, e.subject, e.partition_key, e.payload,
                e.created_at, e.priority
           FROM outbox_events AS e INDEXED BY outbox_events_delivered
          WHERE e.delivered_at BETWEEN ?1 AND ?2
            AND NOT EXISTS (SELECT 1 FROM outbox_events AS p INDEXED BY outbox_events_event_id
                             WHERE p.event_id = e.event_id AND p.destination = ?3
                               AND p.delivered_at IS NULL AND p.dead_at IS NULL)
          ORDER BY e.id",
    )?;
    let rows = stmt.query_map(params![r.since_ms, r.until_ms, r.destination], |row| {
        Ok(Delivered {
            event_id: row.get(0)?,
            event_type: row.get(1)?,
            source: row.get(2)?,
            subject: row.get(3)?,
            partition_key: row.get(4)?,
            payload: row.get(5)?,
            created_at: row.get(6)?,
            priority: row.get::<_, i64>(7)?.clamp(0, 9) as u8,
        })
    })?;
    let mut seen = std::collections::HashSet::new();
    let mut chosen = Vec::new();
    for row in rows {
        let d = row?;
        let wanted = r
            .types
            .as_deref()
            .is_none_or(|pattern| type_matches(pattern, &d.event_type));
        if wanted && seen.insert(d.event_id.clone()) {
            chosen.push(d);
        }
    }
    Ok(chosen)
}
