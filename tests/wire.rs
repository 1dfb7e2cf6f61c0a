//! What the relay puts on the wire: signed CloudEvents, structured and batched, and how a
//! receiver reads them back with the crate's own receiving side.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{delivered_count, fast, wait_until, Received, Reply, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::receive::{parse_request, verify_request, Secret, Verifier};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A relay delivering the default destination to `url`, signed with `SECRET`.
fn signed_relay(outbox: &Outbox, url: String) -> sqlite_outbox::RelayHandle {
    outbox
        .relay(fast(
            RelayConfig::new().destination(Destination::http("default", url).secret(SECRET)),
        ))
        .start()
        .unwrap()
}

fn headers(r: &Received) -> Vec<(String, String)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn relay_sends_signed_cloudevents_that_the_receiving_side_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .default_source("/shop")
        .open(dir.path().join("signed.db"))
        .unwrap();
    let receiver = TestReceiver::ok();
    let ids: Vec<String> = (0..3)
        .map(|i| {
            outbox
                .transaction(|tx| {
                    outbox.enqueue(
                        tx,
                        Event::new("order.created", json!({"order": i}))
                            .partition_key("customer-7")
                            .subject(format!("orders/{i}")),
                    )
                })
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect();
    let relay = signed_relay(&outbox, receiver.url());
    assert!(wait_until(PATIENCE, || receiver.count() == 3));
    let _ = relay.shutdown();

    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    let mut sequences = Vec::new();
    for (r, id) in receiver.received().iter().zip(&ids) {
        assert_eq!(r.headers["webhook-id"], *id);
        assert_eq!(r.headers["idempotency-key"], format!("\"{id}\""));
        let events = verify_request(&verifier, &headers(r), &r.raw, now_secs()).unwrap();
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!((e.id.as_str(), e.source.as_str()), (id.as_str(), "/shop"));
        assert_eq!(e.extension_str("partitionkey"), Some("customer-7"));
        sequences.push(e.extension_str("sequence").unwrap().to_string());
    }
    // Sequence increases in commit order within the key, as strings too.
    let mut sorted = sequences.clone();
    sorted.sort();
    assert_eq!(sorted, sequences);
    assert_eq!(
        sequences
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3
    );
}

#[test]
fn rotation_signs_with_both_secrets_and_a_receiver_knowing_only_the_new_one_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("rotate.db")).unwrap();
    let receiver = TestReceiver::ok();
    let (new_secret, new_text) = Secret::generate().unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .unwrap();
    let relay = outbox
        .relay(fast(
            RelayConfig::new().destination(
                Destination::http("default", receiver.url())
                    .secret(SECRET)
                    .secret(&new_text),
            ),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    let _ = relay.shutdown();
    let r = &receiver.received()[0];
    assert_eq!(r.headers["webhook-signature"].split(' ').count(), 2);
    let only_new = Verifier::new([new_secret]);
    assert!(verify_request(&only_new, &headers(r), &r.raw, now_secs()).is_ok());
    let (stranger, _) = Secret::generate().unwrap();
    assert!(verify_request(&Verifier::new([stranger]), &headers(r), &r.raw, now_secs()).is_err());
}

#[test]
fn a_retry_is_signed_afresh_with_its_own_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("resign.db")).unwrap();
    let receiver = TestReceiver::start(0, |r| {
        if r.earlier == 0 {
            Reply::StatusHeader(503, "Retry-After", "2".into())
        } else {
            Reply::Status(204)
        }
    });
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .unwrap();
    let relay = signed_relay(&outbox, receiver.url());
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let _ = relay.shutdown();
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    let ts = |r: &Received| r.headers["webhook-timestamp"].parse::<i64>().unwrap();
    assert!(
        ts(&got[1]) >= ts(&got[0]) + 2,
        "retry must carry a newer timestamp"
    );
    assert_eq!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    for r in &got {
        verify_request(&verifier, &headers(r), &r.raw, ts(r)).unwrap();
    }
    assert_ne!(
        got[0].headers["webhook-signature"],
        got[1].headers["webhook-signature"]
    );
}

#[test]
fn a_batch_of_100_parses_back_to_the_same_ids_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("batch.db")).unwrap();
    let receiver = TestReceiver::ok();
    let ids: Vec<String> = (0..100)
        .map(|i| {
            outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("reading", json!({"i": i}))))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect();
    let relay = outbox
        .relay(fast(
            RelayConfig::new().destination(
                Destination::http("default", receiver.url())
                    .secret(SECRET)
                    .batch(100, 1 << 20),
            ),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 100));
    let _ = relay.shutdown();
    let got = receiver.received();
    assert_eq!(got.len(), 1, "one request");
    let r = &got[0];
    assert_eq!(
        r.headers["content-type"],
        "application/cloudevents-batch+json"
    );
    assert!(r.headers["webhook-id"].starts_with("batch_"));
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    let events = verify_request(&verifier, &headers(r), &r.raw, now_secs()).unwrap();
    let got_ids: Vec<String> = events.into_iter().map(|e| e.id).collect();
    assert_eq!(got_ids, ids);
}

#[test]
fn batches_respect_the_byte_limit() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bytes.db")).unwrap();
    let receiver = TestReceiver::ok();
    for i in 0..50 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("blob", json!("x".repeat(1000 + i)))))
            .unwrap();
    }
    let limit = 8 * 1024;
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(
            Destination::http("default", receiver.url()).batch(1000, limit),
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 50));
    let _ = relay.shutdown();
    let got = receiver.received();
    assert!(got.len() > 1);
    assert!(
        got.iter().all(|r| r.raw.len() <= limit),
        "a batch over the limit"
    );
    assert_eq!(got.iter().map(|r| r.ids.len()).sum::<usize>(), 50);
    for r in &got {
        let parsed = parse_request(Some("application/cloudevents-batch+json"), &r.raw).unwrap();
        assert_eq!(parsed.len(), r.ids.len());
    }
}

