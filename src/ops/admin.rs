//! Seeing and fixing an outbox: the operator's side.
//!
//! The methods are on [`Outbox`]: [`stats`](Outbox::stats), [`list`](Outbox::list),
//! [`show`](Outbox::show), [`dead_letters`](Outbox::dead_letters), [`retry`](Outbox::retry),
//! [`retry_dead`](Outbox::retry_dead), [`purge_dead`](Outbox::purge_dead),
//! [`prune_delivered`](Outbox::prune_delivered), [`checkpoint`](Outbox::checkpoint),
//! [`health`](Outbox::health), and [`disable_destination`](Outbox::disable_destination) /
//! [`enable_destination`](Outbox::enable_destination). This module holds what they return
//! and take. Everything here works on the database file alone, so the `outbox` CLI can do it
//! while the app is down, or running: SQLite's WAL lets readers and one writer go on together.
//!
//! ```
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! use sqlite_outbox::admin::{HealthThresholds, State};
//! let outbox = sqlite_outbox::Outbox::open(dir.path().join("app.db"))?;
//! let stats = outbox.stats()?;
//! println!("{} pending, {} dead", stats.pending, stats.dead);
//! for dead in outbox.list(Some(State::Dead), 20)? {
//!     println!("{} {}: {:?}", dead.event_id, dead.event_type, dead.last_error);
//! }
//! assert!(outbox.health(HealthThresholds::default())?.ok);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use rusqlite::Row;
use serde::Serialize;

use crate::error::Result;
use crate::outbox::Outbox;
use crate::store::budget_spend::{self, BudgetStatus};
use crate::store::database;
use crate::store::disabled;
use crate::store::oldest;
use crate::store::queue::tally;
use crate::store::queue::{self, Finished, DEAD, EXPIRED, EXPORTED, PARKED, PENDING};
use crate::store::type_pattern::type_matches;

pub use crate::error::Limit;
pub use crate::state::State;
pub use crate::store::database::{schema_version, PooledConnection};
pub use crate::store::disabled::DisabledDestination;

/// One delivery of one event to one destination, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EventRecord {
    /// Row id (commit order).
    pub id: i64,
    /// The event id receivers see.
    pub event_id: String,
    /// The destination.
    pub destination: String,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The partition key.
    pub key: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The subject.
    pub subject: Option<String>,
    /// Where it stands.
    pub state: State,
    /// Answered attempts so far.
    pub attempts: i64,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Commit time (unix ms).
    pub created_at: i64,
    /// When it is (or was) next due (unix ms).
    pub available_at: i64,
    /// 0 (least urgent) to 9 (most urgent).
    pub priority: i64,
    /// Delivery time (unix ms).
    pub delivered_at: Option<i64>,
    /// Dead-letter time (unix ms).
    pub dead_at: Option<i64>,
    /// The lease holder, while a relay has it in flight.
    pub lease_owner: Option<String>,
    /// The event data (JSON text).
    pub data: String,
}

impl EventRecord {
    /// Whether it waits behind an earlier pending event of its partition key, and so has no
    /// due time of its own until that one is delivered or dead.
    pub fn is_parked(&self) -> bool {
        self.state == State::Pending && self.available_at == PARKED
    }
}

const RECORD_COLUMNS: &str = "id, event_id, destination, event_type, partition_key,
    idempotency_key, subject, attempts, last_error, created_at, available_at, delivered_at,
    dead_at, lease_owner, payload, priority, expired_at, exported_at";

