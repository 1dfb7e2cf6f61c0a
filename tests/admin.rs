//! Operating the outbox through its admin API: stats, dead letters, retry, purge, prune,
//! health, bounded storage and coalescing.

mod common;

use std::time::Duration;

use common::{delivered_count, fast, rows, wait_until, Reply, SetOnDrop, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::admin::{DeadFilter, HealthThresholds, Limit, State};
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig, StoragePolicy};

/// Rows per prune transaction, as `Outbox::prune_delivered` documents.
const PRUNE_PAGE_ROWS: usize = 500;

const T0: i64 = 1_700_000_000_000;
const DAY: i64 = 86_400_000;

fn enqueue(outbox: &Outbox, event_type: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new(event_type, json!({"i": i}))))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect()
}

/// Changes rows by hand, then recounts the delivered totals as the queue would have kept
/// them and drops the pending totals, which `stats` then counts again (the outbox keeps
/// both as it writes; a hand edit bypasses that).
fn set(outbox: &Outbox, sql: &str) {
    let conn = outbox.connection().unwrap();
    conn.execute_batch(sql).unwrap();
    conn.execute_batch(RECOUNT_DELIVERED).unwrap();
}

const RECOUNT_DELIVERED: &str = "DELETE FROM outbox_delivered_totals;
    INSERT INTO outbox_delivered_totals
    SELECT destination, COUNT(*) FROM outbox_events
     WHERE delivered_at IS NOT NULL GROUP BY destination;
    DELETE FROM outbox_pending_tally;
    DELETE FROM outbox_lease_tally;
    UPDATE outbox_stats SET tallied_through = 0;";

/// The trigger-kept totals must equal a real count whatever happened.
fn assert_totals_exact(outbox: &Outbox) {
    let conn = outbox.connection().unwrap();
    let (count, bytes): (i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COALESCE(SUM(octet_length(payload)), 0) FROM outbox_events
              WHERE delivered_at IS NULL AND dead_at IS NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let stats = outbox.stats().unwrap();
    assert_eq!((stats.pending, stats.pending_bytes), (count, bytes));
    let triggers: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master
              WHERE type = 'trigger' AND name LIKE 'outbox_events_pending_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if triggers > 0 {
        let kept: (i64, i64) = conn
            .query_row(
                "SELECT pending_count, pending_bytes FROM outbox_stats",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kept, (count, bytes), "trigger-kept totals drifted");
    }
}

#[test]
fn stats_count_states_destinations_attempts_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("stats.db"))
        .unwrap();
    enqueue(&outbox, "a", 5);
    clock.advance_ms(60_000);
    set(
        &outbox,
        "UPDATE outbox_events SET delivered_at = 1 WHERE id <= 2;
         UPDATE outbox_events SET dead_at = 1, attempts = 3, last_error = 'HTTP 400' WHERE id = 3;
         UPDATE outbox_events SET attempts = 2 WHERE id = 4;",
    );
    let s = outbox.stats().unwrap();
    assert_eq!((s.pending, s.delivered, s.dead), (2, 2, 1));
    assert_eq!(s.oldest_pending_age_ms, Some(60_000));
    assert_eq!(s.attempts_histogram, vec![(0, 1), (2, 1), (3, 1)]);
    assert_eq!(s.destinations.len(), 1);
    assert_eq!(s.destinations[0].name, "default");
    assert!(s.database_bytes > 0);
    assert_totals_exact(&outbox);
}

#[test]
fn stats_add_up_pending_and_dead_rows_that_spent_the_same_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("stats-attempts.db")).unwrap();
    enqueue(&outbox, "a", 5);
    set(
        &outbox,
        "UPDATE outbox_events SET attempts = 2 WHERE id IN (1, 2);
         UPDATE outbox_events SET attempts = 7 WHERE id = 3;
         UPDATE outbox_events SET dead_at = 1, attempts = 2, last_error = 'HTTP 400' WHERE id = 4;",
    );
    let s = outbox.stats().unwrap();
    assert_eq!((s.pending, s.dead), (4, 1));
    assert_eq!(s.attempts_histogram, vec![(0, 1), (2, 3), (7, 1)]);
}

