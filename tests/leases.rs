//! Leases across relays: takeover after expiry, fencing of stale owners, two relays on one file.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{delivered_count, fast, rows, wait_until, TestReceiver, PATIENCE};
use crossbeam_channel::bounded;
use serde_json::json;
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::transport::{Attempt, OutboundEvent};
use sqlite_outbox::{Event, Outbox, RelayConfig};

fn accepted() -> Attempt {
    Attempt::Answered {
        status: 200,
        retry_after: None,
        detail: String::new(),
    }
}

#[test]
fn an_expired_lease_is_taken_over_and_the_stale_owners_ack_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease.db");
    let clock = ManualClock::new(1_700_000_000_000);
    let outbox_a = Outbox::builder().clock(clock.clone()).open(&path).unwrap();
    let outbox_b = Outbox::builder().clock(clock.clone()).open(&path).unwrap();
    let event_id = outbox_a
        .transaction(|tx| outbox_a.enqueue(tx, Event::new("t", json!(1))))
        .unwrap()
        .event_id()
        .to_string();

    // Relay A claims the event, then stalls inside the send (as if paused or partitioned).
    let (entered_tx, entered_rx) = bounded::<()>(1);
    let (release_tx, release_rx) = bounded::<()>(1);
    let relay_a = outbox_a
        .relay(
            RelayConfig::transport(move |_: &[OutboundEvent]| {
                let _ = entered_tx.send(());
                let _ = release_rx.recv_timeout(PATIENCE);
                accepted()
            })
            .name("relay-a")
            .lease(Duration::from_secs(10))
            // A looks for work only when told: polling, it would see its own lease run out
            // when the clock moves and claim the event again (its worker still stuck in the
            // send) before B started, whenever B started slowly (7 runs in 24 with 8 runs at
            // once), and B would have nothing to take over.
            .poll_interval(Duration::from_secs(3600)),
        )
        .start()
        .unwrap();
    entered_rx.recv_timeout(PATIENCE).expect("relay A sends");

    // Its lease runs out; relay B takes the event over and delivers it.
    clock.advance_ms(10_001);
    let b_sent = Arc::new(AtomicUsize::new(0));
    let b_count = b_sent.clone();
    let relay_b = outbox_b
        .relay(
            RelayConfig::transport(move |_: &[OutboundEvent]| {
                b_count.fetch_add(1, Ordering::SeqCst);
                accepted()
            })
            .name("relay-b")
            .poll_interval(Duration::from_millis(10)),
        )
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox_b) == 1));
    assert_eq!(b_sent.load(Ordering::SeqCst), 1);

    // A finally finishes: its write-back names a lease that is no longer its own.
    release_tx.send(()).unwrap();
    assert!(wait_until(PATIENCE, || relay_a.stats().lease_lost == 1));
    assert_eq!(relay_a.stats().delivered, 0);
    let _ = relay_a.shutdown();
    let _ = relay_b.shutdown();
    let row = rows(&outbox_b).remove(0);
    assert_eq!(row.event_id, event_id);
    assert!(row.delivered);
    assert_eq!(row.attempts, 1, "only B's outcome was recorded");
}

#[test]
fn two_relays_on_one_file_deliver_every_event_and_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.db");
    let outbox_a = Outbox::open(&path).unwrap();
    let outbox_b = Outbox::open(&path).unwrap();
    let receiver = TestReceiver::ok();
    let relay_a = outbox_a
        .relay(
            fast(RelayConfig::http(receiver.url()))
                .name("a")
                .claim_batch(10),
        )
        .start()
        .unwrap();
    let relay_b = outbox_b
        .relay(
            fast(RelayConfig::http(receiver.url()))
                .name("b")
                .claim_batch(10),
        )
        .start()
        .unwrap();
    // Both handles write, so both relays are woken by commits.
    for i in 0..400 {
        let outbox = if i % 2 == 0 { &outbox_a } else { &outbox_b };
        let event = Event::new("t", json!(i)).partition_key(format!("k{}", i % 7));
        let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
    }
    assert!(wait_until(PATIENCE, || delivered_count(&outbox_a) == 400));
    let (a, b) = (relay_a.shutdown(), relay_b.shutdown());
    assert_eq!((a.abandoned, b.abandoned), (0, 0));

    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in receiver.received() {
        *per_id.entry(r.event_id).or_default() += 1;
    }
    assert_eq!(per_id.len(), 400);
    let twice: Vec<_> = per_id.iter().filter(|(_, &n)| n > 1).collect();
    if !twice.is_empty() {
        let conn = outbox_a.connection().unwrap();
        for (id, _) in &twice {
            let info: (i64, i64, Option<String>) = conn
                .query_row(
                    "SELECT id, attempts, last_error FROM outbox_events WHERE event_id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .unwrap();
            eprintln!("twice: {id} {info:?}");
        }
    }
    assert!(per_id.values().all(|&n| n == 1), "an event arrived twice");
}

#[test]
fn two_starts_under_one_relay_name_never_share_a_lease_owner() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("names.db")).unwrap();
    let owner_of_first_claim = || {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
            .unwrap();
        // The transport hands the event's lease owner out and never answers in time.
        let (tx, rx) = bounded::<String>(1);
        let relay = outbox
            .relay(
                fast(RelayConfig::transport(move |events: &[OutboundEvent]| {
                    let _ = tx.try_send(events[0].lease_owner.clone());
                    std::thread::sleep(Duration::from_millis(50));
                    Attempt::Unreachable {
                        reason: "down".into(),
                    }
                }))
                .name("edge-relay"),
            )
            .start()
            .unwrap();
        let owner = rx.recv_timeout(PATIENCE).unwrap();
        let _ = relay.shutdown();
        owner
    };
    let first = owner_of_first_claim();
    let second = owner_of_first_claim();
    assert!(first.starts_with("edge-relay:"), "{first}");
    assert_ne!(
        first, second,
        "a restart with the same name must not reuse owners"
    );
}

#[test]
fn outcomes_the_app_keeps_from_being_written_at_shutdown_are_written_once_it_lets_go() {
    // Issue 67, item 9: answers come back while the app holds the write lock past the busy
    // timeout, and the relay is shut down meanwhile. Before, the outcomes whose write failed
    // were dropped at shutdown (the summary said nothing was left) and every event went out
    // again on the next run; now they are written again until the shutdown's deadline.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.db");
    let outbox = sqlite_outbox::Outbox::builder()
        .busy_timeout(std::time::Duration::from_millis(200))
        .open(&path)
        .unwrap();
    for i in 0..5 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(i))))
            .unwrap();
    }
    let receiver = common::TestReceiver::start(0, |_| {
        common::Reply::Hang(std::time::Duration::from_millis(1500))
    });
    let relay = outbox
        .relay(
            common::fast(sqlite_outbox::RelayConfig::http(receiver.url()))
                .workers(5)
                .shutdown_timeout(std::time::Duration::from_secs(5)),
        )
        .start()
        .unwrap();
    assert!(common::wait_until(common::PATIENCE, || receiver.count() == 5));
    let mut app = sqlite_outbox::rusqlite::Connection::open(&path).unwrap();
    let hold = app
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let stopping = std::thread::spawn(move || relay.shutdown());
    // The answers come while the lock is held; it is let go well before the deadline.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    hold.rollback().unwrap();
    let report = stopping.join().unwrap();
    assert_eq!(report.unrecorded, 0, "{report:?}");
    let rows = common::rows(&outbox);
    assert!(rows.iter().all(|r| r.delivered), "{rows:?}");
}
