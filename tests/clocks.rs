//! Clocks that lie: set a day ahead and then back, jumping while the relay runs, skewed
//! against the receiver's. Time comes from an injected clock here, and from `faketime` for
//! the CLI in `clocks_cli.rs`.

mod common;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sqlite_outbox::clock::{Clock, SystemClock};
use sqlite_outbox::transport::{Attempt, OutboundEvent};
use sqlite_outbox::{Event, Outbox, RelayConfig};

const DAY_MS: i64 = 86_400_000;

/// The system clock plus an offset that a test can change at any moment: a clock that
/// ticks, and jumps when NTP (or a user) sets it.
#[derive(Clone, Default)]
struct JumpingClock {
    offset_ms: Arc<AtomicI64>,
}

impl JumpingClock {
    fn ahead_by(ms: i64) -> Self {
        let clock = JumpingClock::default();
        clock.offset_ms.store(ms, Ordering::SeqCst);
        clock
    }

    fn set_right(&self) {
        self.offset_ms.store(0, Ordering::SeqCst);
    }
}

impl Clock for JumpingClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

fn enqueue_n(outbox: &Outbox, n: usize) {
    for i in 0..n {
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!(i))))
            .unwrap();
    }
}

/// A transport whose first attempt fails and asks for 2 s (a jittered backoff could be near
/// zero, and the retry could then come before a test jumps the clock), retried 2 s later on
/// the clock of then; every later one is delivered. `calls` counts them.
fn fails_once_then_delivers(
    calls: Arc<AtomicUsize>,
) -> impl Fn(&[OutboundEvent]) -> Attempt + Send + Sync + 'static {
    move |_: &[OutboundEvent]| {
        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
        let (status, retry_after) = if first {
            (503, Some(Duration::from_secs(2)))
        } else {
            (204, None)
        };
        Attempt::Answered {
            status,
            retry_after,
            detail: format!("HTTP {status}"),
        }
    }
}

fn quick(config: RelayConfig) -> RelayConfig {
    config
        .poll_interval(Duration::from_millis(10))
        .retry_backoff(Duration::from_millis(50), Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(5))
}

#[test]
fn events_committed_while_the_clock_was_a_day_ahead_go_out_once_it_is_set_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::ahead_by(DAY_MS);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("ahead.db"))
        .unwrap();
    enqueue_n(&outbox, 3);
    // NTP sets the clock right before the relay starts.
    clock.set_right();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(quick(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let delivered = wait_until(PATIENCE, || receiver.count() == 3);
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
}

#[test]
fn a_retry_scheduled_before_the_clock_jumped_back_a_day_comes_after_its_backoff_not_a_day() {
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::ahead_by(DAY_MS);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("jump.db"))
        .unwrap();
    enqueue_n(&outbox, 1);
    let calls = Arc::new(AtomicUsize::new(0));
    let relay = outbox
        .relay(quick(RelayConfig::transport(fails_once_then_delivers(
            calls.clone(),
        ))))
        .start()
        .unwrap();
    assert!(
        wait_until(PATIENCE, || rows(&outbox)[0].attempts == 1),
        "{:?}, {} calls",
        rows(&outbox),
        calls.load(Ordering::SeqCst)
    );
    // The clock jumps back a day while the relay runs.
    clock.set_right();
    let delivered = wait_until(Duration::from_secs(15), || rows(&outbox)[0].delivered);
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_lease_left_by_a_relay_whose_clock_was_a_day_ahead_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("lease.db")).unwrap();
    enqueue_n(&outbox, 2);
    outbox
        .connection()
        .unwrap()
        .execute(
            "UPDATE outbox_events SET lease_owner = 'crashed-relay', lease_expires_at = ?1 + 60000,
                                      leased_at = ?1",
            [SystemClock.now_ms() + DAY_MS],
        )
        .unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(quick(RelayConfig::http(receiver.url())).lease(Duration::from_secs(30)))
        .start()
        .unwrap();
    let delivered = wait_until(PATIENCE, || receiver.count() == 2);
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
}

