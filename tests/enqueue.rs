//! Enqueueing in the caller's transaction: atomicity, bad input, duplicates, opening files.

mod common;

use common::{fast, query_rows, rows, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{rusqlite, Enqueued, Error, Event, Outbox, RelayConfig};

fn business_table(outbox: &Outbox) {
    outbox
        .transaction(|tx| {
            tx.execute(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
                [],
            )?;
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

fn order_count(outbox: &Outbox) -> i64 {
    outbox
        .connection()
        .unwrap()
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn smoke() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("smoke.db")).unwrap();
    let id = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("smoke", json!({}))))
        .unwrap();
    assert!(matches!(id, Enqueued::New { .. }));
    assert_eq!(rows(&outbox).len(), 1);
}

#[test]
fn business_row_and_event_commit_together_and_rollback_delivers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    business_table(&outbox);
    let receiver = TestReceiver::ok();

    // Committed: the row and its event.
    let committed = outbox
        .transaction(|tx| {
            tx.execute("INSERT INTO orders (id, total) VALUES (1, 100)", [])?;
            outbox.enqueue(tx, Event::new("order.created", json!({"id": 1})))
        })
        .unwrap();
    // Rolled back by an error from the closure: neither the row nor the event exists.
    let failed: Result<(), Error> = outbox.transaction(|tx| {
        tx.execute("INSERT INTO orders (id, total) VALUES (2, 200)", [])?;
        let _ = outbox.enqueue(tx, Event::new("order.created", json!({"id": 2})))?;
        Err(Error::InvalidConfig("business rule failed".into()))
    });
    assert!(failed.is_err());
    // Rolled back explicitly on the caller's own connection.
    let mut own = rusqlite::Connection::open(outbox.path()).unwrap();
    let tx = own.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (3, 300)", [])
        .unwrap();
    let _ = outbox
        .enqueue(&tx, Event::new("order.created", json!({"id": 3})))
        .unwrap();
    tx.rollback().unwrap();
    // A marker committed last: once it arrives, anything before it would have too.
    let marker = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("marker", json!({}))))
        .unwrap();

    assert_eq!(order_count(&outbox), 1);
    assert_eq!(rows(&outbox).len(), 2);

    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).workers(1))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() >= 2));
    let _ = relay.shutdown();
    let ids: Vec<String> = receiver
        .received()
        .into_iter()
        .map(|r| r.event_id)
        .collect();
    assert_eq!(
        ids,
        vec![
            committed.event_id().to_string(),
            marker.event_id().to_string()
        ]
    );
    for r in receiver.received() {
        assert_ne!(r.body["data"]["id"], 2);
        assert_ne!(r.body["data"]["id"], 3);
    }
}

#[test]
fn event_enqueued_on_callers_own_connection_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("own.db")).unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let mut own = rusqlite::Connection::open(outbox.path()).unwrap();
    let tx = own.transaction().unwrap();
    let id = outbox
        .enqueue(&tx, Event::new("own.connection", json!({"n": 1})))
        .unwrap();
    tx.commit().unwrap();
    outbox.notify();
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    assert_eq!(receiver.received()[0].event_id, id.event_id());
    let _ = relay.shutdown();
}

