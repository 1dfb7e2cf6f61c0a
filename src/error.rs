//! The crate's one error type.

use std::fmt;

/// A specialized `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, in variants a caller can act on.
///
/// Input errors (`PayloadTooLarge`, `InvalidEventType`, `FieldTooLong`, `InvalidEvent`,
/// `InvalidData`) are detected before anything is written, so the caller's transaction stays
/// usable.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An offline bundle that does not verify: not a bundle, cut short, signed with another
    /// secret, or changed. Nothing of it was sent.
    InvalidBundle {
        /// What is wrong.
        reason: String,
    },
    /// An expiry of zero (under a millisecond): the event would expire as it is written.
    InvalidExpiry {
        /// The lifetime given, in milliseconds.
        millis: i64,
    },
    /// A setting kept in the file (see [`settings`](crate::settings)) that is unknown or out
    /// of range.
    InvalidSetting {
        /// The setting's key.
        key: String,
        /// What is wrong, and the allowed range.
        reason: String,
    },
    /// A priority outside 0 to 9.
    InvalidPriority {
        /// The priority given.
        priority: i64,
    },
    /// The event's serialized JSON data is larger than the configured limit.
    PayloadTooLarge {
        /// Size of the serialized data in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The event type is empty or longer than the limit.
    InvalidEventType {
        /// Length of the given type in bytes.
        len: usize,
        /// The longest type accepted, in bytes.
        limit: usize,
    },
    /// An optional text field (partition key, idempotency key, subject, source) is too long.
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The longest value accepted, in bytes.
        limit: usize,
    },
    /// A field of the event that is not in the form its standard requires: a `traceparent`
    /// or `tracestate` that is not W3C Trace Context, a `dataschema` that is not an absolute
    /// URI. Nothing was written.
    InvalidEvent {
        /// Which field (`traceparent`, `tracestate`, `dataschema`).
        field: &'static str,
        /// What is wrong, and the rule.
        reason: String,
    },
    /// Routes are configured and none matches the event's type, so it would go nowhere.
    NoRoute {
        /// The event's type.
        event_type: String,
    },
    /// The outbox is at a storage limit the user set, and nothing droppable could make room.
    /// Nothing was written; the caller's transaction is still usable.
    OutboxFull {
        /// Which limit.
        limit: Limit,
        /// The limit's value.
        max: i64,
        /// The current amount.
        current: i64,
    },
    /// The event data could not be serialized to JSON.
    InvalidData(serde_json::Error),
    /// The database was written by a newer version of this crate; nothing was changed.
    SchemaTooNew {
        /// The outbox's schema version found in the file (table `outbox_schema`).
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// A read-only open ([`OutboxBuilder::open_read_only`](crate::OutboxBuilder::open_read_only))
    /// found a file at an older schema version, which only a migration (a read-write open,
    /// `outbox migrate`) brings up to date; nothing was changed.
    SchemaOutdated {
        /// The outbox's schema version found in the file.
        found: i64,
        /// The schema version this build reads.
        current: i64,
    },
    /// `enqueue` was given a transaction on another database than the outbox's file: the
    /// event would have gone into that file's outbox, which this outbox's relay never reads.
    /// Nothing was written.
    WrongDatabase {
        /// The outbox's file.
        outbox: String,
        /// The file the transaction's connection has open.
        connection: String,
    },
    /// The file exists but is not a SQLite database; nothing was changed.
    NotADatabase {
        /// The path that was opened.
        path: String,
    },
    /// [`Outbox::open_existing`](crate::Outbox::open_existing) found no file at the path.
    NotFound {
        /// The path that was opened.
        path: String,
    },
    /// [`Outbox::open_existing`](crate::Outbox::open_existing) found a SQLite database
    /// without an outbox in it; nothing was changed.
    NotAnOutbox {
        /// The path that was opened.
        path: String,
    },
    /// A configuration value is out of range or malformed.
    InvalidConfig(String),
    /// [`Outbox::enqueue`](crate::Outbox::enqueue) was given a connection with no
    /// transaction open: the event would have committed on its own, apart from the business
    /// change. Nothing was written.
    NotInTransaction,
    /// A path that cannot hold an outbox: `:memory:`, `""` (a private temporary database) and
    /// `file:` URIs of in-memory databases give every connection a database of its own, so
    /// the app's transactions, the pool and the relay would each see a different one.
    /// Nothing was created.
    InvalidPath {
        /// The path given.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The app's per-connection setup ([`OutboxBuilder::on_connect`](crate::OutboxBuilder::on_connect))
    /// failed on a connection the outbox opened: a wrong SQLCipher key, say. The connection
    /// was not used.
    OnConnect(rusqlite::Error),
    /// The database or the disk is full (`SQLITE_FULL`): nothing of the failed statement
    /// was written, earlier commits are intact; it works again once space is freed.
    DiskFull(rusqlite::Error),
    /// The database file cannot be written (`SQLITE_READONLY`: permissions, an immutable or
    /// read-only mounted file). Reopen the outbox once it can.
    ReadOnly(rusqlite::Error),
    /// An error from SQLite.
    Sqlite(rusqlite::Error),
    /// No pooled connection could be had within the pool's timeout (the busy timeout, at
    /// least 1 s): every connection is in use.
    Pool(Box<dyn std::error::Error + Send + Sync>),
    /// A background thread could not be started.
    Io(std::io::Error),
    /// An error from PostgreSQL (feature `postgres`): the server, the connection, or a
    /// statement.
    #[cfg(feature = "postgres")]
    Postgres(postgres::Error),
    /// Another process held the PostgreSQL migration lock for as long as
    /// [`pg_migrate`](crate::receive::pg_migrate) waits (10 s): it is still migrating the
    /// tables (a big table can take minutes). Call again later.
    #[cfg(feature = "postgres")]
    MigrationInProgress {
        /// How long this call waited for the lock.
        waited: std::time::Duration,
    },
}

/// `{}` says what failed; the error it wraps, if any, is its [`source`](std::error::Error::source)
/// (a report that walks the chain, as anyhow's, eyre's or Sentry's do, shows it once). `{:#}`
/// adds the wrapped error's message on one line, as the crate's own logs and the `outbox`
/// command print errors: "SQLite error: database is locked".
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.say_what_failed(f)?;
        if f.alternate() {
            if let Some(wrapped) = self.wrapped_message() {
                write!(f, ": {wrapped}")?;
            }
        }
        Ok(())
    }
}

