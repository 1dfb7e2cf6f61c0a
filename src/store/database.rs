//! The database file: opening it (or refusing a foreign one untouched), the connection pool,
//! per-connection PRAGMAs and schema migrations.

use portable_atomic::AtomicU64;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::store::connection_manager::SqliteManager;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::error::{Error, Result};

/// The schema, split into migrations by its `-- version N` lines.
const SCHEMA_SQL: &str = include_str!("../../schema.sql");

pub(crate) use crate::store::pool::Pool;

/// A connection borrowed from an outbox's pool, with the outbox's PRAGMAs applied. It
/// dereferences to a [`rusqlite::Connection`] and goes back to the pool when dropped.
pub struct PooledConnection(r2d2::PooledConnection<SqliteManager>);

impl PooledConnection {
    /// Borrows a connection from `pool`, waiting up to the pool's timeout.
    pub(crate) fn get(pool: &Pool) -> Result<PooledConnection> {
        Ok(PooledConnection(pool.get()?))
    }
}

impl Deref for PooledConnection {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl DerefMut for PooledConnection {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.0
    }
}

impl fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledConnection")
            .field("path", &self.0.path())
            .finish()
    }
}

/// How hard SQLite works to keep a commit on power loss.
///
/// Both settings keep every committed event when the *process* crashes or is killed: the WAL
/// is in the operating system's hands once `COMMIT` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `synchronous=NORMAL`: the WAL is synced at checkpoints only. Fast; after a power loss
    /// or OS crash the last commits before it may be rolled back, each transaction whole
    /// (never corrupted). A relay never sends an event of a commit that is not on disk yet,
    /// so a rolled-back commit's event is never delivered.
    #[default]
    Normal,
    /// `synchronous=FULL`: the WAL is synced on every commit. A commit that returned survives
    /// power loss, at the cost of one fsync per transaction.
    Full,
}

impl Synchronous {
    pub(crate) fn pragma_value(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// The longest busy timeout any outbox of this process asked for, in milliseconds: the busy
/// handler is a plain function, so it cannot carry a per-connection value. It starts at zero
/// (not at the 5 s default), so a process whose outboxes all ask for less gets less.
static BUSY_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Waits for SQLite's write lock in fine steps: 25 µs at first, so a lock held for a few
/// hundred microseconds (a relay's ack) costs about that, not SQLite's default first sleep
/// of a whole millisecond; then 100 µs, then 1 ms steps, until the busy timeout.
/// A busy handler as both rusqlite 0.40 (a function pointer, on `&Connection`) and 0.43 (any
/// `FnMut + Send`, on `&mut Connection`) take it.
type BusyHandler = fn(i32) -> bool;

/// No busy handler, typed for both.
pub(crate) const NO_BUSY_HANDLER: Option<BusyHandler> = None;

/// Makes `settings`' busy timeout the busy handler's (the longest any outbox of the process
/// asked for).
fn keep_busy_timeout(settings: &ConnectionSettings) -> Result<()> {
    let timeout_ms = u64::try_from(settings.busy_timeout.as_millis()).unwrap_or(u64::MAX);
    if timeout_ms > i32::MAX as u64 {
        return Err(Error::InvalidConfig(format!(
            "busy timeout of {:?} is too long; the most is {} ms",
            settings.busy_timeout,
            i32::MAX
        )));
    }
    BUSY_TIMEOUT_MS.fetch_max(timeout_ms, Ordering::Relaxed);
    Ok(())
}

/// Gives `conn` the outbox's busy handler: another process closing the file holds it a
/// moment to copy its WAL back, which a connection that only checks the file waits for
/// rather than fail.
fn wait_when_busy(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(busy_handler as BusyHandler))
}

fn busy_handler(attempt: i32) -> bool {
    let attempt = attempt.max(0) as u64;
    // Time already waited before this attempt, following the same schedule.
    let (step_us, waited_us) = match attempt {
        0..=39 => (25, attempt * 25),
        40..=89 => (100, 1_000 + (attempt - 40) * 100),
        _ => (1_000, 6_000 + (attempt - 90) * 1_000),
    };
    if waited_us >= BUSY_TIMEOUT_MS.load(Ordering::Relaxed) * 1_000 {
        return false;
    }
    std::thread::sleep(Duration::from_micros(step_us));
    true
}

/// `conn` with no busy handler, so a statement that needs a lock held elsewhere fails at
/// once instead of waiting; dropping it puts the outbox's busy handler back.
///
/// Why not `Connection::busy_timeout(0)` and back: that replaces the outbox's handler with
/// SQLite's own, and `PRAGMA busy_timeout` reads 0 while a custom handler is set, so the
/// "restored" connection would go back to the pool with no patience at all, and the app's
/// next transaction on it would fail with "database is locked" the moment a relay wrote.
pub(crate) struct NotWaiting<'c> {
    conn: &'c mut Connection,
}