#[test]
fn each_bad_input_gives_its_error_and_the_transaction_still_commits_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .payload_limit(1024)
        .open(dir.path().join("bad.db"))
        .unwrap();
    business_table(&outbox);
    let (first, dup) = outbox
        .transaction(|tx| {
            tx.execute("INSERT INTO orders (id, total) VALUES (1, 100)", [])?;
            let too_big = outbox.enqueue(tx, Event::new("t", json!("x".repeat(2000))));
            assert!(
                matches!(
                    too_big,
                    Err(Error::PayloadTooLarge {
                        size: 2002,
                        limit: 1024
                    })
                ),
                "{too_big:?}"
            );
            let empty = outbox.enqueue(tx, Event::new("", json!(1)));
            assert!(matches!(empty, Err(Error::InvalidEventType { len: 0, .. })));
            let long = outbox.enqueue(tx, Event::new("t".repeat(300), json!(1)));
            assert!(matches!(
                long,
                Err(Error::InvalidEventType {
                    len: 300,
                    limit: 255
                })
            ));
            let key = outbox.enqueue(tx, Event::new("t", json!(1)).partition_key("k".repeat(256)));
            assert!(matches!(
                key,
                Err(Error::FieldTooLong {
                    field: "partition key",
                    len: 256,
                    limit: 255
                })
            ));
            let first = outbox.enqueue(tx, Event::new("t", json!(1)).idempotency_key("once"))?;
            let dup = outbox.enqueue(tx, Event::new("t", json!(2)).idempotency_key("once"))?;
            tx.execute("INSERT INTO orders (id, total) VALUES (2, 200)", [])?;
            Ok::<_, sqlite_outbox::Error>((first, dup))
        })
        .unwrap();
    assert!(!first.is_duplicate());
    assert_eq!(
        dup,
        Enqueued::Duplicate {
            existing_event_id: first.event_id().to_string()
        }
    );
    assert_eq!(order_count(&outbox), 2);
    let stored = rows(&outbox);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].event_id, first.event_id());
}

#[test]
fn idempotency_key_is_a_duplicate_across_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("idem.db")).unwrap();
    let a = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1)).idempotency_key("k1")))
        .unwrap();
    let b = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1)).idempotency_key("k1")))
        .unwrap();
    assert!(b.is_duplicate());
    assert_eq!(a.event_id(), b.event_id());
}

#[test]
fn event_ids_are_uuid_v7_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("ids.db")).unwrap();
    let ids: Vec<String> = (0..50)
        .map(|i| {
            outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(i))))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect();
    for id in &ids {
        let u = uuid::Uuid::parse_str(id).unwrap();
        assert_eq!(u.get_version_num(), 7);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids);
}

#[test]
fn newer_schema_fails_clearly_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    drop(Outbox::open(&path).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        // A newer release recorded its schema version in the outbox's own table.
        conn.execute_batch(
            "UPDATE outbox_schema SET version = 99; PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Outbox::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 99, supported } if supported == sqlite_outbox::admin::schema_version()),
        "{err:?}"
    );
    assert!(err.to_string().contains("99"));
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn newer_schema_with_a_wal_left_by_a_crash_is_refused_and_the_file_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.db");
    drop(Outbox::open(&live).unwrap());
    let conn = rusqlite::Connection::open(&live).unwrap();
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0; UPDATE outbox_schema SET version = 99;")
        .unwrap();
    // A copy taken while a connection holds the file open: the file and its WAL as a
    // process that crashed leaves them.
    let path = dir.path().join("crashed.db");
    std::fs::copy(&live, &path).unwrap();
    std::fs::copy(
        dir.path().join("live.db-wal"),
        dir.path().join("crashed.db-wal"),
    )
    .unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let err = Outbox::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 99, .. }),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the WAL was checkpointed into the file"
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = "these are not the pages you are looking for ".repeat(100);
    std::fs::write(&path, &text).unwrap();
    let err = Outbox::open(&path).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn every_pooled_connection_has_wal_and_sync_and_the_apps_own_pragmas_stay() {
    let dir = tempfile::tempdir().unwrap();
    let open = |foreign_keys: &'static str| {
        Outbox::builder()
            .pool_size(3)
            .synchronous(sqlite_outbox::Synchronous::Full)
            .wal_autocheckpoint(777)
            .on_connect(move |c| c.execute_batch(&format!("PRAGMA foreign_keys = {foreign_keys}")))
            .open(dir.path().join("pragmas.db"))
            .unwrap()
    };
    // The app's on_connect has the last word on what the outbox does not need: its
    // foreign_keys stays as it set it, either way.
    for (foreign_keys, expected) in [("ON", "1"), ("OFF", "0")] {
        let outbox = open(foreign_keys);
        let conns: Vec<_> = (0..3).map(|_| outbox.connection().unwrap()).collect();
        for c in &conns {
            let get = |pragma: &str| -> String {
                c.query_row(&format!("PRAGMA {pragma}"), [], |r| {
                    r.get::<_, sqlite_outbox::rusqlite::types::Value>(0)
                })
                .map(|v| match v {
                    sqlite_outbox::rusqlite::types::Value::Integer(i) => i.to_string(),
                    sqlite_outbox::rusqlite::types::Value::Text(t) => t,
                    other => format!("{other:?}"),
                })
                .unwrap()
            };
            assert_eq!(get("journal_mode"), "wal");
            assert_eq!(get("foreign_keys"), expected);
            assert_eq!(get("synchronous"), "2");
            assert_eq!(get("wal_autocheckpoint"), "777");
        }
    }
}

