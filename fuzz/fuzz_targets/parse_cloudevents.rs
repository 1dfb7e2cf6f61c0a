//! The CloudEvents parser must never panic, and what it accepts must be well-formed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqlite_outbox::receive::parse_request;

fuzz_target!(|data: &[u8]| {
    let (content_type, body) = match data.split_first() {
        Some((b, rest)) if b % 2 == 0 => ("application/cloudevents+json", rest),
        Some((_, rest)) => ("application/cloudevents-batch+json", rest),
        None => ("application/cloudevents+json", data),
    };
    if let Ok(events) = parse_request(Some(content_type), body) {
        for e in events {
            assert_eq!(e.specversion, "1.0");
            assert!(!e.id.is_empty() && !e.source.is_empty() && !e.event_type.is_empty());
            assert!(e
                .extensions
                .keys()
                .all(|k| k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())));
        }
    }
});
