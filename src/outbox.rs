//! The `Outbox` handle: opening the database and enqueueing events in the caller's transaction.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::event::{Enqueued, Event};
use crate::observe::spans::CreateSpan;
use crate::store::database::{
    self, ConnectionSettings, OnConnect, Pool, PooledConnection, Synchronous,
};
use crate::store::disabled::{self, DisabledDestination};
use crate::store::disk_room::{DiskRoom, DEFAULT_RESERVE_BYTES};
use crate::store::limits::{StorageLimits, StoragePolicy};
use crate::store::queue::{self, NewRow};
use crate::store::right_of_way::RightOfWay;
use crate::store::route::{self, destinations_for, Route};
use crate::store::settings::{Explicit, LiveSettings, Settings};
use crate::store::wake::Wakers;

/// The longest an app transaction waits for a relay write transaction under way before it
/// asks SQLite for the lock (and waits in the busy handler): relay transactions take
/// milliseconds; past this, something else is wrong, and the busy timeout decides.
const RELAY_WRITE_WAIT: Duration = Duration::from_millis(50);

/// A handle to one outbox database file. Cheap to clone; clones share the pool.
///
/// ```
/// use sqlite_outbox::{Event, Outbox};
/// # fn main() -> Result<(), sqlite_outbox::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// let outbox = Outbox::open(dir.path().join("app.db"))?;
/// let enqueued = outbox.transaction(|tx| {
///     tx.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)", [])?;
///     tx.execute("INSERT INTO orders (id) VALUES (42)", [])?;
///     outbox.enqueue(tx, Event::new("order.created", serde_json::json!({"id": 42})))
/// })?;
/// assert!(!enqueued.event_id().is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    path: PathBuf,
    /// The file's name as SQLite reports it for the pool's connections (symlinks resolved),
    /// what an app's own connection to the file reports too: `enqueue` compares with it.
    sqlite_name: Option<String>,
    settings: ConnectionSettings,
    clock: Arc<dyn Clock>,
    /// Routes, limits, policies, defaults: kept in the file, followed as they change.
    live: LiveSettings,
    /// The relays of this process to wake after a local commit.
    wakers: Wakers,
    /// The app's write transactions (and a relay's WAL catch-up), which the relay's writer
    /// lets go first.
    right_of_way: RightOfWay,
    /// Who hears of delivered and dead events.
    subscribers: crate::observe::notices::Subscribers,
    /// The reserve kept for a full disk.
    disk_room: DiskRoom,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("path", &self.inner.path)
            .field("settings", &self.inner.live.peek())
            .finish_non_exhaustive()
    }
}

/// Settings for opening an [`Outbox`].
///
/// Two kinds. The connection's ([`pool_size`](Self::pool_size),
/// [`synchronous`](Self::synchronous), [`busy_timeout`](Self::busy_timeout),
/// [`on_connect`](Self::on_connect), …) last as long as this process's `Outbox`. The
/// enqueue policy's ([`payload_limit`](Self::payload_limit),
/// [`default_source`](Self::default_source), [`route`](Self::route),
/// [`priority_for`](Self::priority_for), [`max_pending`](Self::max_pending),
/// [`storage_policy`](Self::storage_policy), lifetimes) are **kept in the file** at
/// [`open`](Self::open), so every writer of the file (the CLI, apps in other languages)
/// follows them: they stay after the code stops setting them, until `outbox config unset`
/// or [`settings`](crate::settings) removes them.
#[must_use = "an OutboxBuilder does nothing until `.open(path)`"]
pub struct OutboxBuilder {
    pool_size: u32,
    synchronous: Synchronous,
    busy_timeout: Duration,
    wal_autocheckpoint: u32,
    payload_limit: Option<usize>,
    default_source: Option<String>,
    routes: Vec<Route>,
    priorities: Vec<(String, u8)>,
    expiries: Vec<(String, Duration)>,
    limits: StorageLimits,
    clock: Arc<dyn Clock>,
    on_connect: Option<OnConnect>,
    disk_reserve: u64,
}

impl fmt::Debug for OutboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("pool_size", &self.pool_size)
            .field("synchronous", &self.synchronous)
            .field("busy_timeout", &self.busy_timeout)
            .field("wal_autocheckpoint", &self.wal_autocheckpoint)
            .field("payload_limit", &self.payload_limit)
            .field("default_source", &self.default_source)
            .field("routes", &self.routes)
            .field("priorities", &self.priorities)
            .field("expiries", &self.expiries)
            .field("limits", &self.limits)
            .field("on_connect", &self.on_connect.is_some())
            .field("disk_reserve", &self.disk_reserve)
            .finish_non_exhaustive()
    }
}

impl Default for OutboxBuilder {
    fn default() -> Self {
        OutboxBuilder {
            pool_size: 4,
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            wal_autocheckpoint: 8192,
            payload_limit: None,
            default_source: None,
            routes: Vec::new(),
            priorities: Vec::new(),
            expiries: Vec::new(),
            limits: StorageLimits::default(),
            clock: Arc::new(SystemClock),
            on_connect: None,
            disk_reserve: DEFAULT_RESERVE_BYTES,
        }
    }
}

impl OutboxBuilder {
    /// The default limit on an event's serialized data: 256 KiB.
    pub const DEFAULT_PAYLOAD_LIMIT: usize = crate::store::settings::DEFAULT_PAYLOAD_LIMIT;

