//! Nothing silently missing (issue 58): a device's relay, `outbox ingest` and PostgreSQL, and
//! `outbox fleet`, which names for each stream what is stored, what left the device on
//! purpose (expired, dropped, coalesced, dead, purged, exported), what is still pending on
//! the device, and exactly the numbers that are missing or were reused.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/ingest_process.rs"]
mod ingest_process;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ingest_process::Ingest;
use pg::Postgres;
use serde_json::{json, Value};
use sqlite_outbox::receive::Secret;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig, StoragePolicy};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SOURCE: &str = "/devices/17";

/// The device's relay to `url`, run until nothing is pending for it, then stopped (its
/// last accounting told).
fn deliver(outbox: &Outbox, url: &str) {
    let relay = outbox
        .relay(
            common::fast(
                RelayConfig::new().destination(
                    Destination::http("fleet", url)
                        .secret(SECRET)
                        .batch(5, 1 << 20),
                ),
            )
            .max_attempts(3),
        )
        .start()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(30), || {
        outbox.pending_count(None).unwrap() == 0
    }));
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
}

fn enqueue(outbox: &Outbox, event: Event) {
    let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
}

/// `outbox fleet --json` (of `SOURCE` only, if `only`): its streams and its exit code.
fn fleet(postgres: &Postgres, only: bool) -> (Vec<Value>, i32) {
    let args: &[&str] = if only { &["--source", SOURCE] } else { &[] };
    ingest_process::fleet_json(postgres, args)
}

fn device(path: &Path) -> Outbox {
    Outbox::builder()
        .default_source(SOURCE)
        .route("*", "fleet")
        .max_pending(12)
        .storage_policy("telemetry.*", StoragePolicy::DropOldest)
        .open(path)
        .unwrap()
}

