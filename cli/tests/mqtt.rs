//! Delivery to a real Mosquitto broker (Debian package `mosquitto`), started by each test on
//! a free loopback port: per-key order as subscribers see it, a broker killed and restarted
//! mid-run with nothing lost and no attempt spent, refused credentials held as offline.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/mosquitto.rs"]
mod mosquitto;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{rows, wait_until};
use mosquitto::{Auth, Mosquitto, Subscriber};
use serde_json::json;
use sqlite_outbox::transport::MqttConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn enqueue_keyed(outbox: &Outbox, n: usize, keys: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        outbox
            .transaction(|tx| {
                for &i in chunk {
                    let _ = outbox.enqueue(
                        tx,
                        Event::new("reading.taken", json!({"i": i}))
                            .partition_key(format!("k{}", i % keys)),
                    )?;
                }
                Ok::<_, sqlite_outbox::Error>(())
            })
            .unwrap();
    }
}

fn relay_to(broker: &Mosquitto, config: MqttConfig) -> RelayConfig {
    RelayConfig::new()
        .destination(Destination::mqtt("default", broker.url()).mqtt_config(config))
        .poll_interval(Duration::from_millis(20))
}

#[test]
fn ten_thousand_events_over_eight_keys_arrive_in_per_key_order() {
    let broker = Mosquitto::start();
    let subscriber = Subscriber::start(broker.port, "devices/#", None);
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("mqtt.db")).unwrap();
    let n = 10_000;
    enqueue_keyed(&outbox, n, 8);
    let relay = outbox
        .relay(relay_to(
            &broker,
            MqttConfig::new().topic("devices/{key}/{type}"),
        ))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(120), || {
        subscriber.count() >= n
    }));
    let _ = relay.shutdown();
    let messages = subscriber.messages();
    // Per key, first receipts in commit order (`sequence` grows with the commit).
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut seen = HashSet::new();
    for m in &messages {
        let key = m.payload["partitionkey"].as_str().unwrap().to_string();
        assert_eq!(m.topic, format!("devices/{key}/reading.taken"));
        let id = m.payload["id"].as_str().unwrap().to_string();
        if !seen.insert(id) {
            continue;
        }
        let seq = m.payload["sequence"]
            .as_str()
            .and_then(|s| s.parse::<i64>().ok())
            .or_else(|| m.payload["sequence"].as_i64())
            .expect("keyed events carry a sequence");
        if let Some(prev) = last.insert(key.clone(), seq) {
            assert!(prev < seq, "key {key}: {seq} arrived after {prev}");
        }
    }
    assert_eq!(seen.len(), n);
    assert!(rows(&outbox).iter().all(|r| r.delivered));
}

#[test]
fn a_broker_killed_and_restarted_mid_run_loses_nothing_and_spends_no_attempt() {
    let mut broker = Mosquitto::start();
    let subscriber = Subscriber::start(broker.port, "outbox/#", None);
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("mqtt.db")).unwrap();
    let n = 3_000;
    enqueue_keyed(&outbox, n, 4);
    let relay = outbox
        .relay(relay_to(&broker, MqttConfig::new()))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(60), || subscriber.count() >= n / 10));
    broker.kill();
    std::thread::sleep(Duration::from_millis(500));
    broker.restart();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(120)
    ));
    let _ = relay.shutdown();
    // Every event was acknowledged once and only its delivery counted as an attempt.
    for row in rows(&outbox) {
        assert_eq!(row.attempts, 1, "event {} spent attempts", row.event_id);
    }
    // And the subscriber (a persistent session) got every one of them.
    assert!(wait_until(Duration::from_secs(30), || {
        let ids: HashSet<String> = subscriber
            .messages()
            .iter()
            .filter_map(|m| m.payload["id"].as_str().map(str::to_string))
            .collect();
        ids.len() == n
    }));
}

#[test]
fn refused_credentials_hold_events_as_offline_without_dead_letters() {
    let broker = Mosquitto::start_with(Some(Auth {
        user: "device-1",
        password: "s3cret",
        acl: &["topic readwrite outbox/#"],
    }));
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("mqtt.db")).unwrap();
    enqueue_keyed(&outbox, 20, 2);
    let relay = outbox
        .relay(relay_to(
            &broker,
            MqttConfig::new().credentials("device-1", "wrong"),
        ))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
    for row in rows(&outbox) {
        assert!(!row.delivered && !row.dead, "{row:?}");
        assert_eq!(row.attempts, 0, "a refused connection spends no attempt");
    }
    // With the right password the same events go out.
    let subscriber = Subscriber::start(broker.port, "outbox/#", Some(("device-1", "s3cret")));
    let relay = outbox
        .relay(relay_to(
            &broker,
            MqttConfig::new().credentials("device-1", "s3cret"),
        ))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || subscriber.count() >= 20));
    let _ = relay.shutdown();
}

#[test]
fn an_event_too_large_for_the_packet_limit_is_dead_lettered_alone_even_in_a_batch() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("mqtt.db")).unwrap();
    let _ = outbox
        .transaction(|tx| {
            let _ = outbox.enqueue(tx, Event::new("big", json!({"blob": "x".repeat(4000)})))?;
            outbox.enqueue(tx, Event::new("small", json!({"n": 1})))
        })
        .unwrap();
    // Published back to back with its neighbour: each keeps its own outcome.
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::mqtt("default", broker.url())
                        .mqtt_config(MqttConfig::new().max_packet_bytes(2048))
                        .batch(10, usize::MAX),
                )
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        rows(&outbox).iter().all(|r| r.delivered || r.dead)
    }));
    let _ = relay.shutdown();
    let rows = rows(&outbox);
    let big = rows.iter().find(|r| r.dead).expect("the big event is dead");
    assert!(
        big.last_error
            .as_deref()
            .unwrap_or("")
            .contains("allows 2048"),
        "{:?}",
        big.last_error
    );
    assert_eq!(rows.iter().filter(|r| r.delivered).count(), 1);
}

#[test]
fn the_cli_relay_publishes_to_an_mqtt_url_and_refuses_http_only_flags() {
    let broker = Mosquitto::start_with(Some(Auth {
        user: "device-1",
        password: "s3cret",
        acl: &["topic readwrite devices/#"],
    }));
    let subscriber = Subscriber::start(broker.port, "devices/#", Some(("device-1", "s3cret")));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db");
    let outbox = Outbox::open(&db).unwrap();
    enqueue_keyed(&outbox, 50, 3);
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let url = broker.url();
    let o = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--topic",
            "devices/{source}/{type}",
            "--username",
            "device-1",
            "--password-file",
            password.to_str().unwrap(),
            "--until-empty",
            "--timeout",
            "60s",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(wait_until(Duration::from_secs(10), || subscriber.count() >= 50));
    assert!(subscriber
        .messages()
        .iter()
        .all(|m| m.topic == "devices/sqlite-outbox/reading.taken"));
    assert!(common::rows(&outbox).iter().all(|r| r.delivered));
    for (args, why) in [
        (
            vec!["--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            "sign nothing",
        ),
        (vec!["--topic", "a/#"], "wildcards"),
    ] {
        let mut all = vec!["relay", "--url", &url, "--until-empty"];
        all.extend(args);
        let o = common::outbox_cli(&db, &all);
        assert_eq!(o.status.code(), Some(2), "{all:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(why),
            "{all:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = common::outbox_cli(
        &db,
        &["relay", "--url", "http://127.0.0.1:1/x", "--username", "u"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("for mqtt:// URLs"));
}
