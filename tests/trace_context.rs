//! Trace context end to end: captured where the event is written (the Rust API, one event or
//! many, and the SQL contract), checked there, stored, and carried on every request, as the
//! CloudEvents SDK parses it, with the request's own `traceparent` header continuing the
//! trace. (The CLI's ways in are in cli/tests/cli.rs, MQTT in cli/tests/mqtt5.rs.)

mod common;

use std::collections::HashMap;

use cloudevents::{AttributesReader, Event as SdkEvent};
use common::{fast, query_rows, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::receive::{parse_request, TraceParent};
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
const OTHER_TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
const SQL_TRACEPARENT: &str = "00-11111111111111111111111111111111-2222222222222222-01";
const SCHEMA: &str = "https://example.com/schemas/order.created/v2.json";

fn trace_id(traceparent: &str) -> &str {
    TraceParent::parse(traceparent).unwrap().trace_id()
}

#[test]
fn trace_context_written_with_the_event_reaches_receivers_structured_and_batched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traced.db");
    let outbox = Outbox::builder()
        .route("*", "single")
        .route("*", "batched")
        .open(&path)
        .unwrap();
    // Through the API: one event with all three, then two in one call (one traced).
    let first = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("order.created", json!({"order": 1}))
                    .traceparent(TRACEPARENT)
                    .tracestate(TRACESTATE)
                    .dataschema(SCHEMA),
            )
        })
        .unwrap()
        .event_id()
        .to_string();
    let many = outbox
        .transaction(|tx| {
            outbox.enqueue_many(
                tx,
                [
                    Event::new("order.created", json!({"order": 2})).traceparent(OTHER_TRACEPARENT),
                    Event::new("order.created", json!({"order": 3})),
                ],
            )
        })
        .unwrap();
    let (second, untraced) = (
        many[0].event_id().to_string(),
        many[1].event_id().to_string(),
    );
    // Through the SQL contract, in the app's own transaction: a malformed traceparent fails
    // its statement only; the app's other write and the good event commit.
    let mut conn = sqlite_outbox::rusqlite::Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute_batch(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY); INSERT INTO orders VALUES (4);",
    )
    .unwrap();
    let refused = tx
        .execute(
            "INSERT INTO outbox_enqueue (type, data, traceparent) VALUES ('order.created', '{}', ?1)",
            ["00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"],
        )
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("outbox: traceparent must be W3C Trace Context"),
        "{refused}"
    );
    tx.execute(
        "INSERT INTO outbox_enqueue (type, data, traceparent, tracestate, dataschema)
         VALUES ('order.created', '{\"order\": 4}', ?1, 'vendor=x', ?2)",
        [SQL_TRACEPARENT, SCHEMA],
    )
    .unwrap();
    tx.commit().unwrap();
    drop(conn);
    let from_sql: String = query_rows(
        &outbox,
        &format!("SELECT event_id FROM outbox_events WHERE traceparent = '{SQL_TRACEPARENT}'"),
        |r| r.get(0),
    )
    .into_iter()
    .next()
    .unwrap();

    let single = TestReceiver::ok();
    let batched = TestReceiver::ok();
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("single", single.url()))
                .destination(Destination::http("batched", batched.url()).batch(10, 1 << 20)),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || single.event_count() == 4
        && batched.event_count() == 4));
    let _ = relay.shutdown();

    // What each event carries, as the official SDK parses it, in both shapes.
    // Per event id: its traceparent, tracestate and dataschema.
    type Carried<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);
    let want: HashMap<&str, Carried> = HashMap::from([
        (
            first.as_str(),
            (Some(TRACEPARENT), Some(TRACESTATE), Some(SCHEMA)),
        ),
        (second.as_str(), (Some(OTHER_TRACEPARENT), None, None)),
        (untraced.as_str(), (None, None, None)),
        (
            from_sql.as_str(),
            (Some(SQL_TRACEPARENT), Some("vendor=x"), Some(SCHEMA)),
        ),
    ]);
    let structured: Vec<SdkEvent> = single
        .received()
        .iter()
        .map(|r| serde_json::from_slice(&r.raw).expect("SDK parses a structured event"))
        .collect();
    let in_batches: Vec<SdkEvent> = batched
        .received()
        .iter()
        .flat_map(|r| serde_json::from_slice::<Vec<SdkEvent>>(&r.raw).expect("SDK parses a batch"))
        .collect();
    for events in [&structured, &in_batches] {
        assert_eq!(events.len(), 4);
        for e in events {
            let (tp, ts, schema) = want[e.id()];
            let ext = |name: &str| e.extension(name).map(|v| v.to_string());
            assert_eq!(ext("traceparent").as_deref(), tp, "{}", e.id());
            assert_eq!(ext("tracestate").as_deref(), ts, "{}", e.id());
            assert_eq!(e.dataschema().map(|u| u.as_str()), schema, "{}", e.id());
        }
    }

    // The request's own header: the event's trace (its span, as no spans are recorded
    // here), none for the event without trace context.
    for r in single.received() {
        let (tp, ts, _) = want[r.event_id.as_str()];
        assert_eq!(r.headers.get("traceparent").map(String::as_str), tp);
        assert_eq!(r.headers.get("tracestate").map(String::as_str), ts);
        // The crate's own receiving side exposes the event's context to continue from.
        let events =
            parse_request(r.headers.get("content-type").map(String::as_str), &r.raw).unwrap();
        assert_eq!(events[0].traceparent().map(|t| t.as_str()), tp);
        assert_eq!(events[0].tracestate(), ts);
    }
    // A batch's header carries the trace of its first event with trace context.
    for r in batched.received() {
        let first_traced = r
            .ids
            .iter()
            .find_map(|id| want[id.as_str()].0)
            .map(trace_id);
        let header = r.headers.get("traceparent").map(|h| trace_id(h));
        assert_eq!(header, first_traced, "{:?}", r.ids);
    }
}

