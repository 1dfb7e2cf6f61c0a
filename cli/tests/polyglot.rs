//! Apps in other languages enqueue through the SQL contract while `outbox relay` runs beside
//! them as a sidecar: a Python app (`sqlite3` from the standard library, which links SQLite
//! 3.40 on Debian 12) and a Node app (`better-sqlite3` from npm) write orders and their
//! events in their own transactions, some rolled back, at the same time, to one file.
//!
//! Needs `python3`, `node` and `npm install --prefix tests/polyglot` (`.ci/run` installs
//! them). Without them each language's part says on stderr that it is skipped, unless
//! `OUTBOX_REQUIRE_POLYGLOT=1` (set by `.ci/run`) makes that a failure.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{v7_millis, wait_until, TestReceiver};
use sqlite_outbox::Outbox;

/// How many orders each app writes, and every how many it rolls one back.
const ORDERS: usize = 120;
const ROLLBACK_EVERY: usize = 4;

fn polyglot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/polyglot")
}

/// Whether a missing language runtime fails the test instead of skipping its part.
fn required() -> bool {
    std::env::var("OUTBOX_REQUIRE_POLYGLOT").is_ok_and(|v| v == "1")
}

/// The command that runs one app, or why it cannot run here.
fn writer(language: &str) -> Result<Command, String> {
    let runs = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    match language {
        "python" => {
            if !runs("python3", "--version") {
                return Err("python3 is not installed".into());
            }
            let mut command = Command::new("python3");
            command.arg(polyglot_dir().join("writer.py"));
            Ok(command)
        }
        _ => {
            if !runs("node", "--version") {
                return Err("node is not installed (apt-get install nodejs npm)".into());
            }
            if !polyglot_dir().join("node_modules/better-sqlite3").exists() {
                return Err(
                    "better-sqlite3 is not installed (npm install --prefix tests/polyglot)".into(),
                );
            }
            let mut command = Command::new("node");
            command.arg(polyglot_dir().join("writer.mjs"));
            Ok(command)
        }
    }
}

/// Waits for `child` up to `limit`, killing it past that; its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a writer ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// What one app says it did.
#[derive(serde::Deserialize, Debug)]
struct Report {
    sqlite: String,
    committed: Vec<String>,
    rolled_back: Vec<String>,
    refused: Vec<String>,
    read_back: HashMap<String, String>,
}

