//! `ingest` against a real PostgreSQL started by the test: device outboxes relay into it and
//! every committed event is stored once, in key order; a replay stores nothing; forged,
//! stale, malformed and oversize requests are refused by reason; a stopped PostgreSQL gives
//! 503s and everything lands once it is back.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::rows;
use outbox_cli::ingest::{IngestConfig, IngestServer};
use pg::Postgres;
use raw_http::{request, signed_headers};
use serde_json::json;
use sqlite_outbox::receive::Secret;
use sqlite_outbox::{Compression, Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const CLOUDEVENT: &str = "application/cloudevents+json";

fn secret() -> Secret {
    Secret::parse(SECRET).unwrap()
}

fn ingest(postgres: &Postgres) -> IngestServer {
    IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), postgres.url())
            .secret(secret())
            .threads(4)
            .max_body(64 * 1024),
    )
    .unwrap()
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/events")
}

/// A relay delivering `device`'s events to the ingest at `addr`, signed, in batches of
/// `batch`, polling every 20 ms.
fn relay_batches(device: &Outbox, addr: SocketAddr, batch: usize) -> sqlite_outbox::RelayHandle {
    relay_compressed_batches(device, addr, batch, Compression::None)
}

/// [`relay_batches`], its bodies compressed as `compression` says.
fn relay_compressed_batches(
    device: &Outbox,
    addr: SocketAddr,
    batch: usize,
    compression: Compression,
) -> sqlite_outbox::RelayHandle {
    device
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::http("default", url(addr))
                        .secret(SECRET)
                        .batch(batch, 1 << 20)
                        .compress(compression),
                )
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap()
}

/// Commits `n` keyed events from a device in transactions of ten, rolling back every third
/// transaction; returns the ids of the committed ones.
fn commit_events(device: &Outbox, n: usize, keys: usize) -> Vec<String> {
    let mut committed = Vec::new();
    for (t, chunk) in (0..n).collect::<Vec<_>>().chunks(10).enumerate() {
        let mut ids = Vec::new();
        let result: Result<(), sqlite_outbox::Error> = device.transaction(|tx| {
            for &i in chunk {
                let id = device.enqueue(
                    tx,
                    Event::new("reading.taken", json!({"i": i}))
                        .partition_key(format!("k{}", i % keys)),
                )?;
                ids.push(id.event_id().to_string());
            }
            if t % 3 == 2 {
                return Err(sqlite_outbox::Error::InvalidConfig(
                    "rolled back on purpose".into(),
                ));
            }
            Ok(())
        });
        if result.is_ok() {
            committed.extend(ids);
        }
    }
    committed
}

fn stored_ids(postgres: &Postgres) -> Vec<String> {
    postgres
        .client()
        .query("SELECT id FROM outbox_ingested", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn device_events_are_stored_once_each_and_read_back_in_key_order() {
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::builder()
        .default_source("/devices/7")
        .open(dir.path().join("device.db"))
        .unwrap();
    let committed = commit_events(&device, 300, 4);
    let relay = relay_batches(&device, server.local_addr(), 25);
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(60)
    ));
    let _ = relay.shutdown();
    let stored = stored_ids(&postgres);
    assert_eq!(
        stored.len(),
        committed.len(),
        "each committed event stored once"
    );
    assert_eq!(
        stored.iter().collect::<HashSet<_>>(),
        committed.iter().collect::<HashSet<_>>(),
        "exactly the committed ones: nothing rolled back"
    );
    // Per key, the documented function gives the device's commit order.
    let mut client = postgres.client();
    for k in 0..4 {
        let key = format!("k{k}");
        let rows = client
            .query(
                "SELECT id, sequence, type, time, data FROM outbox_key_events($1, $2)",
                &[&"/devices/7", &key],
            )
            .unwrap();
        let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let expected: Vec<String> = device_order(&device, &key);
        assert_eq!(ids, expected, "key {key}");
        let sequences: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
        assert!(sequences.windows(2).all(|w| w[0] < w[1]));
        let data: serde_json::Value = rows[0].get(4);
        assert!(data["i"].is_u64());
        let kind: String = rows[0].get(2);
        assert_eq!(kind, "reading.taken");
    }
    server.shutdown();
}

