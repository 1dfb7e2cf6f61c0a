//! OpenTelemetry spans (feature `opentelemetry`), recorded by the SDK's in-memory exporter:
//! an enqueue inside the app's span records a `create` span whose context the event carries;
//! each delivery attempt is a `send {destination}` span in that trace, linked to it, with the
//! messaging attributes, and the request's `traceparent` header names the attempt's span.
//! (Its own test binary: the tracer provider is process-wide.)
#![cfg(feature = "opentelemetry")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{fast, wait_until, Reply, TestReceiver, PATIENCE};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{global, KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use sqlite_outbox::receive::TraceParent;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv: &KeyValue| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(|v| v.as_str().into_owned())
}

#[test]
fn one_enqueue_one_failed_attempt_and_one_good_one_make_one_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    global::set_tracer_provider(provider.clone());

    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("spans.db")).unwrap();
    // The app's request: the event is written inside its span, with no traceparent given.
    let app_tracer = global::tracer("shop");
    let (event_id, app_trace_id) = app_tracer.in_span("POST /orders", |cx| {
        let trace_id = cx.span().span_context().trace_id();
        let id = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", json!({"order": 42}))))
            .unwrap()
            .event_id()
            .to_string();
        (id, trace_id)
    });
    // Without an active span nothing is captured: no invented trace.
    let untraced = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", json!({"order": 43}))))
        .unwrap()
        .event_id()
        .to_string();

    let create = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .find(|s| s.name.starts_with("create"))
        .expect("a create span");
    assert_eq!(create.name, "create default");
    assert_eq!(create.span_kind, SpanKind::Producer);
    assert_eq!(create.span_context.trace_id(), app_trace_id);
    assert_eq!(
        text(&create, "messaging.operation.name").as_deref(),
        Some("create")
    );
    assert_eq!(
        text(&create, "messaging.message.id"),
        Some(event_id.clone())
    );
    assert_eq!(
        text(&create, "messaging.system").as_deref(),
        Some("sqlite-outbox")
    );
    // The event carries the create span's context.
    let stored: Option<String> = outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT traceparent FROM outbox_events WHERE event_id = ?1",
            [&event_id],
            |r| r.get(0),
        )
        .unwrap();
    let stored = stored.expect("the event took the active context");
    let tp = TraceParent::parse(&stored).unwrap();
    assert_eq!(tp.trace_id(), app_trace_id.to_string());
    assert_eq!(tp.parent_id(), create.span_context.span_id().to_string());

    // The receiver fails the traced event's first attempt and takes the second.
    let answered = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&answered);
    let traced_id = event_id.clone();
    let receiver = TestReceiver::start(0, move |r| {
        if r.event_id == traced_id && seen.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::Status(500)
        } else {
            Reply::Status(204)
        }
    });
    let relay = outbox
        .relay(fast(
            RelayConfig::new().destination(Destination::http("default", receiver.url())),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver
        .received()
        .iter()
        .filter(|r| r.event_id == event_id)
        .count()
        == 2
        && receiver.received().iter().any(|r| r.event_id == untraced)));
    let _ = relay.shutdown();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let mut sends: Vec<&SpanData> = spans
        .iter()
        .filter(|s| text(s, "messaging.message.id").as_deref() == Some(event_id.as_str()))
        .filter(|s| s.name == "send default")
        .collect();
    sends.sort_by_key(|s| s.start_time);
    assert_eq!(sends.len(), 2, "{spans:#?}");
    for send in &sends {
        assert_eq!(send.span_kind, SpanKind::Producer);
        // In the app's trace, a child of the create span, and linked to it.
        assert_eq!(send.span_context.trace_id(), app_trace_id);
        assert_eq!(send.parent_span_id, create.span_context.span_id());
        let links: Vec<_> = send
            .links
            .links
            .iter()
            .map(|l| l.span_context.span_id())
            .collect();
        assert_eq!(links, vec![create.span_context.span_id()]);
        assert_eq!(
            text(send, "messaging.operation.name").as_deref(),
            Some("send")
        );
        assert_eq!(
            text(send, "messaging.destination.name").as_deref(),
            Some("default")
        );
        assert_eq!(
            attribute(send, "messaging.message.body.size"),
            Some(&Value::I64(r#"{"order":42}"#.len() as i64))
        );
        assert!(
            matches!(attribute(send, "sqlite_outbox.wait_ms"), Some(Value::I64(ms)) if *ms >= 0)
        );
    }
    assert_eq!(text(sends[0], "error.type").as_deref(), Some("500"));
    assert!(matches!(sends[0].status, Status::Error { .. }));
    assert_eq!(text(sends[1], "error.type"), None);
    // Each request's header names its own attempt's span, in the app's trace.
    let headers: Vec<String> = receiver
        .received()
        .iter()
        .filter(|r| r.event_id == event_id)
        .map(|r| r.headers["traceparent"].clone())
        .collect();
    for (header, send) in headers.iter().zip(&sends) {
        let tp = TraceParent::parse(header).unwrap();
        assert_eq!(tp.trace_id(), app_trace_id.to_string());
        assert_eq!(tp.parent_id(), send.span_context.span_id().to_string());
    }
    // The event without trace context: a send span with no link, and no header.
    let untraced_send = spans
        .iter()
        .find(|s| text(s, "messaging.message.id").as_deref() == Some(untraced.as_str()))
        .expect("its send span");
    assert!(untraced_send.links.links.is_empty());
    let request = receiver
        .received()
        .into_iter()
        .find(|r| r.event_id == untraced)
        .unwrap();
    assert!(!request.headers.contains_key("traceparent"));
    let _ = provider.shutdown();
}
