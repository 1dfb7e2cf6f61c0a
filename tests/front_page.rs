//! The front page (README.md) as a newcomer meets it: the main command runs end to end, and
//! its SQL block does what the page says. (Its Rust block compiles as a doc test, see
//! `ReadmeDoctests` in src/lib.rs; the test command is what CI runs.)

mod common;

use std::process::Command;

use sqlite_outbox::Outbox;

#[test]
fn the_quickstart_delivers_every_committed_order_through_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::example_binary("quickstart"))
        .arg("600")
        .arg(dir.path().join("quickstart.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("committed   600 orders"), "{stdout}");
    assert!(stdout.contains("duplicates  0"), "{stdout}");
    assert!(stdout.contains("lost        0"), "{stdout}");
}

/// The README's ```sql block, as it stands on the page.
fn readme_sql() -> String {
    let readme = include_str!("../README.md");
    let start = readme.find("```sql\n").expect("README has a ```sql block") + "```sql\n".len();
    let len = readme[start..].find("```").expect("the block ends");
    readme[start..start + len].to_string()
}

#[test]
fn the_front_pages_sql_writes_the_order_and_its_event_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    // The outbox creates its tables; the app writes through a connection of its own.
    drop(Outbox::open(&path).unwrap());
    let app = sqlite_outbox::rusqlite::Connection::open(&path).unwrap();
    app.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        .unwrap();
    app.execute_batch(&readme_sql()).unwrap();
    let total: i64 = app
        .query_row("SELECT total FROM orders WHERE id = 42", [], |r| r.get(0))
        .unwrap();
    assert_eq!(total, 990);
    let (event_type, key, data): (String, String, String) = app
        .query_row(
            "SELECT event_type, partition_key, payload FROM outbox_events
              WHERE idempotency_key = 'order-42-created'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(event_type, "order.created");
    assert_eq!(key, "customer-7");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&data).unwrap(),
        serde_json::json!({"id": 42, "total": 990})
    );
    // The same block again: the order's primary key refuses it, and the transaction takes
    // the event with it (no second event, no orphan).
    assert!(app.execute_batch(&readme_sql()).is_err());
    app.execute_batch("ROLLBACK").ok();
    let events: i64 = app
        .query_row("SELECT COUNT(*) FROM outbox_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(events, 1);
}