#[test]
fn a_failed_batch_is_retried_as_a_whole() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("whole.db")).unwrap();
    let receiver =
        TestReceiver::start(0, |r| Reply::Status(if r.earlier == 0 { 500 } else { 200 }));
    for i in 0..10 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(i))))
            .unwrap();
    }
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(
            Destination::http("default", receiver.url()).batch(10, 1 << 20),
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 10));
    let _ = relay.shutdown();
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].ids, got[1].ids);
    assert_eq!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    assert!(common::rows(&outbox).iter().all(|r| r.attempts == 2));
}

#[test]
fn captured_request_for_the_notes() {
    // Prints one request exactly as the relay sends it (run with --nocapture), and checks
    // the headers a receiver relies on are all there.
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .default_source("/shop/eu-1")
        .open(dir.path().join("capture.db"))
        .unwrap();
    let receiver = TestReceiver::ok();
    let _ = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new(
                    "order.created",
                    json!({"order_id": 42, "total_cents": 1999}),
                )
                .partition_key("customer-7")
                .subject("orders/42"),
            )
        })
        .unwrap();
    let relay = signed_relay(&outbox, receiver.url());
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    let _ = relay.shutdown();
    let r = &receiver.received()[0];
    let mut names: Vec<_> = r.headers.keys().cloned().collect();
    names.sort();
    for name in [
        "content-type",
        "idempotency-key",
        "webhook-id",
        "webhook-signature",
        "webhook-timestamp",
    ] {
        assert!(names.contains(&name.to_string()), "{name} missing");
    }
    println!("POST /events HTTP/1.1");
    for n in &names {
        println!("{n}: {}", r.headers[n]);
    }
    println!();
    println!("{}", String::from_utf8_lossy(&r.raw));
    let _ = Duration::ZERO;
}

#[test]
fn the_official_cloudevents_sdk_accepts_every_request_the_relay_sends() {
    use cloudevents::{AttributesReader, Event as SdkEvent};
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .route("*", "single")
        .route("*", "batched")
        .open(dir.path().join("sdk.db"))
        .unwrap();
    let single = TestReceiver::ok();
    let batched = TestReceiver::ok();
    let mut ids = Vec::new();
    for i in 0..30 {
        let mut event = Event::new(
            "order.created",
            json!({"i": i, "note": "ünïcode \"quoted\""}),
        );
        if i % 2 == 0 {
            event = event
                .partition_key(format!("k{}", i % 3))
                .subject(format!("orders/{i}"));
        }
        ids.push(
            outbox
                .transaction(|tx| outbox.enqueue(tx, event))
                .unwrap()
                .event_id()
                .to_string(),
        );
    }
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("single", single.url()))
                .destination(Destination::http("batched", batched.url()).batch(7, 1 << 20)),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || single.event_count() == 30
        && batched.event_count() == 30));
    let _ = relay.shutdown();

    let mut from_single: Vec<SdkEvent> = single
        .received()
        .iter()
        .map(|r| serde_json::from_slice::<SdkEvent>(&r.raw).expect("SDK parses a structured event"))
        .collect();
    let mut from_batches: Vec<SdkEvent> = batched
        .received()
        .iter()
        .flat_map(|r| serde_json::from_slice::<Vec<SdkEvent>>(&r.raw).expect("SDK parses a batch"))
        .collect();
    for events in [&mut from_single, &mut from_batches] {
        events.sort_by(|a, b| a.id().cmp(b.id()));
        let got: Vec<&str> = events.iter().map(|e| e.id()).collect();
        let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
        want.sort();
        assert_eq!(got, want);
        for e in events.iter() {
            assert_eq!(e.ty(), "order.created");
            assert_eq!(e.source().as_str(), "/sqlite-outbox");
            assert!(e.time().is_some());
        }
        let keyed = events
            .iter()
            .filter(|e| e.extension("partitionkey").is_some())
            .count();
        assert_eq!(keyed, 15);
    }
}

#[test]
fn the_source_is_fixed_at_enqueue_whichever_relay_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("source.db");
    let app = Outbox::builder()
        .default_source("/shop/eu-1")
        .open(&path)
        .unwrap();
    let _ = app
        .transaction(|tx| app.enqueue(tx, Event::new("order.created", json!({}))))
        .unwrap();
    // Another process (the CLI, say) relays with its own default source.
    let other = Outbox::builder()
        .default_source("/cli")
        .open(&path)
        .unwrap();
    let receiver = TestReceiver::ok();
    let relay = other
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    let _ = relay.shutdown();
    assert_eq!(receiver.received()[0].body["source"], "/shop/eu-1");
}

#[test]
fn the_sequence_keeps_growing_after_every_row_is_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("sequence.db")).unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let keyed = |n: i32| {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(n)).partition_key("k")))
            .unwrap();
    };
    keyed(1);
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    // A quiet week later: every delivered row is pruned, the table is empty.
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    std::thread::sleep(Duration::from_millis(5)); // delivered strictly before the cutoff
    let pruned = outbox.prune_delivered(Duration::ZERO).unwrap();
    assert_eq!(pruned.deleted, 1);
    keyed(2);
    assert!(wait_until(PATIENCE, || receiver.count() == 2));
    let _ = relay.shutdown();
    let sequences: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.body["sequence"].as_str().unwrap().to_string())
        .collect();
    assert!(sequences[1] > sequences[0], "{sequences:?}");
}
