//! MQTT 5 against a real Mosquitto: the content modes of the CloudEvents MQTT binding as a
//! subscriber sees them (properties included), PUBACK reason codes (an ACL-denied topic), the
//! broker's maximum packet size and receive maximum, and the CLI's `--mqtt-version 5`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/mosquitto.rs"]
mod mosquitto;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{rows, wait_until};
use mosquitto::{Auth, Mosquitto, Setup, Subscriber5};
use serde_json::json;
use sqlite_outbox::transport::{MqttConfig, MqttVersion};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn relay_to(url: String, config: MqttConfig) -> RelayConfig {
    RelayConfig::new()
        .destination(Destination::mqtt("default", url).mqtt_config(config))
        .poll_interval(Duration::from_millis(20))
}

fn v5() -> MqttConfig {
    MqttConfig::new().version(MqttVersion::V5)
}

#[test]
fn structured_and_binary_messages_carry_the_cloudevents_attributes() {
    let broker = Mosquitto::start();
    let subscriber = Subscriber5::start(broker.port, "#");
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("v5.db")).unwrap();
    let enqueue_one = || {
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(
                    tx,
                    Event::new("reading.taken", json!({"celsius": 21.5}))
                        .partition_key("room-1")
                        .subject("sensor-7"),
                )
            })
            .unwrap();
    };
    enqueue_one();
    let structured = outbox
        .relay(relay_to(broker.url(), v5().topic("structured/{type}")))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || subscriber
        .messages()
        .len()
        == 1));
    let _ = structured.shutdown();
    let event_id = rows(&outbox)[0].event_id.clone();
    let m = &subscriber.messages()[0];
    assert_eq!(m.topic, "structured/reading.taken");
    assert_eq!(
        m.content_type.as_deref(),
        Some("application/cloudevents+json; charset=utf-8")
    );
    let envelope: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(envelope["id"], event_id.as_str());
    assert_eq!(envelope["data"], json!({"celsius": 21.5}));

    // A second event of the same key, in binary mode: the data is the payload, the
    // attributes are user properties named as the attributes.
    enqueue_one();
    let binary = outbox
        .relay(relay_to(
            broker.url(),
            v5().binary_mode(true).topic("binary/{key}"),
        ))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || subscriber
        .messages()
        .len()
        == 2));
    let _ = binary.shutdown();
    let event_id = rows(&outbox)[1].event_id.clone();
    let m = &subscriber.messages()[1];
    eprintln!(
        "captured: topic {:?}, content type {:?}, user properties {:?}, payload {}",
        m.topic,
        m.content_type,
        m.user_properties,
        String::from_utf8_lossy(&m.payload)
    );
    assert_eq!(m.topic, "binary/room-1");
    assert_eq!(m.content_type.as_deref(), Some("application/json"));
    let data: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(data, json!({"celsius": 21.5}));
    assert_eq!(m.property("id"), Some(event_id.as_str()));
    assert_eq!(m.property("specversion"), Some("1.0"));
    assert_eq!(m.property("type"), Some("reading.taken"));
    assert_eq!(m.property("subject"), Some("sensor-7"));
    assert_eq!(m.property("partitionkey"), Some("room-1"));
    let sequence = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok()).unwrap();
    assert!(sequence(m.property("sequence")) > sequence(envelope["sequence"].as_str()));
    let time = m.property("time").unwrap();
    assert!(time.contains('T') && time.ends_with('Z'), "{time}");
    assert_eq!(m.property("source"), envelope["source"].as_str());
    assert!(m.property("datacontenttype").is_none());
}

