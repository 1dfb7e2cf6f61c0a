//! A destination that refuses a stream's accounting (4xx: a receiver's bound, a malformed
//! report) is told again every round, but the refusal is said once as a warning, not every
//! round; once the destination takes an accounting again, a new refusal is said again
//! (issue 65: hostile and refused accountings are never silent, and never a flood).

#[path = "common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_server::{HttpServer, Response};
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// The warnings logged in this test binary (its only test installs the logger).
struct Warnings(Mutex<Vec<String>>);

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static WARNINGS: Warnings = Warnings(Mutex::new(Vec::new()));

fn refusal_warnings() -> usize {
    WARNINGS
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains("accounting of") && w.contains("was refused (422)"))
        .count()
}

/// Waits until `done` holds, at most 20 s (a bound that proves nothing hangs).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_refused_accounting_is_warned_once_until_one_is_taken_again() {
    log::set_logger(&WARNINGS).unwrap();
    log::set_max_level(log::LevelFilter::Warn);

    let refuse = Arc::new(AtomicBool::new(true));
    let refused = Arc::new(AtomicUsize::new(0));
    let taken = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let (refuse, refused, taken) = (refuse.clone(), refused.clone(), taken.clone());
        HttpServer::bind("127.0.0.1:0", move |request| {
            if !request.is_stream_accounting() {
                return Response::status(204);
            }
            if refuse.load(Ordering::SeqCst) {
                refused.fetch_add(1, Ordering::SeqCst);
                Response::status(422)
            } else {
                taken.fetch_add(1, Ordering::SeqCst);
                Response::status(204)
            }
        })
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let enqueue = |n: u32| {
        outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("order.placed", json!({"n": n}))))
            .unwrap()
    };
    let _ = enqueue(1);
    let url = format!("http://{}/events", receiver.addr());
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(Destination::http("default", &url).accounting(true))
                .accounting_interval(Duration::from_secs(1)),
        )
        .start()
        .unwrap();

    // Refused round after round: told again each time, warned once.
    wait_until("three refused accountings", || {
        refused.load(Ordering::SeqCst) >= 3
    });
    assert_eq!(refusal_warnings(), 1, "{:?}", WARNINGS.0.lock().unwrap());

    // Taken once, then refused again: a new refusal is worth a new warning.
    refuse.store(false, Ordering::SeqCst);
    wait_until("an accounting taken", || taken.load(Ordering::SeqCst) >= 1);
    let refused_before = refused.load(Ordering::SeqCst);
    refuse.store(true, Ordering::SeqCst);
    // A new event: the stream's state changed, so it is told again.
    let _ = enqueue(2);
    wait_until("two more refusals", || {
        refused.load(Ordering::SeqCst) >= refused_before + 2
    });
    assert_eq!(refusal_warnings(), 2, "{:?}", WARNINGS.0.lock().unwrap());

    let _ = relay.shutdown();
    receiver.stop();
}
