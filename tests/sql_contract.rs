//! The SQL contract: `INSERT INTO outbox_enqueue (…) VALUES (…)` from a plain SQLite
//! connection, in the caller's own transaction, gives an event what `Outbox::enqueue` gives
//! it, following the settings kept in the file.

mod common;

use std::time::Duration;

use common::{fast, v7_millis, wait_until, TestReceiver};
use serde_json::json;
use sqlite_outbox::rusqlite::{params, Connection, ErrorCode};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// A plain connection of the app's own, as another language would open the file.
fn app_connection(outbox: &Outbox) -> Connection {
    let conn = Connection::open(outbox.path()).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")
        .unwrap();
    conn
}

/// `(row id, event id, destination, type, payload, partition key, available_at, source,
/// priority, created_at, expires_at)` of every row, in commit order.
type Stored = (
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    String,
    i64,
    i64,
    Option<i64>,
);

fn stored(outbox: &Outbox) -> Vec<Stored> {
    let conn = outbox.connection().unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT id, event_id, destination, event_type, payload, partition_key, available_at,
                    source, priority, created_at, expires_at
               FROM outbox_events ORDER BY id",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
            r.get(10)?,
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// A temperature `value` of `sensor`, coalesced by sensor, inserted through the contract.
fn reading(conn: &Connection, sensor: &str, value: i64) -> sqlite_outbox::rusqlite::Result<usize> {
    conn.execute(
        "INSERT INTO outbox_enqueue (type, data, coalesce_key) VALUES ('telemetry.temp', ?1, ?2)",
        params![value.to_string(), sensor],
    )
}

fn enqueue_sql(conn: &Connection, event_type: &str, data: &str, key: Option<&str>) {
    conn.execute(
        "INSERT INTO outbox_enqueue (type, data, key) VALUES (?1, ?2, ?3)",
        params![event_type, data, key],
    )
    .unwrap();
}

#[test]
fn events_inserted_in_sql_commit_with_the_business_write_and_are_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let mut conn = app_connection(&outbox);
    // Committed: an order and its two events; rolled back: another order and its event.
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (1, 30)", [])
        .unwrap();
    enqueue_sql(
        &tx,
        "order.created",
        r#"{"id": 1, "total": 30}"#,
        Some("order-1"),
    );
    enqueue_sql(&tx, "order.paid", r#"{"id": 1}"#, Some("order-1"));
    tx.commit().unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (2, 99)", [])
        .unwrap();
    enqueue_sql(&tx, "order.created", r#"{"id": 2}"#, Some("order-2"));
    tx.rollback().unwrap();
    // Left out columns: no data is JSON null, no key is unkeyed.
    conn.execute("INSERT INTO outbox_enqueue (type) VALUES ('ping')", [])
        .unwrap();

    let rows = stored(&outbox);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0].4, r#"{"id":1,"total":30}"#, "stored as its JSON");
    assert_eq!(rows[2].4, "null");
    assert_eq!(rows[0].7, "/sqlite-outbox", "the default source");
    assert_eq!(rows[0].8, 5, "the default priority");
    assert_eq!(rows[1].6, i64::MAX, "parked behind its key's head");
    assert!(rows.windows(2).all(|w| w[0].0 < w[1].0), "ids increase");
    let times: Vec<u64> = rows.iter().map(|r| v7_millis(&r.1)).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    for row in &rows {
        assert_eq!(
            v7_millis(&row.1) as i64,
            row.9,
            "the id's time is the event's time"
        );
    }

    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || receiver
        .event_count()
        >= 3));
    let _ = relay.shutdown();
    let received = receiver.received();
    let bodies: Vec<&serde_json::Value> = received.iter().map(|r| &r.body).collect();
    let created = bodies
        .iter()
        .find(|b| b["type"] == "order.created")
        .unwrap();
    assert_eq!(
        created["data"],
        json!({"id": 1, "total": 30}),
        "data as a JSON value"
    );
    assert_eq!(created["partitionkey"], "order-1");
    assert_eq!(created["id"], rows[0].1.as_str());
    let ping = bodies.iter().find(|b| b["type"] == "ping").unwrap();
    assert_eq!(ping["data"], serde_json::Value::Null);
    let keyed: Vec<&str> = received
        .iter()
        .filter(|r| r.body["partitionkey"] == "order-1")
        .map(|r| r.body["type"].as_str().unwrap())
        .collect();
    assert_eq!(keyed, ["order.created", "order.paid"], "per-key order");
    assert!(
        !received.iter().any(|r| r.body["data"]["id"] == 2),
        "rolled back"
    );
}

