//! Claim-with-lease + ack against a bare `UPDATE … RETURNING` loop, and the claim's latency
//! with 1,000 pending rows on an empty table versus beside 1,000,000 delivered rows.

mod support;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sqlite_outbox::Outbox;
use support::*;

/// A "now" after every event's commit time.
const FAR: i64 = 4_000_000_000_000_000;
const ROWS: usize = 10_000;

fn claim_ack(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("claim_ack/batches_of_100");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    let mut bare = bare_connection(&dir.path().join("bare.db"), "NORMAL");
    group.bench_function("bare", |b| {
        // Filling the table is not timed; the claim + ack loop is.
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                fill_bare_pending(&mut bare, ROWS);
                let start = std::time::Instant::now();
                assert_eq!(bare_claim_ack(&mut bare, 100, FAR, BareReturning::Id), ROWS);
                total += start.elapsed();
            }
            total
        })
    });
    let outbox = Outbox::open(dir.path().join("outbox.db")).unwrap();
    group.bench_function("outbox", |b| {
        b.iter_batched(
            || fill_pending(&outbox, ROWS),
            |()| assert_eq!(outbox_claim_ack(&outbox, FAR), ROWS),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn claim_latency(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("claim_latency/100_of_1k_pending");
    for history in [0usize, 1_000_000] {
        let outbox = Outbox::open(dir.path().join(format!("history-{history}.db"))).unwrap();
        fill_delivered(&outbox.connection().unwrap(), history);
        fill_pending(&outbox, 1_000);
        let conn = outbox.connection().unwrap();
        let mut seq = 0;
        let name = if history == 0 {
            "empty_table"
        } else {
            "beside_1m_delivered"
        };
        group.bench_function(name, |b| {
            // Only the claim is timed; the claimed rows are handed back (by id) after it.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    seq += 1;
                    total += timed_claim_and_release(&conn, &format!("r{seq}"), FAR, 100);
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = claim_ack, claim_latency
}
criterion_main!(benches);
