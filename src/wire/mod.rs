//! What goes on the wire: CloudEvents 1.0 bodies, structured (one event) or batched, signed
//! per Standard Webhooks. For receivers written without this crate, and for tests.
//!
//! The layer: the formats and signatures themselves (the envelope here; CloudEvents, content
//! encoding, the `outbox-source` header, W3C trace context, `Retry-After`, Standard Webhooks
//! secrets, keys and signatures in their files). It uses the foundation (`error`,
//! `outbound`) and nothing else of the crate: it knows no storage, no relay, no network.

pub(crate) mod cloudevents;
pub(crate) mod content_encoding;
mod key_text;
pub(crate) mod receipt;
pub(crate) mod retry_after;
pub(crate) mod signature;
pub(crate) mod signing_key;
pub(crate) mod source_header;
pub(crate) mod stream_account;
pub(crate) mod trace_context;
pub(crate) mod verify_error;

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::outbound::OutboundEvent;
use crate::wire::source_header::percent_encode_header;

pub use crate::wire::cloudevents::{CLOUDEVENTS_BATCH_JSON, CLOUDEVENTS_JSON};
pub use crate::wire::receipt::{Receipt, MAX_RECEIPT_HEADER, RECEIPT_HEADER};
pub use crate::wire::retry_after::parse_retry_after;
pub use crate::wire::signature::signature_header;
pub use crate::wire::source_header::{decode_source_header, encode_source_header, SOURCE_HEADER};
pub use crate::wire::stream_account::{
    count_of, ranges_of, subtract, union, Fates, Ranges, StreamAccount, ACCOUNTING_HEADER,
    ACCOUNTING_TYPE, MAX_ACCOUNT_RANGES, MAX_STREAM_NUMBER,
};
pub use crate::wire::trace_context::{
    check_tracestate, TraceContextError, TraceParent, MAX_TRACESTATE_LEN, MAX_TRACESTATE_MEMBERS,
};

/// The CloudEvents extension attribute naming an event's stream on its device: the name of
/// the destination it was sent to (with its `source`, the stream's identity).
pub const STREAM_ATTRIBUTE: &str = "outboxstream";

/// The CloudEvents extension attribute holding an event's gapless number in its stream
/// (an integer from 1).
pub const STREAM_SEQ_ATTRIBUTE: &str = "outboxseq";

/// Bytes of a structured event besides its strings and data: member names, quotes, the
/// spec version, the content type and the time. Generous, so that
/// [`encoded_size_bound`] is a true upper bound.
const FIXED_OVERHEAD: usize = 256;

#[derive(Serialize)]
struct StructuredEvent<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    time: String,
    datacontenttype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dataschema: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitionkey: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outboxstream: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outboxseq: Option<i64>,
    data: &'a RawValue,
}

impl<'a> StructuredEvent<'a> {
    fn new(event: &'a OutboundEvent) -> Result<Self, serde_json::Error> {
        let data: &RawValue = serde_json::from_str(&event.payload)?;
        Ok(StructuredEvent {
            specversion: "1.0",
            id: &event.event_id,
            source: &event.source,
            event_type: &event.event_type,
            subject: event.subject.as_deref(),
            time: rfc3339_millis(event.created_at),
            datacontenttype: "application/json",
            dataschema: event.dataschema.as_deref(),
            partitionkey: event.partition_key.as_deref(),
            sequence: sequence(event),
            traceparent: event.traceparent.as_deref(),
            tracestate: event.tracestate.as_deref(),
            outboxstream: event.stream_seq.map(|_| event.destination.as_str()),
            outboxseq: event.stream_seq,
            data,
        })
    }
}

/// The `sequence` extension of a keyed event: the row id, which is the commit order,
/// zero-padded so that it also sorts as a string.
fn sequence(event: &OutboundEvent) -> Option<String> {
    event
        .partition_key
        .as_ref()
        .map(|_| format!("{:020}", event.id))
}

/// The attributes of `event` other than its data, each as its CloudEvents canonical string,
/// in the order of the structured form: for transports that carry them beside the data (MQTT 5
/// user properties in binary mode). `datacontenttype` is left out: it travels as the
/// transport's own content type.
pub fn attributes(event: &OutboundEvent) -> Vec<(&'static str, String)> {
    let mut attributes = vec![
        ("specversion", "1.0".to_string()),
        ("id", event.event_id.clone()),
        ("source", event.source.clone()),
        ("type", event.event_type.clone()),
    ];
    if let Some(subject) = &event.subject {
        attributes.push(("subject", subject.clone()));
    }
    attributes.push(("time", rfc3339_millis(event.created_at)));
    if let Some(schema) = &event.dataschema {
        attributes.push(("dataschema", schema.clone()));
    }
    if let Some(key) = &event.partition_key {
        attributes.push(("partitionkey", key.clone()));
    }
    if let Some(sequence) = sequence(event) {
        attributes.push(("sequence", sequence));
    }
    // The CloudEvents Distributed Tracing extension: set where the event was written,
    // carried unchanged.
    if let Some(traceparent) = &event.traceparent {
        attributes.push(("traceparent", traceparent.clone()));
    }
    if let Some(tracestate) = &event.tracestate {
        attributes.push(("tracestate", tracestate.clone()));
    }
    // The stream number (see the wire notes in guide::destinations): the device's
    // destination name and the event's gapless number in it.
    if let Some(seq) = event.stream_seq {
        attributes.push((STREAM_ATTRIBUTE, event.destination.clone()));
        attributes.push((STREAM_SEQ_ATTRIBUTE, seq.to_string()));
    }
    attributes
}