#[test]
fn stats_count_leased_rows_and_merge_never_attempted_pending_and_dead_rows() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("stats-leased.db"))
        .unwrap();
    enqueue(&outbox, "a", 4);
    set(
        &outbox,
        &format!(
            "UPDATE outbox_events SET dead_at = 1, last_error = 'unreadable' WHERE id = 1;
             UPDATE outbox_events SET attempts = 1 WHERE id = 2;
             UPDATE outbox_events SET lease_owner = 'r', lease_expires_at = {} WHERE id = 3;
             UPDATE outbox_events SET lease_owner = 'old', lease_expires_at = {} WHERE id = 4;",
            T0 + 60_000,
            T0 - 1
        ),
    );
    let s = outbox.stats().unwrap();
    assert_eq!(
        (s.pending, s.dead, s.in_flight),
        (3, 1, 1),
        "an expired lease is not in flight"
    );
    // Rows 3 and 4 (pending) and row 1 (dead) spent no attempt; row 2 spent one.
    assert_eq!(s.attempts_histogram, vec![(0, 3), (1, 1)]);
    let payloads: i64 = outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT SUM(octet_length(payload)) FROM outbox_events WHERE id > 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(s.pending_bytes, payloads);
}

#[test]
fn list_show_and_dead_letters_with_their_errors() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("list.db")).unwrap();
    let ids = enqueue(&outbox, "order.created", 3);
    set(
        &outbox,
        "UPDATE outbox_events SET dead_at = 1, attempts = 1, last_error = 'HTTP 400: bad' WHERE id = 2",
    );
    let dead = outbox.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_id, ids[1]);
    assert_eq!(dead[0].last_error.as_deref(), Some("HTTP 400: bad"));
    assert_eq!(dead[0].state, State::Dead);
    let pending = outbox.list(Some(State::Pending), 10).unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|r| r.event_id.clone())
            .collect::<Vec<_>>(),
        vec![ids[0].clone(), ids[2].clone()]
    );
    assert_eq!(outbox.list(None, 2).unwrap().len(), 2);
    let shown = outbox.show(&ids[0]).unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].data, r#"{"i":0}"#);
    assert!(outbox.show("no-such-id").unwrap().is_empty());
}

#[test]
fn retrying_dead_letters_delivers_them() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("retry.db")).unwrap();
    let flaky = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reject = flaky.clone();
    let receiver = TestReceiver::start(0, move |_| {
        if reject.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::StatusBody(422, "schema mismatch")
        } else {
            Reply::Status(200)
        }
    });
    let a = enqueue(&outbox, "order.created", 3);
    let b = enqueue(&outbox, "user.signup", 2);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || outbox.stats().unwrap().dead == 5));
    // The receiver is fixed; an operator retries one, then all of one type, then the rest.
    flaky.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(outbox.retry(&[a[0].as_str()]).unwrap(), 1);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let by_type = DeadFilter::all().event_type("order.*");
    assert_eq!(outbox.retry_dead(&by_type).unwrap(), 2);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 3));
    assert_eq!(outbox.retry_dead(&DeadFilter::default()).unwrap(), 2);
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 5));
    let _ = relay.shutdown();
    for row in rows(&outbox) {
        assert!(row.delivered && row.attempts == 1, "{row:?}");
    }
    assert_eq!(outbox.show(&b[1]).unwrap()[0].state, State::Delivered);
    assert_totals_exact(&outbox);
}