/// `(row id, event id, idempotency key)` of every row, in commit order.
fn stored(outbox: &Outbox) -> Vec<(i64, String, Option<String>)> {
    let conn = outbox.connection().unwrap();
    let mut stmt = conn
        .prepare("SELECT id, event_id, idempotency_key FROM outbox_events ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn python_and_node_apps_enqueue_in_their_own_transactions_and_the_sidecar_relay_delivers() {
    let mut apps = Vec::new();
    for language in ["python", "node"] {
        match writer(language) {
            Ok(command) => apps.push((language, command)),
            Err(why) if required() => panic!("OUTBOX_REQUIRE_POLYGLOT=1 but {why}"),
            Err(why) => eprintln!("skipped: the {language} app ({why})"),
        }
    }
    if apps.is_empty() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    // The operator's side: create the file and set the source every writer uses.
    let init = common::outbox_cli(&db, &["init"]);
    assert!(init.status.success());
    let set = common::outbox_cli(&db, &["config", "set", "default_source", "/gateway/7"]);
    assert!(set.status.success());

    // The sidecar, started before the apps write.
    let receiver = TestReceiver::ok();
    let mut relay = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["relay", "--url", &receiver.url(), "--workers", "2"])
        .env_remove("OUTBOX_DB")
        .env_remove("OUTBOX_SECRET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let running: Vec<(&str, Child)> = apps
        .into_iter()
        .map(|(language, mut command)| {
            let child = command
                .arg(&db)
                .arg(ORDERS.to_string())
                .arg(ROLLBACK_EVERY.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (language, child)
        })
        .collect();
    let mut reports = Vec::new();
    for (language, child) in running {
        let output = finish(child, Duration::from_secs(120));
        assert!(
            output.status.success(),
            "the {language} app failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Report = serde_json::from_slice(&output.stdout).unwrap();
        eprintln!(
            "{language} app on SQLite {}: {} committed, {} rolled back",
            report.sqlite,
            report.committed.len(),
            report.rolled_back.len()
        );
        reports.push((language, report));
    }
    let committed: HashSet<String> = reports
        .iter()
        .flat_map(|(_, r)| r.committed.iter().cloned())
        .collect();
    let rolled_back: HashSet<String> = reports
        .iter()
        .flat_map(|(_, r)| r.rolled_back.iter().cloned())
        .collect();
    assert_eq!(committed.len() + rolled_back.len(), ORDERS * reports.len());

    let order_of = |body: &serde_json::Value| body["data"]["order"].as_str().map(String::from);
    let delivered_all = wait_until(Duration::from_secs(60), || {
        let seen: HashSet<String> = receiver
            .received()
            .iter()
            .filter_map(|r| order_of(&r.body))
            .collect();
        committed.is_subset(&seen)
    });
    // Give a stray rolled-back event (there must be none) time to show up too.
    std::thread::sleep(Duration::from_millis(300));
    let _ = relay.kill();
    let _ = relay.wait();
    assert!(delivered_all, "not every committed event was delivered");

    let received = receiver.received();
    let mut first_receipts = Vec::new();
    let mut seen_ids = HashSet::new();
    for r in &received {
        if seen_ids.insert(r.event_id.clone()) {
            first_receipts.push(r);
        }
    }
    let delivered: HashSet<String> = first_receipts
        .iter()
        .filter_map(|r| order_of(&r.body))
        .collect();
    assert_eq!(
        delivered, committed,
        "every committed event, nothing rolled back"
    );
    assert_eq!(
        first_receipts.len(),
        committed.len(),
        "one event per order: the idempotent repeats added nothing"
    );
    for r in &first_receipts {
        assert_eq!(r.body["source"], "/gateway/7", "the source set in the file");
        assert_eq!(r.body["type"], "order.created");
    }
    // Per-key order: each key's orders arrive in the order they were committed.
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for r in &first_receipts {
        let key = r.body["partitionkey"].as_str().unwrap().to_string();
        by_key
            .entry(key)
            .or_default()
            .push(r.body["data"]["n"].as_i64().unwrap());
    }
    assert_eq!(by_key.len(), 5 * reports.len());
    for (key, ns) in &by_key {
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{key}: {ns:?}");
    }

    // Ids: unique, UUIDv7, their times never going back in commit order; read back by key.
    let outbox = Outbox::open_existing(&db).unwrap();
    let rows = stored(&outbox);
    assert_eq!(rows.len(), committed.len());
    let unique: HashSet<&String> = rows.iter().map(|r| &r.1).collect();
    assert_eq!(unique.len(), rows.len());
    let times: Vec<u64> = rows.iter().map(|r| v7_millis(&r.1)).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "times in commit order"
    );
    for (language, report) in &reports {
        for (order, event_id) in &report.read_back {
            let row = rows.iter().find(|r| r.2.as_deref() == Some(order)).unwrap();
            assert_eq!(&row.1, event_id, "{language}: the id read back by its key");
        }
        // Bad inputs were refused with the field and its limit, and cost nothing else.
        assert!(!report.refused.is_empty(), "{language}");
        for message in &report.refused {
            assert!(message.starts_with("outbox: "), "{language}: {message}");
            assert!(
                message.contains("255 bytes") || message.contains("JSON text"),
                "{language}: {message}"
            );
        }
    }
}

#[test]
fn the_documented_examples_in_python_and_node_run_as_the_readme_shows() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db");
    assert!(common::outbox_cli(&db, &["init"]).status.success());
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sql");
    let mut ran = Vec::new();
    for (language, order) in [("python", "42"), ("node", "43")] {
        let mut command = match writer(language) {
            Ok(_) if language == "python" => {
                let mut c = Command::new("python3");
                c.arg(examples.join("place_order.py"));
                c
            }
            Ok(_) => {
                let mut c = Command::new("node");
                c.arg(examples.join("place_order.js"))
                    .env("NODE_PATH", polyglot_dir().join("node_modules"));
                c
            }
            Err(why) if required() => panic!("OUTBOX_REQUIRE_POLYGLOT=1 but {why}"),
            Err(why) => {
                eprintln!("skipped: the {language} example ({why})");
                continue;
            }
        };
        let child = command
            .arg(&db)
            .arg(order)
            .arg("990")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = finish(child, Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "{language}: {stdout} {:?}",
            output.stderr
        );
        assert!(
            stdout.contains(&format!("order {order} committed with event 01")),
            "{language}: {stdout}"
        );
        assert!(
            stdout.contains("refused: outbox: data must be JSON text"),
            "{language}: {stdout}"
        );
        ran.push(order);
    }
    let outbox = Outbox::open_existing(&db).unwrap();
    let rows = stored(&outbox);
    assert_eq!(
        rows.len(),
        ran.len(),
        "one event per example run, the bad one refused"
    );
    for (row, order) in rows.iter().zip(&ran) {
        assert_eq!(
            row.2.as_deref(),
            Some(format!("order-{order}-created").as_str())
        );
    }
}
