//! What differs between the systems the crate runs on, each difference in one small function
//! of plain arguments, and the constant `cfg` chooses for this build. The functions are
//! unit-tested for every system on any machine; the constants are what the build uses.
//!
//! This module uses nothing else of the crate's.

/// Whether this build is for an Apple system (macOS, iOS, iPadOS, watchOS, tvOS).
pub(crate) const APPLE: bool = cfg!(target_vendor = "apple");

/// The PRAGMAs that make `synchronous` keep its promise on this system, beside
/// `synchronous` itself: on Apple systems `fsync` leaves the drive's write cache as it is,
/// so SQLite asks for `F_FULLFSYNC` only with `fullfsync` (every sync at `FULL`) and
/// `checkpoint_fullfsync` (the checkpoint's syncs, which `NORMAL` relies on). Elsewhere
/// `fsync` reaches the medium and nothing is added.
pub(crate) fn durability_pragmas(full: bool, apple: bool) -> &'static str {
    match (apple, full) {
        (true, true) => "PRAGMA fullfsync=ON; PRAGMA checkpoint_fullfsync=ON;",
        (true, false) => "PRAGMA checkpoint_fullfsync=ON;",
        (false, _) => "",
    }
}

/// Whether a file-change watch on the database's folder reports writes to a file that stays
/// open, as SQLite's WAL does: inotify does (Linux, Android); FSEvents (macOS),
/// ReadDirectoryChangesW (Windows) and kqueue on a folder (iOS, the BSDs) report a file's
/// creation, removal or closing, not each write. Only where it does may the relay poll
/// less often while the watch is on.
pub(crate) fn watch_reports_writes_to_open_files(os: &str) -> bool {
    matches!(os, "linux" | "android")
}

/// The same for this build's system.
pub(crate) fn watch_reports_writes_here() -> bool {
    watch_reports_writes_to_open_files(std::env::consts::OS)
}

/// Whether a folder can be opened and synced, making a rename in it durable: on unix
/// systems; Windows refuses to open a folder as a file (a rename there is made durable by
/// the file system's own journal, NTFS's, and cannot be forced from here).
pub(crate) fn can_sync_folders(family: &str) -> bool {
    family == "unix"
}

/// The same for this build's system.
pub(crate) fn can_sync_folders_here() -> bool {
    can_sync_folders(std::env::consts::FAMILY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apple_systems_ask_for_full_syncs_and_the_others_need_nothing() {
        assert_eq!(
            durability_pragmas(true, true),
            "PRAGMA fullfsync=ON; PRAGMA checkpoint_fullfsync=ON;"
        );
        assert_eq!(
            durability_pragmas(false, true),
            "PRAGMA checkpoint_fullfsync=ON;"
        );
        assert_eq!(durability_pragmas(true, false), "");
        assert_eq!(durability_pragmas(false, false), "");
    }

    #[test]
    fn only_inotify_systems_report_writes_to_an_open_wal() {
        for os in ["linux", "android"] {
            assert!(watch_reports_writes_to_open_files(os), "{os}");
        }
        for os in ["macos", "ios", "windows", "freebsd", "openbsd", "netbsd"] {
            assert!(!watch_reports_writes_to_open_files(os), "{os}");
        }
        assert_eq!(watch_reports_writes_here(), cfg!(target_os = "linux"));
    }

    #[test]
    fn folders_are_synced_on_unix_only() {
        assert!(can_sync_folders("unix"));
        assert!(!can_sync_folders("windows"));
        assert_eq!(can_sync_folders_here(), cfg!(unix));
    }
}
