//! A commit from another process (python3's sqlite3, through the SQL contract) wakes the
//! relay through the WAL's file-change notification, not at its next poll.
#![cfg(all(target_os = "linux", feature = "wal-watch"))]

mod common;

use std::time::{Duration, Instant};

use common::TestReceiver;
use sqlite_outbox::Outbox;

#[test]
fn a_commit_from_another_process_is_delivered_without_waiting_for_the_poll() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cross.db");
    let outbox = Outbox::open(&db).unwrap();
    let receiver = TestReceiver::ok();
    // A poll of a minute: only the notification can bring these events out in time.
    let relay = outbox
        .relay(common::minute_poll(&receiver))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for n in 0..3 {
        let committed = Instant::now();
        common::insert_from_python(&db, "from.python", &format!("{{\"n\": {n}}}"));
        assert!(
            common::wait_until(Duration::from_secs(5), || receiver.event_count() == n + 1),
            "event {n} from another process not delivered within 5 s (the poll is 60 s)"
        );
        // Includes python's start and exit: the commit itself is later than `committed`.
        assert!(committed.elapsed() < Duration::from_secs(5));
        let body = &receiver.received()[n].body;
        assert_eq!(body["type"], "from.python");
        assert_eq!(body["data"]["n"], n);
    }
    assert_eq!(relay.shutdown().abandoned, 0);
}
