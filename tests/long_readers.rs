//! Another process holds a read transaction for a long time (a backup tool, Litestream, a
//! report query): the relay's checkpoints must never make the app's writes wait.

mod common;

use std::time::{Duration, Instant};

use common::*;
use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::{Event, Outbox, RelayConfig};

const READER_HOLDS: Duration = Duration::from_secs(20);
const COMMITS: usize = 3_000;

fn wal_bytes(db: &std::path::Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

#[test]
fn a_reader_holding_a_snapshot_for_20_s_never_makes_an_app_commit_wait_and_the_wal_shrinks_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("readers.db");
    let outbox = Outbox::open(&db).unwrap();
    outbox
        .transaction(|tx| {
            tx.execute(
                "CREATE TABLE readings (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
                [],
            )?;
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();

    // The reader takes its snapshot in the middle of the WAL (as a backup that starts while
    // the app is busy does), and holds it for 20 s.
    for n in 0..200 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("warm-up", serde_json::json!(n))))
            .unwrap();
    }
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let reader_db = db.clone();
    let reader = std::thread::spawn(move || {
        let conn = Connection::open(&reader_db).unwrap();
        conn.execute_batch("BEGIN").unwrap();
        let _: i64 = conn
            .query_row("SELECT COUNT(*) FROM outbox_events", [], |r| r.get(0))
            .unwrap();
        started_tx.send(()).unwrap();
        std::thread::sleep(READER_HOLDS);
        conn.execute_batch("COMMIT").unwrap();
    });
    started_rx.recv().unwrap();

    // The app commits 3,000 events over the reader's 20 s, each with its business row.
    let pace = READER_HOLDS / COMMITS as u32;
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut max_wal = 0;
    for n in 0..COMMITS {
        let t = Instant::now();
        outbox
            .transaction(|tx| {
                let v = format!("reading {n} {}", "x".repeat(200));
                tx.execute("INSERT INTO readings (v) VALUES (?1)", [&v])?;
                let _ = outbox.enqueue(
                    tx,
                    Event::new("reading", serde_json::json!({"n": n, "v": v})),
                )?;
                Ok::<_, sqlite_outbox::Error>(())
            })
            .unwrap();
        slowest = slowest.max(t.elapsed());
        max_wal = max_wal.max(wal_bytes(&db));
        let due = start + pace * (n as u32 + 1);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    reader.join().unwrap();
    println!("slowest commit {slowest:?}, WAL peaked at {max_wal} bytes");
    assert!(
        slowest < Duration::from_secs(1),
        "an app commit waited {slowest:?} behind a checkpoint"
    );
    assert!(
        max_wal > 16 << 20,
        "the test must grow the WAL past the reset bound ({max_wal} bytes)"
    );

    // Once the reader is gone, the relay's next reset truncates the WAL.
    assert!(wait_until(PATIENCE, || delivered_count(&outbox)
        == COMMITS as i64 + 200));
    let shrunk = wait_until(Duration::from_secs(15), || wal_bytes(&db) < 4 << 20);
    let _ = relay.shutdown();
    assert!(shrunk, "the WAL stayed at {} bytes", wal_bytes(&db));
}
