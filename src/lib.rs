//! A transactional outbox on SQLite, for edge, desktop and IoT apps.
//!
//! An app writes its business change **and** the event that announces it in one SQLite
//! transaction on its own database file: both commit or neither does, so there is no dual
//! write to get wrong. A relay of plain threads (no async runtime) then delivers each
//! committed event at least once (HTTP with Standard Webhooks signatures and CloudEvents, or
//! MQTT) with backoff, crash-safe leases, per-key order and patience for networks gone for
//! weeks. Every event carries a stable UUIDv7 id, so receivers drop duplicates.
//!
//! # The program an app writes
//!
//! ```
//! use sqlite_outbox::rusqlite::Connection;
//! use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("app.db");
//! // The app's own file, with its own schema and migrations: here its version is kept in
//! // PRAGMA user_version, as rusqlite_migration keeps it. The outbox never touches it.
//! let mut conn = Connection::open(&path)?;
//! if conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? == 0 {
//!     conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER)")?;
//!     conn.pragma_update(None, "user_version", 1)?;
//! }
//!
//! // The outbox's tables beside the app's, and a relay delivering to the app's receiver.
//! let outbox = Outbox::open(&path)?;
//! let receiver = "https://hooks.example.com/orders";
//! # let receiver = "http://127.0.0.1:9/orders"; // in the doc test: loopback, nothing listens
//! let relay = outbox
//!     .relay(RelayConfig::new().destination(
//!         Destination::http("default", receiver).secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
//!     ))
//!     .start()?;
//!
//! // The business change and its event: one transaction, on the app's own connection.
//! let tx = conn.transaction()?;
//! tx.execute("INSERT INTO orders (total_cents) VALUES (990)", [])?;
//! let order = tx.last_insert_rowid();
//! let enqueued = outbox.enqueue(&tx, Event::new("order.placed", serde_json::json!({ "id": order })))?;
//! tx.commit()?;
//! outbox.notify(); // wakes the relay now rather than at its next poll
//! println!("order {order} announced as event {}", enqueued.event_id());
//!
//! // On exit: stop claiming, wait (bounded, 10 s by default) for requests in flight.
//! let report = relay.shutdown();
//! # assert_eq!(report.abandoned, 0);
//! # Ok(()) }
//! ```
//!
//! [`Outbox::transaction`] runs the same on a pooled connection, and `cargo run --release
//! --example quickstart` runs it end to end against a real receiver on 127.0.0.1 that
//! verifies every signature. Apps in other languages write the same row with one `INSERT`
//! ([`guide::sql_contract`]) and run `outbox relay` beside them.
//!
//! # What the outbox does to the app's file
//!
//! - **Its own objects, all named `outbox_…`**: the tables `outbox_events`, `outbox_schema`
//!   (its schema version), `outbox_settings` (routes, limits and policies: [`settings`]),
//!   `outbox_destinations`, `outbox_stats`, `outbox_delivered_totals`,
//!   `outbox_pending_tally`, `outbox_lease_tally`, `outbox_streams` (each stream's numbers,
//!   see [guide::fleet]), `outbox_fates`, `outbox_lost_numbers`, `outbox_budgets` (what
//!   each destination's data budget has spent, see [`guide::metered_links`]) and
//!   `outbox_inbox`; the views `outbox_enqueue` and
//!   `outbox_enqueue_make_way` with their `INSTEAD OF` triggers; triggers on its own table
//!   (`outbox_events`: totals, stream numbers, fates); indexes on its own tables. Migrations add only such objects,
//!   each in its own `IMMEDIATE` transaction.
//! - **WAL mode, which SQLite persists in the file**: every connection to it, the app's
//!   too, is in WAL mode from then on, with the `-wal` and `-shm` files beside it.
//! - **One file of its own beside it**, `<file>-outbox-reserve` (2 MiB, allocated): room
//!   kept for a full disk, given back to the file system when SQLite reports the disk full
//!   so the relay goes on delivering ([`OutboxBuilder::disk_reserve`] sets its size, 0
//!   keeps none; see [`guide::durability`]). Under disk pressure a relay deletes delivered
//!   history whatever the retention, so the app's commits fit.
//! - **Incremental auto-vacuum on a brand-new, empty file only** (it must be chosen before
//!   the first table): pruning then hands pages back to the file system. A file that
//!   already has tables keeps its setting.
//! - **On its own connections only**: `synchronous` ([`Synchronous`]),
//!   `wal_autocheckpoint` (8192 pages) and a busy handler (5 s), after the app's
//!   [`on_connect`](OutboxBuilder::on_connect); every other PRAGMA (`foreign_keys`,
//!   `cache_size`, …) is the app's to set there, and the outbox sets none of them. The app's
//!   connections keep theirs. A running relay checkpoints the WAL from a thread of its own (PASSIVE, and past
//!   16 MiB a RESTART that never waits on the app's readers), prunes delivered rows older
//!   than its retention, a page per transaction, and hands the freed pages back.
//! - **Never**: `PRAGMA user_version` and `application_id` (the app's), the app's tables,
//!   the app's connections, the process's working directory. A relative path is resolved
//!   once at [`OutboxBuilder::open`], so the outbox keeps to its file after the app changes
//!   directory; `:memory:` and the like are refused ([`Error::InvalidPath`]).
//!
//! A file made by release 0.1, which kept the outbox's schema version in `user_version`,
//! is taken over once (rows, settings and totals intact, `user_version` left as it was).
//! [`OutboxBuilder::on_connect`] runs the app's own setup first on every connection the
//! outbox opens: SQLCipher's `PRAGMA key`, a small `cache_size`. With the `bundled` feature
//! off, the app brings its own SQLite (the system's, or SQLCipher) through rusqlite's
//! features; `examples/sqlcipher_app` is such an app. The `outbox` command line works on
//! plain files only, not on encrypted ones.
//!
//! # Durability and threads
//!
//! Every commit that returned survives a crash of the process; with
//! [`Synchronous::Full`] it also survives a power loss. Either way no event is sent before
//! its commit is on disk, so a receiver never holds an event the device lost
//! ([`guide::durability`]). [`Outbox`] is `Send + Sync` and cheap to clone. A relay runs
//! named threads (`outbox-relay`, the only one that writes; `outbox-ckpt`; `outbox-account`;
//! delivery workers `outbox-w<destination's number>-<n>`), each joined by [`RelayHandle::shutdown`] or on drop
//! within a bounded time; an open outbox's pool keeps one (`outbox-pool`), ended with its
//! last clone; every blocking call has a timeout ([`guide::relay`]).
//!
//! # Features
//!
//! - `bundled` (default): SQLite compiled in. Turn it off to link the system's SQLite or
//!   SQLCipher through rusqlite's own features (Cargo unifies features: while it is on, no
//!   other SQLite can be chosen).
//! - `mqtt`: `Destination::mqtt`, delivery to MQTT brokers through rumqttc.
//! - `postgres`: `receive::PgInbox` and the tables `outbox ingest` stores in.
//! - `metrics`: counters, gauges and a latency histogram through the `metrics` facade.
//! - `opentelemetry`: `create` and `send` spans through the `opentelemetry` API crate.
//! - `wal-watch`: a relay wakes the moment another process commits (a file-change
//!   notification on the WAL) instead of at its next poll.
//!
//! The `outbox` command, with `outbox relay` and `outbox ingest` (the fleet's receiving end
//! in PostgreSQL), is the crate `outbox-cli` (`cargo install --path cli`).
//!
//! # The guide, and the API by role
//!
//! | page | what it covers |
//! |---|---|
//! | [`guide::promises`] | what is promised, and when a receiver sees a duplicate |
//! | [`guide::enqueueing`] | `enqueue`, `enqueue_many`, savepoints, bad input |
//! | [`guide::sql_contract`] | enqueueing from any language with one `INSERT` |
//! | [`guide::relay`] | every answer and failure, wrong clocks, threads |
//! | [`guide::destinations`] | several destinations, MQTT brokers, what goes on the wire |
//! | [`guide::offline`] | bounded storage, priorities, expiry, rate limits |
//! | [`guide::metered_links`] | an idle relay that sleeps, gzip, linger |
//! | [`guide::durability`] | crashes and power loss |
//! | [`guide::receiving`] | verifying and applying events once; `outbox ingest` |
//! | [`guide::tracing`] | W3C trace context and OpenTelemetry spans |
//! | [`guide::operating`] | outcomes back to the app, replay, bundles, metrics, migrations |
//! | [`guide::platforms`] | Windows, macOS, iOS, Android, 32-bit gateways, proxies, where the file goes |
//! | [`guide::async_apps`] | tokio and sqlx |
//!
//! An app that sends needs the crate root ([`Outbox`], [`Event`], [`Destination`],
//! [`RelayConfig`] and their companions, and the [`rusqlite`] it was built with: use it for the app's own connections, so both share one SQLite); a receiver
//! [`receive`]; an app that wants outcomes back [`notices`]; an operator [`admin`]; a
//! receiver written without this crate [`wire`]; another protocol or a fake receiver
//! [`transport`]; a test of backoff and leases [`clock`]. Builders never fail in a setter;
//! [`OutboxBuilder::open`] and [`Relay::start`] check everything and name what is wrong.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