/// Reads a stored row for the operator. It never fails on what is stored: a row another
/// program wrote with the wrong types (the relay dead-letters such rows as unreadable) is
/// shown as well as it can be, so it can be seen, retried or purged.
fn record(r: &Row<'_>) -> rusqlite::Result<EventRecord> {
    let delivered_at = lossy_int(r, 11)?;
    let dead_at = lossy_int(r, 12)?;
    Ok(EventRecord {
        id: r.get(0)?,
        event_id: lossy_text(r, 1)?.unwrap_or_default(),
        destination: lossy_text(r, 2)?.unwrap_or_default(),
        event_type: lossy_text(r, 3)?.unwrap_or_default(),
        key: lossy_text(r, 4)?,
        idempotency_key: lossy_text(r, 5)?,
        subject: lossy_text(r, 6)?,
        state: match (delivered_at, lossy_int(r, 16)?, lossy_int(r, 17)?, dead_at) {
            (Some(_), _, _, _) => State::Delivered,
            (None, Some(_), _, _) => State::Expired,
            (None, None, Some(_), _) => State::Exported,
            (None, None, None, Some(_)) => State::Dead,
            (None, None, None, None) => State::Pending,
        },
        attempts: lossy_int(r, 7)?.unwrap_or_default(),
        last_error: lossy_text(r, 8)?,
        created_at: lossy_int(r, 9)?.unwrap_or_default(),
        available_at: lossy_int(r, 10)?.unwrap_or_default(),
        delivered_at,
        dead_at,
        lease_owner: lossy_text(r, 13)?,
        data: lossy_text(r, 14)?.unwrap_or_default(),
        priority: lossy_int(r, 15)?.unwrap_or(5),
    })
}

/// A text column as text whatever is stored: invalid UTF-8 replaced, a BLOB shown as hex.
fn lossy_text(r: &Row<'_>, idx: usize) -> rusqlite::Result<Option<String>> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(idx)? {
        ValueRef::Null => None,
        ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Some(format!(
            "x'{}'",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        )),
        ValueRef::Integer(i) => Some(i.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
    })
}

/// An integer column as an integer whatever is stored (a REAL is truncated, text is 0).
fn lossy_int(r: &Row<'_>, idx: usize) -> rusqlite::Result<Option<i64>> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(idx)? {
        ValueRef::Null => None,
        ValueRef::Integer(i) => Some(i),
        ValueRef::Real(f) => Some(f as i64),
        ValueRef::Text(_) | ValueRef::Blob(_) => Some(0),
    })
}

/// The listing of `state`: each walks the index of its state (pending and dead rows sorted
/// in memory, as there are few; delivered and all rows newest first, stopping at the limit).
fn list_sql(state: Option<State>) -> String {
    let (index, condition, order) = match state {
        Some(State::Pending) => ("INDEXED BY outbox_events_pending", PENDING, "id"),
        Some(State::Delivered) => (
            "INDEXED BY outbox_events_delivered",
            "delivered_at IS NOT NULL",
            "delivered_at DESC, id DESC",
        ),
        Some(State::Dead) => ("INDEXED BY outbox_events_dead", DEAD, "id DESC"),
        // Expired rows carry `dead_at` too, so they are in the dead index.
        Some(State::Expired) => ("INDEXED BY outbox_events_dead", EXPIRED, "id DESC"),
        Some(State::Exported) => ("INDEXED BY outbox_events_dead", EXPORTED, "id"),
        None => ("", "1", "id DESC"),
    };
    format!(
        "SELECT {RECORD_COLUMNS} FROM outbox_events {index}
          WHERE {condition} ORDER BY {order} LIMIT CAST(?1 AS INTEGER)"
    )
}

/// The stats of destination `name`, empty until filled in.
fn destination_slot(
    by_name: &mut BTreeMap<String, DestinationStats>,
    name: String,
) -> &mut DestinationStats {
    by_name
        .entry(name.clone())
        .or_insert_with(|| DestinationStats::named(name))
}

impl DestinationStats {
    /// A destination with nothing counted yet.
    fn named(name: String) -> DestinationStats {
        DestinationStats {
            name,
            pending: 0,
            delivered: 0,
            dead: 0,
            oldest_pending_age_ms: None,
            disabled: None,
            synced_through: None,
            budget: None,
        }
    }
}

/// Dead rows per destination (the dead index).
pub(crate) const DEAD_BY_DESTINATION: &str = concat!(
    "SELECT destination, COUNT(*) FROM outbox_events INDEXED BY outbox_events_dead WHERE ",
    crate::store::queue::dead!(),
    " GROUP BY destination"
);
/// Delivered rows per destination, as the queue keeps them.
pub(crate) const DELIVERED_BY_DESTINATION: &str =
    "SELECT destination, delivered FROM outbox_delivered_totals WHERE delivered > 0";
