//! The WAL file as the checkpointer reads it without SQLite: its size, when it was last
//! written, and its checkpoint sequence number. None of these takes a lock, so watching
//! the WAL this way never stands in the way of another connection's checkpoint or of the
//! restart of the WAL by a writer (a PASSIVE checkpoint to count the frames would take the
//! checkpoint lock, and an app's automatic checkpoint that met it would be skipped).
//!
//! The sequence number (bytes 12 to 16 of the header, big-endian, per SQLite's file
//! format) grows by one each time a writer starts the WAL over, and the header is written
//! anew then, so a changed number means the WAL started over.
//!
//! The frames are counted from their headers too: each carries the salts of the WAL header
//! it was written under (bytes 8 to 16 of a frame's header, 16 to 24 of the WAL's), so the
//! frames written since the WAL started over are those, from the first, that carry the
//! current salts. A PASSIVE checkpoint cannot count them while another connection
//! checkpoints (it answers -1), and an app in another process that checkpoints after every
//! few commits does so most of the time: the WAL then grew unseen.
//!
//! Only the WAL file is opened here, never `<db>-shm` or the database: POSIX locks belong to
//! a process and a file, and closing any descriptor of a file drops every lock the process
//! holds on it. SQLite keeps the WAL's locks on `<db>-shm` and none on the WAL file; reading
//! the frame count from `<db>-shm`, as a first version did, dropped the locks of this
//! process's connections, and an app in another process found its file "malformed".

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The WAL file of the database at `db`.
pub(crate) struct WalFile {
    path: PathBuf,
}

/// The WAL file's header, and each frame's, in bytes.
const WAL_HEADER_BYTES: u64 = 32;
const FRAME_HEADER_BYTES: u64 = 24;

impl WalFile {
    /// The WAL of the database file at `db` (`<db>-wal`).
    pub fn of(db: &Path) -> WalFile {
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        WalFile {
            path: PathBuf::from(path),
        }
    }

    /// The frames written since the WAL last started over (committed or about to be):
    /// the last of the frames, from the first on, whose header carries the salts of the
    /// WAL's header (frames left from before carry older salts). `None`: no WAL header.
    pub fn frames(&self) -> Option<i64> {
        let mut file = File::open(&self.path).ok()?;
        let mut header = [0u8; WAL_HEADER_BYTES as usize];
        file.read_exact(&mut header).ok()?;
        let page = u64::from(u32::from_be_bytes([
            header[8], header[9], header[10], header[11],
        ]));
        let salts = &header[16..24];
        let frame_bytes = FRAME_HEADER_BYTES + page;
        let in_file = file.metadata().ok()?.len().saturating_sub(WAL_HEADER_BYTES) / frame_bytes;
        let mut current = |frame: u64| {
            let mut frame_header = [0u8; FRAME_HEADER_BYTES as usize];
            file.seek(SeekFrom::Start(
                WAL_HEADER_BYTES + (frame - 1) * frame_bytes,
            ))
            .and_then(|_| file.read_exact(&mut frame_header))
            .is_ok_and(|_| &frame_header[8..16] == salts)
        };
        // Frames 1..=low are current, high + 1 on are not: halve the gap.
        let (mut low, mut high) = (0, in_file);
        while low < high {
            let middle = low + (high - low).div_ceil(2);
            if current(middle) {
                low = middle;
            } else {
                high = middle - 1;
            }
        }
        i64::try_from(low).ok()
    }

    /// The file, opened to sync it: with write access, as Windows flushes a file only
    /// through a handle that may write (nothing is written through it). Closing it touches
    /// none of SQLite's locks, which are on the database file and `-shm`.
    pub fn open_to_sync(&self) -> std::io::Result<File> {
        OpenOptions::new().write(true).open(&self.path)
    }

    /// Writes the WAL's data out to the disk (`fdatasync`), so that a checkpoint begun
    /// just after syncs only what came since. Errors are ignored: SQLite's own sync
    /// follows, and reports them.
    pub fn write_out(&self) {
        if let Ok(file) = self.open_to_sync() {
            let _ = file.sync_data();
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

    #[test]
    fn the_frames_counted_in_the_file_are_those_a_passive_checkpoint_counts() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("frames.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t (b BLOB);",
        )
        .unwrap();
        let wal = WalFile::of(&db);
        let passive = || {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1))
                .unwrap()
        };
        for rows in [1, 10, 100] {
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO t SELECT randomblob(5000) FROM n",
                [rows],
            )
            .unwrap();
            let frames = wal.frames().expect("a WAL header");
            assert!(
                frames > rows,
                "{frames} frames for {rows} rows of 5000 bytes"
            );
            assert_eq!(frames, passive());
        }
        // Started over: the frames of before are still in the file, with older salts.
        conn.execute("INSERT INTO t VALUES (x'00')", []).unwrap();
        let frames = wal.frames().unwrap();
        assert!(frames < 5, "{frames} frames after the WAL started over");
        assert_eq!(frames, passive());
        assert_eq!(WalFile::of(&dir.path().join("none.db")).frames(), None);
    }

    /// Whether another process gets SQLite's write lock on `db` at once.
    fn another_process_can_write(db: &Path) -> bool {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3, sys\n\
                 c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n\
                 try:\n    c.execute('BEGIN IMMEDIATE'); print('wrote')\n\
                 except sqlite3.OperationalError as e: print(e)",
            ])
            .arg(db)
            .output()
            .expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).trim() == "wrote"
    }

    #[test]
    fn reading_the_wal_leaves_sqlites_locks_held() {
        // POSIX locks belong to the process and a file: closing any descriptor of a file
        // drops every lock the process holds on it, SQLite's included. SQLite keeps the
        // WAL's locks on `<db>-shm`; a first reading of the frame count from there let
        // another process write while this one held the write lock, and an app's next read
        // found "database disk image is malformed".
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        let mut conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);",
        )
        .unwrap();
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("INSERT INTO t VALUES (2)", []).unwrap();
        assert!(!another_process_can_write(&db), "the write lock is held");
        let wal = WalFile::of(&db);
        let _ = (wal.bytes(), wal.modified(), wal.sequence(), wal.frames());
        assert!(
            !another_process_can_write(&db),
            "the write lock was dropped"
        );
        tx.commit().unwrap();
    }
}
