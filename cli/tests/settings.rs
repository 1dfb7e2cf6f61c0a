//! Settings kept in the file: the Rust builder writes them (and says what it overrides),
//! `outbox config` reads and changes them with checks, and every writer follows them,
//! including an app that is already running.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{outbox_cli, query_rows, wait_until};
use serde_json::json;
use sqlite_outbox::{Event, Outbox, StoragePolicy};

/// Every warning logged in this test binary.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct CaptureWarnings;

impl log::Log for CaptureWarnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn capture_warnings() {
    static LOGGER: CaptureWarnings = CaptureWarnings;
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Warn);
}

/// The destinations of every row, in commit order.
fn destinations(outbox: &Outbox) -> Vec<String> {
    query_rows(
        outbox,
        "SELECT destination FROM outbox_events ORDER BY id",
        |r| r.get(0),
    )
}

#[test]
fn the_builder_writes_its_settings_and_warns_of_what_it_overrides() {
    capture_warnings();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let first = Outbox::builder()
        .route("order.*", "billing")
        .route("order.*", "audit")
        .max_pending(1000)
        .storage_policy("telemetry.*", StoragePolicy::DropOldest)
        .priority_for("alarm.*", 9)
        .expiry_for("telemetry.*", Duration::from_secs(600))
        .default_source("/shop/1")
        .open(&db)
        .unwrap();
    let stored = first.settings().unwrap();
    assert_eq!(stored["route:order.*"], r#"["billing","audit"]"#);
    assert_eq!(stored["max_pending"], "1000");
    assert_eq!(stored["policy:telemetry.*"], "drop_oldest");
    assert_eq!(stored["priority:alarm.*"], "9");
    assert_eq!(stored["expiry:telemetry.*"], "600000");
    assert_eq!(stored["default_source"], "/shop/1");

    // An opener that sets nothing follows the file.
    let plain = Outbox::open(&db).unwrap();
    let _ = plain
        .transaction(|tx| plain.enqueue(tx, Event::new("order.created", json!({}))))
        .unwrap();
    assert_eq!(destinations(&plain), ["billing", "audit"]);

    // An opener with other routes replaces the routes, and says so; the rest stays.
    WARNINGS.lock().unwrap().clear();
    let other = Outbox::builder().route("order.*", "erp").open(&db).unwrap();
    let stored = other.settings().unwrap();
    assert_eq!(stored["route:order.*"], r#"["erp"]"#);
    assert_eq!(stored["max_pending"], "1000", "kinds it did not set stay");
    let warnings = WARNINGS.lock().unwrap().clone();
    assert!(
        warnings.iter().any(|w| w.contains("route:order.*")
            && w.contains(r#"["billing","audit"]"#)
            && w.contains(r#"["erp"]"#)),
        "{warnings:?}"
    );
    // The same settings again change nothing and warn of nothing.
    WARNINGS.lock().unwrap().clear();
    Outbox::builder().route("order.*", "erp").open(&db).unwrap();
    assert!(WARNINGS
        .lock()
        .unwrap()
        .iter()
        .all(|w| !w.contains("setting")));
}

#[test]
fn a_running_app_follows_settings_changed_by_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("live.db");
    let app = Outbox::open(&db).unwrap();
    let enqueue = || {
        let _ = app
            .transaction(|tx| app.enqueue(tx, Event::new("order.created", json!({}))))
            .unwrap();
    };
    enqueue();
    let o = outbox_cli(&db, &["config", "set", "route:order.*", "billing"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        r#"route:order.* = ["billing"]"#
    );
    // Within a quarter second (bounded here by two seconds) the running app follows it.
    assert!(wait_until(Duration::from_secs(2), || {
        enqueue();
        destinations(&app).last().map(String::as_str) == Some("billing")
    }));
    assert_eq!(destinations(&app)[0], "default");
    let o = outbox_cli(&db, &["config", "unset", "route:order.*"]);
    assert!(o.status.success());
    assert!(wait_until(Duration::from_secs(2), || {
        enqueue();
        destinations(&app).last().map(String::as_str) == Some("default")
    }));
}

#[test]
fn the_cli_shows_checks_and_follows_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db");
    Outbox::open(&db).unwrap();
    let show = outbox_cli(&db, &["config", "show"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains("no settings stored"));
    for (key, value) in [
        ("route:order.*", "billing,audit"),
        ("expiry:telemetry.*", "10m"),
        ("priority:alarm.*", "9"),
        ("max_pending", "100"),
    ] {
        let o = outbox_cli(&db, &["config", "set", key, value]);
        assert!(
            o.status.success(),
            "{key}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let show = outbox_cli(&db, &["config", "show", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        shown,
        json!({
            "expiry:telemetry.*": "600000",
            "max_pending": "100",
            "priority:alarm.*": "9",
            "route:order.*": "[\"billing\",\"audit\"]",
        })
    );
    for (key, value, says) in [
        ("priority:alarm.*", "10", "0 (least urgent) to 9"),
        ("route:order.*", "no spaces allowed", "destination name"),
        ("expiry:x", "soon", "not a lifetime"),
        ("max_pending", "0", "at least 1"),
        ("colour", "blue", "unknown setting"),
        ("route:a*b", "x", "only at its end"),
    ] {
        let o = outbox_cli(&db, &["config", "set", key, value]);
        assert_eq!(o.status.code(), Some(2), "{key} {value}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(says), "{key} {value}: {stderr}");
    }
    let again = outbox_cli(&db, &["config", "show", "--json"]);
    assert_eq!(again.stdout, show.stdout, "refused values wrote nothing");

    // The CLI's own enqueue follows the routes, and refuses an unrouted type.
    let o = outbox_cli(&db, &["enqueue", "--type", "order.created"]);
    assert!(o.status.success());
    let outbox = Outbox::open_existing(&db).unwrap();
    assert_eq!(destinations(&outbox), ["billing", "audit"]);
    let o = outbox_cli(&db, &["enqueue", "--type", "door.opened"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no route"));
}

#[test]
fn settings_changed_while_a_relay_runs_apply_to_the_next_events_and_nothing_stops() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("running.db");
    let outbox = Outbox::open(&db).unwrap();
    let receiver = common::TestReceiver::ok();
    let relay = outbox
        .relay(common::fast(sqlite_outbox::RelayConfig::http(
            receiver.url(),
        )))
        .start()
        .unwrap();
    let app = sqlite_outbox::rusqlite::Connection::open(&db).unwrap();
    let insert = |n: i64| {
        app.execute(
            "INSERT INTO outbox_enqueue (type, data) VALUES ('order.created', ?1)",
            [n.to_string()],
        )
        .unwrap();
    };
    insert(1);
    assert!(wait_until(Duration::from_secs(20), || receiver
        .event_count()
        == 1));
    // The operator changes the source and the payload limit while the relay runs.
    for (key, value) in [("default_source", "/plant/9"), ("payload_limit", "1000")] {
        let o = outbox_cli(&db, &["config", "set", key, value]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    insert(2);
    let big = format!("\"{}\"", "x".repeat(2_000));
    let refused = app
        .execute(
            "INSERT INTO outbox_enqueue (type, data) VALUES ('order.created', ?1)",
            [big],
        )
        .unwrap_err();
    assert!(refused.to_string().contains("payload limit"), "{refused}");
    assert!(wait_until(Duration::from_secs(20), || receiver
        .event_count()
        == 2));
    let shutdown = relay.shutdown();
    let sources: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.body["source"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(sources, ["/sqlite-outbox", "/plant/9"]);
    assert_eq!(
        (shutdown.abandoned, shutdown.writer_restarts),
        (0, 0),
        "{shutdown:?}"
    );
}
