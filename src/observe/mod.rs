//! What the outbox lets the app and its operators see as it works: metrics through the
//! `metrics` facade, OpenTelemetry spans, and delivery notices to subscribers.
//!
//! The layer: it uses the foundation (`error`, `outbound`, `state`), the app's `event` and
//! the wire's trace context; never the file, the network or the relay, which report to it.

pub mod notices;
pub(crate) mod spans;
pub(crate) mod telemetry;