#[test]
fn the_fleet_names_every_number_stored_accounted_pending_and_exactly_the_missing_ones() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    let outbox = device(&dir.path().join("device.db"));

    // 1-5 delivered.
    for i in 0..5 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    deliver(&outbox, &ingest.url());
    // 6-7 expire while the ingest is down: its relay finds nobody at the address, the
    // events' deadline passes, and it marks them expired.
    let down_url = ingest.url();
    drop(ingest);
    for i in 0..2 {
        enqueue(
            &outbox,
            Event::new("doc.saved", json!({"late": i})).expires_in(Duration::from_millis(300)),
        );
    }
    deliver(&outbox, &down_url);
    let expired = common::query_rows(
        &outbox,
        "SELECT COUNT(*) FROM outbox_events WHERE expired_at IS NOT NULL",
        |r| r.get::<_, i64>(0),
    );
    assert_eq!(expired, vec![2]);
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    // 8-19 telemetry into a full store (12 pending at most, 6 and 7 still among them):
    // the oldest telemetry is dropped.
    for i in 0..12 {
        enqueue(&outbox, Event::new("telemetry.temp", json!({"i": i})));
    }
    // 20 replaced by 21 (coalesced); 22 an event the ingest cannot store (dead).
    enqueue(
        &outbox,
        Event::new("ui.state", json!({"w": 1})).coalesce_key("window"),
    );
    enqueue(
        &outbox,
        Event::new("ui.state", json!({"w": 2})).coalesce_key("window"),
    );
    enqueue(&outbox, Event::new("doc.saved", json!({"nul": "a\u{0}b"})));
    deliver(&outbox, &ingest.url());
    // 23 dead, then purged with 22; 24 dead and kept.
    enqueue(&outbox, Event::new("doc.saved", json!({"nul": "c\u{0}d"})));
    deliver(&outbox, &ingest.url());
    outbox.purge_dead(None).unwrap();
    enqueue(&outbox, Event::new("doc.saved", json!({"nul": "e\u{0}f"})));
    deliver(&outbox, &ingest.url());
    // 25-26 exported and imported (stored); 27-28 exported, carried nowhere yet.
    let secret = Secret::parse(SECRET).unwrap();
    for i in 0..4 {
        enqueue(&outbox, Event::new("doc.saved", json!({"carried": i})));
    }
    let imported = dir.path().join("imported.bundle");
    assert_eq!(
        outbox.export(&imported, &secret, "fleet", 2).unwrap().count,
        2
    );
    assert_eq!(
        outbox
            .export(&dir.path().join("kept.bundle"), &secret, "fleet", 2)
            .unwrap()
            .count,
        2
    );
    let report = sqlite_outbox::bundle::import(
        &imported,
        &secret,
        &ingest.url(),
        &sqlite_outbox::bundle::ImportOptions::default(),
    )
    .unwrap();
    assert_eq!(report.delivered, 2);
    // 29-33: three of them (29, 31, 32) deleted by hand before any relay saw them.
    for i in 0..5 {
        enqueue(&outbox, Event::new("doc.saved", json!({"last": i})));
    }
    outbox
        .connection()
        .unwrap()
        .execute(
            "DELETE FROM outbox_events
              WHERE payload IN ('{\"last\":0}', '{\"last\":2}', '{\"last\":3}')",
            [],
        )
        .unwrap();
    // 34 stays pending: committed after the last relay stopped... and told nowhere yet.
    deliver(&outbox, &ingest.url());
    enqueue(&outbox, Event::new("doc.saved", json!({"after": 1})));

    // The fates the ingest took are forgotten on the device (issue 65: accounting bounded
    // for a device's lifetime): no deleted row's fate is kept once told.
    let kept_fates = common::query_rows(
        &outbox,
        "SELECT COUNT(*) FROM outbox_fates WHERE destination = 'fleet'",
        |r| r.get::<_, i64>(0),
    );
    assert_eq!(kept_fates, vec![0]);
    let (streams, code) = fleet(&postgres, true);
    println!("{}", serde_json::to_string_pretty(&streams).unwrap());
    assert_eq!(streams.len(), 1, "{streams:?}");
    let s = &streams[0];
    assert_eq!(s["source"], SOURCE);
    assert_eq!(s["destination"], "fleet");
    // The last report came before 34 was committed.
    assert_eq!(s["high_water"], 33);
    assert_eq!(s["missing"], json!([[29, 29], [31, 32]]), "{s}");
    assert_eq!(s["reused"], json!([]));
    assert_eq!(code, 1, "missing numbers: exit 1");
    let accounted = &s["accounted"];
    assert_eq!(accounted["expired"], 2);
    assert_eq!(accounted["coalesced"], 1);
    assert_eq!(accounted["dead"], 1, "24");
    assert_eq!(accounted["purged"], 2, "22 and 23");
    assert_eq!(accounted["exported"], 2, "27 and 28; 25 and 26 are stored");
    assert!(accounted["dropped"].as_i64().unwrap() >= 1, "{s}");
    assert_eq!(s["pending_on_device"], 0);
    // Every number 1-33 is stored, accounted or missing, each once.
    let counted = s["stored"].as_i64().unwrap()
        + [
            "expired",
            "dropped",
            "coalesced",
            "dead",
            "purged",
            "exported",
        ]
        .iter()
        .map(|f| accounted[f].as_i64().unwrap())
        .sum::<i64>()
        + 3;
    assert_eq!(counted, 33, "{s}");
    assert_eq!(s["stored_through"], 28);
    assert!(s["reported_at"].is_string());
}

#[test]
fn a_device_restored_from_an_older_copy_of_its_file_shows_its_reused_numbers() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device.db");
    let outbox = device(&path);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    deliver(&outbox, &ingest.url());
    let (streams, code) = fleet(&postgres, false);
    assert_eq!((streams[0]["stored_through"].clone(), code), (json!(3), 0));
    // A copy of the file (a backup), then two more events delivered.
    let backup = dir.path().join("backup.db");
    outbox
        .connection()
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    for i in 3..5 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    deliver(&outbox, &ingest.url());
    drop(outbox);
    // The device is restored from the backup, and commits new events: 4 and 5 again.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    std::fs::copy(&backup, &path).unwrap();
    let outbox = device(&path);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"restored": i})));
    }
    deliver(&outbox, &ingest.url());
    let (streams, code) = fleet(&postgres, false);
    let s = &streams[0];
    assert_eq!(s["reused"], json!([[4, 5]]), "{s}");
    assert_eq!(s["high_water"], 6);
    assert_eq!(s["missing"], json!([]));
    assert_eq!(code, 1, "reused numbers: exit 1");
}

