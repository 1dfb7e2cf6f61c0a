//! Nothing silent at any size (issue 65): the review's cases against a real PostgreSQL,
//! `outbox ingest` and `outbox fleet`: the app's own cleanup and a hand's delete leave no
//! event unnumbered and no gap unnamed; synced-through stops below a number the fleet never
//! stored; a copy of a stored event under another number (a second destination, a
//! redelivery) counts as stored; hostile accountings are escaped, bounded and refused; a
//! device gone silent with numbers pending is incomplete; the streams' summaries are built
//! from the events stored before migration 7.

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
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SOURCE: &str = "/devices/65";

fn device(path: &Path, routes: &[&str]) -> Outbox {
    let mut builder = Outbox::builder().default_source(SOURCE);
    for destination in routes {
        builder = builder.route("*", *destination);
    }
    builder.open(path).unwrap()
}

fn enqueue(outbox: &Outbox, event: Event) {
    let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
}

/// A relay for `destinations` (each to `url`, with receipts if `receipt_key`), run until
/// nothing is pending, then stopped (its last accounting told).
fn deliver(outbox: &Outbox, url: &str, destinations: &[&str], receipt_key: Option<&str>) {
    let mut config = RelayConfig::new();
    for name in destinations {
        let mut destination = Destination::http(*name, url)
            .secret(SECRET)
            .batch(2, 1 << 20);
        if let Some(key) = receipt_key {
            destination = destination.receipt_key(key);
        }
        config = config.destination(destination);
    }
    let relay = outbox
        .relay(
            common::fast(config)
                .max_attempts(3)
                .accounting_interval(Duration::from_secs(1)),
        )
        .start()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(30), || {
        outbox.pending_count(None).unwrap() == 0
    }));
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
}

fn fleet(postgres: &Postgres, args: &[&str]) -> (Vec<Value>, i32) {
    ingest_process::fleet_json(postgres, args)
}

fn stream<'a>(streams: &'a [Value], name: &str) -> &'a Value {
    streams
        .iter()
        .find(|s| s["destination"] == name)
        .unwrap_or_else(|| panic!("no stream {name} in {streams:?}"))
}

fn unnumbered_at_the_fleet(postgres: &Postgres) -> i64 {
    postgres
        .client()
        .query_one(
            "SELECT count(*) FROM outbox_ingested WHERE stream_seq IS NULL",
            &[],
        )
        .unwrap()
        .get(0)
}

/// A PostgreSQL cluster and an `outbox ingest` that signs receipts, healthy; the ingest's
/// public key.
fn ingest_with_receipts(dir: &Path) -> (Postgres, Ingest, String) {
    let (key_file, public) = ingest_process::keygen(dir, "ingest.key");
    let postgres = Postgres::start();
    let ingest = Ingest::start(
        &postgres,
        &[
            "--secret",
            SECRET,
            "--receipt-key",
            key_file.to_str().unwrap(),
        ],
    );
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    (postgres, ingest, public)
}

/// The review's first case: an app deletes its delivered rows itself (the newest among
/// them), commits three events and loses one by hand. Before schema 17 the next rows took
/// the deleted ids again and were never numbered: the fleet stored them without numbers and
/// said "HIGH 3, STORED 3, MISSING -", exit 0.
#[test]
fn the_apps_own_cleanup_and_a_hand_delete_leave_no_event_unnumbered_and_no_gap_unnamed() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("device.db");
    let outbox = device(&db, &["fleet"]);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    deliver(&outbox, &ingest.url(), &["fleet"], None);
    let app = sqlite_outbox::rusqlite::Connection::open(&db).unwrap();
    app.execute("DELETE FROM outbox_events", []).unwrap();
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"late": i})));
    }
    app.execute(
        "DELETE FROM outbox_events WHERE payload = '{\"late\":1}'",
        [],
    )
    .unwrap();
    deliver(&outbox, &ingest.url(), &["fleet"], None);
    assert_eq!(unnumbered_at_the_fleet(&postgres), 0);
    let (streams, code) = fleet(&postgres, &[]);
    let s = stream(&streams, "fleet");
    assert_eq!(s["high_water"], 6, "{s}");
    assert_eq!(s["stored"], 5, "{s}");
    assert_eq!(s["missing"], json!([[5, 5]]), "{s}");
    assert_eq!(code, 1);
}

