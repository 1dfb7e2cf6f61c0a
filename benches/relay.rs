//! Draining committed events to a local tiny_http receiver on 127.0.0.1: one event per
//! request with 1 and 4 workers, and batched (100 per request), against a bare loop of ureq
//! keep-alive POSTs of the same bodies over the same number of connections.
//!
//! `RELAY_BENCH_EVENTS` sets the events per run (default 100,000).

mod support;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sqlite_outbox::{bench_support, Destination, OutboundEvent, Outbox, RelayConfig};
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
    let receiver = CountingReceiver::start(4);
    let sample = bench_support::sample_event(&order_data(1));
    let single = sqlite_outbox::structured_body(&sample).unwrap();
    let batch: Vec<OutboundEvent> = (0..100).map(|_| sample.clone()).collect();
    let batched = sqlite_outbox::batch_body(&batch).unwrap();
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
                    let outbox =
                        Outbox::open(dir.path().join(format!("relay-{round}.db"))).unwrap();
                    fill_pending(&outbox, n);
                    let mut destination = Destination::http("default", &receiver.url);
                    if let Some(size) = batch_size {
                        destination = destination.batch(size, 1 << 20);
                    }
                    let start_count = receiver.count();
                    let start = Instant::now();
                    let relay = outbox
                        .relay(RelayConfig::new().destination(destination).workers(workers))
                        .start()
                        .unwrap();
                    assert!(receiver.wait_for(start_count + n as u64, Duration::from_secs(120)));
                    total += start.elapsed();
                    relay.shutdown();
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
