//! One claimed event on its way: what the queue's claim returns, the wire format encodes and
//! a transport sends. Its own module, below all three, so none of them imports another for
//! it; the public path is `transport::OutboundEvent`.

/// One claimed event on its way to a destination.
///
/// The relay hands these to a [`Transport`](crate::transport::Transport); the lease fields tell which claim it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboundEvent {
    /// Row id: the commit order.
    pub id: i64,
    /// The stable event id (UUIDv7) receivers de-duplicate on.
    pub event_id: String,
    /// The destination's name.
    pub destination: String,
    /// The event type.
    pub event_type: String,
    /// The event source (the outbox default when the event set none).
    pub source: String,
    /// The subject, if set.
    pub subject: Option<String>,
    /// The partition key, if set.
    pub partition_key: Option<String>,
    /// The idempotency key, if set.
    pub idempotency_key: Option<String>,
    /// The event data as JSON text.
    pub payload: String,
    /// Commit time in unix milliseconds.
    pub created_at: i64,
    /// Attempts the receiver has already answered (not counting this one).
    pub attempts: i64,
    /// The claim this delivery belongs to.
    pub lease_owner: String,
    /// When the claim expires, in unix milliseconds.
    pub lease_expires_at: i64,
    /// The event's deadline (unix ms), if it has one: it is never sent after it.
    pub expires_at: Option<i64>,
    /// The W3C `traceparent` of the work that wrote the event, if it was given one.
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it.
    pub tracestate: Option<String>,
    /// The CloudEvents `dataschema` URI, if set.
    pub dataschema: Option<String>,
}
