//! A transactional outbox on SQLite for edge, desktop and IoT apps.
//!
//! GUIDE_PLACEHOLDER

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admin;
mod backoff;
pub mod clock;
mod cloudevents;
mod database;
mod destination;
mod destination_state;
mod error;
mod event;
mod inbox;
#[doc(hidden)]
pub mod internal;
mod limits;
mod outbox;
mod queue;
pub mod receive;
mod relay;
mod signature;
mod telemetry;
pub mod transport;
pub mod wire;

pub use database::Synchronous;
pub use destination::Destination;
pub use error::{Error, Result};
pub use event::{Enqueued, Event};
pub use limits::StoragePolicy;
pub use outbox::{Outbox, OutboxBuilder};
pub use relay::config::RelayConfig;
pub use relay::stats::{RelayStats, ShutdownReport};
pub use relay::{Relay, RelayHandle};

/// The rusqlite this crate was built with: use it for your own transactions.
pub use rusqlite;

/// Compiles the README's examples as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
