//! The parts of the `outbox` command that are libraries of their own: [`ingest`], the fleet's
//! receiving end, an HTTP server that verifies, de-duplicates and stores device events in
//! PostgreSQL (`outbox ingest` is its command-line form).
//!
//! The outbox itself, the relay and the receiving side's verification are the crate
//! [`sqlite_outbox`]; this crate only adds what a device never needs: the argument parser, the
//! terminal UI, an async runtime and the PostgreSQL client of the ingest server.

#[cfg(feature = "ingest")]
pub mod fleet;
#[cfg(feature = "ingest")]
pub mod ingest;

/// The statement `outbox ingest` stores a request's events with: one `text[]` per column
/// (source, id, type, subject, partitionkey), then `int8[]` (sequence), `text[]` (time) and
/// `jsonb[]` (data). For the bench's bare INSERT loop.
#[cfg(feature = "ingest")]
#[doc(hidden)]
pub const INGEST_INSERT: &str = ingest::store::INSERT_EVENTS;
