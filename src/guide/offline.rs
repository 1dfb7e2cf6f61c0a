//! Offline devices: bounded storage, priorities after a reconnect, expiry, and rate and bandwidth limits.
//!
//! # Offline devices and bounded storage
//!
//! A device offline for weeks must not fill its disk, and must not lose business events
//! either:
//!
//! ```
//! use sqlite_outbox::{Event, Outbox, StoragePolicy};
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! let outbox = Outbox::builder()
//!     .max_pending(100_000)                                   // deliveries waiting
//!     .max_pending_bytes(64 << 20)                            // bytes of their data
//!     .storage_policy("telemetry.*", StoragePolicy::DropOldest)
//!     .open(dir.path().join("device.db"))?;
//! outbox.transaction(|tx| {
//!     // The latest position replaces a pending one: a week offline uploads one value.
//!     outbox.enqueue(tx, Event::new("device.position", serde_json::json!({"lat": 48.1, "lon": 11.6}))
//!         .coalesce_key("gps"))
//! })?;
//! # Ok(()) }
//! ```
//!
//! At a limit, the oldest pending events of `DropOldest` types are removed to make room for
//! any new event, counted in [`admin::Stats::dropped`](crate::admin::Stats::dropped) and logged. Events of other types
//! (`Reject`, the default) are never dropped: if nothing droppable can make room, `enqueue`
//! returns [`Error::OutboxFull`](crate::Error::OutboxFull) and the caller's transaction stays usable. Pending totals are
//! kept exact by triggers (whoever writes the file), so checking a limit costs one row read.
//! `cargo run --release --example iot_sensor` shows it end to end.
//!
//! # Priorities after a reconnect
//!
//! A device back after a week has a backlog; the alarm raised an hour ago should not wait
//! behind six days of telemetry. Each event has a priority from 0 (least urgent) to 9 (most
//! urgent), 5 by default: [`Event::priority`](crate::Event::priority), or per type on the builder
//! ([`OutboxBuilder::priority_for`](crate::OutboxBuilder::priority_for)`("alarm.*", 9)`, the most specific matching pattern wins: the exact type, then the longest prefix, then `*`), or
//! `outbox enqueue --priority N` (a `"priority"` member per `--jsonl` line, the flag being
//! the default). Among due events a relay claims the most urgent first, then the longest
//! due, then in commit order; events that share a partition key still go in commit order
//! whatever their priorities, since only a key's oldest pending event is ever due (a later,
//! more urgent event of the key waits for it). A priority over 9 is refused with
//! [`Error::InvalidPriority`](crate::Error::InvalidPriority) (CLI: exit 2) and writes nothing.
//!
//! The claim reads one short range of the pending index per priority level that has due
//! rows, most urgent first, and stops once it has its batch, so its cost stays that of the
//! due rows (`claim_plan_uses_partial_indexes_without_table_scan` pins the plan;
//! docs/PERFORMANCE.md has what priorities cost the claim).
//!
//! # Expiry of stale events
//!
//! Telemetry is often worthless an hour later. [`Event::expires_in`](crate::Event::expires_in)`(lifetime)`, per type
//! [`OutboxBuilder::expiry_for`](crate::OutboxBuilder::expiry_for)`("telemetry.*", one_hour)`, or `outbox enqueue
//! --expires-in 1h` (an `"expires_in": "1h"` member per `--jsonl` line) give an event a
//! deadline. Not delivered by it, the event leaves the pending set as **expired**, a state
//! of its own (not dead): counted in [`admin::Stats::expired`](crate::admin::Stats::expired) and the
//! `outbox_expired_total` metric, listed by `outbox list --state expired`, announced to
//! subscribers ([`notices::DeliveryOutcome::Expired`](crate::notices::DeliveryOutcome::Expired)), and its key's next event goes. It is never
//! sent past its deadline: a claim does not take it, and a worker that finds a claimed event
//! past its deadline hands it back unsent. A delivery already in flight is never expired
//! under it (the sweep skips leased rows), so the receiver's answer decides. The relay's
//! sweep runs every 100 ms and walks an index of the rows that have a deadline. A zero or
//! negative lifetime is refused ([`Error::InvalidExpiry`](crate::Error::InvalidExpiry); CLI: exit 2).
//!
//! # Rate and bandwidth limits
//!
//! A metered uplink, or a receiver with a rate limit, wants an even pace rather than a week's
//! backlog at once. [`Destination::rate_limit`](crate::Destination::rate_limit)`(requests_per_second)` and
//! [`Destination::bandwidth_limit`](crate::Destination::bandwidth_limit)`(bytes_per_second)` (CLI: `relay --rate N --bandwidth
//! BYTES`) pace a destination's requests with a token bucket each, shared by its workers:
//! after a quiet spell one second's worth (at least one request) goes at once, then the pace
//! holds, at any positive rate: three requests a minute is one every 20 s. Bandwidth counts
//! request bodies; a request larger than a second's worth still goes, and the ones after it
//! wait its excess off, then go (one at a time until their own size is known). A batch is one request, and so is one MQTT publish. A 429's
//! `Retry-After` still closes the destination for as long as it asks. Waiting uses the
//! monotonic clock and gives way to shutdown and to an offline destination (the events are
//! handed back, nothing spent). A paced destination claims only what its limits let out
//! within a quarter of the lease, so a backlog of any size goes out at its rate, no claimed
//! event outwaits its lease and none is sent twice; while the pace holds a lane back the
//! relay sleeps until it lets the next request out. Zero, negative or non-finite limits are
//! refused at start (CLI: exit 2). `cli/tests/pacing.rs` checks the pace on the receiver's clock.
