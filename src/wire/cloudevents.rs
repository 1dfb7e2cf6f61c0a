//! Reading CloudEvents 1.0 from an HTTP request: structured mode (one JSON object) and batched
//! mode (a JSON array), validated as the spec and its JSON format require.
//!
//! Choices where the SDKs disagree (each tested against the conformance vectors):
//! - the content type must say CloudEvents (`application/cloudevents+json` or
//!   `application/cloudevents-batch+json`, any case, parameters ignored); a bare
//!   `application/json` or no content type is refused rather than guessed at;
//! - attribute and extension names are lower-case `a-z` and `0-9` only, as the spec says;
//!   names with `_` (some SDK fixtures use them) are refused;
//! - extension values are strings, booleans or 32-bit integers; objects and arrays are
//!   refused; `null` means "not set";
//! - `data` and `data_base64` together, or object data with a non-JSON `datacontenttype`,
//!   are refused.

use std::collections::BTreeMap;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{Map, Value};

use crate::wire::trace_context::{check_tracestate, TraceParent};

/// The `content-type` of a structured-mode CloudEvent.
pub const CLOUDEVENTS_JSON: &str = "application/cloudevents+json";

/// The `content-type` of a batched-mode request.
pub const CLOUDEVENTS_BATCH_JSON: &str = "application/cloudevents-batch+json";

/// A received event's data.
///
/// Exhaustive: CloudEvents 1.0 carries data in exactly these forms.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// No `data` member.
    None,
    /// JSON data (`datacontenttype` absent or JSON).
    Json(Value),
    /// Text data with a non-JSON `datacontenttype` (XML, plain text …).
    Text(String),
    /// Binary data, from `data_base64`.
    Binary(Vec<u8>),
}

/// One CloudEvent as received.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CloudEvent {
    /// `id`: with `source`, what identifies the event.
    pub id: String,
    /// `source`.
    pub source: String,
    /// `specversion` (always `"1.0"`).
    pub specversion: String,
    /// `type`.
    pub event_type: String,
    /// `datacontenttype`, if set.
    pub datacontenttype: Option<String>,
    /// `dataschema`, if set.
    pub dataschema: Option<String>,
    /// `subject`, if set.
    pub subject: Option<String>,
    /// `time` as written (validated as RFC 3339), if set.
    pub time: Option<String>,
    /// Extension attributes (`partitionkey`, `sequence`, …) with their JSON values.
    pub extensions: BTreeMap<String, Value>,
    /// The data.
    pub data: Data,
}

impl CloudEvent {
    /// Every attribute and extension except the data, as JSON: what a conformance vector
    /// calls `expected_attributes`.
    pub fn attributes(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), self.id.clone().into());
        m.insert("source".into(), self.source.clone().into());
        m.insert("specversion".into(), self.specversion.clone().into());
        m.insert("type".into(), self.event_type.clone().into());
        let optional = [
            ("datacontenttype", &self.datacontenttype),
            ("dataschema", &self.dataschema),
            ("subject", &self.subject),
            ("time", &self.time),
        ];
        for (name, value) in optional {
            if let Some(v) = value {
                m.insert(name.into(), v.clone().into());
            }
        }
        for (k, v) in &self.extensions {
            m.insert(k.clone(), v.clone());
        }
        m
    }

    /// The event's W3C `traceparent` (the CloudEvents Distributed Tracing extension): the
    /// context of the work that wrote the event, to continue its trace from. `None` when
    /// absent or not version-00 W3C Trace Context (a malformed one is ignored, as the
    /// specification asks of a receiver).
    ///
    /// ```
    /// # use sqlite_outbox::receive::parse_structured;
    /// let body = br#"{"specversion":"1.0","id":"1","source":"/s","type":"t",
    ///   "traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
    /// let event = parse_structured(Some("application/cloudevents+json"), body).unwrap();
    /// let tp = event.traceparent().unwrap();
    /// assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    /// ```
    pub fn traceparent(&self) -> Option<TraceParent<'_>> {
        self.extension_str("traceparent")
            .and_then(|tp| TraceParent::parse(tp).ok())
    }

    /// The event's W3C `tracestate`, when it has a valid [`traceparent`](Self::traceparent)
    /// and the state itself is well formed.
    pub fn tracestate(&self) -> Option<&str> {
        self.traceparent()?;
        self.extension_str("tracestate")
            .filter(|ts| check_tracestate(ts).is_ok())
    }

    /// An extension's value as a string, if present and a string.
    pub fn extension_str(&self, name: &str) -> Option<&str> {
        self.extensions.get(name).and_then(Value::as_str)
    }
}