    /// Sets the number of pooled connections. A running relay keeps one. Defaults to 4.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Sets `PRAGMA synchronous` for every connection. Defaults to [`Synchronous::Normal`].
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// Sets how long a connection waits for SQLite's write lock. Defaults to 5 s.
    ///
    /// The wait goes in fine steps (25 µs at first), so a lock held briefly by a relay costs
    /// the app about that long instead of SQLite's default first sleep of 1 ms. The handler
    /// is process-wide: the longest timeout any outbox of the process set applies.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets `PRAGMA wal_autocheckpoint` (in pages) on pooled connections. A running relay
    /// checkpoints the WAL in the background (and restarts it past 4096 pages), so commits
    /// through the pool never pay for a checkpoint; this limit keeps the WAL bounded (8192
    /// pages of 4 KiB, 32 MiB) when no relay runs. Set the same on connections of your own.
    /// Defaults to 8192.
    pub fn wal_autocheckpoint(mut self, pages: u32) -> Self {
        self.wal_autocheckpoint = pages;
        self
    }

    /// Sets the largest serialized event data accepted, in bytes. Defaults to 256 KiB.
    ///
    /// Like every setting of enqueue's policy here (routes, limits, policies, priorities,
    /// lifetimes, the default source), it is written into the file at [`open`](Self::open)
    /// (setting `payload_limit`), so that the CLI and apps in other languages that write to
    /// the same file follow it too; see [`settings`](crate::settings).
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = Some(bytes);
        self
    }

    /// Sets the CloudEvents `source` of events that set none. Defaults to `/sqlite-outbox`.
    /// Kept in the file (setting `default_source`): it stays after the code stops setting
    /// it.
    pub fn default_source(mut self, source: impl Into<String>) -> Self {
        self.default_source = Some(source.into());
        self
    }

    /// Routes events whose type matches `pattern` to the destination named `destination`.
    ///
    /// Patterns are an exact type (`order.created`), a prefix ending in `*` (`order.*`), or
    /// `*` for everything. An event goes to every destination with a matching route, each
    /// delivery tracked on its own (its own attempts, its own backoff). With no routes at all,
    /// every event goes to [`Destination::DEFAULT`](crate::Destination::DEFAULT); with routes, an event that matches none is
    /// refused with [`Error::NoRoute`] rather than silently kept.
    pub fn route(mut self, pattern: impl Into<String>, destination: impl Into<String>) -> Self {
        self.routes
            .push(Route::new(pattern.into(), destination.into()));
        self
    }

    /// The priority of events of types matching `pattern` (an exact type, `prefix.*`, or
    /// `*`) that set none themselves: 0 (least urgent) to 9 (most urgent). The most
    /// specific matching pattern wins (the exact type, then the longest prefix, then `*`);
    /// without any, 5. For example `priority_for("alarm.*", 9)` and
    /// `priority_for("telemetry.*", 1)` send alarms first after a reconnect.
    pub fn priority_for(mut self, pattern: impl Into<String>, priority: u8) -> Self {
        let pattern = pattern.into();
        self.priorities.retain(|(p, _)| *p != pattern);
        self.priorities.push((pattern, priority));
        self
    }

    /// The lifetime of events of types matching `pattern` that set none themselves
    /// ([`Event::expires_in`]): not delivered within it of their commit, they expire. The
    /// most specific matching pattern wins; without any, events never expire. For example
    /// `expiry_for("telemetry.*", Duration::from_secs(3600))`.
    pub fn expiry_for(mut self, pattern: impl Into<String>, lifetime: Duration) -> Self {
        let pattern = pattern.into();
        self.expiries.retain(|(p, _)| *p != pattern);
        self.expiries.push((pattern, lifetime));
        self
    }

    /// Limits the pending deliveries (one per event and destination). At the limit, events of
    /// [`StoragePolicy::DropOldest`] types make room; otherwise enqueue fails with
    /// [`Error::OutboxFull`]. Defaults to no limit.
    pub fn max_pending(mut self, count: u64) -> Self {
        self.limits.max_pending = Some(i64::try_from(count).unwrap_or(i64::MAX));
        self
    }

    /// Limits the bytes of pending event data, like [`max_pending`](Self::max_pending).
    /// Defaults to no limit.
    pub fn max_pending_bytes(mut self, bytes: u64) -> Self {
        self.limits.max_pending_bytes = Some(i64::try_from(bytes).unwrap_or(i64::MAX));
        self
    }

    /// Sets the storage policy of event types matching `pattern` (same patterns as
    /// [`route`](Self::route)); the most specific matching pattern wins, so
    /// `storage_policy("*", DropOldest)` with `storage_policy("order.*", Reject)` keeps orders.
    /// Types without a policy are [`StoragePolicy::Reject`]: they are never dropped to make
    /// room.
    pub fn storage_policy(mut self, pattern: impl Into<String>, policy: StoragePolicy) -> Self {
        let pattern = pattern.into();
        self.limits.policies.retain(|(p, _)| *p != pattern);
        self.limits.policies.push((pattern, policy));
        self
    }

    /// Sets the clock used for timestamps, backoff and leases. Defaults to the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs `setup` first on every connection the outbox opens to the file (its pool, the
    /// relay's writer and checkpointer, the settings reader, the check of
    /// [`open_existing`](Self::open_existing)), before the outbox's own PRAGMAs and before
    /// anything is read: SQLCipher's `PRAGMA key`, which must come first, or the app's own
    /// `PRAGMA cache_size` on a device with little memory. The outbox's own are only
    /// `journal_mode=WAL`, `synchronous` (this builder's), `wal_autocheckpoint` and a busy
    /// handler; whatever else `setup` sets (`foreign_keys=ON`, say) stays. Defaults to
    /// nothing.
    ///
    /// ```
    /// # fn main() -> Result<(), sqlite_outbox::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let outbox = sqlite_outbox::Outbox::builder()
    ///     // With SQLCipher linked (see the crate's features): c.pragma_update(None, "key", key)
    ///     .on_connect(|c| c.execute_batch("PRAGMA cache_size = -512"))
    ///     .open(dir.path().join("app.db"))?;
    /// # Ok(()) }
    /// ```
    ///
    /// An error from `setup` fails [`open`](Self::open) (or the relay's start, or the
    /// connection) with [`Error::OnConnect`]; with SQLCipher, a wrong key shows there, or as
    /// [`Error::NotADatabase`] at the first read.
    pub fn on_connect<F>(mut self, setup: F) -> Self
    where
        F: Fn(&rusqlite::Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    {
        self.on_connect = Some(Arc::new(setup));
        self
    }

    /// Sets the room kept for a full disk: a file of `bytes` beside the database,
    /// `<database>-outbox-reserve`, taken at open when the file system has room for it twice
    /// over. When SQLite reports the disk full to a relay, the relay gives it back to the
    /// file system and so goes on claiming, sending and acknowledging, deletes delivered
    /// history (whatever the retention) so the app's commits fit in the pages that frees,
    /// and takes the reserve again once the disk has room (see the guide's
    /// [full disk](crate::guide::durability#a-full-disk) section). 0 keeps no reserve.
    /// Defaults to 2 MiB.
    pub fn disk_reserve(mut self, bytes: u64) -> Self {
        self.disk_reserve = bytes;
        self
    }

    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    ///
    /// A relative `path` is made absolute once, here, against the working directory of the
    /// moment, and on Unix its symbolic links are resolved ([`Outbox::path`] returns it):
    /// connections opened later, after the app changed its working directory, open the same
    /// file, and the outbox's own files and looks are beside the file SQLite opens.
    ///
    /// The settings given to this builder are written into the file's `outbox_settings`
    /// table: a kind of setting the builder sets (any route, say) replaces that kind in the
    /// file, and each stored value it changes or removes is logged as a warning. Settings the
    /// builder leaves alone are taken from the file. Later changes to the file (`outbox
    /// config set`) are followed within a quarter second.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaTooNew`] if a newer crate wrote the file, [`Error::NotADatabase`] if it
    /// is not SQLite (or SQLCipher's key is wrong), [`Error::InvalidPath`] for `:memory:`,
    /// `""` and `file:` URIs, [`Error::OnConnect`] if the app's setup failed,
    /// [`Error::InvalidConfig`] for a pool size below 1 or a setting out of
    /// range ([`Error::InvalidSetting`] for the settings kept in the file), and SQLite errors
    /// (permissions, a full disk). In the first two cases the file is left untouched.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Outbox> {
        if self.pool_size == 0 {
            return Err(Error::InvalidConfig("pool size must be at least 1".into()));
        }
        if let Some((pattern, p)) = self
            .priorities
            .iter()
            .find(|(_, p)| *p > Event::MAX_PRIORITY)
        {
            return Err(Error::InvalidConfig(format!(
                "priority {p} for {pattern:?} is out of range: 0 (least urgent) to 9 (most urgent)"
            )));
        }
        if let Some((pattern, _)) = self.expiries.iter().find(|(_, d)| d.as_millis() == 0) {
            return Err(Error::InvalidConfig(format!(
                "an expiry of zero for {pattern:?} is out of range: at least 1 ms"
            )));
        }
        for route in &self.routes {
            route::validate_name(route.destination())?;
        }
        let path = database::resolve_path(path.as_ref())?;
        let settings = self.connection_settings();
        let explicit = self.explicit_settings()?;
        let disk_room = DiskRoom::new(&path, self.disk_reserve);
        let (pool, path) = match database::open_pool(&path, &settings, self.pool_size) {
            // A disk too full to open the file on (SQLite's `-wal` and `-shm` files need
            // room): the reserve goes back to the file system, and the open is tried again.
            Err(e) if e.is_disk_full() && disk_room.disk_full() > 0 => {
                log::warn!(
                    "{}: the disk is full; gave back the outbox's reserve to open the file",
                    path.display()
                );
                database::open_pool(&path, &settings, self.pool_size)?
            }
            opened => opened?,
        };
        let rows = {
            let mut conn = pool.get()?;
            let rows = if explicit.rows.is_empty() && explicit.owned.is_empty() {
                crate::store::settings::load_rows(&conn)?
            } else {
                crate::store::settings::overlay(&mut conn, &explicit)?
            };
            let limits = crate::store::settings::Settings::from_rows(&rows).limits;
            if limits.is_set() {
                crate::store::limits::ensure_totals(&mut conn)?;
                limits.mark_pending(&mut conn)?;
            }
            rows
        };
        disk_room.take();
        let live = LiveSettings::new(rows, &path, &settings);
        Outbox::assemble(pool, path, settings, live, disk_room, self.clock)
    }

    /// What every connection gets.
    fn connection_settings(&self) -> ConnectionSettings {
        ConnectionSettings {
            synchronous: self.synchronous,
            busy_timeout: self.busy_timeout,
            wal_autocheckpoint: self.wal_autocheckpoint,
            on_connect: self.on_connect.clone(),
        }
    }

    /// The settings this builder was given, as rows of `outbox_settings`.
    fn explicit_settings(&self) -> Result<Explicit> {
        let mut explicit = Explicit::default();
        if let Some(source) = &self.default_source {
            explicit.single("default_source", source.clone());
        }
        if let Some(limit) = self.payload_limit {
            explicit.single("payload_limit", limit.to_string());
        }
        if let Some(max) = self.limits.max_pending {
            explicit.single("max_pending", max.to_string());
        }
        if let Some(max) = self.limits.max_pending_bytes {
            explicit.single("max_pending_bytes", max.to_string());
        }
        let mut routes: Vec<(&str, Vec<&str>)> = Vec::new();
        for route in &self.routes {
            match routes.iter_mut().find(|(p, _)| *p == route.pattern()) {
                Some((_, names)) => names.push(route.destination()),
                None => routes.push((route.pattern(), vec![route.destination()])),
            }
        }
        for (pattern, names) in routes {
            let names = serde_json::to_string(&names).map_err(Error::InvalidData)?;
            explicit.pattern("route:", pattern, names);
        }
        for (pattern, policy) in &self.limits.policies {
            let value = match policy {
                StoragePolicy::DropOldest => "drop_oldest",
                StoragePolicy::Reject => "reject",
            };
            explicit.pattern("policy:", pattern, value.to_string());
        }
        for (pattern, priority) in &self.priorities {
            explicit.pattern("priority:", pattern, priority.to_string());
        }
        for (pattern, lifetime) in &self.expiries {
            explicit.pattern("expiry:", pattern, lifetime.as_millis().to_string());
        }
        Ok(explicit)
    }

    /// Opens the outbox at `path`, which must already exist and hold one, and brings its
    /// schema up to date: for tools that must never create a file or touch a foreign one.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if there is no file, [`Error::NotADatabase`] if it is not SQLite,
    /// [`Error::NotAnOutbox`] if it holds no outbox (in these three cases nothing is created
    /// or changed: the file is checked on a read-only connection first), then as
    /// [`open`](Self::open).
    pub fn open_existing(self, path: impl AsRef<Path>) -> Result<Outbox> {
        let path = database::resolve_path(path.as_ref())?;
        database::check_existing(&path, &self.connection_settings())?;
        self.open(path)
    }

    /// Opens the outbox at `path` for reading only: the file is not migrated, no PRAGMA that
    /// writes is run, no file is created (no disk reserve, and no `-wal` or `-shm` when no
    /// other connection has the file open), and not a byte of it changes. For tools that
    /// look (`outbox stats`, `list`, `show`, `health`, `config show`) beside an app of
    /// another release: a newer tool never upgrades the file under an older app.
    ///
    /// Reads work as on any outbox ([`stats`](Outbox::stats), [`list`](Outbox::list),
    /// [`health`](Outbox::health), …); anything that writes (enqueue, a relay, repairs)
    /// fails with SQLite's read-only error. Settings given to this builder that are kept in
    /// the file (routes, limits, …) are not written either.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`], [`Error::NotADatabase`], [`Error::NotAnOutbox`] as
    /// [`open_existing`](Self::open_existing); [`Error::SchemaOutdated`] for a file at an
    /// older schema version (a read-write open migrates it), [`Error::SchemaTooNew`] for a
    /// newer one.
    pub fn open_read_only(self, path: impl AsRef<Path>) -> Result<Outbox> {
        if self.pool_size == 0 {
            return Err(Error::InvalidConfig("pool size must be at least 1".into()));
        }
        let path = database::resolve_path(path.as_ref())?;
        let settings = self.connection_settings();
        let pool = database::open_read_only_pool(&path, &settings, self.pool_size)?;
        let rows = crate::store::settings::load_rows(&*pool.get()?)?;
        let live = LiveSettings::fixed(rows, &path, &settings);
        // No reserve: nothing is written, and no file is made.
        let disk_room = DiskRoom::new(&path, 0);
        Outbox::assemble(pool, path, settings, live, disk_room, self.clock)
    }
}

