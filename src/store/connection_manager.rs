//! The pool's connection manager: opens a connection to the outbox's file with the flags
//! and setup the outbox chose.
//!
//! Its own rather than `r2d2_sqlite`'s, which is released some time after each rusqlite: an
//! app on the newest rusqlite could not add the crate until then (one SQLite per build, so
//! one rusqlite). This is all `r2d2_sqlite` did for the outbox.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

/// What each new connection runs first (the app's `on_connect`, the outbox's PRAGMAs).
type Init = Box<dyn Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Opens connections to one file for an `r2d2` pool.
pub(crate) struct SqliteManager {
    path: PathBuf,
    flags: OpenFlags,
    init: Init,
}

impl SqliteManager {
    /// Connections to `path` opened with `flags`, each set up by `init`.
    pub fn new(
        path: &Path,
        flags: OpenFlags,
        init: impl Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> SqliteManager {
        SqliteManager {
            path: path.to_path_buf(),
            flags,
            init: Box::new(init),
        }
    }
}

impl r2d2::ManageConnection for SqliteManager {
    type Connection = Connection;
    type Error = rusqlite::Error;

    fn connect(&self) -> Result<Connection, rusqlite::Error> {
        let mut conn = Connection::open_with_flags(&self.path, self.flags)?;
        (self.init)(&mut conn)?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<(), rusqlite::Error> {
        conn.execute_batch("")
    }

    fn has_broken(&self, _: &mut Connection) -> bool {
        false
    }
}