#[test]
fn purge_dead_deletes_only_dead_letters_and_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("purge.db"))
        .unwrap();
    enqueue(&outbox, "t", 4);
    set(
        &outbox,
        &format!(
            "UPDATE outbox_events SET dead_at = {} WHERE id IN (1, 2);
             UPDATE outbox_events SET dead_at = {} WHERE id = 3;",
            T0 - 10 * DAY,
            T0
        ),
    );
    assert_eq!(
        outbox
            .purge_dead(Some(Duration::from_secs(86_400)))
            .unwrap()
            .deleted,
        2
    );
    assert_eq!(outbox.stats().unwrap().dead, 1);
    assert_eq!(outbox.purge_dead(None).unwrap().deleted, 1);
    let s = outbox.stats().unwrap();
    assert_eq!((s.dead, s.pending), (0, 1));
}

#[test]
fn prune_pages_its_deletes_and_leaves_pending_and_dead_rows_alone() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("prune.db"))
        .unwrap();
    let total = 2 * PRUNE_PAGE_ROWS + 100;
    {
        let mut conn = outbox.connection().unwrap();
        let tx = conn.transaction().unwrap();
        for _ in 0..total + 20 {
            let _ = outbox.enqueue(&tx, Event::new("t", json!(1))).unwrap();
        }
        tx.commit().unwrap();
    }
    set(
        &outbox,
        &format!(
            "UPDATE outbox_events SET delivered_at = {old} WHERE id <= {total};
             UPDATE outbox_events SET delivered_at = {new} WHERE id = {fresh};
             UPDATE outbox_events SET dead_at = {old} WHERE id = {dead};",
            old = T0 - 30 * DAY,
            new = T0 - DAY,
            fresh = total + 1,
            dead = total + 2,
        ),
    );
    let mut progress = Vec::new();
    let report = outbox
        .prune_delivered_with_progress(Duration::from_secs(7 * 86_400), |n| progress.push(n))
        .unwrap();
    assert_eq!(report.deleted, total);
    // Three pages of delivered rows, and one that found no expired or exported row.
    assert_eq!(report.pages, 4, "pages of {PRUNE_PAGE_ROWS}");
    assert_eq!(progress, vec![PRUNE_PAGE_ROWS, 2 * PRUNE_PAGE_ROWS, total]);
    let s = outbox.stats().unwrap();
    assert_eq!((s.delivered, s.dead, s.pending), (1, 1, 18));
    assert_totals_exact(&outbox);
}

#[test]
fn the_relay_prunes_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("retention.db")).unwrap();
    let receiver = TestReceiver::ok();
    enqueue(&outbox, "t", 1200);
    set(
        &outbox,
        "UPDATE outbox_events SET delivered_at = 1 WHERE id <= 1100",
    );
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())).retention(Some(Duration::from_secs(3600))))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || outbox.stats().unwrap().delivered
        == 100
        && outbox.stats().unwrap().pending == 0));
    let _ = relay.shutdown();
    assert_eq!(receiver.count(), 100);
}

#[test]
fn health_turns_degraded_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("health.db"))
        .unwrap();
    let thresholds = HealthThresholds::default().max_pending_age(Duration::from_secs(600));
    assert!(outbox.health(thresholds).unwrap().ok);
    let ids = enqueue(&outbox, "t", 2);
    clock.advance_ms(601_000);
    let h = outbox.health(thresholds).unwrap();
    assert!(!h.ok);
    assert!(h.reasons[0].contains("oldest pending"), "{:?}", h.reasons);
    set(
        &outbox,
        &format!(
            "UPDATE outbox_events SET delivered_at = {T0} WHERE id = 1;
                  UPDATE outbox_events SET dead_at = {T0}, last_error = 'x' WHERE id = 2;"
        ),
    );
    outbox
        .disable_destination("default", "HTTP 410 Gone")
        .unwrap();
    let h = outbox.health(thresholds).unwrap();
    assert_eq!(h.reasons.len(), 2, "{:?}", h.reasons);
    assert!(h.reasons.iter().any(|r| r.contains("1 dead letters")));
    assert!(h.reasons.iter().any(|r| r.contains("default is disabled")));
    outbox.purge_dead(None).unwrap();
    outbox.enable_destination("default").unwrap();
    assert!(outbox.health(thresholds).unwrap().ok);
    let _ = ids;
}

