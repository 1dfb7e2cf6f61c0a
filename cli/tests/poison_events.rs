//! A receiver that chokes on one particular event: the event spends its attempts and is
//! dead-lettered, while every other event of its destination keeps flowing.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const OTHERS: usize = 19;
const MAX_ATTEMPTS: u32 = 3;

/// Enqueues the poison event first (the oldest, so the first any probe would pick), then
/// the others; runs a relay against a receiver that answers `poison` for the first event and
/// 200 for the rest; returns the rows once everything has settled.
fn run_with_poison(poison: Reply) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("poison.db")).unwrap();
    let ids: Vec<String> = (0..=OTHERS)
        .map(|n| {
            outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!(n))))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect();
    let poison_id = ids[0].clone();
    let receiver = TestReceiver::start(0, move |r| {
        if r.event_id == poison_id {
            poison.clone()
        } else {
            Reply::Status(200)
        }
    });
    let http = HttpConfig::new()
        .connect_timeout(Duration::from_secs(1))
        .request_timeout(Duration::from_millis(300));
    let relay = outbox
        .relay(
            // `fast` first: its HTTP settings apply to destinations added before it.
            fast(RelayConfig::new())
                .destination(
                    Destination::http(Destination::DEFAULT, receiver.url()).http_config(http),
                )
                .lease(Duration::from_secs(2))
                .max_attempts(MAX_ATTEMPTS),
        )
        .start()
        .unwrap();
    let settled = wait_until(PATIENCE, || {
        let rows = rows(&outbox);
        rows.iter().all(|r| r.delivered || r.dead)
    });
    let _ = relay.shutdown();
    assert!(settled, "not settled: {:?}", rows(&outbox));
    rows(&outbox)
}

fn assert_only_the_poison_is_dead(rows: &[Row], error_part: &str) {
    let (poison, others) = rows.split_first().unwrap();
    assert!(poison.dead, "{poison:?}");
    assert_eq!(poison.attempts, i64::from(MAX_ATTEMPTS), "{poison:?}");
    let error = poison.last_error.as_deref().unwrap_or_default();
    assert!(error.contains(error_part), "{error}");
    assert!(error.contains("gave up after 3 attempts"), "{error}");
    assert_eq!(others.len(), OTHERS);
    assert!(others.iter().all(|r| r.delivered), "{others:?}");
}

#[test]
fn a_receiver_hanging_on_one_event_dead_letters_only_that_event() {
    let rows = run_with_poison(Reply::Hang(Duration::from_secs(3)));
    assert_only_the_poison_is_dead(&rows, "no valid answer");
}

#[test]
fn a_receiver_resetting_on_one_event_dead_letters_only_that_event() {
    let rows = run_with_poison(Reply::Reset);
    assert_only_the_poison_is_dead(&rows, "no valid answer");
}

/// Issue 38, item 8: a batch the receiver refuses (422) because one event in it is bad is
/// split and sent again in halves, spending nothing on the splits, so only that event is
/// dead-lettered, with the receiver's reason, and the other 49 are delivered.
#[test]
fn a_refused_batch_is_bisected_so_only_the_bad_event_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("batch.db");
    let outbox = Outbox::open(&db).unwrap();
    let mut bad_id = String::new();
    outbox
        .transaction(|tx| {
            for n in 0..50 {
                let data = serde_json::json!({ "n": n, "bad": n == 17 });
                let id = outbox
                    .enqueue(tx, Event::new("t", data))?
                    .event_id()
                    .to_string();
                if n == 17 {
                    bad_id = id;
                }
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let receiver = TestReceiver::start(0, |r| {
        if String::from_utf8_lossy(&r.raw).contains("\"bad\":true") {
            Reply::StatusBody(422, "cannot store field bad")
        } else {
            Reply::Status(200)
        }
    });
    let o = outbox_cli(
        &db,
        &[
            "relay",
            "--url",
            &receiver.url(),
            "--batch",
            "10",
            "--until-empty",
            "--timeout",
            "60s",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = rows(&outbox);
    let dead: Vec<&Row> = rows.iter().filter(|r| r.dead).collect();
    assert_eq!(rows.iter().filter(|r| r.delivered).count(), 49, "{rows:?}");
    assert_eq!(dead.len(), 1, "{rows:?}");
    assert_eq!(dead[0].event_id, bad_id);
    let error = dead[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("422") && error.contains("cannot store"),
        "{error}"
    );
    // No attempt spent on a split: each delivered event once, the bad one once alone.
    assert!(rows.iter().all(|r| r.attempts == 1), "{rows:?}");
}
