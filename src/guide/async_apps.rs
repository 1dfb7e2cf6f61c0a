//! Async apps: tokio and sqlx.
//!
//! The crate has no async API and needs none: an enqueue is a short SQLite transaction, and
//! the relay runs on its own threads whatever runtime the app uses. From an async handler,
//! run the transaction on the runtime's blocking pool, so a commit that waits for the write
//! lock (the busy timeout, 5 s at most) never stalls a worker thread of the runtime:
//!
//! ```no_run
//! # async fn handler(outbox: sqlite_outbox::Outbox) -> Result<(), Box<dyn std::error::Error>> {
//! # let id = 42;
//! let event_id = tokio::task::spawn_blocking(move || {
//!     outbox.transaction(|tx| -> Result<String, sqlite_outbox::Error> {
//!         tx.execute("INSERT INTO orders (id) VALUES (?1)", [id])?;
//!         let event = sqlite_outbox::Event::new("order.placed", serde_json::json!({"id": id}));
//!         Ok(outbox.enqueue(tx, event)?.event_id().to_owned())
//!     })
//! })
//! .await??;
//! # let _ = event_id; Ok(()) }
//! ```
//!
//! Start the relay once at startup and shut it down on the app's shutdown signal, also from
//! `spawn_blocking` (it waits, bounded, for requests in flight). `examples/tokio_app.rs` is a
//! whole app: handlers placing orders concurrently, the relay beside the runtime, shutdown on
//! Ctrl-C or SIGTERM.
//!
//! An app whose database layer is sqlx cannot hand over a `rusqlite::Transaction`: it writes
//! its event with the [SQL contract](crate::guide::sql_contract) in its
//! own sqlx transaction (`INSERT INTO outbox_enqueue …`), and the crate's relay, opened on
//! the same file, delivers it; `examples/sqlx_app.rs` does so. Both examples run in the tests
//! (`tests/async_apps.rs`). sqlx links its own `libsqlite3-sys`: Cargo allows one in a build,
//! so sqlx must be a version whose range includes the one rusqlite here uses.
