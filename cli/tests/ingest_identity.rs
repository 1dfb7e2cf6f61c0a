//! Device identity at the ingest, against a real PostgreSQL: each device signs with its own
//! Ed25519 key (Standard Webhooks v1a), the key registry says which sources a key may sign
//! for, and nothing signed by one device is stored as another's. The registry is a file
//! (re-read on SIGHUP, with the `outbox ingest` process) or the table `outbox_device_keys`
//! (re-read when it changes); refusals are counted in `GET /metrics` and `outbox_sources`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/ingest_process.rs"]
mod ingest_process;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ingest_process::{event_body, stored, Ingest};
use outbox_cli::ingest::{IngestConfig, IngestServer};
use pg::Postgres;
use raw_http::{device_signed_headers, request};
use serde_json::json;
use sqlite_outbox::receive::SigningKey;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A device's outbox with `n` events of its source, and its relay signing with `key`.
fn deliver_from_device(dir: &Path, source: &str, key: &str, url: &str, n: usize) -> Outbox {
    let device = Outbox::builder()
        .default_source(source)
        .open(dir.join(format!("{}.db", source.replace('/', "_"))))
        .unwrap();
    device
        .transaction(|tx| {
            for i in 0..n {
                let _ = device.enqueue(tx, Event::new("reading", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let relay = device
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::http("default", url)
                        .signing_key(key)
                        .batch(10, 1 << 20),
                )
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(30)
    ));
    let _ = relay.shutdown();
    device
}

#[test]
fn a_device_cannot_sign_for_another_and_a_forged_source_is_never_stored() {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (key_a, text_a) = SigningKey::generate().unwrap();
    let (key_b, text_b) = SigningKey::generate().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        format!(
            "# the fleet\ndev-a /devices/a {}\ndev-b /devices/b {}\n",
            key_a.public_key().to_text(),
            key_b.public_key().to_text()
        ),
    )
    .unwrap();
    let server = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), postgres.url()).keys_file(&keys),
    )
    .unwrap();
    let addr = server.local_addr();
    let url = format!("http://{addr}/events");

    // Both devices deliver through real relays, each signing with its own key.
    deliver_from_device(dir.path(), "/devices/a", &text_a, &url, 25);
    deliver_from_device(dir.path(), "/devices/b", &text_b, &url, 25);
    assert_eq!(stored(&postgres, "/devices/a"), 25);
    assert_eq!(stored(&postgres, "/devices/b"), 25);

    // Device a's key, taken off its pole, tries to write as b.
    // 1. Naming b in the header: only b's keys are tried, and a's signature is not one.
    let body = event_body("forged-1", "/devices/b");
    let answer = request(
        addr,
        "POST",
        "/events",
        &device_signed_headers(&key_a, "/devices/b", "m1", &body),
        &body,
    )
    .unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(answer.body.contains("invalid_signature"), "{answer:?}");
    let bad_signature = answer.body.clone();
    // 2. Naming a in the header, b in the event: verified as a, refused as forged.
    let answer = request(
        addr,
        "POST",
        "/events",
        &device_signed_headers(&key_a, "/devices/a", "m2", &body),
        &body,
    )
    .unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("forged_source"), "{answer:?}");
    // 3. A source nobody registered: 401 before the body (the body is never sent).
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    stream
        .write_all(
            format!(
                "POST /events HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\noutbox-source: /devices/zzz\r\n\
                 webhook-id: m\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1a,AAAA\r\n\r\n",
                now()
            )
            .as_bytes(),
        )
        .unwrap();
    let answer = raw_http::read_answer(&mut stream).unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    // The same words as a bad signature: the answer does not tell which sources exist.
    assert_eq!(answer.body, bad_signature, "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered without the body"
    );

    assert_eq!(stored(&postgres, "/devices/b"), 25, "nothing forged stored");
    assert_eq!(server.refusals("invalid_signature"), 1);
    assert_eq!(server.refusals("forged_source"), 1);
    assert_eq!(server.refusals("unknown_source"), 1);

    // The fleet at a glance, with the refusals added by the background probe.
    assert!(common::wait_until(Duration::from_secs(5), || {
        let row = postgres
            .client()
            .query_one(
                "SELECT events_stored, refusals, newest_event_time IS NOT NULL
                   FROM outbox_sources WHERE source = '/devices/a'",
                &[],
            )
            .unwrap();
        row.get::<_, i64>(0) == 25 && row.get::<_, i64>(1) == 1 && row.get::<_, bool>(2)
    }));
    let sources: i64 = postgres
        .client()
        .query_one("SELECT count(*) FROM outbox_sources", &[])
        .unwrap()
        .get(0);
    assert_eq!(sources, 2, "a refused unknown source makes no row");
    server.shutdown();
}

