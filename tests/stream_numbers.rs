//! Stream numbers (issue 58, item 1): every event takes, when its transaction commits, the
//! next number of a gapless sequence per destination and source, through `enqueue`,
//! `enqueue_many` and the SQL contract alike; a rolled-back transaction and a repeated
//! idempotency key take none. The number goes on the wire as `outboxstream`/`outboxseq`.

mod common;

use std::time::Duration;

use common::{Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Error, Event, Outbox};

/// `(destination, source, stream_seq)` of every row, in commit order, once numbered (the
/// relay numbers rows as it claims them; `stream_numbers` of the newest event numbers every
/// row up to it).
fn numbers(outbox: &Outbox) -> Vec<(String, String, i64)> {
    let newest: Vec<String> = common::query_rows(
        outbox,
        "SELECT event_id FROM outbox_events ORDER BY id DESC LIMIT 1",
        |r| r.get(0),
    );
    assert!(!outbox.stream_numbers(&newest[0]).unwrap().is_empty());
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
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.placed", json!({"n": 1}))))
        .unwrap();
    // A rolled-back transaction takes no number.
    let failed: Result<(), Error> = outbox.transaction(|tx| {
        let _ = outbox.enqueue(tx, Event::new("order.placed", json!({"n": "lost"})))?;
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
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(
                    tx,
                    Event::new("order.placed", json!({})).idempotency_key("once"),
                )
            })
            .unwrap();
    }
    let _ = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("log.line", json!({})).source("/device/17/sensor"),
            )
        })
        .unwrap();
    // The SQL contract from another process, and a coalesced event.
    common::insert_from_python(&db, "order.placed", "{\"from\": \"python\"}");
    let _ = outbox
        .transaction(|tx| {
            let _ = outbox.enqueue(tx, Event::new("log.line", json!({})).coalesce_key("k"))?;
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
    // Each stream's high water, as the relay tells it (the replaced 9 counts: it was given).
    let high = |destination: &str| -> Vec<(String, i64)> {
        outbox
            .stream_accounts(destination)
            .unwrap()
            .into_iter()
            .map(|(source, account)| (source, account.high_water))
            .collect()
    };
    assert_eq!(high("billing"), vec![("/device/17".to_string(), 5)]);
    assert_eq!(
        high("fleet"),
        vec![
            ("/device/17".to_string(), 10),
            ("/device/17/sensor".to_string(), 1)
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

#[test]
fn every_number_that_left_undelivered_is_accounted_by_its_fate_and_a_hand_deleted_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let outbox = Outbox::builder()
        .default_source("/device/17")
        .max_pending(12)
        .storage_policy("telemetry.*", sqlite_outbox::StoragePolicy::DropOldest)
        .open(&db)
        .unwrap();
    let enqueue = |event: Event| {
        let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
    };
    // 1-4 telemetry (droppable), 5-6 coalesced then replaced by 7, 8-12 plain.
    for i in 0..4 {
        enqueue(Event::new("telemetry.temp", json!({"i": i})));
    }
    for i in 0..3 {
        enqueue(Event::new("ui.state", json!({"i": i})).coalesce_key("window"));
    }
    for i in 0..5 {
        enqueue(Event::new("doc.saved", json!({"i": i})));
    }
    // 13, 14: the store is full (10 pending of 12... plus two): two telemetry events dropped.
    enqueue(Event::new("doc.saved", json!({"i": 13})));
    enqueue(Event::new("doc.saved", json!({"i": 14})));
    enqueue(Event::new("doc.saved", json!({"i": 15})));
    enqueue(Event::new("doc.saved", json!({"i": 16})));
    // The SQL contract coalesces too: 17 replaces 7.
    outbox
        .connection()
        .unwrap()
        .execute(
            "INSERT INTO outbox_enqueue (type, data, coalesce_key) VALUES ('ui.state', '{}', 'window')",
            [],
        )
        .unwrap();
    // 11 goes dead and is purged; then 8 and 9 go dead and 10 expires (as a relay marks
    // them).
    let mark = |sql: &str| outbox.connection().unwrap().execute_batch(sql).unwrap();
    mark("UPDATE outbox_events SET dead_at = 1, last_error = 'refused' WHERE stream_seq = 11");
    assert_eq!(outbox.purge_dead(None).unwrap().deleted, 1);
    mark(
        "UPDATE outbox_events SET dead_at = 1, last_error = 'refused' WHERE stream_seq IN (8, 9);
         UPDATE outbox_events SET dead_at = 1, expired_at = 1 WHERE stream_seq = 10;",
    );
    // The two oldest pending (3 and 4) exported to a bundle.
    let secret =
        sqlite_outbox::receive::Secret::from_bytes(*b"0123456789abcdef0123456789abcdef").unwrap();
    let report = outbox
        .export(&dir.path().join("out.bundle"), &secret, "default", 2)
        .unwrap();
    assert_eq!(report.count, 2);
    // 14 and 15 deleted by hand: accounted nowhere.
    outbox
        .connection()
        .unwrap()
        .execute("DELETE FROM outbox_events WHERE stream_seq IN (14, 15)", [])
        .unwrap();

    let accounts = outbox.stream_accounts("default").unwrap();
    assert_eq!(accounts.len(), 1);
    let (source, account) = &accounts[0];
    assert_eq!(source, "/device/17");
    assert_eq!(account.stream, "default");
    assert_eq!(account.high_water, 17);
    assert_eq!(account.accounted.dropped, vec![[1, 2]]);
    assert_eq!(account.accounted.coalesced, vec![[5, 7]]);
    assert_eq!(account.accounted.dead, vec![[8, 9]]);
    assert_eq!(account.accounted.expired, vec![[10, 10]]);
    assert_eq!(account.accounted.purged, vec![[11, 11]]);
    assert_eq!(account.accounted.exported, vec![[3, 4]]);
    assert_eq!(account.pending, vec![[12, 13], [16, 17]]);
}

#[test]
fn the_relay_tells_the_destination_each_streams_accounting_and_a_last_time_as_it_stops() {
    let receiver = TestReceiver::start(0, |r| {
        if r.body["data"]["bad"] == true {
            Reply::Status(422)
        } else {
            Reply::Status(204)
        }
    });
    let quiet = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .default_source("/device/17")
        .route("*", "fleet")
        .route("*", "quiet")
        .open(dir.path().join("app.db"))
        .unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..5 {
                let _ = outbox.enqueue(
                    tx,
                    Event::new("doc.saved", json!({"i": i, "bad": i % 2 == 1})),
                )?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    let config = common::fast(
        sqlite_outbox::RelayConfig::new()
            // A generic receiver: told only when the destination says it takes accountings.
            .destination(sqlite_outbox::Destination::http("fleet", receiver.url()).accounting(true))
            .destination(sqlite_outbox::Destination::http("quiet", quiet.url()).accounting(false)),
    )
    .max_attempts(1)
    .accounting_interval(Duration::from_secs(1));
    let handle = outbox.relay(config).start().unwrap();
    // Two events go dead (422): a change of fate, told within a quarter interval.
    assert!(common::wait_until(Duration::from_secs(20), || {
        receiver
            .accountings()
            .iter()
            .any(|a| a["data"]["accounted"]["dead"] == json!([[2, 2], [4, 4]]))
    }));
    // One more event, then the relay stops: its last word is the final state.
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("doc.saved", json!({"i": 5}))))
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(20), || {
        common::query_rows(
            &outbox,
            "SELECT COUNT(*) FROM outbox_events WHERE destination = 'fleet' AND delivered_at IS NULL AND dead_at IS NULL",
            |r| r.get::<_, i64>(0),
        ) == vec![0]
    }));
    let report = handle.shutdown();
    assert_eq!(report.detached_threads, 0);
    let told = receiver.accountings();
    let last = told.last().unwrap();
    assert_eq!(last["type"], sqlite_outbox::wire::ACCOUNTING_TYPE);
    assert_eq!(last["source"], "/device/17");
    // Each report tells the fates the destination had not taken yet: the dead ones went
    // in an earlier report, so the last word has none, and a higher report number.
    assert_eq!(
        last["data"],
        json!({"stream": "fleet", "high_water": 6, "pending": [], "seq": told.len(),
               "accounted": {"expired": [], "dropped": [], "coalesced": [], "dead": [],
                             "purged": [], "exported": []}})
    );
    let seqs: Vec<i64> = told
        .iter()
        .map(|a| a["data"]["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
    let mut dead = Vec::new();
    for a in &told {
        for range in a["data"]["accounted"]["dead"].as_array().unwrap() {
            dead.push(range.clone());
        }
    }
    assert_eq!(json!(dead), json!([[2, 2], [4, 4]]), "each fate told once");
    // It went as the library reads it, and the destination that turned it off got none.
    let accounts = outbox.stream_accounts("fleet").unwrap();
    assert_eq!(accounts[0].1.high_water, 6);
    assert_eq!(accounts[0].1.accounted.dead, vec![[2, 2], [4, 4]]);
    assert!(quiet.accountings().is_empty());
    assert_eq!(quiet.count(), 6);
}

/// Rows are numbered as the relay claims them (schema version 16), yet each number is the
/// one its commit fixed: a row deleted by hand before any relay saw it keeps its number
/// given (the fleet names it missing), and a claim numbers the rows of other streams below
/// the newest row it takes, not above.
#[test]
fn a_row_deleted_before_it_was_numbered_keeps_its_number_and_a_claim_numbers_in_commit_order() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let outbox = Outbox::builder()
        .default_source("/device/17")
        .route("*", "a")
        .route("*", "b")
        .open(&db)
        .unwrap();
    let mut ids = Vec::new();
    for i in 1..=6 {
        let enqueued = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("doc.saved", json!({"i": i}))))
            .unwrap();
        ids.push(enqueued.event_id().to_string());
    }
    // Nothing is numbered yet: no relay ran.
    let unnumbered = || {
        common::query_rows(
            &outbox,
            "SELECT COUNT(*) FROM outbox_events WHERE stream_seq IS NULL",
            |r| r.get::<_, i64>(0),
        )[0]
    };
    assert_eq!(unnumbered(), 12);
    // The third event's row for "a" and the fifth's for "b", deleted by hand.
    outbox
        .connection()
        .unwrap()
        .execute_batch(
            "DELETE FROM outbox_events WHERE destination = 'a' AND payload = '{\"i\":3}';
             DELETE FROM outbox_events WHERE destination = 'b' AND payload = '{\"i\":5}';",
        )
        .unwrap();
    // One more through the SQL contract.
    common::insert_from_python(&db, "doc.saved", "{\"i\": 7}");
    // A relay for "a" only (no accounting, which reads every stream's numbers).
    let config = common::fast(
        sqlite_outbox::RelayConfig::new()
            .destination(sqlite_outbox::Destination::http("a", receiver.url()).accounting(false)),
    );
    let handle = outbox.relay(config).start().unwrap();
    assert!(common::wait_until(Duration::from_secs(20), || receiver
        .count()
        == 6));
    let _ = handle.shutdown();
    let mut sent: Vec<i64> = receiver
        .received()
        .iter()
        .map(|r| r.body["outboxseq"].as_i64().unwrap_or(0))
        .collect();
    sent.sort_unstable();
    assert_eq!(sent, vec![1, 2, 4, 5, 6, 7]);
    // "b"'s rows below the newest "a" row are numbered (4 and 6: 5 was deleted); a row above
    // every row "a" claimed is not yet (the SQL contract wrote its two rows in the order of
    // its routes).
    let b: Vec<(Option<i64>, bool)> = common::query_rows(
        &outbox,
        "SELECT stream_seq, id > (SELECT MAX(id) FROM outbox_events WHERE destination = 'a')
           FROM outbox_events WHERE destination = 'b' ORDER BY id",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    let newest_above = b[5].1;
    assert_eq!(
        b,
        vec![
            (Some(1), false),
            (Some(2), false),
            (Some(3), false),
            (Some(4), false),
            (Some(6), false),
            (if newest_above { None } else { Some(7) }, newest_above)
        ]
    );
    // Read now, every stream's numbers are the ones their commits fixed.
    let accounts = outbox.stream_accounts("b").unwrap();
    assert_eq!(accounts[0].1.high_water, 7);
    assert_eq!(accounts[0].1.pending, vec![[1, 4], [6, 7]]);
    let accounts = outbox.stream_accounts("a").unwrap();
    assert_eq!(accounts[0].1.high_water, 7);
    assert_eq!(accounts[0].1.pending, Vec::<[i64; 2]>::new());
    // What an app reads of its event: its number in each stream.
    assert_eq!(
        outbox.stream_numbers(&ids[5]).unwrap(),
        vec![("a".to_string(), 6), ("b".to_string(), 6)]
    );
    assert_eq!(
        outbox.stream_numbers(&ids[4]).unwrap(),
        vec![("a".to_string(), 5)],
        "its row for b was deleted"
    );
    assert!(outbox.stream_numbers("no-such-event").unwrap().is_empty());
}