/// The oldest pending event's age as `stats` and `health` report it must equal one found
/// by reading every pending row, whatever moved the rows' due times.
fn assert_oldest_exact(outbox: &Outbox, now: i64) {
    let conn = outbox.connection().unwrap();
    let by_pass: Option<i64> = conn
        .query_row(
            "SELECT MIN(created_at) FROM outbox_events
              WHERE delivered_at IS NULL AND dead_at IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let stats = outbox.stats().unwrap();
    assert_eq!(stats.oldest_pending_age_ms, by_pass.map(|t| now - t));
    let Some(age) = stats.oldest_pending_age_ms else {
        return;
    };
    let just_under =
        HealthThresholds::default().max_pending_age(Duration::from_millis(age as u64 - 1));
    let at = HealthThresholds::default().max_pending_age(Duration::from_millis(age as u64));
    let flagged = |t| {
        let h = outbox.health(t).unwrap();
        h.reasons.iter().any(|r| r.contains("oldest pending"))
    };
    assert!(flagged(just_under) && !flagged(at), "age {age}");
}

#[test]
fn the_oldest_pending_age_holds_through_retries_unparking_and_operator_retries() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("oldest.db"))
        .unwrap();
    let status = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(500));
    let answer = status.clone();
    let receiver = TestReceiver::start(0, move |_| {
        match answer.load(std::sync::atomic::Ordering::SeqCst) {
            500 => Reply::Status(500),
            _ => Reply::StatusBody(422, "schema mismatch"),
        }
    });
    let keyed = |i: i64| Event::new("k", json!({ "i": i })).partition_key("k");
    let add = |event: Event| {
        outbox
            .transaction(|tx| outbox.enqueue(tx, event))
            .unwrap()
            .event_id()
            .to_string()
    };
    // A key's head and the event parked behind it, then an event of its own.
    let head = add(keyed(1));
    let parked = add(keyed(2));
    clock.advance_ms(1_000);
    let single = add(Event::new("u", json!(3)));
    assert_oldest_exact(&outbox, T0 + 1_000);
    // Failed attempts move the head's and the single event's due times to their retries
    // (the manual clock stands still, so the retries stay ahead).
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)
        .iter()
        .filter(|r| r.attempts > 0)
        .count()
        == 2));
    let _ = relay.shutdown();
    clock.advance_ms(1_000);
    add(Event::new("u", json!(4)).priority(0));
    assert_oldest_exact(&outbox, T0 + 2_000);
    // Refused for good: each head's dead letter unparks the next event of its key.
    status.store(422, std::sync::atomic::Ordering::SeqCst);
    clock.advance_ms(60_000);
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || outbox.stats().unwrap().dead == 4));
    let _ = relay.shutdown();
    assert_oldest_exact(&outbox, T0 + 62_000);
    // An operator's retries make dead letters pending again, due now.
    clock.advance_ms(1_000);
    assert_eq!(outbox.retry(&[single.as_str()]).unwrap(), 1);
    assert_oldest_exact(&outbox, T0 + 63_000);
    assert_eq!(outbox.retry(&[parked.as_str(), head.as_str()]).unwrap(), 2);
    assert_oldest_exact(&outbox, T0 + 63_000);
    assert_eq!(outbox.stats().unwrap().pending, 3);
}