#[test]
fn malformed_trace_context_or_schema_is_refused_by_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("refused.db")).unwrap();
    let cases = [
        (
            Event::new("t", json!(1)).traceparent("00-abc"),
            "traceparent",
        ),
        (
            Event::new("t", json!(1))
                .traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            "traceparent",
        ),
        (
            Event::new("t", json!(1))
                .traceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "traceparent",
        ),
        (Event::new("t", json!(1)).tracestate("rojo=1"), "tracestate"),
        (
            Event::new("t", json!(1))
                .traceparent(TRACEPARENT)
                .tracestate("rojo=1,rojo=2"),
            "tracestate",
        ),
        (
            Event::new("t", json!(1))
                .traceparent(TRACEPARENT)
                .tracestate(format!("k={}", "v".repeat(600))),
            "tracestate",
        ),
        (
            Event::new("t", json!(1)).dataschema("schemas/v2.json"),
            "dataschema",
        ),
        (
            Event::new("t", json!(1)).dataschema("https://x/a b"),
            "dataschema",
        ),
    ];
    for (event, want) in cases {
        let err = outbox
            .transaction(|tx| outbox.enqueue(tx, event.clone()))
            .unwrap_err();
        match &err {
            Error::InvalidEvent { field, .. } => assert_eq!(*field, want, "{err}"),
            other => panic!("{event:?}: {other}"),
        }
        assert!(err.to_string().starts_with(want), "{err}");
        // enqueue_many checks every event before writing any.
        let err = outbox
            .transaction(|tx| outbox.enqueue_many(tx, [Event::new("ok", json!(1)), event]))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidEvent { .. }), "{err}");
    }
    let stored: Vec<i64> = query_rows(&outbox, "SELECT COUNT(*) FROM outbox_events", |r| r.get(0));
    assert_eq!(stored, vec![0]);
}

#[test]
fn binary_mode_carries_every_attribute_as_ce_headers_the_sdk_reads() {
    use sqlite_outbox::transport::HttpConfig;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("binary.db")).unwrap();
    let traced = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("order.created", json!({"order": 7, "note": "ünï \"q\""}))
                    .subject("orders/7 (eu)")
                    .partition_key("customer-7")
                    .traceparent(TRACEPARENT)
                    .tracestate(TRACESTATE)
                    .dataschema(SCHEMA),
            )
        })
        .unwrap()
        .event_id()
        .to_string();
    let plain = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", json!(null))))
        .unwrap()
        .event_id()
        .to_string();
    let receiver = TestReceiver::ok();
    let binary = HttpConfig::new().binary_mode(true);
    let relay =
        outbox
            // Added after `fast`, which sets the HTTP settings of the destinations before it.
            .relay(fast(RelayConfig::new()).destination(
                Destination::http("default", receiver.url()).http_config(binary.clone()),
            ))
            .start()
            .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 2));
    let _ = relay.shutdown();
    let parsed: HashMap<String, (SdkEvent, HashMap<String, String>)> = receiver
        .received()
        .into_iter()
        .map(|r| {
            let mut headers = ureq::http::HeaderMap::new();
            for (name, value) in &r.headers {
                headers.insert(
                    ureq::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    ureq::http::HeaderValue::from_str(value).unwrap(),
                );
            }
            let event = cloudevents::binding::http::to_event(&headers, r.raw.clone())
                .expect("the SDK reads a binary-mode request");
            (event.id().to_string(), (event, r.headers.clone()))
        })
        .collect();
    let (event, headers) = &parsed[&traced];
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["ce-traceparent"], TRACEPARENT);
    assert_eq!(headers["ce-tracestate"], TRACESTATE);
    assert_eq!(headers["traceparent"], TRACEPARENT);
    assert_eq!(
        event
            .extension("traceparent")
            .map(|v| v.to_string())
            .as_deref(),
        Some(TRACEPARENT)
    );
    assert_eq!(
        event
            .extension("tracestate")
            .map(|v| v.to_string())
            .as_deref(),
        Some(TRACESTATE)
    );
    assert_eq!(event.dataschema().map(|u| u.as_str()), Some(SCHEMA));
    // Percent-encoded as the HTTP binding asks (the SDK hands the header over as received).
    assert_eq!(headers["ce-subject"], "orders/7%20(eu)");
    assert_eq!(event.subject(), Some("orders/7%20(eu)"));
    assert_eq!(event.ty(), "order.created");
    assert_eq!(
        event
            .extension("partitionkey")
            .map(|v| v.to_string())
            .as_deref(),
        Some("customer-7")
    );
    let data: serde_json::Value = match event.data() {
        Some(cloudevents::Data::Json(v)) => v.clone(),
        Some(cloudevents::Data::Binary(b)) => serde_json::from_slice(b).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(data, json!({"order": 7, "note": "ünï \"q\""}));
    let (_, headers) = &parsed[&plain];
    assert!(!headers.contains_key("ce-traceparent") && !headers.contains_key("traceparent"));

    // Binary mode cannot batch: refused when the relay starts.
    let err = outbox
        .relay(
            RelayConfig::new().destination(
                Destination::http("default", receiver.url())
                    .http_config(binary)
                    .batch(10, 1 << 20),
            ),
        )
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("cannot batch"), "{err}");
}
