//! The relay's decisions, driven through a fake transport (no network needed).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{rows, wait_until, PATIENCE};
use serde_json::json;
use sqlite_outbox::clock::ManualClock;
use sqlite_outbox::transport::{Attempt, OutboundEvent};
use sqlite_outbox::{Event, Outbox, RelayConfig};

fn one_event(outbox: &Outbox) {
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!({"n": 1}))))
        .unwrap();
}

fn quick(config: RelayConfig) -> RelayConfig {
    config
        .poll_interval(Duration::from_millis(10))
        .retry_backoff(Duration::from_millis(5), Duration::from_millis(20))
}

#[test]
fn a_panicking_transport_spends_an_attempt_and_the_event_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("panic.db")).unwrap();
    one_event(&outbox);
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let relay = outbox
        .relay(quick(RelayConfig::transport(
            move |_: &[OutboundEvent]| {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("transport bug");
                }
                Attempt::Answered {
                    status: 200,
                    retry_after: None,
                    detail: String::new(),
                }
            },
        )))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].delivered));
    let _ = relay.shutdown();
    let row = rows(&outbox).remove(0);
    assert_eq!(row.attempts, 2);
    assert_eq!(
        row.last_error.as_deref(),
        Some("transport panicked: transport bug")
    );
}

#[test]
fn an_unsendable_event_is_dead_lettered_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("unsendable.db")).unwrap();
    one_event(&outbox);
    let relay = outbox
        .relay(quick(RelayConfig::transport(|_: &[OutboundEvent]| {
            Attempt::Unsendable {
                reason: "stored data is not valid JSON".into(),
            }
        })))
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].dead));
    let _ = relay.shutdown();
    assert_eq!(
        rows(&outbox)[0].last_error.as_deref(),
        Some("stored data is not valid JSON")
    );
}

#[test]
fn an_enormous_retry_after_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let start = 1_700_000_000_000;
    let outbox = Outbox::builder()
        .clock(ManualClock::new(start))
        .open(dir.path().join("cap.db"))
        .unwrap();
    one_event(&outbox);
    let relay = outbox
        .relay(
            quick(RelayConfig::transport(|_: &[OutboundEvent]| {
                Attempt::Answered {
                    status: 503,
                    retry_after: Some(Duration::from_secs(u64::MAX)),
                    detail: "HTTP 503".into(),
                }
            }))
            .retry_after_cap(Duration::from_secs(60)),
        )
        .start()
        .unwrap();
    assert!(wait_until(PATIENCE, || rows(&outbox)[0].attempts == 1));
    let _ = relay.shutdown();
    let row = rows(&outbox).remove(0);
    assert_eq!(row.available_at, start + 60_000);
    assert!(!row.dead);
}

#[test]
fn an_unreachable_destination_never_dead_letters_however_long_it_lasts() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let outbox = Outbox::builder()
        .clock(clock.clone())
        .open(dir.path().join("week.db"))
        .unwrap();
    for _ in 0..5 {
        one_event(&outbox);
    }
    let calls = Arc::new(AtomicUsize::new(0));
    // The most requests in flight at once.
    let (active, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (seen, now_active, peak) = (calls.clone(), active.clone(), most.clone());
    let relay = outbox
        .relay(
            quick(RelayConfig::transport(move |_: &[OutboundEvent]| {
                seen.fetch_add(1, Ordering::SeqCst);
                let n = now_active.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                now_active.fetch_sub(1, Ordering::SeqCst);
                Attempt::Unreachable {
                    reason: "connection refused".into(),
                }
            }))
            // The offline windows run on real (monotonic) time: short ones here.
            .offline_backoff(Duration::from_millis(10), Duration::from_millis(40))
            .max_attempts(1),
        )
        .start()
        .unwrap();
    // A simulated week on the wall clock, in 60 steps; the destination is probed all along.
    let mut probed_steps = 0;
    for step in 0..60 {
        if step == 1 {
            // The first claim went out whole; from now on the destination is suspect. Its
            // requests may still be running on a loaded machine: the peak is reset only once
            // none is and every event of that claim was handed back (no lease held), so a
            // late one of them is not counted as a second probe.
            assert!(wait_until(Duration::from_secs(10), || {
                active.load(Ordering::SeqCst) == 0 && outbox.stats().is_ok_and(|s| s.in_flight == 0)
            }));
            most.store(0, Ordering::SeqCst);
        }
        let before = calls.load(Ordering::SeqCst);
        clock.advance_ms(7 * 24 * 3600 * 1000 / 60);
        if wait_until(Duration::from_secs(2), || {
            calls.load(Ordering::SeqCst) > before
        }) {
            probed_steps += 1;
        }
    }
    let _ = relay.shutdown();
    assert!(
        probed_steps >= 50,
        "probed in only {probed_steps} of 60 steps"
    );
    // One probe at a time, never the whole backlog.
    assert_eq!(most.load(Ordering::SeqCst), 1);
    assert!(rows(&outbox).iter().all(|r| !r.dead && r.attempts == 0));
}

