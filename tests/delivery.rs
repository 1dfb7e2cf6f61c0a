//! Delivery over real HTTP to a receiver on 127.0.0.1: order, retries, dead letters, offline.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{closed_port, delivered_count, fast, rows, wait_until, Reply, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::{Event, Outbox, RelayConfig};

fn enqueue_n(outbox: &Outbox, n: usize, key_of: impl Fn(usize) -> Option<String>) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut event = Event::new("test.event", json!({ "seq": i }));
            if let Some(k) = key_of(i) {
                event = event.partition_key(k);
            }
            outbox
                .transaction(|tx| outbox.enqueue(tx, event))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect()
}

#[test]
fn every_event_arrives_once_and_in_commit_order_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("order.db")).unwrap();
    let receiver = TestReceiver::ok();
    let ids = enqueue_n(&outbox, 300, |i| Some(format!("key-{}", i % 5)));
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).workers(4))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() >= 300));
    let report = relay.shutdown();
    assert_eq!(report.abandoned, 0);

    let got = receiver.received();
    assert_eq!(got.len(), 300, "each event exactly once");
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &got {
        *seen.entry(r.event_id.as_str()).or_default() += 1;
    }
    assert!(ids.iter().all(|id| seen.get(id.as_str()) == Some(&1)));
    // Within each key, receipt order is commit order.
    let mut last: HashMap<String, i64> = HashMap::new();
    for r in &got {
        let key = r.body["partitionkey"].as_str().unwrap().to_string();
        let seq = r.body["data"]["seq"].as_i64().unwrap();
        if let Some(prev) = last.insert(key.clone(), seq) {
            assert!(prev < seq, "key {key}: {seq} arrived after {prev}");
        }
    }
    assert!(rows(&outbox).iter().all(|r| r.delivered && r.attempts == 1));
}

#[test]
fn request_is_a_cloudevent_with_id_headers() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .default_source("/tests/wire")
        .open(dir.path().join("wire.db"))
        .unwrap();
    let receiver = TestReceiver::ok();
    let id = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("order.shipped", json!({"order": 7}))
                    .subject("order/7")
                    .partition_key("c-1"),
            )
        })
        .unwrap();
    deliver_the_one_event(&outbox, &receiver);
    let r = &receiver.received()[0];
    assert_eq!(r.headers["content-type"], "application/cloudevents+json");
    assert_eq!(r.headers["webhook-id"], id.event_id());
    assert_eq!(
        r.headers["idempotency-key"],
        format!("\"{}\"", id.event_id())
    );
    assert_eq!(r.body["specversion"], "1.0");
    assert_eq!(r.body["type"], "order.shipped");
    assert_eq!(r.body["source"], "/tests/wire");
    assert_eq!(r.body["subject"], "order/7");
    assert_eq!(r.body["data"], json!({"order": 7}));
}

#[test]
fn a_500_then_200_is_retried_and_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("retry.db")).unwrap();
    let receiver = TestReceiver::start(0, |r| {
        if r.earlier == 0 {
            Reply::StatusBody(500, "database on fire")
        } else {
            Reply::Status(200)
        }
    });
    let ids = enqueue_n(&outbox, 3, |_| None);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 3));
    let stats = relay.stats();
    let _ = relay.shutdown();
    assert_eq!((stats.retried, stats.delivered, stats.dead), (3, 3, 0));
    for id in &ids {
        let attempts: Vec<_> = receiver
            .received()
            .into_iter()
            .filter(|r| &r.event_id == id)
            .collect();
        assert_eq!(attempts.len(), 2, "one failure, one success");
    }
    for row in rows(&outbox) {
        assert!(row.delivered);
        assert_eq!(row.attempts, 2);
        assert_eq!(
            row.last_error.as_deref(),
            Some("HTTP 500: database on fire")
        );
    }
}

