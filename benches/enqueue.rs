//! Enqueue cost against its bare baseline, in the same run.
//!
//! Baseline: the same two plain rusqlite INSERTs (a business row, and a row of the outbox's
//! shape into a table with the outbox's indexes, with a fresh UUIDv7 id and the same JSON),
//! in an IMMEDIATE transaction on one connection with the same PRAGMAs.
//! Outbox: the business INSERT plus `Outbox::enqueue` (validation, routing, serialization,
//! id) on the caller's own connection, and through `Outbox::transaction` (pooled connection,
//! relay wake-up). With 100 events a transaction, also `Outbox::enqueue_many` after the
//! business rows, and the bare transaction that writes its outbox rows with one `INSERT`.

mod support;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sqlite_outbox::rusqlite::{params, Connection};
use sqlite_outbox::{Event, Outbox, Synchronous};
use support::*;

fn bench_enqueue(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    for (label, sync, pragma, events) in [
        ("normal_1", Synchronous::Normal, "NORMAL", 1),
        ("full_1", Synchronous::Full, "FULL", 1),
        ("normal_100", Synchronous::Normal, "NORMAL", 100),
    ] {
        let mut group = c.benchmark_group(format!("enqueue/{label}"));
        group.throughput(Throughput::Elements(events as u64));
        let mut bare = bare_connection(&dir.path().join(format!("bare-{label}.db")), pragma);
        let mut n = 0;
        group.bench_function("bare", |b| {
            b.iter(|| {
                n += events;
                bare_enqueue_tx(&mut bare, n, events)
            })
        });
        let path = dir.path().join(format!("outbox-{label}.db"));
        let outbox = Outbox::builder().synchronous(sync).open(&path).unwrap();
        let mut own = Connection::open(&path).unwrap();
        own.execute_batch(&format!("PRAGMA synchronous={pragma}; {BUSINESS_TABLE}"))
            .unwrap();
        let mut n = 0;
        group.bench_function("outbox", |b| {
            b.iter(|| {
                n += events;
                outbox_enqueue_tx(&outbox, &mut own, n, events)
            })
        });
        if events > 1 {
            let mut n = 0;
            group.bench_function("outbox_enqueue_many", |b| {
                b.iter(|| {
                    n += events;
                    outbox_enqueue_many_tx(&outbox, &mut own, n, events)
                })
            });
            let listed_sql = bare_listed_insert_sql(events);
            let mut n = 0;
            group.bench_function("bare_one_insert", |b| {
                b.iter(|| {
                    n += events;
                    bare_enqueue_listed_tx(&mut bare, &listed_sql, n, events)
                })
            });
        }
        if events == 1 {
            let mut n = 0;
            group.bench_function("outbox_transaction", |b| {
                b.iter(|| {
                    n += 1;
                    outbox
                        .transaction(|tx| {
                            tx.prepare_cached(
                                "INSERT INTO orders (customer, total) VALUES (?1, ?2)",
                            )?
                            .execute(params!["customer-7", n])?;
                            outbox.enqueue(
                                tx,
                                Event::new("order.created", order_data(n))
                                    .partition_key("customer-7"),
                            )
                        })
                        .unwrap()
                })
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