impl<'c> NotWaiting<'c> {
    /// Takes `conn`'s busy handler away until the result is dropped.
    pub fn new(conn: &'c mut Connection) -> rusqlite::Result<NotWaiting<'c>> {
        conn.busy_handler(NO_BUSY_HANDLER)?;
        Ok(NotWaiting { conn })
    }
}

impl Deref for NotWaiting<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl DerefMut for NotWaiting<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
    }
}

impl Drop for NotWaiting<'_> {
    fn drop(&mut self) {
        // SQLite's busy_handler only fails on a misused handle; the connection is open.
        if let Err(e) = self.conn.busy_handler(Some(busy_handler as BusyHandler)) {
            log::error!("the busy handler could not be put back on a connection: {e:#}");
        }
    }
}

/// The app's per-connection setup: run first on every connection the outbox opens.
pub(crate) type OnConnect =
    std::sync::Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Settings applied to every connection the outbox opens.
#[derive(Clone)]
pub(crate) struct ConnectionSettings {
    pub synchronous: Synchronous,
    pub busy_timeout: Duration,
    /// WAL pages after which a committing connection checkpoints by itself. High, so that a
    /// running relay (which checkpoints in the background) keeps checkpoints off the app's
    /// commits; still bounded, so the WAL cannot grow without limit when no relay runs.
    pub wal_autocheckpoint: u32,
    /// The app's setup (`OutboxBuilder::on_connect`): SQLCipher's key, its own PRAGMAs.
    pub on_connect: Option<OnConnect>,
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("synchronous", &self.synchronous)
            .field("busy_timeout", &self.busy_timeout)
            .field("wal_autocheckpoint", &self.wal_autocheckpoint)
            .field("on_connect", &self.on_connect.is_some())
            .finish()
    }
}

impl ConnectionSettings {
    /// Runs the app's setup on `conn`, before anything reads the file (SQLCipher's key must
    /// be the first statement).
    pub fn prepare(&self, conn: &Connection) -> Result<()> {
        match &self.on_connect {
            Some(setup) => setup(conn).map_err(Error::OnConnect),
            None => Ok(()),
        }
    }

    /// Applies the outbox's PRAGMAs to `conn`.
    pub fn apply(&self, conn: &mut Connection) -> rusqlite::Result<()> {
        conn.busy_handler(Some(busy_handler as BusyHandler))?;
        // journal_mode returns the resulting mode as a row; read it so the statement runs.
        let _mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.execute_batch(&format!(
            "PRAGMA synchronous={}; PRAGMA wal_autocheckpoint={}; {}",
            self.synchronous.pragma_value(),
            self.wal_autocheckpoint,
            crate::platform::durability_pragmas(
                self.synchronous == Synchronous::Full,
                crate::platform::APPLE
            )
        ))
    }

    /// Opens a connection to `path` with `flags`, the app's setup run on it first.
    fn open(&self, path: &Path, flags: OpenFlags) -> Result<Connection> {
        let conn = Connection::open_with_flags(path, flags)?;
        self.prepare(&conn)?;
        Ok(conn)
    }
}

/// Refuses a path every connection would see a database of its own at, and makes a relative
/// path absolute once, against the working directory at open: SQLite resolves a relative
/// path each time a connection opens, so after the app changed its working directory the
/// pool's renewed connections and a relay's would open another, empty file. On Unix it then
/// resolves symbolic links ([`through_links`]).
///
/// # Errors
///
/// [`Error::InvalidPath`] for `:memory:`, `""` and `file:` URIs; [`Error::Io`] if the
/// working directory cannot be read.
pub(crate) fn resolve_path(path: &Path) -> Result<PathBuf> {
    let text = path.to_string_lossy();
    let refused = |reason| {
        Err(Error::InvalidPath {
            path: text.to_string(),
            reason,
        })
    };
    if text.is_empty() {
        return refused(
            "an empty path is a private temporary database, one per connection; give a file's path",
        );
    }
    if text == ":memory:" {
        return refused(
            "an in-memory database is one per connection, so the app, the pool and the relay \
             would each see their own; give a file's path",
        );
    }
    if text.starts_with("file:") {
        return refused(
            "URI filenames are not taken (file::memory: and mode=memory give one database per \
             connection); give a file's path",
        );
    }
    let absolute = std::path::absolute(path)?;
    #[cfg(unix)]
    let absolute = through_links(&absolute);
    Ok(absolute)
}

