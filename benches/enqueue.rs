//! Enqueue cost against its bare baseline, in the same run.
//!
//! Baseline: the same two plain rusqlite INSERTs (a business row, and a row of the outbox's
//! shape into a table with the outbox's indexes, with a fresh UUIDv7 id and the same JSON),
//! in an IMMEDIATE transaction on one connection with the same PRAGMAs.
//! Outbox: the business INSERT plus `Outbox::enqueue` (validation, serialization, id) on the
//! caller's own connection, and through `Outbox::transaction` (pooled connection, relay wake).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::json;
use sqlite_outbox::rusqlite::{params, Connection, TransactionBehavior};
use sqlite_outbox::{Event, Outbox, Synchronous};

const BUSINESS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total INTEGER NOT NULL)";

fn data(n: i64) -> serde_json::Value {
    json!({"order_id": n, "customer": "customer-7", "total_cents": 1999, "currency": "EUR"})
}

/// A database with the outbox schema and the app's table, plus a raw connection to it.
fn setup(dir: &tempfile::TempDir, name: &str, sync: Synchronous) -> (Outbox, Connection) {
    let path = dir.path().join(name);
    let outbox = Outbox::builder().synchronous(sync).open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    let pragma = match sync {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={pragma}; PRAGMA foreign_keys=ON; {BUSINESS};"
    ))
    .unwrap();
    (outbox, conn)
}

fn bare_tx(conn: &mut Connection, n: i64, events: i64) {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    for i in 0..events {
        tx.prepare_cached("INSERT INTO orders (customer, total) VALUES (?1, ?2)")
            .unwrap()
            .execute(params!["customer-7", n + i])
            .unwrap();
        let payload = serde_json::to_string(&data(n + i)).unwrap();
        tx.prepare_cached(
            "INSERT INTO outbox_events (event_id, destination, idempotency_key, event_type,
                 source, subject, partition_key, payload, created_at, available_at)
             VALUES (?1, 'default', NULL, 'order.created', NULL, NULL, ?2, ?3, ?4, ?4)",
        )
        .unwrap()
        .execute(params![
            uuid::Uuid::now_v7().to_string(),
            "customer-7",
            payload,
            n
        ])
        .unwrap();
    }
    tx.commit().unwrap();
}

fn outbox_tx(outbox: &Outbox, conn: &mut Connection, n: i64, events: i64) {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    for i in 0..events {
        tx.prepare_cached("INSERT INTO orders (customer, total) VALUES (?1, ?2)")
            .unwrap()
            .execute(params!["customer-7", n + i])
            .unwrap();
        outbox
            .enqueue(
                &tx,
                Event::new("order.created", data(n + i)).partition_key("customer-7"),
            )
            .unwrap();
    }
    tx.commit().unwrap();
}

fn bench_enqueue(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    for (label, sync, events) in [
        ("normal_1", Synchronous::Normal, 1),
        ("full_1", Synchronous::Full, 1),
        ("normal_100", Synchronous::Normal, 100),
    ] {
        let mut group = c.benchmark_group(format!("enqueue/{label}"));
        group.throughput(Throughput::Elements(events as u64));
        let (_o, mut bare) = setup(&dir, &format!("bare-{label}.db"), sync);
        let mut n = 0;
        group.bench_function("bare", |b| {
            b.iter(|| {
                n += events;
                bare_tx(&mut bare, n, events)
            })
        });
        let (outbox, mut own) = setup(&dir, &format!("outbox-{label}.db"), sync);
        let mut n = 0;
        group.bench_function("outbox", |b| {
            b.iter(|| {
                n += events;
                outbox_tx(&outbox, &mut own, n, events)
            })
        });
        if events == 1 {
            let mut n = 0;
            group.bench_function("outbox_transaction", |b| {
                b.iter_batched(
                    || {
                        n += 1;
                        n
                    },
                    |n| {
                        outbox
                            .transaction(|tx| {
                                tx.prepare_cached(
                                    "INSERT INTO orders (customer, total) VALUES (?1, ?2)",
                                )?
                                .execute(params!["customer-7", n])?;
                                outbox.enqueue(
                                    tx,
                                    Event::new("order.created", data(n))
                                        .partition_key("customer-7"),
                                )
                            })
                            .unwrap()
                    },
                    BatchSize::SmallInput,
                )
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = bench_enqueue
}
criterion_main!(benches);
