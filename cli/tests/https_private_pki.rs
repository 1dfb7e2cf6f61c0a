//! HTTPS receivers behind a private CA, and ones that ask for a client certificate (issue
//! 57, item 2): a real TLS server on loopback (rustls) with certificates a test CA issues
//! at test time, the library's relay and the CLI's.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/https_receiver.rs"]
mod https_receiver;
#[path = "../../tests/common/test_ca.rs"]
mod test_ca;

use std::time::Duration;

use https_receiver::HttpsReceiver;
use sqlite_outbox::transport::HttpConfig;
use test_ca::TestCa;

const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn a_receiver_behind_a_private_ca_is_refused_without_spending_attempts_and_reached_with_its_ca() {
    // Issue 57: 30 events against an HTTPS receiver with a private CA spent every event's
    // attempts (148 retries in 8 s): a TLS failure was the events' fault.
    let ca = TestCa::new("factory CA");
    let receiver = HttpsReceiver::start(&ca.server(), None);
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("device.db"), "reading", 30);
    let relay = common::relay_over_http(&outbox, &receiver.url(), HttpConfig::new(), 3);
    std::thread::sleep(Duration::from_secs(4));
    let _ = relay.shutdown();
    let rows = common::rows(&outbox);
    let attempts: i64 = rows.iter().map(|r| r.attempts).sum();
    eprintln!(
        "without the CA: {attempts} attempts spent, {} dead, last error {:?}",
        rows.iter().filter(|r| r.dead).count(),
        rows.iter().find_map(|r| r.last_error.clone())
    );
    assert_eq!(receiver.received(), 0);
    assert_eq!(attempts, 0, "a TLS failure spends no attempt");
    assert!(rows.iter().all(|r| !r.dead));
    assert!(
        rows.iter()
            .filter_map(|r| r.last_error.as_deref())
            .any(|e| e.contains("unreachable") && e.to_lowercase().contains("certificate")),
        "the refusal says it is the certificate: {:?}",
        rows.iter().find_map(|r| r.last_error.clone())
    );
    // With the CA's certificate, every event goes.
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    let relay = common::relay_over_http(&outbox, &receiver.url(), HttpConfig::new().ca_pem(pem), 3);
    assert!(common::all_delivered_within(&outbox, PATIENCE));
    let _ = relay.shutdown();
    assert_eq!(receiver.received(), 30);
}

#[test]
fn a_receiver_that_asks_for_a_client_certificate_gets_the_devices() {
    let ca = TestCa::new("platform CA");
    let receiver = HttpsReceiver::start(&ca.server(), Some(&ca.ca_pem()));
    let device_cert = ca.client("device-42");
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("device.db"), "reading", 5);
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    // Without a client certificate the handshake is refused: no attempt spent.
    let relay = common::relay_over_http(
        &outbox,
        &receiver.url(),
        HttpConfig::new().ca_pem(pem.clone()),
        3,
    );
    std::thread::sleep(Duration::from_secs(3));
    let _ = relay.shutdown();
    let rows = common::rows(&outbox);
    assert_eq!(receiver.received(), 0);
    assert_eq!(rows.iter().map(|r| r.attempts).sum::<i64>(), 0, "{rows:?}");
    let relay = common::relay_over_http(
        &outbox,
        &receiver.url(),
        HttpConfig::new().ca_pem(pem).client_identity_pem(
            std::fs::read(&device_cert.cert).unwrap(),
            std::fs::read(&device_cert.key).unwrap(),
        ),
        3,
    );
    assert!(common::all_delivered_within(&outbox, PATIENCE));
    let _ = relay.shutdown();
    assert_eq!(receiver.received(), 5);
}

#[test]
fn the_cli_relay_takes_a_ca_file_and_a_client_certificate_and_refuses_bad_pem_with_exit_2() {
    let ca = TestCa::new("site CA");
    let receiver = HttpsReceiver::start(&ca.server(), Some(&ca.ca_pem()));
    let device_cert = ca.client("device-7");
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("device.db"), "reading", 3);
    drop(outbox);
    let db = dir.path().join("device.db");
    let url = receiver.url();
    let ca_file = ca.ca_pem();
    let args = [
        "relay",
        "--url",
        &url,
        "--ca-file",
        ca_file.to_str().unwrap(),
        "--client-cert",
        device_cert.cert.to_str().unwrap(),
        "--client-key",
        device_cert.key.to_str().unwrap(),
        "--until-empty",
        "--timeout",
        "30s",
    ];
    let o = common::outbox_cli(&db, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(receiver.received(), 3);
    // A CA file that holds no certificate: refused at start, naming the setting.
    let bad = dir.path().join("not-a-ca.pem");
    std::fs::write(&bad, "hello\n").unwrap();
    let o = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--ca-file",
            bad.to_str().unwrap(),
            "--until-empty",
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ca_pem holds no PEM certificate"),
        "{stderr}"
    );
}