/// `path` with its symbolic links resolved, the file's or, for a file not created yet, its
/// folder's. SQLite puts the `-wal` and `-shm` files beside the file a link points to, so
/// the reserve, the free-space reads and the WAL watch must look there too: through a link
/// on another file system they read that one's free space (a full data disk said 73 GiB
/// free), two paths to one file made two reserves, and the watch of the link's folder never
/// saw a commit. Unix only: Windows' resolved paths are verbatim (`\\?\C:\…`), and its
/// links are rare. As given when nothing resolves (a folder that does not exist: the open
/// then fails naming it).
#[cfg(unix)]
fn through_links(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    match (path.parent(), path.file_name()) {
        (Some(folder), Some(name)) => std::fs::canonicalize(folder)
            .map_or_else(|_| path.to_path_buf(), |folder| folder.join(name)),
        _ => path.to_path_buf(),
    }
}

/// The migrations in `schema.sql`, as `(version, sql)` in ascending order.
pub(crate) fn migrations() -> Vec<(i64, &'static str)> {
    let mut out = Vec::new();
    let mut current: Option<(i64, usize)> = None;
    let mut offset = 0;
    for line in SCHEMA_SQL.split_inclusive('\n') {
        if let Some(rest) = line.trim().strip_prefix("-- version ") {
            if let Ok(version) = rest.trim().parse::<i64>() {
                if let Some((v, start)) = current.take() {
                    out.push((v, &SCHEMA_SQL[start..offset]));
                }
                current = Some((version, offset + line.len()));
            }
        }
        offset += line.len();
    }
    if let Some((v, start)) = current {
        out.push((v, &SCHEMA_SQL[start..]));
    }
    out
}

/// The newest schema version this build knows.
pub fn schema_version() -> i64 {
    migrations().last().map(|(v, _)| *v).unwrap_or(0)
}

/// The table that holds the outbox's schema version: one row, `id` 1. The outbox keeps its
/// version here, never in `PRAGMA user_version`, which belongs to the app (rusqlite_migration
/// and most hand-written migration schemes keep the app's schema version there).
const VERSION_TABLE: &str = "outbox_schema";

/// The last schema version a release kept in `PRAGMA user_version` (0.1).
const LAST_USER_VERSION_SCHEMA: i64 = 13;

/// Maps "file is not a database" (a read of a file that is not SQLite, or is encrypted with
/// another key) to [`Error::NotADatabase`], naming the path.
fn not_a_database(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => Error::NotADatabase {
            path: path.display().to_string(),
        },
        _ => Error::from(e),
    }
}

/// Whether `conn`'s main database has a table named `name`.
fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get(0),
    )
}

/// Where a file's outbox schema version was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoredVersion {
    /// In the outbox's own table.
    Own(i64),
    /// A file made by a release before 0.2, which kept its version in `PRAGMA user_version`
    /// (its `outbox_events` table is there, `outbox_schema` is not): taken over once, by
    /// writing the version into the outbox's table; `user_version` is left as found.
    Legacy(i64),
    /// No outbox in the file yet.
    None,
}

impl StoredVersion {
    fn version(self) -> i64 {
        match self {
            StoredVersion::Own(v) | StoredVersion::Legacy(v) => v,
            StoredVersion::None => 0,
        }
    }
}

/// Reads the outbox's schema version in `conn`'s file without changing anything, telling a
/// non-SQLite file apart.
fn stored_version(conn: &Connection, path: &Path) -> Result<StoredVersion> {
    let read = || -> rusqlite::Result<StoredVersion> {
        if has_table(conn, VERSION_TABLE)? {
            let version = conn.query_row(
                &format!("SELECT version FROM {VERSION_TABLE} WHERE id = 1"),
                [],
                |r| r.get(0),
            )?;
            return Ok(StoredVersion::Own(version));
        }
        if has_table(conn, "outbox_events")? {
            let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            // Above 13 the app's own migrations counted on from the outbox's number (they
            // believed 13 of theirs had run): the outbox's schema is 13 at most.
            return Ok(StoredVersion::Legacy(version.min(LAST_USER_VERSION_SCHEMA)));
        }
        Ok(StoredVersion::None)
    };
    read().map_err(not_a_database(path))
}

