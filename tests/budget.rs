//! A data budget per destination (issue 69), against receivers whose sockets are counted
//! (a forwarder in front of them counts every byte each way, as a carrier would): a
//! minute's budget held within its bound over several periods and counted within 2% of
//! what crossed the sockets, over plain HTTP and over TLS; urgent events through when it is
//! spent; a restart within a period; the forecast against a steady rate.
//!
//! The outbox's clock is a `ManualClock`: a period ends when the test moves it a minute on
//! (and wakes the relay, as a commit would), so several periods take seconds.

#[path = "common/byte_counter.rs"]
mod byte_counter;
mod common;
#[path = "common/forward_proxy.rs"]
mod forward_proxy;
#[path = "common/https_receiver.rs"]
mod https_receiver;
#[cfg(feature = "mqtt")]
#[path = "common/mosquitto.rs"]
mod mosquitto;
#[path = "common/test_ca.rs"]
mod test_ca;

use std::time::{Duration, Instant};

use byte_counter::ByteCounter;
use common::{wait_until, TestReceiver};
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::notices::DeliveryOutcome;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{BudgetStatus, Destination, Event, Outbox, RelayConfig, RelayHandle};

const T0: i64 = 1_800_000_000_000;
const MINUTE: Duration = Duration::from_secs(60);
const PATIENCE: Duration = Duration::from_secs(30);
/// What one answer may add beyond the relay's bound for it (the bound is the costliest
/// request seen so far beyond its body; these receivers' answers do not vary by more).
const ONE_ANSWER: u64 = 1_000;

fn open(dir: &tempfile::TempDir, clock: &ManualClock) -> Outbox {
    Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("budget.db"))
        .unwrap()
}

/// `n` events of about 400 bytes of data each, at `priority`.
fn enqueue(outbox: &Outbox, n: usize, priority: u8) -> Vec<String> {
    let mut conn = outbox.connection().unwrap();
    let tx = conn.transaction().unwrap();
    let ids = (0..n)
        .map(|i| {
            let data = serde_json::json!({"reading": i, "pad": "x".repeat(380)});
            outbox
                .enqueue(&tx, Event::new("meter.read", data).priority(priority))
                .unwrap()
                .event_id()
                .to_string()
        })
        .collect();
    tx.commit().unwrap();
    outbox.notify();
    ids
}

/// A receiver on 127.0.0.1 behind a byte-counting forwarder, and an outbox on a manual
/// clock at [`T0`].
struct Counted {
    receiver: TestReceiver,
    counter: ByteCounter,
    /// The receiver's URL through the forwarder.
    url: String,
    /// Kept for the outbox's file.
    _dir: tempfile::TempDir,
    clock: ManualClock,
    outbox: Outbox,
}

fn counted() -> Counted {
    let receiver = TestReceiver::ok();
    let counter = ByteCounter::start(([127, 0, 0, 1], receiver.port).into());
    let url = format!("http://127.0.0.1:{}/events", counter.port);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = open(&dir, &clock);
    Counted {
        receiver,
        counter,
        url,
        _dir: dir,
        clock,
        outbox,
    }
}

fn start(outbox: &Outbox, destination: Destination) -> RelayHandle {
    outbox
        .relay(
            RelayConfig::new()
                .destination(destination)
                .workers(2)
                .poll_interval(Duration::from_millis(50)),
        )
        .start()
        .unwrap()
}

fn budget(outbox: &Outbox) -> BudgetStatus {
    outbox
        .budget("default")
        .unwrap()
        .expect("the relay keeps a budget")
}

/// Waits until the file says the destination holds events for its budget and the bytes on
/// the sockets have stood still for a while (every request under way answered).
fn wait_until_held(outbox: &Outbox, counter: &ByteCounter) {
    assert!(
        wait_until(PATIENCE, || outbox
            .budget("default")
            .unwrap()
            .is_some_and(|b| b.holding)),
        "the destination never held events for its budget: {:?}",
        outbox.budget("default")
    );
    let mut last = counter.total();
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        let now = counter.total();
        if now != last {
            last = now;
            still_since = Instant::now();
        }
    }
    // What the last requests spent reaches the file within a second.
    std::thread::sleep(SPENDING_WRITTEN_WITHIN);
}

/// How long the relay takes at most to write what it spent to the file (its `SYNC_EVERY`,
/// and a margin).
const SPENDING_WRITTEN_WITHIN: Duration = Duration::from_millis(1_300);

fn pending_attempts(outbox: &Outbox) -> Vec<i64> {
    common::query_rows(
        outbox,
        "SELECT attempts FROM outbox_events WHERE delivered_at IS NULL AND dead_at IS NULL",
        |r| r.get(0),
    )
}

