//! Several relay processes (the `outbox` CLI) on one database file.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{wait_until, Reply, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{Event, Outbox};

fn spawn_relay(db: &Path, url: &str, lease_secs: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(db)
        .args([
            "relay",
            "--url",
            url,
            "--lease-secs",
            lease_secs,
            "--workers",
            "2",
        ])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn relay")
}

fn enqueue(outbox: &Outbox, n: usize) {
    let mut conn = outbox.connection().unwrap();
    let tx = conn.transaction().unwrap();
    for i in 0..n {
        let _ = outbox
            .enqueue(
                &tx,
                Event::new("t", json!(i)).partition_key(format!("k{}", i % 20)),
            )
            .unwrap();
    }
    tx.commit().unwrap();
}

fn delivered(outbox: &Outbox) -> i64 {
    outbox.stats().unwrap().delivered
}

fn per_id(receiver: &TestReceiver) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in receiver.received() {
        *m.entry(r.event_id).or_default() += 1;
    }
    m
}

fn attempts_by_row(outbox: &Outbox) -> Vec<(i64, i64)> {
    outbox
        .connection()
        .unwrap()
        .prepare("SELECT id, attempts FROM outbox_events ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn stop(mut children: Vec<Child>) {
    for c in &mut children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
    }
    for c in &mut children {
        let _ = c.wait();
    }
}

#[test]
fn three_relay_processes_deliver_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("three.db");
    let outbox = Outbox::open(&db).unwrap();
    let receiver = TestReceiver::ok();
    let relays: Vec<Child> = (0..3)
        .map(|_| spawn_relay(&db, &receiver.url(), "30"))
        .collect();
    for _ in 0..10 {
        enqueue(&outbox, 100);
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(wait_until(PATIENCE, || delivered(&outbox) == 1000));
    stop(relays);
    let counts = per_id(&receiver);
    assert_eq!(counts.len(), 1000);
    assert!(
        counts.values().all(|&n| n == 1),
        "an event was delivered twice"
    );
}

#[test]
fn a_killed_relay_duplicates_only_its_in_flight_events() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("killed.db");
    let outbox = Outbox::open(&db).unwrap();
    // A slow receiver keeps requests in flight long enough to kill a relay mid-request.
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_millis(20)));
    enqueue(&outbox, 300);
    let mut relays: Vec<Child> = (0..3)
        .map(|_| spawn_relay(&db, &receiver.url(), "2"))
        .collect();
    assert!(wait_until(PATIENCE, || receiver.count() >= 50));
    let mut victim = relays.remove(0);
    victim.kill().unwrap();
    victim.wait().unwrap();
    // What the victim held when it died: leased rows it can no longer ack.
    let held: i64 = outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM outbox_events
              WHERE delivered_at IS NULL AND lease_owner IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered(&outbox) == 300));
    stop(relays);
    let counts = per_id(&receiver);
    assert_eq!(counts.len(), 300, "every event arrived");
    let duplicated = counts.values().filter(|&&n| n > 1).count() as i64;
    // Only events leased at the moment of the kill can arrive twice (the survivors' own
    // in-flight leases at that moment are included in `held`, so this bound is generous).
    assert!(
        duplicated <= held,
        "{duplicated} duplicates, {held} leased at the kill"
    );
    assert!(counts.values().all(|&n| n <= 2));
}

#[test]
fn a_paused_relay_cannot_mark_events_another_relay_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("paused.db");
    let outbox = Outbox::open(&db).unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_millis(50)));
    enqueue(&outbox, 40);
    let paused = spawn_relay(&db, &receiver.url(), "2");
    assert!(wait_until(PATIENCE, || receiver.count() >= 2));
    // Freeze it mid-delivery, past its 2 s lease.
    let pid = paused.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let leased_by_paused: Vec<i64> = outbox
        .connection()
        .unwrap()
        .prepare(
            "SELECT id FROM outbox_events WHERE lease_owner IS NOT NULL AND delivered_at IS NULL",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!leased_by_paused.is_empty());
    let other = spawn_relay(&db, &receiver.url(), "30");
    assert!(wait_until(PATIENCE, || delivered(&outbox) == 40));
    // The other relay's leases and outcomes stand; now wake the paused one.
    let before = attempts_by_row(&outbox);
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(1500));
    stop(vec![paused, other]);
    let after = attempts_by_row(&outbox);
    assert_eq!(
        before, after,
        "the woken relay changed rows another relay had claimed"
    );
    assert_eq!(per_id(&receiver).len(), 40);
}