#[test]
fn bad_input_fails_the_statement_with_the_field_and_the_limit_and_the_transaction_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bad.db")).unwrap();
    let mut conn = app_connection(&outbox);
    let long = "k".repeat(256);
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (7, 1)", [])
        .unwrap();
    let cases: Vec<(&str, Vec<sqlite_outbox::rusqlite::types::Value>, &str)> = {
        use sqlite_outbox::rusqlite::types::Value::{Integer, Null, Text};
        vec![
            (
                "type",
                vec![Null, Null, Null, Null, Null],
                "type must be text of 1 to 255 bytes",
            ),
            (
                "empty type",
                vec![Text("".into()), Null, Null, Null, Null],
                "1 to 255 bytes",
            ),
            (
                "data",
                vec![Text("t".into()), Text("{not json".into()), Null, Null, Null],
                "data must be JSON text",
            ),
            (
                "key",
                vec![Text("t".into()), Null, Text(long.clone()), Null, Null],
                "key must be text of at most 255 bytes",
            ),
            (
                "number key",
                vec![Text("t".into()), Null, Integer(5), Null, Null],
                "key must be text",
            ),
            (
                "priority",
                vec![Text("t".into()), Null, Null, Integer(10), Null],
                "0 (least urgent) to 9",
            ),
            (
                "expiry",
                vec![Text("t".into()), Null, Null, Null, Integer(0)],
                "at least 1",
            ),
            (
                "payload",
                vec![
                    Text("t".into()),
                    Text(format!("\"{}\"", "x".repeat(300_000))),
                    Null,
                    Null,
                    Null,
                ],
                "payload limit",
            ),
        ]
    };
    for (what, values, message) in cases {
        let err = tx
            .execute(
                "INSERT INTO outbox_enqueue (type, data, key, priority, expires_in_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                sqlite_outbox::rusqlite::params_from_iter(values),
            )
            .unwrap_err();
        let sqlite_outbox::rusqlite::Error::SqliteFailure(code, Some(text)) = &err else {
            panic!("{what}: {err:?}");
        };
        assert_eq!(code.code, ErrorCode::ConstraintViolation, "{what}");
        assert!(text.starts_with("outbox: "), "{what}: {text}");
        assert!(text.contains(message), "{what}: {text}");
    }
    enqueue_sql(&tx, "order.created", "{}", None);
    tx.commit().unwrap();
    let orders: i64 = conn
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orders, 1, "the caller's other write committed");
    assert_eq!(stored(&outbox).len(), 1, "only the good event");
}

