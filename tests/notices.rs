//! Outcomes back to the app: a notice per delivered or dead event from the relays of this
//! process, a subscriber that falls behind losing notices (counted) without slowing the
//! relay, and `status` answering from the file whatever was lost.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{fast, Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::admin::State;
use sqlite_outbox::notices::{DeliveryOutcome, NOTICE_CAPACITY};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

#[test]
fn delivered_and_dead_events_are_announced_and_status_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("n.db")).unwrap();
    let notices = outbox.subscribe();
    let mut ids = Vec::new();
    let mut poison = String::new();
    outbox
        .transaction(|tx| {
            for i in 0..20 {
                ids.push(
                    outbox
                        .enqueue(tx, Event::new("t", json!({"i": i})))?
                        .event_id()
                        .to_string(),
                );
            }
            poison = outbox
                .enqueue(tx, Event::new("t", json!({"poison": true})))?
                .event_id()
                .to_string();
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // The receiver refuses the poison event for good (400: dead at once).
    let receiver = TestReceiver::start(0, |r| {
        if r.body["data"]["poison"] == json!(true) {
            Reply::Status(400)
        } else {
            Reply::Status(200)
        }
    });
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    let mut delivered = HashSet::new();
    let mut dead = Vec::new();
    while delivered.len() + dead.len() < 21 {
        let notice = notices
            .recv_timeout(Duration::from_secs(30))
            .expect("a notice for every event");
        assert_eq!(notice.destination, "default");
        assert!(notice.at_ms > 0);
        match notice.outcome {
            DeliveryOutcome::Delivered => assert!(delivered.insert(notice.event_id)),
            DeliveryOutcome::Dead { error } => dead.push((notice.event_id, error)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let _ = relay.shutdown();
    assert_eq!(delivered, ids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, poison);
    assert!(dead[0].1.contains("400"), "{}", dead[0].1);
    assert_eq!(outbox.lost_notices(), 0);
    let status = outbox.status(&ids[0]).unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].state, State::Delivered);
    assert!(status[0].at_ms.is_some());
    assert_eq!(outbox.status(&poison).unwrap()[0].state, State::Dead);
    assert!(outbox.status("no-such-event").unwrap().is_empty());
}

#[test]
fn a_subscriber_that_never_reads_loses_notices_and_never_slows_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("slow.db")).unwrap();
    let n = NOTICE_CAPACITY + 500;
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let _ = outbox.enqueue(tx, Event::new("t", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let unread = outbox.subscribe();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()).batch(100, 1 << 20)),
        )
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(60)
    ));
    let _ = relay.shutdown();
    assert_eq!(unread.len(), NOTICE_CAPACITY);
    assert_eq!(outbox.lost_notices(), 500);
    // A dropped receiver is forgotten: nothing more is counted as lost for it.
    drop(unread);
    let next = outbox.subscribe();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!({}))))
        .unwrap();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    let notice = next.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(notice.outcome, DeliveryOutcome::Delivered);
    let _ = relay.shutdown();
    assert_eq!(outbox.lost_notices(), 500);
}
