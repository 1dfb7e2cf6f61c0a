//! The fleet's front door, round 2 (issue 56): each finding of a security review of
//! `outbox ingest`, reproduced against the real pieces (the `outbox` binary, a PostgreSQL on
//! loopback, raw sockets for the hostile clients, a real relay for the device) and held shut.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/ingest_process.rs"]
mod ingest_process;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ingest_process::{event_body, stored, Ingest};
use pg::Postgres;
use raw_http::{device_signed_headers, request};
use serde_json::json;
use sqlite_outbox::receive::SigningKey;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const BOUND: Duration = Duration::from_secs(30);

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn keys_file(dir: &Path, lines: &[(&str, &str, String)]) -> PathBuf {
    let path = dir.join("keys");
    let text: String = lines
        .iter()
        .map(|(id, pattern, key)| format!("{id} {pattern} {key}\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// A device of `source` with five events committed, and its relay signing with
/// `key_text` for the ingest: two attempts an event at most, so one spent for good would
/// dead-letter it soon.
fn device_relaying(
    dir: &Path,
    source: &str,
    ingest: &Ingest,
    key_text: &str,
) -> (Outbox, sqlite_outbox::RelayHandle) {
    let device = Outbox::builder()
        .default_source(source)
        .open(dir.join("device.db"))
        .unwrap();
    device
        .transaction(|tx| {
            for i in 0..5 {
                let _ = device.enqueue(tx, Event::new("reading", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let relay = device
        .relay(
            common::fast(
                RelayConfig::new()
                    .destination(Destination::http("default", ingest.url()).signing_key(key_text)),
            )
            .max_attempts(2),
        )
        .start()
        .unwrap();
    (device, relay)
}

/// A PostgreSQL, a device's key, and an ingest whose keys file lets that key sign for
/// `pattern`, started with `extra` arguments and healthy.
struct Fleet {
    postgres: Postgres,
    dir: tempfile::TempDir,
    key: SigningKey,
    ingest: Ingest,
}

fn fleet(pattern: &str, extra: &[&str]) -> Fleet {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = SigningKey::generate().unwrap();
    let keys = keys_file(dir.path(), &[("d", pattern, key.public_key().to_text())]);
    let mut args = vec!["--keys", keys.to_str().unwrap()];
    args.extend_from_slice(extra);
    let ingest = Ingest::start(&postgres, &args);
    assert!(ingest.wait_healthy(BOUND));
    Fleet {
        postgres,
        dir,
        key,
        ingest,
    }
}

#[test]
fn an_ingest_started_while_postgres_is_down_answers_503_until_it_has_read_the_keys_table() {
    // Issue 56 item 1: before, every provisioned device got 401 unknown_source until the
    // table was read, and its relay dead-lettered on the 401 (5 of 5 dead).
    let mut postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, key_text) = SigningKey::generate().unwrap();
    {
        let mut client = postgres.client();
        sqlite_outbox::receive::pg_migrate(&mut client).unwrap();
        client
            .execute(
                "INSERT INTO outbox_device_keys (key_id, source_pattern, key) \
                 VALUES ('d1', '/devices/d1', $1)",
                &[&key.public_key().to_text()],
            )
            .unwrap();
    }
    postgres.stop();
    let ingest = Ingest::start(&postgres, &["--keys-table"]);
    let answer = ingest.post(&key, "/devices/d1", "early");
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
    assert_ne!(
        ingest.healthz(),
        200,
        "not healthy before the table is read"
    );

    // A device's relay meanwhile: nothing is dead-lettered, nothing is spent for good.
    let (device, relay) = device_relaying(dir.path(), "/devices/d1", &ingest, &key_text);
    std::thread::sleep(Duration::from_secs(3));
    postgres.restart();
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    assert!(
        common::all_delivered_within(&device, BOUND),
        "every event delivered once the table was read"
    );
    let _ = relay.shutdown();
    assert_eq!(stored(&postgres, "/devices/d1"), 5);
    assert_eq!(device.stats().unwrap().dead, 0);
}

#[test]
fn a_relay_answered_401_keeps_its_events_and_delivers_them_once_its_key_is_provisioned() {
    // Issue 56 item 1, device side: a 401 is about the credentials, not the event.
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, key_text) = SigningKey::generate().unwrap();
    let ingest = Ingest::start(&postgres, &["--keys-table"]);
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    let (device, relay) = device_relaying(dir.path(), "/devices/late", &ingest, &key_text);
    std::thread::sleep(Duration::from_secs(2));
    let stats = device.stats().unwrap();
    assert_eq!(stats.dead, 0, "401s dead-letter nothing");
    assert_eq!(stats.pending, 5);
    postgres
        .client()
        .execute(
            "INSERT INTO outbox_device_keys (key_id, source_pattern, key) \
             VALUES ('late', '/devices/late', $1)",
            &[&key.public_key().to_text()],
        )
        .unwrap();
    assert!(common::all_delivered_within(&device, BOUND));
    let _ = relay.shutdown();
    assert_eq!(stored(&postgres, "/devices/late"), 5);
}

/// Opens `n` connections that each declare a 1 MiB body for a registered source, with any
/// signature, and send no body.
fn idle_declarers(addr: SocketAddr, source: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut stream = TcpStream::connect(addr).unwrap();
            let _ = stream.write_all(
                format!(
                    "POST /events HTTP/1.1\r\nhost: x\r\ncontent-length: 1048576\r\n\
                     content-type: application/cloudevents+json\r\noutbox-source: {source}\r\n\
                     webhook-id: idle-{i}\r\nwebhook-timestamp: {}\r\n\
                     webhook-signature: v1a,{}\r\n\r\n",
                    now(),
                    "A".repeat(86) + "=="
                )
                .as_bytes(),
            );
            stream
        })
        .collect()
}

#[test]
fn idle_connections_declaring_large_bodies_lock_no_device_out() {
    // Issue 56 item 2: 64 idle connections each declaring 1 MiB held the whole 64 MiB
    // budget, and every real device got 503 (139 of 139 posts).
    let Fleet {
        postgres,
        dir: _dir,
        key,
        ingest,
    } = fleet("/devices/*", &["--read-timeout", "20s"]);
    let _attack = idle_declarers(ingest.addr, "/devices/victim", 64);
    std::thread::sleep(Duration::from_millis(500));
    let posts = 40;
    let answered_2xx = (0..posts)
        .filter(|i| {
            (200..300).contains(&ingest.post(&key, "/devices/real", &format!("r{i}")).status)
        })
        .count();
    eprintln!("during the attack: {answered_2xx} of {posts} signed posts answered 2xx");
    assert_eq!(answered_2xx, posts);
    assert_eq!(stored(&postgres, "/devices/real"), posts as i64);
}

#[test]
fn one_address_holds_its_share_of_connections_and_a_body_must_keep_arriving() {
    let Fleet {
        postgres: _postgres,
        dir: _dir,
        key,
        ingest,
    } = fleet(
        "/devices/*",
        &[
            "--max-connections-per-peer",
            "4",
            "--read-timeout",
            "20s",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    // Four connections, each answered on keep-alive (so each is counted; a connection of
    // the health checks above may still be closing, and then one is retried).
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = None;
            assert!(common::wait_until(BOUND, || {
                let mut s = TcpStream::connect(ingest.addr).unwrap();
                s.set_read_timeout(Some(BOUND)).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                    .unwrap();
                let mut buf = [0u8; 512];
                let n = s.read(&mut buf).unwrap_or(0);
                let ok = buf[..n].starts_with(b"HTTP/1.1 200");
                if ok {
                    stream = Some(s);
                } else {
                    std::thread::sleep(Duration::from_millis(100));
                }
                ok
            }));
            stream.unwrap()
        })
        .collect();
    let refused_while_opening = ingest
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("outbox_ingest_refusals_total{reason=\"peer_connections\"} "))
        .map_or(0, |n| n.parse::<u64>().unwrap());
    let started = Instant::now();
    let mut fifth = TcpStream::connect(ingest.addr).unwrap();
    fifth.set_read_timeout(Some(BOUND)).unwrap();
    let answer = raw_http::read_answer(&mut fifth).unwrap();
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once"
    );
    assert!(ingest.metrics().contains(&format!(
        "outbox_ingest_refusals_total{{reason=\"peer_connections\"}} {}",
        refused_while_opening + 1
    )));
    drop(held);

    // A body that dribbles a byte a second is cut off soon after its grace, not at the
    // 20 s read timeout.
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    let body = event_body("slow", "/devices/slow");
    let headers = device_signed_headers(&key, "/devices/slow", "slow", &body);
    let mut slow = TcpStream::connect(ingest.addr).unwrap();
    slow.write_all(raw_http::events_post_head(&headers, body.len()).as_bytes())
        .unwrap();
    let started = Instant::now();
    slow.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut answer = Vec::new();
    for byte in body.iter() {
        if slow.write_all(&[*byte]).is_err() {
            break;
        }
        let mut buf = [0u8; 512];
        if let Ok(n) = slow.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
            break;
        }
        if started.elapsed() > BOUND {
            break;
        }
    }
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    eprintln!("a body at a byte a second was answered after {took:?}: {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn long_and_invented_source_names_cost_neither_memory_nor_log() {
    // Issue 56 item 3: 1,000 requests with 256 KiB source names took the ingest from 8 to
    // 613 MiB and wrote 262 MB of log lines.
    let Fleet {
        postgres: _postgres,
        dir: _dir,
        key,
        ingest,
    } = fleet("/devices/d", &["--metrics-listen", "127.0.0.1:0"]);
    let rss_before = ingest.rss_kib();
    let log_before = ingest.log_text().len();
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..1_000 {
        // 256 KiB names: past the head's limit. 1,000-byte names: under the source's, each
        // a new name no key is for.
        let name = if i % 2 == 0 {
            format!("/{}{i}", "x".repeat(256 << 10))
        } else {
            format!("/{}{i:05}", "y".repeat(994))
        };
        let Ok(mut stream) = TcpStream::connect(ingest.addr) else {
            continue;
        };
        stream.set_read_timeout(Some(BOUND)).unwrap();
        let head = format!(
            "POST /events HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\noutbox-source: {name}\r\n\
             webhook-id: m{i}\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1a,AAAA\r\n\r\n{{}}",
            now()
        );
        let _ = stream.write_all(head.as_bytes());
        let status = raw_http::read_answer(&mut stream).map_or(0, |a| a.status);
        *statuses.entry(status).or_insert(0) += 1;
    }
    let rss_after = ingest.rss_kib();
    let log_after = ingest.log_text().len();
    eprintln!(
        "answers {statuses:?}; RSS {} -> {} MiB; log grew {} bytes",
        rss_before / 1024,
        rss_after / 1024,
        log_after - log_before
    );
    assert_eq!(statuses.get(&431), Some(&500), "{statuses:?}");
    assert_eq!(statuses.get(&401), Some(&500), "{statuses:?}");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "{rss_before} -> {rss_after} KiB"
    );
    assert!(
        log_after - log_before < 64 << 10,
        "{} bytes of log",
        log_after - log_before
    );
    // A source over the limit is refused before anything is kept for it.
    let long = format!("/{}", "z".repeat(1024));
    let answer = ingest.post(&key, &long, "too-long");
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("longer than 1024 bytes"), "{answer:?}");
    assert!(ingest
        .metrics()
        .contains("outbox_ingest_refusals_total{reason=\"source_too_long\"} 1"));
    // The registered device is still served.
    assert_eq!(ingest.post(&key, "/devices/d", "ok").status, 204);
}

