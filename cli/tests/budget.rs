//! `outbox relay --budget SIZE/PERIOD` and `--budget-exempt-priority N` (issue 69): what a
//! period spent, kept in the file and shown by `outbox stats` (text and `--json`); a spent
//! budget holds the backlog (exit 3, events pending, no attempt spent); bad values exit 2
//! naming the limits.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{outbox_cli, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Event, Outbox};

fn backlog(outbox: &Outbox, n: usize, priority: u8) {
    backlog_of(outbox, "reading", n, priority);
}

fn backlog_of(outbox: &Outbox, event_type: &str, n: usize, priority: u8) {
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let data = json!({"n": i, "pad": "x".repeat(200)});
                let _ = outbox.enqueue(tx, Event::new(event_type, data).priority(priority))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

/// `outbox relay --url URL --until-empty` with `more` flags.
fn relay_until_empty(db: &std::path::Path, url: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec!["relay", "--url", url, "--until-empty"];
    args.extend_from_slice(more);
    outbox_cli(db, &args)
}

fn stats_json(db: &std::path::Path) -> serde_json::Value {
    let o = outbox_cli(db, &["stats", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_budget_the_relay_spent_is_kept_in_the_file_and_shown_by_stats() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("budget.db");
    let outbox = Outbox::open(&db).unwrap();
    backlog(&outbox, 5, Event::DEFAULT_PRIORITY);
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    let o = relay_until_empty(&db, &url, &["--budget", "1MB/1d"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(receiver.event_count(), 5);
    let stats = stats_json(&db);
    let destination = stats["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "default")
        .unwrap();
    let budget = &destination["budget"];
    assert_eq!(budget["limit_bytes"], 1_000_000, "{budget}");
    let used = budget["used_bytes"].as_u64().unwrap();
    // Five requests of a few hundred bytes each, heads and answers included.
    assert!((1_500..20_000).contains(&used), "{budget}");
    let started = budget["period_started"].as_i64().unwrap();
    assert_eq!(
        budget["period_ends"].as_i64().unwrap() - started,
        86_400_000
    );
    assert_eq!(budget["holding"], false);
    assert!(budget.get("forecast").is_some(), "{budget}");
    let text = outbox_cli(&db, &["stats"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("BUDGET USED"), "{text}");
    assert!(text.contains(" KB of 1.0 MB"), "{text}");
    // A second relay run the same day spends on from what the first spent.
    backlog(&outbox, 1, Event::DEFAULT_PRIORITY);
    let o = relay_until_empty(&db, &url, &["--budget", "1MB/1d"]);
    assert_eq!(o.status.code(), Some(0));
    let again = stats_json(&db)["destinations"][0]["budget"]["used_bytes"]
        .as_u64()
        .unwrap();
    assert!(again > used, "{again} after {used}");
}

#[test]
fn a_spent_budget_holds_the_backlog_without_spending_attempts_and_lets_alarms_through() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("held.db");
    let outbox = Outbox::open(&db).unwrap();
    backlog(&outbox, 30, Event::DEFAULT_PRIORITY);
    backlog_of(&outbox, "alarm", 2, 9);
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    let o = relay_until_empty(
        &db,
        &url,
        &[
            "--budget",
            "3KB/1d",
            "--budget-exempt-priority",
            "9",
            "--timeout",
            "6s",
        ],
    );
    // Stopped by its timeout with events pending.
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stats = stats_json(&db);
    let budget = &stats["destinations"][0]["budget"];
    assert_eq!(budget["holding"], true, "{budget}");
    // Urgent ones go first and whatever is left: both alarms went.
    let alarms = receiver
        .received()
        .iter()
        .filter(|r| r.body["type"] == "alarm")
        .count();
    assert_eq!(alarms, 2);
    let pending = stats["pending"].as_i64().unwrap();
    assert!((1..32).contains(&pending), "{pending} pending");
    let attempts = common::query_rows(
        &outbox,
        "SELECT attempts FROM outbox_events WHERE delivered_at IS NULL AND dead_at IS NULL",
        |r| r.get::<_, i64>(0),
    );
    assert!(attempts.iter().all(|a| *a == 0), "{attempts:?}");
    // Said once when it began, and in the line every 5 s says where the relay stands.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("spent its data budget"), "{stderr}");
    assert!(
        stderr.contains("destination default: holds its events for its data budget"),
        "{stderr}"
    );
}

#[test]
fn bad_budgets_exit_2_naming_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.db");
    drop(Outbox::open(&db).unwrap());
    for (args, says) in [
        (vec!["--budget", "5XB/1d"], "KB, MB or GB"),
        (vec!["--budget", "50MB/30s"], "from 1m to 31d"),
        (vec!["--budget", "50MB/40d"], "to a month (31d)"),
        (vec!["--budget", "0B/1d"], "from 1 byte"),
        (vec!["--budget-exempt-priority", "8"], "needs --budget"),
        (
            vec!["--budget", "1MB/1d", "--budget-exempt-priority", "12"],
            "0 to 9",
        ),
    ] {
        let o = relay_until_empty(&db, "http://127.0.0.1:1/", &args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
