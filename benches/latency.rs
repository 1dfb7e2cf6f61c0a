//! Commit-to-receipt latency of single events with an idle relay: each iteration commits
//! one event and waits until the local receiver has it. Criterion reports the distribution;
//! `examples/bench.rs` prints p50 and p99.

mod support;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use sqlite_outbox::{Event, Outbox, RelayConfig};
use support::*;

fn commit_to_receipt(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let receiver = CountingReceiver::start();
    let outbox = Outbox::open(dir.path().join("latency.db")).unwrap();
    let relay = outbox
        .relay(RelayConfig::http(&receiver.url).workers(2))
        .start()
        .unwrap();
    let mut n = 0;
    c.bench_function("latency/commit_to_receipt", |b| {
        b.iter(|| {
            n += 1;
            let before = receiver.count();
            let _ = outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", order_data(n))))
                .unwrap();
            assert!(receiver.wait_for(before + 1, Duration::from_secs(10)));
        })
    });
    let _ = relay.shutdown();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(200)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    targets = commit_to_receipt
}
criterion_main!(benches);
