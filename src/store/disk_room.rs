//! The room the outbox keeps for a disk that fills: a reserve file beside the database, given
//! back to the file system when SQLite reports the disk full and taken again once room
//! returns.
//!
//! Why: an unattended device's disk fills (logs, a camera, an update). SQLite then fails every
//! write, the relay's claims and acknowledgements too, so the one thing on the device that
//! could make room (deliver, then drop delivered history) stops, and the disk stays full. The
//! reserve is room held in advance: given back, it is what the relay needs to go on claiming,
//! sending and acknowledging, and to delete delivered history so that the app's next commits
//! fit in the pages that frees inside the file.
//!
//! The reserve is one file, `<database>-outbox-reserve`, of [`DEFAULT_RESERVE_BYTES`] unless
//! the app chose otherwise (`OutboxBuilder::disk_reserve`; 0 turns it off). Its blocks are
//! allocated (`fallocate`), not a sparse file, so they are really held. Every process that
//! opens the outbox shares it: whichever relay meets the full disk first gives it back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The reserve's size unless the app chose another: room for a relay's claims and
/// acknowledgements and for deleting delivered history a page at a time.
pub const DEFAULT_RESERVE_BYTES: u64 = 2 << 20;

/// How often at most a relay under disk pressure tries to take the reserve back.
const RETAKE_INTERVAL: Duration = Duration::from_secs(5);

/// How often at most the file system's free space is read to tell whether it is full.
const FULL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The reserve and whether this process has seen the disk full since it last held it.
#[derive(Debug)]
pub(crate) struct DiskRoom {
    reserve: PathBuf,
    bytes: u64,
    /// SQLite reported the disk full and the reserve has not been taken back since.
    pressure: AtomicBool,
    /// When the reserve may be tried again (see [`DiskRoom::retake_now_and_then`]).
    next_try: Mutex<Option<Instant>>,
    /// When the file system's free space was last read, and whether it was full then.
    full_checked: Mutex<Option<(Instant, bool)>>,
}

impl DiskRoom {
    /// The room for the database at `database` (an absolute path), with a reserve of
    /// `bytes` (0: none). Takes nothing yet.
    pub fn new(database: &Path, bytes: u64) -> DiskRoom {
        let mut name = database.as_os_str().to_owned();
        name.push("-outbox-reserve");
        DiskRoom {
            reserve: PathBuf::from(name),
            bytes,
            pressure: AtomicBool::new(false),
            next_try: Mutex::new(None),
            full_checked: Mutex::new(None),
        }
    }

    /// The reserve file's path.
    pub fn reserve_path(&self) -> &Path {
        &self.reserve
    }