/// The committed events of `key`, in commit order, as the device has them.
fn device_order(device: &Outbox, key: &str) -> Vec<String> {
    let conn = device.connection().unwrap();
    let mut stmt = conn
        .prepare("SELECT event_id FROM outbox_events WHERE partition_key = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([key], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn event_body(id: &str, sequence: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "specversion": "1.0", "id": id, "source": "/devices/1", "type": "t",
        "partitionkey": "k", "sequence": sequence, "time": "2026-11-30T00:00:00Z",
        "data": {"a": 1}
    }))
    .unwrap()
}

#[test]
fn a_replayed_request_is_answered_204_and_stores_nothing() {
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let body = event_body("e-1", "00000000000000000005");
    let send = || {
        request(
            server.local_addr(),
            "POST",
            "/events",
            &signed_headers(&secret(), "msg-1", &body, CLOUDEVENT),
            &body,
        )
        .unwrap()
    };
    let first = send();
    assert_eq!(first.status, 204, "{first:?}");
    assert_eq!(first.header("outbox-stored"), Some("1"));
    let again = send();
    assert_eq!(again.status, 204, "{again:?}");
    assert_eq!(again.header("outbox-stored"), Some("0"));
    let row = postgres
        .client()
        .query_one("SELECT count(*), max(sequence) FROM outbox_ingested", &[])
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    assert_eq!(row.get::<_, Option<i64>>(1), Some(5));
    server.shutdown();
}

#[test]
fn bad_requests_are_refused_by_reason_and_store_nothing() {
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let addr = server.local_addr();
    let body = event_body("e-2", "7");
    let forged = Secret::parse("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdA==").unwrap();
    let mut stale = signed_headers(&secret(), "m", &body, CLOUDEVENT);
    stale[2].1 = "1000000".into();
    stale[3].1 = secret().sign("m", 1_000_000, &body);
    let bad_sequence = event_body("e-3", "12a");
    let not_cloudevents = br#"{"hello": "world"}"#.to_vec();
    let huge = vec![b' '; 70 * 1024];
    // Headers, body, expected status, and what the answer must say.
    type Case<'a> = (Vec<(&'a str, String)>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            signed_headers(&forged, "m", &body, CLOUDEVENT),
            body.clone(),
            401,
            "invalid_signature",
        ),
        (
            vec![("content-type", CLOUDEVENT.into())],
            body.clone(),
            401,
            "missing_header",
        ),
        (stale, body.clone(), 401, "timestamp_too_old"),
        (
            signed_headers(&secret(), "m", &not_cloudevents, CLOUDEVENT),
            not_cloudevents.clone(),
            400,
            "not CloudEvents",
        ),
        (
            signed_headers(&secret(), "m", &bad_sequence, CLOUDEVENT),
            bad_sequence.clone(),
            400,
            "not a decimal integer",
        ),
        (
            signed_headers(&secret(), "m", &huge, CLOUDEVENT),
            huge.clone(),
            413,
            "over the limit of 65536",
        ),
    ];
    for (headers, body, status, why) in cases {
        let answer = request(addr, "POST", "/events", &headers, &body).unwrap();
        assert_eq!(answer.status, status, "{why}: {answer:?}");
        assert!(answer.body.contains(why), "{why}: {answer:?}");
    }
    let get = request(addr, "GET", "/events", &[], b"").unwrap();
    assert_eq!(get.status, 405);
    let health = request(addr, "GET", "/healthz", &[], b"").unwrap();
    assert_eq!(health.status, 200, "{health:?}");
    assert!(stored_ids(&postgres).is_empty());
    server.shutdown();
}

