//! Metrics through the `metrics` facade (run with `--features metrics`).
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{fast, wait_until, Reply, TestReceiver, PATIENCE};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig, StoragePolicy};

/// Every update, by metric name and its labels.
#[derive(Default)]
struct Sink {
    values: Mutex<HashMap<String, f64>>,
    labels: Mutex<Vec<(String, String)>>,
}

struct Handle {
    sink: Arc<Sink>,
    key: String,
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self
            .sink
            .values
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.sink
            .values
            .lock()
            .unwrap()
            .insert(self.key.clone(), value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        *self
            .sink
            .values
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self
            .sink
            .values
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.sink
            .values
            .lock()
            .unwrap()
            .insert(self.key.clone(), value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _value: f64) {
        *self
            .sink
            .values
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default() += 1.0;
    }
}

struct TestRecorder(Arc<Sink>);

impl TestRecorder {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut name = key.name().to_string();
        for label in key.labels() {
            self.0
                .labels
                .lock()
                .unwrap()
                .push((label.key().to_string(), label.value().to_string()));
            name.push_str(&format!(",{}={}", label.key(), label.value()));
        }
        Arc::new(Handle {
            sink: self.0.clone(),
            key: name,
        })
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

#[test]
fn counters_gauges_and_latency_with_bounded_labels() {
    let sink = Arc::new(Sink::default());
    metrics::set_global_recorder(TestRecorder(sink.clone())).unwrap();
    let value = |k: &str| sink.values.lock().unwrap().get(k).copied().unwrap_or(0.0);

    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending(10)
        .storage_policy("tick", StoragePolicy::DropOldest)
        .open(dir.path().join("metrics.db"))
        .unwrap();
    let mut ids = Vec::new();
    for (t, data) in [
        ("order.created", json!(1)),
        ("order.created", json!(2)),
        ("bad", json!(3)),
    ] {
        ids.push(
            outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new(t, data)))
                .unwrap()
                .event_id()
                .to_string(),
        );
    }
    for i in 0..2 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("pos", json!(i)).coalesce_key("gps")))
            .unwrap();
    }
    for i in 0..9 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("tick", json!(i))))
            .unwrap();
    }
    let receiver = TestReceiver::start(0, |r| {
        if r.body["type"] == "bad" {
            Reply::Status(400)
        } else {
            Reply::Status(200)
        }
    });
    // With a data budget, whose gauges follow what it spent.
    let destination = Destination::http("default", receiver.url())
        .budget(1_000_000, std::time::Duration::from_secs(86_400));
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(destination)))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || outbox.stats().unwrap().pending == 0));
    // Gauges refresh on the relay's first idle turn.
    assert!(wait_until(PATIENCE, || value("outbox_database_bytes") > 0.0));
    let _ = relay.shutdown();

    let d = "destination=default";
    assert_eq!(
        value(&format!("outbox_enqueued_total,type=order.created,{d}")),
        2.0
    );
    assert_eq!(
        value(&format!("outbox_delivered_total,type=order.created,{d}")),
        2.0
    );
    assert_eq!(value(&format!("outbox_dead_total,type=bad,{d}")), 1.0);
    assert_eq!(
        value(&format!(
            "outbox_delivery_latency_seconds,type=order.created,{d}"
        )),
        2.0
    );
    assert_eq!(value("outbox_coalesced_total,type=pos"), 1.0);
    assert_eq!(value("outbox_dropped_total"), 3.0);
    // The budget's gauges, as its last write to the file (at the relay's stop) left them.
    let budget = outbox.budget("default").unwrap().unwrap();
    assert!(budget.used_bytes > 0);
    assert_eq!(
        value(&format!("outbox_budget_limit_bytes,{d}")),
        1_000_000.0
    );
    assert_eq!(
        value(&format!("outbox_budget_used_bytes,{d}")),
        budget.used_bytes as f64
    );
    let labels = sink.labels.lock().unwrap();
    assert!(labels
        .iter()
        .all(|(k, _)| k == "type" || k == "destination"));
    assert!(
        labels.iter().all(|(_, v)| !ids.contains(v)),
        "an event id became a label"
    );
}
