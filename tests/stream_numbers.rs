//! Stream numbers (issue 58, item 1): every event takes, when its transaction commits, the
//! next number of a gapless sequence per destination and source, through `enqueue`,
//! `enqueue_many` and the SQL contract alike; a rolled-back transaction and a repeated
//! idempotency key take none. The number goes on the wire as `outboxstream`/`outboxseq`.

mod common;

use std::time::Duration;

use common::{Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Error, Event, Outbox};

/// `(destination, source, stream_seq)` of every row, in commit order.
fn numbers(outbox: &Outbox) -> Vec<(String, String, i64)> {
    common::query_rows(
        outbox,
        "SELECT destination, source, stream_seq FROM outbox_events ORDER BY id",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

fn seqs(outbox: &Outbox, destination: &str, source: &str) -> Vec<i64> {
    numbers(outbox)
        .into_iter()
        .filter(|(d, s, _)| d == destination && s == source)
        .map(|(_, _, n)| n)
        .collect()
}

#[test]
fn every_writer_takes_the_next_number_of_its_stream_and_a_rollback_takes_none() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let outbox = Outbox::builder()
        .default_source("/device/17")
        .route("order.*", "fleet")
        .route("order.*", "billing")
        .route("log.*", "fleet")
        .open(&db)
        .unwrap();
    // One event, routed to two destinations: a number in each stream.
    outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.placed", json!({"n": 1}))))
        .unwrap();
    // A rolled-back transaction takes no number.
    let failed: Result<(), Error> = outbox.transaction(|tx| {
        outbox.enqueue(tx, Event::new("order.placed", json!({"n": "lost"})))?;
        Err(Error::InvalidConfig("the app's own write failed".into()))
    });
    assert!(failed.is_err());
    // A batch: numbers in the batch's order, per stream.
    outbox
        .transaction(|tx| {
            outbox.enqueue_many(
                tx,
                (0..5).map(|i| {
                    let t = if i % 2 == 0 {
                        "log.line"
                    } else {
                        "order.placed"
                    };
                    Event::new(t, json!({"i": i}))
                }),
            )
        })
        .unwrap();
    // A repeated idempotency key takes none; another source is another stream.
    for _ in 0..2 {
        outbox
            .transaction(|tx| {
                outbox.enqueue(
                    tx,
                    Event::new("order.placed", json!({})).idempotency_key("once"),
                )
            })
            .unwrap();
    }
    outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("log.line", json!({})).source("/device/17/sensor"),
            )
        })
        .unwrap();
    // The SQL contract from another process, and a coalesced event.
    common::insert_from_python(&db, "order.placed", "{\"from\": \"python\"}");
    outbox
        .transaction(|tx| {
            outbox.enqueue(tx, Event::new("log.line", json!({})).coalesce_key("k"))?;
            outbox.enqueue(tx, Event::new("log.line", json!({})).coalesce_key("k"))
        })
        .unwrap();

    // fleet: order(1), log 0, order 1, log 2, order 3, log 4, order "once", python, log k, log k'.
    assert_eq!(
        seqs(&outbox, "fleet", "/device/17"),
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
            .into_iter()
            .filter(|n| *n != 9) // the first coalesced event was replaced (its fate is kept)
            .collect::<Vec<_>>()
    );
    // billing: order(1), order 1, order 3, order "once", python.
    assert_eq!(seqs(&outbox, "billing", "/device/17"), vec![1, 2, 3, 4, 5]);
    assert_eq!(seqs(&outbox, "fleet", "/device/17/sensor"), vec![1]);
    let high: Vec<(String, String, i64)> = common::query_rows(
        &outbox,
        "SELECT destination, source, high_water FROM outbox_streams ORDER BY 1, 2",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    );
    assert_eq!(
        high,
        vec![
            ("billing".into(), "/device/17".into(), 5),
            ("fleet".into(), "/device/17".into(), 10),
            ("fleet".into(), "/device/17/sensor".into(), 1),
        ]
    );
}

#[test]
fn the_number_and_the_stream_go_on_the_wire() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("app.db"), "doc.saved", 3);
    let handle = common::relay_over_http(
        &outbox,
        &receiver.url(),
        sqlite_outbox::transport::HttpConfig::new(),
        3,
    );
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    let _ = handle.shutdown();
    let mut got: Vec<(String, i64)> = receiver
        .received()
        .iter()
        .map(|r| {
            (
                r.body["outboxstream"].as_str().unwrap_or("").to_string(),
                r.body["outboxseq"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("default".to_string(), 1),
            ("default".to_string(), 2),
            ("default".to_string(), 3)
        ]
    );
}
