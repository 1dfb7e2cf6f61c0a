//! Rows that fall due later (another relay's retry, a row written with a later due time)
//! wake the relay when they fall due, not at its poll: the poll here is a minute.

mod common;

use std::time::{Duration, Instant};

use common::{Reply, TestReceiver};
use sqlite_outbox::{Event, Outbox, RelayConfig};

/// Writes an event of `event_type` due `after` from now, as another relay's retry leaves
/// one: through a connection of its own, then wakes the relay of this process as an app
/// committing on its own connection does.
fn write_due_later(outbox: &Outbox, path: &std::path::Path, event_type: &str, after: Duration) {
    let mut conn = sqlite_outbox::rusqlite::Connection::open(path).unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute(
        "INSERT INTO outbox_enqueue (type, data) VALUES (?1, '{}')",
        [event_type],
    )
    .unwrap();
    tx.execute(
        "UPDATE outbox_events SET available_at = ?1 WHERE event_type = ?2",
        sqlite_outbox::rusqlite::params![outbox.now_ms() + after.as_millis() as i64, event_type],
    )
    .unwrap();
    tx.commit().unwrap();
    outbox.notify();
}

/// How long after `written` the receiver got its `nth` request (counting from 1), which
/// carries the row due `due_in` after it was written: never before.
fn sent_after(receiver: &TestReceiver, nth: usize, written: Instant, due_in: Duration) -> Duration {
    assert!(common::wait_until(Duration::from_secs(10), || receiver
        .count()
        >= nth));
    let took = receiver.received()[nth - 1].at - written;
    assert!(
        took >= due_in - Duration::from_millis(20),
        "sent early: {took:?}, due after {due_in:?}"
    );
    took
}

fn config(receiver: &TestReceiver) -> RelayConfig {
    common::minute_poll(receiver).workers(2)
}

#[test]
fn a_row_due_later_is_sent_when_it_falls_due() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("due.db");
    let outbox = Outbox::open(&path).unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox.relay(config(&receiver)).start().unwrap();
    let due_in = Duration::from_millis(1500);
    let written = Instant::now();
    write_due_later(&outbox, &path, "later", due_in);
    let took = sent_after(&receiver, 1, written, due_in);
    // Without the timer, the next look would be the minute's poll.
    assert!(
        took < due_in + Duration::from_millis(500),
        "sent late: {took:?}"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}

#[test]
fn a_row_falling_due_while_a_request_is_out_is_sent_without_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let outbox = Outbox::open(&path).unwrap();
    let hold = Duration::from_secs(4);
    let receiver = TestReceiver::start(0, move |r| {
        if r.body["type"] == "slow" {
            Reply::Hang(hold)
        } else {
            Reply::Status(200)
        }
    });
    let relay = outbox.relay(config(&receiver)).start().unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("slow", serde_json::json!({}))))
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(10), || receiver
        .count()
        == 1));
    // The slow request is out (held for 4 s) when the row due later is written, so the
    // relay reads its due time within a tenth of a second rather than after the answer.
    let due_in = Duration::from_millis(500);
    let written = Instant::now();
    write_due_later(&outbox, &path, "later", due_in);
    let took = sent_after(&receiver, 2, written, due_in);
    assert!(
        took < due_in + Duration::from_millis(500),
        "sent {took:?} after it was written, due after {due_in:?}: it waited for the slow \
         request's answer"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}