#[test]
fn a_post_to_healthz_is_refused_and_a_relay_pointed_at_it_delivers_nothing() {
    // Issue 40: `POST /healthz` answered 200 and stored nothing, so a relay pointed at that
    // path marked its events delivered and they were gone.
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let addr = server.local_addr();
    let body = event_body("e-h", "1");
    let posted = request(
        addr,
        "POST",
        "/healthz",
        &signed_headers(&secret(), "m-h", &body, CLOUDEVENT),
        &body,
    )
    .unwrap();
    assert_eq!(posted.status, 405, "{posted:?}");
    assert_eq!(posted.header("allow"), Some("GET, HEAD"), "{posted:?}");
    let head = request(addr, "HEAD", "/healthz", &[], b"").unwrap();
    assert_eq!(head.status, 200, "{head:?}");
    // A device whose relay was given the health path by mistake: nothing is counted
    // delivered; its events are dead letters with the reason, to retry at the right path.
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::open(dir.path().join("device.db")).unwrap();
    commit_events(&device, 10, 2);
    let relay = device
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::http("default", format!("http://{addr}/healthz")).secret(SECRET),
                )
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while device.stats().unwrap().pending > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = relay.shutdown();
    let stats = device.stats().unwrap();
    assert_eq!(stats.delivered, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    let dead = device.dead_letters(100).unwrap();
    assert!(!dead.is_empty());
    assert!(
        dead.iter()
            .all(|d| d.last_error.as_deref().is_some_and(|e| e.contains("405"))),
        "{dead:?}"
    );
    assert!(stored_ids(&postgres).is_empty());
    server.shutdown();
}

#[test]
fn an_event_postgres_cannot_hold_is_refused_by_id_and_the_rest_of_its_batch_is_stored() {
    // Issue 40: one event with `\u0000` in its data (jsonb refuses it) made the whole
    // request a 400 saying only "db error", and the device dead-lettered the whole batch.
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let addr = server.local_addr();
    let batch = serde_json::to_vec(&json!([
        {"specversion": "1.0", "id": "ok-1", "source": "/devices/1", "type": "t", "data": {"a": 1}},
        {"specversion": "1.0", "id": "nul-1", "source": "/devices/1", "type": "t",
         "data": {"note": "a\u{0}b"}},
    ]))
    .unwrap();
    let batch_type = "application/cloudevents-batch+json";
    let answer = request(
        addr,
        "POST",
        "/events",
        &signed_headers(&secret(), "m-nul", &batch, batch_type),
        &batch,
    )
    .unwrap();
    assert_eq!(answer.status, 422, "{answer:?}");
    let refused: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        refused["refused"].as_array().map(Vec::len),
        Some(1),
        "{refused}"
    );
    assert_eq!(refused["refused"][0]["id"], "nul-1", "{refused}");
    assert!(refused["refused"][0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("u0000")));
    assert!(
        stored_ids(&postgres).is_empty(),
        "nothing of a refused request"
    );
    // Through a device's relay in batches of 10: the batch is split, only the event that
    // fails alone is dead-lettered, with the reason; the nine others are stored.
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::open(dir.path().join("device.db")).unwrap();
    let mut poison = String::new();
    device
        .transaction(|tx| {
            for i in 0..10 {
                let data = if i == 4 {
                    json!({"note": "a\u{0}b"})
                } else {
                    json!({"i": i})
                };
                let id = device.enqueue(tx, Event::new("t", data))?;
                if i == 4 {
                    poison = id.event_id().to_string();
                }
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let relay = relay_batches(&device, addr, 10);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while device.stats().unwrap().pending > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = relay.shutdown();
    let stats = device.stats().unwrap();
    assert_eq!((stats.delivered, stats.dead), (9, 1), "{stats:?}");
    let dead = device.dead_letters(10).unwrap();
    assert_eq!(dead[0].event_id, poison);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("422") && e.contains("u0000")),
        "{dead:?}"
    );
    let stored = stored_ids(&postgres);
    assert_eq!(stored.len(), 9);
    assert!(!stored.contains(&poison));
    server.shutdown();
}