impl Error {
    /// The wrapped error, when this error is one from SQLite, the pool, the file system,
    /// JSON or PostgreSQL.
    fn wrapped(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidData(e) => Some(e),
            Error::OnConnect(e) | Error::DiskFull(e) | Error::ReadOnly(e) | Error::Sqlite(e) => {
                Some(e)
            }
            Error::Pool(e) => Some(&**e),
            Error::Io(e) => Some(e),
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => Some(e),
            _ => None,
        }
    }

    /// What `{:#}` adds: the wrapped error's message, unless `{}` already said it (a
    /// PostgreSQL server's own words).
    fn wrapped_message(&self) -> Option<&(dyn std::error::Error + 'static)> {
        #[cfg(feature = "postgres")]
        if let Error::Postgres(e) = self {
            if e.as_db_error().is_some() {
                return None;
            }
        }
        self.wrapped()
    }

    fn say_what_failed(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidBundle { reason } => {
                write!(f, "the bundle is refused, nothing was sent: {reason}")
            }
            Error::InvalidExpiry { millis } => write!(
                f,
                "an expiry of {millis} ms is out of range: at least 1 ms after the commit"
            ),
            Error::InvalidSetting { key, reason } => write!(f, "setting {key}: {reason}"),
            Error::InvalidPriority { priority } => write!(
                f,
                "priority {priority} is out of range: 0 (least urgent) to 9 (most urgent)"
            ),
            Error::PayloadTooLarge { size, limit } => write!(
                f,
                "event data is {size} bytes of JSON, over the limit of {limit} bytes"
            ),
            Error::InvalidEventType { len: 0, .. } => write!(f, "event type is empty"),
            Error::InvalidEventType { len, limit } => write!(
                f,
                "event type is {len} bytes long, over the limit of {limit} bytes"
            ),
            Error::FieldTooLong { field, len, limit } => write!(
                f,
                "{field} is {len} bytes long, over the limit of {limit} bytes"
            ),
            Error::InvalidEvent { field, reason } => write!(f, "{field} {reason}"),
            Error::NoRoute { event_type } => write!(
                f,
                "no route matches event type {event_type:?}; add a route (\"*\" catches all)"
            ),
            Error::OutboxFull {
                limit,
                max,
                current,
            } => write!(
                f,
                "outbox full: {current} {limit} with a limit of {max}, and nothing droppable \
                 to make room"
            ),
            Error::InvalidData(_) => f.write_str("event data cannot be serialized to JSON"),
            Error::SchemaTooNew { found, supported } => write!(
                f,
                "database schema version {found} is newer than this build of sqlite-outbox \
                 supports ({supported}); upgrade the crate, nothing was changed"
            ),
            Error::SchemaOutdated { found, current } => write!(
                f,
                "the outbox's schema is at version {found}, this build reads version {current}: \
                 a migration (a read-write open, `outbox migrate`) brings it up to date"
            ),
            Error::WrongDatabase { outbox, connection } => write!(
                f,
                "enqueue was given a transaction on {connection}, not on the outbox's file \
                 {outbox}; nothing was written (open the transaction on a connection to the \
                 outbox's file: Outbox::transaction or Outbox::connection)"
            ),
            Error::NotADatabase { path } => write!(f, "{path} is not a SQLite database"),
            Error::NotFound { path } => write!(f, "{path} does not exist"),
            Error::NotAnOutbox { path } => write!(f, "{path} is not an outbox database"),
            Error::InvalidConfig(msg) => write!(f, "invalid configuration: {msg}"),
            Error::NotInTransaction => f.write_str(
                "enqueue needs an open transaction (a rusqlite Transaction or Savepoint); the \
                 connection is in autocommit mode, so the event was not written",
            ),
            Error::InvalidPath { path, reason } => {
                write!(f, "{path:?} cannot hold an outbox: {reason}")
            }
            Error::OnConnect(_) => f.write_str("the app's on_connect setup failed"),
            Error::DiskFull(_) => f.write_str(
                "the database or disk is full; nothing was written, earlier commits are intact",
            ),
            Error::ReadOnly(_) => f.write_str("the database file cannot be written"),
            Error::Sqlite(_) => f.write_str("SQLite error"),
            Error::Pool(_) => f.write_str("no database connection available"),
            Error::Io(_) => f.write_str("I/O error"),
            #[cfg(feature = "postgres")]
            Error::MigrationInProgress { waited } => write!(
                f,
                "another process is migrating the PostgreSQL tables (waited {:.1} s for its \
                 lock, the most this call waits); try again later",
                waited.as_secs_f64()
            ),
            // The server's own words: the error's own display says only "db error".
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => match e.as_db_error() {
                Some(db) => {
                    write!(f, "PostgreSQL error {}: {}", db.code().code(), db.message())?;
                    if let Some(detail) = db.detail() {
                        write!(f, " ({detail})")?;
                    }
                    Ok(())
                }
                None => f.write_str("PostgreSQL error"),
            },
        }
    }
}

