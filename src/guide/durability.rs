//! Durability: what survives a crash and a power loss, and why no event is sent before its commit is on disk.
//!
//! [`OutboxBuilder::synchronous`](crate::OutboxBuilder::synchronous) sets [`Synchronous::Normal`](crate::Synchronous::Normal) (the default) or
//! [`Synchronous::Full`](crate::Synchronous::Full) on every pooled connection, with `journal_mode=WAL`,
//! `foreign_keys=ON` and a busy timeout (5 s); the CLI takes the same choice as
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