#[test]
fn settings_in_the_file_route_prioritize_expire_coalesce_and_bound_sql_inserts() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("settings.db")).unwrap();
    outbox
        .set_setting("route:order.*", "billing,audit")
        .unwrap();
    outbox.set_setting("route:telemetry.*", "metrics").unwrap();
    outbox.set_setting("priority:telemetry.*", "1").unwrap();
    outbox.set_setting("priority:telemetry.alarm", "9").unwrap();
    outbox.set_setting("expiry:telemetry.*", "1h").unwrap();
    outbox.set_setting("default_source", "/plant/7").unwrap();
    let conn = app_connection(&outbox);

    // Routing: one event id, one row per destination, increasing ids.
    enqueue_sql(&conn, "order.created", r#"{"id":1}"#, None);
    let rows = stored(&outbox);
    assert_eq!(
        rows.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        ["billing", "audit"]
    );
    assert_eq!(rows[0].1, rows[1].1, "one event id for both");
    assert_eq!(rows[0].7, "/plant/7");
    let err = conn
        .execute(
            "INSERT INTO outbox_enqueue (type) VALUES ('door.opened')",
            [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("outbox: no route"), "{err}");

    // Priorities and lifetimes: the most specific pattern wins.
    enqueue_sql(&conn, "telemetry.temp", "1", None);
    enqueue_sql(&conn, "telemetry.alarm", "2", None);
    let rows = stored(&outbox);
    let temp = &rows[2];
    let alarm = &rows[3];
    assert_eq!((temp.8, alarm.8), (1, 9));
    assert_eq!(
        temp.10,
        Some(temp.9 + 3_600_000),
        "expires an hour after its commit"
    );

    // Idempotency: a repeat is no error and adds nothing; the id is read back by the key.
    for _ in 0..2 {
        conn.execute(
            "INSERT INTO outbox_enqueue (type, idempotency_key) VALUES ('order.paid', 'pay-1')",
            [],
        )
        .unwrap();
    }
    let id: String = conn
        .query_row(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = ?1 ORDER BY id LIMIT 1",
            ["pay-1"],
            |r| r.get(0),
        )
        .unwrap();
    let copies = stored(&outbox).iter().filter(|r| r.1 == id).count();
    assert_eq!(copies, 2, "one per destination, once");

    // Coalescing: a newer reading replaces the pending one of the same key.
    for v in 1..=3 {
        conn.execute(
            "INSERT INTO outbox_enqueue (type, data, coalesce_key) VALUES ('telemetry.temp', ?1, 'sensor-1')",
            [v.to_string()],
        )
        .unwrap();
    }
    let temps: Vec<String> = stored(&outbox)
        .into_iter()
        .filter(|r| r.3 == "telemetry.temp")
        .map(|r| r.4)
        .collect();
    assert_eq!(
        temps,
        ["1", "3"],
        "the uncoalesced one stays, the key keeps its newest"
    );
    assert_eq!(outbox.stats().unwrap().coalesced, 2);

    // Storage limits: telemetry makes room, orders are refused when nothing can.
    let pending = stored(&outbox).len();
    outbox
        .set_setting("max_pending", &pending.to_string())
        .unwrap();
    outbox
        .set_setting("policy:telemetry.*", "drop_oldest")
        .unwrap();
    enqueue_sql(&conn, "telemetry.temp", "4", None);
    assert_eq!(outbox.stats().unwrap().dropped, 1);
    assert_eq!(
        stored(&outbox).len(),
        pending,
        "the oldest telemetry made room"
    );
    outbox.set_setting("policy:telemetry.*", "reject").unwrap();
    let before = stored(&outbox);
    let err = conn
        .execute(
            "INSERT INTO outbox_enqueue (type) VALUES ('order.cancelled')",
            [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("outbox: full"), "{err}");
    assert_eq!(stored(&outbox), before, "nothing dropped, nothing added");
}

#[test]
fn ids_and_times_never_go_back_whatever_was_deleted_or_written_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.db");
    let outbox = Outbox::open(&path).unwrap();
    let conn = app_connection(&outbox);
    for i in 0..3 {
        enqueue_sql(&conn, "t", &i.to_string(), None);
    }
    let top = stored(&outbox).last().unwrap().0;
    // The newest rows go (purged as dead letters): their ids must not be given again.
    conn.execute("UPDATE outbox_events SET dead_at = 1", [])
        .unwrap();
    outbox.purge_dead(None).unwrap();
    // A writer whose clock was an hour ahead.
    let ahead = Outbox::builder()
        .clock(sqlite_outbox::clock::ManualClock::new(
            outbox.now_ms() + 3_600_000,
        ))
        .open(&path)
        .unwrap();
    let _ = ahead
        .transaction(|tx| ahead.enqueue(tx, Event::new("t", json!("ahead"))))
        .unwrap();
    enqueue_sql(&conn, "t", "\"after\"", None);
    let rows = stored(&outbox);
    assert!(rows[0].0 > top, "ids continue above the deleted ones");
    assert!(rows[1].0 > rows[0].0);
    assert!(
        v7_millis(&rows[1].1) as i64 >= rows[0].9,
        "the time of an id never goes back in commit order"
    );
}

#[test]
fn many_writers_get_unique_ids_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("many.db")).unwrap();
    let path = outbox.path().to_path_buf();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let path = path.clone();
            std::thread::Builder::new()
                .name(format!("sql-writer-{w}"))
                .spawn(move || {
                    let mut conn = Connection::open(&path).unwrap();
                    conn.busy_timeout(Duration::from_secs(10)).unwrap();
                    for i in 0..250 {
                        let tx = conn
                            .transaction_with_behavior(
                                sqlite_outbox::rusqlite::TransactionBehavior::Immediate,
                            )
                            .unwrap();
                        enqueue_sql(&tx, "t", &format!("{{\"w\":{w},\"i\":{i}}}"), Some("k"));
                        tx.commit().unwrap();
                    }
                })
                .unwrap()
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let rows = stored(&outbox);
    assert_eq!(rows.len(), 1000);
    let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(ids.len(), 1000, "unique event ids");
    let times: Vec<u64> = rows.iter().map(|r| v7_millis(&r.1)).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "times in commit order"
    );
    let due = rows.iter().filter(|r| r.6 != i64::MAX).count();
    assert_eq!(due, 1, "one head for the key, the rest parked");
}