#[test]
fn gzip_bombs_with_garbage_signatures_cost_little_and_never_slow_the_health_check() {
    // Issue 56 item 4: 11 KB of gzip decoding to 1 MiB with four garbage v1a entries cost
    // 5.3 ms of CPU a request on the I/O threads, and /healthz p50 went from 0.5 to 65 ms.
    let Fleet {
        postgres: _postgres,
        dir: _dir,
        key: _key,
        ingest,
    } = fleet("/devices/d", &[]);
    // Spaces with a random letter every 48 bytes: about 1 MiB decoded from tens of KiB,
    // under the ratio of 100 that would refuse it unread.
    let bomb = {
        let plain: Vec<u8> = (0..(1 << 20) - 1024)
            .map(|i| {
                if i % 48 == 0 {
                    fastrand::alphabetic() as u8
                } else {
                    b' '
                }
            })
            .collect();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&plain).unwrap();
        encoder.finish().unwrap()
    };
    let garbage = format!("v1a,{}==", "A".repeat(86));
    let signature = vec![garbage; 4].join(" ");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = ingest.addr;
    let cpu_before = ingest.cpu();
    let attackers: Vec<_> = (0..3)
        .map(|t| {
            let stop = std::sync::Arc::clone(&stop);
            let bomb = bomb.clone();
            let signature = signature.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let headers = [
                        ("content-type", "application/cloudevents+json".to_string()),
                        ("content-encoding", "gzip".to_string()),
                        ("outbox-source", "/devices/d".to_string()),
                        ("webhook-id", format!("bomb-{t}-{n}")),
                        ("webhook-timestamp", now().to_string()),
                        ("webhook-signature", signature.clone()),
                    ];
                    if let Ok(answer) = request(addr, "POST", "/events", &headers, &bomb) {
                        statuses.push(answer.status);
                    }
                }
                statuses
            })
        })
        .collect();
    let mut health = Vec::new();
    for _ in 0..40 {
        let started = Instant::now();
        let status = ingest.healthz();
        health.push((status, started.elapsed()));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses: Vec<u16> = attackers
        .into_iter()
        .flat_map(|a| a.join().unwrap())
        .collect();
    let cpu = ingest.cpu() - cpu_before;
    let mut took: Vec<Duration> = health.iter().map(|(_, t)| *t).collect();
    took.sort();
    eprintln!(
        "{} bombs ({} bytes each), {:?} of CPU, {:?} a request; /healthz p50 {:?}, max {:?}",
        statuses.len(),
        bomb.len(),
        cpu,
        cpu / statuses.len().max(1) as u32,
        took[took.len() / 2],
        took[took.len() - 1]
    );
    let mut by_status = std::collections::BTreeMap::new();
    for status in &statuses {
        *by_status.entry(*status).or_insert(0) += 1;
    }
    eprintln!("answers: {by_status:?}");
    assert!(by_status.get(&401).is_some_and(|n| *n > 0), "{by_status:?}");
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 503),
        "refused, never stored: {by_status:?}"
    );
    assert!(health.iter().all(|(s, _)| *s == 200), "{health:?}");
}

