//! A transactional outbox on SQLite for edge, desktop and IoT apps.
//!
//! Your app writes its business change **and** the event that announces it in one SQLite
//! transaction on its own database file. Both commit or neither does: there is no dual write
//! to get wrong. A relay of plain threads (no async runtime) then delivers each committed
//! event at least once, with exponential backoff, crash-safe leases, per-key ordering and
//! patience for networks that are gone for days. Every event carries a stable UUIDv7 id so
//! the receiver can drop duplicates.
//!
//! # Quick start
//!
//! ```
//! use std::time::{Duration, Instant};
//! use sqlite_outbox::transport::{Attempt, OutboundEvent};
//! use sqlite_outbox::{Event, Outbox, RelayConfig};
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
//! let accept_all = |_: &[OutboundEvent]| Attempt::Answered {
//!     status: 204,
//!     retry_after: None,
//!     detail: String::new(),
//! };
//! let relay = outbox.relay(RelayConfig::transport(accept_all)).start()?;
//! let deadline = Instant::now() + Duration::from_secs(10);
//! while relay.stats().delivered < 1 && Instant::now() < deadline {
//!     std::thread::sleep(Duration::from_millis(10));
//! }
//! assert_eq!(relay.shutdown().abandoned, 0);
//! # Ok(()) }
//! ```
//!
//! `cargo run --release --example quickstart` runs the same end to end against a real
//! receiver on 127.0.0.1 that verifies every signature, and takes it down for a second
//! half-way.
//!
//! # The API by role
//!
//! | who | where |
//! |---|---|
//! | an app that sends | the crate root: [`Outbox`], [`OutboxBuilder`], [`Event`], [`Enqueued`], [`RelayConfig`], [`Destination`], [`Relay`], [`RelayHandle`], [`RelayStats`], [`ShutdownReport`], [`Synchronous`], [`StoragePolicy`], [`Redelivery`], [`Error`], [`Result`] (15 names), and the [`rusqlite`] it was built with |
//! | a receiver | [`receive`]: verify signatures, parse CloudEvents, apply each event once with an inbox |
//! | an app that wants outcomes back | [`notices`]: what [`Outbox::subscribe`] sends, and [`Outbox::status`]'s answer |
//! | an operator | [`admin`]: stats, listings, dead letters, retry, prune, health (methods on [`Outbox`]) |
//! | a receiver written without this crate, a test | [`wire`]: the exact bodies and headers on the wire |
//! | another protocol, a fake receiver | [`transport`]: the [`Transport`](transport::Transport) seam and the HTTP transport |
//! | a test of backoff and leases | [`clock`]: a clock that moves only when told |
//!
//! Builders follow one rule: setters never fail and document their default;
//! [`OutboxBuilder::open`] and [`Relay::start`] check everything and return
//! [`Error::InvalidConfig`] naming the setting that is wrong.
//!
//! # Enqueueing in your own transaction
//!
//! [`Outbox::enqueue`] takes any `rusqlite::Transaction` on the same file, so an app that
//! manages its own connection keeps doing so. Call [`Outbox::notify`] after your commit to
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
//! Bad input never breaks your transaction. An oversized payload
//! ([`Error::PayloadTooLarge`], default limit 256 KiB), an empty or over-long type
//! ([`Error::InvalidEventType`], 255 bytes), an over-long key, subject or source
//! ([`Error::FieldTooLong`]) are found before anything is written: the transaction stays
//! usable and commits the rest.
//!
//! A transaction that writes many events (a burst of sensor readings, the lines of an
//! order) hands them over in one call: [`Outbox::enqueue_many`] stores the same rows, ids,
//! key order and answers as one `enqueue` per event, with one `INSERT` per hundred events.
//! A hundred keyed events a transaction went 1.3–1.6× as fast as through `enqueue`
//! (docs/PERFORMANCE.md).
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
//!
//! # Enqueueing from any language: the SQL contract
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
//! [`Outbox::enqueue`] gives it: a UUIDv7 id whose time never goes back in commit order,
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
//! [Tracing](#tracing)), checked as `Event`'s are: an `INSERT` that names its columns, as
//! above, is unchanged; one that lists values without naming columns must name them now.
//!
//! Routes, storage limits and policies, the default source, priorities, lifetimes and the
//! payload limit are [settings kept in the file](settings): the builder writes what it was
//! given at [`OutboxBuilder::open`], `outbox config set KEY VALUE` (or
//! [`Outbox::set_setting`]) changes one with checks, and every writer follows them, a running
//! [`Outbox`] within a quarter second of a change.
//!
//! # What it promises
//!
//! 1. A committed event is delivered at least once, whatever happens after the commit: the
//!    process is killed, the receiver answers 500 or 429, the network is gone for a week.
//! 2. An event whose transaction rolled back is never delivered, including a transaction a
//!    power loss rolled back: an event is sent only once its commit is on disk.
//! 3. Events that share a partition key arrive in commit order: only the oldest undelivered
//!    event of a key can be claimed. A dead-lettered event stops blocking its key, so one
//!    poison event parks only itself. An event that replaces another by coalescing takes
//!    its own place in the order (the newest), not the replaced event's.
//! 4. An event leaves the pending set only by being delivered, dead-lettered with its last
//!    error kept, replaced by a newer event with the same coalescing key, or dropped by a
//!    storage limit when its type is one the user marked `DropOldest`; the last two are
//!    counted in [`admin::Stats`] and never touch an event a relay is delivering.
//! 5. Duplicates happen only when a relay's lease expires while its delivery was in flight
//!    (it crashed, was paused, or shut down with a request still hanging), or when a power
//!    loss undid the ack of a delivered event. Receivers de-duplicate on the event id.
//!
//! # How the relay behaves
//!
//! | situation | what happens |
//! |---|---|
//! | 2xx | delivered; many acks are written in one transaction |
//! | 5xx, 408, 429 | retried with exponential backoff and full jitter (1 s base, 5 min cap), or at `Retry-After` (seconds or HTTP date, capped at 1 h) if later; dead-lettered after 25 answered attempts |
//! | 429 | also pauses that destination (only) for its `Retry-After`, or the retry base without one |
//! | a rate or bandwidth limit with a backlog far larger than a lease's worth | the destination claims only what its limits let out within a quarter of the lease; the backlog goes out at the rate, each event once, none handed back unsent for ever |
//! | 410 | the destination is disabled (persisted; its events stay pending, attempts untouched) until [`Outbox::enable_destination`] |
//! | 400, 413 or 422 to a batch | the batch is split in halves and sent again at once, halves of halves as long as they are refused, spending no attempt on a split: only an event refused alone is dead-lettered, with the receiver's reason; the rest are delivered |
//! | other 4xx | dead-lettered at once with status and body start kept ([`RelayConfig::dead_letter_client_errors`]`(false)` retries them instead) |
//! | DNS failure, connection refused, connect timeout, TLS handshake failure (the request never left) | the **destination** backs off as a whole (250 ms doubling to 30 s, jittered), then one probe event is sent; no event spends an attempt, so a device offline for a week dead-letters nothing; the first answer lifts the backoff and the backlog drains at full speed. A released probe moves behind the other due events, so the next probe is another event |
//! | 502, 503 or 504 (or 503/429 with `Retry-After`) to three requests in a row for three different events: the receiver's own backend is down (its store restarting, a load balancer with no healthy upstream) | the answers that made the judgement spent an attempt each; from then on the **destination** is treated as unreachable: no event spends an attempt (requests still in flight included), the destination backs off as a whole for at least the `Retry-After`, single probes, and the first other answer lifts it and the backlog drains at full speed. An hour's outage dead-letters nothing. One event answered so while others succeed (a poison event) never makes three in a row and spends its attempts |
//! | the request was written but no valid answer came (read timeout, reset or close mid-response, malformed answer) | that **event** spends an attempt and backs off on its own, like a 5xx; the destination stays open, so a poison event that hangs or crashes the receiver is dead-lettered at `max_attempts` while every other event keeps flowing |
//! | the event cannot be encoded (stored data not JSON) | dead-lettered at once |
//! | a claimed row cannot be read at all (a BLOB payload, a REAL time, text that is not UTF-8, written by another program) | that row alone is dead-lettered with `last_error` "unreadable row: …"; the rest of its batch is delivered; the operator still sees it in `list` and `show` |
//! | the transport panics | the attempt counts as a failure and is retried with backoff; the worker lives on |
//! | an ack cannot be written (an app transaction holds the write lock past the busy timeout, a full disk) | the outcomes are kept and written again every 100 ms while their leases hold, so a delivered event is not sent again |
//! | the writer thread panics (a bug) | caught and logged; the writer starts again after a pause doubling up to 30 s; counted in [`RelayStats::writer_restarts`] and [`ShutdownReport::writer_restarts`] |
//! | a setting is out of range (a lease of centuries, a zero poll interval or backoff, a header with a newline, a malformed secret) | [`Relay::start`] refuses it with [`Error::InvalidConfig`] naming the setting; nothing is ever dead-lettered for it |
//! | the power fails | nothing was sent before its commit reached the disk; after the reboot, events whose ack was lost are sent again (duplicates), the rest wait as before; see [Durability](#durability) |
//! | a relay crashes | its leases (60 s) expire and any relay, in this or another process, claims the events again; every start adds a random id to its lease owners, so two relays given one name never share an owner |
//! | a stale relay comes back | every write-back is fenced by the claim's lease owner: an outcome for a lease that was taken over is discarded ([`RelayStats::lease_lost`]) |
//! | `shutdown()` or drop | stops claiming, hands back claimed events no worker started, waits up to `shutdown_timeout` (10 s) for in-flight requests, joins every thread that ended; returns even if the receiver hangs |
//!
//! Each row is decided by one pure function (`src/relay/decide.rs`), with a unit test per
//! row. One writer thread owns every SQLite write of the relay (claims and acks); delivery
//! workers (4 by default, per destination) only do HTTP, so a slow receiver never holds the
//! write lock. The claim is one `UPDATE … RETURNING` over a partial index, so its cost does
//! not grow with delivered history (a test pins the query plan), and events queued behind an
//! earlier event of their partition key are *parked* until it leaves, so a keyed backlog
//! costs the claim nothing either (`src/queue/mod.rs` draws the row's state machine). Acks are
//! gathered (up to 200 per transaction, waiting at most 1 ms for more) and written a hundred
//! rows a statement, each row still fenced by its lease, claims wait until a
//! whole batch fits, and a thread of the relay's own checkpoints the WAL in the background
//! on its own connection (PASSIVE, which takes no lock a writer needs, so neither claims nor
//! the app's commits wait for the copy; and past 16 MiB a RESTART, or a TRUNCATE once the
//! file passed 64 MiB, that never busy-waits: while another process holds a read
//! transaction, a backup or a report query, the reset is skipped and retried after a growing
//! pause, so the app's commits never wait behind it), so the app's own commits do not pay for
//! checkpoints. A writer waiting for
//! SQLite's lock polls in 25 µs steps at first instead of SQLite's default 1 ms sleep.
//!
//! # Clocks
//!
//! Devices without a real-time clock boot in 1970 or wherever their last shutdown left them,
//! and NTP, a user or a phone app sets them later. The wall clock is therefore used only as
//! data (commit times, due times, lease ends, signatures); every wait runs on `Instant`.
//!
//! - **Skew against the receiver.** Standard Webhooks receivers refuse a signature whose
//!   timestamp is more than 5 minutes from their own clock. The HTTP transport estimates the
//!   offset from every answer's `Date` header (the median of the last 5 samples) and, once it
//!   reaches 30 s, signs with the corrected time; the correction is logged once and shown in
//!   [`RelayStats::clock_offset_ms`]. A 4xx answered to a request signed 30 s or more away
//!   from the receiver's clock is not a verdict on the event: it is retried with the
//!   corrected time (spending an attempt), never dead-lettered with the backlog after it.
//! - **Jumps.** A destination's offline backoff and 429 pause run on `Instant`, so a jump
//!   neither stretches nor cuts them. A lease taken more than 5 s later than now was taken
//!   while the clock was ahead: it counts as expired. A due time written while
//!   the clock was ahead (its commit or last attempt lies in the future) is re-anchored on
//!   now, keeping the wait it was given; the relay does this when it starts and whenever it
//!   sees the wall clock move more than 2 s away from `Instant` between two polls.
//!
//! `tests/clocks.rs` covers these with an injected clock; `cli/tests/clocks_cli.rs` runs the
//! `outbox relay` CLI under `faketime` 10 minutes behind, 10 minutes ahead and a day ahead.
//!
//! # Several destinations
//!
//! ```no_run
//! use sqlite_outbox::{Destination, Outbox, RelayConfig};
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! let outbox = Outbox::builder()
//!     .route("order.*", "billing")       // prefix
//!     .route("user.signup", "crm")       // exact
//!     .route("*", "audit")               // everything
//!     .open("app.db")?;
//! let relay = outbox
//!     .relay(
//!         RelayConfig::new()
//!             .destination(
//!                 Destination::http("billing", "https://billing.example.com/hooks")
//!                     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
//!             )
//!             .destination(Destination::http("crm", "https://crm.example.com/in"))
//!             .destination(
//!                 Destination::http("audit", "https://audit.example.com/bulk").batch(100, 1 << 20),
//!             ),
//!     )
//!     .start()?;
//! # drop(relay);
//! # Ok(()) }
//! ```
//!
//! Each (event, destination) pair is its own row with its own attempts and backoff, and each
//! destination has its own workers and in-flight limit: one that is down or slow never holds
//! back another, and a retry to one never re-sends to the others. With routes configured,
//! an event that matches none is refused with [`Error::NoRoute`] rather than kept where
//! nobody delivers it.
//!
//! # MQTT brokers
//!
//! With the `mqtt` feature (on in the CLI build), a destination can be an MQTT broker:
//!
//! ```no_run
//! # #[cfg(feature = "mqtt")] {
//! use sqlite_outbox::transport::MqttConfig;
//! use sqlite_outbox::{Destination, RelayConfig};
//! let config = RelayConfig::new().destination(
//!     Destination::mqtt("broker", "mqtt://127.0.0.1:1883").mqtt_config(
//!         MqttConfig::new()
//!             .topic("devices/{source}/{type}")
//!             .client_id("device-0042")
//!             .credentials("device-0042", "secret from a file"),
//!     ),
//! );
//! # let _ = config; }
//! ```
//!
//! - Each event is one PUBLISH at QoS 1; the event is delivered when the broker's PUBACK for
//!   *that* publish arrives, and only then. The payload follows the CloudEvents MQTT binding:
//!   by default its structured mode, the same JSON envelope an HTTP receiver gets (under
//!   MQTT 5 with the content type property `application/cloudevents+json; charset=utf-8`);
//!   with [`MqttConfig::binary_mode`](transport::MqttConfig::binary_mode) (MQTT 5 only) the
//!   binary mode: the event's data as the payload, content type `application/json`, and every
//!   other attribute (`id`, `source`, `type`, `subject`, `time`, `partitionkey`, `sequence`) a
//!   user property of that name.
//! - MQTT 3.1.1 by default; [`MqttConfig::version`](transport::MqttConfig::version)
//!   `(MqttVersion::V5)` for MQTT 5, where a PUBACK carries a reason code: 0x87 (not
//!   authorized), 0x90 (topic name invalid) and 0x99 (payload format invalid) dead-letter the
//!   event with the reason; other codes of 0x80 or more (quota exceeded, unspecified error)
//!   are a failed attempt, retried after a backoff. The broker's receive maximum bounds the
//!   in-flight window, and the maximum packet size in its CONNACK is a limit like
//!   `max_packet_bytes`. With MQTT 3.1.1 a broker that drops a message by ACL or size still
//!   sends a plain PUBACK (Mosquitto does): prefer MQTT 5 where the broker has it.
//! - The topic comes from a template with `{type}`, `{key}`, `{source}`, `{subject}` and
//!   `{destination}`, `outbox/{type}` by default; a template with a wildcard, an empty level
//!   or an unknown placeholder is refused by [`Relay::start`], and an event missing a value
//!   its topic needs is dead-lettered with that reason, unless the placeholder opts in to an
//!   empty level with `?` (`outbox/{type}/{subject?}`). Values lose their outer `/`.
//! - TLS: an `mqtts://` URL (port 8883 by default) checks the broker's certificate against
//!   Mozilla's roots (built in) or [`MqttConfig::ca_pem`](transport::MqttConfig::ca_pem);
//!   [`client_identity_pem`](transport::MqttConfig::client_identity_pem) adds a client
//!   certificate for mutual TLS. Certificates and keys are checked at start; a broker whose
//!   certificate does not check out, or that refuses the client's, is offline like an
//!   unreachable one.
//! - The outbox, not the broker, keeps what is not acknowledged: the session is clean, and a
//!   broker that cannot be reached, refuses the connection (wrong credentials) or drops it
//!   is the same destination-wide offline backoff as for HTTP: no attempt spent, every
//!   unacknowledged publish pending again and published again after the reconnect.
//! - Per-key order holds as for HTTP (one event of a key in flight). Each delivery worker
//!   publishes one event, or with [`Destination::batch`]`(n, …)` `n` back to back, and the
//!   connection keeps at most `workers × n` publishes unacknowledged (the in-flight window,
//!   narrowed further by the broker's receive maximum). A worker does not wait for
//!   PUBACKs: it hands the connection up to sixteen requests, which wait in the client, in
//!   order, until a PUBACK makes room, so the window never idles while a worker wakes up;
//!   the connection thread that takes a request's last PUBACK reports its outcome to the
//!   relay, and a publish unanswered within the ack timeout counts as a failed attempt.
//!   Each event keeps its own outcome (an oversize one is dead-lettered alone). Mosquitto sends its
//!   PUBACKs with Nagle's algorithm on unless `set_tcp_nodelay true` is in its config; a
//!   publisher that awaits a batch's PUBACKs then stalls on TCP's delayed ACK (about 40 ms
//!   per batch, measured), so set it.
//! - An event whose PUBLISH would exceed [`MqttConfig::max_packet_bytes`](transport::MqttConfig::max_packet_bytes) (256 KiB by
//!   default) or the broker's announced maximum is dead-lettered with its size.
//!
//! For AWS IoT Core: `mqtts://<prefix>-ats.iot.<region>.amazonaws.com:8883`, the CA
//! `AmazonRootCA1.pem`, the thing's certificate and key, a client id the policy allows (the
//! thing name), MQTT 5 or 3.1.1, a payload under 128 KB, and at most 100 messages in flight
//! (`workers × batch`). On port 443 add `.alpn("x-amzn-mqtt-ca")`. For EMQX or HiveMQ: user
//! name and password, or a client certificate, and MQTT 5 so that an ACL refusal is seen.
//!
//! `cli/tests/mqtt.rs`, `cli/tests/mqtt5.rs` and `cli/tests/mqtt_tls.rs` run each of these against a
//! real Mosquitto broker started by the test (the TLS ones with certificates made at test
//! time). A structured message as a subscriber receives it, on topic
//! `devices/sqlite-outbox/reading.taken`:
//!
//! ```text
//! {"data":{"i":0},"datacontenttype":"application/json",
//!  "id":"01a22d25-ad71-74ae-a341-a4bb8d30e424","partitionkey":"k0",
//!  "sequence":"00000000000000000001","source":"/sqlite-outbox","specversion":"1.0",
//!  "time":"2026-11-30T15:49:33.681Z","type":"reading.taken"}
//! ```
//!
//! The same kind of event in binary mode under MQTT 5 (topic template `binary/{key}`):
//!
//! ```text
//! topic          binary/room-1
//! content type   application/json
//! user props     specversion=1.0, id=01a22d6a-05bc-778c-95fc-eb756351b343,
//!                source=/sqlite-outbox, type=reading.taken, subject=sensor-7,
//!                time=2026-11-30T17:04:12.732Z, partitionkey=room-1,
//!                sequence=00000000000000000002
//! payload        {"celsius":21.5}
//! ```
//!
//! # What goes on the wire
//!
//! One CloudEvents 1.0 request per event (structured mode), or per batch when a destination
//! opts in (batched mode), signed per [Standard Webhooks](https://www.standardwebhooks.com/):
//!
//! ```text
//! POST /events HTTP/1.1
//! content-type: application/cloudevents+json
//! idempotency-key: "01a22a8a-741d-7166-b7d9-db961a986ef3"
//! user-agent: sqlite-outbox/0.1.0
//! webhook-id: 01a22a8a-741d-7166-b7d9-db961a986ef3
//! webhook-signature: v1,h++f0qd4XlLeL4Ao60IgJYfJVYeiACjARsoLKb2HOBA=
//! webhook-timestamp: 1796010046
//!
//! {"specversion":"1.0","id":"01a22a8a-741d-7166-b7d9-db961a986ef3","source":"/shop/eu-1","type":"order.created","subject":"orders/42","time":"2026-11-30T03:40:46.493Z","datacontenttype":"application/json","partitionkey":"customer-7","sequence":"00000000000000000001","data":{"order_id":42,"total_cents":1999}}
//! ```
//!
//! - `id` is the event id; `partitionkey` and `sequence` (commit order, zero-padded so it
//!   sorts as a string) appear on events with a partition key. `sequence` strictly
//!   increases for the life of the file, whatever is pruned, purged or replaced; `source` is
//!   fixed when the event is enqueued, so every relay sends one id under one source.
//! - `webhook-timestamp` is the time of *this* attempt: a retry days later is signed afresh.
//!   `webhook-signature` carries one `v1,` entry per secret, so secrets rotate without a
//!   gap, and a `v1a,` entry (Ed25519, Standard Webhooks' asymmetric scheme) when the
//!   destination has a device key ([`Destination::signing_key`]). Secrets and private keys
//!   never appear in logs, `Debug` output or errors.
//! - `outbox-source` names the events' `source` (percent-encoded where it is not visible
//!   ASCII): a request never mixes sources, so a receiver picks the keys that may sign for
//!   that source before it reads the body.
//! - A batch (`application/cloudevents-batch+json`, a JSON array of at most N events and M
//!   bytes) is delivered or retried as a whole. Its `webhook-id` (`batch_…`) is derived from
//!   the events it holds: the same batch sent again carries the same id, but a batch formed
//!   anew (after a lease expired, say) may group the events differently and gets another
//!   one. Receivers de-duplicate batched events by each event's own `id`.
//! - Events written with trace context carry the CloudEvents Distributed Tracing attributes
//!   `traceparent` and `tracestate`, and `dataschema` when set; the request then has a W3C
//!   `traceparent` header of the same trace (see [Tracing](#tracing)).
//! - Binary content mode ([`HttpConfig::binary_mode`](transport::HttpConfig::binary_mode)):
//!   the data is the body and every attribute a `ce-` header (`ce-id`, `ce-traceparent`, …,
//!   percent-encoded as the HTTP binding asks), one event per request. The signature covers
//!   the body only, so `outbox ingest` takes structured and batched mode.
//! - The official CloudEvents Rust SDK parses every request the relay sends (a test checks
//!   it). [`wire`] builds the same bodies for other code.
//!
//! # Tracing
//!
//! An event carries the W3C trace context of the work that wrote it, so one trace shows the
//! request that placed an order, the event it wrote, how long the event waited in the
//! outbox, each delivery attempt and the receiver's work. The context is captured **when
//! the event is written**, in the app's transaction, never when a relay drains it (a relay
//! runs later, on another thread, often in another process).
//!
//! - **Capture**: [`Event::traceparent`] and [`Event::tracestate`]; `outbox enqueue
//!   --traceparent TP [--tracestate TS]` and the keys `traceparent` and `tracestate` on a
//!   `--jsonl` line; the columns `traceparent` and `tracestate` of `INSERT INTO
//!   outbox_enqueue`. Each is checked as W3C Trace Context (version `00`, lowercase hex, ids
//!   not all zeros; `tracestate` at most 32 `key=value` members, each key once, 512 bytes,
//!   and only with a `traceparent`): a malformed value is [`Error::InvalidEvent`] naming the
//!   field (CLI: exit 2; SQL: `outbox: traceparent must be …`, the caller's transaction
//!   kept), and nothing is stored.
//! - **On every hop, unchanged**: the CloudEvent's `traceparent` and `tracestate` attributes
//!   (structured, batched, MQTT 3.1.1 envelopes), `ce-traceparent`/`ce-tracestate` headers in
//!   HTTP binary mode, and MQTT 5 user properties `traceparent`/`tracestate` in binary mode.
//!   The HTTP request also carries a `traceparent` header (and `tracestate`) of the same
//!   trace: for one event, its trace with the attempt's `send` span as parent when spans are
//!   recorded, else the event's own context; for a batch, the trace of its first event with
//!   trace context. An event without trace context sends none: no trace is invented.
//! - **Spans** (feature `opentelemetry`, the `opentelemetry` API crate; the app installs its
//!   own SDK and exporter): enqueueing inside an active span, with no `traceparent` given,
//!   records a `create {destination}` span (kind PRODUCER) in the app's trace and gives the
//!   event that span's context. The relay records a `send {destination}` span (PRODUCER) for
//!   every delivery attempt, a child of the first event's creation context and linked to
//!   each event's, with `messaging.system` (`sqlite-outbox`), `messaging.operation.name`
//!   (`send`), `messaging.destination.name`, `messaging.message.id` (one event) or
//!   `messaging.batch.message_count`, `messaging.message.body.size`, `sqlite_outbox.wait_ms`
//!   (how long the oldest event waited in the outbox) and, on failure, `error.type` (the
//!   HTTP status, `unreachable`, `no_answer`, `unsendable`). Without a tracer provider the
//!   API records nothing.
//! - **The receiving side**: [`receive::CloudEvent::traceparent`] (a checked
//!   [`receive::TraceParent`]: trace id, parent id, sampled) and
//!   [`receive::CloudEvent::tracestate`] continue the trace; `outbox ingest` stores both,
//!   and `dataschema`, in columns of `outbox_ingested`; `examples/receiver.rs` logs each
//!   event with its `trace_id`.
//!
//! ```
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! use sqlite_outbox::{Event, Outbox};
//! let outbox = Outbox::open(dir.path().join("app.db"))?;
//! // The context of the request being handled (from its `traceparent` header, or your
//! // tracer); with the `opentelemetry` feature the active span's is taken by itself.
//! let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
//! outbox.transaction(|tx| {
//!     tx.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)", [])?;
//!     tx.execute("INSERT INTO orders (id) VALUES (42)", [])?;
//!     outbox.enqueue(
//!         tx,
//!         Event::new("order.created", serde_json::json!({"order": 42}))
//!             .traceparent(traceparent)
//!             .tracestate("shop=eu-1")
//!             .dataschema("https://example.com/schemas/order.created/v2.json"),
//!     )
//! })?;
//! // A receiver continues the trace from the event it got:
//! let body = br#"{"specversion":"1.0","id":"1","source":"/shop","type":"order.created",
//!     "traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
//! let events = sqlite_outbox::receive::parse_request(
//!     Some("application/cloudevents+json"), body).unwrap();
//! let tp = events[0].traceparent().expect("trace context");
//! assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! # Ok(()) }
//! ```
//!
//! `Event::dataschema` (CloudEvents `dataschema`: an absolute URI, visible ASCII, at most
//! 1024 bytes; `--dataschema`, the `dataschema` column of the SQL contract) names the schema
//! the data follows, for receivers that evolve an event's versions side by side.
//!
//! # The receiving side
//!
//! [`receive`] verifies a request, parses its CloudEvents and records each event id in an
//! inbox table inside the receiver's own transaction, so every event takes effect once. Its
//! module docs show a complete handler; `examples/receiver.rs` is a complete receiver
//! (`cargo run --example receiver -- --db received.db --secret whsec_…`). With the
//! `postgres` feature, [`receive::PgInbox`] does the same in a PostgreSQL transaction, with
//! its own versioned migrations ([`receive::pg_migrate`]).
//!
//! # The fleet's receiving end: `outbox ingest` into PostgreSQL
//!
//! ```text
//! devices ──▶ load balancer ──▶ outbox ingest × N ──▶ PostgreSQL ──▶ your consumers
//!  (each: app + outbox file        (stateless,           (outbox_ingested)   (SQL, replicas,
//!   + outbox relay)                 any number)                               Debezium → Kafka)
//! ```
//!
//! `outbox ingest --listen 0.0.0.0:8080 --postgres-file pg-url --keys fleet-keys`
//! (library: `outbox_cli::ingest::IngestServer`, in the crate `outbox-cli`) verifies each
//! request's signature against the keys of the device it names, parses its CloudEvents,
//! and stores them in **one** PostgreSQL transaction in `outbox_ingested` (`source, id,
//! type, subject, partitionkey, sequence bigint, time timestamptz, data jsonb,
//! received_at`; primary key `(source, id)`), answering 204 only after the commit. It
//! creates or migrates its tables at start, before `/healthz` can answer 200.
//!
//! **One identity per device.** Each device signs with its own Ed25519 key (Standard
//! Webhooks `v1a`); the ingest holds only public keys, in a key registry that says which
//! sources each key may sign for. A device taken off its pole signs for itself and nobody
//! else, and a leaked registry signs for nobody.
//!
//! 1. *Provision.* On the device: `outbox keygen --out /etc/outbox/device.key` writes the
//!    private key (`whsk_…`, mode 0600) and prints its public key (`whpk_…`); the relay
//!    signs with `outbox relay --signing-key /etc/outbox/device.key …` (library:
//!    [`Destination::signing_key`]). At the ingest, one line in the `--keys` file,
//!    `KEY_ID SOURCE_PATTERN KEY` (`pump-42 /devices/pump-42 whpk_…`; a pattern is a source
//!    or a prefix ending in `*`; `#` starts a comment), then `kill -HUP` the ingest (the
//!    file is re-read, no connection dropped; a file with a malformed line changes nothing
//!    and is logged). Or, with `--keys-table`, one row: `INSERT INTO outbox_device_keys
//!    (key_id, source_pattern, key) VALUES ('pump-42', '/devices/pump-42', 'whpk_…')`,
//!    taken within a second by every ingest process.
//! 2. *Rotate.* Add the new key beside the old one (two lines or rows for one source: both
//!    verify), move the device to its new key, then remove the old line or row.
//! 3. *Revoke.* Remove the line and send SIGHUP, or `UPDATE outbox_device_keys SET
//!    revoked_at = now() WHERE key_id = 'pump-42'` (a future `revoked_at` takes effect
//!    then, within 30 s).
//!
//! `--secret` (a shared `whsec_` secret that signs for **any** source) stays for a
//! single-tenant fleet, and for relays older than the `outbox-source` header: without the
//! header, only such secrets can verify a request. Each check that needs no body comes
//! before it is read: a source no key is for, or no `outbox-source` and no `--secret`: 401;
//! missing webhook headers or a timestamp outside ±5 minutes: 401; then the source's rate
//! and the in-flight budget (below). After the body: a signature by none of the source's
//! keys: 401; an event whose `source` differs from the header's: 403, nothing of the
//! request stored. Refusals are counted by reason (`GET /metrics`, and `refusals` in
//! `outbox_sources` for known sources) and logged at most once a minute per source, never
//! with a key.
//!
//! **TLS on both sides.** Devices reach the ingest over HTTPS through your load balancer
//! (the relay verifies the server with Mozilla's roots). The ingest reaches PostgreSQL with
//! libpq's parameters in its URL: `sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`
//! checks the certificate and host name, `require` encrypts and never falls back to
//! plaintext, `prefer` (the default) encrypts when the server offers it;
//! [`receive::pg_connect`] does the same for [`receive::PgInbox`] users.
//!
//! **The fleet at a glance.** `outbox_sources` holds a row per source stored: `first_seen`,
//! `last_seen`, `events_stored`, `newest_event_time` and `refusals`; `SELECT source,
//! last_seen FROM outbox_sources WHERE last_seen < now() - interval '1 day'` lists the
//! devices gone silent. `--metrics-listen 127.0.0.1:9090` serves `GET /metrics`
//! (Prometheus text: requests by status, refusals by reason, events stored, request
//! latency, bytes in flight, database queue depth) on its own address, not with the events.
//!
//! - **Exactly once.** A device sends an event until it gets a 2xx; a 2xx comes only after
//!   the commit; the commit skips every `(source, id)` already stored (`ON CONFLICT DO
//!   NOTHING`, which also waits out a concurrent transaction storing the same pair). So a
//!   retry after a lost answer, a killed process or a replay stores nothing new, whichever
//!   process it reaches: each committed event is stored once. `cli/tests/ingest_fleet.rs` kills
//!   ingest processes with SIGKILL under four devices and counts: 0 lost, 0 stored twice.
//! - **Order.** A device sends a key's events one at a time in commit order, each after the
//!   previous one's 2xx, so within `(source, partitionkey)` rows commit in `sequence` order
//!   even when they go through different processes. Read a key's events with
//!   `SELECT * FROM outbox_key_events($source, $key)` (ordered by `sequence`); never order
//!   by `received_at`, each process's own clock.
//! - **Answers.** Bad or missing signature, stale timestamp: 401 with the reason (missing
//!   webhook headers and a timestamp outside the tolerance are refused before a byte of
//!   the body is read, with [`receive::Verifier::verify_headers`]); not
//!   CloudEvents, or a `sequence` that is not a decimal integer: 400; an event PostgreSQL
//!   cannot hold (a NUL character, `\u0000`, in its data or a text attribute): 422 with a
//!   JSON body naming each such event and why (`{"refused": [{"id", "reason"}]}`), nothing
//!   of the request stored, and the device's relay splits the batch so that only that event
//!   is dead-lettered, with the reason; over `--max-body`
//!   (1 MiB): 413; PostgreSQL unreachable or failing: 503 with `Retry-After: 5`; every
//!   database thread busy: 503 with `Retry-After: 1`. A device's relay backs off on 503s
//!   and keeps its events meanwhile. `/healthz` answers from a state a background probe
//!   of PostgreSQL refreshes every second, never through the database queue (a flood of
//!   health checks takes nothing from the devices' posts), and a store that fails makes it
//!   503 at once until a probe succeeds again. It answers `GET` and `HEAD` only; any other
//!   method there is 405 with `Allow: GET, HEAD` (a relay given that path by mistake
//!   dead-letters its events with the reason, to retry at the right one, instead of having
//!   them counted delivered and never stored).
//! - **Limits.** `--threads` database threads (and connections), `--max-connections` open
//!   connections (past it, new ones wait to be accepted), `--read-timeout` for a request's
//!   head and for its body (a slow or idle client is cut off at it: slowloris cannot hold
//!   anything), `--write-timeout` (10 s) for each write of an answer (a client that
//!   pipelines requests and reads none of the answers loses its connection then, so it
//!   cannot hold a slot of `--max-connections`), `--max-requests-per-connection` (1,000:
//!   the answer to the last says `connection: close` and the connection ends),
//!   `--max-inflight-bytes` (64 MiB: body bytes being read across all connections; a
//!   request whose declared length does not fit gets 503 with `Retry-After: 1` before its
//!   body is read), `--max-rate-per-source` (off by default: verified requests a second per
//!   source; past it 429 with `Retry-After`, and requests forged in a device's name spend
//!   none of its rate), `--events-path` (`/events`; any other path but `/healthz` is 404).
//!   The docs of `outbox_cli::ingest` list what happens at each.
//! - **Into Kafka.** The table is an ordinary one: Debezium's PostgreSQL connector
//!   (`plugin.name=pgoutput`, `table.include.list=public.outbox_ingested`) streams each
//!   committed row as a change event; key the topic by `source,partitionkey` so a key stays
//!   in one partition, in commit order. Prune old rows with a `DELETE … WHERE received_at <
//!   …` in pages, or partition the table by `received_at`.
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
//!         .coalesce_key("gps"))?;
//!     Ok(())
//! })?;
//! # Ok(()) }
//! ```
//!
//! At a limit, the oldest pending events of `DropOldest` types are removed to make room for
//! any new event, counted in [`admin::Stats::dropped`] and logged. Events of other types
//! (`Reject`, the default) are never dropped: if nothing droppable can make room, `enqueue`
//! returns [`Error::OutboxFull`] and the caller's transaction stays usable. Pending totals are
//! kept exact by triggers (whoever writes the file), so checking a limit costs one row read.
//! `cargo run --release --example iot_sensor` shows it end to end.
//!
//! # Priorities after a reconnect
//!
//! A device back after a week has a backlog; the alarm raised an hour ago should not wait
//! behind six days of telemetry. Each event has a priority from 0 (least urgent) to 9 (most
//! urgent), 5 by default: [`Event::priority`], or per type on the builder
//! ([`OutboxBuilder::priority_for`]`("alarm.*", 9)`, first matching pattern wins), or
//! `outbox enqueue --priority N` (a `"priority"` member per `--jsonl` line, the flag being
//! the default). Among due events a relay claims the most urgent first, then the longest
//! due, then in commit order; events that share a partition key still go in commit order
//! whatever their priorities, since only a key's oldest pending event is ever due (a later,
//! more urgent event of the key waits for it). A priority over 9 is refused with
//! [`Error::InvalidPriority`] (CLI: exit 2) and writes nothing.
//!
//! The claim reads one short range of the pending index per priority level that has due
//! rows, most urgent first, and stops once it has its batch, so its cost stays that of the
//! due rows (`claim_plan_uses_partial_indexes_without_table_scan` pins the plan). Measured
//! against the claim before priorities, alternating runs of `cargo run --release --example
//! bench -- claim`: a claim of 100 at 1.04–1.08×, claim + ack at 0.94–0.97× the rate.
//!
//! # Expiry of stale events
//!
//! Telemetry is often worthless an hour later. [`Event::expires_in`]`(lifetime)`, per type
//! [`OutboxBuilder::expiry_for`]`("telemetry.*", one_hour)`, or `outbox enqueue
//! --expires-in 1h` (an `"expires_in": "1h"` member per `--jsonl` line) give an event a
//! deadline. Not delivered by it, the event leaves the pending set as **expired**, a state
//! of its own (not dead): counted in [`admin::Stats::expired`] and the
//! `outbox_expired_total` metric, listed by `outbox list --state expired`, announced to
//! subscribers ([`notices::DeliveryOutcome::Expired`]), and its key's next event goes. It is never
//! sent past its deadline: a claim does not take it, and a worker that finds a claimed event
//! past its deadline hands it back unsent. A delivery already in flight is never expired
//! under it (the sweep skips leased rows), so the receiver's answer decides. The relay's
//! sweep runs every 100 ms and walks an index of the rows that have a deadline. A zero or
//! negative lifetime is refused ([`Error::InvalidExpiry`]; CLI: exit 2).
//!
//! # Rate and bandwidth limits
//!
//! A metered uplink, or a receiver with a rate limit, wants an even pace rather than a week's
//! backlog at once. [`Destination::rate_limit`]`(requests_per_second)` and
//! [`Destination::bandwidth_limit`]`(bytes_per_second)` (CLI: `relay --rate N --bandwidth
//! BYTES`) pace a destination's requests with a token bucket each, shared by its workers:
//! after a quiet spell one second's worth goes at once, then the pace holds. Bandwidth counts
//! request bodies; a request larger than a second's worth still goes, and the ones after it
//! wait its excess off. A batch is one request, and so is one MQTT publish. A 429's
//! `Retry-After` still closes the destination for as long as it asks. Waiting uses the
//! monotonic clock and gives way to shutdown and to an offline destination (the events are
//! handed back, nothing spent). A paced destination claims only what its limits let out
//! within a quarter of the lease, so a backlog of any size goes out at its rate, no claimed
//! event outwaits its lease and none is sent twice. Zero, negative or non-finite limits are
//! refused at start (CLI: exit 2). `cli/tests/pacing.rs` checks the pace on the receiver's clock.
//!
//! # On batteries and metered links
//!
//! **An idle relay sleeps.** Nothing is looked at on a fixed beat: the writer sleeps until
//! the soonest thing it knows is due (a retry it scheduled, a row written with a delay or
//! another relay's retry falling due, the end of a lease a crashed relay left, the earliest
//! event deadline, the next retention run, a destination's backoff or `Retry-After`
//! ending), the checkpointer sleeps until the writer reports a write, delivery workers
//! block on their queue, and `outbox relay`'s main thread waits for its signal. The bench
//! example's `-- frugal` rows (`cargo run --release --all-features --example bench --
//! frugal`): an idle relay (receiver up, nothing pending) woke its threads 0.30 times a
//! second in all over 60 s (voluntary context switches from `/proc/self/task/*/status`;
//! median of six 10 s windows) and used 3.2 ms of CPU a minute, where honker's update
//! watcher, measured beside it, woke 915 times a second and used 1.2 s a minute. Before
//! this, an idle `outbox relay` woke 30 times a second. `tests/idle_relay.rs` holds a relay
//! to at most one wake-up a second, `tests/due_later.rs` sends a row due later at its time
//! with a minute's poll. After a claim, the writer reads when the next row falls due once
//! the claim's requests are answered (100 ms after at the latest), so the read never takes
//! CPU from the request it follows.
//!
//! **Commits from other processes wake it at once** with the `wal-watch` feature (on in
//! `outbox relay`): a file-change notification on the WAL (inotify on Linux, through the
//! `notify` crate) wakes the writer, which reads `PRAGMA data_version` then and a few
//! 1 ms steps later (the commit is published in the `-shm` wal-index a moment after its
//! frames are written, and no notification reports that). The watch is on the file's
//! directory, so a WAL deleted and made again (every connection closed, a restore) is still
//! watched. The `data_version` poll stays as a fallback, every 5 s instead of every
//! [`poll_interval`](RelayConfig::poll_interval) (100 ms). Without the feature, or on a file
//! system without notifications (network mounts, some FUSE layers), the relay polls at the
//! poll interval as before: an app whose every commit goes through this crate's
//! [`Outbox`] (which wakes the relay itself) can set a poll interval of seconds instead.
//! While requests are out the watch is paused (the relay's own claims and acks would
//! notify it on every commit: 5–7% of a batched drain's rate) and the relay polls at the
//! poll interval; it watches again 10 ms after the last answer. Bench rows: with a second
//! process writing through the SQL contract at 20 commits a second, commit → receipt was
//! 1.1 ms p50 and 2.3 ms p99 (the crate's own enqueue at the same pace: 0.8 and 1.6 ms).
//!
//! **Fewer bytes.** [`Destination::compress`]`(`[`Compression::Gzip`]`)` (CLI: `relay
//! --compress gzip`) sends request bodies of 1 KiB or more gzip-compressed, with
//! `Content-Encoding: gzip`; smaller ones go as they are. The Standard Webhooks signature is
//! over the **uncompressed** body, what the receiver's handler parses after decoding, so a
//! receiver decodes first ([`receive::decode_body`]) and verifies that. `outbox ingest` and
//! `examples/receiver.rs` accept gzip: their body limit (`--max-body`) applies to the
//! decoded size too, and decoding stops one byte past it or past 100 times the body's size on
//! the wire, whichever is less, with 413 (a zip bomb costs that much and no more); another
//! encoding is 415 before the body is read. Off by default: a receiver that does not decode
//! would see bytes it cannot parse. Bench rows: batches of 100 telemetry events took 34 bytes
//! an event on the wire against 320 (11%), and drained at 0.99× the uncompressed rate.
//!
//! **Fewer radio wake-ups.** [`Destination::linger`]`(d)` (CLI: `relay --linger 2s`, with
//! `--batch`): while fewer events are due than fill a batch, the relay holds what it claimed
//! for up to `d` for more to arrive, as Kafka producers' `linger.ms` does, so a trickle of
//! ten events a second goes out as one request every `d` instead of ten a second; each event
//! waits at most `d`. Events of priority [`Event::URGENT_PRIORITY`] (8) or above go at once,
//! taking what waits with them; shutdown sends what waits. The held events are leased, so
//! `d` may be at most a quarter of the lease (checked at start). Bench rows: 1,000 events at
//! ten a second with batches of 100 went in 50 requests with a linger of 2 s against 1,000
//! without, each waiting 1.0 s more at the median (2.0 s at most), and the relay spent
//! a third less CPU per event (940 µs against 1,392 µs; 25 µs in a full drain).
//!
//! # Outcomes back to the app
//!
//! [`Outbox::subscribe`] returns a crossbeam `Receiver` of [`notices::DeliveryNotice`]s (event id,
//! destination, delivered or dead with the error, when) from the relays started from this
//! outbox, so an app can mark a record "synced" or show a failure. The channel is bounded
//! ([`notices::NOTICE_CAPACITY`]) and a relay never waits for it: a subscriber that falls behind
//! loses notices, counted in [`Outbox::lost_notices`]. [`Outbox::status`]`(event_id)` answers
//! from the file at any time, so a lost notice costs a query. `cargo run --example
//! desktop_sync` is a notes app that marks each note synced when its event is delivered.
//!
//! # Replay to a destination
//!
//! [`Outbox::redeliver`]`(&`[`Redelivery`]`::to("warehouse").types("order.*")
//! .delivered_since(t))` (CLI: `outbox redeliver --destination D [--type PATTERN] [--since
//! TIME] [--until TIME]`, TIME an RFC 3339 time or a duration meaning that long ago) queues
//! delivered events again for a destination, to fill one added later or one that lost data.
//! Each keeps its original id, data and time (receivers de-duplicate), goes once even if it
//! was delivered to several destinations, and is skipped if already pending there; they go
//! in commit order, a key's events parked behind each other. Only what retention kept can be
//! replayed (`prune` deletes delivered rows). The count is returned (printed).
//!
//! # The offline bundle: a site with no uplink
//!
//! Some sites never get a network: events leave on a USB stick. `outbox export --out FILE
//! --secret whsec_… [--destination D] [--limit N]` ([`Outbox::export`]) writes the oldest
//! pending events, in commit order, to one JSON Lines file: one structured CloudEvent per
//! line (exactly the body a relay would send), then a manifest (count, first and last
//! `sequence`, SHA-256 of the event lines), then a Standard Webhooks signature of the
//! manifest. The events are leased first, the file is synced and renamed into place, and
//! only then are they marked **exported** (a state of its own: `list --state exported`,
//! [`admin::State::Exported`]; their keys' next events go). A crash before that leaves them
//! pending, so they are exported again and receivers drop the repeats by id; a write that
//! fails (a full disk) hands them back unchanged. `outbox import FILE --secret whsec_… --url
//! URL` ([`bundle::import`]) needs no outbox database: it verifies the whole file first (a
//! tampered or truncated file or another secret is refused before anything is sent, exit 2),
//! then posts the events in order, each signed with the same secret, retrying with backoff;
//! it exits 1 if it had to give up on any. A bundle's last lines:
//!
//! ```text
//! {"bundle":"sqlite-outbox/1","count":20,"destination":"default","first_sequence":"00000000000000000001","last_sequence":"00000000000000000020","sha256":"a0861956…","created":"2026-11-30T18:14:46.555Z"}
//! {"webhook-id":"bundle_a0861956a8f5c92e4c719dbc36b88a97","webhook-timestamp":"1796062486","webhook-signature":"v1,EyEkqXPx…"}
//! ```
//!
//! Expired and exported rows are finished like delivered ones: `prune` and the relay's
//! retention delete them after the same age.
//!
//! # Operating
//!
//! The `outbox` binary (feature `cli`, on by default) works on any database file the crate
//! created, while the app runs or not; its commands, flags, outputs and exit codes are a
//! contract for scripts (`outbox --help`). The same from code: the methods listed in
//! [`admin`]. A running relay prunes delivered events older than its retention (7 days by
//! default) by itself, a page of 500 rows per transaction.
//!
//! With the `metrics` feature the crate reports through the `metrics` facade (plug in any
//! exporter). Labels are bounded: event type and destination, never ids.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `outbox_enqueued_total`, `outbox_delivered_total`, `outbox_retried_total`, `outbox_dead_total` | counter | `type`, `destination` |
//! | `outbox_dropped_total` | counter | |
//! | `outbox_coalesced_total` | counter | `type` |
//! | `outbox_pending`, `outbox_oldest_pending_age_seconds`, `outbox_database_bytes` | gauge | |
//! | `outbox_delivery_latency_seconds` (commit to delivery) | histogram | `type`, `destination` |
//!
//! Every log line about an event (through `log`) names its event id.
//!
//! # Durability
//!
//! [`OutboxBuilder::synchronous`] sets [`Synchronous::Normal`] (the default) or
//! [`Synchronous::Full`] on every pooled connection, with `journal_mode=WAL`,
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
//!
//! # Schema and migrations
//!
//! `schema.sql` is the one source of the schema; each `-- version N` section is one
//! migration, applied in order and recorded in the outbox's own table `outbox_schema`. The
//! outbox never writes `PRAGMA user_version`: it is the app's (rusqlite_migration keeps the
//! app's schema version there). A file made by 0.1, which kept the outbox's version in
//! `user_version`, is taken over once, every row and setting intact and `user_version` left
//! as found. Opening a file written by a newer version of the crate
//! fails with [`Error::SchemaTooNew`] and changes nothing; a file that is not SQLite gives
//! [`Error::NotADatabase`], also untouched. [`Outbox::open_existing`] also refuses a missing
//! file ([`Error::NotFound`]) and a database without an outbox ([`Error::NotAnOutbox`]).
//!
//! # About threads
//!
//! [`Outbox`] is `Send + Sync` and cheap to clone. A relay runs one writer thread
//! (`outbox-relay`, the only one that writes rows), one checkpointer (`outbox-checkpoint`,
//! which only copies the WAL back into the file, on a connection outside the pool) and, per
//! destination, a configurable number of delivery threads (`outbox-<destination>-<n>`) that
//! only do HTTP; all are joined by [`RelayHandle::shutdown`] or on drop, within a bounded
//! time (`tests/threads.rs`). An MQTT destination adds its connection thread
//! (`outbox-mqtt-<destination>`); an `outbox_cli::ingest::IngestServer` runs two I/O threads
//! (`outbox-ingest-io`) and its database threads (`outbox-ingest-db-<n>`), joined by its
//! `shutdown`. Every blocking call has a
//! timeout: HTTP (connect and whole request), SQLite (the busy timeout), joins (the shutdown
//! timeout).
//!
//! # Async apps: tokio and sqlx
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
//!     outbox.transaction(|tx| {
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
//! its event with the [SQL contract](#enqueueing-from-any-language-the-sql-contract) in its
//! own sqlx transaction (`INSERT INTO outbox_enqueue …`), and the crate's relay, opened on
//! the same file, delivers it; `examples/sqlx_app.rs` does so. Both examples run in the tests
//! (`tests/async_apps.rs`). sqlx links its own `libsqlite3-sys`: Cargo allows one in a build,
//! so sqlx must be a version whose range includes the one rusqlite here uses.
//!
//! # Features
//!
//! None is on by default: the default build delivers over HTTP(S) and nothing more (no async
//! runtime, no PostgreSQL or MQTT client, no argument parser, no terminal UI). The `outbox`
//! command is the crate `outbox-cli` of the same workspace (`cargo install --path cli`).
//!
//! - `mqtt`: [`Destination::mqtt`], delivery to MQTT brokers through rumqttc.
//! - `postgres`: [`receive::PgInbox`] and the tables of the receiving end in PostgreSQL
//!   ([`receive::pg_migrate`]), which `outbox ingest` (the crate `outbox-cli`) stores in.
//! - `metrics`: counters, gauges and a latency histogram through the `metrics` facade.
//! - `opentelemetry`: `create` and `send` spans through the `opentelemetry` API crate
//!   (see [Tracing](#tracing)); trace context on events and requests needs no feature.
//! - `wal-watch`: a relay wakes the moment another process commits to the file, through a
//!   file-change notification on the WAL (the `notify` crate), and polls only every 5 s as a
//!   fallback (see [On batteries and metered links](#on-batteries-and-metered-links)).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admin;
mod backoff;
pub mod bundle;
pub mod clock;
mod cloudevents;
mod configure;
mod content_encoding;
mod database;
mod destination;
mod disabled;
mod error;
mod event;
mod inbox;
#[doc(hidden)]
pub mod internal;
mod key_text;
mod limits;
pub mod notices;
mod oldest;
mod outbound;
mod outbox;
#[cfg(feature = "postgres")]
mod pg;
mod queue;
pub mod receive;
mod redeliver;
mod relay;
mod right_of_way;
pub mod settings;
mod signature;
mod signing_key;
mod source_header;
mod spans;
mod state;
mod subscribe;
mod telemetry;
mod trace_context;
pub mod transport;
mod type_pattern;
mod verify_error;
mod wake;
mod wal_watch;
pub mod wire;

pub use content_encoding::Compression;
pub use database::Synchronous;
pub use destination::Destination;
pub use error::{Error, Result};
pub use event::{Enqueued, Event};
pub use limits::StoragePolicy;
pub use outbox::{Outbox, OutboxBuilder};
pub use redeliver::Redelivery;
pub use relay::config::RelayConfig;
pub use relay::stats::{RelayStats, ShutdownReport};
pub use relay::{Relay, RelayHandle};

/// The rusqlite this crate was built with: use it for your own transactions.
pub use rusqlite;

/// Compiles the README's examples as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