// The library by layer, each using only those above it in this list (and the foundation):
// `python3 scripts/modgraph.py src` checks it.
//
// - the foundation, at the root: `error`, `boot_time` (the time since boot, sleep included,
//   under `clock`), `clock`, `outbound` (a claimed event, the one value
//   the store, the wire and the transport share), `state` (where a delivery stands),
//   `platform` (what differs between the systems the crate runs on);
// - `wire/`: formats and signatures;
// - `event`: the app's event and its checks;
// - `observe/`: metrics, spans, delivery notices;
// - `store/`: the file, its rows and settings;
// - `transport/`: the seam to the network;
// - `outbox`: the app's handle;
// - `relay/`, `ops/`, `receive/`: the relay's threads, what operators run on the file, the
//   receiving side; none uses another;
// - `internal` (for the benches) and the `guide` (docs only).
mod boot_time;
pub mod clock;
mod error;
mod event;
pub mod guide;
#[doc(hidden)]
pub mod internal;
mod observe;
mod ops;
mod outbound;
mod outbox;
mod platform;
pub mod receive;
mod relay;
mod state;
mod store;
pub mod transport;
pub mod wire;

pub use error::{Error, Result};
pub use event::{Enqueued, Event};
pub use observe::notices;
pub use ops::redeliver::Redelivery;
pub use ops::{admin, bundle};
pub use outbox::{Outbox, OutboxBuilder};
pub use relay::budget::Budget;
pub use relay::config::RelayConfig;
pub use relay::destination::Destination;
pub use relay::drain::{DrainEnd, DrainReport};
pub use relay::stats::{RelayStats, ShutdownReport};
pub use relay::{Relay, RelayHandle};
pub use store::budget_spend::BudgetStatus;
pub use store::database::Synchronous;
pub use store::limits::StoragePolicy;
pub use store::settings;
pub use wire::content_encoding::Compression;

/// The rusqlite this crate was built with: use it for your own transactions.
pub use rusqlite;

/// Compiles the README's examples as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