#[test]
fn a_429_with_retry_after_waits_at_least_that_long_on_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let start = 1_700_000_000_000;
    let clock = ManualClock::new(start);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("429.db"))
        .unwrap();
    let receiver = TestReceiver::start(0, |r| {
        if r.earlier == 0 {
            Reply::StatusHeader(429, "Retry-After", "2".into())
        } else {
            Reply::Status(200)
        }
    });
    enqueue_n(&outbox, 1, |_| None);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].attempts == 1));
    let row = rows(&outbox).remove(0);
    assert!(row.available_at >= start + 2_000, "{row:?}");
    assert!(!row.delivered);

    // 1.999 s later on the clock, and longer than the relay's idle claim interval in real
    // time: still not due, so not re-sent.
    clock.advance_ms(1_999);
    std::thread::sleep(Duration::from_millis(1_300));
    assert_eq!(receiver.count(), 1);

    clock.advance_ms(1);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let _ = relay.shutdown();
    assert_eq!(receiver.count(), 2);
}

#[test]
fn a_400_dead_letters_at_once_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("400.db")).unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::StatusBody(400, "field 'total' missing"));
    enqueue_n(&outbox, 1, |_| None);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].dead));
    let _ = relay.shutdown();
    let row = rows(&outbox).remove(0);
    assert_eq!(row.attempts, 1);
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 400: field 'total' missing")
    );
    assert_eq!(receiver.count(), 1);
}

#[test]
fn max_attempts_of_5xx_dead_letters_with_the_last_error() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("max.db")).unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Status(503));
    enqueue_n(&outbox, 1, |_| None);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).max_attempts(3))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].dead));
    let _ = relay.shutdown();
    let row = rows(&outbox).remove(0);
    assert_eq!(row.attempts, 3);
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 503 (gave up after 3 attempts)")
    );
    assert_eq!(receiver.count(), 3);
}

#[test]
fn a_client_error_can_be_retried_instead_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("404.db")).unwrap();
    let receiver = TestReceiver::start(0, |r| Reply::Status(if r.earlier < 2 { 404 } else { 204 }));
    enqueue_n(&outbox, 1, |_| None);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).dead_letter_client_errors(false))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let _ = relay.shutdown();
    assert_eq!(rows(&outbox)[0].attempts, 3);
}

#[test]
fn receiver_down_for_many_backoff_rounds_spends_no_attempt_and_drains_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("offline.db")).unwrap();
    let port = closed_port();
    let ids = enqueue_n(&outbox, 50, |i| Some(format!("k{}", i % 3)));
    let relay = outbox
        .relay(fast(RelayConfig::http(format!("http://127.0.0.1:{port}/events"))).max_attempts(2))
        .start()
        .unwrap();
    // Many rounds of "connection refused", each backing the destination off.
    assert!(wait_until(PATIENCE, || relay.stats().released >= 10));
    let offline = rows(&outbox);
    assert!(offline
        .iter()
        .all(|r| r.attempts == 0 && !r.dead && !r.delivered));
    assert!(offline.iter().any(|r| r
        .last_error
        .as_deref()
        .unwrap_or("")
        .starts_with("unreachable")));

    // The receiver comes back on the same port: everything drains, each event once.
    let receiver = TestReceiver::start(port, |_| Reply::Status(200));
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 50));
    let stats = relay.stats();
    let _ = relay.shutdown();
    assert_eq!(stats.dead, 0);
    assert_eq!(receiver.count(), 50);
    let mut got: Vec<String> = receiver
        .received()
        .into_iter()
        .map(|r| r.event_id)
        .collect();
    got.sort();
    let mut want = ids;
    want.sort();
    assert_eq!(got, want);
    assert!(rows(&outbox).iter().all(|r| r.attempts == 1));
}