#[test]
fn a_writer_waits_for_the_lock_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("busy.db")).unwrap();
    let holder = hold_write_lock(outbox.path(), 200);
    let started = std::time::Instant::now();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .expect("waits for the lock, within the 5 s busy timeout");
    assert!(started.elapsed() >= std::time::Duration::from_millis(150));
    holder.join().unwrap();
    assert_eq!(rows(&outbox).len(), 1);
}

#[test]
fn an_absurd_busy_timeout_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Outbox::builder()
        .busy_timeout(std::time::Duration::from_secs(u64::MAX / 4))
        .open(dir.path().join("absurd.db"))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

/// Regression: with a keyed backlog every claim used to step over all queued events of every
/// key (a 40k backlog drained at 100 events/s). Only each key's head may be due.
#[test]
fn a_keyed_backlog_parks_all_but_each_keys_head() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("parked.db")).unwrap();
    let mut conn = outbox.connection().unwrap();
    let tx = conn.transaction().unwrap();
    for i in 0..100 {
        let _ = outbox
            .enqueue(
                &tx,
                Event::new("t", json!(i)).partition_key(format!("k{}", i % 5)),
            )
            .unwrap();
        let _ = outbox.enqueue(&tx, Event::new("t", json!(i))).unwrap();
    }
    tx.commit().unwrap();
    let (due_keyed, parked, due_unkeyed): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*) FILTER (WHERE partition_key IS NOT NULL AND available_at < ?1),
                    COUNT(*) FILTER (WHERE available_at = ?1),
                    COUNT(*) FILTER (WHERE partition_key IS NULL AND available_at < ?1)
               FROM outbox_events",
            // A parked row's due time is later than any real time.
            [i64::MAX],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((due_keyed, parked, due_unkeyed), (5, 95, 100));
}

/// Regression: enqueue used to read before writing, and SQLite refuses (SQLITE_BUSY, no
/// waiting) to turn a deferred transaction that has only read into a writer while another
/// connection holds the write lock.
#[test]
fn an_enqueue_opening_a_deferred_transaction_waits_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("deferred.db")).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(0)).partition_key("k")))
        .unwrap();
    in_a_deferred_transaction_behind_a_writer(&outbox, |tx| {
        let _ = outbox
            .enqueue(tx, Event::new("t", json!(1)).partition_key("k"))
            .expect("waits for the writer, then parks behind the first event");
    });
    assert_eq!(rows(&outbox).len(), 2);
}

