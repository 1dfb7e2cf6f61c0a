//! Durability: what survives a crash, a power loss and a full disk, and why no event is sent before its commit is on disk.
//!
//! [`OutboxBuilder::synchronous`](crate::OutboxBuilder::synchronous) sets [`Synchronous::Normal`](crate::Synchronous::Normal) (the default) or
//! [`Synchronous::Full`](crate::Synchronous::Full) on every pooled connection, with `journal_mode=WAL`
//! and a busy timeout (5 s); the CLI takes the same choice as
//! `--synchronous normal|full` (or `OUTBOX_SYNCHRONOUS`), so an operator's `outbox enqueue`
//! and `outbox relay` can run with the app's setting.
//!
//! What survives, by what happens to the device:
//!
//! | | process crash, `kill -9` | power loss, OS crash |
//! |---|---|---|
//! | **Normal** | every commit that returned | the last commits before the loss may roll back, each transaction whole: its business rows and its events together |
//! | **Full** | every commit that returned | every commit that returned (one fsync per transaction) |
//! | both | the file is never corrupt | the file is never corrupt |
//!
//! **On each system.** On Linux, Android and Windows a sync reaches the medium. On Apple
//! systems (macOS, iOS) `fsync` leaves the drive's write cache as it is, so every outbox
//! connection there also sets `PRAGMA checkpoint_fullfsync=ON` (the checkpoint's syncs,
//! which `Normal`'s promise rests on) and, at `Full`, `PRAGMA fullfsync=ON` (every sync an
//! `F_FULLFSYNC`): without them a Mac's `Full` promised less than Linux's `Normal`. The
//! power-loss suite runs on Linux only (FUSE); the Apple choice is unit-tested as a plain
//! function in `src/platform.rs` (see [`guide::platforms`](crate::guide::platforms)).
//!
//! **No ghosts, in either mode.** A relay never sends an event before the transaction that
//! committed it is on disk, whatever the app chose: after the claim that takes events for
//! sending has committed, and before they go out, the relay syncs the WAL file when another
//! connection has committed since its last sync, and that one sync of the append-only WAL
//! covers every commit before it (`src/relay/barrier.rs`). The sync runs after the claim
//! has released SQLite's write lock, so the app's commits never wait for it. Without it, at `Normal` a relay could deliver an event a
//! millisecond after its commit and a power cut could then roll the commit back, leaving the
//! receiver with an event for a change the device no longer has. Draining a backlog costs
//! one sync; while the app keeps committing, about one per claim (see docs/PERFORMANCE.md
//! for the cost). An ack lost in a power cut makes its event pending again,
//! so it is sent again: a duplicate, which receivers drop by id.
//!
//! `cli/tests/power_loss.rs` proves each cell on a file system that loses unsynced writes
//! (`tests/common/power_cut_fs.rs`, FUSE): an app process and a relay process run while the
//! power is cut at random moments, 50 times per mode (a 1,000-cut soak is
//! `POWER_CUTS=1000 cargo test --release --test power_loss`), half of the cuts tearing the
//! unsynced writes instead of dropping them. After each cut the file passes
//! `PRAGMA integrity_check`, business rows and events match one to one, under `Full` no
//! returned commit is missing, and the receiver holds no event the device lacks; after the
//! last, every event on the device is delivered.
//!
//! # A full disk
//!
//! The most common failure of an unattended device: logs, a camera or an update fill the
//! file system. SQLite then refuses every write (`SQLITE_FULL`): nothing committed is lost
//! and the file stays sound, but a relay's claims and acknowledgements are writes too, so
//! without room of its own the one thing on the device that could make room (deliver, then
//! drop delivered history) would stop and leave the disk full.
//!
//! So the outbox keeps room in advance: a file of 2 MiB beside the database,
//! `<database>-outbox-reserve` ([`OutboxBuilder::disk_reserve`](crate::OutboxBuilder::disk_reserve)
//! sets its size, 0 keeps none), its blocks allocated (`fallocate`), taken when the outbox
//! opens or a relay starts if the file system has room for it twice over. It is the only
//! file the outbox adds beside SQLite's own `-wal` and `-shm`. When SQLite reports the disk
//! full to a relay, or a running relay finds the file system full (less free than the
//! reserve, read at most once a second), whatever is pending, even nothing:
//!
//! 1. it takes SQLite's write lock, gives the reserve back and copies the WAL into the
//!    database (a `PASSIVE` checkpoint on a connection of its own) before it lets the lock
//!    go: the commits that filled the disk may need the database file to grow when copied
//!    into it, the reserve's room is for that, and no other writer takes that room first (an
//!    app committing flat out grew the WAL into it when the reserve went back before the
//!    lock was held, and then no writer of the file could write at all). With every frame
//!    copied the next write starts the WAL over: the relay's claims and acknowledgements,
//!    and the app's commits, are from then on written into the room the WAL file already
//!    has, which needs no free byte. With events pending the relay takes back what the copy
//!    left free, up to the reserve's size, before it lets the lock go, and gives it back the
//!    same way at its next failed write; with nothing pending it leaves that room to the
//!    app's commits (a relay that kept up used to take it back at once, and every commit of
//!    the app's failed while nothing was pending);
//! 2. it keeps claiming, sending and acknowledging, and deletes delivered history (then
//!    expired and exported events) oldest first, a page at a time, **whatever the
//!    retention**: logged once, counted in [`Stats::pruned_for_room`](crate::admin::Stats::pruned_for_room)
//!    and the metric `outbox_pruned_for_room_total`. The pages it frees stay in the file (not
//!    handed back to the file system, where another program could take them), so the app's
//!    next commits fit in them. Dead letters stay: an operator has yet to see them;
//! 3. once the file system has room again (twice the reserve), it takes the reserve back and
//!    retention rules again.
//!
//! The app's [`Outbox::enqueue`](crate::Outbox::enqueue) (and an `INSERT` through the SQL
//! contract) gets [`Error::DiskFull`](crate::Error::DiskFull) ([`Error::is_disk_full`](crate::Error::is_disk_full))
//! until a relay has made that room (within about a second of the disk filling, when one is
//! running), and afterwards only while pending events alone fill the room; its transaction
//! rolls back whole. A relay
//! started on a disk that is already full (a device that rebooted full) does the same at
//! its first write; [`Outbox::open`](crate::Outbox::open) gives the reserve back too if the
//! file cannot be opened for lack of room. `outbox stats` and
//! [`Outbox::stats`](crate::Outbox::stats) show the free bytes, the reserve held and
//! whether the disk is full ([`Stats::disk_full`](crate::admin::Stats::disk_full), read
//! without writing, so it works on the full disk), [`Outbox::health`](crate::Outbox::health)
//! reports a full disk, and the gauges `outbox_disk_full` and `outbox_disk_reserve_bytes`
//! follow it.
//!
//! Room for the WAL beside the file: a running relay keeps it within 16 MiB plus what every
//! writer of the file writes in a fraction of a second, also while an app in another process
//! commits flat out (the relay gives way to it past 16 MiB: see the guide's relay chapter);
//! 21-32 MiB beside an app writing 20 MB/s. A long reader (a backup) lets it grow until it
//! ends; past 64 MiB the file is cut back once the reader is gone.
//!
//! On a copy-on-write file system (btrfs, ZFS, APFS) every overwrite needs new blocks, so
//! the WAL's own room does not carry the relay there: the reserve alone does, while it
//! lasts, and the history it deletes gives blocks back only once SQLite reuses its pages.
//!
//! `tests/full_disk.rs` proves it on a 16 MiB file system (a tmpfs the test mounts): a relay
//! running while an app commits orders and their events until SQLite says the disk is full
//! and another file takes the last free byte, and a relay started (the outbox opened again)
//! after that; with the disk still full, every committed event is delivered, the app
//! commits again, `PRAGMA integrity_check` says `ok`, and stats and health say the disk is
//! full. Before, nothing was delivered (0 of 11,090 events) and the claims failed every few
//! seconds until someone freed the disk.
