//! A paced destination (`Destination::rate_limit`, `bandwidth_limit`) as the library's relay
//! runs it; `cli/tests/pacing.rs` checks the pace itself on the receiver's clock.

mod common;

use std::time::{Duration, Instant};

use common::{delivered_count, fast, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

#[test]
fn shutdown_wakes_a_worker_waiting_on_its_pace_and_hands_its_events_back() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("paced.db")).unwrap();
    for n in 0..3 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(n))))
            .unwrap();
    }
    let receiver = TestReceiver::ok();
    // One request every five seconds: the first goes at once, the next waits its turn.
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(
            Destination::http("default", receiver.url()).rate_limit(0.2),
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let report = relay.shutdown();
    let took = started.elapsed();
    // Before, the waiting worker slept out its pace (about five seconds) and sent its
    // request during shutdown, whose outcome was then dropped.
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert_eq!(report.abandoned, 0, "{report:?}");
    assert_eq!(receiver.event_count(), 1, "nothing sent during shutdown");
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.delivered, stats.pending), (1, 2));
}