/// Runs `enqueue` in a deferred transaction on a connection of the app's own, opened while
/// another connection holds the write lock (and commits a change when it lets go, so that
/// a transaction that had read before could not write after), then commits it.
fn in_a_deferred_transaction_behind_a_writer(
    outbox: &Outbox,
    enqueue: impl FnOnce(&rusqlite::Transaction<'_>),
) {
    let holder = hold_write_lock(outbox.path(), 200);
    let mut own = rusqlite::Connection::open(outbox.path()).unwrap();
    own.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let tx = own.transaction().unwrap(); // DEFERRED
    enqueue(&tx);
    tx.commit().unwrap();
    holder.join().unwrap();
}

/// Takes the write lock on `path` from another connection for `ms` milliseconds, and
/// commits a change then; returns once the lock is held.
fn hold_write_lock(path: &std::path::Path, ms: u64) -> std::thread::JoinHandle<()> {
    let (locked_tx, locked_rx) = crossbeam_channel::bounded(1);
    let path = path.to_path_buf();
    let holder = std::thread::spawn(move || {
        let mut conn = rusqlite::Connection::open(path).unwrap();
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS other_app (x); INSERT INTO other_app VALUES (1);",
        )
        .unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(ms));
        tx.commit().unwrap();
    });
    locked_rx.recv().unwrap();
    holder
}

/// The pending events' ids, oldest first.
fn pending_ids(outbox: &Outbox) -> Vec<String> {
    outbox
        .list(Some(sqlite_outbox::admin::State::Pending), 100)
        .unwrap()
        .into_iter()
        .map(|r| r.event_id)
        .collect()
}

#[test]
fn a_duplicate_with_a_coalescing_key_leaves_the_replaced_event_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("savepoint.db")).unwrap();
    let held = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order", json!(1)).idempotency_key("k1")))
        .unwrap();
    let position = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("gps", json!(1)).coalesce_key("gps")))
        .unwrap();
    let before = pending_ids(&outbox);
    // Would replace the pending fix, but its idempotency key is taken: a duplicate.
    let again = outbox
        .transaction(|tx| {
            outbox.enqueue(
                tx,
                Event::new("gps", json!(2))
                    .coalesce_key("gps")
                    .idempotency_key("k1"),
            )
        })
        .unwrap();
    assert_eq!(again.event_id(), held.event_id());
    assert!(again.is_duplicate());
    assert_eq!(pending_ids(&outbox), before);
    assert!(before.contains(&position.event_id().to_string()));
}

#[test]
fn a_full_outbox_leaves_the_replaced_event_and_the_callers_writes_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending_bytes(1_000)
        .open(dir.path().join("savepoint-full.db"))
        .unwrap();
    business_table(&outbox);
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("gps", json!(1)).coalesce_key("gps")))
        .unwrap();
    let before = pending_ids(&outbox);
    let result: Result<(), Error> = outbox.transaction(|tx| {
        tx.execute("INSERT INTO orders (id, total) VALUES (7, 1)", [])?;
        // Replacing the small pending fix still leaves this one over the byte limit.
        let huge = Event::new("gps", json!("x".repeat(2_000))).coalesce_key("gps");
        let err = outbox.enqueue(tx, huge).unwrap_err();
        assert!(matches!(err, Error::OutboxFull { .. }), "{err}");
        Ok(())
    });
    result.unwrap();
    assert_eq!(
        pending_ids(&outbox),
        before,
        "the replaced event is still pending"
    );
    assert_eq!(order_count(&outbox), 1, "the caller's own write committed");
}

#[test]
fn an_enqueue_under_a_storage_limit_opening_a_deferred_transaction_waits_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending(100)
        .open(dir.path().join("deferred-limit.db"))
        .unwrap();
    in_a_deferred_transaction_behind_a_writer(&outbox, |tx| {
        let _ = outbox
            .enqueue(tx, Event::new("t", json!(1)))
            .expect("the limit check writes first, so it waits instead of failing");
    });
    assert_eq!(rows(&outbox).len(), 1);
}

// `enqueue_many`: one call for a transaction's events.