/// The review's second case: the second of three events deleted by hand before any relay
/// saw it; the relay delivers with receipts. The fleet names 2 missing, and the device's
/// synced-through stops at 1 (it said 3).
#[test]
fn synced_through_stops_below_a_number_the_fleet_never_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (postgres, ingest, public) = ingest_with_receipts(dir.path());
    let db = dir.path().join("device.db");
    let outbox = device(&db, &["fleet"]);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    sqlite_outbox::rusqlite::Connection::open(&db)
        .unwrap()
        .execute("DELETE FROM outbox_events WHERE payload = '{\"i\":1}'", [])
        .unwrap();
    deliver(&outbox, &ingest.url(), &["fleet"], Some(&public));
    let (streams, _) = fleet(&postgres, &[]);
    let s = stream(&streams, "fleet");
    assert_eq!(s["missing"], json!([[2, 2]]), "{s}");
    assert!(s["reported_at"].is_string(), "the device reported: {s}");
    let synced = outbox.synced_through("fleet").unwrap().unwrap();
    assert_eq!(synced.through, 1);
}

/// The review's third case: one event routed to two destinations that post to the same
/// ingest, then redelivered. The ingest stores each `(source, id)` once; the copies'
/// numbers (stream `backup`, and `fleet` 4-6 of the redelivery) are recorded as stored
/// and covered by receipts. Before, the fleet named them missing for good ("STORED 0,
/// MISSING 1-3", "MISSING 4-6").
#[test]
fn a_copy_stored_before_under_another_number_counts_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (postgres, ingest, public) = ingest_with_receipts(dir.path());
    let outbox = device(&dir.path().join("device.db"), &["fleet", "backup"]);
    for i in 0..3 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    deliver(&outbox, &ingest.url(), &["fleet", "backup"], Some(&public));
    let redelivered = outbox
        .redeliver(&sqlite_outbox::Redelivery::to("fleet"))
        .unwrap();
    assert_eq!(redelivered, 3);
    deliver(&outbox, &ingest.url(), &["fleet", "backup"], Some(&public));
    let stored: i64 = postgres
        .client()
        .query_one("SELECT count(*) FROM outbox_ingested", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, 3, "each event stored once");
    let (streams, code) = fleet(&postgres, &[]);
    for (name, high) in [("fleet", 6), ("backup", 3)] {
        let s = stream(&streams, name);
        assert_eq!(s["high_water"], high, "{s}");
        assert_eq!(s["stored"], high, "{s}");
        assert_eq!(s["missing"], json!([]), "{s}");
        assert_eq!(s["reused"], json!([]), "{s}");
    }
    assert_eq!(code, 0);
    // Every copy was counted delivered with a receipt that covered it.
    assert_eq!(outbox.synced_through("fleet").unwrap().unwrap().through, 6);
    assert_eq!(outbox.synced_through("backup").unwrap().unwrap().through, 3);
}

/// A batch of CloudEvents signed with the shared secret, posted to the ingest.
fn post_batch(ingest: &Ingest, events: &[Value]) -> raw_http::Answer {
    let secret = Secret::parse(SECRET).unwrap();
    let body = serde_json::to_vec(events).unwrap();
    let id = format!("msg-{}", events.len());
    raw_http::request(
        ingest.addr,
        "POST",
        "/events",
        &raw_http::signed_headers(&secret, &id, &body, "application/cloudevents-batch+json"),
        &body,
    )
    .unwrap()
}

fn accounting(id: &str, source: &str, stream: &str, high_water: i64, pending: Value) -> Value {
    json!({"specversion": "1.0", "id": id, "source": source,
           "type": sqlite_outbox::wire::ACCOUNTING_TYPE, "outboxstream": stream,
           "datacontenttype": "application/json",
           "data": {"stream": stream, "high_water": high_water, "pending": pending}})
}

