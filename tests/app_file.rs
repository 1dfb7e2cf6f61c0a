//! The outbox as a guest in the app's own file: the app's schema version (`PRAGMA
//! user_version`, kept by rusqlite_migration) and its tables are the app's, before and after
//! the outbox opens the file; a file made by release 0.1 (which kept the outbox's version in
//! user_version) is taken over with every row, setting and total intact.

mod common;

use std::path::Path;

use common::{delivered_count, fast, wait_until, TestReceiver, PATIENCE};
use rusqlite_migration::{Migrations, M};
use serde_json::json;
use sqlite_outbox::rusqlite::{self, Connection};
use sqlite_outbox::{Event, Outbox, RelayConfig};

/// The app's first release: three migrations of its own.
fn app_release_1() -> Vec<M<'static>> {
    vec![
        M::up("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL);"),
        M::up("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL);"),
        M::up("ALTER TABLE orders ADD COLUMN total_cents INTEGER NOT NULL DEFAULT 0;"),
    ]
}

/// The app's next release: one more migration, whose effect shows how often it ran.
fn app_release_2() -> Vec<M<'static>> {
    let mut migrations = app_release_1();
    migrations.push(M::up(
        "CREATE TABLE IF NOT EXISTS audit (note TEXT NOT NULL);
         INSERT INTO audit (note) VALUES ('migration 4 ran');",
    ));
    migrations
}

fn user_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

fn migrate_app(path: &Path, migrations: Vec<M<'static>>) {
    let mut conn = Connection::open(path).unwrap();
    Migrations::new(migrations).to_latest(&mut conn).unwrap();
}

/// An order and its event in one transaction on the app's own connection.
fn place_order(outbox: &Outbox, path: &Path, id: i64) {
    let mut conn = Connection::open(path).unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute(
        "INSERT INTO orders (id, customer, total_cents) VALUES (?1, 1, 990)",
        [id],
    )
    .unwrap();
    let _ = outbox
        .enqueue(&tx, Event::new("order.placed", json!({ "id": id })))
        .unwrap();
    tx.commit().unwrap();
    outbox.notify();
}

fn outbox_schema_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT version FROM outbox_schema", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn an_app_migrated_by_rusqlite_migration_keeps_its_version_and_runs_its_next_migration_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    migrate_app(&path, app_release_1());
    assert_eq!(user_version(&path), 3);

    // Failed before with "no such table: outbox_stats": the outbox read 3 as its own version.
    let outbox = Outbox::open(&path).unwrap();
    assert_eq!(
        user_version(&path),
        3,
        "the outbox left the app's version alone"
    );
    assert_eq!(
        outbox_schema_version(&path),
        sqlite_outbox::admin::schema_version()
    );

    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    place_order(&outbox, &path, 1);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));

    // The app's next release, with the outbox open and its relay running.
    migrate_app(&path, app_release_2());
    assert_eq!(user_version(&path), 4);
    migrate_app(&path, app_release_2());
    let audit: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM audit", [], |r| r.get(0))
        .unwrap();
    assert_eq!(audit, 1, "migration 4 ran exactly once");

    place_order(&outbox, &path, 2);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 2));
    let _ = relay.shutdown();
    drop(outbox);

    // Opened again after the app's migration: nothing of the app's changes.
    let outbox = Outbox::open(&path).unwrap();
    assert_eq!(user_version(&path), 4);
    assert_eq!(outbox.stats().unwrap().delivered, 2);
}

#[test]
fn an_app_that_migrates_after_the_outbox_created_its_tables_runs_every_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let outbox = Outbox::open(&path).unwrap();
    // Before, the outbox had set user_version to its own 13, and the app's tool believed 13
    // of its migrations had run.
    assert_eq!(user_version(&path), 0);
    migrate_app(&path, app_release_1());
    assert_eq!(user_version(&path), 3);
    place_order(&outbox, &path, 7);
    let orders: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orders, 1);
    assert_eq!(outbox.stats().unwrap().pending, 1);
}

