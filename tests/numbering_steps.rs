//! Stream numbers in bounded steps (issue 65, item 6): a backlog committed while no relay
//! claimed is numbered in steps of 500 rows down to at most 10,000, never all at once
//! inside the claim that takes an urgent event behind it. Its own test binary: the step is
//! counted for the whole process.

mod common;

use std::time::Duration;

use common::{Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Error, Event, Outbox};

#[test]
fn an_urgent_event_behind_an_unnumbered_backlog_is_claimed_after_bounded_numbering_steps() {
    const BACKLOG: usize = 25_000;
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    // Weeks offline: the backlog waits, not numbered (no relay claimed).
    outbox
        .transaction(|tx| {
            let events: Vec<Event> = (0..BACKLOG)
                .map(|i| Event::new("telemetry.temp", json!({"i": i})))
                .collect();
            outbox.enqueue_many(tx, events)?;
            Ok::<_, Error>(())
        })
        .unwrap();
    let urgent = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("alarm.raised", json!({"door": "open"}))
                    .priority(Event::URGENT_PRIORITY),
            )
        })
        .unwrap()
        .event_id()
        .to_string();
    let unnumbered = common::query_rows(
        &outbox,
        "SELECT COUNT(*) FROM outbox_events WHERE stream_seq IS NULL",
        |r| r.get::<_, i64>(0),
    );
    assert_eq!(unnumbered, vec![BACKLOG as i64 + 1]);
    assert_eq!(sqlite_outbox::internal::largest_numbering_step(), 0);
    let relay = common::relay_over_http(
        &outbox,
        &receiver.url(),
        sqlite_outbox::transport::HttpConfig::new(),
        4,
    );
    assert!(common::wait_until(Duration::from_secs(30), || {
        receiver
            .received()
            .iter()
            .any(|r| r.body["type"] == "alarm.raised")
    }));
    let _ = relay.shutdown();
    let alarm = receiver
        .received()
        .into_iter()
        .find(|r| r.body["type"] == "alarm.raised")
        .unwrap();
    // Its number is the one its commit fixed, behind the whole backlog...
    assert_eq!(alarm.body["outboxseq"], json!(BACKLOG as i64 + 1));
    assert_eq!(alarm.body["id"], json!(urgent));
    // ...and no transaction numbered more than a step (and the rows committed meanwhile:
    // none here).
    let largest = sqlite_outbox::internal::largest_numbering_step();
    assert!(
        largest > 0 && largest <= 10_000,
        "one transaction numbered {largest} rows"
    );
}
