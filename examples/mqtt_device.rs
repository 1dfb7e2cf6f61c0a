//! A device that publishes to an MQTT broker: while the broker is out of reach its readings
//! wait in the outbox (no attempt spent, nothing dropped), and when the broker appears they
//! go out in order, each acknowledged by a PUBACK before it counts as delivered.
//!
//! ```text
//! cargo run --release --example mqtt_device      # needs mosquitto (Debian package)
//! ```
//!
//! Settings a fleet would use, in place of the local broker below:
//! - **AWS IoT Core**: `Destination::mqtt("cloud", "mqtts://<prefix>-ats.iot.<region>.amazonaws.com:8883")`
//!   with `MqttConfig::new().ca_pem(AmazonRootCA1.pem).client_identity_pem(cert, key)`
//!   (mutual TLS; the CLI's `--ca`, `--cert`, `--key`); the client id is the thing name
//!   (`client_id`), and the IoT policy must allow publishing to the template's topics;
//!   `version(MqttVersion::V5)` so that a policy refusal comes back as PUBACK reason 0x87 and
//!   dead-letters the event instead of vanishing; keep-alive at most 1,200 s; a PUBLISH of at
//!   most 128 KB (`max_packet_bytes(128 * 1024)`); at most 100 in flight (`workers × batch`).
//!   On port 443, `.alpn("x-amzn-mqtt-ca")`.
//! - **EMQX, HiveMQ, Mosquitto**: user name and password (`credentials`, or the CLI's
//!   `--username` and `--password-file`) or a client certificate, a topic the ACL allows,
//!   MQTT 5, and `binary_mode(true)` if subscribers want the bare data with the attributes as
//!   user properties. For Mosquitto, `set_tcp_nodelay true` in its config.

#[path = "../benches/support/mqtt.rs"]
mod broker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event as MqttEvent, MqttOptions, Packet, QoS};
use serde_json::json;
use sqlite_outbox::transport::MqttConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let dir = tempfile::tempdir()?;
    let outbox = Outbox::builder()
        .default_source("/plant-3/line-2")
        .route("*", "broker")
        .open(dir.path().join("device.db"))?;

    // The broker's address is known, but nothing answers there yet: the device is offline.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::mqtt("broker", format!("mqtt://127.0.0.1:{port}"))
                        .mqtt_config(
                            MqttConfig::new()
                                .topic("devices/{source}/{type}")
                                .client_id("device-0042")
                                .keep_alive(Duration::from_secs(30))
                                .max_packet_bytes(128 * 1024),
                        )
                        // 25 publishes in flight per worker.
                        .batch(25, usize::MAX),
                )
                .offline_backoff(Duration::from_millis(50), Duration::from_millis(500)),
        )
        .start()?;

    let readings = 2_000;
    for i in 0..readings {
        let _ = outbox.transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("reading.taken", json!({"n": i, "celsius": 20 + i % 7}))
                    .partition_key(format!("sensor-{}", i % 4)),
            )
        })?;
    }
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "offline: {} pending, {} delivered, {} retried (an unreachable broker spends no attempt)",
        outbox.pending_count(None)?,
        relay.stats().delivered,
        relay.stats().retried
    );

    // The broker comes up where the device expects it, and a subscriber listens.
    let Some(_broker) = broker::Broker::start_on(port) else {
        println!("mosquitto is not installed (Debian package mosquitto): stopping here");
        return Ok(());
    };
    let received = Arc::new(AtomicU64::new(0));
    let counted = received.clone();
    let mut options = MqttOptions::new("dashboard", "127.0.0.1", port);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut connection) = Client::new(options, 16);
    client.subscribe("devices/#", QoS::AtLeastOnce)?;
    let subscriber = std::thread::Builder::new()
        .name("dashboard".into())
        .spawn(move || {
            for event in connection.iter() {
                match event {
                    // The relay's accounting of its streams is published too (its type
                    // in the topic): not a reading.
                    Ok(MqttEvent::Incoming(Packet::Publish(p)))
                        if !p.topic.contains(sqlite_outbox::wire::ACCOUNTING_TYPE) =>
                    {
                        if counted.fetch_add(1, Ordering::Relaxed) == 0 {
                            println!(
                                "first message on {}: {}",
                                p.topic,
                                String::from_utf8_lossy(&p.payload)
                            );
                        }
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })?;

    let started = Instant::now();
    while outbox.pending_count(None)? > 0 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "online: {} delivered in {:.2?} after the broker came up, {} pending",
        relay.stats().delivered,
        started.elapsed(),
        outbox.pending_count(None)?
    );
    while received.load(Ordering::Relaxed) < readings && started.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "the dashboard got {} messages",
        received.load(Ordering::Relaxed)
    );
    let _ = relay.shutdown();
    client.disconnect()?;
    let _ = subscriber.join();
    Ok(())
}