/// One transaction's events, for the comparison below: what each event is, by kind.
fn batch_script() -> Vec<Vec<Event>> {
    let reading = |n: i64, key: Option<&str>| {
        let event = Event::new("reading", json!({ "n": n }));
        match key {
            Some(key) => event.partition_key(key),
            None => event,
        }
    };
    vec![
        // Keys new and repeated, unkeyed, urgent, expiring, and an event for two
        // destinations (written one at a time) in the middle.
        vec![
            reading(1, Some("k1")),
            reading(2, Some("k2")),
            reading(3, None),
            Event::new("alarm", json!(4))
                .priority(9)
                .partition_key("k1"),
            reading(5, Some("k1")).subject("sensor-5"),
            Event::new("order.created", json!(6)).partition_key("k2"),
            reading(7, Some("k2")).expires_in(std::time::Duration::from_secs(60)),
            reading(8, None).source("/elsewhere"),
        ],
        // Keys already pending from the first transaction, a coalescing key, and an
        // idempotency key twice (the second a duplicate).
        vec![
            reading(9, Some("k1")),
            Event::new("gps", json!(10)).coalesce_key("fix"),
            reading(11, Some("k3")),
            reading(12, None).idempotency_key("once"),
            reading(13, Some("k3")),
            reading(14, None).idempotency_key("once"),
            reading(15, Some("k2")),
        ],
        // Newer fixes replace the older (the second time, the top row).
        vec![Event::new("gps", json!(16)).coalesce_key("fix")],
        vec![Event::new("gps", json!(17)).coalesce_key("fix")],
        (18..140)
            .map(|n| reading(n, Some(["k1", "k4", "k5"][n as usize % 3])))
            .collect(),
        vec![],
        vec![reading(140, Some("k4")), reading(141, None)],
    ]
}

/// An outbox from `builder` with the routes of [`batch_script`] and a clock that stands
/// still.
fn routed_outbox(builder: sqlite_outbox::OutboxBuilder, path: &std::path::Path) -> Outbox {
    builder
        .route("reading", "iot")
        .route("alarm", "iot")
        .route("gps", "iot")
        .route("order.*", "shop")
        .route("order.*", "audit")
        .clock(sqlite_outbox::clock::ManualClock::new(1_700_000_000_000))
        .open(path)
        .unwrap()
}

/// Every stored column that enqueue decides, in id order.
fn stored_rows(outbox: &Outbox) -> Vec<String> {
    query_rows(
        outbox,
        "SELECT json_array(id, destination, event_type, source, subject, partition_key,
                payload, created_at, available_at, priority, droppable, expires_at,
                idempotency_key, coalesce_key)
           FROM outbox_events ORDER BY id",
        |r| r.get(0),
    )
}

#[test]
fn a_batch_writes_the_same_rows_and_answers_as_one_enqueue_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let one_by_one = routed_outbox(Outbox::builder(), &dir.path().join("one-by-one.db"));
    let batched = routed_outbox(Outbox::builder(), &dir.path().join("batched.db"));
    for (step, events) in batch_script().into_iter().enumerate() {
        if step == 4 {
            // The top rows delivered and pruned: the next ids must still rise above them.
            prune_top_rows(&[&one_by_one, &batched], 3);
        }
        write_both_ways(&one_by_one, &batched, events);
    }
    let (expected, got) = (stored_rows(&one_by_one), stored_rows(&batched));
    // 140 events, the order twice, a duplicate, two fixes replaced, three pruned.
    assert_eq!(got.len(), 136);
    assert_eq!(got, expected);
    // The first transaction's event ids are in the answers' order, and rising (UUIDv7).
    let ids: Vec<String> = rows(&batched).into_iter().map(|r| r.event_id).collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
}

#[test]
fn random_batches_write_the_same_rows_and_answers_as_one_enqueue_per_event() {
    // Without a storage limit most events go in runs; with one, every event is written one
    // at a time inside the call's savepoint.
    for (seed, limited) in [(1, false), (2, false), (3, true)] {
        let dir = tempfile::tempdir().unwrap();
        let builder = || {
            let builder = Outbox::builder();
            if limited {
                builder.max_pending(1_000_000)
            } else {
                builder
            }
        };
        let one_by_one = routed_outbox(builder(), &dir.path().join("one-by-one.db"));
        let batched = routed_outbox(builder(), &dir.path().join("batched.db"));
        let mut random = XorShift(seed);
        for _ in 0..40 {
            if random.below(10) == 0 {
                prune_top_rows(&[&one_by_one, &batched], 1 + random.below(3) as i64);
            }
            let events = (0..random.below(60))
                .map(|n| random_event(&mut random, n))
                .collect();
            write_both_ways(&one_by_one, &batched, events);
        }
        assert_eq!(
            stored_rows(&batched),
            stored_rows(&one_by_one),
            "seed {seed}"
        );
    }
}

