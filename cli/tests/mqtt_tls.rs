//! `mqtts://` against a real Mosquitto with a TLS listener and certificates made at test time:
//! mutual TLS delivers; a broker certificate from another CA, or no client certificate where
//! the broker requires one, holds events as offline (no attempt spent, nothing dead); and the
//! CLI's `--ca`, `--cert` and `--key`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/mosquitto.rs"]
mod mosquitto;
#[path = "../../tests/common/test_ca.rs"]
mod test_ca;

use std::time::Duration;

use common::{rows, wait_until};
use mosquitto::{Mosquitto, Setup, Subscriber, Tls};
use serde_json::json;
use sqlite_outbox::transport::MqttConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};
use test_ca::TestCa;

/// A broker whose TLS listener presents a certificate of `ca` and requires clients to show
/// one `ca` signed.
fn tls_broker(ca: &TestCa) -> Mosquitto {
    let server = ca.server();
    Mosquitto::start_setup(Setup {
        tls: Some(Tls {
            server_cert: server.cert,
            server_key: server.key,
            client_ca: ca.ca_pem(),
            require_certificate: true,
        }),
        ..Setup::default()
    })
}

fn enqueue(outbox: &Outbox, n: usize) {
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let _ = outbox.enqueue(tx, Event::new("reading", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

fn relay_to(url: String, config: MqttConfig) -> RelayConfig {
    RelayConfig::new()
        .destination(Destination::mqtt("default", url).mqtt_config(config))
        .poll_interval(Duration::from_millis(20))
}

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn mutual_tls_delivers_and_a_wrong_ca_or_a_missing_client_certificate_holds_events_offline() {
    let ca = TestCa::new("test-ca");
    let broker = tls_broker(&ca);
    let subscriber = Subscriber::start(broker.port, "outbox/#", None);
    let client = ca.client("device-1");
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("tls.db")).unwrap();
    enqueue(&outbox, 20);

    // The broker's certificate signed by a CA the device does not trust: refused in the
    // handshake, held as offline.
    let stranger = TestCa::new("another-ca");
    let wrong_ca = MqttConfig::new()
        .ca_pem(read(&stranger.ca_pem()))
        .client_identity_pem(read(&client.cert), read(&client.key));
    // No client certificate, where the broker requires one.
    let anonymous = MqttConfig::new().ca_pem(read(&ca.ca_pem()));
    for config in [wrong_ca, anonymous] {
        let relay = outbox
            .relay(relay_to(broker.tls_url(), config))
            .start()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let _ = relay.shutdown();
        for row in rows(&outbox) {
            assert!(!row.delivered && !row.dead, "{row:?}");
            assert_eq!(row.attempts, 0, "a failed handshake spends no attempt");
        }
    }
    assert_eq!(subscriber.count(), 0);

    let trusted = MqttConfig::new()
        .ca_pem(read(&ca.ca_pem()))
        .client_identity_pem(read(&client.cert), read(&client.key));
    let relay = outbox
        .relay(relay_to(broker.tls_url(), trusted))
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(30)
    ));
    let _ = relay.shutdown();
    assert!(rows(&outbox).iter().all(|r| r.attempts == 1));
    assert!(wait_until(Duration::from_secs(10), || subscriber.count() >= 20));
}

#[test]
fn tls_settings_that_cannot_work_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bad.db")).unwrap();
    let garbage = MqttConfig::new().ca_pem(b"not a certificate".to_vec());
    let e = outbox
        .relay(relay_to("mqtts://127.0.0.1:1".into(), garbage))
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds no PEM certificate"), "{e}");
    let ca = TestCa::new("test-ca");
    let on_plain = MqttConfig::new().ca_pem(read(&ca.ca_pem()));
    let e = outbox
        .relay(relay_to("mqtt://127.0.0.1:1".into(), on_plain))
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("use mqtts://"), "{e}");
}

#[test]
fn the_cli_relays_over_mutual_tls_with_ca_cert_and_key_files() {
    let ca = TestCa::new("test-ca");
    let broker = tls_broker(&ca);
    let client = ca.client("device-1");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db");
    let outbox = Outbox::open(&db).unwrap();
    enqueue(&outbox, 10);
    let url = broker.tls_url();
    let (ca_pem, cert, key) = (
        ca.ca_pem().display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let o = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--ca",
            &ca_pem,
            "--cert",
            &cert,
            "--key",
            &key,
            "--until-empty",
            "--timeout",
            "60s",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(rows(&outbox).iter().all(|r| r.delivered));
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let not_pem = not_pem.display().to_string();
    for (args, why) in [
        (
            vec!["--cert", cert.as_str()],
            "--cert and --client-key go together",
        ),
        (vec!["--ca", not_pem.as_str()], "holds no PEM certificate"),
    ] {
        let mut all = vec!["relay", "--url", &url, "--until-empty"];
        all.extend(args);
        let o = common::outbox_cli(&db, &all);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains(why), "{all:?}: {stderr}");
    }
}