/// `stats`' pending counts, bytes, leases and attempts must equal a pass over every row,
/// per destination. Call it while nothing writes.
fn assert_stats_match_a_pass(outbox: &Outbox) {
    let stats = outbox.stats().unwrap();
    let conn = outbox.connection().unwrap();
    let by_destination: Vec<(String, i64)> = conn
        .prepare(
            "SELECT destination, COUNT(*) FROM outbox_events
              WHERE delivered_at IS NULL AND dead_at IS NULL GROUP BY destination",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let counted: Vec<(String, i64)> = stats
        .destinations
        .iter()
        .filter(|d| d.pending > 0)
        .map(|d| (d.name.clone(), d.pending))
        .collect();
    assert_eq!(counted, by_destination);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (bytes, leased): (i64, i64) = conn
        .query_row(
            "SELECT COALESCE(SUM(octet_length(payload)), 0),
                    COALESCE(SUM(lease_expires_at > ?1), 0)
               FROM outbox_events WHERE delivered_at IS NULL AND dead_at IS NULL",
            [now],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((stats.pending_bytes, stats.in_flight), (bytes, leased));
    let attempts: Vec<(i64, i64)> = conn
        .prepare(
            "SELECT attempts, COUNT(*) FROM outbox_events
              WHERE delivered_at IS NULL AND expired_at IS NULL AND exported_at IS NULL
              GROUP BY attempts ORDER BY attempts",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stats.attempts_histogram, attempts);
}

#[test]
fn stats_stay_exact_while_a_relay_drains_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .route("order.*", "shop")
        .route("order.*", "audit")
        .route("tick", "audit")
        .open(dir.path().join("exact.db"))
        .unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = calls.clone();
    // Every third request fails for a while: retries spend attempts and move due times.
    let receiver = TestReceiver::start(0, move |_| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n.is_multiple_of(3) && n < 1_500 {
            Reply::Status(503)
        } else {
            Reply::Status(200)
        }
    });
    let add = |n: i64| {
        outbox
            .transaction(|tx| {
                for i in 0..n {
                    let event = match i % 3 {
                        0 => Event::new("order.created", json!({ "i": i }))
                            .partition_key(format!("o{}", i % 7)),
                        1 => Event::new("order.paid", json!({ "i": i })),
                        _ => Event::new("tick", json!({ "i": i })),
                    };
                    let _ = outbox.enqueue(tx, event)?;
                }
                Ok::<_, sqlite_outbox::Error>(())
            })
            .unwrap()
    };
    add(600);
    assert_stats_match_a_pass(&outbox);
    let config = || {
        fast(
            RelayConfig::new()
                .destination(Destination::http("shop", receiver.url()))
                .destination(Destination::http("audit", receiver.url())),
        )
    };
    let relay = outbox.relay(config()).start().unwrap();
    // Stats called while the relay claims and acks fold its rows into the totals as they go.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                drop(outbox.stats().unwrap());
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let _stop_stats = SetOnDrop(&stop);
        add(600);
        std::thread::sleep(Duration::from_millis(50));
        add(600);
        let busy = wait_until(PATIENCE, || {
            calls.load(std::sync::atomic::Ordering::SeqCst) > 1_000
        });
        assert!(busy, "the relay made too few requests");
    });
    // Stopped part way: what it left, leases handed back, counted exactly.
    let _ = relay.shutdown();
    assert_stats_match_a_pass(&outbox);
    let relay = outbox.relay(config()).start().unwrap();
    assert!(wait_until(PATIENCE, || outbox.stats().unwrap().pending == 0));
    let _ = relay.shutdown();
    assert_stats_match_a_pass(&outbox);
    let conn = outbox.connection().unwrap();
    let tallied: i64 = conn
        .query_row("SELECT tallied_through FROM outbox_stats", [], |r| r.get(0))
        .unwrap();
    assert!(tallied > 0, "no stats call folded rows in");
}