/// A small deterministic generator, so that a failing seed can be run again.
struct XorShift(u64);

impl XorShift {
    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// An event of a random type (one of [`routed_outbox`]'s, two of them for two
/// destinations), with or without a key, an idempotency key that often repeats, a
/// coalescing key, a priority or a lifetime.
fn random_event(random: &mut XorShift, n: u64) -> Event {
    let kind = ["reading", "alarm", "gps", "order.created"][random.below(4) as usize];
    let mut event = Event::new(kind, json!({ "n": n }));
    if random.below(3) > 0 {
        event = event.partition_key(format!("k{}", random.below(6)));
    }
    if random.below(10) == 0 {
        event = event.idempotency_key(format!("i{}", random.below(20)));
    }
    if random.below(10) == 0 {
        event = event.coalesce_key(format!("c{}", random.below(3)));
    }
    if random.below(5) == 0 {
        event = event.priority(random.below(10) as u8);
    }
    if random.below(8) == 0 {
        event = event.expires_in(std::time::Duration::from_secs(1 + random.below(100)));
    }
    event
}

/// Writes `events` in one transaction on each file, one `enqueue` at a time on the first
/// and with one `enqueue_many` on the second, and checks that the answers agree.
fn write_both_ways(one_by_one: &Outbox, batched: &Outbox, events: Vec<Event>) {
    let expected: Vec<Enqueued> = one_by_one
        .transaction(|tx| {
            events
                .iter()
                .map(|e| one_by_one.enqueue(tx, e.clone()))
                .collect()
        })
        .unwrap();
    let got = batched
        .transaction(|tx| batched.enqueue_many(tx, events))
        .unwrap();
    let duplicates = |answers: &[Enqueued]| -> Vec<bool> {
        answers.iter().map(Enqueued::is_duplicate).collect()
    };
    assert_eq!(duplicates(&got), duplicates(&expected));
}

/// Marks the `n` rows with the highest ids delivered in each outbox and prunes them.
fn prune_top_rows(outboxes: &[&Outbox], n: i64) {
    for outbox in outboxes {
        let marked = outbox
            .connection()
            .unwrap()
            .execute(
                "UPDATE outbox_events SET delivered_at = 0
                  WHERE id IN (SELECT id FROM outbox_events ORDER BY id DESC LIMIT ?1)",
                [n],
            )
            .unwrap();
        let pruned = outbox.prune_delivered(std::time::Duration::ZERO).unwrap();
        assert_eq!(pruned.deleted, marked);
    }
}

#[test]
fn a_bad_event_anywhere_in_a_batch_writes_none_and_the_transaction_still_commits() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("bad-batch.db")).unwrap();
    business_table(&outbox);
    let mut own = rusqlite::Connection::open(outbox.path()).unwrap();
    let tx = own.transaction().unwrap();
    tx.execute("INSERT INTO orders (id, total) VALUES (1, 100)", [])
        .unwrap();
    let err = outbox
        .enqueue_many(
            &tx,
            vec![
                Event::new("order.created", json!(1)),
                Event::new("order.created", json!(2)).partition_key("k"),
                Event::new("order.created", json!(3)).partition_key("x".repeat(10_000)),
            ],
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::FieldTooLong {
                field: "partition key",
                ..
            }
        ),
        "{err}"
    );
    tx.commit().unwrap();
    assert_eq!(order_count(&outbox), 1);
    assert!(rows(&outbox).is_empty());
    let nothing = outbox
        .transaction(|tx| outbox.enqueue_many(tx, Vec::new()))
        .unwrap();
    assert!(nothing.is_empty());
    assert!(rows(&outbox).is_empty());
}