#[test]
fn a_device_ten_minutes_off_the_receivers_clock_corrects_from_its_date_header_and_dead_letters_nothing(
) {
    use sqlite_outbox::receive::{verify_request, Secret, Verifier};
    use sqlite_outbox::Destination;
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("skew.db")).unwrap();
    enqueue_n(&outbox, 30);
    // The receiver's clock is 10 minutes ahead of this device's: it checks signatures
    // against its own time (5 minute tolerance) and says its time in every answer.
    let skew = Duration::from_secs(600);
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    let receiver = TestReceiver::start(0, move |r| {
        let its_now = std::time::SystemTime::now() + skew;
        let secs = unix_secs(its_now);
        let status = match verify_request(&verifier, &r.header_pairs(), &r.raw, secs) {
            Ok(_) => 204,
            Err(_) => 401,
        };
        Reply::StatusAt(status, its_now)
    });
    let relay =
        outbox
            .relay(quick(RelayConfig::new()).destination(
                Destination::http(Destination::DEFAULT, receiver.url()).secret(SECRET),
            ))
            .start()
            .unwrap();
    let delivered = wait_until(PATIENCE, || delivered_count(&outbox) == 30);
    let stats = relay.stats();
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
    assert!(rows(&outbox).iter().all(|r| !r.dead));
    let offset = stats.clock_offset_ms.expect("an offset estimate");
    assert!((598_000..=602_000).contains(&offset), "{offset}");
}

#[test]
fn a_retry_after_date_is_read_on_the_receivers_clock_not_the_devices() {
    // The receiver's clock is 10 minutes ahead of the device's. Its first answer is 503 with
    // a Retry-After two seconds after its own now, as an HTTP date; then 200. Read against
    // the device's clock, that date was 602 s away and held the event as long.
    let answers = Arc::new(AtomicUsize::new(0));
    let counted = answers.clone();
    let server = HttpServer::bind(("127.0.0.1", 0), move |_| {
        let its_now = std::time::SystemTime::now() + Duration::from_secs(600);
        let date = httpdate::fmt_http_date(its_now);
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            let retry_at = httpdate::fmt_http_date(its_now + Duration::from_secs(2));
            Response::status(503)
                .header("date", date)
                .header("retry-after", retry_at)
        } else {
            Response::status(200).header("date", date)
        }
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("retry-after.db")).unwrap();
    enqueue_n(&outbox, 1);
    let url = format!("http://127.0.0.1:{}/events", server.port());
    let relay = outbox.relay(quick(RelayConfig::http(url))).start().unwrap();
    let delivered = wait_until(Duration::from_secs(20), || delivered_count(&outbox) == 1);
    let _ = relay.shutdown();
    server.stop();
    assert!(
        delivered,
        "the retry waited for the device's clock to reach the receiver's date ({} answers)",
        answers.load(Ordering::SeqCst)
    );
}

/// Settings that put four events in flight at once, each on a lease of 30 s.
fn all_four_at_once(receiver: &TestReceiver) -> RelayConfig {
    quick(RelayConfig::http(receiver.url()))
        .workers(8)
        .max_in_flight(8)
        .lease(Duration::from_secs(30))
}

/// Four events held in flight by a receiver that answers after `HOLD`, while the wall clock
/// is stepped by `step_ms` once all four have arrived: the relay must not take its own
/// in-flight events for expired leases (or leases taken "in the future") and send them again.
fn in_flight_events_survive_a_clock_step(step_ms: i64) {
    const HOLD: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::default();
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("step.db"))
        .unwrap();
    enqueue_n(&outbox, 4);
    let receiver = TestReceiver::start(0, |_| Reply::Hang(HOLD));
    let relay = outbox.relay(all_four_at_once(&receiver)).start().unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 4));
    clock.offset_ms.store(step_ms, Ordering::SeqCst);
    let delivered = wait_until(PATIENCE, || delivered_count(&outbox) == 4);
    // Time for any second claim to reach the receiver.
    std::thread::sleep(Duration::from_millis(500));
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
    assert_eq!(
        receiver.count(),
        4,
        "each in-flight event sent once: {:?}",
        receiver.event_ids()
    );
}

