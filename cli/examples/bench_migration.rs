//! What the ingest's PostgreSQL migrations cost a big table (issue 65, item 7): a database
//! of the release before stream numbers (version 4) holding N events (20 million by
//! default), migrated to the current version while a writer stores one event at a time
//! beside it (as an ingest of the older release still running does during a rolling
//! upgrade), with the ingest's 5 s statement timeout.
//!
//! Two ways, same database, same run: the shipped migrations 5 and 6 as they were (the new
//! key's index rebuilt by `ALTER TABLE` under the table's lock), then, on the database put
//! back to version 4, [`pg_migrate`](sqlite_outbox::receive::pg_migrate) as it is now (the
//! index built concurrently, the key swapped onto it). For each: how long the migration
//! took, how many writes went through meanwhile, the slowest write and how many failed.
//!
//! ```text
//! cargo run --release -p outbox-cli --example bench_migration            # 20M events
//! cargo run --release -p outbox-cli --example bench_migration -- 100000  # a quick look
//! ```

#[path = "../../tests/common/postgres.rs"]
mod support_postgres;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Migrations 5 and 6 as they shipped before the concurrent build.
const SHIPPED_5_AND_6: &str = "
    ALTER TABLE outbox_ingested ADD COLUMN stream text, ADD COLUMN stream_seq bigint;
    CREATE INDEX outbox_ingested_stream_seq
        ON outbox_ingested (source, stream, stream_seq) WHERE stream_seq IS NOT NULL;
    CREATE TABLE outbox_stream_reports (
        source text NOT NULL, stream text NOT NULL, high_water bigint NOT NULL,
        pending jsonb NOT NULL, accounted jsonb NOT NULL,
        reported_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (source, stream));
    INSERT INTO outbox_pg_migrations (version) VALUES (5);
    ALTER TABLE outbox_ingested
        DROP CONSTRAINT outbox_ingested_pkey,
        ADD CONSTRAINT outbox_ingested_pkey PRIMARY KEY (source, id) INCLUDE (stream, stream_seq);
    DROP INDEX outbox_ingested_stream_seq;
    INSERT INTO outbox_pg_migrations (version) VALUES (6);";

/// From any later version back to 4: the tables of 5 to 7 dropped, the plain key back.
const BACK_TO_4: &str = "
    DROP TABLE IF EXISTS outbox_fleet_streams, outbox_fleet_log, outbox_stream_reports;
    ALTER TABLE outbox_ingested
        DROP CONSTRAINT IF EXISTS outbox_ingested_pkey,
        DROP COLUMN IF EXISTS stream,
        DROP COLUMN IF EXISTS stream_seq,
        ADD CONSTRAINT outbox_ingested_pkey PRIMARY KEY (source, id);
    DELETE FROM outbox_pg_migrations WHERE version > 4;";

/// What the writer beside a migration saw.
struct Writes {
    done: u64,
    failed: u64,
    slowest: Duration,
}

/// Stores one event at a time, each with the ingest's 5 s statement timeout, until told
/// to stop.
fn writer(
    postgres: &support_postgres::Postgres,
    run: &'static str,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Writes> {
    let mut client = postgres.client();
    client
        .batch_execute("SET statement_timeout = '5s'")
        .expect("timeout");
    std::thread::Builder::new()
        .name("writer".into())
        .spawn(move || {
            let mut writes = Writes {
                done: 0,
                failed: 0,
                slowest: Duration::ZERO,
            };
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                let stored = client.execute(
                    "INSERT INTO outbox_ingested (source, id, type, data)
                     VALUES ('/devices/writer', $1, 'reading.taken', '{}')",
                    &[&format!("{run}-{n}")],
                );
                writes.slowest = writes.slowest.max(started.elapsed());
                match stored {
                    Ok(_) => writes.done += 1,
                    Err(_) => writes.failed += 1,
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            writes
        })
        .expect("the writer's thread")
}

/// Runs `migrate` with a writer beside it: how long it took and what the writer saw.
fn beside_a_writer(
    postgres: &support_postgres::Postgres,
    run: &'static str,
    migrate: impl FnOnce(),
) -> (Duration, Writes) {
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writer(postgres, run, stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    migrate();
    let took = started.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    (took, writing.join().expect("the writer"))
}

fn row(way: &str, took: Duration, writes: &Writes) {
    println!(
        "| {way} | {:.1} s | {} | {} | {:.0} ms |",
        took.as_secs_f64(),
        writes.done,
        writes.failed,
        writes.slowest.as_secs_f64() * 1000.0
    );
}

fn main() {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("PostgreSQL is not installed: no migration rows");
        std::process::exit(1);
    }
    let events: i64 = match std::env::args().nth(1) {
        Some(n) => n.parse().expect("a number of events"),
        None => 20_000_000,
    };
    let postgres = support_postgres::Postgres::start();
    let mut client = postgres.client();
    sqlite_outbox::receive::pg_migrate(&mut client).expect("the tables");
    client.batch_execute(BACK_TO_4).expect("version 4");
    let filling = Instant::now();
    client
        .execute(
            "INSERT INTO outbox_ingested (source, id, type, data)
             SELECT '/devices/' || (n % 10000), n::text, 'reading.taken',
                    jsonb_build_object('n', n)
               FROM generate_series(1, $1::int8) AS n",
            &[&events],
        )
        .expect("events stored");
    client.batch_execute("VACUUM ANALYZE").expect("vacuum");
    eprintln!(
        "{events} events stored in {:.0} s",
        filling.elapsed().as_secs_f64()
    );
    println!(
        "| {events} events, version 4 to {} | migration | writes beside it | failed (5 s timeout) | slowest write |",
        sqlite_outbox::receive::pg_schema_version()
    );
    println!("|---|---|---|---|---|");
    let (took, writes) = beside_a_writer(&postgres, "shipped", || {
        let mut client = postgres.client();
        let mut tx = client.transaction().expect("a transaction");
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .expect("no timeout");
        tx.batch_execute(SHIPPED_5_AND_6)
            .expect("migrations 5 and 6");
        tx.commit().expect("commit");
        sqlite_outbox::receive::pg_migrate(&mut client).expect("migration 7");
    });
    row(
        "5 and 6 as shipped (key rebuilt under the table's lock), then 7",
        took,
        &writes,
    );
    client.batch_execute(BACK_TO_4).expect("version 4 again");
    client.batch_execute("VACUUM ANALYZE").expect("vacuum");
    let (took, writes) = beside_a_writer(&postgres, "now", || {
        sqlite_outbox::receive::pg_migrate(&mut postgres.client()).expect("migrations 5 to 7");
    });
    row(
        "`pg_migrate` now (index built concurrently, key swapped)",
        took,
        &writes,
    );
}
