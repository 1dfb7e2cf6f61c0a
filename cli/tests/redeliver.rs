//! Replay: delivered events sent again to a destination (one added later) with their
//! original ids, filtered by type and delivery time, counted; repeats while pending add
//! nothing; bad input is refused.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, SystemTime};

use common::{fast, outbox_cli, rows, wait_until, TestReceiver};
use serde_json::json;
use sqlite_outbox::admin::State;
use sqlite_outbox::{Destination, Event, Outbox, Redelivery, RelayConfig};

#[test]
fn a_destination_added_later_gets_the_delivered_events_with_their_ids_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let outbox = Outbox::builder().route("*", "a").open(&db).unwrap();
    let mut orders = Vec::new();
    outbox
        .transaction(|tx| {
            for i in 0..5 {
                let e = outbox.enqueue(
                    tx,
                    Event::new("order.placed", json!({"i": i})).partition_key("customer-1"),
                )?;
                orders.push(e.event_id().to_string());
                let _ = outbox.enqueue(tx, Event::new("telemetry", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    let a = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("a", a.url())))
        .start()
        .unwrap();
    assert!(common::all_delivered_within(
        &outbox,
        Duration::from_secs(30)
    ));
    let _ = relay.shutdown();

    // Nothing delivered in the future, nothing before the dawn of time.
    let future = SystemTime::now() + Duration::from_secs(3600);
    let none = Redelivery::to("b").types("order.*").delivered_since(future);
    assert_eq!(outbox.redeliver(&none).unwrap(), 0);
    let early = Redelivery::to("b").delivered_until(SystemTime::UNIX_EPOCH);
    assert_eq!(outbox.redeliver(&early).unwrap(), 0);

    let replay = Redelivery::to("b")
        .types("order.*")
        .delivered_since(SystemTime::now() - Duration::from_secs(3600));
    assert_eq!(outbox.redeliver(&replay).unwrap(), 5);
    // Again while they are pending for b: nothing more.
    assert_eq!(outbox.redeliver(&replay).unwrap(), 0);

    let b = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("b", b.url())))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || b.event_count() >= 5));
    let _ = relay.shutdown();
    assert_eq!(
        b.event_ids(),
        orders,
        "the original ids, in the key's commit order"
    );
    // Same data and time as the first delivery.
    let again = &b.received()[0].body;
    let first = a
        .received()
        .into_iter()
        .find(|r| r.body["id"] == again["id"])
        .unwrap()
        .body;
    assert_eq!(first["time"], again["time"]);
    assert_eq!(first["data"], again["data"]);
    assert_eq!(first["sequence"].is_string(), again["sequence"].is_string());
    let status = outbox.status(&orders[0]).unwrap();
    assert_eq!(status.len(), 2);
    assert!(status.iter().all(|s| s.state == State::Delivered));

    // The CLI: a count, and times as RFC 3339 or "that long ago".
    let o = outbox_cli(
        &db,
        &[
            "redeliver",
            "--destination",
            "c",
            "--type",
            "telemetry",
            "--since",
            "1h",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "queued 5 delivered events again for destination c"
    );
    let o = outbox_cli(
        &db,
        &[
            "redeliver",
            "--destination",
            "d",
            "--until",
            "2000-01-01T00:00:00Z",
        ],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("queued 0"));
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.db");
    let outbox = Outbox::open(&db).unwrap();
    for r in [
        Redelivery::to(""),
        Redelivery::to("b").types("a*b"),
        Redelivery::to("b").types(""),
    ] {
        assert!(outbox.redeliver(&r).is_err(), "{r:?}");
    }
    for (args, why) in [
        (vec!["--since", "yesterday-ish"], "neither an RFC 3339 time"),
        (vec!["--type", "x*y"], "type pattern"),
    ] {
        let mut all = vec!["redeliver", "--destination", "b"];
        all.extend(args.iter().copied());
        let o = outbox_cli(&db, &all);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(why),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(rows(&outbox).is_empty());
}

/// Issue 38, item 6: a replay of a long history goes in pages, each a short transaction of
/// its own (progress after each), sends an event delivered to several destinations once,
/// and a repeat while the copies are pending adds nothing.
#[test]
fn a_long_history_is_replayed_in_pages_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("long.db");
    let outbox = Outbox::builder()
        .route("*", "a")
        .route("*", "b")
        .open(&db)
        .unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..1_300 {
                let _ = outbox.enqueue(tx, Event::new("reading", json!({ "i": i })))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // Delivered to both, as a relay would have marked them.
    outbox
        .connection()
        .unwrap()
        .execute(
            "UPDATE outbox_events SET delivered_at = created_at + 1, attempts = 1",
            [],
        )
        .unwrap();
    let mut pages = Vec::new();
    let queued = outbox
        .redeliver_with_progress(&Redelivery::to("c"), |n| pages.push(n))
        .unwrap();
    assert_eq!(queued, 1_300);
    // 2,600 rows in pages of 500 ids.
    assert_eq!(pages.len(), 6, "{pages:?}");
    assert!(pages.windows(2).all(|w| w[0] <= w[1]));
    let copies: Vec<(String, i64)> = common::query_rows(
        &outbox,
        "SELECT event_id, COUNT(*) FROM outbox_events WHERE destination = 'c' GROUP BY event_id",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    assert_eq!(copies.len(), 1_300);
    assert!(copies.iter().all(|(_, n)| *n == 1), "each event once");
    assert_eq!(outbox.redeliver(&Redelivery::to("c")).unwrap(), 0);
}
