//! What goes on the wire: the CloudEvents 1.0 structured-mode body of one event.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::transport::OutboundEvent;

/// The `content-type` of a structured-mode CloudEvent.
pub const CLOUDEVENTS_JSON: &str = "application/cloudevents+json";

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
    partitionkey: Option<&'a str>,
    data: &'a RawValue,
}

/// Formats unix milliseconds as an RFC 3339 UTC timestamp.
pub fn rfc3339_millis(unix_ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Encodes `event` as one CloudEvents 1.0 JSON object.
///
/// The stored payload is embedded as it is, without re-parsing it into a tree.
///
/// # Errors
///
/// Returns the parse error when the stored payload is not valid JSON (a row edited by hand).
pub fn structured_body(event: &OutboundEvent) -> Result<Vec<u8>, serde_json::Error> {
    let data: &RawValue = serde_json::from_str(&event.payload)?;
    serde_json::to_vec(&StructuredEvent {
        specversion: "1.0",
        id: &event.event_id,
        source: &event.source,
        event_type: &event.event_type,
        subject: event.subject.as_deref(),
        time: rfc3339_millis(event.created_at),
        datacontenttype: "application/json",
        partitionkey: event.partition_key.as_deref(),
        data,
    })
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
    }

    #[test]
    fn corrupt_payload_is_an_error_not_a_panic() {
        let mut e = sample();
        e.payload = "{not json".into();
        assert!(structured_body(&e).is_err());
    }
}
