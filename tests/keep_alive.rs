//! Kept-alive connections a receiver closes: a request that meets a connection closed under
//! it before the answer goes again on another at once and spends no attempt.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::http_server::{HttpServer, Response};
use common::*;
use sqlite_outbox::{Event, Outbox, RelayConfig};

#[test]
fn a_connection_closed_as_a_request_arrives_costs_no_attempt() {
    // Issue 67, item 8: a server whose idle timeout runs out as the next request arrives
    // closes the connection without an answer. Here every connection is closed that way at
    // its second request, so each reuse meets it. Before, each such request was a failed
    // attempt (retried after a backoff); now it goes again at once on a new connection.
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("keep-alive.db")).unwrap();
    let closed_under = Arc::new(AtomicUsize::new(0));
    let server = {
        let closed_under = closed_under.clone();
        HttpServer::bind(("127.0.0.1", 0), move |request| {
            if request.earlier_on_connection > 0 {
                closed_under.fetch_add(1, Ordering::SeqCst);
                Response::reset()
            } else {
                Response::status(200)
            }
        })
        .unwrap()
    };
    let url = format!("http://127.0.0.1:{}/events", server.port());
    let relay = outbox
        .relay(fast(RelayConfig::http(url)).workers(1).max_in_flight(1))
        .start()
        .unwrap();
    for i in 0..6 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!(i))))
            .unwrap();
        assert!(wait_until(PATIENCE, || delivered_count(&outbox) == i + 1));
    }
    let _ = relay.shutdown();
    assert!(
        closed_under.load(Ordering::SeqCst) >= 5,
        "the connections were reused: {} requests met a closed one",
        closed_under.load(Ordering::SeqCst)
    );
    let attempts: Vec<i64> = rows(&outbox).iter().map(|r| r.attempts).collect();
    assert_eq!(attempts, [1; 6], "no attempt spent on a closed connection");
}
