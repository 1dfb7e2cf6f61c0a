//! An IoT sensor that is offline for a while: telemetry piles up within a storage bound the
//! user chose, the latest GPS fix replaces older ones, alarms are never dropped, and when
//! the network comes back everything that matters drains at once.
//!
//! ```text
//! cargo run --release --example iot_sensor
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
                        .batch(200, 256 * 1024)
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
            outbox.enqueue(
                tx,
                Event::new(
                    "telemetry.temperature",
                    json!({"celsius": 20.0 + (i % 50) as f64 / 10.0}),
                ),
            )?;
            outbox.enqueue(
                tx,
                Event::new("device.position", json!({"fix": i})).coalesce_key("gps"),
            )?;
            if i % 2_000 == 0 {
                outbox.enqueue(tx, Event::new("alarm.door_open", json!({"at": i})))?;
            }
            Ok(())
        })?;
    }
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
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let cloud = HttpServer::bind(addr, move |request| {
        let body = String::from_utf8_lossy(&request.body);
        let n = body.matches("\"specversion\"").count() as u64;
        counter.fetch_add(n, Ordering::Relaxed);
        Response::status(204)
    })?;
    let back = Instant::now();
    while outbox.stats()?.pending > 0 && back.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let online = outbox.stats()?;
    println!(
        "online:    {} delivered in {:.2?}, {} pending, {} dead",
        received.load(Ordering::Relaxed),
        back.elapsed(),
        online.pending,
        online.dead
    );
    let alarms = outbox
        .list(Some(sqlite_outbox::admin::State::Delivered), 10_000)?
        .into_iter()
        .filter(|r| r.event_type == "alarm.door_open")
        .count();
    println!("alarms:    {alarms} of 5 delivered (never dropped)");
    relay.shutdown();
    cloud.stop();
    if alarms != 5 || online.pending != 0 {
        return Err("not everything that matters arrived".into());
    }
    Ok(())
}