/// Attempts of dead rows (through the dead index); pending rows' attempts come with
/// the pending totals (src/store/queue/tally.rs).
pub(crate) const ATTEMPTS_OF_DEAD: &str = concat!(
    "SELECT attempts, COUNT(*) FROM outbox_events INDEXED BY outbox_events_dead WHERE ",
    crate::store::queue::dead!(),
    " GROUP BY attempts"
);

/// Counts for one destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DestinationStats {
    /// The destination.
    pub name: String,
    /// Pending deliveries.
    pub pending: i64,
    /// Delivered (and not yet pruned).
    pub delivered: i64,
    /// Dead letters.
    pub dead: i64,
    /// Age of the oldest pending delivery, in ms.
    pub oldest_pending_age_ms: Option<i64>,
    /// Why it is disabled, if it is.
    pub disabled: Option<String>,
    /// How far the destination has everything of the outbox's default source (see
    /// [`Outbox::synced_through`]); `None` before the first.
    pub synced_through: Option<SyncedThrough>,
    /// Where its data budget stands, if a relay keeps one for it
    /// ([`Destination::budget`](crate::Destination::budget)).
    pub budget: Option<BudgetStatus>,
}

/// "Everything up to here is safe at the destination": the stream number through which
/// every event is delivered (with a receipt where the destination requires them) or
/// accounted to the destination, which took the accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SyncedThrough {
    /// The stream number (see `OutboundEvent::stream_seq` and `Outbox::stream_numbers`).
    pub through: i64,
    /// When it last moved, unix ms (the relay's clock).
    pub at_ms: i64,
}

/// A picture of the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Pending deliveries.
    pub pending: i64,
    /// Of those, leased by a relay right now.
    pub in_flight: i64,
    /// Delivered (and not yet pruned).
    pub delivered: i64,
    /// Dead letters.
    pub dead: i64,
    /// Bytes of pending event data.
    pub pending_bytes: i64,
    /// Age of the oldest pending delivery, in ms.
    pub oldest_pending_age_ms: Option<i64>,
    /// Per destination.
    pub destinations: Vec<DestinationStats>,
    /// `(attempts, deliveries)` for pending and dead deliveries, by attempts so far.
    pub attempts_histogram: Vec<(i64, i64)>,
    /// Size of the database file in bytes.
    pub database_bytes: i64,
    /// Size of its write-ahead log in bytes.
    pub wal_bytes: i64,
    /// Events dropped by a [`StoragePolicy::DropOldest`](crate::StoragePolicy::DropOldest) policy, ever.
    pub dropped: i64,
    /// Pending events replaced by a newer one with the same coalescing key, ever.
    pub coalesced: i64,
    /// Events that expired before they were delivered, ever.
    pub expired: i64,
    /// Delivered, expired and exported events deleted to make room on a full disk, whatever
    /// the retention, ever (see [`OutboxBuilder::disk_reserve`](crate::OutboxBuilder::disk_reserve)).
    pub pruned_for_room: i64,
    /// Bytes free on the file system that holds the database (`None` if it cannot be read).
    pub disk_free_bytes: Option<u64>,
    /// Bytes the outbox's reserve for a full disk holds now: its size, less once a relay
    /// gave it back to go on delivering on a full disk; 0 when none is kept.
    pub disk_reserve_bytes: u64,
    /// Whether the disk is full: less is free than the reserve's size (1 MiB without a
    /// reserve).
    pub disk_full: bool,
}

/// Which dead letters to retry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a DeadFilter does nothing until `Outbox::retry_dead`"]
pub struct DeadFilter {
    /// Only types matching this pattern (exact, `prefix*`, `*`).
    pub event_type: Option<String>,
    /// Only events committed at or after this time (unix ms).
    pub since_ms: Option<i64>,
    /// Only events committed before this time (unix ms).
    pub until_ms: Option<i64>,
}

impl DeadFilter {
    /// Every dead letter: no filter. The same as `DeadFilter::default()`.
    pub fn all() -> DeadFilter {
        DeadFilter::default()
    }

    /// Only types matching `pattern` (exact, `prefix*`, `*`). Defaults to every type.
    pub fn event_type(mut self, pattern: impl Into<String>) -> DeadFilter {
        self.event_type = Some(pattern.into());
        self
    }

