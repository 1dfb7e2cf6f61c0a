//! A transactional outbox on SQLite for edge, desktop and IoT apps.
//!
//! Write a business change and the event that announces it in **one** SQLite transaction;
//! a relay of plain threads delivers the event over HTTP at least once, with backoff,
//! leases that survive crashes, per-key ordering, and patience for networks that are gone
//! for days.
//!
//! ```
//! use std::time::Duration;
//! use sqlite_outbox::{Attempt, Event, Outbox, RelayConfig};
//!
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! let outbox = Outbox::open(dir.path().join("app.db"))?;
//!
//! // The business write and the event commit together, or not at all.
//! outbox.transaction(|tx| {
//!     tx.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)", [])?;
//!     tx.execute("INSERT INTO orders (id, total) VALUES (1, 990)", [])?;
//!     outbox.enqueue(tx, Event::new("order.created", serde_json::json!({"id": 1})))?;
//!     Ok(())
//! })?;
//!
//! // A relay delivers it. Here a transport that accepts everything stands in for
//! // `RelayConfig::http("https://example.com/hook")`.
//! let relay = outbox
//!     .relay(RelayConfig::transport(|_: &[sqlite_outbox::OutboundEvent]| Attempt::Answered {
//!         status: 204,
//!         retry_after: None,
//!         detail: String::new(),
//!     }))
//!     .start()?;
//! let deadline = std::time::Instant::now() + Duration::from_secs(10);
//! while relay.stats().delivered < 1 && std::time::Instant::now() < deadline {
//!     std::thread::sleep(Duration::from_millis(10));
//! }
//! assert_eq!(relay.shutdown().abandoned, 0);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `cli` (default): the `outbox` command-line tool.
//! - `metrics`: counters, gauges and a latency histogram through the `metrics` facade; see
//!   the table in the README's Operating section.
//!
//! # About threads
//!
//! [`Outbox`] is `Send + Sync` and cheap to clone. A relay runs one writer thread (the only
//! one that writes to SQLite) and a configurable number of delivery threads that only do
//! HTTP; all are named `outbox-…`, joined by [`RelayHandle::shutdown`] or on drop, within a
//! bounded time.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod admin;
mod backoff;
#[doc(hidden)]
pub mod bench_support;
mod claim;
mod clock;
mod cloudevents;
mod destination;
mod destination_state;
mod error;
mod event;
mod http;
mod inbox;
mod outbox;
mod reachability;
mod relay;
mod relay_config;
mod relay_housekeeping;
mod relay_writer;
mod signature;
mod storage;
mod store;
mod telemetry;
mod transport;
mod wire;

pub use admin::{
    DeadFilter, DestinationStats, EventRecord, Health, HealthThresholds, PruneReport, State, Stats,
    DEFAULT_RETENTION, PRUNE_PAGE_ROWS,
};
pub use backoff::{parse_retry_after, Backoff};
pub use claim::PARKED;
pub use clock::{Clock, ManualClock, SystemClock};
pub use cloudevents::{
    parse_batch, parse_request, parse_structured, CloudEvent, Data, ParseError,
    CLOUDEVENTS_BATCH_JSON,
};
pub use destination::{Batching, Destination, Route, MAX_DESTINATION_NAME_LEN};
pub use destination_state::DisabledDestination;
pub use error::{Error, Result};
pub use event::{Enqueued, Event, MAX_EVENT_TYPE_LEN, MAX_KEY_LEN, MAX_SOURCE_LEN};
pub use http::{HttpConfig, HttpTransport};
pub use inbox::{verify_request, Inbox, Receipt, ReceiveError};
pub use outbox::{Outbox, OutboxBuilder, DEFAULT_DESTINATION, DEFAULT_PAYLOAD_LIMIT};
pub use relay::{Relay, RelayHandle, RelayStats, ShutdownReport};
pub use relay_config::RelayConfig;
pub use signature::{signature_header, Secret, Verifier, VerifyError, SECRET_PREFIX};
pub use storage::{Limit, StoragePolicy};
pub use store::{migrate_connection as migrate, schema_version, Synchronous};
pub use transport::{Attempt, OutboundEvent, Transport};
pub use wire::{batch_body, batch_id, rfc3339_millis, structured_body, CLOUDEVENTS_JSON};

/// The rusqlite this crate was built with: use it for your own transactions.
pub use rusqlite;

/// Compiles the README's examples as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
