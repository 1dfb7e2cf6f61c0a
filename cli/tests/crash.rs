//! Crash consistency with real processes killed by SIGKILL: a writer committing business rows
//! and events, and a relay (the `outbox` CLI) delivering them, both killed at random moments
//! again and again, then restarted to drain.
//!
//! `CRASH_ROUNDS` sets the rounds (default 30; the soak is `CRASH_ROUNDS=500 cargo test
//! --release --test crash -- --nocapture`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{example_binary, TestReceiver};
use sqlite_outbox::rusqlite::Connection;

fn rounds() -> usize {
    std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

fn spawn_writer(db: &Path, first_seq: i64) -> Child {
    Command::new(example_binary("crash_writer"))
        .arg(db)
        .arg(first_seq.to_string())
        // At most 1,000 events a round, paced so that kills land mid-stream.
        .args(["1000", "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn writer")
}

fn spawn_relay(db: &Path, url: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(db)
        .args(["relay", "--url", url, "--lease-secs", "2", "--workers", "2"])
        .args(extra)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay")
}

/// The ids the writer printed: each was committed before it was printed.
fn committed_ids(child: Child) -> Vec<(String, i64, String)> {
    let out = child.wait_with_output().expect("writer output");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            let id = parts.next()?.to_string();
            let seq = parts.next()?.parse().ok()?;
            let key = parts.next()?.to_string();
            Some((id, seq, key))
        })
        .collect()
}

#[test]
fn committed_events_survive_repeated_kill_9_of_writer_and_relay() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    sqlite_outbox::Outbox::open(&db).unwrap();
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    let mut printed = Vec::new();
    let mut kills = 0;
    for round in 0..rounds() {
        let mut writer = spawn_writer(&db, round as i64 * 1_000_000);
        let mut relay = spawn_relay(&db, &url, &[]);
        // Kill each at its own random moment.
        let (first, second) = (fastrand::u64(20..200), fastrand::u64(20..200));
        let (a, b) = if first <= second {
            (first, second - first)
        } else {
            (second, first - second)
        };
        std::thread::sleep(Duration::from_millis(a));
        if first <= second {
            writer.kill().unwrap();
        } else {
            relay.kill().unwrap();
        }
        std::thread::sleep(Duration::from_millis(b));
        let _ = writer.kill();
        let _ = relay.kill();
        kills += 2;
        let _ = relay.wait();
        printed.extend(committed_ids(writer));
    }

    // Restart a relay and drain everything (leases of killed relays expire after 2 s).
    let drain = spawn_relay(&db, &url, &["--until-empty", "--timeout", "60s"])
        .wait_with_output()
        .unwrap();
    if !drain.status.success() {
        let conn = Connection::open(&db).unwrap();
        let stuck: Vec<String> = conn
            .prepare(
                "SELECT id || ' key=' || COALESCE(partition_key, '-') || ' attempts=' || attempts
                        || ' lease=' || COALESCE(lease_owner, '-') || '@' || COALESCE(lease_expires_at, 0)
                        || ' avail=' || available_at || ' err=' || COALESCE(last_error, '-')
                   FROM outbox_events WHERE delivered_at IS NULL AND dead_at IS NULL LIMIT 10",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        panic!(
            "drain failed: {}\nstuck: {stuck:#?}",
            String::from_utf8_lossy(&drain.stderr)
        );
    }

    let conn = Connection::open(&db).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    // Every business row has its event and no event lacks its row: they committed together.
    let mismatched: i64 = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM orders o
                      WHERE NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.event_id = o.event_id))
                  + (SELECT COUNT(*) FROM outbox_events e
                      WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.event_id = e.event_id))",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(mismatched, 0);
    let in_db: HashSet<String> = common::stored_event_ids(&db);

    let received = receiver.received();
    let mut first_receipt: HashMap<String, usize> = HashMap::new();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for (i, r) in received.iter().enumerate() {
        *per_id.entry(r.event_id.as_str()).or_default() += 1;
        first_receipt.entry(r.event_id.clone()).or_insert(i);
        assert_eq!(
            r.body["data"]["rolled_back"], false,
            "a rolled-back event arrived"
        );
        assert!(
            in_db.contains(&r.event_id),
            "an event that was never committed arrived"
        );
    }
    // Every committed event arrived: those the writer saw commit, and any it committed but
    // was killed before printing.
    let lost: Vec<&String> = in_db
        .iter()
        .filter(|id| !per_id.contains_key(id.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} committed events never arrived",
        lost.len()
    );
    for (id, _, _) in &printed {
        assert!(per_id.contains_key(id.as_str()));
    }
    // Per key, first receipts follow commit order.
    let mut by_key: HashMap<&str, Vec<(usize, i64)>> = HashMap::new();
    for (id, seq, key) in &printed {
        by_key
            .entry(key)
            .or_default()
            .push((first_receipt[id], *seq));
    }
    for (key, mut list) in by_key {
        list.sort();
        assert!(
            list.windows(2).all(|w| w[0].1 < w[1].1),
            "key {key}: first receipts out of commit order"
        );
    }
    let duplicates: usize = per_id.values().map(|n| n - 1).sum();
    println!(
        "kills survived {kills}, events committed {}, received {} ({} requests), duplicated {duplicates}, lost {}",
        in_db.len(),
        per_id.len(),
        received.len(),
        lost.len()
    );
}
