//! Enqueueing from any language: the SQL contract an app in another language writes through.
//!
//! An app in another language enqueues with one statement in its own transaction on the same
//! file, and `outbox relay` runs beside it (docs/SQL-CONTRACT.md shows the same order in
//! Python, Node and Go, and cli/README.md a systemd unit and a launchd plist for the relay):
//!
//! ```sql
//! INSERT INTO outbox_enqueue (type, data, key, idempotency_key, subject, source,
//!                             coalesce_key, priority, expires_in_ms,
//!                             traceparent, tracestate, dataschema) VALUES (...);
//! ```
//!
//! Every column but `type` may be left out; `data` is JSON text (`null` when left out). The
//! triggers behind the view (schema version 9, in `schema.sql`) give the event exactly what
//! [`Outbox::enqueue`](crate::Outbox::enqueue) gives it: a UUIDv7 id whose time never goes back in commit order,
//! routing, parking behind its key, coalescing, idempotency (a repeat is no error and adds
//! nothing), the storage limits, the type's default priority and lifetime, and a row id above
//! every id ever given. Its due time, lifetime and the leases making way compares with
//! follow the real clock, even after rows were written while the clock was ahead (the id's
//! time alone is carried forward); a lifetime of `i64::MAX` ("never") is clamped, not
//! overflowed (schema version 12). Bad input fails the statement with `RAISE(ABORT, 'outbox: …')`,
//! naming the field and its limit; the caller's transaction stays usable. The new event's id
//! is read back by its idempotency key:
//! `SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1`. It
//! needs SQLite 3.40 or later and no extension; the contract is stable from schema 9 on.
//! Schema 13 added the columns `traceparent`, `tracestate` and `dataschema` (see
//! [Tracing](crate::guide::tracing)), checked as `Event`'s are: an `INSERT` that names its columns, as
//! above, is unchanged; one that lists values without naming columns must name them now.
//!
//! Routes, storage limits and policies, the default source, priorities, lifetimes and the
//! payload limit are [settings kept in the file](crate::settings): the builder writes what it was
//! given at [`OutboxBuilder::open`](crate::OutboxBuilder::open), `outbox config set KEY VALUE` (or
//! [`Outbox::set_setting`](crate::Outbox::set_setting)) changes one with checks, and every writer follows them, a running
//! [`Outbox`](crate::Outbox) within a quarter second of a change.
