//! Enqueueing in the app's own transaction: `enqueue`, `enqueue_many`, and what bad input does.
//!
//! [`Outbox::enqueue`](crate::Outbox::enqueue) takes any `rusqlite::Transaction` or
//! `rusqlite::Savepoint` on a connection to the same file, so an app that manages its own
//! connections keeps doing so; a connection with no transaction open is refused
//! ([`Error::NotInTransaction`](crate::Error::NotInTransaction)), since the event would
//! commit apart from the business change. Call [`Outbox::notify`](crate::Outbox::notify) after your commit to
//! wake the relay at once; otherwise it notices within its poll interval (`PRAGMA
//! data_version`, 100 ms by default). Use the re-exported [`rusqlite`] so both sides share
//! one SQLite build.
//!
//! ```
//! use sqlite_outbox::rusqlite::{Connection, TransactionBehavior};
//! use sqlite_outbox::{Enqueued, Event, Outbox};
//!
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! let outbox = Outbox::open(&path)?;
//! let mut conn = Connection::open(&path)?; // the app's own connection
//! conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")?;
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders (id, total) VALUES (42, 990)", [])?;
//! let event = Event::new("order.created", serde_json::json!({"id": 42, "total": 990}))
//!     .partition_key("customer-7")          // same key: delivered in commit order
//!     .idempotency_key("order-42-created")  // same key again: a duplicate, not a new event
//!     .subject("orders/42");
//! let first = outbox.enqueue(&tx, event.clone())?;
//! assert!(matches!(outbox.enqueue(&tx, event)?, Enqueued::Duplicate { .. }));
//! tx.commit()?;
//! outbox.notify();
//! # let _ = first;
//! # Ok(()) }
//! ```
//!
//! [`Enqueued`](crate::Enqueued) tells a new event from a duplicate, so the compiler asks
//! for it to be looked at (or bound to `_`). [`Outbox::transaction`](crate::Outbox::transaction)
//! runs the closure in an `IMMEDIATE` transaction on a pooled connection and returns the
//! closure's own error type, so the app can stop the transaction with its own error:
//!
//! ```
//! use sqlite_outbox::{Event, Outbox};
//!
//! #[derive(Debug)]
//! enum ShopError {
//!     OutOfStock,
//!     Outbox(sqlite_outbox::Error),
//! }
//! impl From<sqlite_outbox::Error> for ShopError {
//!     fn from(e: sqlite_outbox::Error) -> Self {
//!         ShopError::Outbox(e)
//!     }
//! }
//! impl From<sqlite_outbox::rusqlite::Error> for ShopError {
//!     fn from(e: sqlite_outbox::rusqlite::Error) -> Self {
//!         ShopError::Outbox(e.into())
//!     }
//! }
//!
//! # let dir = tempfile::tempdir().unwrap();
//! let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
//! let placed = outbox.transaction(|tx| {
//!     let stock: i64 = tx.query_row("SELECT 0", [], |r| r.get(0))?;
//!     if stock == 0 {
//!         return Err(ShopError::OutOfStock); // the transaction rolls back
//!     }
//!     let _ = outbox.enqueue(tx, Event::new("order.placed", serde_json::json!({})))?;
//!     Ok(())
//! });
//! assert!(matches!(placed, Err(ShopError::OutOfStock)));
//! ```
//!
//! Bad input never breaks your transaction. An oversized payload
//! ([`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge), default limit 256 KiB), an empty or over-long type
//! ([`Error::InvalidEventType`](crate::Error::InvalidEventType), 255 bytes), an over-long key, subject or source
//! ([`Error::FieldTooLong`](crate::Error::FieldTooLong)) are found before anything is written: the transaction stays
//! usable and commits the rest.
//!
//! A transaction that writes many events (a burst of sensor readings, the lines of an
//! order) hands them over in one call: [`Outbox::enqueue_many`](crate::Outbox::enqueue_many) stores the same rows, ids,
//! key order and answers as one `enqueue` per event, with one `INSERT` per hundred events
//! (`cargo run --release --example bench -- enqueue` compares both; docs/PERFORMANCE.md).
//!
//! ```
//! use sqlite_outbox::{Event, Outbox};
//!
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! let outbox = Outbox::open(dir.path().join("app.db"))?;
//! let readings = (0..100).map(|n| {
//!     Event::new("sensor.reading", serde_json::json!({"n": n})).partition_key("sensor-1")
//! });
//! let answers = outbox.transaction(|tx| outbox.enqueue_many(tx, readings))?;
//! assert_eq!(answers.len(), 100);
//! # Ok(()) }
//! ```