/// The headers of `event` in the CloudEvents HTTP binary content mode: every attribute of
/// [`attributes`] as `ce-{name}`, its value percent-encoded where the HTTP binding asks
/// (space, `"`, `%` and anything outside printable ASCII, as UTF-8 bytes). The body is the
/// event's data, with content type `application/json`.
pub fn binary_headers(event: &OutboundEvent) -> Vec<(String, String)> {
    attributes(event)
        .into_iter()
        .map(|(name, value)| (format!("ce-{name}"), percent_encode_header(&value)))
        .collect()
}

/// Formats unix milliseconds as an RFC 3339 UTC timestamp.
pub fn rfc3339_millis(unix_ms: i64) -> String {
    // Far-future values (a parked event's due time) are shown as the latest time humantime
    // can print rather than overflowing.
    let ms = unix_ms.clamp(0, 253_402_300_799_999) as u64;
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Encodes `event` as one CloudEvents 1.0 JSON object.
///
/// The stored payload is embedded as it is, without re-parsing it into a tree. Events with a
/// partition key carry the `partitionkey` and `sequence` extensions; events written with trace
/// context carry `traceparent` and `tracestate` (the CloudEvents Distributed Tracing
/// extension), and `dataschema` when set.
///
/// # Errors
///
/// Returns the parse error when the stored payload is not valid JSON (a row edited by hand).
pub fn structured_body(event: &OutboundEvent) -> Result<Vec<u8>, serde_json::Error> {
    // Sized once: grown from serde_json's default, the buffer was copied two or three
    // times per request.
    let mut body = Vec::with_capacity(encoded_size_bound(event));
    serde_json::to_writer(&mut body, &StructuredEvent::new(event)?)?;
    Ok(body)
}

/// Encodes `events` as one CloudEvents batch: a JSON array of structured events.
///
/// # Errors
///
/// As [`structured_body`], for the first event whose payload is not valid JSON.
pub fn batch_body(events: &[OutboundEvent]) -> Result<Vec<u8>, serde_json::Error> {
    let items = events
        .iter()
        .map(StructuredEvent::new)
        .collect::<Result<Vec<_>, _>>()?;
    serde_json::to_vec(&items)
}

/// A stable id for a batch (its `webhook-id`): the same events give the same id.
pub fn batch_id(events: &[OutboundEvent]) -> String {
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    for e in events {
        hash.update(e.event_id.as_bytes());
        hash.update(b",");
    }
    let digest = hash.finish();
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("batch_{hex}")
}

/// An upper bound on the encoded size of `event`, for packing batches without encoding them:
/// JSON escaping makes a string at most six times longer.
pub(crate) fn encoded_size_bound(event: &OutboundEvent) -> usize {
    let strings = event.event_id.len()
        + event.source.len()
        + event.event_type.len()
        + event.subject.as_ref().map_or(0, String::len)
        + event.partition_key.as_ref().map_or(0, String::len)
        + event.dataschema.as_ref().map_or(0, String::len)
        + event.traceparent.as_ref().map_or(0, String::len)
        + event.tracestate.as_ref().map_or(0, String::len)
        + event.stream_seq.map_or(0, |_| event.destination.len() + 20);
    FIXED_OVERHEAD + 6 * strings + event.payload.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OutboundEvent {
        OutboundEvent {
            id: 1,
            event_id: "0190a0a0-0000-7000-8000-000000000001".into(),
            destination: "default".into(),
            event_type: "order.created".into(),
            source: "/shop".into(),
            subject: Some("order/42".into()),
            partition_key: Some("customer-7".into()),
            idempotency_key: None,
            payload: r#"{"order":42}"#.into(),
            created_at: 1_614_265_330_123,
            attempts: 0,
            lease_owner: "r:1".into(),
            lease_expires_at: 0,
            expires_at: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
            stream_seq: None,
            priority: crate::outbound::DEFAULT_PRIORITY,
            lease_ends: None,
        }
    }

    #[test]
    fn body_is_a_cloudevent_with_data_embedded() {
        let body = structured_body(&sample()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["specversion"], "1.0");
        assert_eq!(v["id"], "0190a0a0-0000-7000-8000-000000000001");
        assert_eq!(v["type"], "order.created");
        assert_eq!(v["source"], "/shop");
        assert_eq!(v["subject"], "order/42");
        assert_eq!(v["partitionkey"], "customer-7");
        assert_eq!(v["time"], "2021-02-25T15:02:10.123Z");
        assert_eq!(v["data"]["order"], 42);
        assert_eq!(v["sequence"], "00000000000000000001");
        assert!(body.len() <= encoded_size_bound(&sample()));
    }

    #[test]
    fn batch_is_an_array_and_its_id_is_stable() {
        let mut second = sample();
        second.id = 2;
        second.event_id = "0190a0a0-0000-7000-8000-000000000002".into();
        let events = vec![sample(), second];
        let v: serde_json::Value = serde_json::from_slice(&batch_body(&events).unwrap()).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 2);
        assert_eq!(v[1]["sequence"], "00000000000000000002");
        assert_eq!(batch_id(&events), batch_id(&events.clone()));
        assert_ne!(batch_id(&events), batch_id(&events[..1]));
        assert!(batch_id(&events).starts_with("batch_"));
    }

    #[test]
    fn size_bound_holds_for_strings_that_need_escaping() {
        let mut e = sample();
        e.subject = Some("\u{1}\"".repeat(50));
        e.event_type = "\n".repeat(100);
        assert!(structured_body(&e).unwrap().len() <= encoded_size_bound(&e));
    }

    #[test]
    fn corrupt_payload_is_an_error_not_a_panic() {
        let mut e = sample();
        e.payload = "{not json".into();
        assert!(structured_body(&e).is_err());
    }
}