#[test]
fn a_stopped_postgres_gives_503s_and_every_event_lands_once_it_is_back() {
    let mut postgres = Postgres::start();
    let server = ingest(&postgres);
    let addr = server.local_addr();
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::open(dir.path().join("device.db")).unwrap();
    let mut committed = commit_events(&device, 60, 3);
    let relay = device
        .relay(
            RelayConfig::new()
                .destination(Destination::http("default", url(addr)).secret(SECRET))
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(30)
    ));
    postgres.stop();
    // The background probe sees it within its second (a failed store at once).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let health = loop {
        let health = request(addr, "GET", "/healthz", &[], b"").unwrap();
        if health.status != 200 || std::time::Instant::now() > deadline {
            break health;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(health.status, 503, "{health:?}");
    let body = event_body("e-down", "1");
    let down = request(
        addr,
        "POST",
        "/events",
        &signed_headers(&secret(), "m", &body, CLOUDEVENT),
        &body,
    )
    .unwrap();
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(down.header("retry-after"), Some("5"));
    // The device keeps committing while the database is down; its events wait.
    committed.extend(commit_events(&device, 60, 3));
    std::thread::sleep(Duration::from_secs(2));
    assert!(rows(&device).iter().any(|r| !r.delivered));
    postgres.restart();
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(60)
    ));
    let report = relay.shutdown();
    assert_eq!(report.detached_threads, 0);
    assert!(rows(&device).iter().all(|r| !r.dead));
    let stored = stored_ids(&postgres);
    assert_eq!(stored.len(), committed.len());
    assert_eq!(
        stored.iter().collect::<HashSet<_>>(),
        committed.iter().collect::<HashSet<_>>()
    );
    // Healthy again once the probe has succeeded again.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let health = loop {
        let health = request(addr, "GET", "/healthz", &[], b"").unwrap();
        if health.status == 200 || std::time::Instant::now() > deadline {
            break health;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(health.status, 200, "{health:?}");
    server.shutdown();
}

#[test]
fn postgres_stopped_for_30_s_under_a_relay_dead_letters_nothing_and_spends_no_attempt() {
    const EVENTS: usize = 40;
    let mut postgres = Postgres::start();
    let server = ingest(&postgres);
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::builder()
        .default_source("/devices/outage")
        .open(dir.path().join("device.db"))
        .unwrap();
    let enqueue = |from: usize, to: usize| {
        device
            .transaction(|tx| {
                for i in from..to {
                    let _ = device.enqueue(tx, Event::new("reading", json!({ "i": i })))?;
                }
                Ok::<_, sqlite_outbox::Error>(())
            })
            .unwrap()
    };
    enqueue(0, EVENTS / 2);
    let relay = device
        .relay(
            RelayConfig::new()
                .destination(Destination::http("default", url(server.local_addr())).secret(SECRET))
                .max_attempts(3)
                .poll_interval(Duration::from_millis(20)),
        )
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(30)
    ));
    // The store goes away; the device keeps committing.
    postgres.stop();
    let outage = std::time::Instant::now();
    enqueue(EVENTS / 2, EVENTS);
    while outage.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            rows(&device).iter().all(|r| !r.dead),
            "nothing is dead-lettered during the outage"
        );
    }
    postgres.restart();
    assert!(
        common::all_delivered_within(&device, Duration::from_secs(60)),
        "delivered once the store is back: {:?}",
        rows(&device)
    );
    let _ = relay.shutdown();
    let rows = rows(&device);
    assert!(rows.iter().all(|r| r.delivered && !r.dead));
    // Each delivery is an attempt; the outage's 503s (with Retry-After) spent at most the
    // three that judged the destination down.
    let attempts: i64 = rows.iter().map(|r| r.attempts).sum();
    eprintln!("{attempts} attempts for {EVENTS} deliveries across a 30 s outage");
    assert!(
        attempts <= EVENTS as i64 + 3,
        "{} attempts spent during the outage: {rows:?}",
        attempts - EVENTS as i64
    );
    assert_eq!(stored_ids(&postgres).len(), EVENTS);
    server.shutdown();
}