/// The review's last cases: a device's key printing terminal control sequences through
/// `outbox fleet`, wrapping the missing total with a high water of 2^63-1, inventing 2,000
/// streams in one request and more across requests.
#[test]
fn hostile_accountings_are_escaped_bounded_and_refused() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(
        &postgres,
        &[
            "--secret",
            SECRET,
            "--max-streams-per-source",
            "100",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let red = "\u{1b}[31mred\u{1b}]0;owned\u{7}";
    let answer = post_batch(&ingest, &[accounting("a1", "/d/esc", red, 2, json!([]))]);
    assert_eq!(answer.status, 204, "{}", answer.body);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", &postgres.url()])
        .output()
        .unwrap();
    assert!(
        !out.stdout.contains(&0x1b),
        "an escape reached the terminal"
    );
    assert!(!out.stdout.contains(&0x07));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\\u{1b}[31mred"), "{text}");
    assert_eq!(out.status.code(), Some(1), "1-2 missing: {text}");

    // Numbers past 2^53-1 are refused, in an accounting and on an event.
    let answer = post_batch(
        &ingest,
        &[accounting("a2", "/d/huge", "fleet", i64::MAX, json!([]))],
    );
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("out of range"), "{}", answer.body);
    let event = json!({"specversion": "1.0", "id": "e1", "source": "/d/huge", "type": "t",
                       "outboxstream": "fleet", "outboxseq": i64::MAX.to_string()});
    let answer = post_batch(&ingest, &[event]);
    assert_eq!(answer.status, 400, "{}", answer.body);

    // Streams per source: 2,000 in one request, then 60 and 60 more across two.
    let many: Vec<Value> = (0..2_000)
        .map(|i| {
            accounting(
                &format!("m{i}"),
                "/d/many",
                &format!("s{i}"),
                1,
                json!([[1, 1]]),
            )
        })
        .collect();
    let answer = post_batch(&ingest, &many);
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(answer.body.contains("at most 100"), "{}", answer.body);
    let first: Vec<Value> = (0..60)
        .map(|i| {
            accounting(
                &format!("f{i}"),
                "/d/many",
                &format!("s{i}"),
                1,
                json!([[1, 1]]),
            )
        })
        .collect();
    assert_eq!(post_batch(&ingest, &first).status, 204);
    let second: Vec<Value> = (60..120)
        .map(|i| {
            accounting(
                &format!("g{i}"),
                "/d/many",
                &format!("s{i}"),
                1,
                json!([[1, 1]]),
            )
        })
        .collect();
    assert_eq!(post_batch(&ingest, &second).status, 422);
    // The streams already known still take their reports.
    assert_eq!(post_batch(&ingest, &first[..10]).status, 204);
    let (streams, _) = fleet(&postgres, &["--source", "/d/many"]);
    assert_eq!(streams.len(), 60);
    assert!(
        ingest
            .metrics()
            .contains("outbox_ingest_refusals_total{reason=\"streams_per_source\"} 2"),
        "{}",
        ingest.metrics()
    );
}

/// A device that reported numbers pending, then went silent: complete while the silence is
/// short, incomplete (exit 1, `silent`) once it is longer than `--silent-after`. Before,
/// such a stream counted as complete for ever.
#[test]
fn a_device_gone_silent_with_numbers_pending_is_incomplete() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let answer = post_batch(
        &ingest,
        &[accounting("s1", "/d/quiet", "fleet", 3, json!([[1, 3]]))],
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    let (streams, code) = fleet(&postgres, &[]);
    assert_eq!((streams[0]["silent"].clone(), code), (json!(false), 0));
    std::thread::sleep(Duration::from_millis(1_500));
    let (streams, code) = fleet(&postgres, &["--silent-after", "1s"]);
    assert_eq!(streams[0]["silent"], true, "{streams:?}");
    assert_eq!(streams[0]["pending_on_device"], 3);
    assert_eq!(code, 1);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", &postgres.url(), "--silent-after", "1s"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("SILENT"));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", &postgres.url(), "--silent-after", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// PostgreSQL migration 7 builds the streams' summaries from the events stored before it:
/// the view read from the summaries afterwards is the one read before them.
#[test]
fn migration_7_builds_the_summaries_from_the_events_stored_before_it() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("device.db");
    let outbox = device(&db, &["fleet"]);
    for i in 0..6 {
        enqueue(&outbox, Event::new("doc.saved", json!({"i": i})));
    }
    sqlite_outbox::rusqlite::Connection::open(&db)
        .unwrap()
        .execute("DELETE FROM outbox_events WHERE payload = '{\"i\":3}'", [])
        .unwrap();
    deliver(&outbox, &ingest.url(), &["fleet"], None);
    drop(ingest);
    let (before, code_before) = fleet(&postgres, &[]);
    assert_eq!(stream(&before, "fleet")["missing"], json!([[4, 4]]));
    // As a database migrated to version 6 only would be, with those events in it.
    postgres
        .client()
        .batch_execute(
            "DROP TABLE outbox_fleet_streams, outbox_fleet_log; ALTER TABLE outbox_stream_reports DROP COLUMN report_seq; DELETE FROM outbox_pg_migrations WHERE version = 7;",
        )
        .unwrap();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let (after, code_after) = fleet(&postgres, &[]);
    assert_eq!(after, before);
    assert_eq!(code_after, code_before);
}

/// The review's fourth case: a device whose history left 100,000 scattered coalesced
/// numbers. Before, every accounting resent every fate (a 1.49 MB body, 413 for ever: no
/// report landed, synced-through stayed null). Now the relay tells them over reports of
/// at most 20,000 ranges, forgets each fate the ingest took, and tells nothing again.
#[test]
fn a_hundred_thousand_scattered_fates_are_told_once_in_bounded_reports_and_forgotten() {
    const FATES: i64 = 100_000;
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("device.db");
    let outbox = device(&db, &["fleet"]);
    // A long life, as the file keeps it: numbers 1 to 200,000 given, the even ones delivered
    // and pruned long ago, the odd ones replaced by newer events of their coalescing keys.
    let app = sqlite_outbox::rusqlite::Connection::open(&db).unwrap();
    app.execute(
        "INSERT INTO outbox_streams (destination, source, high_water) VALUES ('fleet', ?1, ?2)",
        sqlite_outbox::rusqlite::params![SOURCE, 2 * FATES],
    )
    .unwrap();
    app.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 2 FROM n WHERE i + 2 < ?2)
         INSERT INTO outbox_fates (destination, source, stream_seq, fate)
         SELECT 'fleet', ?1, i, 'coalesced' FROM n",
        sqlite_outbox::rusqlite::params![SOURCE, 2 * FATES],
    )
    .unwrap();
    let relay = outbox
        .relay(
            common::fast(
                // Told from the start: this device delivers nothing in the run (its whole
                // history is fates), so the ingest never answers a 2xx that says it takes
                // accountings, and no earlier relay told it one.
                RelayConfig::new().destination(
                    Destination::http("fleet", ingest.url())
                        .secret(SECRET)
                        .accounting(true),
                ),
            )
            .accounting_interval(Duration::from_secs(1)),
        )
        .start()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(60), || {
        outbox
            .synced_through("fleet")
            .unwrap()
            .is_some_and(|s| s.through == 2 * FATES)
    }));
    // A few more rounds: nothing is told again.
    std::thread::sleep(Duration::from_secs(3));
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
    let kept: i64 = app
        .query_row("SELECT COUNT(*) FROM outbox_fates", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 0, "the fates the ingest took are forgotten");
    let (reports, seq): (i64, Option<i64>) = {
        let row = postgres
            .client()
            .query_one(
                "SELECT count(*), max(report_seq) FROM outbox_stream_reports",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(reports, 1);
    assert_eq!(seq, Some(5), "100,000 ranges in five reports, none since");
    assert!(
        !ingest.log_text().contains("refused"),
        "{}",
        ingest.log_text()
    );
    let (streams, _) = fleet(&postgres, &[]);
    let s = stream(&streams, "fleet");
    assert_eq!(s["accounted"]["coalesced"], FATES);
    assert_eq!(s["high_water"], 2 * FATES);
}
