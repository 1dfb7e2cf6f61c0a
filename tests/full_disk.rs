//! A full disk (issue 55, item 1): the file system the app's file lives on fills up (the app's
//! own commits, then another file takes the last free bytes) while the receiver is down. The
//! relay must still claim, send and acknowledge every committed event, whether it was running
//! when the disk filled or started afterwards, then make room for the app inside the file.

mod common;
#[path = "common/small_disk.rs"]
mod small_disk;

use std::time::Duration;

use common::{closed_port, fast, wait_until, Reply, TestReceiver};
use small_disk::SmallDisk;
use sqlite_outbox::rusqlite::{params, Connection, ErrorCode};
use sqlite_outbox::{Outbox, RelayConfig};

/// The app's own connection, with its own table beside the outbox's.
fn app_connection(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)",
    )
    .unwrap();
    conn
}

/// One order and its event, in one transaction, through the SQL contract.
fn place_order(conn: &mut Connection, n: i64) -> sqlite_outbox::rusqlite::Result<()> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO orders (note) VALUES (?1)",
        [format!("order {n} {}", "n".repeat(200))],
    )?;
    tx.execute(
        "INSERT INTO outbox_enqueue (type, data) VALUES ('order.placed', json_object('n', ?1, 'pad', ?2))",
        params![n, "p".repeat(600)],
    )?;
    tx.commit()
}

/// Places orders until the disk is full; returns how many committed.
fn place_orders_until_full(conn: &mut Connection) -> i64 {
    let mut n = 0;
    loop {
        match place_order(conn, n) {
            Ok(()) => n += 1,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DiskFull) => return n,
            Err(e) => panic!("order {n}: {e}"),
        }
    }
}

