//! The WAL file as the checkpointer reads it without SQLite: its size, when it was last
//! written, and its checkpoint sequence number. None of these takes a lock, so watching
//! the WAL this way never stands in the way of another connection's checkpoint or of the
//! restart of the WAL by a writer (a PASSIVE checkpoint to count the frames would take the
//! checkpoint lock, and an app's automatic checkpoint that met it would be skipped).
//!
//! The sequence number (bytes 12 to 16 of the header, big-endian, per SQLite's file
//! format) grows by one each time a writer starts the WAL over, and the header is written
//! anew then, so a changed number means the WAL started over.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The WAL file of the database at `db`.
pub(crate) struct WalFile {
    path: PathBuf,
}

impl WalFile {
    /// The WAL of the database file at `db` (`<db>-wal`).
    pub fn of(db: &Path) -> WalFile {
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        WalFile {
            path: PathBuf::from(path),
        }
    }

    /// The file's size in bytes (0 if it cannot be read).
    pub fn bytes(&self) -> i64 {
        std::fs::metadata(&self.path).map_or(0, |m| i64::try_from(m.len()).unwrap_or(i64::MAX))
    }

    /// When the file was last written (`None` if that cannot be read).
    pub fn modified(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }

    /// The checkpoint sequence number in the file's header (`None`: no header yet, or it
    /// cannot be read).
    pub fn sequence(&self) -> Option<u32> {
        let mut header = [0u8; 16];
        File::open(&self.path)
            .and_then(|mut f| f.read_exact(&mut header))
            .ok()?;
        Some(u32::from_be_bytes([
            header[12], header[13], header[14], header[15],
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    #[test]
    fn the_sequence_number_changes_when_a_writer_starts_the_wal_over() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("seq.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t (x); INSERT INTO t VALUES (1);",
        )
        .unwrap();
        let wal = WalFile::of(&db);
        let first = wal.sequence().expect("a header");
        assert!(wal.bytes() > 0 && wal.modified().is_some());
        conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
        assert_eq!(wal.sequence(), Some(first), "appended, not started over");
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        conn.execute("INSERT INTO t VALUES (3)", []).unwrap();
        assert_eq!(wal.sequence(), Some(first + 1), "started over");
    }
}