/// Issue 65, item 1: an app that deletes its own rows (all of them, the newest included)
/// gives no id twice, so every later row is numbered, and a row it deletes before a relay
/// saw it keeps its number given.
#[test]
fn the_apps_own_cleanup_gives_no_id_twice_and_every_later_row_is_numbered() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let outbox = common::outbox_with_events(&db, "doc.saved", 3);
    let relay = common::relay_over_http(
        &outbox,
        &receiver.url(),
        sqlite_outbox::transport::HttpConfig::new(),
        3,
    );
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    let _ = relay.shutdown();
    // The app's own cleanup of delivered rows, newest included.
    let app = rusqlite::Connection::open(&db).unwrap();
    assert_eq!(app.execute("DELETE FROM outbox_events", []).unwrap(), 3);
    for i in 0..3 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("doc.saved", json!({"late": i}))))
            .unwrap();
    }
    let ids: Vec<i64> =
        common::query_rows(&outbox, "SELECT id FROM outbox_events ORDER BY id", |r| {
            r.get(0)
        });
    assert!(ids.iter().all(|id| *id > 3), "ids given again: {ids:?}");
    // One of them lost by hand before any relay saw it.
    assert_eq!(
        app.execute(
            "DELETE FROM outbox_events WHERE json_extract(payload, '$.late') = 1",
            []
        )
        .unwrap(),
        1
    );
    let relay = common::relay_over_http(
        &outbox,
        &receiver.url(),
        sqlite_outbox::transport::HttpConfig::new(),
        3,
    );
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    let _ = relay.shutdown();
    let mut sent: Vec<Option<i64>> = receiver
        .received()
        .iter()
        .filter(|r| r.body["type"] == "doc.saved")
        .map(|r| r.body["outboxseq"].as_i64())
        .collect();
    sent.sort();
    assert_eq!(sent, vec![Some(1), Some(2), Some(3), Some(4), Some(6)]);
    let accounts = outbox.stream_accounts("default").unwrap();
    assert_eq!(accounts[0].1.high_water, 6);
}

