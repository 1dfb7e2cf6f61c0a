//! Draining committed events to a local local receiver on 127.0.0.1: one event per
//! request with 1 and 4 workers, and batched (100 per request), against a bare loop of ureq
//! keep-alive POSTs of the same bodies over the same number of connections.
//!
//! `RELAY_BENCH_EVENTS` sets the events per run (default 100,000).

mod support;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sqlite_outbox::internal as bench_support;
use sqlite_outbox::transport::OutboundEvent;
use support::*;

fn events() -> usize {
    std::env::var("RELAY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

fn relay(c: &mut Criterion) {
    let n = events();
    let dir = tempfile::tempdir().unwrap();
    let receiver = CountingReceiver::start();
    let sample = bench_support::sample_event(&order_data(1));
    let single = sqlite_outbox::wire::structured_body(&sample).unwrap();
    let batch: Vec<OutboundEvent> = (0..100).map(|_| sample.clone()).collect();
    let batched = sqlite_outbox::wire::batch_body(&batch).unwrap();
    let mut round = 0;
    for (name, workers, batch_size) in [
        ("single_1_worker", 1, None),
        ("single_4_workers", 4, None),
        ("batched_100_4_workers", 4, Some(100)),
    ] {
        let mut group = c.benchmark_group(format!("relay/{name}"));
        group.throughput(Throughput::Elements(n as u64));
        group.sample_size(10);
        group.bench_function("bare_ureq", |b| {
            b.iter(|| {
                let start = receiver.count();
                match batch_size {
                    None => bare_posts(
                        &receiver.url,
                        &single,
                        "application/cloudevents+json",
                        n,
                        workers,
                    ),
                    Some(size) => bare_posts(
                        &receiver.url,
                        &batched,
                        "application/cloudevents-batch+json",
                        n / size,
                        workers,
                    ),
                }
                assert!(receiver.wait_for(start + n as u64, Duration::from_secs(120)));
            })
        });
        group.bench_function("outbox", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    round += 1;
                    let path = dir.path().join(format!("relay-{round}.db"));
                    total += timed_drain(&path, &receiver, n, workers, batch_size);
                }
                total
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(20));
    targets = relay
}
criterion_main!(benches);