#[test]
fn an_acl_denied_topic_is_dead_lettered_with_the_reason_and_the_rest_delivered() {
    let broker = Mosquitto::start_with(Some(Auth {
        user: "device-1",
        password: "s3cret",
        acl: &["topic readwrite outbox/allowed"],
    }));
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("acl.db")).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..10 {
                let kind = if i % 2 == 0 { "allowed" } else { "denied" };
                let _ = outbox.enqueue(tx, Event::new(kind, json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let relay = outbox
        .relay(relay_to(
            broker.url(),
            v5().credentials("device-1", "s3cret"),
        ))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        rows(&outbox).iter().all(|r| r.delivered || r.dead)
    }));
    let _ = relay.shutdown();
    for row in rows(&outbox) {
        if row.event_type == "allowed" {
            assert!(row.delivered, "{row:?}");
        } else {
            assert!(row.dead, "{row:?}");
            let error = row.last_error.as_deref().unwrap_or("");
            assert!(
                error.contains("not authorized (PUBACK reason 0x87)"),
                "{error}"
            );
            assert_eq!(row.attempts, 1, "dead-lettered on the first refusal");
        }
    }
}

#[test]
fn an_event_over_the_brokers_maximum_packet_size_is_dead_lettered_the_rest_delivered() {
    let broker = Mosquitto::start_setup(Setup {
        extra: "max_packet_size 2048",
        ..Setup::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("size.db")).unwrap();
    let _ = outbox
        .transaction(|tx| {
            let _ = outbox.enqueue(tx, Event::new("small", json!({"n": 1})))?;
            let _ = outbox.enqueue(tx, Event::new("big", json!({"blob": "x".repeat(4000)})))?;
            outbox.enqueue(tx, Event::new("small", json!({"n": 2})))
        })
        .unwrap();
    // The destination's own limit (256 KiB) is far above the broker's: the CONNACK's
    // maximum packet size is what refuses the big event, before it could break the
    // connection.
    let relay = outbox.relay(relay_to(broker.url(), v5())).start().unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        rows(&outbox).iter().all(|r| r.delivered || r.dead)
    }));
    let _ = relay.shutdown();
    for row in rows(&outbox) {
        if row.event_type == "big" {
            let error = row.last_error.as_deref().unwrap_or("");
            assert!(
                row.dead && error.contains("the broker allows 2048"),
                "{row:?}"
            );
        } else {
            assert!(row.delivered && row.attempts == 1, "{row:?}");
        }
    }
}

#[test]
fn a_receive_maximum_of_two_bounds_the_window_and_loses_nothing() {
    let broker = Mosquitto::start_setup(Setup {
        extra: "max_inflight_messages 2",
        ..Setup::default()
    });
    let subscriber = Subscriber5::start(broker.port, "outbox/#");
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("window.db")).unwrap();
    let n = 2_000;
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let _ = outbox.enqueue(
                    tx,
                    Event::new("reading", json!({"i": i})).partition_key(format!("k{}", i % 4)),
                )?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // 4 workers with batches of 25 offer up to 100 publishes at once; the broker takes 2.
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::mqtt("default", broker.url())
                        .mqtt_config(v5())
                        .batch(25, usize::MAX),
                )
                .workers(4)
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(120)
    ));
    let _ = relay.shutdown();
    assert!(rows(&outbox).iter().all(|r| r.attempts == 1));
    assert!(wait_until(Duration::from_secs(10), || subscriber
        .messages()
        .len()
        >= n));
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut ids = HashSet::new();
    for m in subscriber.messages() {
        let envelope: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let key = envelope["partitionkey"].as_str().unwrap().to_string();
        let seq: i64 = envelope["sequence"].as_str().unwrap().parse().unwrap();
        ids.insert(envelope["id"].as_str().unwrap().to_string());
        if let Some(prev) = last.insert(key.clone(), seq) {
            assert!(prev < seq, "key {key}: {seq} after {prev}");
        }
    }
    assert_eq!(ids.len(), n);
}