impl Outbox {
    /// The settings in force (read again from the file within a quarter second of a change).
    pub(crate) fn current_settings(&self) -> Arc<Settings> {
        self.inner.live.get()
    }

    /// The subscribers to delivery notices (see `notices.rs`).
    pub(crate) fn subscribers(&self) -> &crate::observe::notices::Subscribers {
        &self.inner.subscribers
    }

    /// Opens the database at `path` with default settings. See [`OutboxBuilder::open`].
    ///
    /// # Errors
    ///
    /// As [`OutboxBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Outbox> {
        OutboxBuilder::default().open(path)
    }

    /// Opens an outbox that must already exist, with default settings. See
    /// [`OutboxBuilder::open_existing`].
    ///
    /// # Errors
    ///
    /// As [`OutboxBuilder::open_existing`].
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Outbox> {
        OutboxBuilder::default().open_existing(path)
    }

    /// Starts configuring an outbox.
    pub fn builder() -> OutboxBuilder {
        OutboxBuilder::default()
    }

    /// The database file's path: absolute, as [`OutboxBuilder::open`] resolved it (on Unix
    /// with its symbolic links resolved, see [`guide::platforms`](crate::guide::platforms)).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Writes `event` inside `tx`: it commits with the caller's business writes, or not at all.
    ///
    /// `tx` is a [`rusqlite::Transaction`] or a [`rusqlite::Savepoint`] (both dereference to
    /// the connection this takes), on any connection to the same database file, including
    /// one the application opened itself. After committing such a transaction, call
    /// [`notify`](Self::notify) to wake a relay in this process at once (otherwise it notices
    /// within its poll interval).
    ///
    /// # Errors
    ///
    /// [`Error::NotInTransaction`] for a connection in autocommit mode (no transaction
    /// open): the event would commit on its own, apart from the business change. Input errors ([`Error::InvalidEventType`], [`Error::FieldTooLong`],
    /// [`Error::PayloadTooLarge`], [`Error::InvalidData`]) are found before anything is
    /// written: `tx` stays usable and can still commit the caller's other writes. A repeated
    /// idempotency key is not an error: it returns [`Enqueued::Duplicate`].
    pub fn enqueue(&self, tx: &Connection, mut event: Event) -> Result<Enqueued> {
        self.require_own_transaction(tx)?;
        let settings = self.inner.live.get();
        let payload = event.validate(settings.payload_limit)?;
        let destinations = routed(&settings, &event.event_type)?;
        let span = CreateSpan::capture(&mut event, |_| destinations.clone());
        let event_id = uuid::Uuid::now_v7().to_string();
        let ready = Ready {
            event: &event,
            event_id: &event_id,
            payload: &payload,
            destinations: &destinations,
        };
        let enqueued = self.write_guarded(tx, &settings, &ready);
        span.finish(enqueued.as_ref().map(Enqueued::event_id));
        enqueued
    }

    /// Writes `events` inside `tx`, in order: the same rows, ids, order and answers as
    /// [`enqueue`](Self::enqueue) called for each in turn, with one `INSERT` per hundred
    /// events instead of one per event.
    ///
    /// For an app that writes several events in one transaction (a burst of readings, the
    /// lines of an order): SQLite starts and halts a statement for every `INSERT`, and
    /// `enqueue` checks each event's key and id inside its own; here those checks run once
    /// for the whole call. `cargo run --release --example bench -- enqueue` compares both
    /// with bare `INSERT`s (docs/PERFORMANCE.md).
    ///
    /// Events with an idempotency key or a coalescing key, events routed to several
    /// destinations, and every event while a storage limit is set are written one at a
    /// time, as `enqueue` writes them, in their place in the order; a call with any of them
    /// runs inside a savepoint, so that an error (a storage limit that refuses an event,
    /// say) leaves `tx` as it was.
    ///
    /// # Errors
    ///
    /// [`Error::NotInTransaction`] as [`enqueue`](Self::enqueue). The first input error of
    /// any event ([`Error::InvalidEventType`],
    /// [`Error::FieldTooLong`], [`Error::PayloadTooLarge`], [`Error::InvalidData`],
    /// [`Error::NoRoute`], …) is found before anything is written: `tx` stays usable. A
    /// repeated idempotency key is not an error: that event's answer is
    /// [`Enqueued::Duplicate`]. An SQLite error while writing (a full disk, an I/O error)
    /// in a call with none of the events written one at a time may leave some events
    /// written: roll `tx` back, as after any failed write. (A savepoint there would cost a
    /// temporary file per call: past 64 KiB of changed pages, SQLite spills a savepoint's
    /// journal to disk.)
    pub fn enqueue_many<I>(&self, tx: &Connection, events: I) -> Result<Vec<Enqueued>>
    where
        I: IntoIterator<Item = Event>,
    {
        self.require_own_transaction(tx)?;
        let settings = self.inner.live.get();
        let mut events: Vec<Event> = events.into_iter().collect();
        let spans: Vec<CreateSpan> = events
            .iter_mut()
            .map(|event| {
                CreateSpan::capture(event, |event_type| {
                    routed(&settings, event_type).unwrap_or_default()
                })
            })
            .collect();
        let enqueued = self.enqueue_checked(tx, &settings, &events);
        match &enqueued {
            Ok(answers) => {
                for (span, answer) in spans.into_iter().zip(answers) {
                    span.finish(Ok(answer.event_id()));
                }
            }
            Err(e) => spans.into_iter().for_each(|span| span.finish(Err(e))),
        }
        enqueued
    }

    /// `enqueue_many` after trace context is captured: every check, then the writes.
    fn enqueue_checked(
        &self,
        tx: &Connection,
        settings: &Settings,
        events: &[Event],
    ) -> Result<Vec<Enqueued>> {
        // Every event's checks before anything is written. Each type is routed once.
        let mut routes: Vec<(&str, Vec<&str>)> = Vec::new();
        let mut route_of_type: std::collections::HashMap<&str, usize> = Default::default();
        let mut checked = Vec::with_capacity(events.len());
        for event in events {
            let payload = event.validate(settings.payload_limit)?;
            // Events of one type often come together: the type routed last is checked
            // before the map is hashed.
            let last = routes.len().checked_sub(1);
            let route = if let Some(route) = last.filter(|r| routes[*r].0 == event.event_type) {
                route
            } else if let Some(route) = route_of_type.get(event.event_type.as_str()) {
                *route
            } else {
                routes.push((&event.event_type, routed(settings, &event.event_type)?));
                route_of_type.insert(&event.event_type, routes.len() - 1);
                routes.len() - 1
            };
            // A run's rows cannot be duplicates: `insert_run` writes every one of them.
            let plain = !needs_savepoint(settings, event, &routes[route].1)
                && event.idempotency_key.is_none();
            checked.push(Checked {
                payload,
                route,
                plain,
            });
        }
        if checked.iter().all(|c| c.plain) {
            return self.write_many(tx, settings, events, &checked, &routes);
        }
        tx.prepare_cached("SAVEPOINT outbox_enqueue_many")?
            .execute([])?;
        let result = self.write_many(tx, settings, events, &checked, &routes);
        if result.is_err() {
            tx.prepare_cached("ROLLBACK TO outbox_enqueue_many")?
                .execute([])?;
        }
        tx.prepare_cached("RELEASE outbox_enqueue_many")?
            .execute([])?;
        result
    }

    /// `enqueue_many`'s writes, after every event passed its checks: runs of plain events
    /// through [`queue::insert_run`], the others one at a time in between.
    fn write_many(
        &self,
        tx: &Connection,
        settings: &Settings,
        events: &[Event],
        checked: &[Checked],
        routes: &[(&str, Vec<&str>)],
    ) -> Result<Vec<Enqueued>> {
        // Every id first, in the events' order, so that ids (UUIDv7) rise with the rows'
        // order as they do for one `enqueue` after another.
        let event_ids: Vec<String> = events
            .iter()
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let now = self.inner.clock.now_ms();
        // The answers of the events written one at a time; the plain ones are `New`.
        let mut guarded_answers: Vec<Option<Enqueued>> = Vec::with_capacity(events.len());
        let mut run: Vec<(&str, NewRow<'_>)> = Vec::new();
        for ((event, c), event_id) in events.iter().zip(checked).zip(&event_ids) {
            let ready = Ready {
                event,
                event_id,
                payload: &c.payload,
                destinations: &routes[c.route].1,
            };
            if c.plain {
                run.push((ready.destinations[0], new_row(settings, &ready, now)));
                guarded_answers.push(None);
            } else {
                self.write_run(tx, &mut run)?;
                guarded_answers.push(Some(self.write_guarded(tx, settings, &ready)?));
            }
        }
        self.write_run(tx, &mut run)?;
        drop(run);
        Ok(guarded_answers
            .into_iter()
            .zip(event_ids)
            .map(|(answer, event_id)| answer.unwrap_or(Enqueued::New { event_id }))
            .collect())
    }

    /// Inserts the plain events gathered so far and empties `run`.
    fn write_run(&self, tx: &Connection, run: &mut Vec<(&str, NewRow<'_>)>) -> Result<()> {
        queue::insert_run(tx, run)?;
        for (destination, row) in run.drain(..) {
            crate::observe::telemetry::enqueued(row.event_type, destination);
        }
        Ok(())
    }

    /// `enqueue` of one checked event, in a savepoint when it [`needs_savepoint`].
    fn write_guarded(
        &self,
        tx: &Connection,
        settings: &Settings,
        ready: &Ready<'_>,
    ) -> Result<Enqueued> {
        if !needs_savepoint(settings, ready.event, ready.destinations) {
            return self.write_event(tx, settings, ready);
        }
        tx.prepare_cached("SAVEPOINT outbox_enqueue")?.execute([])?;
        let result = self.write_event(tx, settings, ready);
        if !matches!(result, Ok(Enqueued::New { .. })) {
            tx.prepare_cached("ROLLBACK TO outbox_enqueue")?
                .execute([])?;
        }
        tx.prepare_cached("RELEASE outbox_enqueue")?.execute([])?;
        result
    }

    /// Enqueue's writes: replacing a coalesced event, making room, inserting.
    fn write_event(
        &self,
        tx: &Connection,
        settings: &Settings,
        ready: &Ready<'_>,
    ) -> Result<Enqueued> {
        let Ready {
            event,
            event_id,
            payload,
            destinations,
        } = *ready;
        let now = self.inner.clock.now_ms();
        if let Some(key) = &event.coalesce_key {
            let replaced = queue::coalesce(tx, &event.event_type, key, destinations, now)?;
            if replaced > 0 {
                crate::observe::telemetry::coalesced(&event.event_type, replaced);
            }
        }
        if settings.limits.is_set() {
            let n = destinations.len() as i64;
            settings
                .limits
                .make_room(tx, n, n * payload.len() as i64, now)?;
        }
        let row = new_row(settings, ready, now);
        let inserted_any = queue::insert(tx, &row, destinations, |destination| {
            crate::observe::telemetry::enqueued(&event.event_type, destination)
        })?;
        if !inserted_any {
            if let Some(key) = &event.idempotency_key {
                for destination in destinations {
                    if let Some(existing_event_id) =
                        queue::idempotency_holder(tx, destination, key)?
                    {
                        return Ok(Enqueued::Duplicate { existing_event_id });
                    }
                }
            }
            // Only the idempotency index can refuse a row, so this is unreachable in
            // practice; report it rather than pretend the event was written.
            return Err(Error::Sqlite(rusqlite::Error::QueryReturnedNoRows));
        }
        Ok(Enqueued::New {
            event_id: event_id.to_owned(),
        })
    }

    /// Runs `f` in an IMMEDIATE transaction on a pooled connection, commits, then wakes the
    /// relay.
    ///
    /// IMMEDIATE takes the write lock up front, so the transaction waits (up to the busy
    /// timeout) instead of failing half-way with `SQLITE_BUSY`. If `f` returns an error the
    /// transaction rolls back and the error is returned.
    ///
    /// A relay started from this `Outbox` lets these transactions go first: before each of
    /// its own writes it waits (up to 5 ms) for those that want or hold the lock at that
    /// moment (not for later ones, so an app committing flat out cannot stop it), and a
    /// commit made here while the relay drains a backlog waits for at most the one relay
    /// transaction already under way (woken when it ends, up to 50 ms, then through
    /// SQLite's busy handler). While the relay's checkpointer copies the last of the WAL
    /// back (a few milliseconds every few hundred milliseconds of a drain), a transaction
    /// begun here waits up to 2 ms more, so the copy reaches the WAL's end and syncs the
    /// database file without holding SQLite's lock. Commits through connections of the
    /// app's own are not seen, and take their turn at SQLite's lock.
    ///
    /// The closure returns the app's own error type, so it can stop the transaction with an
    /// error of the app's ("out of stock"): any `E` that an [`Error`] converts into
    /// (`Box<dyn std::error::Error>`, `anyhow::Error`, an app enum with a `From<Error>`).
    /// Where nothing else fixes `E` (a closure that ends in `Ok(())`), name it:
    /// `outbox.transaction(|tx| -> Result<(), sqlite_outbox::Error> { .. })`. Add
    /// `From<rusqlite::Error>` to the app's type too to use `?` on the app's own statements,
    /// or convert them with `.map_err(sqlite_outbox::Error::from)`.
    ///
    /// ```
    /// use sqlite_outbox::{Event, Outbox};
    /// #[derive(Debug)]
    /// enum OrderError {
    ///     OutOfStock,
    ///     Outbox(sqlite_outbox::Error),
    /// }
    /// impl From<sqlite_outbox::Error> for OrderError {
    ///     fn from(e: sqlite_outbox::Error) -> Self {
    ///         OrderError::Outbox(e)
    ///     }
    /// }
    /// # let dir = tempfile::tempdir().unwrap();
    /// let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    /// let stock = 0;
    /// let placed = outbox.transaction(|tx| {
    ///     if stock == 0 {
    ///         return Err(OrderError::OutOfStock); // rolls back
    ///     }
    ///     let _ = outbox.enqueue(tx, Event::new("order.placed", serde_json::json!({})))?;
    ///     Ok(())
    /// });
    /// assert!(matches!(placed, Err(OrderError::OutOfStock)));
    /// ```
    ///
    /// # Errors
    ///
    /// Whatever `f` returns, or (converted into `E`) a pool timeout or the commit's SQLite
    /// error.
    pub fn transaction<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let mut conn = self.connection()?;
        // Marked before asking for the lock: a relay of this outbox then lets it go first.
        let turn = self.inner.right_of_way.take();
        turn.wait_for_relay_writes(RELAY_WRITE_WAIT);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::from)?;
        let value = f(&tx)?;
        tx.commit().map_err(Error::from)?;
        drop(turn);
        self.notify();
        Ok(value)
    }

    /// The writes that go before the relay's (see [`crate::store::right_of_way`]).
    pub(crate) fn right_of_way(&self) -> &RightOfWay {
        &self.inner.right_of_way
    }

    /// The reserve kept for a full disk.
    pub(crate) fn disk_room(&self) -> &DiskRoom {
        &self.inner.disk_room
    }

    /// Wakes a relay running in this process so it claims newly committed events at once.
    ///
    /// Call it after committing a transaction of your own that enqueued events. Never blocks.
    pub fn notify(&self) {
        self.inner.wakers.wake_all();
    }

    /// Borrows a pooled connection, for reads and admin work on the same file.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] when no connection frees up within the busy timeout.
    pub fn connection(&self) -> Result<PooledConnection> {
        PooledConnection::get(&self.inner.pool)
    }

    /// The streams of `destination`, one `(source, accounting)` per source: each stream's
    /// high water, the numbers still pending and the fates of the numbers that left
    /// undelivered (see [`wire::StreamAccount`](crate::wire::StreamAccount)), as a relay
    /// tells the destination.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] when no connection frees up; [`Error::Sqlite`] if the file cannot be
    /// read.
    pub fn stream_accounts(
        &self,
        destination: &str,
    ) -> Result<Vec<(String, crate::wire::StreamAccount)>> {
        let mut conn = self.connection()?;
        Ok(crate::store::stream_accounts::read(&mut conn, destination)?
            .into_iter()
            .map(|stream| (stream.source, stream.account))
            .collect())
    }

    /// The stream numbers event `event_id` took: `(destination, number)` for each
    /// destination it was routed to (still in the file), in the order written. Compare with
    /// [`synced_through`](Self::synced_through) to tell the user the change is safe at the
    /// fleet.
    ///
    /// A number is fixed when its transaction commits, and written into the row when first
    /// needed: as the relay claims the row, or here (which numbers every row up to it, in
    /// short transactions: writes).
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] when no connection frees up; [`Error::Sqlite`] if the file cannot be
    /// read or written.
    pub fn stream_numbers(&self, event_id: &str) -> Result<Vec<(String, i64)>> {
        let mut conn = self.connection()?;
        let newest: Option<i64> = conn
            .prepare_cached("SELECT MAX(id) FROM outbox_events WHERE event_id = ?1")?
            .query_row([event_id], |r| r.get(0))?;
        let Some(newest) = newest else {
            return Ok(Vec::new());
        };
        crate::store::queue::numbering::number_up_to(&mut conn, newest)?;
        let mut stmt = conn.prepare_cached(
            "SELECT destination, stream_seq FROM outbox_events
              WHERE event_id = ?1 AND stream_seq IS NOT NULL ORDER BY id",
        )?;
        let numbers = stmt
            .query_map([event_id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(numbers)
    }

    /// Opens a connection of its own, outside the pool (it counts against no pool limit),
    /// with the outbox's PRAGMAs: for a relay's background checkpoints.
    pub(crate) fn unpooled_connection(&self) -> Result<rusqlite::Connection> {
        database::open_unpooled(&self.inner.path, &self.inner.settings)
    }

    /// The `synchronous` setting of the outbox's connections.
    pub(crate) fn synchronous(&self) -> Synchronous {
        self.inner.settings.synchronous
    }

    /// The current time on the outbox's clock, in unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Stops deliveries to `destination` until [`enable_destination`](Self::enable_destination);
    /// its events stay pending. A relay also does this by itself when a receiver answers
    /// `410 Gone`. Relays notice within their poll interval.
    ///
    /// # Errors
    ///
    /// SQLite errors, or [`Error::InvalidConfig`] for a malformed name.
    pub fn disable_destination(&self, destination: &str, reason: &str) -> Result<()> {
        route::validate_name(destination)?;
        let conn = self.connection()?;
        disabled::disable(&conn, destination, reason, self.now_ms())
    }

    /// Resumes deliveries to `destination`; returns whether it was disabled.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn enable_destination(&self, destination: &str) -> Result<bool> {
        let conn = self.connection()?;
        let was = disabled::enable(&conn, destination)?;
        self.notify();
        Ok(was)
    }

    /// The destinations that are disabled, with when and why.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn disabled_destinations(&self) -> Result<Vec<DisabledDestination>> {
        let conn = self.connection()?;
        disabled::list(&conn)
    }

    /// The clock every timestamp of this outbox comes from.
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// Makes the next enqueue read the file's settings again.
    pub(crate) fn refresh_settings(&self) {
        self.inner.live.invalidate();
    }

    /// The CloudEvents `source` of events that set none.
    pub(crate) fn default_source(&self) -> String {
        self.inner.live.get().default_source.clone()
    }

    /// A wake channel for a relay starting on this outbox.
    pub(crate) fn register_relay(&self) -> Receiver<()> {
        self.inner.wakers.register()
    }
}