    /// The reserve's size when held (0: none is kept).
    pub fn reserve_bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes the reserve unless it is held already, if the file system has room for it twice
    /// over (so taking it never leaves the app the last bytes). Returns whether it is held
    /// now; taking it ends the pressure.
    pub fn take(&self) -> bool {
        if self.bytes == 0 {
            return false;
        }
        if self.held_bytes() >= self.bytes {
            // Whole again after a refill, maybe on a disk still full: the pressure ends
            // (and "disk room returned" is logged) only once there is room beside it too.
            if !self.is_full() {
                self.end_pressure();
            }
            return true;
        }
        let free = self.available_bytes().unwrap_or(0);
        if free < self.bytes.saturating_mul(2) {
            return false;
        }
        match allocate(&self.reserve, self.bytes) {
            Ok(()) => {
                self.end_pressure();
                true
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.reserve);
                log::debug!("disk reserve {} not taken: {e:#}", self.reserve.display());
                false
            }
        }
    }

    /// [`DiskRoom::take`] under pressure, at most every few seconds: for a relay's loop.
    pub fn retake_now_and_then(&self) -> bool {
        let mut next = self.next_try.lock().unwrap_or_else(|p| p.into_inner());
        if next.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        *next = Some(Instant::now() + RETAKE_INTERVAL);
        drop(next);
        self.take()
    }

    /// Takes as much of the reserve back as the file system has free, up to its size, whatever
    /// that leaves: a relay does this while it holds the write lock right after giving the
    /// reserve back, so that what it did not need stays the outbox's instead of going to the
    /// next writer. Returns the bytes held now.
    pub fn refill(&self) -> u64 {
        if self.bytes == 0 {
            return 0;
        }
        let held = self.held_bytes();
        let free = self.available_bytes().unwrap_or(0);
        let want = self.bytes.min(held.saturating_add(free));
        if want > held {
            if let Err(e) = allocate(&self.reserve, want) {
                log::debug!(
                    "disk reserve {} not refilled: {e:#}",
                    self.reserve.display()
                );
                // A partial allocation may hold some: keep what it holds.
            }
        }
        self.held_bytes()
    }

    /// SQLite reported the disk full: the outbox is under pressure from now on, and the
    /// reserve goes back to the file system. Returns the bytes given back (0 if none was
    /// held: another process gave it back first, or it was never taken).
    pub fn disk_full(&self) -> u64 {
        self.pressure.store(true, Ordering::SeqCst);
        let held = self.held_bytes();
        if held == 0 {
            return 0;
        }
        match std::fs::remove_file(&self.reserve) {
            Ok(()) => held,
            Err(_) => 0,
        }
    }

    /// SQLite reported the disk full: under pressure from now on, the reserve kept.
    pub fn mark_full(&self) {
        self.pressure.store(true, Ordering::SeqCst);
    }

    /// Whether the outbox is under disk pressure: this process saw SQLite report the disk
    /// full since the reserve was last taken whole, or the file system is full now (read at
    /// most every [`FULL_CHECK_INTERVAL`]).
    pub fn under_pressure(&self) -> bool {
        if self.pressure.load(Ordering::SeqCst) {
            return true;
        }
        let mut checked = self.full_checked.lock().unwrap_or_else(|p| p.into_inner());
        match *checked {
            Some((at, full)) if at.elapsed() < FULL_CHECK_INTERVAL => full,
            _ => {
                let full = self.bytes > 0 && self.is_full();
                *checked = Some((Instant::now(), full));
                full
            }
        }
    }

    /// The bytes the reserve holds now (0 when given back).
    pub fn held_bytes(&self) -> u64 {
        std::fs::metadata(&self.reserve).map_or(0, |m| m.len())
    }

    /// Bytes the file system holding the database has free for this process, if known.
    pub fn available_bytes(&self) -> Option<u64> {
        let folder = self.reserve.parent().unwrap_or(Path::new("."));
        fs4::available_space(folder).ok()
    }

    /// Whether the disk is full: less room is free than the reserve would hold (or than
    /// [`FULL_BELOW_BYTES`] without a reserve).
    pub fn is_full(&self) -> bool {
        let threshold = self.bytes.max(FULL_BELOW_BYTES);
        self.available_bytes().is_some_and(|free| free < threshold)
    }

    fn end_pressure(&self) {
        if self.pressure.swap(false, Ordering::SeqCst) {
            log::info!(
                "disk room returned: the outbox's reserve of {} bytes is held again",
                self.bytes
            );
        }
    }
}

/// Below this many free bytes the disk counts as full when no reserve is kept.
pub const FULL_BELOW_BYTES: u64 = 1 << 20;

/// Creates `path` with `bytes` allocated on the disk and synced.
fn allocate(path: &Path, bytes: u64) -> std::io::Result<()> {
    use fs4::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    FileExt::allocate(&file, bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_taken_given_back_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let room = DiskRoom::new(&dir.path().join("app.db"), 64 << 10);
        assert!(room.reserve_path().ends_with("app.db-outbox-reserve"));
        assert!(room.take());
        assert_eq!(room.held_bytes(), 64 << 10);
        assert!(!room.under_pressure());
        assert_eq!(room.disk_full(), 64 << 10);
        assert!(room.under_pressure());
        assert_eq!(room.held_bytes(), 0);
        assert!(!room.reserve_path().exists());
        // A second report gives back nothing more.
        assert_eq!(room.disk_full(), 0);
        assert!(room.retake_now_and_then());
        assert!(!room.under_pressure());
        // Not tried again before the interval.
        room.disk_full();
        assert!(!room.retake_now_and_then());
    }

    #[test]
    fn no_reserve_is_kept_when_turned_off() {
        let dir = tempfile::tempdir().unwrap();
        let room = DiskRoom::new(&dir.path().join("app.db"), 0);
        assert!(!room.take());
        assert!(!room.reserve_path().exists());
        assert_eq!(room.disk_full(), 0);
    }
}