#[test]
fn the_outbox_opens_a_file_whatever_the_apps_user_version_and_leaves_it_as_found() {
    for found in [0_i64, 3, 20, 1000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
                .unwrap();
            conn.pragma_update(None, "user_version", found).unwrap();
        }
        let outbox = Outbox::open(&path)
            .unwrap_or_else(|e| panic!("user_version {found}: the outbox refused: {e}"));
        let _ = outbox
            .transaction(|tx| {
                tx.execute("INSERT INTO notes (body) VALUES ('kept')", [])?;
                outbox.enqueue(tx, Event::new("note.added", json!({})))
            })
            .unwrap();
        drop(outbox);
        // Opened a second time: the outbox's version is read from its own table.
        let outbox = Outbox::open(&path).unwrap();
        assert_eq!(outbox.stats().unwrap().pending, 1, "user_version {found}");
        assert_eq!(user_version(&path), found);
    }
}

/// Each row's id, type, attempts, lease holder, and whether it is delivered or dead.
type RowState = (String, String, i64, Option<String>, bool, bool);

fn row_states(conn: &Connection) -> Vec<RowState> {
    let mut stmt = conn
        .prepare(
            "SELECT event_id, event_type, attempts, lease_owner, delivered_at IS NOT NULL,
                    dead_at IS NOT NULL FROM outbox_events ORDER BY id",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    rows
}

#[test]
fn a_file_made_by_release_0_1_is_taken_over_with_every_row_setting_and_total() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    // Made by 0.1 (commit 640078c): one dead, two delivered, one leased by a relay that is
    // gone, two pending events; settings (default source, a storage limit, a priority);
    // user_version 13, the outbox's version then.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/outbox-0.1-v13.db"),
        &path,
    )
    .unwrap();
    assert_eq!(user_version(&path), 13);
    let before = row_states(&Connection::open(&path).unwrap());
    assert_eq!(before.len(), 6);

    let outbox = Outbox::open(&path).unwrap();
    assert_eq!(user_version(&path), 13, "user_version left as found");
    assert_eq!(
        outbox_schema_version(&path),
        sqlite_outbox::admin::schema_version()
    );
    let after = row_states(&outbox.connection().unwrap());
    assert_eq!(after, before, "every row as it was");
    let stats = outbox.stats().unwrap();
    // Pending: two, and the leased one, whose lease has run out (so not in flight).
    assert_eq!(
        (stats.pending, stats.in_flight, stats.delivered, stats.dead),
        (3, 0, 2, 1)
    );
    let settings = outbox.settings().unwrap();
    assert_eq!(settings["default_source"], "/fixture");
    assert_eq!(settings["max_pending"], "1000");
    assert_eq!(settings["priority:a.leased"], "7");

    // Delivered by this release: the two pending events and the leased one, whose relay is
    // long gone (its lease ran out when the fixture was a minute old).
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 5));
    let _ = relay.shutdown();
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.body["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(types.len(), 3);
    assert_eq!(types.iter().filter(|t| *t == "a.pending").count(), 2);
    assert!(types.contains(&"a.leased".to_string()));
    assert_eq!(outbox.stats().unwrap().dead, 1);
    assert_eq!(user_version(&path), 13);
}

#[test]
fn a_receivers_database_keeps_its_user_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receiver.db");
    let mut conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 7).unwrap();
    sqlite_outbox::receive::migrate(&mut conn).unwrap();
    sqlite_outbox::receive::migrate(&mut conn).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 7);
    use sqlite_outbox::receive::{Inbox, Receipt};
    let tx = conn.transaction().unwrap();
    assert_eq!(Inbox::receive(&tx, "/shop", "evt-1").unwrap(), Receipt::New);
    assert_eq!(
        Inbox::receive(&tx, "/shop", "evt-1").unwrap(),
        Receipt::Duplicate
    );
    tx.commit().unwrap();
}