#[test]
fn after_stats_the_apps_next_transaction_still_waits_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("patient.db");
    // One pooled connection: the one `stats` folds the totals on is the app's next one.
    let patience = Duration::from_secs(30);
    let outbox = Outbox::builder()
        .pool_size(1)
        .busy_timeout(patience)
        .open(&path)
        .unwrap();
    let enqueue =
        |name: &str| outbox.transaction(|tx| outbox.enqueue(tx, Event::new(name, json!({}))));
    let _ = enqueue("before").unwrap();
    // Another program holds the write lock, as a relay's ack does.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Stats does not wait for the lock to fold its totals: it counts and returns.
    let started = std::time::Instant::now();
    assert_eq!(outbox.stats().unwrap().pending, 1);
    assert!(
        started.elapsed() < patience / 3,
        "stats waited for the write lock"
    );
    // The connection must have its patience back: the app's next transaction waits for
    // the lock instead of failing with "database is locked".
    let held_for = Duration::from_millis(200);
    let release = std::thread::spawn(move || {
        std::thread::sleep(held_for);
        other.execute_batch("COMMIT").unwrap();
    });
    let started = std::time::Instant::now();
    let after = enqueue("after");
    let waited = started.elapsed();
    release.join().unwrap();
    let _ = after.expect("the transaction waits for the lock instead of failing at once");
    assert!(waited >= held_for / 2, "waited only {waited:?}");
    assert_eq!(outbox.stats().unwrap().pending, 2);
}

#[test]
fn reject_policy_refuses_at_the_limit_and_the_transaction_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending(3)
        .open(dir.path().join("reject.db"))
        .unwrap();
    enqueue(&outbox, "order.created", 3);
    let (full, after) = outbox
        .transaction(|tx| {
            tx.execute("CREATE TABLE orders (id INTEGER)", [])?;
            let full = outbox.enqueue(tx, Event::new("order.created", json!(4)));
            tx.execute("INSERT INTO orders VALUES (4)", [])?;
            Ok::<_, sqlite_outbox::Error>((full, 1))
        })
        .unwrap();
    assert!(matches!(
        full,
        Err(Error::OutboxFull {
            limit: Limit::PendingEvents,
            max: 3,
            current: 3
        })
    ));
    assert_eq!(after, 1);
    let orders: i64 = outbox
        .connection()
        .unwrap()
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orders, 1, "the caller's other write committed");
    assert_eq!(outbox.stats().unwrap().pending, 3);
    // Room again once something is delivered.
    set(
        &outbox,
        "UPDATE outbox_events SET delivered_at = 1 WHERE id = 1",
    );
    enqueue(&outbox, "order.created", 1);
    assert_totals_exact(&outbox);
}

#[test]
fn drop_oldest_makes_room_from_lossy_types_only_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending(10)
        .storage_policy("telemetry.*", StoragePolicy::DropOldest)
        .open(dir.path().join("drop.db"))
        .unwrap();
    let orders = enqueue(&outbox, "order.created", 4);
    let readings = enqueue(&outbox, "telemetry.temperature", 6);
    // Full. New telemetry pushes out the oldest telemetry, never an order.
    let newer = enqueue(&outbox, "telemetry.temperature", 3);
    // A business event also gets in by dropping telemetry.
    let order = enqueue(&outbox, "order.created", 1);
    let kept: Vec<String> = outbox
        .list(Some(State::Pending), 100)
        .unwrap()
        .into_iter()
        .map(|r| r.event_id)
        .collect();
    assert_eq!(kept.len(), 10);
    for id in orders.iter().chain(&order).chain(&newer) {
        assert!(kept.contains(id), "{id} was dropped");
    }
    for id in &readings[..4] {
        assert!(!kept.contains(id), "oldest reading {id} kept");
    }
    let s = outbox.stats().unwrap();
    assert_eq!(s.dropped, 4);
    // Only orders left to drop? Then even telemetry is refused rather than losing an order.
    let only_orders = Outbox::builder()
        .max_pending(2)
        .storage_policy("telemetry.*", StoragePolicy::DropOldest)
        .open(dir.path().join("orders-only.db"))
        .unwrap();
    enqueue(&only_orders, "order.created", 2);
    let refused =
        only_orders.transaction(|tx| only_orders.enqueue(tx, Event::new("telemetry.x", json!(1))));
    assert!(matches!(refused, Err(Error::OutboxFull { .. })));
    assert_eq!(only_orders.stats().unwrap().pending, 2);
    assert_totals_exact(&outbox);
}

