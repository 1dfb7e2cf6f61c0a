//! An app that opens its outbox by a relative path and then changes its working directory:
//! every connection opened afterwards (the pool's new ones, a relay's) opens the same file.
//! Alone in its test binary, because it changes the process's working directory.

mod common;

use common::{delivered_count, fast, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{Event, Outbox, RelayConfig};

#[test]
fn a_relative_path_keeps_naming_the_same_file_after_the_app_changes_directory() {
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::env::set_current_dir(home.path()).unwrap();
    let outbox = Outbox::builder().pool_size(4).open("app.db").unwrap();
    assert_eq!(
        outbox.path(),
        home.path().canonicalize().unwrap().join("app.db")
    );
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("before", json!(1))))
        .unwrap();

    std::env::set_current_dir(elsewhere.path()).unwrap();
    // Four connections at once: the pool opens new ones now, in the other directory.
    let held: Vec<_> = (0..4).map(|_| outbox.connection().unwrap()).collect();
    for conn in &held {
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM outbox_events", [], |r| r.get(0))
            .expect("the outbox's table, in the outbox's file");
        assert_eq!(count, 1);
    }
    drop(held);
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("after", json!(2))))
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 2));
    let _ = relay.shutdown();
    assert!(
        !elsewhere.path().join("app.db").exists(),
        "no second file in the new working directory"
    );
    std::env::set_current_dir(std::env::temp_dir()).unwrap();
}