#[test]
fn a_v1a_request_signed_by_a_python_client_is_verified_and_stored() {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    // The Python client makes its own key and prints the public key first.
    let script = r#"
import base64, json, sys, time, urllib.request
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization
key = Ed25519PrivateKey.generate()
public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
print("whpk_" + base64.b64encode(public).decode(), flush=True)
url = sys.stdin.readline().strip()
body = json.dumps({"specversion": "1.0", "id": "py-1", "source": "/devices/py", "type": "t", "data": {"from": "python"}}).encode()
ts = str(int(time.time()))
signature = key.sign(b"msg-py." + ts.encode() + b"." + body)
request = urllib.request.Request(url, data=body, method="POST", headers={
    "content-type": "application/cloudevents+json", "webhook-id": "msg-py", "webhook-timestamp": ts,
    "webhook-signature": "v1a," + base64.b64encode(signature).decode(), "outbox-source": "/devices/py"})
print(urllib.request.urlopen(request, timeout=10).status, flush=True)
"#;
    let mut python = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines = BufReader::new(python.stdout.take().unwrap()).lines();
    let public = lines
        .next()
        .expect("the Python client printed nothing: is its `cryptography` package installed? (.ci/run installs it)")
        .unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("py /devices/* {public}\n")).unwrap();
    let server = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), postgres.url()).keys_file(&keys),
    )
    .unwrap();
    writeln!(
        python.stdin.as_mut().unwrap(),
        "http://{}/events",
        server.local_addr()
    )
    .unwrap();
    let status = lines.next().unwrap().unwrap();
    assert_eq!(status, "204");
    assert!(python.wait().unwrap().success());
    let data: serde_json::Value = postgres
        .client()
        .query_one("SELECT data FROM outbox_ingested WHERE id = 'py-1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(data, json!({"from": "python"}));
    server.shutdown();
}

