//! An IoT sensor that is offline for a while: telemetry piles up within a storage bound the
//! user chose, the latest GPS fix replaces older ones, alarms are never dropped, telemetry
//! older than its lifetime expires unsent, and when the network comes back the alarms go
//! first and the rest follows at the rate the metered uplink allows.
//!
//! ```text
//! cargo run --release --example iot_sensor
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig, StoragePolicy};

use http_server::{HttpServer, Response};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let dir = tempfile::tempdir()?;
    // At most 2,000 deliveries wait on the device; telemetry may give way, nothing else.
    let outbox = Outbox::builder()
        .max_pending(2_000)
        .storage_policy("telemetry.*", StoragePolicy::DropOldest)
        // After a reconnect: alarms first, telemetry last, and telemetry older than two
        // seconds (an hour, on a real device) is not worth the uplink.
        .priority_for("alarm.*", 9)
        .priority_for("telemetry.*", 1)
        .expiry_for("telemetry.*", Duration::from_secs(2))
        .route("*", "cloud")
        .open(dir.path().join("sensor.db"))?;

    // The uplink: nothing listens on this port yet, the device is "offline".
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    drop(listener);
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::http("cloud", format!("http://{addr}/ingest"))
                        .batch(50, 256 * 1024)
                        // A metered uplink: at most 2 requests a second.
                        .rate_limit(2.0)
                        .http_config(
                            HttpConfig::new()
                                .connect_timeout(Duration::from_millis(200))
                                .request_timeout(Duration::from_secs(2)),
                        ),
                )
                .offline_backoff(Duration::from_millis(50), Duration::from_millis(500)),
        )
        .start()?;

    // Offline: 10,000 temperature readings, 10,000 GPS fixes, and 5 alarms.
    for i in 0..10_000 {
        outbox.transaction(|tx| {
            let _ = outbox.enqueue(
                tx,
                Event::new(
                    "telemetry.temperature",
                    json!({"celsius": 20.0 + (i % 50) as f64 / 10.0}),
                ),
            )?;
            let _ = outbox.enqueue(
                tx,
                Event::new("device.position", json!({"fix": i})).coalesce_key("gps"),
            )?;
            if i % 2_000 == 0 {
                let _ = outbox.enqueue(tx, Event::new("alarm.door_open", json!({"at": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })?;
    }
    // The device stays offline past the telemetry's lifetime, then takes 300 more readings.
    std::thread::sleep(Duration::from_millis(3_500));
    outbox.transaction(|tx| {
        for i in 0..300 {
            let _ = outbox.enqueue(tx, Event::new("telemetry.temperature", json!({"fresh": i})))?;
        }
        Ok::<_, sqlite_outbox::Error>(())
    })?;
    let offline = outbox.stats()?;
    println!(
        "offline:   {} pending ({} dropped telemetry, {} GPS fixes coalesced), {} attempts spent",
        offline.pending,
        offline.dropped,
        offline.coalesced,
        offline
            .attempts_histogram
            .iter()
            .filter(|(a, _)| *a > 0)
            .map(|(_, n)| n)
            .sum::<i64>()
    );

    // The network comes back.
    // When each request arrived, and the types of its events.
    type Log = Vec<(Instant, Vec<String>)>;
    let requests: Arc<Mutex<Log>> = Arc::default();
    let log = requests.clone();
    let cloud = HttpServer::bind(addr, move |request| {
        let body: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        let types = body
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|e| e["type"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if let Ok(mut log) = log.lock() {
            log.push((Instant::now(), types));
        }
        Response::status(204)
    })?;
    let back = Instant::now();
    while outbox.stats()?.pending > 0 && back.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let online = outbox.stats()?;
    let requests = requests
        .lock()
        .map_err(|_| "receiver log poisoned")?
        .clone();
    let delivered: usize = requests.iter().map(|(_, t)| t.len()).sum();
    println!(
        "online:    {delivered} delivered in {:.2?}, {} pending, {} dead, {} telemetry \
         readings expired unsent",
        back.elapsed(),
        online.pending,
        online.dead,
        online.expired
    );
    // The types in the order they first arrived, with their counts.
    let mut order: Vec<(String, usize)> = Vec::new();
    for t in requests.iter().flat_map(|(_, types)| types) {
        match order.iter_mut().find(|(seen, _)| seen == t) {
            Some((_, n)) => *n += 1,
            None => order.push((t.clone(), 1)),
        }
    }
    let order: Vec<String> = order.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
    println!("order:     {}", order.join(", "));
    if let (Some((start, _)), Some((end, _))) = (requests.first(), requests.last()) {
        let span = end.duration_since(*start).as_secs_f64();
        println!(
            "rate:      {} requests in {span:.2} s: one second's worth (2) at once, then {:.1}/s \
             (limit 2/s)",
            requests.len(),
            requests.len().saturating_sub(2) as f64 / span.max(0.001)
        );
    }
    let alarms = outbox
        .list(Some(sqlite_outbox::admin::State::Delivered), 10_000)?
        .into_iter()
        .filter(|r| r.event_type == "alarm.door_open")
        .count();
    println!("alarms:    {alarms} of 5 delivered (never dropped)");
    let _ = relay.shutdown();
    cloud.stop();
    if alarms != 5 || online.pending != 0 {
        return Err("not everything that matters arrived".into());
    }
    Ok(())
}