    /// Only events committed at or after `unix_ms`. Defaults to no lower bound.
    pub fn since_ms(mut self, unix_ms: i64) -> DeadFilter {
        self.since_ms = Some(unix_ms);
        self
    }

    /// Only events committed before `unix_ms`. Defaults to no upper bound.
    pub fn until_ms(mut self, unix_ms: i64) -> DeadFilter {
        self.until_ms = Some(unix_ms);
        self
    }
}

/// Whether the outbox needs attention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Health {
    /// `true` when nothing needs attention.
    pub ok: bool,
    /// What needs attention, one line each.
    pub reasons: Vec<String>,
}

/// When [`Outbox::health`] calls the outbox degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "HealthThresholds do nothing until `Outbox::health`"]
pub struct HealthThresholds {
    /// The oldest pending event may be at most this old. Defaults to 1 hour.
    pub max_pending_age: Duration,
}

impl HealthThresholds {
    /// The oldest pending event may be at most `age` old. Defaults to 1 hour.
    pub fn max_pending_age(mut self, age: Duration) -> HealthThresholds {
        self.max_pending_age = age;
        self
    }
}

impl Default for HealthThresholds {
    fn default() -> Self {
        HealthThresholds {
            max_pending_age: Duration::from_secs(3600),
        }
    }
}

/// What a prune did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct PruneReport {
    /// Rows deleted.
    pub deleted: usize,
    /// Transactions used (one per page; expired and exported rows take at least one more).
    pub pages: usize,
}

fn file_size(path: &std::path::Path) -> i64 {
    std::fs::metadata(path).map_or(0, |m| m.len() as i64)
}

/// Deletes finished rows one page per transaction until none is left, reporting the
/// running total after each page.
fn delete_in_pages(
    outbox: &Outbox,
    which: Finished,
    progress: &mut dyn FnMut(usize),
) -> Result<PruneReport> {
    let mut conn = outbox.connection()?;
    let mut report = PruneReport::default();
    loop {
        let deleted = queue::delete_page(&mut conn, which)?;
        report.deleted += deleted;
        report.pages += 1;
        progress(report.deleted);
        if deleted < queue::DELETE_PAGE_ROWS {
            return Ok(report);
        }
    }
}

impl Outbox {
    /// How far `destination` has everything of this outbox's default source: the stream
    /// number through which every event is delivered (with a receipt where the destination
    /// requires them, see [`Destination::receipt_key`](crate::Destination::receipt_key)) or
    /// accounted to the destination, which took the accounting, and when that was reached.
    /// A running relay keeps it (within a quarter of its accounting interval, at most
    /// 15 s); `None` before the first. An app can tell its user "everything up to here is
    /// safe": compare with the number its event took ([`Outbox::stream_numbers`]).
    ///
    /// # Errors
    ///
    /// [`Error::Pool`](crate::Error::Pool) or SQLite errors.
    pub fn synced_through(&self, destination: &str) -> Result<Option<SyncedThrough>> {
        let conn = self.connection()?;
        Ok(
            crate::store::stream_accounts::synced(&conn, destination, &self.default_source())?
                .map(|(through, at_ms)| SyncedThrough { through, at_ms }),
        )
    }