/// Issue 65, item 2: a number deleted by hand before any destination took it is lost, and
/// synced-through stops below it for good (it counted it delivered).
#[test]
fn synced_through_never_passes_a_number_deleted_by_hand() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let outbox = common::outbox_with_events(&db, "doc.saved", 3);
    let app = rusqlite::Connection::open(&db).unwrap();
    // The second row goes before it is numbered; the fourth after the relay numbered it.
    assert_eq!(
        app.execute(
            "DELETE FROM outbox_events WHERE id = (SELECT id FROM outbox_events ORDER BY id LIMIT 1 OFFSET 1)",
            []
        )
        .unwrap(),
        1
    );
    let config =
        common::fast(sqlite_outbox::RelayConfig::new().destination(
            sqlite_outbox::Destination::http("default", receiver.url()).accounting(true),
        ))
        .accounting_interval(Duration::from_secs(1));
    let relay = outbox.relay(config).start().unwrap();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(20)
    ));
    // The accountant has looked (it told the destination), yet synced-through stays at 1.
    assert!(common::wait_until(Duration::from_secs(20), || {
        outbox
            .synced_through("default")
            .unwrap()
            .is_some_and(|s| s.through >= 1)
            && !receiver.accountings().is_empty()
    }));
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(
        outbox.synced_through("default").unwrap().unwrap().through,
        1
    );
    // A numbered row deleted by hand while pending is lost too; a coalesced one is not.
    let _ = relay.shutdown();
    for i in 0..2 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("doc.saved", json!({"more": i}))))
            .unwrap();
    }
    let newest: Vec<String> = common::query_rows(
        &outbox,
        "SELECT event_id FROM outbox_events ORDER BY id DESC LIMIT 1",
        |r| r.get(0),
    );
    assert_eq!(
        outbox.stream_numbers(&newest[0]).unwrap(),
        vec![("default".to_string(), 5)]
    );
    app.execute(
        "DELETE FROM outbox_events WHERE json_extract(payload, '$.more') = 0",
        [],
    )
    .unwrap();
    for i in 0..2 {
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(
                    tx,
                    Event::new("ui.state", json!({"w": i})).coalesce_key("w"),
                )
            })
            .unwrap();
    }
    let lost: Vec<i64> = common::query_rows(
        &outbox,
        "SELECT stream_seq FROM outbox_lost_numbers ORDER BY stream_seq",
        |r| r.get(0),
    );
    assert_eq!(lost, vec![2, 4], "the coalesced 6 has its fate, not lost");
}