impl std::error::Error for Error {
    /// The wrapped error (SQLite's, the pool's, the file system's, serde_json's,
    /// PostgreSQL's), which `{}` does not repeat; it is also in the variant, to match on.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.wrapped()
    }
}

impl Error {
    /// Whether trying the same call again later can succeed without changing anything: the
    /// database was locked past the busy timeout (`SQLITE_BUSY`, `SQLITE_LOCKED`), or every
    /// pooled connection was in use. Input errors, a full disk, a read-only file and the
    /// rest need something changed first.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Sqlite(e) | Error::OnConnect(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            Error::Pool(_) => true,
            _ => false,
        }
    }
}

impl Error {
    /// Whether the disk (or the database) is full: [`Error::DiskFull`], or a SQLite error
    /// that says so from the app's setup or a failed open (on a full disk SQLite may fail to
    /// size its `-shm` file with an I/O error instead). It works again once there is room.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::DiskFull(_) => true,
            Error::Sqlite(e) | Error::OnConnect(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure)
            ),
            Error::Pool(e) => {
                let text = e.to_string();
                text.contains("disk is full") || text.contains("disk I/O error")
            }
            _ => false,
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => Error::DiskFull(e),
            Some(rusqlite::ErrorCode::ReadOnly) => Error::ReadOnly(e),
            _ => Error::Sqlite(e),
        }
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        // Boxed, so that no r2d2 type is part of the crate's API.
        Error::Pool(Box::new(e))
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        Error::Postgres(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_and_handles_are_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();
        assert_bounds::<crate::Outbox>();
        assert_bounds::<crate::RelayHandle>();
        assert_bounds::<crate::RelayConfig>();
    }

    /// What a report that walks the chain prints (anyhow's and eyre's `{:#}`).
    fn report(err: &Error) -> String {
        let mut report = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(s) = source {
            report.push_str(&format!(": {s}"));
            source = s.source();
        }
        report
    }

    #[test]
    fn the_wrapped_error_is_the_source_and_said_once() {
        let locked = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".into()),
        );
        let err = Error::from(locked);
        assert!(err.is_busy());
        assert_eq!(err.to_string(), "SQLite error");
        assert_eq!(format!("{err:#}"), "SQLite error: database is locked");
        let source = std::error::Error::source(&err).expect("the SQLite error is the source");
        let sqlite = source
            .downcast_ref::<rusqlite::Error>()
            .expect("a rusqlite::Error");
        assert_eq!(
            sqlite.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy)
        );
        // The chain: what failed, then SQLite's message (rusqlite's own source, SQLite's
        // code, comes below it).
        let report = report(&err);
        assert!(
            report.starts_with("SQLite error: database is locked: "),
            "{report}"
        );
        assert!(!err.to_string().contains(&sqlite.to_string()));
        assert!(!Error::NotInTransaction.is_busy());
    }

    #[test]
    fn every_wrapping_variant_has_a_source_and_the_others_none() {
        let io = Error::Io(std::io::Error::other("no random source"));
        assert_eq!(io.to_string(), "I/O error");
        assert_eq!(format!("{io:#}"), "I/O error: no random source");
        assert_eq!(report(&io), "I/O error: no random source");
        let json = Error::InvalidData(serde_json::from_str::<u8>("x").unwrap_err());
        assert!(std::error::Error::source(&json).is_some());
        let full = Error::DiskFull(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        ));
        assert!(std::error::Error::source(&full).is_some());
        assert!(!full.to_string().contains("Error code"), "{full}");
        // Variants that wrap nothing say it all themselves.
        let no_route = Error::NoRoute {
            event_type: "a".into(),
        };
        assert!(std::error::Error::source(&no_route).is_none());
        assert_eq!(format!("{no_route:#}"), no_route.to_string());
    }

    #[test]
    fn payload_error_names_size_and_limit() {
        let msg = Error::PayloadTooLarge {
            size: 300_000,
            limit: 262_144,
        }
        .to_string();
        assert!(msg.contains("300000") && msg.contains("262144"), "{msg}");
    }
}

/// Which limit an enqueue ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// The number of pending deliveries.
    PendingEvents,
    /// The bytes of pending event data.
    PendingBytes,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::PendingEvents => "pending events",
            Limit::PendingBytes => "pending bytes",
        })
    }
}