/// One event ready to be written: checked, its data serialized, routed, its id chosen.
#[derive(Clone, Copy)]
struct Ready<'a> {
    event: &'a Event,
    event_id: &'a str,
    payload: &'a str,
    destinations: &'a [&'a str],
}

/// One event of `enqueue_many`, checked: its data serialized, and where it goes.
struct Checked {
    payload: String,
    /// Its type's destinations: an index into the routes `enqueue_many` looked up.
    route: usize,
    /// Written in a run (one destination, no idempotency or coalescing key, no storage
    /// limit); otherwise one at a time, as `enqueue` writes it.
    plain: bool,
}

/// Whether enqueueing `event` may write more than one row (a coalesced event deleted, room
/// made, several destinations), and so needs a savepoint to leave the caller's transaction
/// as it was on an error or a duplicate. One `INSERT` into one destination is atomic by
/// itself.
fn needs_savepoint(settings: &Settings, event: &Event, destinations: &[&str]) -> bool {
    event.coalesce_key.is_some() || settings.limits.is_set() || destinations.len() > 1
}

impl Outbox {
    /// The outbox over an opened pool.
    fn assemble(
        pool: Pool,
        path: PathBuf,
        settings: ConnectionSettings,
        live: LiveSettings,
        disk_room: DiskRoom,
        clock: Arc<dyn Clock>,
    ) -> Result<Outbox> {
        let sqlite_name = sqlite_name(&pool)?;
        Ok(Outbox {
            inner: Arc::new(Inner {
                live,
                pool,
                sqlite_name,
                path,
                settings,
                clock,
                wakers: Wakers::default(),
                right_of_way: RightOfWay::default(),
                subscribers: Default::default(),
                disk_room,
            }),
        })
    }
}

