//! Waking a relay when another process commits: a file-change notification on the WAL.
//!
//! A commit appends its frames to the `-wal` file (a write, which inotify reports) and then
//! publishes them in the wal-index, in the `-shm` file, through a shared mapping that no
//! notification reports. So a notification says "look soon", not "it is visible now": the
//! relay reads `PRAGMA data_version` at once and again a few milliseconds later (see
//! `relay::writer`). Checkpoints, WAL resets and the relay's own commits notify too; they
//! only cost such a look, but while the relay delivers, its own claims and acks would
//! notify on every commit (5–7% of a batched drain's rate on two cores went to the watcher's
//! thread and those looks), so the writer [pauses](WalWatch::pause) the watch while requests
//! are out and polls at its poll interval meanwhile, as without a watch.
//!
//! The watch is on the file's directory, not on the file: a WAL deleted when the last
//! connection closes, or renamed and re-created by a backup or restore tool, is watched again
//! with no work of ours. Events about other files of the directory are dropped on the
//! watcher's thread. Where no watch can be set up (a file system without notifications, the
//! `wal-watch` feature off) the relay keeps polling `data_version` at its poll interval.

use std::path::Path;

use crossbeam_channel::{bounded, Receiver};

/// A live watch of one database's WAL; dropping it stops the watch.
pub(crate) struct WalWatch {
    #[cfg(feature = "wal-watch")]
    watcher: notify::RecommendedWatcher,
    /// The directory watched (the database's).
    #[cfg(feature = "wal-watch")]
    dir: std::path::PathBuf,
    paused: bool,
}

impl WalWatch {
    /// Whether notifications come: set up, and not paused.
    pub(crate) fn is_watching(&self) -> bool {
        !self.paused
    }

    /// Stops the notifications until [`resume`](Self::resume); the caller polls meanwhile.
    pub(crate) fn pause(&mut self) {
        #[cfg(feature = "wal-watch")]
        {
            use notify::Watcher;
            if let Err(e) = self.watcher.unwatch(&self.dir) {
                log::debug!("pausing the watch of {}: {e:#}", self.dir.display());
            }
        }
        self.paused = true;
    }

    /// Starts the notifications again; false if the watch cannot be set up again (the
    /// caller then keeps polling). Commits made while paused are not reported: the caller
    /// looks for them itself.
    pub(crate) fn resume(&mut self) -> bool {
        #[cfg(feature = "wal-watch")]
        {
            use notify::{RecursiveMode, Watcher};
            if let Err(e) = self.watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
                log::info!(
                    "cannot watch {} for changes again ({e:#}); polling for other processes' commits",
                    self.dir.display()
                );
                return false;
            }
        }
        self.paused = false;
        true
    }
}

impl std::fmt::Debug for WalWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WalWatch")
    }
}

/// Watches the WAL of the database at `db_path`. Each change makes one message ready on the
/// receiver (capacity one: a message not yet taken covers every change after it). `None`
/// when no watch can be set up; the reason is logged.
pub(crate) fn watch(db_path: &Path) -> Option<(WalWatch, Receiver<()>)> {
    let (tx, rx) = bounded::<()>(1);
    start(db_path, tx).map(|w| (w, rx))
}

#[cfg(feature = "wal-watch")]
fn start(db_path: &Path, changed: crossbeam_channel::Sender<()>) -> Option<WalWatch> {
    use notify::event::ModifyKind;
    use notify::{EventKind, RecursiveMode, Watcher};

    let file_name = db_path.file_name()?;
    let mut wal_name = file_name.to_os_string();
    wal_name.push("-wal");
    let dir = match db_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            // The kernel's queue overflowed, or the watch broke: look, to be safe.
            let _ = changed.try_send(());
            return;
        };
        // Writes, and the file made, removed or renamed; not opens, reads or metadata
        // (every new connection opens the file and sets the WAL's owner).
        if !matches!(
            event.kind,
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Name(_) | ModifyKind::Any)
                | EventKind::Create(_)
                | EventKind::Remove(_)
                | EventKind::Any
        ) {
            return;
        }
        if event
            .paths
            .iter()
            .any(|p| p.file_name() == Some(wal_name.as_os_str()))
        {
            let _ = changed.try_send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            log::info!(
                "no file-change notifications ({e:#}); polling for other processes' commits"
            );
            return None;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        log::info!(
            "cannot watch {} for changes ({e:#}); polling for other processes' commits",
            dir.display()
        );
        return None;
    }
    Some(WalWatch {
        watcher,
        dir,
        paused: false,
    })
}

#[cfg(not(feature = "wal-watch"))]
fn start(_db_path: &Path, _changed: crossbeam_channel::Sender<()>) -> Option<WalWatch> {
    None
}

#[cfg(all(test, feature = "wal-watch"))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_write_to_the_wal_is_reported_and_other_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let (_watch, changed) = watch(&db).expect("inotify works on this machine");
        std::fs::write(dir.path().join("other.txt"), b"x").unwrap();
        assert!(
            changed.recv_timeout(Duration::from_millis(300)).is_err(),
            "another file's change is not reported"
        );
        // Created, written, removed and created again: each reported, the watch survives.
        for _ in 0..2 {
            std::fs::write(dir.path().join("app.db-wal"), b"frames").unwrap();
            assert!(changed.recv_timeout(Duration::from_secs(5)).is_ok());
            while changed.recv_timeout(Duration::from_millis(100)).is_ok() {}
            std::fs::remove_file(dir.path().join("app.db-wal")).unwrap();
            assert!(changed.recv_timeout(Duration::from_secs(5)).is_ok());
            while changed.recv_timeout(Duration::from_millis(100)).is_ok() {}
        }
    }

    #[test]
    fn a_paused_watch_reports_nothing_until_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let (mut watch, changed) = watch(&db).expect("inotify works on this machine");
        watch.pause();
        assert!(!watch.is_watching());
        std::fs::write(dir.path().join("app.db-wal"), b"frames").unwrap();
        assert!(
            changed.recv_timeout(Duration::from_millis(300)).is_err(),
            "a paused watch reports no write"
        );
        assert!(watch.resume());
        assert!(watch.is_watching());
        std::fs::write(dir.path().join("app.db-wal"), b"more frames").unwrap();
        assert!(changed.recv_timeout(Duration::from_secs(5)).is_ok());
    }
}