#[test]
fn a_byte_limit_drops_the_oldest_droppable_events_until_the_new_one_fits() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bytes.db")).unwrap();
    let conn = app_connection(&outbox);
    // Ten telemetry readings of 100 bytes of data each, keyed, then a 350-byte limit.
    let reading = |n: usize| format!("\"{}{}\"", n, "x".repeat(97));
    for n in 0..10 {
        enqueue_sql(&conn, "telemetry.temp", &reading(n), Some("sensor-1"));
    }
    outbox
        .set_setting("policy:telemetry.*", "drop_oldest")
        .unwrap();
    outbox.set_setting("max_pending_bytes", "350").unwrap();
    // Room for 101 more bytes needs the oldest eight gone (1,000 + 101 - 350 = 751 bytes).
    enqueue_sql(&conn, "telemetry.temp", &reading(10), Some("sensor-1"));
    let rows = stored(&outbox);
    let kept: Vec<String> = rows.iter().map(|r| r.4[1..2].to_string()).collect();
    assert_eq!(
        kept,
        ["8", "9", "1"],
        "the two newest and the new one: {kept:?}"
    );
    assert_eq!(outbox.stats().unwrap().dropped, 8);
    assert_eq!(outbox.stats().unwrap().pending_bytes, 100 + 100 + 101);
    // The key's new head is due, the rest parked behind it.
    assert_ne!(rows[0].6, i64::MAX, "the oldest left is unparked");
    assert!(rows[1..].iter().all(|r| r.6 == i64::MAX));
    // An event larger than the whole budget never fits, and nothing is dropped for it.
    let err = conn
        .execute(
            "INSERT INTO outbox_enqueue (type, data) VALUES ('telemetry.temp', ?1)",
            [format!("\"{}\"", "y".repeat(400))],
        )
        .unwrap_err();
    assert!(err.to_string().contains("max_pending_bytes"), "{err}");
    assert_eq!(stored(&outbox), rows);
}

#[test]
fn a_coalesced_event_makes_its_own_room_before_anything_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("both.db")).unwrap();
    outbox.set_setting("max_pending", "3").unwrap();
    outbox
        .set_setting("policy:telemetry.*", "drop_oldest")
        .unwrap();
    let conn = app_connection(&outbox);
    let reading = |sensor: &str, value: i64| {
        reading(&conn, sensor, value).unwrap();
    };
    reading("a", 1);
    reading("b", 2);
    reading("c", 3);
    // Full, but the new reading of "a" replaces the pending one: nothing is dropped.
    reading("a", 4);
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.coalesced, stats.dropped, stats.pending), (1, 0, 3));
    // A new sensor needs room: the oldest reading ("b") goes.
    reading("d", 5);
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.coalesced, stats.dropped, stats.pending), (1, 1, 3));
    let data: Vec<String> = stored(&outbox).into_iter().map(|r| r.4).collect();
    assert_eq!(data, ["3", "4", "5"]);
}

