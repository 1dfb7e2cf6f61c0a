//! The receiver example as a real process: verifies, de-duplicates through the inbox, and
//! applies a re-delivered event once.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{delivered_count, fast, wait_until, PATIENCE};
use serde_json::json;
use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Receiver {
    child: Child,
    url: String,
}

impl Receiver {
    fn start(db: &std::path::Path) -> Receiver {
        Self::start_logging(db, "warn", Stdio::inherit())
    }

    /// Started with `RUST_LOG=level`, its log (stderr) going to `log`.
    fn start_logging(db: &std::path::Path, level: &str, log: Stdio) -> Receiver {
        let mut child = Command::new(common::example_binary("receiver"))
            .args(["--db", db.to_str().unwrap(), "--secret", SECRET])
            .args(["--port", "0", "--max-seconds", "120"])
            .env("RUST_LOG", level)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn receiver");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(PATIENCE)
            .expect("receiver announces its address");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("listening line")
            .to_string();
        Receiver { child, url }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that reads every status as an answer, never waiting past 10 s.
fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn count(db: &std::path::Path, sql: &str) -> i64 {
    Connection::open(db)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

#[test]
fn the_receiver_example_applies_a_redelivered_event_once_and_refuses_bad_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let received_db = dir.path().join("received.db");
    let receiver = Receiver::start(&received_db);

    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    for i in 0..20 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", json!({"n": i}))))
            .unwrap();
    }
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(
            Destination::http("default", receiver.url.clone()).secret(SECRET),
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 20));

    // Deliver three of them again, as a relay that lost its acks would.
    outbox
        .connection()
        .unwrap()
        .execute(
            "UPDATE outbox_events SET delivered_at = NULL WHERE id <= 3",
            [],
        )
        .unwrap();
    outbox.notify();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 20
        && common::rows(&outbox)
            .iter()
            .take(3)
            .all(|r| r.attempts == 2)));
    let _ = relay.shutdown();

    assert_eq!(
        count(&received_db, "SELECT COUNT(*) FROM received_events"),
        20
    );
    assert_eq!(
        count(
            &received_db,
            "SELECT COUNT(DISTINCT event_id) FROM received_events"
        ),
        20
    );
    assert_eq!(count(&received_db, "SELECT COUNT(*) FROM outbox_inbox"), 20);

    // A forged request is refused with 401 and changes nothing.
    let agent = client();
    let response = agent
        .post(&receiver.url)
        .header("content-type", "application/cloudevents+json")
        .header("webhook-id", "forged")
        .header("webhook-timestamp", "1700000000")
        .header("webhook-signature", "v1,Zm9yZ2Vk")
        .send(r#"{"specversion":"1.0","id":"x","source":"/evil","type":"t"}"#)
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(
        count(&received_db, "SELECT COUNT(*) FROM received_events"),
        20
    );

    // A head with too many headers, and a body over the limit, are refused unread.
    let mut crowded = agent.post(&receiver.url);
    for n in 0..200 {
        crowded = crowded.header(format!("x-filler-{n}"), "1");
    }
    let response = crowded.send("{}").unwrap();
    assert_eq!(response.status().as_u16(), 431);
    // The server answers 413 and closes before the client has written the whole body, so
    // the client sees the answer or, if it was still writing, the connection reset.
    match agent
        .post(&receiver.url)
        .send(vec![b' '; 5 << 20].as_slice())
    {
        Ok(response) => assert_eq!(response.status().as_u16(), 413),
        Err(ureq::Error::Io(e)) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{e}"
        ),
        Err(e) => panic!("{e}"),
    }
    assert_eq!(
        count(&received_db, "SELECT COUNT(*) FROM received_events"),
        20
    );
}

#[test]
fn the_receiver_example_logs_each_event_in_the_trace_it_was_written_in() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("receiver.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let receiver = Receiver::start_logging(&dir.path().join("received.db"), "info", log.into());
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let traced = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("order.created", json!({"n": 1})).traceparent(TP),
            )
        })
        .unwrap()
        .event_id()
        .to_string();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.untraced", json!({"n": 2}))))
        .unwrap();
    let relay = outbox
        .relay(fast(RelayConfig::new().destination(
            Destination::http("default", receiver.url.clone()).secret(SECRET),
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 2));
    let _ = relay.shutdown();
    let mut lines = Vec::new();
    assert!(wait_until(PATIENCE, || {
        lines = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("trace_id="))
            .map(str::to_owned)
            .collect();
        !lines.is_empty()
    }));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(line.contains(&traced), "{line}");
    assert!(
        line.contains(
            "trace_id=4bf92f3577b34da6a3ce929d0e0e4736 parent_id=00f067aa0ba902b7 span_id="
        ),
        "{line}"
    );
}

#[test]
fn the_receiver_example_takes_gzip_batches_and_refuses_a_zip_bomb_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let received_db = dir.path().join("received.db");
    let receiver = Receiver::start(&received_db);
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..120 {
                let _ = outbox.enqueue(tx, Event::new("reading.taken", json!({"n": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let relay = outbox
        .relay(fast(
            RelayConfig::new().destination(
                Destination::http("default", receiver.url.clone())
                    .secret(SECRET)
                    .batch(50, 1 << 20)
                    .compress(sqlite_outbox::Compression::Gzip),
            ),
        ))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 120));
    let _ = relay.shutdown();
    assert_eq!(
        count(
            &received_db,
            "SELECT COUNT(DISTINCT event_id) FROM received_events"
        ),
        120
    );

    // 8 MiB of zeros is about 8 KB of gzip, well within the receiver's 4 MiB on the wire:
    // the decoder stops at 100 times that, 413, without decoding the rest.
    let mut encoder = flate2_gzip();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..8 {
        std::io::Write::write_all(&mut encoder, &zeros).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    let agent = client();
    let response = agent
        .post(&receiver.url)
        .header("content-type", "application/cloudevents+json")
        .header("content-encoding", "gzip")
        .send(&bomb[..])
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let response = agent
        .post(&receiver.url)
        .header("content-encoding", "br")
        .send("{}")
        .unwrap();
    assert_eq!(response.status().as_u16(), 415);
}

fn flate2_gzip() -> flate2::write::GzEncoder<Vec<u8>> {
    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast())
}