/// The name SQLite gives the pool's file.
fn sqlite_name(pool: &Pool) -> Result<Option<String>> {
    Ok(pool.get()?.path().map(str::to_owned))
}

impl Outbox {
    /// Refuses a connection with no transaction open (an event written there would commit
    /// by itself, and the promise, the event commits with the business change or not at
    /// all, would silently not hold), and a connection to another database file (the event
    /// would go into that file's outbox, which this outbox's relay never reads).
    fn require_own_transaction(&self, conn: &Connection) -> Result<()> {
        if conn.is_autocommit() {
            return Err(Error::NotInTransaction);
        }
        let Some(file) = conn.path().filter(|file| !file.is_empty()) else {
            // A temporary or in-memory database: never this outbox's file.
            return Err(Error::WrongDatabase {
                outbox: self.inner.path.display().to_string(),
                connection: "a temporary or in-memory database".into(),
            });
        };
        let own = &self.inner.path;
        if self.inner.sqlite_name.as_deref() == Some(file) || Path::new(file) == own.as_path() {
            return Ok(());
        }
        // The same file under another name (a symlink, `..`): looked at only on a mismatch.
        let same = match (std::fs::canonicalize(file), std::fs::canonicalize(own)) {
            (Ok(theirs), Ok(ours)) => theirs == ours,
            _ => false,
        };
        if same {
            return Ok(());
        }
        Err(Error::WrongDatabase {
            outbox: own.display().to_string(),
            connection: file.to_owned(),
        })
    }
}

