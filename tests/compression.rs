//! gzip request bodies: a batch of 1 KiB or more leaves with `Content-Encoding: gzip`, a
//! smaller body as it is; a receiver that decodes with `receive::decode_body` verifies the
//! Standard Webhooks signature over the decoded body and parses every event with the
//! CloudEvents SDK.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudevents::AttributesReader;
use common::{fast, HttpServer, Request, Response};
use serde_json::json;
use sqlite_outbox::receive::{decode_body, verify_request, Secret, Verifier};
use sqlite_outbox::{Compression, Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A receiver that keeps every request as it arrived.
fn recording_receiver() -> (HttpServer, Arc<Mutex<Vec<Request>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let server = HttpServer::bind(("127.0.0.1", 0), move |request| {
        log.lock().unwrap().push(request.clone());
        Response::status(204)
    })
    .unwrap();
    (server, seen)
}

fn send(outbox: &Outbox, events: usize) -> Vec<String> {
    outbox
        .transaction(|tx| {
            (0..events)
                .map(|i| {
                    let event = Event::new(
                        "reading.taken",
                        json!({"device": "pump-7", "i": i, "celsius": 21.5, "battery": 0.87}),
                    );
                    Ok::<_, sqlite_outbox::Error>(outbox.enqueue(tx, event)?.event_id().to_string())
                })
                .collect()
        })
        .unwrap()
}

#[test]
fn large_bodies_go_gzipped_and_verify_and_parse_once_decoded_small_ones_go_plain() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("gzip.db")).unwrap();
    let (server, seen) = recording_receiver();
    let relay = outbox
        .relay(
            fast(RelayConfig::new()).destination(
                Destination::http("default", format!("http://{}/events", server.addr()))
                    .secret(SECRET)
                    .batch(100, 1 << 20)
                    .compress(Compression::Gzip),
            ),
        )
        .start()
        .unwrap();
    let mut sent = send(&outbox, 250);
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    // One event alone: a body under 1 KiB.
    sent.extend(send(&outbox, 1));
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    assert_eq!(relay.shutdown().abandoned, 0);

    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    let now = common::unix_secs(std::time::SystemTime::now());
    let mut received = Vec::new();
    let (mut gzipped, mut plain) = (0, 0);
    // The relay's accounting of its streams (issue 58) is a request of its own.
    for request in seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.is_stream_accounting())
    {
        let encoding = request.header("content-encoding");
        let decoded = decode_body(encoding, &request.body, 1 << 20).unwrap();
        match encoding {
            Some("gzip") => {
                gzipped += 1;
                assert!(decoded.len() >= Compression::MIN_BYTES);
                assert!(
                    request.body.len() * 4 < decoded.len(),
                    "{} bytes on the wire for {} decoded",
                    request.body.len(),
                    decoded.len()
                );
                // Signed over the decoded body, so the bytes on the wire do not verify.
                assert!(verify_request(&verifier, &request.headers, &request.body, now).is_err());
            }
            None => {
                plain += 1;
                assert!(decoded.len() < Compression::MIN_BYTES);
            }
            Some(other) => panic!("unexpected content-encoding {other}"),
        }
        let events = verify_request(&verifier, &request.headers, &decoded, now)
            .expect("the signature verifies over the decoded body");
        // The CloudEvents SDK reads the same events from the decoded body.
        let content_type = request.header("content-type").unwrap();
        let sdk: Vec<cloudevents::Event> = if content_type.contains("batch") {
            serde_json::from_slice(&decoded).unwrap()
        } else {
            vec![serde_json::from_slice(&decoded).unwrap()]
        };
        assert_eq!(sdk.len(), events.len());
        for (ours, theirs) in events.iter().zip(&sdk) {
            assert_eq!(theirs.id(), ours.id);
        }
        received.extend(events.into_iter().map(|e| e.id));
    }
    assert!(gzipped >= 3, "{gzipped} gzipped batches");
    assert_eq!(plain, 1, "the lone event went uncompressed");
    received.sort();
    sent.sort();
    assert_eq!(received, sent, "every event once");
    server.stop();
}

#[cfg(feature = "mqtt")]
#[test]
fn compression_on_an_mqtt_destination_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("mqtt.db")).unwrap();
    let err = outbox
        .relay(RelayConfig::new().destination(
            Destination::mqtt("default", "mqtt://127.0.0.1:1").compress(Compression::Gzip),
        ))
        .start()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("compression is for HTTP destinations"),
        "{err}"
    );
}
