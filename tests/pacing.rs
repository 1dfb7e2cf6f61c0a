//! A paced destination (`Destination::rate_limit`, `bandwidth_limit`) as the library's relay
//! runs it; `cli/tests/pacing.rs` checks the pace itself on the receiver's clock.

mod common;

use std::time::{Duration, Instant};

use common::{delivered_count, fast, wait_until, Reply, TestReceiver, PATIENCE};
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

/// Relay settings for a paced destination at `rate` requests a second (and `bandwidth`
/// bytes a second, if given) delivering to `receiver`, with a lease of `lease`.
fn paced(
    receiver: &TestReceiver,
    rate: Option<f64>,
    bandwidth: Option<u64>,
    lease: Duration,
) -> RelayConfig {
    let mut destination = Destination::http("default", receiver.url());
    if let Some(rate) = rate {
        destination = destination.rate_limit(rate);
    }
    if let Some(bandwidth) = bandwidth {
        destination = destination.bandwidth_limit(bandwidth);
    }
    fast(RelayConfig::new().destination(destination)).lease(lease)
}

#[test]
fn a_rate_whose_pace_window_holds_less_than_one_request_still_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("slow.db")).unwrap();
    for n in 0..2 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(n))))
            .unwrap();
    }
    let receiver = TestReceiver::ok();
    // One request every five seconds, and a pace window of a quarter of a 10 s lease: the
    // window lets out half a request. Before, nothing was ever claimed (0 of 2 delivered).
    let relay = outbox
        .relay(paced(&receiver, Some(0.2), None, Duration::from_secs(10)))
        .start()
        .unwrap();
    let delivered = wait_until(Duration::from_secs(20), || delivered_count(&outbox) == 2);
    let _ = relay.shutdown();
    assert!(delivered, "{} of 2 delivered", delivered_count(&outbox));
    assert_eq!(receiver.event_count(), 2, "each once");
}

#[test]
fn one_event_larger_than_the_bandwidths_window_does_not_hold_back_the_ones_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("large.db")).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("big", json!("x".repeat(20_000)))))
        .unwrap();
    for n in 0..10 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("small", json!(n))))
            .unwrap();
    }
    let receiver = TestReceiver::ok();
    // 2,000 bytes a second: the 20 KB event goes (into debt), and then the small ones must,
    // once the debt is paid (about 9 s). Before, none of them ever did.
    let relay = outbox
        .relay(paced(&receiver, None, Some(2_000), Duration::from_secs(30)))
        .start()
        .unwrap();
    let delivered = wait_until(Duration::from_secs(40), || delivered_count(&outbox) == 11);
    let _ = relay.shutdown();
    assert!(delivered, "{} of 11 delivered", delivered_count(&outbox));
}

/// Issue 55, finding 3: a receiver that refuses batches of more than 10 events (413) to a
/// paced destination. The halves of a refused batch wait their turn at the pace; once half
/// the lease is gone they are handed back unsent. Before, the next claim rebuilt them into
/// the same refused batch, and delivery crawled (23 of 200 in 60 s, batches of 100); the
/// bisection must carry on across a hand-back.
#[test]
fn bisecting_a_refused_batch_finishes_under_a_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bisect.db")).unwrap();
    outbox
        .transaction(|tx| {
            for n in 0..100 {
                let _ = outbox.enqueue(tx, Event::new("t", json!(n)))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let receiver = TestReceiver::start(0, |r| {
        if r.ids.len() > 10 {
            Reply::Status(413)
        } else {
            Reply::Status(200)
        }
    });
    let destination = Destination::http("default", receiver.url())
        .batch(50, 1 << 20)
        .rate_limit(2.0);
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(destination)).lease(Duration::from_secs(10)))
        .start()
        .unwrap();
    let delivered = wait_until(Duration::from_secs(60), || delivered_count(&outbox) == 100);
    let _ = relay.shutdown();
    assert!(delivered, "{} of 100 delivered", delivered_count(&outbox));
    let stats = outbox.stats().unwrap();
    assert_eq!(stats.dead, 0, "a split spends no attempt");
}
