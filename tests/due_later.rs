//! Rows that fall due later (another relay's retry, a row written with a later due time)
//! wake the relay when they fall due, not at its poll: the poll here is a minute.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{fast, Reply, TestReceiver};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const POLL: Duration = Duration::from_secs(60);

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

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
        sqlite_outbox::rusqlite::params![unix_ms() + after.as_millis() as i64, event_type],
    )
    .unwrap();
    tx.commit().unwrap();
    outbox.notify();
}

fn config(receiver: &TestReceiver) -> RelayConfig {
    fast(RelayConfig::new())
        .destination(Destination::http("default", receiver.url()))
        .poll_interval(POLL)
        .workers(2)
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
    assert!(common::wait_until(Duration::from_secs(10), || receiver
        .count()
        == 1));
    let took = receiver.received()[0].at - written;
    assert!(
        took >= due_in - Duration::from_millis(20),
        "sent early: {took:?}"
    );
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
    outbox
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
    assert!(common::wait_until(Duration::from_secs(10), || receiver
        .count()
        == 2));
    let took = receiver.received()[1].at - written;
    assert!(
        took >= due_in - Duration::from_millis(20),
        "sent early: {took:?}"
    );
    assert!(
        took < due_in + Duration::from_millis(500),
        "sent {took:?} after it was written, due after {due_in:?}: it waited for the slow \
         request's answer"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}