#[test]
fn a_clock_stepped_forward_past_the_lease_does_not_send_in_flight_events_twice() {
    in_flight_events_survive_a_clock_step(10 * 60_000);
}

#[test]
fn a_clock_stepped_back_does_not_send_in_flight_events_twice() {
    in_flight_events_survive_a_clock_step(-10 * 60_000);
}

#[test]
fn a_coalescing_enqueue_after_a_clock_step_does_not_replace_the_event_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::default();
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("coalesce.db"))
        .unwrap();
    let step = |n: i64| {
        Event::new("position", serde_json::json!({ "step": n }))
            .coalesce_key("robot-1")
            .partition_key("robot-1")
    };
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, step(1)))
        .unwrap();
    let receiver = TestReceiver::start(0, |_| Reply::Hang(Duration::from_secs(2)));
    let relay = outbox
        .relay(quick(RelayConfig::http(receiver.url())).lease(Duration::from_secs(30)))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    clock.offset_ms.store(10 * 60_000, Ordering::SeqCst);
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, step(2)))
        .unwrap();
    let pending: i64 = query_rows(&outbox, "SELECT count(*) FROM outbox_events", |r| r.get(0))
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(
        pending,
        2,
        "the head in flight was replaced: {:?}",
        rows(&outbox)
    );
    let delivered = wait_until(PATIENCE, || delivered_count(&outbox) == 2);
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
    let steps: Vec<i64> = receiver
        .received()
        .iter()
        .map(|r| r.body["data"]["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2], "in commit order, each once");
}

#[test]
fn a_clock_set_back_while_the_app_holds_the_write_lock_is_followed_once_the_lock_is_free() {
    // Issue 67, item 2: the clock is set back a day while the app holds the write lock past
    // the busy timeout (a migration at boot); the relay's re-anchoring fails. Before, the
    // jump was spent all the same and never followed: a retry scheduled on the clock of
    // before stayed a day away (0 of 5 delivered 30 s later). Now it is tried again.
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::ahead_by(DAY_MS);
    let path = dir.path().join("locked.db");
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .busy_timeout(Duration::from_millis(300))
        .open(&path)
        .unwrap();
    for i in 0..5 {
        let _ = outbox
            .transaction(|tx| {
                outbox.enqueue(tx, Event::new("t", serde_json::json!(i)).partition_key("k"))
            })
            .unwrap();
    }
    // The head of the key is answered 503 once (a retry 2 s later on the clock of then, a
    // day ahead); everything after goes through.
    let relay = outbox
        .relay(quick(RelayConfig::transport(fails_once_then_delivers(
            Arc::new(AtomicUsize::new(0)),
        ))))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].attempts == 1));
    // The app takes the write lock and holds it while NTP sets the clock back a day.
    let mut app = sqlite_outbox::rusqlite::Connection::open(&path).unwrap();
    let hold = app
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    clock.set_right();
    // Longer than the 5 s between an idle relay's looks: it sees the step while the lock
    // is held (with 3 s, 5 runs of 6 passed before the fix, the look falling after).
    std::thread::sleep(Duration::from_secs(6));
    hold.rollback().unwrap();
    let delivered = wait_until(Duration::from_secs(15), || {
        rows(&outbox).iter().all(|r| r.delivered)
    });
    let _ = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
}