/// Issue 55, finding 2: a row whose lease looks expired by this connection's clock may still
/// be in flight (the wall clock steps; a relay judges its own leases by its monotonic
/// clock), so neither coalescing nor a storage limit makes way among leased rows, through
/// the SQL contract as through `Outbox::enqueue`.
#[test]
fn sql_inserts_never_replace_or_drop_a_leased_row_whose_lease_looks_expired() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("leased.db")).unwrap();
    outbox.set_setting("max_pending", "2").unwrap();
    outbox
        .set_setting("policy:telemetry.*", "drop_oldest")
        .unwrap();
    let conn = app_connection(&outbox);
    let reading = |sensor: &str, value: i64| reading(&conn, sensor, value);
    reading("a", 1).unwrap();
    reading("b", 2).unwrap();
    // Both in flight under leases that ended long ago by the wall clock.
    conn.execute(
        "UPDATE outbox_events SET lease_owner = 'relay:1', lease_expires_at = 1, leased_at = 0",
        [],
    )
    .unwrap();
    // A newer reading of "a" replaces nothing, and a new sensor drops nothing: the outbox
    // is full of rows in flight.
    let full = reading("a", 3).unwrap_err().to_string();
    assert!(full.contains("max_pending"), "{full}");
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.coalesced, stats.dropped), (0, 0));
    let data: Vec<String> = stored(&outbox).into_iter().map(|r| r.4).collect();
    assert_eq!(data, ["1", "2"]);
    // The same through Outbox::enqueue.
    let refused = outbox.transaction(|tx| {
        outbox.enqueue(tx, Event::new("telemetry.temp", json!(4)).coalesce_key("a"))
    });
    assert!(refused.is_err(), "{refused:?}");
    let data: Vec<String> = stored(&outbox).into_iter().map(|r| r.4).collect();
    assert_eq!(data, ["1", "2"]);
}

/// Issue 38, item 3: after a row was written while the clock was an hour ahead (here even
/// delivered), an event inserted through the SQL contract keeps its id rising but is due at
/// the real now, and a running relay delivers it at once, not an hour later.
#[test]
fn after_a_row_written_an_hour_ahead_an_sql_insert_is_delivered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stepped.db");
    let outbox = Outbox::open(&path).unwrap();
    let receiver = TestReceiver::ok();
    let ahead = Outbox::builder()
        .clock(sqlite_outbox::clock::ManualClock::new(
            outbox.now_ms() + 3_600_000,
        ))
        .open(&path)
        .unwrap();
    let _ = ahead
        .transaction(|tx| ahead.enqueue(tx, Event::new("t", json!("ahead"))))
        .unwrap();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    // The relay re-anchors the row written ahead and delivers it.
    assert!(wait_until(Duration::from_secs(10), || receiver.count() == 1));
    let conn = app_connection(&outbox);
    enqueue_sql(&conn, "t", "\"after\"", None);
    let delivered = wait_until(Duration::from_secs(5), || receiver.count() == 2);
    let _ = relay.shutdown();
    let rows = stored(&outbox);
    assert!(
        delivered,
        "the SQL insert was not delivered within 5 s: {:?}",
        rows.last()
    );
    let (newest, before) = (&rows[1], &rows[0]);
    assert!(v7_millis(&newest.1) as i64 >= before.9, "ids keep rising");
    assert!(
        newest.6 <= outbox.now_ms(),
        "due at the real now: {newest:?}"
    );
}

/// Issue 38, item 4: a lifetime near `i64::MAX` (a Python app passing `sys.maxsize` for
/// "never") is clamped, not turned into a REAL that the claim cannot read; the event is
/// delivered, whether the lifetime comes with the insert or from an `expiry:` setting.
#[test]
fn a_lifetime_of_i64_max_through_the_sql_contract_never_expires_and_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("forever.db")).unwrap();
    let conn = app_connection(&outbox);
    conn.execute(
        "INSERT INTO outbox_enqueue (type, data, expires_in_ms) VALUES ('t', '1', ?1)",
        [i64::MAX],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO outbox_settings (key, value) VALUES ('expiry:s', ?1)",
        [i64::MAX.to_string()],
    )
    .unwrap();
    enqueue_sql(&conn, "s", "2", None);
    let types: Vec<String> = conn
        .prepare("SELECT typeof(expires_at) FROM outbox_events ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(types, ["integer", "integer"], "expires_at stays an integer");
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::new()).destination(Destination::http("default", receiver.url())))
        .start()
        .unwrap();
    let delivered = wait_until(Duration::from_secs(10), || receiver.count() == 2);
    let _ = relay.shutdown();
    let stats = outbox.stats().unwrap();
    assert!(delivered, "{stats:?}");
    assert_eq!(stats.dead, 0);
}