#[test]
fn a_bundle_signed_with_a_device_key_is_imported_as_that_device() {
    // Issue 56 item 5: import sent no outbox-source, so an ingest with per-device keys
    // refused every bundle event (0 of 3), and bundles could not be signed with a whsk_ key.
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("device.key");
    let keygen = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["keygen", "--out"])
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(keygen.status.success(), "{keygen:?}");
    let public = String::from_utf8(keygen.stdout)
        .unwrap()
        .split_whitespace()
        .find(|w| w.starts_with("whpk_"))
        .unwrap()
        .to_string();
    let keys = keys_file(dir.path(), &[("site", "/site-7", public)]);
    let ingest = Ingest::start(&postgres, &["--keys", keys.to_str().unwrap()]);
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    let db = dir.path().join("site.db");
    let device = Outbox::builder()
        .default_source("/site-7")
        .open(&db)
        .unwrap();
    device
        .transaction(|tx| {
            for i in 0..3 {
                let _ = device.enqueue(tx, Event::new("reading", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    drop(device);
    let bundle = dir.path().join("site.bundle");
    let export = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["export", "--signing-key"])
        .arg(&key_file)
        .arg("--out")
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(export.status.success(), "{export:?}");
    let import = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("import")
        .arg(&bundle)
        .arg("--signing-key")
        .arg(&key_file)
        .args(["--url", &ingest.url(), "--max-attempts", "3"])
        .output()
        .unwrap();
    assert!(import.status.success(), "{import:?}");
    assert_eq!(stored(&postgres, "/site-7"), 3);
}

#[test]
fn health_and_revocation_do_not_wait_behind_a_full_database_queue() {
    // Issue 56 item 6: the probe and the key reload waited in the stores' queue: under load
    // /healthz said 503 on 10 of 16 checks and a revocation took 5.7 to 7.5 s.
    let postgres = Postgres::start();
    let (heavy, _) = SigningKey::generate().unwrap();
    let (revoked, _) = SigningKey::generate().unwrap();
    let ingest = Ingest::start(&postgres, &["--keys-table", "--threads", "1"]);
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    for (id, source, key) in [
        ("heavy", "/devices/heavy", &heavy),
        ("rev", "/devices/rev", &revoked),
    ] {
        postgres
            .client()
            .execute(
                "INSERT INTO outbox_device_keys (key_id, source_pattern, key) VALUES ($1, $2, $3)",
                &[&id, &source, &key.public_key().to_text()],
            )
            .unwrap();
    }
    assert!(common::wait_until(BOUND, || ingest
        .post(&revoked, "/devices/rev", "r0")
        .status
        == 204));
    // One heavy sender: 8 threads posting batches as fast as they can.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = ingest.addr;
    let senders: Vec<_> = (0..8)
        .map(|t| {
            let stop = std::sync::Arc::clone(&stop);
            let heavy = heavy.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                let mut statuses = std::collections::BTreeMap::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let events: Vec<_> = (0..200)
                        .map(|i| {
                            json!({"specversion": "1.0", "id": format!("h{t}-{n}-{i}"),
                                   "source": "/devices/heavy", "type": "t", "data": {"i": i}})
                        })
                        .collect();
                    let body = serde_json::to_vec(&events).unwrap();
                    let id = format!("h{t}-{n}");
                    let mut headers = device_signed_headers(&heavy, "/devices/heavy", &id, &body);
                    headers[0].1 = "application/cloudevents-batch+json".into();
                    if let Ok(a) = request(addr, "POST", "/events", &headers, &body) {
                        *statuses.entry(a.status).or_insert(0) += 1;
                    }
                }
                statuses
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut health = Vec::new();
    for _ in 0..16 {
        health.push(ingest.healthz());
        std::thread::sleep(Duration::from_millis(250));
    }
    postgres
        .client()
        .execute(
            "UPDATE outbox_device_keys SET revoked_at = now() WHERE key_id = 'rev'",
            &[],
        )
        .unwrap();
    let revoking = Instant::now();
    let mut n = 0;
    assert!(common::wait_until(BOUND, || {
        n += 1;
        ingest
            .post(&revoked, "/devices/rev", &format!("r{n}"))
            .status
            == 401
    }));
    let revocation = revoking.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answers = std::collections::BTreeMap::new();
    for sender in senders {
        for (status, count) in sender.join().unwrap() {
            *answers.entry(status).or_insert(0) += count;
        }
    }
    let healthy = health.iter().filter(|s| **s == 200).count();
    eprintln!(
        "under load ({answers:?} heavy answers): /healthz 200 on {healthy} of {}; revocation took {revocation:?}",
        health.len()
    );
    assert!(answers.get(&204).is_some_and(|n| *n > 0), "{answers:?}");
    assert_eq!(healthy, health.len(), "{health:?}");
}

#[test]
fn a_keys_file_that_does_not_reload_is_counted_and_check_keys_says_why() {
    // Issue 56 items 8 and 10: a SIGHUP with a malformed line kept every old key and only
    // a log line said so; an identity-point key let one fixed signature verify anything.
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = SigningKey::generate().unwrap();
    let keys = keys_file(
        dir.path(),
        &[("d", "/devices/d", key.public_key().to_text())],
    );
    let check = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["ingest", "--check-keys"])
            .arg(path)
            .output()
            .unwrap()
    };
    let good = check(&keys);
    assert!(good.status.success(), "{good:?}");
    assert!(
        String::from_utf8_lossy(&good.stdout).contains("1 keys"),
        "{good:?}"
    );
    let ingest = Ingest::start(
        &postgres,
        &[
            "--keys",
            keys.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    assert!(common::wait_until(BOUND, || ingest.healthz() == 200));
    let metrics = ingest.metrics();
    assert!(
        metrics.contains("outbox_ingest_key_reload_failures_total 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("outbox_ingest_key_reload_last_success_timestamp_seconds 0\n"),
        "{metrics}"
    );
    // The identity point: refused by --check-keys, and by a reload.
    let identity = format!("whpk_{}", {
        use base64::Engine;
        let mut bytes = [0u8; 32];
        bytes[0] = 1;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    });
    let bad = dir.path().join("bad-keys");
    std::fs::write(
        &bad,
        format!(
            "d /devices/d {}\nevil /devices/* {identity}\n",
            key.public_key().to_text()
        ),
    )
    .unwrap();
    let refused = check(&bad);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("line 2") && why.contains("small order"),
        "{why}"
    );
    std::fs::copy(&bad, &keys).unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &ingest.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(common::wait_until(BOUND, || ingest
        .metrics()
        .contains("outbox_ingest_key_reload_failures_total 1")));
    assert_eq!(
        ingest.post(&key, "/devices/d", "still").status,
        204,
        "old keys kept"
    );
}

#[test]
fn values_from_a_request_cannot_forge_log_lines() {
    // Issue 56 item 13: an event id was logged with `{}`, so a device could write lines.
    let Fleet {
        postgres: _postgres,
        dir: _dir,
        key,
        ingest,
    } = fleet("/devices/d", &[]);
    let forged_line = "INFO ingest: all keys revoked by operator";
    let body = json!({"specversion": "1.0", "id": format!("x\n{forged_line}"),
                      "source": "/devices/other", "type": "t"})
    .to_string()
    .into_bytes();
    let answer = request(
        ingest.addr,
        "POST",
        "/events",
        &device_signed_headers(&key, "/devices/d", "m1", &body),
        &body,
    )
    .unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(common::wait_until(BOUND, || ingest
        .log_text()
        .contains("forged_source")));
    let log = ingest.log_text();
    assert!(
        !log.lines().any(|l| l.starts_with(forged_line)),
        "a line of the device's making:\n{log}"
    );
    assert!(log.contains("\\n"), "the newline is escaped:\n{log}");
}

#[test]
fn a_store_that_cannot_finish_is_cancelled_by_postgresql_not_left_waiting() {
    // Issue 56 item 12: no statement timeout towards PostgreSQL, so a store stuck behind a
    // lock (or a dead connection) stayed there long after its device was answered 503.
    let Fleet {
        postgres,
        dir: _dir,
        key,
        ingest,
    } = fleet("/devices/d", &[]);
    let mut locker = postgres.client();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("LOCK TABLE outbox_ingested IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let started = Instant::now();
    let body = event_body("stuck", "/devices/d");
    let mut stream = TcpStream::connect(ingest.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = raw_http::events_post_head(
        &device_signed_headers(&key, "/devices/d", "stuck", &body),
        body.len(),
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let answer = raw_http::read_answer(&mut stream).unwrap();
    let took = started.elapsed();
    eprintln!(
        "a store behind a lock was answered {} after {took:?}: {}",
        answer.status, answer.body
    );
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.body.contains("statement timeout"), "{answer:?}");
    let waiting: i64 = postgres
        .client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE application_name = 'outbox-ingest' AND wait_event_type = 'Lock'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(waiting, 0, "no store is left waiting for the lock");
    lock.rollback().unwrap();
    assert_eq!(ingest.post(&key, "/devices/d", "after").status, 204);
}
