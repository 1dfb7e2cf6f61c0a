//! An app transaction holds SQLite's write lock longer than the busy timeout just as the
//! relay writes its acks: the outcomes are kept and written once the lock is free, so no
//! delivered event is sent again. (Its own test binary: the busy timeout is process-wide.)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use crossbeam_channel::bounded;
use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const EVENTS: usize = 40;

#[test]
fn acks_that_cannot_be_written_behind_a_long_app_transaction_are_kept_not_resent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("acks.db");
    let outbox = Outbox::builder()
        .busy_timeout(Duration::from_millis(200))
        .open(&db)
        .unwrap();
    for n in 0..EVENTS {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!(n))))
            .unwrap();
    }
    // On the first request, another connection takes the write lock for 1.5 s (seven busy
    // timeouts) before the receiver answers: the relay's ack write then fails.
    let (locked_tx, locked_rx) = bounded::<()>(1);
    let first = Arc::new(AtomicBool::new(true));
    let lock_db = db.clone();
    let holder = std::thread::spawn(move || {
        let conn = Connection::open(&lock_db).unwrap();
        // Wait for the signal, then hold the lock.
        let go = locked_rx.recv_timeout(PATIENCE).is_ok();
        if go {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_rx.recv_timeout(Duration::from_millis(1_500)).ok();
            conn.execute_batch("COMMIT").unwrap();
        }
    });
    let signal = locked_tx.clone();
    let receiver = TestReceiver::start(0, move |_| {
        if first.swap(false, Ordering::SeqCst) {
            let _ = signal.send(());
            std::thread::sleep(Duration::from_millis(100)); // the lock is taken by now
        }
        Reply::Status(200)
    });
    let http = HttpConfig::new().request_timeout(Duration::from_secs(1));
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(
                    Destination::http(Destination::DEFAULT, receiver.url()).http_config(http),
                )
                // Short leases: were the outcomes dropped, the events would be claimed and
                // sent again within the test.
                .lease(Duration::from_secs(3)),
        )
        .start()
        .unwrap();
    let all = wait_until(PATIENCE, || delivered_count(&outbox) == EVENTS as i64);
    // Past the leases, to see any resend.
    std::thread::sleep(Duration::from_secs(4));
    let _ = relay.shutdown();
    drop(locked_tx);
    holder.join().unwrap();
    assert!(all, "{:?}", rows(&outbox));
    let resent: Vec<_> = receiver
        .received()
        .into_iter()
        .filter(|r| r.earlier > 0)
        .collect();
    assert!(resent.is_empty(), "{} events sent twice", resent.len());
    assert_eq!(receiver.count(), EVENTS);
}