/// Three periods of a 20 KB a minute budget over `destination` (through `counter`): each
/// spends at most the budget plus one answer, most of it, and counts what crossed the
/// sockets within `accuracy` (0.02: 2%); the events left wait without spending attempts.
fn three_periods_held_and_counted(destination: Destination, counter: &ByteCounter, accuracy: f64) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = open(&dir, &clock);
    let notices = outbox.subscribe();
    enqueue(&outbox, 200, Event::DEFAULT_PRIORITY);
    let limit = 20_000;
    let relay = start(&outbox, destination.budget(limit, MINUTE));
    let mut delivered_before = 0;
    for period in 0..3 {
        let before = counter.total();
        wait_until_held(&outbox, counter);
        let crossed = counter.total() - before;
        let status = budget(&outbox);
        assert!(
            crossed <= limit + ONE_ANSWER,
            "period {period}: {crossed} bytes crossed the sockets, over the budget of {limit} \
             and one answer"
        );
        assert!(
            crossed >= limit / 2,
            "period {period}: only {crossed} of {limit} bytes spent ({status:?})"
        );
        let off = status.used_bytes.abs_diff(crossed) as f64 / crossed as f64;
        assert!(
            off <= accuracy,
            "period {period}: the relay counted {} bytes, the sockets carried {crossed} ({:.1}% off)",
            status.used_bytes,
            off * 100.0
        );
        let delivered = outbox.stats().unwrap().delivered;
        assert!(
            delivered > delivered_before,
            "period {period} delivered nothing"
        );
        delivered_before = delivered;
        assert!(
            pending_attempts(&outbox).iter().all(|a| *a == 0),
            "held events spent attempts: {:?}",
            pending_attempts(&outbox)
        );
        assert_eq!(status.period_started, T0 + period * 60_000);
        assert_eq!(status.period_ends, T0 + (period + 1) * 60_000);
        // The next period: the budget is whole again, and the relay, woken, sends.
        clock.advance_ms(60_000);
        outbox.notify();
    }
    drop(relay);
    let said: Vec<DeliveryOutcome> = notices
        .try_iter()
        .filter(|n| n.event_id.is_empty())
        .map(|n| n.outcome)
        .collect();
    assert_eq!(
        said[..4],
        [
            DeliveryOutcome::BudgetSpent {
                period_ends_ms: T0 + 60_000
            },
            DeliveryOutcome::BudgetRenewed,
            DeliveryOutcome::BudgetSpent {
                period_ends_ms: T0 + 120_000
            },
            DeliveryOutcome::BudgetRenewed,
        ],
        "{said:?}"
    );
}

#[test]
fn a_minutes_budget_holds_over_several_periods_counted_as_the_sockets_carry_it() {
    let receiver = TestReceiver::ok();
    let counter = ByteCounter::start(([127, 0, 0, 1], receiver.port).into());
    let url = format!("http://127.0.0.1:{}/events", counter.port);
    three_periods_held_and_counted(Destination::http("default", url), &counter, 0.02);
}

#[test]
fn over_tls_the_handshakes_and_records_count_too() {
    let ca = test_ca::TestCa::new("budget test CA");
    let server = ca.server();
    let receiver = https_receiver::HttpsReceiver::start(&server, None);
    let counter = ByteCounter::start(receiver.addr);
    let url = format!("https://127.0.0.1:{}/events", counter.port);
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    let destination = Destination::http("default", url).http_config(HttpConfig::new().ca_pem(pem));
    three_periods_held_and_counted(destination, &counter, 0.02);
    assert!(receiver.received() > 0);
}

