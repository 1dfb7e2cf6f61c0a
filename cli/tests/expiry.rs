//! Expiry: an event not delivered by its deadline leaves pending as expired (counted,
//! listed, announced), is never sent, and lets its key's next event go; one in flight is
//! never expired under it; bad lifetimes are refused.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{closed_port, fast, outbox_cli, wait_until, Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::admin::State;
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::notices::DeliveryOutcome;
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig};

#[test]
fn events_past_their_deadline_expire_unsent_and_unpark_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .expiry_for("telemetry.*", Duration::from_millis(300))
        .open(dir.path().join("e.db"))
        .unwrap();
    let notices = outbox.subscribe();
    let (mut head, mut next, mut loose) = (String::new(), String::new(), String::new());
    outbox
        .transaction(|tx| {
            head = outbox
                .enqueue(
                    tx,
                    Event::new("door.state", json!({"open": true}))
                        .partition_key("door-1")
                        .expires_in(Duration::from_millis(300)),
                )?
                .event_id()
                .to_string();
            next = outbox
                .enqueue(
                    tx,
                    Event::new("door.state", json!({"open": false})).partition_key("door-1"),
                )?
                .event_id()
                .to_string();
            // The type's default lifetime.
            loose = outbox
                .enqueue(tx, Event::new("telemetry.temp", json!({"c": 21})))?
                .event_id()
                .to_string();
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // The receiver is down past the deadlines, then comes up.
    let port = closed_port();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http(
            "default",
            format!("http://127.0.0.1:{port}/events"),
        )))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || outbox
        .stats()
        .unwrap()
        .expired
        == 2));
    let receiver = TestReceiver::start(port, |_| Reply::Status(200));
    assert!(wait_until(Duration::from_secs(20), || receiver
        .event_count()
        >= 1));
    std::thread::sleep(Duration::from_millis(300));
    let _ = relay.shutdown();
    assert_eq!(
        receiver.event_ids(),
        vec![next.clone()],
        "only the unexpired event went out"
    );
    assert_eq!(outbox.status(&head).unwrap()[0].state, State::Expired);
    assert_eq!(outbox.status(&loose).unwrap()[0].state, State::Expired);
    assert_eq!(outbox.status(&next).unwrap()[0].state, State::Delivered);
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.expired, stats.dead, stats.pending), (2, 0, 0));
    let listed = outbox.list(Some(State::Expired), 10).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        outbox.list(Some(State::Dead), 10).unwrap().is_empty(),
        "expired is not dead"
    );
    let mut expired_notices: Vec<String> = notices
        .try_iter()
        .filter(|n| n.outcome == DeliveryOutcome::Expired)
        .map(|n| n.event_id)
        .collect();
    expired_notices.sort();
    let mut expected = vec![head, loose];
    expected.sort();
    assert_eq!(expired_notices, expected);
}

#[test]
fn a_delivery_in_flight_is_never_expired_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("f.db")).unwrap();
    let _ = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("t", json!({})).expires_in(Duration::from_millis(200)),
            )
        })
        .unwrap();
    // The receiver takes far longer than the lifetime to answer.
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_millis(900)));
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || outbox
        .stats()
        .unwrap()
        .delivered
        == 1));
    let _ = relay.shutdown();
    assert_eq!(outbox.stats().unwrap().expired, 0);
    assert_eq!(receiver.event_count(), 1);
}

#[test]
fn a_claim_never_takes_an_event_past_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("c.db"))
        .unwrap();
    let _ = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("t", json!({})).expires_in(Duration::from_secs(1)),
            )
        })
        .unwrap();
    clock.advance_ms(2_000);
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || outbox
        .stats()
        .unwrap()
        .expired
        == 1));
    let _ = relay.shutdown();
    assert_eq!(receiver.event_count(), 0);
}

#[test]
fn zero_and_negative_lifetimes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.db");
    let outbox = Outbox::open(&db).unwrap();
    let result = outbox.transaction(|tx| {
        let e = outbox
            .enqueue(tx, Event::new("t", json!({})).expires_in(Duration::ZERO))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidExpiry { .. }), "{e}");
        outbox.enqueue(tx, Event::new("t", json!({})))
    });
    assert!(result.is_ok(), "the transaction stays usable");
    assert!(Outbox::builder()
        .expiry_for("x", Duration::ZERO)
        .open(dir.path().join("other.db"))
        .is_err());
    for args in [
        vec!["enqueue", "--type", "t", "--expires-in", "0s"],
        vec!["enqueue", "--type", "t", "--expires-in", "-5s"],
    ] {
        let o = outbox_cli(&db, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not an expiry"),
            "{args:?}"
        );
    }
    let o = outbox_cli(&db, &["enqueue", "--type", "t", "--expires-in", "1h"]);
    assert!(o.status.success());
    let o = outbox_cli(&db, &["list", "--state", "expired"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // --jsonl: a line's own "expires_in", else the flag's; a zero one stops at its line.
    let o = common::outbox_cli_with_stdin(
        &db,
        &["enqueue", "--jsonl", "--expires-in", "2h"],
        b"{\"type\":\"a\",\"expires_in\":\"30s\"}\n{\"type\":\"b\"}\n{\"type\":\"c\",\"expires_in\":\"0s\"}\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 3"));
    let conn = outbox.connection().unwrap();
    let lifetimes: Vec<i64> = conn
        .prepare("SELECT expires_at - created_at FROM outbox_events WHERE event_type IN ('a', 'b') ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(lifetimes, vec![30_000, 7_200_000]);
}

/// Issue 38, item 11: `retry` brings back dead letters and hurries pending events, but
/// leaves expired and exported events alone (an expired one is past its deadline, an
/// exported one travels in a bundle): neither is sent again.
#[test]
fn retry_leaves_expired_and_exported_events_alone() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("r.db")).unwrap();
    let mut ids = Vec::new();
    outbox
        .transaction(|tx| {
            let short = Event::new("t", json!(1)).expires_in(Duration::from_millis(200));
            ids.push(outbox.enqueue(tx, short)?.event_id().to_string());
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // Expired by a relay's sweep while its receiver is down.
    let port = closed_port();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http(
            "default",
            format!("http://127.0.0.1:{port}/events"),
        )))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || outbox
        .stats()
        .is_ok_and(|s| s.expired == 1)));
    let _ = relay.shutdown();
    outbox
        .transaction(|tx| {
            ids.push(
                outbox
                    .enqueue(tx, Event::new("t", json!(2)))?
                    .event_id()
                    .to_string(),
            );
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let secret =
        sqlite_outbox::receive::Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    let report = outbox
        .export(&dir.path().join("b.bundle"), &secret, "default", 10)
        .unwrap();
    assert_eq!(report.count, 1);
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(outbox.retry(&id_refs).unwrap(), 0, "nothing to retry");
    assert_eq!(outbox.status(&ids[0]).unwrap()[0].state, State::Expired);
    assert_eq!(outbox.status(&ids[1]).unwrap()[0].state, State::Exported);
    assert_eq!(outbox.stats().unwrap().pending, 0);
}