#[test]
fn shutdown_returns_within_its_bound_while_the_receiver_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("hang.db")).unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_secs(30)));
    enqueue_n(&outbox, 20, |_| None);
    let relay = outbox
        .relay(
            fast(RelayConfig::http(receiver.url()))
                .workers(2)
                .shutdown_timeout(Duration::from_millis(500)),
        )
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() >= 1));
    let started = Instant::now();
    let report = relay.shutdown();
    let took = started.elapsed();
    // The bound: shutdown timeout plus the documented margin, far below the 5 s request
    // timeout and the 30 s hang.
    assert!(took < Duration::from_millis(3_000), "took {took:?}");
    assert!(report.abandoned >= 1, "{report:?}");
    assert!(report.released >= 1, "{report:?}");
    // Unstarted events were handed back: nothing is leased except the abandoned ones.
    let leased: i64 = outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM outbox_events WHERE lease_owner IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(leased as usize, report.abandoned);
}

#[test]
fn dropping_the_handle_stops_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("drop.db")).unwrap();
    let receiver = TestReceiver::ok();
    {
        let _relay = outbox
            .relay(fast(RelayConfig::http(receiver.url())))
            .start()
            .unwrap();
    }
    // With the relay gone, a new event stays pending.
    enqueue_n(&outbox, 1, |_| None);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.count(), 0);
    assert!(!rows(&outbox)[0].delivered);
}

#[test]
fn a_relay_gives_its_connection_back_to_the_pool_as_it_found_it() {
    // The writer runs on a smaller page cache than the pool's connections have; with one
    // pooled connection, the writer's is the one the app gets back afterwards.
    let receiver = TestReceiver::ok();
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .pool_size(1)
        .open(dir.path().join("cache.db"))
        .unwrap();
    let cache_size = |outbox: &Outbox| -> i64 {
        outbox
            .connection()
            .unwrap()
            .query_row("PRAGMA cache_size", [], |r| r.get(0))
            .unwrap()
    };
    let before = cache_size(&outbox);
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!({"n": 1}))))
        .unwrap();
    deliver_the_one_event(&outbox, &receiver);
    assert_eq!(cache_size(&outbox), before);
}

/// Runs a relay until `receiver` has the outbox's one event, then stops it.
fn deliver_the_one_event(outbox: &Outbox, receiver: &TestReceiver) {
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    let _ = relay.shutdown();
}

#[test]
fn a_poison_events_503_with_retry_after_holds_back_that_event_not_its_destination() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("poison.db")).unwrap();
    // The receiver chokes on one event only, and asks for 30 s each time.
    let receiver = TestReceiver::start(0, |r| {
        if r.body["type"] == "poison" {
            Reply::StatusHeader(503, "retry-after", "30".into())
        } else {
            Reply::Status(200)
        }
    });
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("poison", json!({}))))
        .unwrap();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() >= 1));
    for n in 0..20 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(n))))
            .unwrap();
    }
    // Before, its 503 paused the whole destination for 30 s: 0 of 20 in this time.
    let delivered = wait_until(Duration::from_secs(10), || delivered_count(&outbox) == 20);
    let _ = relay.shutdown();
    assert!(delivered, "{} of 20 delivered", delivered_count(&outbox));
    let poison = common::query_rows(
        &outbox,
        "SELECT attempts FROM outbox_events WHERE event_type = 'poison'",
        |r| r.get::<_, i64>(0),
    );
    assert_eq!(
        poison,
        [1],
        "the poison event waits its 30 s, with its attempt spent"
    );
}

/// The ids of the dead letters, in commit order.
fn dead_event_ids(outbox: &Outbox) -> Vec<String> {
    rows(outbox)
        .into_iter()
        .filter(|r| r.dead)
        .map(|r| r.event_id)
        .collect()
}

