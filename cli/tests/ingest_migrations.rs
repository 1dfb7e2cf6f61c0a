//! PostgreSQL migrations while the ingest answers (issue 65, item 7): a migration that takes
//! longer than the ingest's statement timeouts finishes (it ran under them and was
//! cancelled for ever), every request meanwhile is answered 503 with Retry-After and the
//! health check says why, and a migration that fails logs the server's own words (the log
//! said only "db error").

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/ingest_process.rs"]
mod ingest_process;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::time::{Duration, Instant};

use ingest_process::Ingest;
use pg::Postgres;
use serde_json::json;
use sqlite_outbox::receive::Secret;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Brings a database the ingest migrated back to version 6, as a database of the last
/// release is: without the tables of migration 7.
fn back_to_version_6(postgres: &Postgres) {
    postgres
        .client()
        .batch_execute(
            "DROP TABLE outbox_fleet_streams, outbox_fleet_log;
             ALTER TABLE outbox_stream_reports DROP COLUMN report_seq;
             DELETE FROM outbox_pg_migrations WHERE version = 7;",
        )
        .unwrap();
}

fn post_one(ingest: &Ingest, id: &str) -> raw_http::Answer {
    let secret = Secret::parse(SECRET).unwrap();
    let body = json!({"specversion": "1.0", "id": id, "source": "/d/1", "type": "t",
                      "outboxstream": "fleet", "outboxseq": 1})
    .to_string()
    .into_bytes();
    raw_http::request(
        ingest.addr,
        "POST",
        "/events",
        &raw_http::signed_headers(&secret, id, &body, "application/cloudevents+json"),
        &body,
    )
    .unwrap()
}

#[test]
fn a_migration_longer_than_the_statement_timeouts_finishes_while_requests_get_503() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    drop(ingest);
    back_to_version_6(&postgres);
    // A long migration: another session holds the table migration 7 reads, for longer than
    // the probe's 5 s statement timeout.
    let mut holder = postgres.client();
    let mut hold = holder.transaction().unwrap();
    hold.batch_execute("LOCK TABLE outbox_ingested IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    let held_since = Instant::now();
    // The ingest answers at once, 503 with Retry-After, and says why.
    assert!(common::wait_until(Duration::from_secs(10), || {
        raw_http::request(ingest.addr, "GET", "/healthz", &[], b"").is_ok()
    }));
    let answer = post_one(&ingest, "during");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.header("retry-after").is_some());
    assert!(answer.body.contains("migrated"), "{}", answer.body);
    assert_ne!(ingest.healthz(), 200);
    while held_since.elapsed() < Duration::from_secs(7) {
        std::thread::sleep(Duration::from_millis(200));
    }
    hold.rollback().unwrap();
    assert!(
        ingest.wait_healthy(Duration::from_secs(30)),
        "{}",
        ingest.log_text()
    );
    assert_eq!(post_one(&ingest, "after").status, 204);
    let log = ingest.log_text();
    assert!(!log.contains("statement timeout"), "{log}");
    let version: i32 = postgres
        .client()
        .query_one("SELECT max(version) FROM outbox_pg_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, sqlite_outbox::receive::pg_schema_version());
}

#[test]
fn a_failed_migration_logs_the_servers_own_words() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    drop(ingest);
    back_to_version_6(&postgres);
    // A table of that name in the way (a hand made it): migration 7 cannot create its own.
    postgres
        .client()
        .batch_execute("CREATE TABLE outbox_fleet_streams (x int)")
        .unwrap();
    let ingest = Ingest::start(&postgres, &["--secret", SECRET]);
    assert!(common::wait_until(Duration::from_secs(20), || {
        ingest.log_text().contains("42P07")
    }));
    let log = ingest.log_text();
    assert!(log.contains("42P07: relation"), "{log}");
    assert!(log.contains("already exists"), "{log}");
    assert!(!log.contains("db error"), "{log}");
    assert_eq!(post_one(&ingest, "refused").status, 503);
}
