//! An event to enqueue, its limits, and what enqueueing it returned.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::wire::cloudevents::is_absolute_uri;
use crate::wire::trace_context::{check_tracestate, TraceParent};

/// An event to be written to the outbox inside the caller's transaction.
///
/// ```
/// use sqlite_outbox::Event;
/// let event = Event::new("order.created", serde_json::json!({"order": 42}))
///     .partition_key("customer-7")
///     .idempotency_key("order-42-created");
/// # let _ = event;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use = "an Event is written only by `Outbox::enqueue`"]
pub struct Event {
    pub(crate) event_type: String,
    pub(crate) data: serde_json::Value,
    pub(crate) partition_key: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) subject: Option<String>,
    pub(crate) source: Option<String>,
    pub(crate) coalesce_key: Option<String>,
    pub(crate) priority: Option<u8>,
    pub(crate) expires_in: Option<std::time::Duration>,
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<String>,
    pub(crate) dataschema: Option<String>,
}

impl Event {
    /// The most urgent priority; 0 is the least urgent.
    pub const MAX_PRIORITY: u8 = 9;
    /// The priority of an event that sets none and whose type has no default.
    pub const DEFAULT_PRIORITY: u8 = crate::outbound::DEFAULT_PRIORITY;
    /// The priority from which an event skips a destination's
    /// [`linger`](crate::Destination::linger) and goes at once.
    pub const URGENT_PRIORITY: u8 = 8;

    /// The longest event type accepted, in bytes.
    pub const MAX_TYPE_LEN: usize = 255;
    /// The longest partition key, idempotency key, coalescing key or subject accepted, in
    /// bytes.
    pub const MAX_KEY_LEN: usize = 255;
    /// The longest source accepted, in bytes.
    pub const MAX_SOURCE_LEN: usize = 1024;

    /// Creates an event of `event_type` carrying `data`.
    pub fn new(event_type: impl Into<String>, data: serde_json::Value) -> Self {
        Event {
            event_type: event_type.into(),
            data,
            partition_key: None,
            idempotency_key: None,
            subject: None,
            source: None,
            coalesce_key: None,
            priority: None,
            expires_in: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
        }
    }

    /// Creates an event whose data is any `Serialize` value.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidData`] if `data` cannot be represented as JSON (a map with non-string
    /// keys, a failing `Serialize` impl).
    pub fn from_serialize<T: Serialize + ?Sized>(
        event_type: impl Into<String>,
        data: &T,
    ) -> Result<Self> {
        let value = serde_json::to_value(data).map_err(Error::InvalidData)?;
        Ok(Event::new(event_type, value))
    }

    /// Sets the partition key: events that share one are delivered in commit order.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// Sets an idempotency key: enqueueing the same key twice yields the first event's id.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the subject (CloudEvents `subject`): what the event is about.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Sets a coalescing key: enqueueing replaces any still-pending (not yet claimed) event
    /// with the same type and key, so a device offline for a week uploads one current value
    /// (latest position, latest settings) instead of thousands. Replacements are counted in
    /// [`Stats::coalesced`](crate::admin::Stats::coalesced).
    pub fn coalesce_key(mut self, key: impl Into<String>) -> Self {
        self.coalesce_key = Some(key.into());
        self
    }

    /// Sets the priority, from 0 (least urgent) to 9 (most urgent); without one, the
    /// default of its type ([`OutboxBuilder::priority_for`](crate::OutboxBuilder::priority_for)),
    /// else 5. Among due events a relay sends the most urgent first (after a reconnect, say);
    /// events that share a partition key still go in commit order whatever their priorities.
    /// Over 9 is refused at enqueue ([`Error::InvalidPriority`]).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets a deadline: if the event is not delivered within `lifetime` of its commit, it
    /// leaves the pending set as *expired* (counted, listed, announced to subscribers) and
    /// is never sent after that, even before the relay has marked it. For telemetry that is
    /// worthless after an hour. Without one, the type's default
    /// ([`OutboxBuilder::expiry_for`](crate::OutboxBuilder::expiry_for)), else none. Zero is
    /// refused at enqueue ([`Error::InvalidExpiry`]).
    pub fn expires_in(mut self, lifetime: std::time::Duration) -> Self {
        self.expires_in = Some(lifetime);
        self
    }