    /// Counts by state and destination, the oldest pending age, attempts, sizes and the
    /// dropped and coalesced totals.
    ///
    /// It costs what it returns, whatever the backlog or the history: pending rows are
    /// counted from totals the queue keeps, and the oldest is found with a few index seeks.
    /// The totals cover the rows up to the last call's; rows committed since are counted,
    /// then folded in if the write lock is free at that moment, in ranges of 20,000 ids, each
    /// its own short transaction with a pause between, for at most 250 ms a call (a first
    /// call with at most 20,000 pending rows folds them all at once through the pending
    /// index, however long the history). On a file migrated with a large backlog the first
    /// calls count the rows not folded yet one by one (exact all the same, but slower, and
    /// never holding the write lock long; docs/PERFORMANCE.md has the figures). Rows edited
    /// by hand in `outbox_events`, outside this crate and the `outbox_enqueue` view, bypass
    /// the totals.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn stats(&self) -> Result<Stats> {
        let mut conn = self.connection()?;
        let now = self.now_ms();
        // Each count comes from where it costs what it returns: pending rows from the totals
        // the queue keeps (src/store/queue/tally.rs) and the rows committed since, their oldest through
        // a few index seeks, dead ones through the dead index, delivered ones from the
        // totals the queue keeps. Nothing here reads delivered history, nor a backlog.
        match tally::fold(&mut conn) {
            // The fold only moves counts into the totals; without it they are read from
            // the rows above them, so a full disk still gets its stats.
            Err(e) if e.is_disk_full() => {}
            folded => folded?,
        }
        let tx = conn.transaction()?;
        let disabled = disabled::reasons(&tx)?;
        let mut by_name = BTreeMap::new();
        let pending = tally::read(&tx, now)?;
        let pending_bytes = pending.values().map(|p| p.bytes).sum();
        let in_flight = pending.values().map(|p| p.leased).sum();
        let mut attempts: BTreeMap<i64, i64> = BTreeMap::new();
        for p in pending.values() {
            for (spent, n) in &p.by_attempts {
                *attempts.entry(*spent).or_default() += n;
            }
        }
        for (name, p) in pending {
            let oldest = oldest::oldest_pending(&tx, &name)?;
            let d = destination_slot(&mut by_name, name);
            d.pending = p.rows;
            d.oldest_pending_age_ms = oldest.map(|t| (now - t).max(0));
        }
        for (sql, dead) in [
            (DEAD_BY_DESTINATION, true),
            (DELIVERED_BY_DESTINATION, false),
        ] {
            let rows: Vec<(String, i64)> = tx
                .prepare_cached(sql)?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (name, n) in rows {
                let d = destination_slot(&mut by_name, name);
                if dead {
                    d.dead = n;
                } else {
                    d.delivered = n;
                }
            }
        }
        let mut destinations: Vec<DestinationStats> = by_name.into_values().collect();
        let source = self.default_source();
        for d in &mut destinations {
            d.disabled = disabled.get(&d.name).cloned();
            d.synced_through = crate::store::stream_accounts::synced(&tx, &d.name, &source)?
                .map(|(through, at_ms)| SyncedThrough { through, at_ms });
        }
        for (name, reason) in &disabled {
            if !destinations.iter().any(|d| &d.name == name) {
                destinations.push(DestinationStats {
                    disabled: Some(reason.clone()),
                    ..DestinationStats::named(name.clone())
                });
            }
        }
        for budget in budget_spend::all(&tx, None, now)? {
            let d = match destinations
                .iter_mut()
                .find(|d| d.name == budget.destination)
            {
                Some(d) => d,
                None => {
                    destinations.push(DestinationStats::named(budget.destination.clone()));
                    destinations.last_mut().expect("just pushed")
                }
            };
            d.budget = Some(budget);
        }
        let (dropped, coalesced, expired, pruned_for_room): (i64, i64, i64, i64) = tx.query_row(
            "SELECT dropped, coalesced, expired, pruned_for_room FROM outbox_stats WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        let dead_attempts: Vec<(i64, i64)> = tx
            .prepare_cached(ATTEMPTS_OF_DEAD)?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (spent, n) in dead_attempts {
            *attempts.entry(spent).or_default() += n;
        }
        let attempts_histogram: Vec<(i64, i64)> = attempts.into_iter().collect();
        let database_bytes = crate::store::database::database_bytes(&tx)?;
        drop(tx);
        let mut wal = self.path().as_os_str().to_owned();
        wal.push("-wal");
        Ok(Stats {
            pending: destinations.iter().map(|d| d.pending).sum(),
            in_flight,
            delivered: destinations.iter().map(|d| d.delivered).sum(),
            dead: destinations.iter().map(|d| d.dead).sum(),
            pending_bytes,
            oldest_pending_age_ms: destinations
                .iter()
                .filter_map(|d| d.oldest_pending_age_ms)
                .max(),
            destinations,
            attempts_histogram,
            database_bytes,
            wal_bytes: file_size(std::path::Path::new(&wal)),
            dropped,
            coalesced,
            expired,
            pruned_for_room,
            disk_free_bytes: self.disk_room().available_bytes(),
            disk_reserve_bytes: self.disk_room().held_bytes(),
            disk_full: self.disk_room().is_full(),
        })
    }