#[test]
fn the_byte_limit_counts_payload_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .max_pending_bytes(1000)
        .storage_policy("*", StoragePolicy::DropOldest)
        .open(dir.path().join("bytes.db"))
        .unwrap();
    for _ in 0..5 {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!("é".repeat(149)))))
            .unwrap();
    }
    // Each payload is 300 bytes ("é" is two bytes, plus quotes): three fit in 1000.
    let s = outbox.stats().unwrap();
    assert_eq!((s.pending, s.pending_bytes, s.dropped), (3, 900, 2));
    let too_big =
        outbox.transaction(|tx| outbox.enqueue(tx, Event::new("t", json!("x".repeat(2000)))));
    assert!(matches!(
        too_big,
        Err(Error::OutboxFull {
            limit: Limit::PendingBytes,
            ..
        })
    ));
    assert_totals_exact(&outbox);
}

#[test]
fn coalescing_keeps_one_current_value_per_key_while_offline() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("coalesce.db")).unwrap();
    for i in 0..1000 {
        let _ = outbox
            .transaction(|tx| {
                let _ = outbox.enqueue(
                    tx,
                    Event::new("device.position", json!({"fix": i})).coalesce_key("gps"),
                )?;
                outbox.enqueue(
                    tx,
                    Event::new("device.settings", json!({"rev": i})).coalesce_key("settings"),
                )
            })
            .unwrap();
    }
    enqueue(&outbox, "device.position", 2); // no key: never replaced
    let pending = outbox.list(Some(State::Pending), 100).unwrap();
    assert_eq!(pending.len(), 4);
    let latest = |t: &str| {
        pending
            .iter()
            .find(|r| r.event_type == t && r.data.contains("999"))
            .is_some()
    };
    assert!(latest("device.position") && latest("device.settings"));
    assert_eq!(outbox.stats().unwrap().coalesced, 2 * 999);
    assert_totals_exact(&outbox);
}

#[test]
fn totals_start_exact_when_a_limit_is_first_set_on_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.db");
    let plain = Outbox::open(&path).unwrap();
    enqueue(&plain, "t", 7);
    set(
        &plain,
        "UPDATE outbox_events SET delivered_at = 1 WHERE id <= 2",
    );
    let limited = Outbox::builder().max_pending(6).open(&path).unwrap();
    assert_totals_exact(&limited);
    enqueue(&limited, "t", 1);
    // Writes by an opener without limits are counted too: the triggers live in the file.
    set(&plain, "UPDATE outbox_events SET dead_at = 1 WHERE id = 3");
    assert_totals_exact(&limited);
    enqueue(&limited, "t", 1);
    let full = limited.transaction(|tx| limited.enqueue(tx, Event::new("t", json!(1))));
    assert!(matches!(full, Err(Error::OutboxFull { .. })));
    assert_totals_exact(&limited);
}

/// The database file's size once its WAL is checkpointed into it.
fn file_bytes(outbox: &Outbox) -> u64 {
    outbox.checkpoint().unwrap();
    std::fs::metadata(outbox.path()).unwrap().len()
}