/// A clock that panics once, on the `n`th reading from the relay's writer thread.
#[derive(Clone)]
struct PanicsInTheWriter {
    readings: Arc<AtomicUsize>,
    at: usize,
}

impl sqlite_outbox::clock::Clock for PanicsInTheWriter {
    fn now_ms(&self) -> i64 {
        if std::thread::current().name() == Some("outbox-relay")
            && self.readings.fetch_add(1, Ordering::SeqCst) + 1 == self.at
        {
            panic!("a bug in the writer");
        }
        sqlite_outbox::clock::SystemClock.now_ms()
    }
}

/// A clock that panics once, on the first reading from the relay's writer thread after
/// `armed` is set: the transport sets it, so the writer is then most likely about to record
/// that delivery's outcome (its poll ticks are seconds apart here).
#[derive(Clone)]
struct PanicsWhenArmed {
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl sqlite_outbox::clock::Clock for PanicsWhenArmed {
    fn now_ms(&self) -> i64 {
        if std::thread::current().name() == Some("outbox-relay")
            && self.armed.swap(false, Ordering::SeqCst)
        {
            panic!("a bug in the writer, with an outcome in hand");
        }
        sqlite_outbox::clock::SystemClock.now_ms()
    }
}

#[test]
fn outcomes_lost_in_a_writer_panic_leave_the_in_flight_count() {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outbox = Outbox::builder()
        .clock(PanicsWhenArmed {
            armed: armed.clone(),
        })
        .open(dir.path().join("writer-panic-in-flight.db"))
        .unwrap();
    let arm = armed.clone();
    let relay = outbox
        .relay(
            RelayConfig::transport(move |_: &[OutboundEvent]| {
                arm.store(true, Ordering::SeqCst);
                Attempt::Answered {
                    status: 204,
                    retry_after: None,
                    detail: String::new(),
                }
            })
            // Ticks seconds apart, so the writer's next clock reading after the send is the
            // one that records its outcome; a lease that outlives the test, so the event
            // is not claimed again and its outcome stays lost.
            .poll_interval(Duration::from_secs(5))
            .lease(Duration::from_secs(600))
            .shutdown_timeout(Duration::from_secs(3)),
        )
        .start()
        .unwrap();
    one_event(&outbox);
    assert!(
        wait_until(PATIENCE, || relay.stats().writer_restarts == 1),
        "the writer never panicked"
    );
    let row = &rows(&outbox)[0];
    assert!(
        !row.delivered,
        "the panic did not hit the outcome (it was recorded): the test proves nothing; {row:?}"
    );
    let report = relay.shutdown();
    // The lost outcome's event left the in-flight count: nothing is running, so shutdown
    // has nothing to wait for or abandon (before the fix: 1 abandoned).
    assert_eq!(report.abandoned, 0, "{report:?}");
    assert_eq!(report.writer_restarts, 1);
}

#[test]
fn a_panic_in_the_writer_is_caught_reported_and_the_writer_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = PanicsInTheWriter {
        readings: Arc::new(AtomicUsize::new(0)),
        at: 30,
    };
    let outbox = Outbox::builder()
        .clock(clock)
        .open(dir.path().join("writer-panic.db"))
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let relay = outbox
        .relay(
            quick(RelayConfig::transport(move |_: &[OutboundEvent]| {
                seen.fetch_add(1, Ordering::SeqCst);
                Attempt::Answered {
                    status: 204,
                    retry_after: None,
                    detail: String::new(),
                }
            }))
            // An outcome the writer held when it panicked is lost; its lease expires and the
            // event is delivered again: a short lease keeps that within the test's patience.
            .lease(Duration::from_secs(2)),
        )
        .start()
        .unwrap();
    // Events keep coming while the writer panics and starts again.
    for _ in 0..20 {
        one_event(&outbox);
        std::thread::sleep(Duration::from_millis(10));
    }
    let delivered = wait_until(PATIENCE, || {
        rows(&outbox).iter().filter(|r| r.delivered).count() == 20
    });
    assert!(relay.is_running());
    let stats = relay.stats();
    let report = relay.shutdown();
    assert!(delivered, "{:?}", rows(&outbox));
    assert_eq!(stats.writer_restarts, 1);
    assert_eq!(report.writer_restarts, 1);
}