#[test]
fn a_keys_file_is_reread_on_sighup_without_dropping_a_connection() {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = SigningKey::generate().unwrap();
    let (new, _) = SigningKey::generate().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        format!("old /devices/r {}\n", old.public_key().to_text()),
    )
    .unwrap();
    let ingest = Ingest::start(
        &postgres,
        &[
            "--keys",
            keys.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    // A connection held open across the reload.
    let mut held = TcpStream::connect(ingest.addr).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(ingest.post(&old, "/devices/r", "e1").status, 204);
    assert_eq!(ingest.post(&new, "/devices/r", "e2").status, 401);

    // Rotation: the new key is added beside the old one, then the old one removed.
    std::fs::write(
        &keys,
        format!(
            "old /devices/r {}\nnew /devices/r {}\n",
            old.public_key().to_text(),
            new.public_key().to_text()
        ),
    )
    .unwrap();
    let hup = |pid: u32| {
        assert!(Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    hup(ingest.child.id());
    assert!(common::wait_until(Duration::from_secs(5), || ingest
        .post(&new, "/devices/r", "e3")
        .status
        == 204));
    assert_eq!(
        ingest.post(&old, "/devices/r", "e4").status,
        204,
        "both during the rotation"
    );
    std::fs::write(
        &keys,
        format!("new /devices/r {}\n", new.public_key().to_text()),
    )
    .unwrap();
    hup(ingest.child.id());
    assert!(common::wait_until(Duration::from_secs(5), || ingest
        .post(&old, "/devices/r", "e5")
        .status
        == 401));
    // A malformed file keeps the keys there were.
    std::fs::write(&keys, "new /devices/r whpk_broken\n").unwrap();
    hup(ingest.child.id());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ingest.post(&new, "/devices/r", "e6").status, 204);

    // The held connection still serves.
    let body = event_body("e7", "/devices/r");
    let head = raw_http::events_post_head(
        &device_signed_headers(&new, "/devices/r", "e7", &body),
        body.len(),
    );
    held.write_all(head.as_bytes()).unwrap();
    held.write_all(&body).unwrap();
    assert_eq!(raw_http::read_answer(&mut held).unwrap().status, 204);

    // The refusals are in /metrics, on its own address.
    let metrics = request(ingest.metrics.unwrap(), "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .lines()
            .any(|l| l.starts_with("outbox_ingest_refusals_total{reason=\"invalid_signature\"} ")),
        "{}",
        metrics.body
    );
    assert!(metrics
        .body
        .contains("outbox_ingest_requests_total{status=\"204\"}"));
    let on_events = request(ingest.addr, "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(
        on_events.status, 404,
        "metrics are not served with the events"
    );
}

#[test]
fn a_key_inserted_in_the_table_provisions_a_device_and_revoking_it_refuses_it() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(&postgres, &["--keys-table"]);
    assert!(
        ingest.wait_healthy(Duration::from_secs(10)),
        "healthy once the table is read"
    );
    let (key, _) = SigningKey::generate().unwrap();
    assert_eq!(
        ingest.post(&key, "/devices/t", "t1").status,
        401,
        "not provisioned yet"
    );
    assert!(common::wait_until(Duration::from_secs(10), || {
        postgres
        .client()
        .execute(
            "INSERT INTO outbox_device_keys (key_id, source_pattern, key) VALUES ('t', '/devices/t', $1)",
            &[&key.public_key().to_text()],
        )
        .is_ok()
    }));
    assert!(common::wait_until(Duration::from_secs(5), || ingest
        .post(&key, "/devices/t", "t2")
        .status
        == 204));
    postgres
        .client()
        .execute(
            "UPDATE outbox_device_keys SET revoked_at = now() WHERE key_id = 't'",
            &[],
        )
        .unwrap();
    // Posts until one is refused; that one is not stored.
    let mut n = 0;
    assert!(common::wait_until(Duration::from_secs(5), || {
        n += 1;
        ingest.post(&key, "/devices/t", &format!("t3-{n}")).status == 401
    }));
    let refused: i64 = postgres
        .client()
        .query_one(
            "SELECT count(*) FROM outbox_ingested WHERE id = $1",
            &[&format!("t3-{n}")],
        )
        .unwrap()
        .get(0);
    assert_eq!(refused, 0);
}

#[test]
fn a_key_from_outbox_keygen_signs_the_cli_relay_whose_batches_never_mix_sources() {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("device.key");
    let keygen = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["keygen", "--out", key_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(keygen.status.success());
    let public = String::from_utf8(keygen.stdout).unwrap().trim().to_string();
    assert!(public.starts_with("whpk_"), "{public}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the private key is its owner's only");
    let again = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["keygen", "--out", key_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(2),
        "an existing key is never overwritten"
    );

    // One gateway signs for its three sensors, whose events interleave in its outbox.
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("gateway-1 /site/gw-1/* {public}\n")).unwrap();
    let server = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), postgres.url()).keys_file(&keys),
    )
    .unwrap();
    let db = dir.path().join("gateway.db");
    let outbox = Outbox::open(&db).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..60 {
                let source = format!("/site/gw-1/sensor-{}", i % 3);
                let _ =
                    outbox.enqueue(tx, Event::new("reading", json!({"i": i})).source(source))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    drop(outbox);
    let relay = common::outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &format!("http://{}/events", server.local_addr()),
            "--signing-key",
            key_file.to_str().unwrap(),
            "--batch",
            "10",
            "--until-empty",
            "--timeout",
            "60s",
        ],
    );
    assert!(
        relay.status.success(),
        "{}",
        String::from_utf8_lossy(&relay.stderr)
    );
    // A batch mixing sources would be refused as forged (403) and dead-lettered.
    assert_eq!(server.refusals("forged_source"), 0);
    for sensor in 0..3 {
        assert_eq!(
            stored(&postgres, &format!("/site/gw-1/sensor-{sensor}")),
            20
        );
    }
    server.shutdown();
}