/// Issue 55, finding 4: in a batch of ten, one poison event the receiver cannot take makes
/// it fail the whole request (`reply`). Before, every event of the batch spent its attempts
/// with the poison one and all ten were dead; only the poison event may be.
fn only_the_poison_event_of_a_batch_is_dead(reply: fn() -> Reply) {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("poison.db")).unwrap();
    let ids = enqueue_n(&outbox, 10, |_| None);
    let poison = ids[3].clone();
    let receiver = {
        let poison = poison.clone();
        TestReceiver::start(0, move |r| {
            if r.ids.contains(&poison) {
                reply()
            } else {
                Reply::Status(200)
            }
        })
    };
    let destination =
        sqlite_outbox::Destination::http("default", receiver.url()).batch(10, 1 << 20);
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(destination)).max_attempts(3))
        .start()
        .unwrap();
    let settled = wait_until(PATIENCE, || {
        let stats = outbox.stats().unwrap();
        stats.pending == 0
    });
    let _ = relay.shutdown();
    assert!(settled, "{:?}", rows(&outbox));
    let dead = dead_event_ids(&outbox);
    assert_eq!(dead, [poison], "{:?}", rows(&outbox));
    assert_eq!(delivered_count(&outbox), 9);
}

#[test]
fn a_poison_event_answered_500_in_a_batch_takes_no_batch_mate_with_it() {
    only_the_poison_event_of_a_batch_is_dead(|| Reply::Status(500));
}

#[test]
fn a_poison_event_that_resets_the_connection_in_a_batch_takes_no_batch_mate_with_it() {
    only_the_poison_event_of_a_batch_is_dead(|| Reply::Reset);
}

#[test]
fn a_poison_event_answered_403_in_a_batch_takes_no_batch_mate_with_it() {
    only_the_poison_event_of_a_batch_is_dead(|| Reply::Status(403));
}

#[test]
fn an_event_whose_stored_data_is_not_json_takes_no_batch_mate_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("not-json.db")).unwrap();
    let ids = enqueue_n(&outbox, 10, |_| None);
    outbox
        .connection()
        .unwrap()
        .execute(
            "UPDATE outbox_events SET payload = '{oops' WHERE event_id = ?1",
            [&ids[3]],
        )
        .unwrap();
    let receiver = TestReceiver::ok();
    let destination =
        sqlite_outbox::Destination::http("default", receiver.url()).batch(10, 1 << 20);
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(destination)))
        .start()
        .unwrap();
    let settled = wait_until(PATIENCE, || outbox.stats().unwrap().pending == 0);
    let _ = relay.shutdown();
    assert!(settled, "{:?}", rows(&outbox));
    let dead = dead_event_ids(&outbox);
    assert_eq!(dead, [ids[3].clone()], "{:?}", rows(&outbox));
    assert_eq!(receiver.event_count(), 9);
}

/// Issue 55, finding 7: claims and the events in flight are bounded in bytes, not only in
/// count. 150 events of 200 KB to a receiver that holds each request 300 ms: before, one
/// claim leased 100 of them (20 MB) and up to 400 were in flight; now a claim takes at most
/// 4 MiB and a destination keeps at most 16 MiB in flight (plus one event).
#[test]
fn claims_and_events_in_flight_are_bounded_in_bytes() {
    const EVENT_BYTES: usize = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("large.db")).unwrap();
    let blob = "x".repeat(EVENT_BYTES - 2);
    outbox
        .transaction(|tx| {
            for _ in 0..150 {
                let _ = outbox.enqueue(tx, Event::new("t", json!(blob)))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_millis(300)));
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).workers(8))
        .start()
        .unwrap();
    let conn = outbox.connection().unwrap();
    let mut most_leased = 0i64;
    let done = wait_until(PATIENCE, || {
        let leased: i64 = conn
            .query_row(
                "SELECT count(*) FROM outbox_events
                  WHERE lease_owner IS NOT NULL AND delivered_at IS NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        most_leased = most_leased.max(leased);
        delivered_count(&outbox) == 150
    });
    let _ = relay.shutdown();
    assert!(done, "{} of 150 delivered", delivered_count(&outbox));
    let bound = (16 << 20) / EVENT_BYTES as i64 + 1;
    assert!(
        most_leased <= bound,
        "{most_leased} events of 200 KB leased at once; at most {bound}"
    );
    assert!(
        most_leased >= 8,
        "the workers were kept busy: {most_leased}"
    );
}
