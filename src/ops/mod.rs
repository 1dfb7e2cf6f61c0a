//! What operators and apps run on the file, with or without a relay: stats, listings, dead
//! letters, retry, prune and health (`admin`), replay (`redeliver`), offline bundles
//! (`bundle`), the settings kept in the file (`configure`) and where an event stands
//! (`subscribe`). Each is a set of methods on [`Outbox`](crate::Outbox).
//!
//! The layer: it uses the `outbox` handle, the store, the wire and the transport (a bundle's
//! import posts over HTTP); never the relay: nothing here needs one running.

pub mod admin;
pub mod bundle;
mod configure;
pub(crate) mod redeliver;
mod subscribe;