#[test]
fn each_event_is_stored_with_its_trace_context_and_data_schema() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let dir = tempfile::tempdir().unwrap();
    let device = Outbox::builder()
        .default_source("/devices/9")
        .open(dir.path().join("traced.db"))
        .unwrap();
    let ids: Vec<String> = device
        .transaction(|tx| {
            device.enqueue_many(
                tx,
                [
                    Event::new("order.created", json!({"order": 1}))
                        .traceparent(TP)
                        .tracestate("rojo=00f067aa0ba902b7")
                        .dataschema("https://example.com/schemas/order/v2.json"),
                    Event::new("order.created", json!({"order": 2})),
                ],
            )
        })
        .unwrap()
        .iter()
        .map(|e| e.event_id().to_string())
        .collect();
    let relay = relay_batches(&device, server.local_addr(), 10);
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(30)
    ));
    let _ = relay.shutdown();
    let mut client = postgres.client();
    let mut row = |id: &str| -> (Option<String>, Option<String>, Option<String>) {
        let r = client
            .query_one(
                "SELECT traceparent, tracestate, dataschema FROM outbox_ingested WHERE id = $1",
                &[&id],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        row(&ids[0]),
        (
            Some(TP.to_string()),
            Some("rojo=00f067aa0ba902b7".to_string()),
            Some("https://example.com/schemas/order/v2.json".to_string())
        )
    );
    assert_eq!(row(&ids[1]), (None, None, None));
    server.shutdown();
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(body).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn gzip_batches_are_stored_and_bodies_that_decode_past_a_limit_are_refused_with_413() {
    let postgres = Postgres::start();
    let server = ingest(&postgres);
    let addr = server.local_addr();
    // A relay sending gzip batches: every committed event stored once.
    let device = Outbox::open(tempfile::tempdir().unwrap().keep().join("gzip.db")).unwrap();
    let relay = relay_compressed_batches(&device, addr, 100, Compression::Gzip);
    let committed = commit_events(&device, 300, 3);
    assert!(common::all_delivered_within(
        &device,
        Duration::from_secs(30)
    ));
    assert!(relay.shutdown().abandoned == 0);
    let stored: HashSet<String> = stored_ids(&postgres).into_iter().collect();
    assert_eq!(stored, committed.iter().cloned().collect::<HashSet<_>>());

    // Bombs: 10 MB of zeros is about 10 KB of gzip (within the 64 KiB --max-body on the
    // wire), refused when the decoder passes 64 KiB; 60 KB of zeros is about 100 bytes,
    // refused when it passes 100 times that, before the body limit.
    let zeros = vec![b'0'; 10_000_000];
    let bomb = gzip(&zeros);
    assert!(bomb.len() < 64 * 1024);
    let small_bomb = gzip(&zeros[..60_000]);
    // JSON that compresses 20 times: 200 KB decoded, past the 64 KiB limit.
    let mut big = String::from("[");
    while big.len() < 200_000 {
        big.push_str(r#"{"type":"reading","data":{"c":21.5,"battery":0.87}},"#);
    }
    let big = gzip(big.as_bytes());
    let small = event_body("gz-1", "1");
    let small_gz = gzip(&small);
    type Case<'a> = (Vec<u8>, &'a [u8], &'a str, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            bomb.clone(),
            &zeros[..1],
            "gzip",
            413,
            "more than the limit of 65536 bytes",
        ),
        (
            small_bomb.clone(),
            &zeros[..1],
            "gzip",
            413,
            "more than 100 times its size",
        ),
        (
            big.clone(),
            b"x",
            "gzip",
            413,
            "more than the limit of 65536 bytes",
        ),
        (small.clone(), &small, "br", 415, "\"br\" is not supported"),
        (b"not gzip".to_vec(), &small, "gzip", 400, "not valid gzip"),
        (small_gz.clone(), &small, "gzip", 204, ""),
    ];
    for (wire, signed, encoding, status, why) in cases {
        let mut headers = signed_headers(&secret(), "m-gz", signed, CLOUDEVENT);
        headers.push(("content-encoding", encoding.to_string()));
        let answer = request(addr, "POST", "/events", &headers, &wire).unwrap();
        assert_eq!(answer.status, status, "{why}: {answer:?}");
        assert!(answer.body.contains(why), "{why}: {answer:?}");
    }
    let stored = stored_ids(&postgres);
    assert!(stored.contains(&"gz-1".to_string()));
    assert_eq!(stored.len(), committed.len() + 1);
    server.shutdown();
}
