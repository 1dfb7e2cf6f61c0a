//! One claimed event on its way: what the queue's claim returns, the wire format encodes and
//! a transport sends. Its own module, below all three, so none of them imports another for
//! it; the public path is `transport::OutboundEvent`.

/// An event's priority when it was given none: `Event::DEFAULT_PRIORITY`, kept here too so
/// that this module, below `event`, does not import it.
pub(crate) const DEFAULT_PRIORITY: u8 = 5;

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
    /// The event's number in its stream (this destination and its source): gapless, from
    /// 1, fixed when its transaction committed and written as the relay claimed it (`None`
    /// for rows delivered before numbering began, and outside a relay). Sent as the
    /// `outboxseq` extension attribute.
    pub stream_seq: Option<i64>,
    /// Its priority, 0 (least urgent) to 9 ([`Event::priority`](crate::Event::priority)).
    pub priority: u8,
    /// When the claim ends by the claiming relay's monotonic clock (`None` outside a
    /// relay): the relay judges its own leases by this, since the wall clock steps.
    pub(crate) lease_ends: Option<std::time::Instant>,
}

impl OutboundEvent {
    /// An event as the relay would hand it to a transport: for unit tests of a custom
    /// [`Transport`](crate::transport::Transport), which otherwise only the relay's claim can
    /// make. A fresh UUIDv7 id, destination `default`, source `/sqlite-outbox`, committed
    /// now, never attempted, under a made-up lease; every field is public, so a test sets
    /// what it needs.
    ///
    /// ```
    /// use sqlite_outbox::transport::{Attempt, OutboundEvent, Transport};
    ///
    /// let sink = |events: &[OutboundEvent]| Attempt::Answered {
    ///     status: if events[0].attempts < 3 { 503 } else { 200 },
    ///     retry_after: None,
    ///     detail: String::new(),
    /// };
    /// let mut event = OutboundEvent::new("order.placed", &serde_json::json!({"id": 7}));
    /// event.attempts = 3;
    /// assert!(matches!(sink.send(&[event]), Attempt::Answered { status: 200, .. }));
    /// ```
    pub fn new(event_type: impl Into<String>, data: &serde_json::Value) -> OutboundEvent {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        OutboundEvent {
            id: 1,
            event_id: uuid::Uuid::now_v7().to_string(),
            destination: "default".into(),
            event_type: event_type.into(),
            source: "/sqlite-outbox".into(),
            subject: None,
            partition_key: None,
            idempotency_key: None,
            payload: data.to_string(),
            created_at: now,
            attempts: 0,
            lease_owner: "test".into(),
            lease_expires_at: now.saturating_add(60_000),
            expires_at: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
            stream_seq: None,
            priority: DEFAULT_PRIORITY,
            lease_ends: None,
        }
    }
}
