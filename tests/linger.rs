//! A destination's linger: a trickle of events goes out as one batch per request, waiting
//! at most the linger; an urgent event (priority 8 and above) takes what waits with it at
//! once; shutdown sends what waits; settings it cannot honour are refused at start.

mod common;

use std::time::{Duration, Instant};

use common::{delivered_count, fast, wait_until, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig};

fn lingering(receiver: &TestReceiver, linger: Duration) -> RelayConfig {
    fast(RelayConfig::new())
        .lease(Duration::from_secs(200))
        .destination(
            Destination::http("default", receiver.url())
                .batch(100, 1 << 20)
                .linger(linger),
        )
}

fn commit(outbox: &Outbox, event: Event) -> String {
    outbox
        .transaction(|tx| {
            Ok::<_, sqlite_outbox::Error>(outbox.enqueue(tx, event)?.event_id().to_string())
        })
        .unwrap()
}

#[test]
fn a_trickle_goes_out_as_one_batch_delayed_at_most_the_linger() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("trickle.db")).unwrap();
    let receiver = TestReceiver::ok();
    let linger = Duration::from_secs(2);
    let relay = outbox.relay(lingering(&receiver, linger)).start().unwrap();
    let first_commit = Instant::now();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(commit(&outbox, Event::new("reading", json!({"i": i}))));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(wait_until(Duration::from_secs(10), || receiver
        .event_count()
        == 10));
    let requests = receiver.received();
    assert_eq!(requests.len(), 1, "ten events, one request");
    assert_eq!(requests[0].ids, ids, "in commit order");
    // The first event waited for the batch to fill, no longer than the linger (and the
    // claim's moment after its commit).
    let waited = requests[0].at - first_commit;
    assert!(
        waited >= linger - Duration::from_millis(100),
        "sent after {waited:?}"
    );
    assert!(
        waited <= linger + Duration::from_millis(1500),
        "sent after {waited:?}"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}

#[test]
fn an_urgent_event_takes_what_waits_with_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("urgent.db")).unwrap();
    let receiver = TestReceiver::ok();
    // A linger of 40 s: only the bypass can send these within the test's 10 s.
    let relay = outbox
        .relay(lingering(&receiver, Duration::from_secs(40)))
        .start()
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(commit(&outbox, Event::new("reading", json!({"i": i}))));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.count(), 0, "the trickle waits");
    let alarm = commit(
        &outbox,
        Event::new("alarm", json!({})).priority(Event::URGENT_PRIORITY),
    );
    assert!(wait_until(Duration::from_secs(10), || receiver
        .event_count()
        == 4));
    let sent: Vec<String> = receiver.event_ids();
    assert!(sent.contains(&alarm));
    for id in &ids {
        assert!(sent.contains(id), "waiting event {id} went with the alarm");
    }
    assert!(receiver.count() <= 2, "{} requests", receiver.count());
    assert_eq!(relay.shutdown().abandoned, 0);
}

#[test]
fn shutdown_sends_what_waits() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("shutdown.db")).unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(lingering(&receiver, Duration::from_secs(40)))
        .start()
        .unwrap();
    for i in 0..5 {
        commit(&outbox, Event::new("reading", json!({"i": i})));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.count(), 0, "the trickle waits");
    let stopped = Instant::now();
    let report = relay.shutdown();
    assert!(stopped.elapsed() < Duration::from_secs(10));
    assert_eq!(report.abandoned, 0);
    assert_eq!(receiver.event_count(), 5);
    assert_eq!(delivered_count(&outbox), 5, "recorded as delivered");
}

#[test]
fn a_linger_without_batching_or_over_a_quarter_of_the_lease_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("refused.db")).unwrap();
    let url = "http://127.0.0.1:9/events";
    let no_batch = outbox
        .relay(
            RelayConfig::new()
                .destination(Destination::http("default", url).linger(Duration::from_secs(1))),
        )
        .start()
        .unwrap_err();
    assert!(
        matches!(&no_batch, Error::InvalidConfig(m) if m.contains("set batch too")),
        "{no_batch}"
    );
    let too_long = outbox
        .relay(
            RelayConfig::new()
                .lease(Duration::from_secs(60))
                .destination(
                    Destination::http("default", url)
                        .batch(10, 1 << 20)
                        .linger(Duration::from_secs(16)),
                ),
        )
        .start()
        .unwrap_err();
    assert!(
        matches!(&too_long, Error::InvalidConfig(m) if m.contains("at most a quarter of the lease")),
        "{too_long}"
    );
}
