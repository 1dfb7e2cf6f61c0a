//! Several destinations from one outbox: routing, independence, 410 and 429 per destination.

mod common;

use std::time::Duration;

use common::{closed_port, fast, wait_until, Reply, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::{Destination, Error, Event, Outbox, RelayConfig};

fn pending_by_destination(outbox: &Outbox, destination: &str) -> (i64, i64, i64) {
    outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FILTER (WHERE delivered_at IS NULL AND dead_at IS NULL),
                    COUNT(*) FILTER (WHERE delivered_at IS NOT NULL),
                    COALESCE(SUM(attempts), 0)
               FROM outbox_events WHERE destination = ?1",
            [destination],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

fn two_way(dir: &tempfile::TempDir) -> Outbox {
    Outbox::builder()
        .route("*", "billing")
        .route("*", "analytics")
        .open(dir.path().join("two.db"))
        .unwrap()
}

fn enqueue(outbox: &Outbox, n: usize) {
    for i in 0..n {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", json!(i))))
            .unwrap();
    }
}

#[test]
fn routes_send_each_event_to_every_matching_destination_and_refuse_unrouted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .route("order.*", "billing")
        .route("order.created", "crm")
        .route("user.*", "crm")
        .open(dir.path().join("routes.db"))
        .unwrap();
    let (order, user, none) = outbox
        .transaction(|tx| {
            tx.execute("CREATE TABLE audit (n INTEGER)", [])?;
            let order = outbox.enqueue(tx, Event::new("order.created", json!(1)))?;
            let user = outbox.enqueue(tx, Event::new("user.signup", json!(2)))?;
            let none = outbox.enqueue(tx, Event::new("telemetry.tick", json!(3)));
            tx.execute("INSERT INTO audit VALUES (1)", [])?;
            Ok::<_, sqlite_outbox::Error>((order, user, none))
        })
        .unwrap();
    assert!(
        matches!(none, Err(Error::NoRoute { ref event_type }) if event_type == "telemetry.tick")
    );
    let rows: Vec<(String, String)> = {
        let conn = outbox.connection().unwrap();
        let mut stmt = conn
            .prepare("SELECT event_id, destination FROM outbox_events ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(
        rows,
        vec![
            (order.event_id().to_string(), "billing".to_string()),
            (order.event_id().to_string(), "crm".to_string()),
            (user.event_id().to_string(), "crm".to_string()),
        ]
    );
}

#[test]
fn an_idempotency_key_is_a_duplicate_across_all_its_destinations() {
    // Keys are per destination: a repeat finds every destination already holding it.
    let dir = tempfile::tempdir().unwrap();
    let outbox = two_way(&dir);
    let first = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1)).idempotency_key("k")))
        .unwrap();
    let again = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1)).idempotency_key("k")))
        .unwrap();
    assert!(again.is_duplicate());
    assert_eq!(again.event_id(), first.event_id());
    assert_eq!(pending_by_destination(&outbox, "billing").0, 1);
    assert_eq!(pending_by_destination(&outbox, "analytics").0, 1);
}

#[test]
fn one_destination_down_for_the_whole_test_never_holds_back_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = two_way(&dir);
    let up = TestReceiver::ok();
    let down = format!("http://127.0.0.1:{}/events", closed_port());
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("billing", up.url()))
                .destination(Destination::http("analytics", down)),
        ))
        .start()
        .unwrap();
    enqueue(&outbox, 200);
    assert!(wait_until(PATIENCE, || up.count() == 200));
    let _ = relay.shutdown();
    assert_eq!(pending_by_destination(&outbox, "billing"), (0, 200, 200));
    let (pending, delivered, attempts) = pending_by_destination(&outbox, "analytics");
    assert_eq!(
        (pending, delivered, attempts),
        (200, 0, 0),
        "nothing spent while down"
    );
}

#[test]
fn a_slow_destination_never_holds_back_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = two_way(&dir);
    let fast_receiver = TestReceiver::ok();
    let slow = TestReceiver::start(0, |_| Reply::Hang(Duration::from_secs(3)));
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("billing", fast_receiver.url()))
                .destination(Destination::http("analytics", slow.url()))
                .shutdown_timeout(Duration::from_millis(200)),
        ))
        .start()
        .unwrap();
    enqueue(&outbox, 100);
    assert!(wait_until(PATIENCE, || fast_receiver.count() == 100));
    assert!(slow.count() <= 4);
    let _ = relay.shutdown();
}

#[test]
fn a_410_disables_only_that_destination_until_it_is_enabled_again() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = two_way(&dir);
    let gone_flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = gone_flag.clone();
    let gone = TestReceiver::start(0, move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::StatusBody(410, "endpoint deleted")
        } else {
            Reply::Status(200)
        }
    });
    let fine = TestReceiver::ok();
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("billing", fine.url()))
                .destination(Destination::http("analytics", gone.url()).workers(1)),
        ))
        .start()
        .unwrap();
    enqueue(&outbox, 50);
    assert!(wait_until(PATIENCE, || fine.count() == 50));
    assert!(wait_until(PATIENCE, || !outbox
        .disabled_destinations()
        .unwrap()
        .is_empty()));
    let disabled = outbox.disabled_destinations().unwrap();
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0].name, "analytics");
    assert!(disabled[0].reason.contains("410"), "{}", disabled[0].reason);
    // Its events wait, without spending attempts; only the requests in flight saw the 410.
    std::thread::sleep(Duration::from_millis(300));
    let requests_while_gone = gone.count();
    assert!(
        requests_while_gone <= 2,
        "{requests_while_gone} requests after 410"
    );
    let (pending, _, attempts) = pending_by_destination(&outbox, "analytics");
    assert_eq!((pending, attempts), (50, 0));

    // The endpoint is back: an operator enables it and everything drains.
    gone_flag.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(outbox.enable_destination("analytics").unwrap());
    assert!(wait_until(PATIENCE, || pending_by_destination(
        &outbox,
        "analytics"
    )
    .0 == 0));
    let _ = relay.shutdown();
    assert!(outbox.disabled_destinations().unwrap().is_empty());
}

#[test]
fn a_storm_of_429s_pauses_only_that_destination() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = two_way(&dir);
    let throttled =
        TestReceiver::start(0, |_| Reply::StatusHeader(429, "Retry-After", "60".into()));
    let fine = TestReceiver::ok();
    let relay = outbox
        .relay(fast(
            RelayConfig::new()
                .destination(Destination::http("billing", fine.url()))
                .destination(Destination::http("analytics", throttled.url()).workers(1)),
        ))
        .start()
        .unwrap();
    enqueue(&outbox, 100);
    assert!(wait_until(PATIENCE, || fine.count() == 100));
    std::thread::sleep(Duration::from_millis(300));
    let _ = relay.shutdown();
    // One request met the 429; the destination then waits out the minute.
    assert!(throttled.count() <= 2, "{} requests", throttled.count());
    let (pending, delivered, _) = pending_by_destination(&outbox, "analytics");
    assert_eq!((pending, delivered), (100, 0));
}