#[test]
fn the_cli_speaks_mqtt_5_binary_and_refuses_flags_that_do_not_fit() {
    let broker = Mosquitto::start();
    let subscriber = Subscriber5::start(broker.port, "outbox/#");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db");
    let outbox = Outbox::open(&db).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("ping", json!({"n": 1}))))
        .unwrap();
    let url = broker.url();
    let o = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--mqtt-version",
            "5",
            "--mqtt-binary",
            "--until-empty",
            "--timeout",
            "60s",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(wait_until(Duration::from_secs(10), || subscriber
        .messages()
        .len()
        == 1));
    let m = &subscriber.messages()[0];
    assert_eq!(m.payload, br#"{"n":1}"#);
    assert_eq!(m.property("type"), Some("ping"));
    for (args, why) in [
        (vec!["--mqtt-binary"], "needs --mqtt-version 5"),
        (vec!["--mqtt-version", "7"], "not an MQTT version"),
        (
            vec!["--ca", "/nonexistent"],
            "not an https:// or mqtts:// URL",
        ),
    ] {
        let mut all = vec!["relay", "--url", &url, "--until-empty"];
        all.extend(args);
        let o = common::outbox_cli(&db, &all);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains(why), "{all:?}: {stderr}");
    }
}

#[test]
fn trace_context_travels_as_user_properties_in_binary_mode_and_in_the_envelope_otherwise() {
    use cloudevents::{AttributesReader, Event as SdkEvent};
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TS: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    const SCHEMA: &str = "urn:schemas:reading:v2";
    let broker = Mosquitto::start();
    let subscriber = Subscriber5::start(broker.port, "#");
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .route("*", "binary5")
        .route("*", "structured5")
        .route("*", "structured311")
        .open(dir.path().join("traced.db"))
        .unwrap();
    for event in [
        Event::new("reading.taken", json!({"celsius": 21.5}))
            .traceparent(TP)
            .tracestate(TS)
            .dataschema(SCHEMA),
        Event::new("reading.untraced", json!({"celsius": 3.0})),
    ] {
        let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
    }
    let mqtt = |name: &str, config: MqttConfig| {
        Destination::mqtt(name, broker.url()).mqtt_config(config.topic(format!("{name}/{{type}}")))
    };
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(mqtt("binary5", v5().binary_mode(true)))
                .destination(mqtt("structured5", v5()))
                .destination(mqtt("structured311", MqttConfig::new()))
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || subscriber
        .messages()
        .len()
        == 6));
    let _ = relay.shutdown();
    let messages = subscriber.messages();
    let find = |topic: &str| messages.iter().find(|m| m.topic == topic).unwrap();

    // Binary mode (MQTT 5): user properties named as the attributes, no ce- prefix.
    let binary = find("binary5/reading.taken");
    assert_eq!(binary.property("traceparent"), Some(TP));
    assert_eq!(binary.property("tracestate"), Some(TS));
    assert_eq!(binary.property("dataschema"), Some(SCHEMA));
    assert!(binary.property("ce-traceparent").is_none());
    let untraced = find("binary5/reading.untraced");
    assert!(untraced.property("traceparent").is_none());
    assert!(untraced.property("tracestate").is_none());

    // Structured mode, MQTT 5 and 3.1.1: members of the envelope, as the SDK reads them.
    for topic in ["structured5/reading.taken", "structured311/reading.taken"] {
        let event: SdkEvent = serde_json::from_slice(&find(topic).payload).unwrap();
        assert_eq!(
            event
                .extension("traceparent")
                .map(|v| v.to_string())
                .as_deref(),
            Some(TP)
        );
        assert_eq!(
            event
                .extension("tracestate")
                .map(|v| v.to_string())
                .as_deref(),
            Some(TS)
        );
        assert_eq!(event.dataschema().map(|u| u.as_str()), Some(SCHEMA));
    }
    for topic in [
        "structured5/reading.untraced",
        "structured311/reading.untraced",
    ] {
        let event: SdkEvent = serde_json::from_slice(&find(topic).payload).unwrap();
        assert!(event.extension("traceparent").is_none());
    }
}