/// Records `version` as the outbox's schema version, inside the caller's transaction.
fn record_version(tx: &Connection, version: i64) -> rusqlite::Result<()> {
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
             id      INTEGER PRIMARY KEY CHECK (id = 1),
             version INTEGER NOT NULL
         )"
    ))?;
    tx.execute(
        &format!(
            "INSERT INTO {VERSION_TABLE} (id, version) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET version = excluded.version"
        ),
        [version],
    )?;
    Ok(())
}

/// Fails with [`Error::SchemaTooNew`] when the file's outbox schema is newer than this build.
fn check_not_too_new(found: StoredVersion) -> Result<()> {
    let supported = schema_version();
    if found.version() > supported {
        return Err(Error::SchemaTooNew {
            found: found.version(),
            supported,
        });
    }
    Ok(())
}

/// Brings the outbox's schema in `conn`'s file up to date, or fails without touching a newer
/// one. Never reads the app's tables, never writes `PRAGMA user_version`.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<()> {
    let found = stored_version(conn, path)?;
    check_not_too_new(found)?;
    if found == StoredVersion::Own(schema_version()) {
        return Ok(());
    }
    // Each step in an IMMEDIATE transaction, so two processes opening a fresh file at once do
    // not both migrate: the second waits for the lock, then reads the new version and skips.
    let step = |conn: &mut Connection, version: i64, sql: &str| -> Result<()> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = stored_version(&tx, path)?;
        check_not_too_new(now)?;
        if now.version() < version {
            tx.execute_batch(sql)?;
            record_version(&tx, version)?;
        } else if let StoredVersion::Legacy(legacy) = now {
            // The take-over of an earlier release's file: its version, now in our table.
            record_version(&tx, legacy)?;
        }
        tx.commit()?;
        Ok(())
    };
    if let StoredVersion::Legacy(legacy) = found {
        // Records the version the file is at (no migration runs for it).
        step(conn, legacy, "")?;
    }
    for (version, sql) in migrations() {
        if version > found.version() {
            step(conn, version, sql)?;
        }
    }
    Ok(())
}

/// Creates or updates the crate's tables (the outbox's and the inbox's) on an open
/// connection: for a receiver's own database, or an app that manages its connections itself.
///
/// ```
/// # fn main() -> Result<(), sqlite_outbox::Error> {
/// let mut conn = sqlite_outbox::rusqlite::Connection::open_in_memory()?;
/// sqlite_outbox::receive::migrate(&mut conn)?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::SchemaTooNew`] (nothing changed) or SQLite errors.
pub fn migrate_connection(conn: &mut Connection) -> Result<()> {
    let path = conn.path().unwrap_or("").to_string();
    migrate(conn, Path::new(&path))
}