#[test]
fn events_queued_a_week_behind_survive_ntp_stepping_the_clock_forward() {
    // Issue 67, item 3: a device without a real-time clock boots a week behind and queues
    // events that expire in an hour; the receiver is down; NTP steps the clock forward a
    // week. Before, the relay saw the step and expired all 5 (0 received): the deadlines
    // were an hour after a time a week ago. Now they move with the step (measured against
    // the time since boot, which a suspend moves and a step does not).
    let dir = tempfile::tempdir().unwrap();
    let clock = JumpingClock::ahead_by(-7 * DAY_MS);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("behind.db"))
        .unwrap();
    for i in 0..5 {
        let _ = outbox
            .transaction(|tx| {
                let event =
                    Event::new("t", serde_json::json!(i)).expires_in(Duration::from_secs(3600));
                outbox.enqueue(tx, event)
            })
            .unwrap();
    }
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let receiver = {
        let up = up.clone();
        TestReceiver::start(0, move |_| {
            Reply::Status(if up.load(Ordering::SeqCst) { 200 } else { 503 })
        })
    };
    let relay = outbox
        .relay(quick(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let tried = |n| {
        wait_until(PATIENCE, || {
            receiver
                .event_ids()
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                == n
        })
    };
    assert!(tried(5), "each tried once while the receiver is down");
    clock.set_right();
    // Several polls and expiry sweeps on the new clock before the receiver comes back.
    std::thread::sleep(Duration::from_secs(2));
    up.store(true, Ordering::SeqCst);
    let delivered = wait_until(PATIENCE, || delivered_count(&outbox) == 5);
    let _ = relay.shutdown();
    let expired: Vec<_> = rows(&outbox).into_iter().filter(|r| r.dead).collect();
    assert!(expired.is_empty(), "expired by the step: {expired:?}");
    assert!(delivered, "{:?}", rows(&outbox));
}

/// Two relays on one file (a service and a second one, as `deliver_pending` in the app's
/// process): four events in flight by the first, held by the receiver, when the wall clock
/// steps by `step_ms`; the second, polling often, must not take the first's leases for
/// expired (a step forward) or taken in the future (a step back) before their owner moves
/// them. The first polls once a minute while requests are out, so only the second sees the
/// step while they are held (an idle relay looks at least every 5 s: the hold is longer).
fn another_relays_in_flight_events_survive_a_clock_step(step_ms: i64) {
    const HOLD: Duration = Duration::from_secs(8);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.db");
    let clock = JumpingClock::default();
    let open = || Outbox::builder().clock(clock.clone()).open(&path).unwrap();
    let (service, app) = (open(), open());
    enqueue_n(&service, 4);
    let receiver = TestReceiver::start(0, |_| Reply::Hang(HOLD));
    let first = service
        .relay(all_four_at_once(&receiver).poll_interval(Duration::from_secs(60)))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || receiver.count() == 4));
    let second = app
        .relay(quick(RelayConfig::http(receiver.url())).lease(Duration::from_secs(30)))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    clock.offset_ms.store(step_ms, Ordering::SeqCst);
    let delivered = wait_until(PATIENCE, || delivered_count(&service) == 4);
    // Time for any second claim to reach the receiver.
    std::thread::sleep(Duration::from_millis(500));
    let _ = second.shutdown();
    let _ = first.shutdown();
    assert!(delivered, "{:?}", rows(&service));
    assert_eq!(
        receiver.count(),
        4,
        "each in-flight event sent once: {:?}",
        receiver.event_ids()
    );
}

#[test]
fn a_clock_stepped_back_does_not_let_another_relay_send_in_flight_events_twice() {
    // Issue 67, item 11: before, the second relay took the first's leases for taken in
    // the future and sent all four again.
    another_relays_in_flight_events_survive_a_clock_step(-3_600_000);
}

#[test]
fn a_clock_stepped_forward_does_not_let_another_relay_send_in_flight_events_twice() {
    another_relays_in_flight_events_survive_a_clock_step(3_600_000);
}