#[test]
fn through_a_proxy_the_connect_and_the_tunnel_count_too() {
    let ca = test_ca::TestCa::new("budget test CA");
    let server = ca.server();
    let receiver = https_receiver::HttpsReceiver::start(&server, None);
    let proxy = forward_proxy::ForwardProxy::start(None);
    // The counter stands where the device's uplink would: between the relay and the proxy.
    let counter = ByteCounter::start(proxy.addr);
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    let http = HttpConfig::new()
        .ca_pem(pem)
        .proxy(format!("http://127.0.0.1:{}", counter.port));
    let destination = Destination::http("default", receiver.url()).http_config(http);
    three_periods_held_and_counted(destination, &counter, 0.02);
    assert!(
        proxy
            .state
            .tunnels
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
}

/// MQTT's bytes are counted from its packets (the connection's own packets and PINGs are
/// not): the budget holds all the same, and the count is within 2% of the sockets.
#[cfg(feature = "mqtt")]
#[test]
fn over_mqtt_the_packets_and_acknowledgements_count() {
    let broker = mosquitto::Mosquitto::start();
    let counter = ByteCounter::start(([127, 0, 0, 1], broker.port).into());
    let url = format!("mqtt://127.0.0.1:{}", counter.port);
    three_periods_held_and_counted(Destination::mqtt("default", url), &counter, 0.02);
}

#[test]
fn urgent_events_go_when_the_budget_is_spent_and_the_rest_wait_without_attempts() {
    let c = counted();
    enqueue(&c.outbox, 60, Event::DEFAULT_PRIORITY);
    let destination = Destination::http("default", c.url)
        .budget(8_000, MINUTE)
        .budget_exempt_priority(8);
    let _relay = start(&c.outbox, destination);
    wait_until_held(&c.outbox, &c.counter);
    let pending = c.outbox.stats().unwrap().pending;
    assert!(pending > 0);
    let alarms = enqueue(&c.outbox, 3, 9);
    assert!(
        wait_until(PATIENCE, || {
            let got = c.receiver.event_ids();
            alarms.iter().all(|a| got.contains(a))
        }),
        "the urgent events were not delivered with the budget spent"
    );
    // They went beyond the budget, and were counted.
    let status = budget(&c.outbox);
    assert!(status.holding);
    std::thread::sleep(SPENDING_WRITTEN_WITHIN);
    assert_eq!(
        c.outbox.stats().unwrap().pending,
        pending,
        "held events went too"
    );
    assert!(pending_attempts(&c.outbox).iter().all(|a| *a == 0));
    assert!(
        budget(&c.outbox).used_bytes.abs_diff(c.counter.total()) as f64 / c.counter.total() as f64
            <= 0.02
    );
}

#[test]
fn a_relay_restarted_within_the_period_spends_on_from_what_was_spent() {
    let c = counted();
    enqueue(&c.outbox, 100, Event::DEFAULT_PRIORITY);
    let destination = Destination::http("default", c.url).budget(10_000, MINUTE);
    let relay = start(&c.outbox, destination.clone());
    wait_until_held(&c.outbox, &c.counter);
    drop(relay);
    let spent = budget(&c.outbox).used_bytes;
    let crossed = c.counter.total();
    // Half a minute later, a new relay: the same period, already spent.
    c.clock.advance_ms(30_000);
    let _relay = start(&c.outbox, destination);
    c.outbox.notify();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        c.counter.total(),
        crossed,
        "the restarted relay spent afresh"
    );
    assert_eq!(budget(&c.outbox).used_bytes, spent);
    assert_eq!(budget(&c.outbox).period_started, T0);
    // The period ends: it sends again.
    c.clock.advance_ms(30_000);
    c.outbox.notify();
    assert!(wait_until(PATIENCE, || c.counter.total() > crossed));
}

#[test]
fn deliver_pending_spends_the_same_budget() {
    let c = counted();
    enqueue(&c.outbox, 40, Event::DEFAULT_PRIORITY);
    let config =
        RelayConfig::new().destination(Destination::http("default", c.url).budget(6_000, MINUTE));
    let report = c
        .outbox
        .deliver_pending(config.clone(), Instant::now() + Duration::from_secs(2))
        .unwrap();
    assert_eq!(report.ended, sqlite_outbox::DrainEnd::Deadline);
    assert!(report.delivered > 0 && report.pending > 0, "{report:?}");
    let spent = budget(&c.outbox).used_bytes;
    assert!(
        spent <= 6_000 && spent == c.counter.total(),
        "{spent} of {}",
        c.counter.total()
    );
    // A second drain in the same period sends nothing more.
    let again = c
        .outbox
        .deliver_pending(config, Instant::now() + Duration::from_secs(1))
        .unwrap();
    assert_eq!(again.delivered, 0);
    assert_eq!(c.counter.total(), spent);
}

#[test]
fn the_forecast_is_when_a_steady_rate_spends_the_rest() {
    let receiver = TestReceiver::ok();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let outbox = open(&dir, &clock);
    let limit = 1_000_000;
    let relay = start(
        &outbox,
        Destination::http("default", receiver.url()).budget(limit, Duration::from_secs(86_400)),
    );
    // Ten seconds at a steady rate: a batch of events each second.
    for _ in 0..10 {
        enqueue(&outbox, 5, Event::DEFAULT_PRIORITY);
        assert!(common::all_delivered_within(&outbox, PATIENCE));
        assert!(wait_until(PATIENCE, || {
            let s = outbox.stats().unwrap();
            s.in_flight == 0
        }));
        clock.advance_ms(1_000);
    }
    // A relay that stops writes what it spent.
    drop(relay);
    let status = budget(&outbox);
    let used = status.used_bytes;
    assert!(used > 0);
    let now = T0 + 10_000;
    let expected = now + ((limit - used) as f64 / (used as f64 / 10_000.0)) as i64;
    if expected < status.period_ends {
        let forecast = status.forecast.expect("a forecast within the day");
        assert!(
            forecast.abs_diff(expected) <= 1,
            "forecast {forecast}, expected {expected}"
        );
    } else {
        assert_eq!(status.forecast, None, "the day ends before the budget does");
    }
}