#[test]
fn a_storage_limit_that_refuses_one_event_of_a_batch_leaves_the_transaction_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending(3)
        .open(dir.path().join("full-batch.db"))
        .unwrap();
    business_table(&outbox);
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(0))))
        .unwrap();
    let result: Result<(), Error> = outbox.transaction(|tx| {
        tx.execute("INSERT INTO orders (id, total) VALUES (7, 1)", [])?;
        let err = outbox
            .enqueue_many(tx, (1..=3).map(|n| Event::new("t", json!(n))))
            .unwrap_err();
        assert!(matches!(err, Error::OutboxFull { .. }), "{err}");
        Ok(())
    });
    result.unwrap();
    assert_eq!(rows(&outbox).len(), 1, "none of the batch was kept");
    assert_eq!(order_count(&outbox), 1, "the caller's own write committed");
}

#[test]
fn a_batch_opening_a_deferred_transaction_waits_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("deferred-batch.db")).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(0)).partition_key("k")))
        .unwrap();
    in_a_deferred_transaction_behind_a_writer(&outbox, |tx| {
        outbox
            .enqueue_many(
                tx,
                (1..=3).map(|n| Event::new("t", json!(n)).partition_key("k")),
            )
            .expect("waits for the writer, then parks behind the first event");
    });
    let parked = rows(&outbox)
        .iter()
        .filter(|r| r.available_at == i64::MAX)
        .count();
    assert_eq!(parked, 3);
}

#[test]
fn batches_of_keyed_events_are_delivered_in_each_keys_order() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("batch-order.db")).unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).workers(4))
        .start()
        .unwrap();
    let mut sent: std::collections::HashMap<String, Vec<String>> = Default::default();
    for batch in 0..4 {
        let events: Vec<Event> = (0..100)
            .map(|i| {
                Event::new("reading", json!({ "batch": batch, "i": i }))
                    .partition_key(format!("device-{}", i % 7))
            })
            .collect();
        let keys: Vec<String> = (0..100).map(|i| format!("device-{}", i % 7)).collect();
        let answers = outbox
            .transaction(|tx| outbox.enqueue_many(tx, events))
            .unwrap();
        for (key, answer) in keys.into_iter().zip(answers) {
            sent.entry(key)
                .or_default()
                .push(answer.event_id().to_string());
        }
    }
    assert!(wait_until(PATIENCE, || receiver.event_count() >= 400));
    let _ = relay.shutdown();
    let received = receiver.event_ids();
    assert_eq!(received.len(), 400, "each event once");
    for (key, ids) in sent {
        let order: Vec<&String> = received.iter().filter(|id| ids.contains(id)).collect();
        assert_eq!(order, ids.iter().collect::<Vec<_>>(), "{key}");
    }
}

#[test]
fn a_large_batch_of_many_keys_parks_all_but_each_keys_first() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("many-keys.db")).unwrap();
    // 20,000 events over 5,000 keys, each key's events spread over the whole call.
    let answers = outbox
        .transaction(|tx| {
            outbox.enqueue_many(
                tx,
                (0..20_000).map(|i| {
                    Event::new("reading", json!(i)).partition_key(format!("k{}", i % 5_000))
                }),
            )
        })
        .unwrap();
    assert_eq!(answers.len(), 20_000);
    let conn = outbox.connection().unwrap();
    let (due, parked, first_due_of_each_key): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*) FILTER (WHERE available_at < ?1),
                    COUNT(*) FILTER (WHERE available_at = ?1),
                    (SELECT COUNT(*) FROM outbox_events AS e
                      WHERE e.available_at < ?1
                        AND e.id = (SELECT MIN(id) FROM outbox_events
                                     WHERE partition_key = e.partition_key))
               FROM outbox_events",
            [i64::MAX],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((due, parked, first_due_of_each_key), (5_000, 15_000, 5_000));
}