    /// Sets the source (CloudEvents `source`), overriding the outbox's default source.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Sets the W3C `traceparent` of the work that wrote the event (`00-{trace id}-{span
    /// id}-{flags}`), which every receiver gets as the CloudEvents `traceparent` attribute
    /// and every request's `traceparent` header continues: the trace of the request that
    /// placed an order then shows the event it wrote, its wait in the outbox and its
    /// delivery. Version 00, lowercase hex, ids not all zeros; anything else is refused at
    /// enqueue ([`Error::InvalidEvent`]). With the `opentelemetry` feature an event without
    /// one takes the active span's context (see the guide's "Tracing").
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// Sets the W3C `tracestate` that goes with the [`traceparent`](Self::traceparent):
    /// vendor-specific `key=value` members, at most 32 and 512 bytes. Refused at enqueue
    /// without a `traceparent`, or when malformed ([`Error::InvalidEvent`]).
    pub fn tracestate(mut self, tracestate: impl Into<String>) -> Self {
        self.tracestate = Some(tracestate.into());
        self
    }

    /// Sets the CloudEvents `dataschema`: an absolute URI naming the schema the data
    /// follows (`https://example.com/schemas/order.created/v2.json`), for receivers that
    /// evolve an event's versions side by side. Visible ASCII, at most 1024 bytes; anything
    /// else is refused at enqueue ([`Error::InvalidEvent`]).
    pub fn dataschema(mut self, uri: impl Into<String>) -> Self {
        self.dataschema = Some(uri.into());
        self
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// Checks every limit and serializes the data, before anything touches the database.
    pub(crate) fn validate(&self, payload_limit: usize) -> Result<String> {
        if self.expires_in.is_some_and(|d| d.as_millis() == 0) {
            return Err(Error::InvalidExpiry {
                millis: self.expires_in.map_or(0, |d| d.as_millis() as i64),
            });
        }
        if let Some(priority) = self.priority {
            if priority > Self::MAX_PRIORITY {
                return Err(Error::InvalidPriority {
                    priority: i64::from(priority),
                });
            }
        }
        let type_len = self.event_type.len();
        if type_len == 0 || type_len > Self::MAX_TYPE_LEN {
            return Err(Error::InvalidEventType {
                len: type_len,
                limit: Self::MAX_TYPE_LEN,
            });
        }
        let fields = [
            ("partition key", &self.partition_key, Self::MAX_KEY_LEN),
            ("idempotency key", &self.idempotency_key, Self::MAX_KEY_LEN),
            ("subject", &self.subject, Self::MAX_KEY_LEN),
            ("source", &self.source, Self::MAX_SOURCE_LEN),
            ("coalescing key", &self.coalesce_key, Self::MAX_KEY_LEN),
        ];
        for (field, value, limit) in fields {
            if let Some(v) = value {
                if v.len() > limit {
                    return Err(Error::FieldTooLong {
                        field,
                        len: v.len(),
                        limit,
                    });
                }
            }
        }
        self.check_context()?;
        let payload = serde_json::to_string(&self.data).map_err(Error::InvalidData)?;
        if payload.len() > payload_limit {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit: payload_limit,
            });
        }
        Ok(payload)
    }
}

impl Event {
    /// The longest `dataschema` accepted, in bytes.
    pub const MAX_DATASCHEMA_LEN: usize = 1024;