/// Checks, on a read-only connection that changes nothing, that `path` exists and holds an
/// outbox (any schema version): the first step of opening a file that must not be created.
pub(crate) fn check_existing(path: &Path, settings: &ConnectionSettings) -> Result<()> {
    let shown = || path.display().to_string();
    if !path.exists() {
        return Err(Error::NotFound { path: shown() });
    }
    keep_busy_timeout(settings)?;
    let mut conn = settings.open(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    wait_when_busy(&mut conn)?;
    if stored_version(&conn, path)?.version() < 1 {
        return Err(Error::NotAnOutbox { path: shown() });
    }
    Ok(())
}

/// Opens (creating if needed) the database at `path`, migrates it and returns a pool.
///
/// The schema version is checked on a plain connection before any PRAGMA is applied, so a
/// file that is too new or not a database is left exactly as it was.
pub(crate) fn open_pool(
    path: &Path,
    settings: &ConnectionSettings,
    pool_size: u32,
) -> Result<(Pool, PathBuf)> {
    keep_busy_timeout(settings)?;
    {
        let mut conn = settings.open(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Closing the last connection to a file checkpoints its WAL into it, even one this
        // connection could not read (too new, or encrypted with another key): a WAL a crash
        // left would then be copied into a file that must be left as it was.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        wait_when_busy(&mut conn)?;
        check_not_too_new(stored_version(&conn, path)?)?;
        // A new file gets incremental auto-vacuum, so pruning can hand space back to the
        // file system; it must be chosen before the first table exists.
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        if pages == 0 {
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
        }
        settings.apply(&mut conn)?;
        migrate(&mut conn, path)?;
        // Opened and migrated: closing checkpoints again, as any connection does, so that
        // the schema just written reaches the file even under synchronous=NORMAL (which
        // syncs the WAL only at checkpoints) before anything else runs.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            false,
        )?;
    }
    let init_settings = settings.clone();
    let manager = SqliteManager::new(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        move |c| {
            if let Some(setup) = &init_settings.on_connect {
                setup(c)?;
            }
            init_settings.apply(c)
        },
    );
    let pool = Pool::build(manager, pool_size, pool_wait(settings))?;
    Ok((pool, path.to_path_buf()))
}

/// Opens the outbox at `path` for reading only, and returns a pool of read-only
/// connections: no migration, no PRAGMA that writes, nothing created. The schema must be
/// this build's (an older one is [`Error::SchemaOutdated`]).
///
/// A WAL-mode file opened read-only makes SQLite create its `-wal` and `-shm` files when no
/// other connection has them open, and leave them behind. So when there is no `-wal` file
/// (no connection has the file open in WAL mode) the file is read as it stands, through
/// SQLite's `immutable` URI parameter: no file created, no lock taken. A writer that opens
/// the file in that moment writes to a WAL this read does not see.
pub(crate) fn open_read_only_pool(
    path: &Path,
    settings: &ConnectionSettings,
    pool_size: u32,
) -> Result<Pool> {
    let shown = || path.display().to_string();
    if !path.exists() {
        return Err(Error::NotFound { path: shown() });
    }
    keep_busy_timeout(settings)?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let (target, flags) = if Path::new(&wal).exists() {
        (
            path.to_path_buf(),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    } else {
        (
            immutable_uri(path),
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    };
    {
        let mut conn = settings.open(&target, flags)?;
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        wait_when_busy(&mut conn)?;
        let found = stored_version(&conn, path)?;
        if found.version() < 1 {
            return Err(Error::NotAnOutbox { path: shown() });
        }
        check_not_too_new(found)?;
        if found.version() < schema_version() {
            return Err(Error::SchemaOutdated {
                found: found.version(),
                current: schema_version(),
            });
        }
    }
    let init_settings = settings.clone();
    let manager = SqliteManager::new(&target, flags, move |c| {
        if let Some(setup) = &init_settings.on_connect {
            setup(c)?;
        }
        c.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        c.busy_handler(Some(busy_handler as BusyHandler))
    });
    Pool::build(manager, pool_size, pool_wait(settings))
}

/// How long a borrower waits for a connection: the busy timeout, at least a second.
fn pool_wait(settings: &ConnectionSettings) -> Duration {
    settings.busy_timeout.max(Duration::from_secs(1))
}

/// `path` as a `file:` URI with `mode=ro&immutable=1`, its reserved characters escaped.
fn immutable_uri(path: &Path) -> PathBuf {
    use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
    // What a URI's path cannot hold as is: the query and fragment marks, the escape itself.
    const RESERVED: &AsciiSet = &CONTROLS.add(b'%').add(b'?').add(b'#').add(b' ');
    let text = path.to_string_lossy();
    PathBuf::from(format!(
        "file:{}?mode=ro&immutable=1",
        utf8_percent_encode(&text, RESERVED)
    ))
}

/// Opens a connection to an outbox file that [`open_pool`] already opened (and migrated),
/// outside the pool, with the same settings.
pub(crate) fn open_unpooled(path: &Path, settings: &ConnectionSettings) -> Result<Connection> {
    let mut conn = settings.open(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    settings.apply(&mut conn)?;
    Ok(conn)
}

/// The database file's size in bytes (pages times page size, without the WAL).
///
/// The casts are for SQLCipher, whose `page_size` pragma answers in text.
pub(crate) fn database_bytes(conn: &Connection) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT CAST(c.page_count AS INTEGER) * CAST(s.page_size AS INTEGER)
           FROM pragma_page_count() AS c, pragma_page_size() AS s",
        [],
        |r| r.get(0),
    )?)
}

/// Free pages handed back to the file system per step: each step is its own short write
/// (4 MiB of 4 KiB pages moves in milliseconds), so app writers wait for one step at most.
pub(crate) const RECLAIM_STEP_PAGES: i64 = 1024;

/// Hands free pages back to the file system, one bounded step: moves up to
/// [`RECLAIM_STEP_PAGES`] pages off the freelist (files created by this crate use
/// incremental auto-vacuum). Returns how many free pages are left.
pub(crate) fn reclaim_step(conn: &Connection) -> Result<i64> {
    // Each row the pragma returns is one page freed: it must be stepped to the end, which
    // a plain `execute` would not do (it would free a single page).
    let mut stmt =
        conn.prepare_cached(&format!("PRAGMA incremental_vacuum({RECLAIM_STEP_PAGES})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?)
}

/// Hands every free page back in bounded steps, then checkpoints the WAL (PASSIVE, never
/// waiting) so the database file itself shrinks.
pub(crate) fn reclaim(conn: &Connection) -> Result<()> {
    let mut left = conn.query_row("PRAGMA freelist_count", [], |r| r.get::<_, i64>(0))?;
    while left > 0 {
        let before = left;
        left = reclaim_step(conn)?;
        // A file without auto-vacuum (made by another tool) frees nothing: stop.
        if left >= before {
            break;
        }
    }
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outbox's schema version (its own table) and the app's `user_version`.
    fn versions(conn: &Connection) -> (i64, i64) {
        let own = conn
            .query_row("SELECT version FROM outbox_schema", [], |r| r.get(0))
            .unwrap();
        let app = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        (own, app)
    }

    /// A file as release 0.1 left it at schema `version`: the outbox's version in
    /// `user_version`.
    fn legacy_file(path: &Path, version: i64) -> Connection {
        let conn = Connection::open(path).unwrap();
        for (v, sql) in migrations().into_iter().filter(|(v, _)| *v <= version) {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", v).unwrap();
        }
        conn
    }

    #[test]
    fn schema_splits_into_ascending_migrations() {
        let m = migrations();
        assert!(!m.is_empty());
        assert_eq!(m[0].0, 1);
        assert!(m[0].1.contains("CREATE TABLE outbox_events"));
        assert!(m.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn busy_handler_waits_in_fine_steps_then_gives_up_at_the_timeout() {
        BUSY_TIMEOUT_MS.fetch_max(5_000, Ordering::Relaxed);
        let start = std::time::Instant::now();
        for attempt in 0..40 {
            assert!(busy_handler(attempt));
        }
        // Forty first steps of 25 µs: about a millisecond, not forty.
        assert!(start.elapsed() < Duration::from_millis(20));
        let timeout = BUSY_TIMEOUT_MS.load(Ordering::Relaxed) as i32;
        assert!(!busy_handler(90 + timeout));
    }

    #[test]
    fn a_version_3_file_starts_its_high_water_at_its_highest_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v3.db");
        let mut conn = legacy_file(&path, 3);
        for id in [5, 9] {
            conn.execute(
                "INSERT INTO outbox_events (id, event_id, event_type, payload, created_at,
                                            available_at)
                 VALUES (?1, 'e' || ?1, 't', '{}', 0, 0)",
                [id],
            )
            .unwrap();
        }
        migrate(&mut conn, &path).unwrap();
        let high_water: i64 = conn
            .query_row("SELECT high_water FROM outbox_stats", [], |r| r.get(0))
            .unwrap();
        assert_eq!(high_water, 9);
    }

    #[test]
    fn a_version_12_file_keeps_its_pending_event_and_takes_trace_context_after_migrating() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v12.db");
        let mut conn = legacy_file(&path, 12);
        conn.execute_batch("INSERT INTO outbox_enqueue (type, data) VALUES ('old', '1')")
            .unwrap();
        // The version-12 view has no trace columns.
        assert!(conn
            .execute_batch("INSERT INTO outbox_enqueue (type, traceparent) VALUES ('t', 'x')")
            .is_err());
        migrate(&mut conn, &path).unwrap();
        conn.execute_batch(
            "INSERT INTO outbox_enqueue (type, data, traceparent, tracestate, dataschema)
             VALUES ('new', '2', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
                     'rojo=1', 'urn:schema:v2')",
        )
        .unwrap();
        type Traced = (String, Option<String>, Option<String>, Option<String>);
        let rows: Vec<Traced> = conn
            .prepare("SELECT event_type, traceparent, tracestate, dataschema FROM outbox_events ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(rows[0], ("old".into(), None, None, None));
        assert_eq!(rows[1].0, "new");
        assert_eq!(rows[1].2.as_deref(), Some("rojo=1"));
        assert_eq!(rows[1].3.as_deref(), Some("urn:schema:v2"));
    }

    /// A file at schema `version` (as that release left it) with `events` events committed
    /// through the SQL contract, their data `"1"`, `"2"`, ….
    fn file_at_version(path: &Path, version: i64, events: i64) -> Connection {
        let conn = Connection::open(path).unwrap();
        for (_, sql) in migrations().into_iter().filter(|(v, _)| *v <= version) {
            conn.execute_batch(sql).unwrap();
        }
        record_version(&conn, version).unwrap();
        for n in 1..=events {
            conn.execute(
                "INSERT INTO outbox_enqueue (type, data) VALUES ('t', ?1)",
                [n.to_string()],
            )
            .unwrap();
        }
        conn
    }

    #[test]
    fn a_version_15_file_keeps_its_numbers_and_the_next_row_continues_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v15.db");
        // Version 15 numbered inside the INSERT; the third row is then deleted.
        let mut conn = file_at_version(&path, 15, 3);
        conn.execute("DELETE FROM outbox_events WHERE stream_seq = 3", [])
            .unwrap();
        migrate(&mut conn, &path).unwrap();
        conn.execute(
            "INSERT INTO outbox_enqueue (type, data) VALUES ('t', '4')",
            [],
        )
        .unwrap();
        let tx = conn.transaction().unwrap();
        crate::store::queue::numbering::number_all(&tx).unwrap();
        tx.commit().unwrap();
        let numbers: Vec<(String, i64)> = conn
            .prepare("SELECT payload, stream_seq FROM outbox_events ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            numbers,
            vec![("1".into(), 1), ("2".into(), 2), ("4".into(), 4)],
            "3 was given before the migration and stays given"
        );
    }

    #[test]
    fn a_version_17_file_with_reused_ids_gets_its_pending_rows_numbered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v17.db");
        let mut conn = file_at_version(&path, 17, 4);
        let tx = conn.transaction().unwrap();
        crate::store::queue::numbering::number_all(&tx).unwrap();
        tx.commit().unwrap();
        conn.execute_batch(
            "UPDATE outbox_events SET delivered_at = 1;
             DELETE FROM outbox_events WHERE id >= 2;",
        )
        .unwrap();
        // What a release before 17 left: rows 2-4 again, under ids already numbered through,
        // with no number: one pending, one dead, one delivered (sent without a number).
        let (destination, source): (String, String) = conn
            .query_row("SELECT destination, source FROM outbox_events", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        for (id, delivered, dead) in [(2, None, None), (3, None, Some(9)), (4, Some(9), None)] {
            conn.execute(
                "INSERT INTO outbox_events (id, event_id, destination, source, event_type,
                                            payload, created_at, available_at, delivered_at,
                                            dead_at)
                 VALUES (?1, 'again-' || ?1, ?2, ?3, 't', 'null', 1, 1, ?4, ?5)",
                rusqlite::params![id, destination, source, delivered, dead],
            )
            .unwrap();
        }
        migrate(&mut conn, &path).unwrap();
        let numbers: Vec<(i64, Option<i64>)> = conn
            .prepare("SELECT id, stream_seq FROM outbox_events ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            numbers,
            vec![(1, Some(1)), (2, Some(5)), (3, Some(6)), (4, None)]
        );
        let high: i64 = conn
            .query_row(
                "SELECT high_water FROM outbox_streams WHERE destination = ?1 AND source = ?2",
                [&destination, &source],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(high, 6);
    }

    #[test]
    fn migrate_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let mut conn = Connection::open(&path).unwrap();
        migrate(&mut conn, &path).unwrap();
        migrate(&mut conn, &path).unwrap();
        assert_eq!(
            versions(&conn),
            (schema_version(), 0),
            "user_version is the app's"
        );
    }

    #[test]
    fn a_legacy_file_whose_user_version_the_app_moved_on_is_taken_over_at_13() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("moved.db");
        let mut conn = legacy_file(&path, 13);
        // The app's migration tool believed 13 of its migrations had run, and ran 14 to 20.
        conn.pragma_update(None, "user_version", 20).unwrap();
        migrate(&mut conn, &path).unwrap();
        assert_eq!(versions(&conn), (schema_version(), 20));
    }
}
