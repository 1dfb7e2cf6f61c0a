//! Priorities: after a reconnect the most urgent due events go first, a key's events keep
//! commit order whatever their priorities, per-type defaults apply, and bad priorities are
//! refused (library error, CLI exit 2) with nothing written.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{fast, outbox_cli, query_rows, wait_until, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig};

/// `(event id, priority)` of every row, in commit order.
fn priorities(outbox: &Outbox) -> Vec<(String, i64)> {
    query_rows(
        outbox,
        "SELECT event_id, priority FROM outbox_events ORDER BY id",
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

#[test]
fn the_most_urgent_go_first_and_a_keys_events_keep_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .priority_for("alarm.*", 9)
        .priority_for("telemetry.*", 1)
        .open(dir.path().join("p.db"))
        .unwrap();
    // Committed while offline: telemetry first, alarms last, a keyed sequence whose later
    // events claim a higher priority than its head.
    let mut keyed = Vec::new();
    let _ = outbox
        .transaction(|tx| {
            for i in 0..20 {
                let _ = outbox.enqueue(tx, Event::new("telemetry.reading", json!({"i": i})))?;
            }
            for i in 0..5 {
                let _ = outbox.enqueue(tx, Event::new("order.updated", json!({"i": i})))?;
            }
            for (i, p) in [1u8, 9, 9].into_iter().enumerate() {
                let e = outbox.enqueue(
                    tx,
                    Event::new("door.state", json!({"i": i}))
                        .partition_key("door-1")
                        .priority(p),
                )?;
                keyed.push(e.event_id().to_string());
            }
            for i in 0..3 {
                let _ = outbox.enqueue(tx, Event::new("alarm.smoke", json!({"i": i})))?;
            }
            // An explicit priority beats the type's default.
            outbox.enqueue(tx, Event::new("telemetry.urgent", json!({})).priority(8))
        })
        .unwrap();
    let rows = priorities(&outbox);
    let priority_of = |id: &str| rows.iter().find(|(e, _)| e == id).unwrap().1;
    let commit_index = |id: &str| rows.iter().position(|(e, _)| e == id).unwrap();
    let receiver = TestReceiver::ok();
    // One worker and small claims: the order of receipt is the order of the claims.
    let relay = outbox
        .relay(
            fast(RelayConfig::new())
                .destination(Destination::http("default", receiver.url()))
                .workers(1)
                .claim_batch(4),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || receiver
        .event_count()
        >= rows.len()));
    let _ = relay.shutdown();
    let received = receiver.event_ids();
    // Unkeyed events: by priority, most urgent first, then in commit order.
    let unkeyed: Vec<&String> = received.iter().filter(|id| !keyed.contains(id)).collect();
    let mut expected = unkeyed.clone();
    expected.sort_by_key(|id| (std::cmp::Reverse(priority_of(id)), commit_index(id)));
    assert_eq!(unkeyed, expected);
    assert_eq!(priority_of(unkeyed[0]), 9, "alarms first");
    assert_eq!(priority_of(unkeyed[3]), 8, "then the explicit 8");
    assert_eq!(priority_of(unkeyed.last().unwrap()), 1, "telemetry last");
    // The keyed events: commit order, though the later two are more urgent than the head.
    let keyed_received: Vec<&String> = received.iter().filter(|id| keyed.contains(id)).collect();
    assert_eq!(keyed_received, keyed.iter().collect::<Vec<_>>());
}

#[test]
fn a_bad_priority_is_refused_and_the_transaction_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bad.db")).unwrap();
    let result = outbox.transaction(|tx| {
        let e = outbox
            .enqueue(tx, Event::new("t", json!({})).priority(10))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidPriority { priority: 10 }), "{e}");
        assert!(e.to_string().contains("0 (least urgent) to 9"), "{e}");
        // The same transaction still commits the caller's other writes.
        outbox.enqueue(tx, Event::new("t", json!({})).priority(9))
    });
    assert!(result.is_ok());
    assert_eq!(priorities(&outbox).len(), 1);
    let e = Outbox::builder()
        .priority_for("x.*", 12)
        .open(dir.path().join("other.db"))
        .unwrap_err();
    assert!(e.to_string().contains("priority 12"), "{e}");
}

#[test]
fn the_cli_takes_a_priority_per_event_and_per_line_and_refuses_one_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db");
    let outbox = Outbox::open(&db).unwrap();
    let o = outbox_cli(&db, &["enqueue", "--type", "t", "--priority", "7"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let shown = outbox_cli(&db, &["show", &id]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("priority     7"));
    for args in [
        vec!["enqueue", "--type", "t", "--priority", "10"],
        vec!["enqueue", "--type", "t", "--priority=-1"],
    ] {
        let o = outbox_cli(&db, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("not a priority"));
    }
    // --jsonl: a line's own priority, else the flag's.
    let o = common::outbox_cli_with_stdin(
        &db,
        &["enqueue", "--jsonl", "--priority", "2"],
        b"{\"type\":\"a\",\"priority\":9}\n{\"type\":\"b\"}\n{\"type\":\"c\",\"priority\":12}\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 3: priority 12 is out of range"));
    let stored: Vec<i64> = priorities(&outbox).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        stored,
        vec![7, 9, 2],
        "the good lines stay committed, the bad one wrote nothing"
    );
}