/// 5,000 delivered events of 2 KB each: about 10 MB of history.
fn fill_delivered_history(outbox: &Outbox) {
    let data = json!("x".repeat(2_000));
    outbox
        .transaction(|tx| {
            for _ in 0..5_000 {
                let _ = outbox.enqueue(tx, Event::new("reading", data.clone()))?;
            }
            tx.execute("UPDATE outbox_events SET delivered_at = 0", [])?;
            tx.execute_batch(RECOUNT_DELIVERED)?;
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

#[test]
fn pruning_gives_the_space_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("shrink.db")).unwrap();
    fill_delivered_history(&outbox);
    let before = file_bytes(&outbox);
    let report = outbox.prune_delivered(Duration::ZERO).unwrap();
    assert_eq!(report.deleted, 5_000);
    let after = file_bytes(&outbox);
    assert!(after < before / 10, "{before} bytes, then {after}");
}

#[test]
fn the_relays_retention_gives_the_space_back_too() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("retention-shrink.db")).unwrap();
    fill_delivered_history(&outbox);
    let before = file_bytes(&outbox);
    let receiver = common::TestReceiver::ok();
    let relay = outbox
        .relay(common::fast(RelayConfig::http(receiver.url())).retention(Some(Duration::ZERO)))
        .start()
        .unwrap();
    let shrunk = common::wait_until(common::PATIENCE, || {
        std::fs::metadata(outbox.path()).unwrap().len() < before / 10
    });
    let _ = relay.shutdown();
    assert!(shrunk, "{before} bytes, then {}", file_bytes(&outbox));
}

/// Issue 55, finding 7: an export leases, writes and marks its events page by page, each
/// page a short transaction bounded in rows and bytes. Before, one transaction leased the
/// whole bundle (here 600 rows of 20 KB, 12 MB held in memory while the app's commits
/// waited) and another marked it all: 2 transactions, one of 600 rows. Now pages of 4 MiB
/// of data (210 events of 20 KB) are leased, and marked 500 rows at a time.
#[test]
fn an_export_works_in_short_transactions_bounded_in_rows_and_bytes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // The most rows of outbox_events one transaction changed, and how many did.
    let most_rows = Arc::new(AtomicUsize::new(0));
    let transactions = Arc::new(AtomicUsize::new(0));
    let (seen, counted_transactions) = (Arc::clone(&most_rows), Arc::clone(&transactions));
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .on_connect(move |conn| {
            let rows = Arc::new(AtomicUsize::new(0));
            let (counted, committed, rolled_back) = (rows.clone(), rows.clone(), rows);
            let most = Arc::clone(&seen);
            let transactions = Arc::clone(&counted_transactions);
            conn.update_hook(Some(move |_, _: &str, table: &str, _| {
                if table == "outbox_events" {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                }
            }))?;
            conn.commit_hook(Some(move || {
                if committed.swap(0, Ordering::SeqCst) > 0 {
                    transactions.fetch_add(1, Ordering::SeqCst);
                }
                false
            }))?;
            conn.rollback_hook(Some(move || rolled_back.store(0, Ordering::SeqCst)))?;
            Ok(())
        })
        .open(dir.path().join("export.db"))
        .unwrap();
    let blob = "x".repeat(20_000);
    outbox
        .transaction(|tx| {
            for _ in 0..600 {
                let _ = outbox.enqueue(tx, Event::new("t", json!(blob)))?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    most_rows.store(0, Ordering::SeqCst);
    transactions.store(0, Ordering::SeqCst);
    let secret =
        sqlite_outbox::receive::Secret::from_bytes(*b"0123456789abcdef0123456789abcdef").unwrap();
    let path = dir.path().join("out.bundle");
    let report = outbox
        .export(&path, &secret, "default", usize::MAX)
        .unwrap();
    assert_eq!(report.count, 600);
    let bundle = sqlite_outbox::bundle::read_bundle(&path, &secret).unwrap();
    assert_eq!(bundle.events.len(), 600);
    assert_eq!(outbox.stats().unwrap().pending, 0);
    let (most, transactions) = (
        most_rows.load(Ordering::SeqCst),
        transactions.load(Ordering::SeqCst),
    );
    assert!(most <= 500, "{most} rows changed in one transaction");
    assert!(
        transactions >= 5,
        "{transactions} transactions: 3 pages leased, 2 marked"
    );
}
