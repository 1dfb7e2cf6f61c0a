//! Rate and bandwidth limits, seen from the receiver's clock: after a reconnect a backlog goes
//! out at one second's worth and then an even pace, not in a burst; bad limits are refused.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{fast, outbox_cli, wait_until, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn backlog(outbox: &Outbox, n: usize, data: serde_json::Value) {
    outbox
        .transaction(|tx| {
            for _ in 0..n {
                let _ = outbox.enqueue(tx, Event::new("reading", data.clone()))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

/// The most requests that arrived within any `window`.
fn busiest(arrivals: &[Instant], window: Duration) -> usize {
    arrivals
        .iter()
        .map(|start| {
            arrivals
                .iter()
                .filter(|t| **t >= *start && t.duration_since(*start) < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn a_rate_limit_lets_one_seconds_worth_through_then_paces_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("rate.db")).unwrap();
    backlog(&outbox, 30, json!({"n": 1}));
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()).rate_limit(10.0))
                .workers(4),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || receiver.count() >= 30));
    let _ = relay.shutdown();
    let arrivals: Vec<Instant> = receiver.received().iter().map(|r| r.at).collect();
    let spread = *arrivals.last().unwrap() - arrivals[0];
    // 10 at once, then 20 more at 10 a second: about two seconds, never a burst of 30.
    assert!(
        spread >= Duration::from_millis(1700),
        "30 requests within {spread:?}"
    );
    // After the first second's worth, no half second holds more than its share (5) and one
    // for the timing of the boundaries.
    let paced: Vec<Instant> = arrivals[10..].to_vec();
    assert!(
        busiest(&paced, Duration::from_millis(500)) <= 6,
        "{arrivals:?}"
    );
}

#[test]
fn a_bandwidth_limit_paces_request_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bw.db")).unwrap();
    // About 1 KiB per request.
    backlog(&outbox, 12, json!({"blob": "x".repeat(800)}));
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()).bandwidth_limit(4096))
                .workers(4),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || receiver.count() >= 12));
    let _ = relay.shutdown();
    let received = receiver.received();
    let bytes: usize = received.iter().map(|r| r.raw.len()).sum();
    let spread = received.last().unwrap().at - received[0].at;
    // One second's worth at once, the rest at 4 KiB/s.
    let floor = Duration::from_secs_f64((bytes as f64 - 4096.0) / 4096.0 * 0.85);
    assert!(
        spread >= floor,
        "{bytes} bytes within {spread:?} (floor {floor:?})"
    );
}

#[test]
fn bad_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.db");
    let outbox = Outbox::open(&db).unwrap();
    for destination in [
        Destination::http("default", "http://127.0.0.1:1/").rate_limit(0.0),
        Destination::http("default", "http://127.0.0.1:1/").rate_limit(-3.0),
        Destination::http("default", "http://127.0.0.1:1/").rate_limit(f64::NAN),
        Destination::http("default", "http://127.0.0.1:1/").bandwidth_limit(0),
    ] {
        let e = outbox
            .relay(RelayConfig::new().destination(destination))
            .start()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("out of range") || e.contains("sends nothing"),
            "{e}"
        );
    }
    for args in [
        vec!["--rate", "0"],
        vec!["--rate", "-5"],
        vec!["--bandwidth", "0"],
        vec!["--bandwidth", "-100"],
    ] {
        let mut all = vec!["relay", "--url", "http://127.0.0.1:1/", "--until-empty"];
        all.extend(args.iter().copied());
        let o = outbox_cli(&db, &all);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("out of range"),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn a_429_retry_after_still_wins_over_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("429.db")).unwrap();
    backlog(&outbox, 3, json!({"n": 1}));
    // The first request is told to wait a second; the rate alone would allow 100 a second.
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let receiver = TestReceiver::start(0, move |_| {
        if answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            common::Reply::StatusHeader(429, "retry-after", "1".into())
        } else {
            common::Reply::Status(200)
        }
    });
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()).rate_limit(100.0))
                .workers(1),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || receiver.count() >= 4));
    let _ = relay.shutdown();
    let arrivals: Vec<Instant> = receiver.received().iter().map(|r| r.at).collect();
    let waited = arrivals[1] - arrivals[0];
    assert!(
        waited >= Duration::from_millis(900),
        "the 429 asked for 1 s; waited {waited:?}"
    );
}

/// Issue 38, item 1: a paced lane never claims more than its pacer lets out well within a
/// lease, so a backlog far larger than a lease's worth goes out at the rate, none twice, and
/// none handed back over and over unsent.
#[test]
fn a_paced_backlog_larger_than_a_lease_goes_out_at_its_rate_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("paced.db")).unwrap();
    backlog(&outbox, 600, json!({"n": 1}));
    let receiver = TestReceiver::ok();
    let started = Instant::now();
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(
                    Destination::http("default", receiver.url())
                        .rate_limit(40.0)
                        .http_config(
                            sqlite_outbox::transport::HttpConfig::new()
                                .connect_timeout(Duration::from_millis(500))
                                .request_timeout(Duration::from_secs(1)),
                        ),
                )
                .lease(Duration::from_secs(3))
                .workers(4),
        )
        .start()
        .unwrap();
    // 600 at 40 a second: 15 s, five times the lease's worth (the test ran 600 at 10 a
    // second under a 10 s lease, a minute of CI, before). Before the fix the lane queued
    // its whole in-flight limit, jobs outwaited half their lease and went back unsent, and
    // the delivered count stopped rising for good.
    let all_in = wait_until(Duration::from_secs(120), || {
        outbox.stats().map(|s| s.pending == 0).unwrap_or(false)
    });
    let took = started.elapsed();
    let _ = relay.shutdown();
    let stats = outbox.stats().unwrap();
    assert!(all_in, "not all delivered in 120 s: {stats:?}");
    let ids = receiver.event_ids();
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), 600, "every event arrived");
    assert_eq!(ids.len(), 600, "no event arrived twice");
    // The rate held: 600 at 40 a second, one second's worth at once, cannot take under
    // 14 s.
    assert!(
        took >= Duration::from_secs(13),
        "600 paced events in {took:?}"
    );
}
