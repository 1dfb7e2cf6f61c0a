//! `Outbox::deliver_pending`: what is pending goes out within a deadline, as a phone's
//! background task or a desktop app about to quit needs, whether the receiver is up, down
//! or too slow for the time given (issue 57, item 4).

mod common;

use std::time::{Duration, Instant};

use common::{closed_port, fast, rows, Reply, TestReceiver};
use sqlite_outbox::{Destination, DrainEnd, Outbox, RelayConfig};

fn outbox_with(dir: &std::path::Path, n: usize) -> Outbox {
    common::outbox_with_events(&dir.join("phone.db"), "note.saved", n)
}

/// Test settings (5 s a request) with the shortest lease they allow: an event whose
/// request was still out when a drain stopped comes back to the next one within it.
fn to(url: String) -> RelayConfig {
    fast(RelayConfig::new().destination(Destination::http("default", url)))
        .lease(Duration::from_secs(10))
}

#[test]
fn a_receiver_that_is_up_gets_everything_and_the_drain_returns_as_soon_as_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = outbox_with(dir.path(), 50);
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let started = Instant::now();
    let report = outbox
        .deliver_pending(to(receiver.url()), started + Duration::from_secs(30))
        .unwrap();
    let took = started.elapsed();
    assert_eq!(report.ended, DrainEnd::Empty, "{report:?}");
    assert_eq!((report.delivered, report.dead, report.pending), (50, 0, 0));
    assert_eq!(report.last_error, None);
    assert!(took < Duration::from_secs(10), "returned at once: {took:?}");
    assert_eq!(receiver.count(), 50);
}

#[test]
fn a_receiver_that_is_down_costs_nothing_and_the_drain_returns_by_its_deadline_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = outbox_with(dir.path(), 20);
    let url = format!("http://127.0.0.1:{}/in", closed_port());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(2);
    let report = outbox.deliver_pending(to(url), deadline).unwrap();
    let late = Instant::now().saturating_duration_since(deadline);
    assert_eq!(report.ended, DrainEnd::Deadline, "{report:?}");
    assert_eq!((report.delivered, report.dead, report.pending), (0, 0, 20));
    assert!(
        report
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("unreachable")),
        "{report:?}"
    );
    assert!(
        late < Duration::from_millis(500),
        "{late:?} past the deadline"
    );
    assert!(rows(&outbox).iter().all(|r| r.attempts == 0));
}

#[test]
fn a_receiver_too_slow_for_the_time_given_keeps_its_events_for_the_next_drain() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = outbox_with(dir.path(), 10);
    // Each request held 4 s: longer than the 3 s the system gave.
    let slow = TestReceiver::start(0, |_| Reply::Hang(Duration::from_secs(4)));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3);
    let report = outbox.deliver_pending(to(slow.url()), deadline).unwrap();
    let late = Instant::now().saturating_duration_since(deadline);
    assert_eq!(report.ended, DrainEnd::Deadline, "{report:?}");
    assert_eq!(report.pending, 10, "{report:?}");
    assert!(
        late < Duration::from_millis(500),
        "{late:?} past the deadline"
    );
    drop(slow);
    // The next slot, with the receiver quick again: every event goes (those whose request
    // was out when the first drain stopped once their lease has run out).
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let report = outbox
        .deliver_pending(to(receiver.url()), Instant::now() + Duration::from_secs(60))
        .unwrap();
    assert_eq!(report.ended, DrainEnd::Empty, "{report:?}");
    assert_eq!(report.pending, 0);
    assert!(rows(&outbox).iter().all(|r| r.delivered && !r.dead));
}

#[test]
fn a_receiver_that_hangs_on_the_last_accounting_does_not_hold_the_drain_past_its_deadline() {
    // Issue 67, item 4: the accountant's last round had 5 s of its own after the stop
    // budget, so a drain given 2 s returned after 5 (8.0 s for 4 s in the field). Here the
    // receiver takes the events at once and holds every accounting 10 s.
    let dir = tempfile::tempdir().unwrap();
    let outbox = outbox_with(dir.path(), 5);
    let receiver = TestReceiver::start(0, |request| {
        if request.body["type"] == sqlite_outbox::wire::ACCOUNTING_TYPE {
            Reply::Hang(Duration::from_secs(10))
        } else {
            Reply::Status(204)
        }
    });
    let config = fast(
        RelayConfig::new()
            .destination(Destination::http("default", receiver.url()).accounting(true)),
    )
    .lease(Duration::from_secs(10));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(2);
    let report = outbox.deliver_pending(config, deadline).unwrap();
    let late = Instant::now().saturating_duration_since(deadline);
    assert_eq!((report.delivered, report.pending), (5, 0), "{report:?}");
    assert!(
        late < Duration::from_millis(300),
        "{late:?} past the deadline"
    );
}