/// Why a request's body is not valid CloudEvents.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// The content type is not the CloudEvents one expected for this mode.
    ContentType(String),
    /// The body is not JSON, or not the JSON shape the mode requires.
    Body(String),
    /// An event (at this index in a batch; 0 for structured mode) breaks the spec.
    Invalid {
        /// Position in the batch.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::ContentType(ct) => write!(f, "unsupported content type {ct:?}"),
            ParseError::Body(why) => write!(f, "body is not a CloudEvents document: {why}"),
            ParseError::Invalid { index, reason } => write!(f, "event {index}: {reason}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// The media type of a content-type header: lower-cased, parameters dropped.
fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Parses a request in either mode, chosen by its content type.
///
/// # Errors
///
/// [`ParseError`] if the content type is neither CloudEvents type, or the body is invalid.
pub fn parse_request(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<CloudEvent>, ParseError> {
    match media_type(content_type).as_str() {
        CLOUDEVENTS_BATCH_JSON => parse_batch(content_type, body),
        _ => parse_structured(content_type, body).map(|e| vec![e]),
    }
}

/// Parses a structured-mode request (`application/cloudevents+json`).
///
/// # Errors
///
/// [`ParseError`] naming the first problem.
pub fn parse_structured(content_type: Option<&str>, body: &[u8]) -> Result<CloudEvent, ParseError> {
    let mt = media_type(content_type);
    if mt != CLOUDEVENTS_JSON {
        return Err(ParseError::ContentType(mt));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| ParseError::Body(e.to_string()))?;
    let Value::Object(object) = value else {
        return Err(ParseError::Body("expected a JSON object".into()));
    };
    event_from_object(object).map_err(|reason| ParseError::Invalid { index: 0, reason })
}

/// Parses a batched-mode request (`application/cloudevents-batch+json`). The batch is valid
/// only if every member is.
///
/// # Errors
///
/// [`ParseError`] naming the first problem.
pub fn parse_batch(content_type: Option<&str>, body: &[u8]) -> Result<Vec<CloudEvent>, ParseError> {
    let mt = media_type(content_type);
    if mt != CLOUDEVENTS_BATCH_JSON {
        return Err(ParseError::ContentType(mt));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| ParseError::Body(e.to_string()))?;
    let Value::Array(items) = value else {
        return Err(ParseError::Body("expected a JSON array".into()));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::Object(object) => {
                event_from_object(object).map_err(|reason| ParseError::Invalid { index, reason })
            }
            _ => Err(ParseError::Invalid {
                index,
                reason: "batch member is not a JSON object".into(),
            }),
        })
        .collect()
}

fn take_string(object: &mut Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match object.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

fn required(object: &mut Map<String, Value>, name: &str) -> Result<String, String> {
    match take_string(object, name)? {
        Some(s) if !s.is_empty() => Ok(s),
        Some(_) => Err(format!("{name} must not be empty")),
        None => Err(format!("missing required attribute {name}")),
    }
}

fn optional_non_empty(
    object: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<String>, String> {
    match take_string(object, name)? {
        Some(s) if s.is_empty() => Err(format!("{name} must not be empty")),
        other => Ok(other),
    }
}

/// Whether `s` is an absolute URI: a scheme (`ALPHA *( ALPHA / DIGIT / + - . )`) and a colon.
pub(crate) fn is_absolute_uri(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// RFC 2045 `token` characters.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&b))
}

/// Whether `s` is a media type as RFC 2046 writes one: `type/subtype *(; name=value)`.
fn is_media_type(s: &str) -> bool {
    let mut parts = s.split(';');
    let Some((ty, sub)) = parts.next().and_then(|t| t.trim().split_once('/')) else {
        return false;
    };
    if !is_token(ty) || !is_token(sub) {
        return false;
    }
    parts.all(|p| match p.trim().split_once('=') {
        Some((name, value)) => {
            let value = value.trim();
            is_token(name.trim())
                && (is_token(value)
                    || (value.len() >= 2 && value.starts_with('"') && value.ends_with('"')))
        }
        None => false,
    })
}

/// Whether a media type carries JSON (`application/json`, `…/…+json`, `text/json`).
fn is_json_media_type(s: &str) -> bool {
    let mt = media_type(Some(s));
    mt.ends_with("/json") || mt.ends_with("+json")
}

fn event_from_object(mut object: Map<String, Value>) -> Result<CloudEvent, String> {
    let specversion = match take_string(&mut object, "specversion")? {
        Some(v) if v == "1.0" => v,
        Some(v) => return Err(format!("unsupported specversion {v:?}")),
        None => return Err("missing required attribute specversion".into()),
    };
    let id = required(&mut object, "id")?;
    let source = required(&mut object, "source")?;
    let event_type = required(&mut object, "type")?;
    let subject = optional_non_empty(&mut object, "subject")?;
    let datacontenttype = optional_non_empty(&mut object, "datacontenttype")?;
    if let Some(ct) = &datacontenttype {
        if !is_media_type(ct) {
            return Err(format!("datacontenttype {ct:?} is not a media type"));
        }
    }
    let dataschema = optional_non_empty(&mut object, "dataschema")?;
    if let Some(ds) = &dataschema {
        if !is_absolute_uri(ds) {
            return Err(format!("dataschema {ds:?} is not an absolute URI"));
        }
    }
    let time = take_string(&mut object, "time")?;
    if let Some(t) = &time {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .map_err(|_| format!("time {t:?} is not RFC 3339"))?;
    }
    let data_value = object.remove("data");
    let data_base64 = object.remove("data_base64");
    let data = match (data_value, data_base64) {
        (Some(d), Some(b)) if !d.is_null() && !b.is_null() => {
            return Err("data and data_base64 are both present".into())
        }
        (_, Some(Value::String(b))) => Data::Binary(
            STANDARD
                .decode(b.trim())
                .map_err(|_| "data_base64 is not base64".to_string())?,
        ),
        (_, Some(b)) if !b.is_null() => return Err("data_base64 must be a string".into()),
        (None | Some(Value::Null), _) => Data::None,
        (Some(value), _) => match &datacontenttype {
            Some(ct) if !is_json_media_type(ct) => match value {
                Value::String(s) => Data::Text(s),
                _ => {
                    return Err(format!(
                        "data is JSON but datacontenttype {ct:?} is not a JSON type"
                    ))
                }
            },
            _ => Data::Json(value),
        },
    };
    let mut extensions = BTreeMap::new();
    for (name, value) in object {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(format!(
                "attribute name {name:?} is not lower-case letters and digits"
            ));
        }
        match &value {
            Value::Null => continue,
            Value::String(_) | Value::Bool(_) => {}
            Value::Number(n) => {
                if n.as_i64().is_none_or(|i| i32::try_from(i).is_err()) {
                    return Err(format!("extension {name} = {n} is not a 32-bit integer"));
                }
            }
            _ => {
                return Err(format!(
                    "extension {name} must be a string, boolean or integer"
                ))
            }
        }
        extensions.insert(name, value);
    }
    Ok(CloudEvent {
        id,
        source,
        specversion,
        event_type,
        datacontenttype,
        dataschema,
        subject,
        time,
        extensions,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types() {
        assert!(is_media_type("application/json"));
        assert!(is_media_type("text/plain; charset=us-ascii"));
        assert!(!is_media_type("application"));
        assert!(!is_media_type("bogus ;========="));
        assert!(!is_media_type(""));
    }

    #[test]
    fn content_type_parameters_and_case_are_ignored() {
        let body = br#"{"specversion":"1.0","id":"1","source":"/s","type":"t"}"#;
        assert!(
            parse_structured(Some("application/CLOUDEVENTS+json ; charset=utf-8"), body).is_ok()
        );
        assert!(matches!(
            parse_structured(Some("application/json"), body),
            Err(ParseError::ContentType(_))
        ));
    }
}
