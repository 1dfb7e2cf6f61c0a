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

/// Brings a database back to version 5 as an older build left it: the numbers' own index
/// and the primary key without them.
fn back_to_version_5(postgres: &Postgres) {
    back_to_version_6(postgres);
    postgres
        .client()
        .batch_execute(
            "ALTER TABLE outbox_ingested DROP CONSTRAINT outbox_ingested_pkey,
                 ADD CONSTRAINT outbox_ingested_pkey PRIMARY KEY (source, id);
             CREATE INDEX outbox_ingested_stream_seq
                 ON outbox_ingested (source, stream, stream_seq) WHERE stream_seq IS NOT NULL;
             DELETE FROM outbox_pg_migrations WHERE version = 6;",
        )
        .unwrap();
}

fn store_row(client: &mut postgres::Client, id: &str) -> Result<u64, postgres::Error> {
    client.execute(
        "INSERT INTO outbox_ingested (source, id, type, stream, stream_seq)
         VALUES ('/d/1', $1, 't', 'fleet', 1)",
        &[&id],
    )
}

#[test]
fn the_key_is_rebuilt_concurrently_while_the_table_takes_writes_and_a_build_cut_short_is_redone() {
    let postgres = Postgres::start();
    sqlite_outbox::receive::pg_migrate(&mut postgres.client()).unwrap();
    back_to_version_5(&postgres);
    let mut writer = postgres.client();
    writer
        .batch_execute(
            "INSERT INTO outbox_ingested (source, id, type, stream, stream_seq)
             SELECT '/d/1', 'e' || n, 't', 'fleet', n FROM generate_series(1, 1000) AS n;
             SET statement_timeout = '3s';",
        )
        .unwrap();
    // A build cut short, as a crash leaves it: an invalid index under the new key's name
    // (a unique index on a column that repeats fails and stays behind, invalid).
    let failed = postgres.client().batch_execute(
        "CREATE UNIQUE INDEX CONCURRENTLY outbox_ingested_pkey_v6 ON outbox_ingested (source)",
    );
    assert!(failed.is_err());
    // A reader's open transaction: the rebuild (and the drop of the invalid index) waits
    // for it. A rebuild under the table's
    // lock (migration 6 before) queued behind it and every write queued behind the rebuild.
    let mut reader = postgres.client();
    let mut reading = reader.transaction().unwrap();
    reading
        .query_one("SELECT count(*) FROM outbox_ingested", &[])
        .unwrap();
    let migrating = {
        let mut client = postgres.client();
        std::thread::Builder::new()
            .name("migrate".into())
            .spawn(move || sqlite_outbox::receive::pg_migrate(&mut client))
            .unwrap()
    };
    let mut watcher = postgres.client();
    assert!(common::wait_until(Duration::from_secs(20), || {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE query LIKE '%INDEX CONCURRENTLY outbox_ingested_pkey_v6%'
                    AND wait_event_type = 'Lock'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1
    }));
    // The table takes writes while its key is rebuilt (within the writer's 3 s timeout).
    store_row(&mut writer, "during").expect("a write while the key is rebuilt");
    // Another process's migration meanwhile waits for the lock, then says it is in progress.
    let second = sqlite_outbox::receive::pg_migrate(&mut postgres.client()).unwrap_err();
    assert!(
        matches!(
            second,
            sqlite_outbox::Error::MigrationInProgress { waited } if waited >= Duration::from_secs(10)
        ),
        "{second}"
    );
    reading.commit().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !migrating.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        migrating.is_finished(),
        "the migration did not finish in 30 s"
    );
    migrating.join().unwrap().unwrap();
    let mut client = postgres.client();
    let key: String = client
        .query_one(
            "SELECT pg_get_indexdef('outbox_ingested_pkey'::regclass)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        key.contains("(source, id) INCLUDE (stream, stream_seq)"),
        "{key}"
    );
    let leftovers: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class
              WHERE relname IN ('outbox_ingested_pkey_v6', 'outbox_ingested_stream_seq')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(leftovers, 0);
    let invalid: i64 = client
        .query_one("SELECT count(*) FROM pg_index WHERE NOT indisvalid", &[])
        .unwrap()
        .get(0);
    assert_eq!(invalid, 0);
    // The key holds: the row written during the rebuild is there, once.
    assert_eq!(
        client
            .query_one(
                "SELECT count(*) FROM outbox_ingested WHERE id = 'during'",
                &[]
            )
            .unwrap()
            .get::<_, i64>(0),
        1
    );
    assert!(store_row(&mut client, "during").is_err());
    let version: i32 = client
        .query_one("SELECT max(version) FROM outbox_pg_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, sqlite_outbox::receive::pg_schema_version());
    // Migration 7 summarized the rows stored before and during the rebuild.
    let stored: String = client
        .query_one(
            "SELECT stored::text FROM outbox_fleet_streams WHERE source = '/d/1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(stored, "{[1,1001)}");
}
