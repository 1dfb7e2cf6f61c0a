//! A receiver whose own backend is down (its store restarting, a load balancer with no
//! healthy upstream) answers 503 to everything: once three answers in a row for different
//! events said so, the destination is treated as down, as when it cannot be reached, and
//! its events wait without spending attempts; nothing is dead-lettered however long it lasts.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{rows, wait_until, Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Event, Outbox};

const EVENTS: usize = 20;

#[test]
fn a_receiver_answering_503_for_30_s_dead_letters_nothing_and_gets_everything_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.db");
    let outbox = Outbox::open(&db).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..EVENTS {
                let _ = outbox.enqueue(tx, Event::new("reading", json!({ "i": i })))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let outage_ends = Instant::now() + Duration::from_secs(30);
    let receiver = TestReceiver::start(0, move |_| {
        if Instant::now() < outage_ends {
            Reply::Status(503)
        } else {
            Reply::Status(204)
        }
    });
    let mut relay = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["relay", "--url", &receiver.url(), "--max-attempts", "3"])
        .env_remove("OUTBOX_DB")
        .env_remove("OUTBOX_SECRET")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let delivered = wait_until(Duration::from_secs(150), || {
        outbox
            .stats()
            .map(|s| s.delivered == EVENTS as i64 || s.dead > 0)
            .unwrap_or(false)
    });
    let _ = relay.kill();
    let _ = relay.wait();
    let stats = outbox.stats().unwrap();
    let rows = rows(&outbox);
    assert!(delivered, "not all delivered after the outage: {stats:?}");
    assert_eq!(stats.dead, 0, "nothing dead-lettered: {rows:?}");
    // Each delivery is an attempt; beyond those, only the three answers that judged the
    // destination down spent one.
    let attempts: i64 = rows.iter().map(|r| r.attempts).sum();
    assert!(
        attempts <= EVENTS as i64 + 3,
        "{} attempts spent on 503s: {rows:?}",
        attempts - EVENTS as i64
    );
    // It was probed all along, not given up on.
    let sick_answers = receiver
        .received()
        .iter()
        .filter(|r| r.at < outage_ends)
        .count();
    assert!(
        sick_answers > 3,
        "{sick_answers} requests during the outage"
    );
}
