//! Every thread a relay starts is named after its job and joined by `shutdown()`. In a file
//! of its own: it reads the process's thread list, which other tests' relays would change.

mod common;

use std::time::Duration;

use common::{fast, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// The names of this process's threads (Linux: `/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect();
    names.sort();
    names
}

fn outbox_threads() -> Vec<String> {
    thread_names()
        .into_iter()
        .filter(|n| n.starts_with("outbox-"))
        .collect()
}

#[test]
fn a_relay_names_every_thread_and_joins_them_all_on_shutdown() {
    let receiver = TestReceiver::ok();
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("threads.db")).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!({"n": 1}))))
        .unwrap();
    // An open outbox: its pool's one maintenance thread, none of r2d2's own.
    assert_eq!(outbox_threads(), ["outbox-pool"]);
    assert!(!thread_names().iter().any(|n| n.starts_with("r2d2")));
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()).workers(2))
                .destination(Destination::http("audit", receiver.url()).workers(1)),
        )
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.event_count() >= 1));
    // Every name fits the 15 bytes Linux keeps, and no two are alike.
    assert_eq!(
        outbox_threads(),
        [
            "outbox-account",
            "outbox-ckpt",
            "outbox-pool",
            "outbox-relay",
            "outbox-w0-0",
            "outbox-w0-1",
            "outbox-w1-0"
        ]
    );
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
    // Joined threads leave the list once the kernel reaps them: at once, in practice.
    assert!(wait_until(Duration::from_secs(5), || outbox_threads()
        == ["outbox-pool"]));
    // The pool's thread ends with the last clone of the outbox, not a round later.
    let clone = outbox.clone();
    drop(outbox);
    assert_eq!(outbox_threads(), ["outbox-pool"]);
    drop(clone);
    assert!(wait_until(Duration::from_secs(5), || outbox_threads().is_empty()));
}
