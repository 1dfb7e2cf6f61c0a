//! Tracing: W3C trace context from the app's request to the receiver, and OpenTelemetry spans.
//!
//! An event carries the W3C trace context of the work that wrote it, so one trace shows the
//! request that placed an order, the event it wrote, how long the event waited in the
//! outbox, each delivery attempt and the receiver's work. The context is captured **when
//! the event is written**, in the app's transaction, never when a relay drains it (a relay
//! runs later, on another thread, often in another process).
//!
//! - **Capture**: [`Event::traceparent`](crate::Event::traceparent) and [`Event::tracestate`](crate::Event::tracestate); `outbox enqueue
//!   --traceparent TP [--tracestate TS]` and the keys `traceparent` and `tracestate` on a
//!   `--jsonl` line; the columns `traceparent` and `tracestate` of `INSERT INTO
//!   outbox_enqueue`. Each is checked as W3C Trace Context (version `00`, lowercase hex, ids
//!   not all zeros; `tracestate` at most 32 `key=value` members, each key once, 512 bytes,
//!   and only with a `traceparent`): a malformed value is [`Error::InvalidEvent`](crate::Error::InvalidEvent) naming the
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
//! - **The receiving side**: [`receive::CloudEvent::traceparent`](crate::receive::CloudEvent::traceparent) (a checked
//!   [`receive::TraceParent`](crate::receive::TraceParent): trace id, parent id, sampled) and
//!   [`receive::CloudEvent::tracestate`](crate::receive::CloudEvent::tracestate) continue the trace; `outbox ingest` stores both,
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
