//! While a relay delivers (a backlog here) its WAL watch is paused, so its own claims and
//! acks do not wake the watcher's thread on every commit; once caught up the watch is back,
//! and another process's commit is delivered without waiting for the poll. Alone in its test binary, so
//! no other test's watcher thread is counted.
#![cfg(all(target_os = "linux", feature = "wal-watch"))]

mod common;

use std::time::Duration;

use common::TestReceiver;
use sqlite_outbox::{Event, Outbox};

/// The WAL watch's thread's wake-ups so far (the `notify` crate's inotify loop).
fn watcher_wake_ups() -> u64 {
    common::voluntary_switches(&["notify-rs"]).values().sum()
}

#[test]
fn the_watch_sleeps_through_a_drain_and_wakes_the_relay_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("drain.db");
    let outbox = Outbox::open(&db).unwrap();
    let backlog = 3_000;
    outbox
        .transaction(|tx| {
            for n in 0..backlog {
                let _ = outbox.enqueue(tx, Event::new("t", serde_json::json!({ "n": n })))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let receiver = TestReceiver::ok();
    // A poll of a minute: after the drain, only the watch can bring the last event out.
    let relay = outbox
        .relay(common::minute_poll(&receiver))
        .start()
        .unwrap();
    let before = watcher_wake_ups();
    assert!(common::wait_until(Duration::from_secs(60), || {
        relay.stats().delivered == backlog
    }));
    let woke = watcher_wake_ups() - before;
    // Unpaused, every ack transaction of the drain (hundreds) woke the watcher's thread.
    // Paused, it wakes a few times, or about twenty when the first claims and acks land
    // before the first request pauses it (2 to 5, or 13 to 22, seen at e08a51d and since).
    assert!(
        woke <= 40,
        "the WAL watch's thread woke {woke} times while the relay drained {backlog} events"
    );
    // Caught up: the watch is back.
    std::thread::sleep(Duration::from_millis(300));
    common::insert_from_python(&db, "after.drain", "{}");
    assert!(
        common::wait_until(Duration::from_secs(5), || relay.stats().delivered
            == backlog + 1),
        "the event committed by another process after the drain waited for the poll (60 s)"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}