fn integrity(path: &std::path::Path) -> String {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

/// Events pending, read without writing (the disk is full).
fn pending(outbox: &Outbox) -> i64 {
    outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT count(*) FROM outbox_events WHERE delivered_at IS NULL AND dead_at IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

fn relay_config(port: u16) -> RelayConfig {
    fast(RelayConfig::http(format!("http://127.0.0.1:{port}/events")))
}

/// Fills the disk while `outbox`'s relay (if `running`) cannot reach its receiver, then starts
/// the receiver (and, if not `running`, the relay) and checks that every committed event is
/// delivered with the disk still full, and that the app can commit again afterwards.
fn delivers_everything_from_a_full_disk(running: bool) {
    // The relay's log (RUST_LOG) is shown with a failure: what it did while the disk was full.
    let _ = env_logger::builder().is_test(true).try_init();
    let disk = SmallDisk::mount(8);
    let path = disk.path().join("app.db");
    let outbox = Outbox::open(&path).unwrap();
    let mut app = app_connection(&path);
    let port = closed_port();
    let relay = running.then(|| outbox.relay(relay_config(port)).start().unwrap());
    let committed = place_orders_until_full(&mut app);
    assert!(
        committed > 1_000,
        "only {committed} orders before the disk filled"
    );
    let filler = disk.fill("camera.bin");
    // Pending events alone fill the room: the app's events are refused (a few more may
    // fit in pages and WAL room left), nothing committed is lost.
    let refused = (0..1_000)
        .map(|n| {
            outbox.transaction(|tx| {
                outbox.enqueue(
                    tx,
                    sqlite_outbox::Event::new("order.placed", serde_json::json!(n)),
                )
            })
        })
        .find_map(Result::err);
    assert!(
        refused.as_ref().is_some_and(|e| e.is_disk_full()),
        "{refused:?}"
    );
    let orders_placed = committed;
    // Every event committed, the app's orders' and those that still fit.
    let committed = pending(&outbox);
    // A device that rebooted full: the outbox opened again and its relay started on the
    // full disk (the app's own connection stays open).
    let outbox = if running {
        outbox
    } else {
        drop(outbox);
        Outbox::open(&path).unwrap()
    };
    let relay = relay.unwrap_or_else(|| outbox.relay(relay_config(port)).start().unwrap());
    let receiver = TestReceiver::start(port, |_| Reply::Status(200));
    // Delivered history may be deleted to make room as it goes: count what arrived.
    let received = || {
        receiver
            .event_ids()
            .into_iter()
            .collect::<std::collections::HashSet<_>>()
            .len() as i64
    };
    let delivered = wait_until(Duration::from_secs(60), || {
        received() == committed && pending(&outbox) == 0
    });
    assert!(
        delivered,
        "{} of {committed} received, {} pending, with the disk full",
        received(),
        pending(&outbox)
    );
    assert!(filler.exists(), "the other file still holds its bytes");
    // Stats and health say so, read on the full disk.
    let stats = outbox.stats().unwrap();
    assert!(stats.disk_full, "{stats:?}");
    assert!(stats.pruned_for_room > 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    let health = outbox
        .health(sqlite_outbox::admin::HealthThresholds::default())
        .unwrap();
    assert!(
        health
            .reasons
            .iter()
            .any(|r| r.contains("the disk is full")),
        "{health:?}"
    );
    // The app commits again: the outbox made room inside the file.
    let again = wait_until(Duration::from_secs(30), || {
        place_order(&mut app, -1).is_ok()
    });
    assert!(
        again,
        "the app cannot commit after delivery: {:?}",
        place_order(&mut app, -2)
    );
    let _ = relay.shutdown();
    assert_eq!(integrity(&path), "ok");
    let orders: i64 = app
        .query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
        .unwrap();
    assert!(orders > orders_placed, "every order kept, and the new one");
}

#[test]
fn a_relay_running_when_the_disk_fills_delivers_everything_and_makes_room() {
    delivers_everything_from_a_full_disk(true);
}

#[test]
fn a_relay_started_on_a_full_disk_delivers_everything_and_makes_room() {
    delivers_everything_from_a_full_disk(false);
}

/// Issue 67, item 1: the relay keeps up (nothing pending), another program takes every free
/// byte once, and the app goes on committing an order and its event every 20 ms. Before, the
/// relay gave its reserve back only when one of its own writes failed, which with nothing
/// pending never came: 7 of 1,477 commits went through in 30 s. Now it gives it back (and
/// starts the WAL over) within about a second of finding the file system full, and the app's
/// commits go through again.
#[test]
fn with_nothing_pending_the_app_commits_again_soon_after_another_program_fills_the_disk() {
    let disk = SmallDisk::mount(32);
    let path = disk.path().join("app.db");
    let outbox = Outbox::open(&path).unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Status(200));
    let relay = outbox.relay(relay_config(receiver.port)).start().unwrap();
    let mut app = app_connection(&path);
    for n in 0..50 {
        place_order(&mut app, n).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(wait_until(Duration::from_secs(20), || pending(&outbox) == 0));
    let filler = disk.fill("camera.bin");
    let started = std::time::Instant::now();
    let (mut early, mut late_ok, mut late_failed) = (0, 0, 0);
    let mut n = 50;
    while started.elapsed() < Duration::from_secs(15) {
        let result = place_order(&mut app, n);
        n += 1;
        match result {
            Ok(()) if started.elapsed() >= Duration::from_secs(5) => late_ok += 1,
            Ok(()) => early += 1,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DiskFull) => {
                if started.elapsed() >= Duration::from_secs(5) {
                    late_failed += 1;
                }
            }
            Err(e) => panic!("order {n}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(filler.exists(), "the other file still holds its bytes");
    eprintln!("first 5 s: {early} went through; then {late_ok} went through, {late_failed} failed");
    // From 5 s after the disk filled, the app's commits go through (a few may still meet
    // the moments the room runs short before delivered history is deleted). At most 500
    // are tried in those 10 s; a machine under load tries fewer (242 went through, none
    // failed, in one CI-like run with two busy loops beside it), so the floor is 100: the
    // defect this guards against let 7 of 1,477 through in 30 s.
    assert!(
        late_ok >= 100 && late_failed * 10 <= late_ok,
        "from 5 s on: {late_ok} commits went through, {late_failed} failed (before: {early})"
    );
    // Every event committed is delivered, on the disk still full.
    assert!(wait_until(Duration::from_secs(30), || pending(&outbox) == 0));
    let _ = relay.shutdown();
    assert_eq!(integrity(&path), "ok");
}
