//! Platforms: Windows, macOS and iOS, Android, small 32-bit gateways, and where the file
//! should live on each; what was built and tested where.
//!
//! # What is built and tested where
//!
//! Development and CI run on x86_64 Linux, the only target this project's machines have.
//! Every other system's difference is one small function in `src/platform.rs`, chosen by
//! `cfg` and unit-tested as a plain function for every system on any machine; and
//! `tests/platforms.rs` reads the source for what would break another system's build (a
//! 64-bit atomic of the standard library, a unix-only API outside `#[cfg(unix)]`).
//!
//! | | built | tested |
//! |---|---|---|
//! | Linux x86_64 | yes | every suite: power loss on FUSE, full disk on tmpfs, PostgreSQL, Mosquitto |
//! | Windows, macOS, iOS, Android | not here (no target) | the choices as functions; the source checks |
//! | 32-bit ARM, MIPS, PowerPC | not here | the source check: every 64-bit atomic is `portable-atomic`'s |
//!
//! # Windows
//!
//! `outbox relay` runs beside an Electron, .NET or Python desktop app; `outbox ingest`
//! stops on Ctrl-C or when its console closes (it has no SIGHUP: re-read `--keys` by
//! restarting it, or keep the keys in `--keys-table`, re-read within a second).
//! [`Outbox::export`](crate::Outbox::export) syncs the bundle file; the folder is synced only
//! on unix (Windows refuses to open a folder as a file; NTFS's journal keeps the rename).
//! `outbox keygen` writes the key with mode `0600` on unix; on Windows the file takes its
//! folder's access list: write it under the user's profile (`%LOCALAPPDATA%`), which only
//! that user and administrators can read, never in a shared folder.
//!
//! # macOS and iOS
//!
//! Every connection sets `checkpoint_fullfsync`, and `fullfsync` at
//! [`Synchronous::Full`](crate::Synchronous::Full), so the durability table of
//! [`guide::durability`](crate::guide::durability) holds there too. The WAL watch
//! (`wal-watch` feature) cannot see another process's commit on these systems
//! (FSEvents and kqueue report a file's creation and closing, not each write to the open
//! WAL), so the relay keeps polling at its poll interval there, not the 5 s it allows itself
//! on Linux and Android; commits through [`Outbox`](crate::Outbox) in the same process wake
//! it at once everywhere. On iOS, keep the file under the app's Application Support folder
//! with data protection `NSFileProtectionCompleteUntilFirstUserAuthentication`: the stricter
//! `Complete` class makes the file unreadable while the phone is locked, and a background
//! task then fails to open it.
//!
//! # Phones: a few seconds in the background
//!
//! Android (WorkManager) and iOS (BGTaskScheduler, `beginBackgroundTask`) give an app a
//! slot of seconds to sync. [`Outbox::deliver_pending`](crate::Outbox::deliver_pending)
//! delivers what is pending and returns by the deadline given, with what went, what is left
//! and why ([`DrainReport`](crate::DrainReport)); it keeps a quarter of the slot for
//! stopping, and the last word to a receiver that takes accounting (the streams' final
//! state) is cut at the deadline, skipped when under 250 ms are left. The system may end the task at any moment: events are taken by leases, never
//! locks, so a killed drain leaves them to the next one once the lease runs out (choose a
//! lease a little over twice the request timeout for a phone). Call it from the task the
//! system gives, not a thread of your own that outlives it.
//!
//! # Small devices
//!
//! A relay's memory is its threads (a writer, the destinations' workers, a checkpointer)
//! plus the events it holds: at most [`RelayConfig::max_in_flight`](crate::RelayConfig::max_in_flight) claimed
//! events a destination (400 by default) and at most 16 MiB of their data, each request's
//! body once more while it is sent. On a gateway with a few megabytes to spare, cap it:
//! `max_in_flight(8)`, one or two workers, and [`Destination::batch`](crate::Destination::batch)
//! with a byte bound, so `max_in_flight` × the largest payload fits. 32-bit targets without
//! 64-bit atomics build (`portable-atomic` with its fallback).
//!
//! # Where the file lives
//!
//! On a local disk the app owns: the app's data folder (`%LOCALAPPDATA%` on Windows,
//! `~/Library/Application Support` on macOS, the app's files folder on Android). Not in a
//! folder a cloud service syncs (OneDrive, iCloud Drive, Dropbox, Google Drive): they copy
//! the database, its `-wal` and `-shm` files at different moments and can bring back an old
//! copy, which SQLite cannot make whole. Not on a network share (SMB, NFS): WAL needs shared
//! memory that only one machine's processes can map, and locks there are not reliable.
//!
//! A path through a symbolic link (the app's folder linking to a file on a data disk) is
//! resolved once, at open, on Unix: SQLite puts the `-wal` and `-shm` files beside the file
//! the link points to, and so does the outbox with its reserve, its free-space reads (a full
//! data disk is seen full) and its watch for other processes' commits; two paths to one
//! file share one reserve, and [`Outbox::path`](crate::Outbox::path) returns the resolved
//! path (`tests/symlinked_path.rs`).
//!
//! # The clock that tells a step from a sleep
//!
//! The relay follows steps of the wall clock (NTP, a user) in both directions by measuring
//! it against a clock that counts the device's sleep and no step: `CLOCK_BOOTTIME` on Linux
//! and Android, `CLOCK_MONOTONIC` on macOS and iOS (there it counts sleep; Rust's `Instant`
//! does not), `Instant` on Windows (QueryPerformanceCounter counts standby and hibernation).
//! On other systems (the BSDs) there is none it knows: only steps back are followed, and a
//! step forward expires what a suspend of that length would (see the guide's relay chapter).
//!
//! # Networks
//!
//! Proxies, private CAs, client certificates and the operating system's certificate store
//! are in [`guide::destinations`](crate::guide::destinations): `HttpConfig::proxy`,
//! `proxy_from_env`, `ca_pem`, `client_identity_pem` and (feature `platform-verifier`)
//! `platform_roots`.
