//! Accounting only for receivers that ask for it (issue 66, item 4): an HTTP destination
//! left to its default gets streams' accountings only once its receiver answered a 2xx with
//! `outbox-accounting: 1` (as `outbox ingest` does); a generic webhook receiver gets only
//! the app's events, also from the relay's last round as it stops.

#[path = "common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_server::{HttpServer, Response};
use serde_json::json;
use sqlite_outbox::wire::ACCOUNTING_HEADER;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// Runs a relay over three events to a receiver that answers 204 (with the accounting
/// header if `asks`), for a few accounting intervals and a shutdown; returns how many
/// events and how many accountings it got.
fn run(asks: bool) -> (usize, usize) {
    let events = Arc::new(AtomicUsize::new(0));
    let accountings = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let (events, accountings) = (events.clone(), accountings.clone());
        HttpServer::bind("127.0.0.1:0", move |request| {
            if request.is_stream_accounting() {
                accountings.fetch_add(1, Ordering::SeqCst);
            } else {
                events.fetch_add(1, Ordering::SeqCst);
            }
            let answer = Response::status(204);
            if asks {
                answer.header(ACCOUNTING_HEADER, "1")
            } else {
                answer
            }
        })
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    outbox
        .transaction(|tx| {
            for n in 0..3 {
                let _ = outbox.enqueue(tx, Event::new("order.placed", json!({"n": n})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let url = format!("http://{}/events", receiver.addr());
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(Destination::http("default", &url))
                .accounting_interval(Duration::from_secs(1)),
        )
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while events.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "events not delivered");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past an accounting interval, then the last round of the shutdown.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = relay.shutdown();
    receiver.stop();
    (
        events.load(Ordering::SeqCst),
        accountings.load(Ordering::SeqCst),
    )
}

#[test]
fn a_generic_receiver_gets_no_accounting_and_one_that_asks_gets_it() {
    let (events, accountings) = run(false);
    assert_eq!((events, accountings), (3, 0), "a generic receiver");
    let (events, accountings) = run(true);
    assert_eq!(events, 3);
    assert!(accountings >= 1, "a receiver that asks is told");
}