/// The destinations `event_type` is routed to; an event no route takes is an input error.
fn routed<'s>(settings: &'s Settings, event_type: &str) -> Result<Vec<&'s str>> {
    let destinations = destinations_for(&settings.routes, event_type);
    if destinations.is_empty() {
        return Err(Error::NoRoute {
            event_type: event_type.to_owned(),
        });
    }
    Ok(destinations)
}

/// The row `ready` is stored as, written at `now`.
fn new_row<'a>(settings: &'a Settings, ready: &Ready<'a>, now: i64) -> NewRow<'a> {
    let Ready {
        event,
        event_id,
        payload,
        ..
    } = *ready;
    NewRow {
        event_id,
        idempotency_key: event.idempotency_key.as_deref(),
        event_type: &event.event_type,
        // Stored, not resolved at delivery: every relay (this app's, the CLI's, another
        // process's) then sends one event id under one source, which receivers
        // de-duplicate on together.
        source: Some(event.source.as_deref().unwrap_or(&settings.default_source)),
        subject: event.subject.as_deref(),
        partition_key: event.partition_key.as_deref(),
        payload,
        coalesce_key: event.coalesce_key.as_deref(),
        priority: event
            .priority
            .unwrap_or_else(|| settings.priority_for(&event.event_type)),
        droppable: settings.limits.is_droppable(&event.event_type),
        created_at: now,
        expires_at: event
            .expires_in
            .or_else(|| settings.lifetime_for(&event.event_type))
            .map(|d| now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
        traceparent: event.traceparent.as_deref(),
        tracestate: event.tracestate.as_deref(),
        dataschema: event.dataschema.as_deref(),
        now,
    }
}
