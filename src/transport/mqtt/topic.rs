//! Topic templates: `outbox/{type}`, `devices/{source}/{type}`, … rendered per event.
//!
//! A placeholder whose value an event lacks makes the event unpublishable, since an empty
//! level (`devices//reading`) is rarely what a subscriber's filter expects. A template opts
//! in to empty levels per placeholder with a `?`: `outbox/{type}/{subject?}` gives
//! `outbox/reading.taken/` to an event without a subject.

use crate::error::{Error, Result};
use crate::outbound::OutboundEvent;

/// The longest topic MQTT allows, in bytes (a two-byte length prefix).
pub(crate) const MAX_TOPIC_BYTES: usize = 65_535;

/// The placeholders a template may use.
const PLACEHOLDERS: [&str; 5] = ["type", "key", "source", "subject", "destination"];

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// A placeholder, and whether an event may lack its value (`{subject?}`).
    Field(&'static str, bool),
}

/// A checked topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicTemplate {
    parts: Vec<Part>,
}

impl TopicTemplate {
    /// Parses and checks `template`: known placeholders only, no wildcard, no empty level.
    pub fn parse(template: &str) -> Result<TopicTemplate> {
        let bad = |why: String| Error::InvalidConfig(format!("MQTT topic {template:?}: {why}"));
        if template.is_empty() {
            return Err(bad("is empty".into()));
        }
        if template.contains(['+', '#']) {
            return Err(bad(
                "a topic to publish to cannot hold the wildcards + or #".into(),
            ));
        }
        if template.contains('\0') {
            return Err(bad("holds a NUL character".into()));
        }
        if template.split('/').any(str::is_empty) {
            return Err(bad(
                "has an empty level (a leading, trailing or double /)".into()
            ));
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(bad("has a { without its }".into()));
            };
            let written = &rest[open + 1..open + close];
            let (name, optional) = match written.strip_suffix('?') {
                Some(name) => (name, true),
                None => (written, false),
            };
            let Some(field) = PLACEHOLDERS.iter().find(|p| **p == name) else {
                return Err(bad(format!(
                    "unknown placeholder {{{name}}}; known: {{type}}, {{key}}, {{source}}, \
                     {{subject}}, {{destination}}, each with an optional ? to allow an empty value"
                )));
            };
            parts.push(Part::Field(field, optional));
            rest = &rest[open + close + 1..];
        }
        if rest.contains('}') {
            return Err(bad("has a } without its {".into()));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(TopicTemplate { parts })
    }

    /// The topic for `event`, or why it has none (a missing key or subject, a value with a
    /// wildcard, a topic too long): the event cannot be published.
    pub fn render(&self, event: &OutboundEvent) -> std::result::Result<String, String> {
        let mut topic = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => topic.push_str(text),
                Part::Field(field, optional) => {
                    let value = match *field {
                        "type" => Some(event.event_type.as_str()),
                        "key" => event.partition_key.as_deref(),
                        "source" => Some(event.source.as_str()),
                        "subject" => event.subject.as_deref(),
                        _ => Some(event.destination.as_str()),
                    };
                    // A source is often a URI reference like `/sqlite-outbox`: its outer
                    // slashes would make empty levels, so they are dropped.
                    let value = value.map(|v| v.trim_matches('/'));
                    let Some(value) = value.filter(|v| !v.is_empty()) else {
                        if *optional {
                            continue;
                        }
                        return Err(format!(
                            "the topic needs {{{field}}}, which this event has not"
                        ));
                    };
                    if value.contains(['+', '#', '\0']) {
                        return Err(format!(
                            "{{{field}}} = {value:?} holds a character a topic cannot (+, #, NUL)"
                        ));
                    }
                    topic.push_str(value);
                }
            }
        }
        if topic.len() > MAX_TOPIC_BYTES {
            return Err(format!(
                "the topic is {} bytes; MQTT allows {MAX_TOPIC_BYTES}",
                topic.len()
            ));
        }
        Ok(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> OutboundEvent {
        OutboundEvent {
            id: 1,
            event_id: "e1".into(),
            destination: "broker".into(),
            event_type: "reading.taken".into(),
            source: "sensor-7".into(),
            subject: None,
            partition_key: Some("room-1".into()),
            idempotency_key: None,
            payload: "{}".into(),
            created_at: 0,
            attempts: 0,
            lease_owner: "o".into(),
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
    fn placeholders_are_filled_from_the_event() {
        let t = TopicTemplate::parse("devices/{source}/{type}/{key}").unwrap();
        assert_eq!(
            t.render(&event()).unwrap(),
            "devices/sensor-7/reading.taken/room-1"
        );
        let t = TopicTemplate::parse("outbox/{destination}").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "outbox/broker");
        // A URI-reference source loses its outer slashes, not its inner ones.
        let mut e = event();
        e.source = "/plant/sensor-7/".into();
        let t = TopicTemplate::parse("devices/{source}/{type}").unwrap();
        assert_eq!(
            t.render(&e).unwrap(),
            "devices/plant/sensor-7/reading.taken"
        );
    }

    #[test]
    fn a_bad_template_is_refused_with_the_reason() {
        for (template, why) in [
            ("", "is empty"),
            ("a/+/b", "wildcards"),
            ("a/#", "wildcards"),
            ("a//b", "empty level"),
            ("/a", "empty level"),
            ("a/{nope}", "unknown placeholder {nope}"),
            ("a/{type", "without its }"),
            ("a/type}", "without its {"),
        ] {
            let e = TopicTemplate::parse(template).unwrap_err().to_string();
            assert!(e.contains(why), "{template:?}: {e:#}");
        }
    }

    #[test]
    fn an_event_without_a_value_the_topic_needs_cannot_be_published() {
        let t = TopicTemplate::parse("by-subject/{subject}").unwrap();
        let e = t.render(&event()).unwrap_err();
        assert!(e.contains("{subject}"), "{e:#}");
        let mut wild = event();
        wild.partition_key = Some("a+b".into());
        let e = TopicTemplate::parse("k/{key}")
            .unwrap()
            .render(&wild)
            .unwrap_err();
        assert!(e.contains("+, #"), "{e:#}");
    }

    #[test]
    fn a_question_mark_lets_a_missing_value_make_an_empty_level() {
        let t = TopicTemplate::parse("outbox/{type}/{subject?}").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "outbox/reading.taken/");
        let mut with_subject = event();
        with_subject.subject = Some("order-9".into());
        assert_eq!(
            t.render(&with_subject).unwrap(),
            "outbox/reading.taken/order-9"
        );
        let t = TopicTemplate::parse("a/{key?}/b").unwrap();
        let mut keyless = event();
        keyless.partition_key = None;
        assert_eq!(t.render(&keyless).unwrap(), "a//b");
        assert!(TopicTemplate::parse("a/{nope?}").is_err());
    }
}