#[test]
fn bad_input_exits_2_and_an_empty_fleet_exits_0() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", "postgresql://u@127.0.0.1/db?sslmode=bogus"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", &postgres.url()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no streams yet"));
}

/// A relay to `url` requiring receipts signed by `receipt_key`, telling its accounting
/// every second.
fn relay_with_receipts(
    outbox: &Outbox,
    url: &str,
    receipt_key: &str,
) -> sqlite_outbox::RelayHandle {
    outbox
        .relay(
            common::fast(
                RelayConfig::new().destination(
                    Destination::http("fleet", url)
                        .secret(SECRET)
                        .receipt_key(receipt_key)
                        .batch(2, 1 << 20),
                ),
            )
            .max_attempts(2)
            .accounting_interval(Duration::from_secs(1)),
        )
        .start()
        .unwrap()
}

#[test]
fn a_2xx_without_a_receipt_delivers_nothing_and_synced_through_follows_the_receipts() {
    let dir = tempfile::tempdir().unwrap();
    let (receipt_file, receipt_public) = ingest_process::keygen(dir.path(), "ingest.key");
    let postgres = Postgres::start();
    let ingest = Ingest::start(
        &postgres,
        &[
            "--secret",
            SECRET,
            "--receipt-key",
            receipt_file.to_str().unwrap(),
        ],
    );
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let db = dir.path().join("device.db");
    let outbox = device(&db);
    assert_eq!(outbox.synced_through("fleet").unwrap(), None);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    let relay = relay_with_receipts(&outbox, &ingest.url(), &receipt_public);
    assert!(common::wait_until(Duration::from_secs(20), || {
        outbox
            .synced_through("fleet")
            .unwrap()
            .is_some_and(|s| s.through == 3)
    }));
    let _ = relay.shutdown();

    // A stand-in answers 200 to everything, without a receipt (a captive portal).
    let stand_in = common::TestReceiver::start(0, |_| common::Reply::Status(200));
    for i in 3..5 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    let relay = relay_with_receipts(&outbox, &stand_in.url(), &receipt_public);
    assert!(common::wait_until(Duration::from_secs(20), || stand_in
        .count()
        >= 2));
    std::thread::sleep(Duration::from_secs(1));
    let _ = relay.shutdown();
    let rows = common::rows(&outbox);
    let late: Vec<_> = rows.iter().skip(3).collect();
    assert!(
        late.iter()
            .all(|r| !r.delivered && !r.dead && r.attempts == 0),
        "{late:?}"
    );
    assert!(
        late.iter().all(|r| r
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("without a valid receipt"))),
        "{late:?}"
    );
    assert_eq!(outbox.synced_through("fleet").unwrap().unwrap().through, 3);

    // The ingest again: delivered with receipts, and synced through all five.
    let relay = relay_with_receipts(&outbox, &ingest.url(), &receipt_public);
    assert!(common::wait_until(Duration::from_secs(20), || {
        outbox
            .synced_through("fleet")
            .unwrap()
            .is_some_and(|s| s.through == 5)
    }));
    let _ = relay.shutdown();
    let stats = common::outbox_cli(&db, &["stats", "--json"]);
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    let fleet = stats["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "fleet")
        .unwrap()
        .clone();
    assert_eq!(fleet["synced_through"]["through"], 5, "{fleet}");

    // The CLI's flag: a malformed key is bad input.
    let out = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &ingest.url(),
            "--receipt-public-key",
            "whpk_nope",
            "--until-empty",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