    /// Checks the trace context and the data schema against their standards.
    fn check_context(&self) -> Result<()> {
        let invalid = |field: &'static str, reason: String| Error::InvalidEvent { field, reason };
        if let Some(tp) = &self.traceparent {
            TraceParent::parse(tp).map_err(|e| invalid("traceparent", e.to_string()))?;
        }
        if let Some(ts) = &self.tracestate {
            if self.traceparent.is_none() {
                return Err(invalid(
                    "tracestate",
                    "is set without a traceparent, which it belongs to".into(),
                ));
            }
            check_tracestate(ts).map_err(|e| invalid("tracestate", e.to_string()))?;
        }
        if let Some(uri) = &self.dataschema {
            if uri.len() > Self::MAX_DATASCHEMA_LEN {
                return Err(invalid(
                    "dataschema",
                    format!(
                        "is {} bytes long, over the limit of {} bytes",
                        uri.len(),
                        Self::MAX_DATASCHEMA_LEN
                    ),
                ));
            }
            if !is_absolute_uri(uri) || !uri.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "dataschema",
                    format!(
                        "{uri:?} is not an absolute URI (a scheme such as https: and no \
                         spaces or characters outside visible ASCII)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What [`Outbox::enqueue`](crate::Outbox::enqueue) did with an event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "`Enqueued::Duplicate` means no new event was written (its idempotency key was seen before): check it, or bind it to `_`"]
pub enum Enqueued {
    /// The event was written; it commits with the caller's transaction.
    New {
        /// The new event's id (UUIDv7).
        event_id: String,
    },
    /// An event with the same idempotency key already exists; nothing was written.
    Duplicate {
        /// The id of the event that holds the key.
        existing_event_id: String,
    },
}

impl Enqueued {
    /// The id receivers will see: the new event's, or the existing one's for a duplicate.
    pub fn event_id(&self) -> &str {
        match self {
            Enqueued::New { event_id } => event_id,
            Enqueued::Duplicate { existing_event_id } => existing_event_id,
        }
    }

    /// Whether the event was a duplicate of an earlier one.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Enqueued::Duplicate { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_type_is_rejected() {
        let err = Event::new("", json!(1)).validate(1024).unwrap_err();
        assert!(matches!(err, Error::InvalidEventType { len: 0, .. }));
    }

    #[test]
    fn long_type_is_rejected_with_limit() {
        let err = Event::new("t".repeat(256), json!(1))
            .validate(1024)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidEventType {
                len: 256,
                limit: 255
            }
        ));
    }

    #[test]
    fn payload_at_limit_passes_and_one_over_fails() {
        // `"aaa…"` serializes to its length plus two quotes.
        let at = Event::new("t", json!("a".repeat(98)));
        assert_eq!(at.validate(100).unwrap().len(), 100);
        let over = Event::new("t", json!("a".repeat(99)));
        assert!(matches!(
            over.validate(100),
            Err(Error::PayloadTooLarge {
                size: 101,
                limit: 100
            })
        ));
    }

    #[test]
    fn long_keys_are_rejected_by_name() {
        let err = Event::new("t", json!(1))
            .idempotency_key("k".repeat(300))
            .validate(1024)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::FieldTooLong {
                field: "idempotency key",
                len: 300,
                ..
            }
        ));
    }

    #[test]
    fn trace_context_and_dataschema_are_checked_by_field() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let ok = Event::new("t", json!(1))
            .traceparent(tp)
            .tracestate("rojo=1")
            .dataschema("https://example.com/s/v2.json");
        assert!(ok.validate(1024).is_ok());
        let field_of = |e: Event| match e.validate(1024) {
            Err(Error::InvalidEvent { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field_of(Event::new("t", json!(1)).traceparent("00-x")),
            "traceparent"
        );
        assert_eq!(
            field_of(Event::new("t", json!(1)).tracestate("a=1")),
            "tracestate"
        );
        assert_eq!(
            field_of(Event::new("t", json!(1)).traceparent(tp).tracestate("A=1")),
            "tracestate"
        );
        for bad in [
            "schema.json",
            "",
            "https://x/a b",
            "1http://x",
            "https://x/\u{e9}",
        ] {
            assert_eq!(
                field_of(Event::new("t", json!(1)).dataschema(bad)),
                "dataschema"
            );
        }
    }

    #[test]
    fn non_string_map_keys_are_invalid_data() {
        let mut map = std::collections::BTreeMap::new();
        map.insert(vec![1u8], 1);
        assert!(matches!(
            Event::from_serialize("t", &map),
            Err(Error::InvalidData(_))
        ));
    }
}