    /// Where the data budget of `destination` stands
    /// ([`Destination::budget`](crate::Destination::budget)): its limit, what the current
    /// period has spent (every relay of the file), when the period ends, and when the
    /// budget runs out at the rate spent so far. `None` if no relay has kept a budget for
    /// it. For an app to show "sync paused until …" or warn before the plan runs out.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn budget(&self, destination: &str) -> Result<Option<BudgetStatus>> {
        let conn = self.connection()?;
        budget_spend::status(&conn, destination, self.now_ms())
    }

    /// Pending deliveries to `destination` (all destinations with `None`).
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn pending_count(&self, destination: Option<&str>) -> Result<i64> {
        let conn = self.connection()?;
        Ok(match destination {
            None => conn.query_row(
                &format!(
                    "SELECT COUNT(*) FROM outbox_events INDEXED BY outbox_events_pending
                      WHERE {PENDING}"
                ),
                [],
                |r| r.get(0),
            )?,
            Some(d) => conn.query_row(
                &format!("SELECT COUNT(*) FROM outbox_events WHERE destination = ?1 AND {PENDING}"),
                [d],
                |r| r.get(0),
            )?,
        })
    }

    /// Lists deliveries in `state` (all states with `None`): pending oldest first, the others
    /// newest first; at most `limit`.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn list(&self, state: Option<State>, limit: usize) -> Result<Vec<EventRecord>> {
        let conn = self.connection()?;
        let mut stmt = conn.prepare(&list_sql(state))?;
        let rows = stmt.query_map([limit as i64], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The deliveries of one event (one per destination).
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn show(&self, event_id: &str) -> Result<Vec<EventRecord>> {
        let conn = self.connection()?;
        let mut stmt = conn.prepare(&format!(
            "SELECT {RECORD_COLUMNS} FROM outbox_events INDEXED BY outbox_events_event_id
              WHERE event_id = ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map([event_id], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Dead letters, newest first, with their last errors.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<EventRecord>> {
        self.list(Some(State::Dead), limit)
    }

    /// Makes the given events due now with a fresh attempt budget: dead letters come back,
    /// and pending events waiting out a backoff are tried at once. Delivered, expired (past
    /// their deadline) and exported (handed to a bundle) ones are left alone. Returns how
    /// many deliveries were reset.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn retry(&self, event_ids: &[&str]) -> Result<usize> {
        let mut conn = self.connection()?;
        let now = self.now_ms();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut reset = 0;
        for id in event_ids {
            reset += queue::retry_event(&tx, id, now)?;
        }
        tx.commit()?;
        self.notify();
        Ok(reset)
    }

    /// Retries every dead letter that `filter` selects; returns how many. Works in pages of
    /// 500 dead rows, each a short transaction of its own with a
    /// pause between them, so the app's commits do not wait behind a long history of dead
    /// letters; on an error the pages before it stay retried.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn retry_dead(&self, filter: &DeadFilter) -> Result<usize> {
        let mut conn = self.connection()?;
        let since = filter.since_ms.unwrap_or(i64::MIN);
        let until = filter.until_ms.unwrap_or(i64::MAX);
        let mut reset = 0;
        let mut after = None;
        loop {
            let started = std::time::Instant::now();
            let now = self.now_ms();
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let page = queue::dead_rows_page(&tx, since, until, after, queue::DELETE_PAGE_ROWS)?;
            let Some((dead_at, id, _)) = page.last() else {
                tx.commit()?;
                break;
            };
            after = Some((*dead_at, *id));
            for (_, id, event_type) in &page {
                if filter
                    .event_type
                    .as_deref()
                    .is_none_or(|p| type_matches(p, event_type))
                {
                    reset += queue::retry_row(&tx, *id, now)?;
                }
            }
            tx.commit()?;
            self.notify();
            // Give way to the app for as long as the page held the lock (at most 100 ms).
            std::thread::sleep(started.elapsed().min(Duration::from_millis(100)));
        }
        Ok(reset)
    }

    /// Deletes dead letters (all, or those dead for longer than `older_than`), in pages.
    /// Nothing else ever deletes them.
    ///
    /// # Errors
    ///
    /// SQLite errors; pages already deleted stay deleted.
    pub fn purge_dead(&self, older_than: Option<Duration>) -> Result<PruneReport> {
        let cutoff = older_than.map_or(i64::MAX, |d| {
            self.now_ms().saturating_sub(d.as_millis() as i64)
        });
        delete_in_pages(self, Finished::DeadSince(cutoff), &mut |_| {})
    }

    /// Deletes delivered events older than `older_than`, a page of 500 rows per transaction
    /// so the app's writes never wait long; never pending
    /// or dead ones. After a large prune the WAL is checkpointed and free pages are returned
    /// to the file system (on files created with incremental auto-vacuum, as this crate
    /// creates them).
    ///
    /// # Errors
    ///
    /// SQLite errors; pages already deleted stay deleted.
    pub fn prune_delivered(&self, older_than: Duration) -> Result<PruneReport> {
        self.prune_delivered_with_progress(older_than, |_| {})
    }

    /// [`prune_delivered`](Self::prune_delivered), calling `progress` with the running total
    /// after each page.
    ///
    /// # Errors
    ///
    /// As [`prune_delivered`](Self::prune_delivered).
    pub fn prune_delivered_with_progress(
        &self,
        older_than: Duration,
        mut progress: impl FnMut(usize),
    ) -> Result<PruneReport> {
        let cutoff = self.now_ms().saturating_sub(older_than.as_millis() as i64);
        let mut report = delete_in_pages(self, Finished::DeliveredBefore(cutoff), &mut progress)?;
        // Expired and exported rows are finished too, and go with the same retention.
        let delivered = report.deleted;
        let settled = delete_in_pages(self, Finished::SettledBefore(cutoff), &mut |n| {
            if n > 0 {
                progress(delivered + n);
            }
        })?;
        report.deleted += settled.deleted;
        report.pages += settled.pages;
        if report.deleted > 0 {
            database::reclaim(&*self.connection()?)?;
        }
        Ok(report)
    }

    /// Checkpoints the WAL (truncating it) and returns free pages to the file system.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn checkpoint(&self) -> Result<()> {
        let conn = self.connection()?;
        database::reclaim(&conn)?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// Ok, or degraded with reasons: dead letters present, the oldest pending event older
    /// than the threshold, a destination disabled.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn health(&self, thresholds: HealthThresholds) -> Result<Health> {
        // What it checks, read where it costs what it returns (the dead index, a few seeks
        // per destination for the oldest pending event): a probe called every few seconds
        // beside a week's backlog must not read the backlog.
        let conn = self.connection()?;
        let now = self.now_ms();
        let mut reasons = Vec::new();
        let dead: i64 = conn
            .prepare_cached(DEAD_BY_DESTINATION)?
            .query_map([], |r| r.get::<_, i64>(1))?
            .sum::<rusqlite::Result<i64>>()?;
        if dead > 0 {
            reasons.push(format!("{dead} dead letters"));
        }
        let oldest = oldest::oldest_pending_anywhere(&conn)?;
        let max_age = thresholds.max_pending_age.as_millis() as i64;
        if let Some(age) = oldest.map(|t| (now - t).max(0)).filter(|a| *a > max_age) {
            reasons.push(format!(
                "oldest pending event is {} old (threshold {})",
                humantime::format_duration(Duration::from_secs((age / 1000) as u64)),
                humantime::format_duration(thresholds.max_pending_age)
            ));
        }
        for d in disabled::list(&conn)? {
            reasons.push(format!("destination {} is disabled: {}", d.name, d.reason));
        }
        let room = self.disk_room();
        if room.is_full() {
            reasons.push(format!(
                "the disk is full: {} bytes free; the outbox's reserve holds {} of {} bytes",
                room.available_bytes().unwrap_or(0),
                room.held_bytes(),
                room.reserve_bytes()
            ));
        }
        Ok(Health {
            ok: reasons.is_empty(),
            reasons,
        })
    }
}
