//! Every case of the CloudEvents HTTP conformance vectors (`tests/vectors/`), structured and
//! batched, from the CloudEvents SDKs and conformance suite.
//!
//! The parser's choices on `ambiguous` cases are documented in `src/wire/cloudevents.rs`; the
//! list below pins what each ambiguous case yields so a change of behaviour is deliberate.

use base64::Engine;
use serde_json::Value;
use sqlite_outbox::receive::{parse_batch, parse_structured, CloudEvent, Data};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Ambiguous cases and whether this crate accepts them.
const AMBIGUOUS_CHOICES: &[(&str, bool)] = &[
    // Extension names with `_` are outside the spec's a-z0-9.
    ("rust_full_no_data", false),
    ("rust_full_json_data", false),
    ("rust_full_json_base64_data", false),
    ("rust_full_non_json_base64_data", false),
    ("rust_full_xml_string_data", false),
    ("rust_full_xml_base64_data", false),
    ("rust_actix_structured_request", false),
    // Object data under a non-JSON (here also malformed) datacontenttype.
    ("go_object_data_with_non_json_content_type", false),
    ("go_object_data_before_non_json_content_type", false),
    // No CloudEvents content type: not guessed at.
    ("py_http_application_json_without_ce_headers", false),
    ("py_structured_no_content_type_header", false),
    // ce- headers beside a structured body: the body wins, headers are ignored.
    ("py_http_mixed_ce_headers_and_structured_body", true),
    // Object-valued extension: not a CloudEvents type.
    ("js_extension_object_value", false),
    // data and data_base64 together.
    ("spec_data_and_data_base64_both_present", false),
];

fn cases() -> Vec<Value> {
    serde_json::from_str(include_str!("vectors/cloudevents-http.json")).expect("vectors parse")
}

fn content_type(case: &Value) -> Option<&str> {
    case["headers"]["content-type"].as_str()
}

fn parse(case: &Value) -> Result<Vec<CloudEvent>, String> {
    let body = case["body"].as_str().unwrap_or_default().as_bytes();
    match case["mode"].as_str().unwrap() {
        "structured" => parse_structured(content_type(case), body)
            .map(|e| vec![e])
            .map_err(|e| e.to_string()),
        "batched" => parse_batch(content_type(case), body).map_err(|e| e.to_string()),
        m => panic!("unknown mode {m}"),
    }
}

fn same_instant(a: &str, b: &str) -> bool {
    match (
        OffsetDateTime::parse(a, &Rfc3339),
        OffsetDateTime::parse(b, &Rfc3339),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn attributes_match(event: &CloudEvent, expected: &Value) -> Result<(), String> {
    let got = event.attributes();
    let want = expected
        .as_object()
        .ok_or("expected attributes not an object")?;
    for (k, v) in want {
        let g = got.get(k).ok_or(format!("missing attribute {k}"))?;
        let equal = if k == "time" {
            same_instant(g.as_str().unwrap_or(""), v.as_str().unwrap_or(""))
        } else {
            g == v
        };
        if !equal {
            return Err(format!("attribute {k}: got {g}, want {v}"));
        }
    }
    if let Some(extra) = got.keys().find(|k| !want.contains_key(*k)) {
        return Err(format!("unexpected attribute {extra}"));
    }
    Ok(())
}

fn data_matches(event: &CloudEvent, expected: &Value) -> Result<(), String> {
    let ok = match (&event.data, expected["type"].as_str()) {
        (Data::None, None) => expected.is_null(),
        (Data::Json(v), Some("json")) => *v == expected["value"],
        (Data::Text(s), Some("string")) => expected["value"] == *s.as_str(),
        (Data::Binary(b), Some("binary")) => {
            base64::engine::general_purpose::STANDARD
                .decode(expected["base64"].as_str().unwrap_or(""))
                .map_err(|e| e.to_string())?
                == *b
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("data: got {:?}, want {expected}", event.data))
    }
}

fn check_valid(case: &Value, events: &[CloudEvent]) -> Result<(), String> {
    match case["mode"].as_str().unwrap() {
        "structured" => {
            attributes_match(&events[0], &case["expected_attributes"])?;
            data_matches(&events[0], &case["expected_data"])
        }
        _ => {
            let attrs = case["expected_attributes"]
                .as_array()
                .ok_or("no attribute list")?;
            let data = case["expected_data"].as_array().ok_or("no data list")?;
            let count = case["expected_count"]
                .as_u64()
                .unwrap_or(attrs.len() as u64);
            if events.len() as u64 != count {
                return Err(format!("{} events, want {count}", events.len()));
            }
            for (i, e) in events.iter().enumerate() {
                attributes_match(e, &attrs[i]).map_err(|m| format!("[{i}] {m}"))?;
                data_matches(e, &data[i]).map_err(|m| format!("[{i}] {m}"))?;
            }
            Ok(())
        }
    }
}

#[test]
fn every_cloudevents_vector_gives_the_expected_outcome() {
    let cases = cases();
    assert_eq!(cases.len(), 142);
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let ambiguous = case["ambiguous"] == true;
        let want_valid = if ambiguous {
            match AMBIGUOUS_CHOICES.iter().find(|(n, _)| *n == name) {
                Some((_, accept)) => *accept,
                None => {
                    failures.push(format!(
                        "{name}: ambiguous case without a documented choice"
                    ));
                    continue;
                }
            }
        } else {
            case["expected_valid"] == true
        };
        match (parse(case), want_valid) {
            (Ok(events), true) => {
                if !ambiguous {
                    if let Err(m) = check_valid(case, &events) {
                        failures.push(format!("{name}: {m}"));
                    }
                }
            }
            (Err(_), false) => {}
            (Ok(_), false) => failures.push(format!("{name}: accepted, should be refused")),
            (Err(e), true) => failures.push(format!("{name}: refused: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_ambiguous_case_has_a_choice() {
    let ambiguous: Vec<String> = cases()
        .into_iter()
        .filter(|c| c["ambiguous"] == true)
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ambiguous.len(), AMBIGUOUS_CHOICES.len());
    for name in ambiguous {
        assert!(AMBIGUOUS_CHOICES.iter().any(|(n, _)| *n == name), "{name}");
    }
}
