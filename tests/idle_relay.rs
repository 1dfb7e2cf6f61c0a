//! An idle relay sleeps, paced or not: its threads' wake-ups, counted from /proc, are at
//! most one a second. Alone in its test binary, its tests taking turns, so no other test's
//! relay threads are counted.
#![cfg(all(target_os = "linux", feature = "wal-watch"))]

mod common;

use std::time::Duration;

use common::{fast, TestReceiver};
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// The relay's threads: the writer, the checkpointer, the workers and the WAL watcher.
const RELAY_THREADS: &[&str] = &["outbox-", "notify-rs"];

/// Held by each test while its relay runs: the wake-ups are counted over every relay
/// thread of the process, so the tests take turns.
static ONE_RELAY_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The wake-ups of the relay's threads over `idle`, by thread.
fn wake_ups_over(idle: Duration) -> Vec<(String, u64)> {
    let before = common::voluntary_switches(RELAY_THREADS);
    std::thread::sleep(idle);
    let after = common::voluntary_switches(RELAY_THREADS);
    after
        .iter()
        .map(|(k, n)| (k.1.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Delivers one event through `config`'s relay, lets what follows a delivery settle (the
/// checkpointer's look, a sweep: within a second), then holds the relay's threads to at most
/// one wake-up a second over six seconds of idleness.
fn assert_sleeps_after_one_delivery(config: RelayConfig) {
    let _turn = ONE_RELAY_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("idle.db")).unwrap();
    let relay = outbox.relay(config).start().unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", serde_json::json!({}))))
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(10), || {
        relay.stats().delivered == 1
    }));
    std::thread::sleep(Duration::from_secs(1));
    let idle = Duration::from_secs(6);
    let by_thread = wake_ups_over(idle);
    let woke: u64 = by_thread.iter().map(|(_, n)| n).sum();
    assert!(
        woke <= idle.as_secs(),
        "{woke} wake-ups in {idle:?} of idleness (at most one a second): {by_thread:?}"
    );
    assert_eq!(relay.shutdown().abandoned, 0);
}

#[test]
fn an_idle_paced_relay_sleeps_too() {
    let receiver = TestReceiver::ok();
    // One request every five seconds, a pace window of 2.5 s: after a delivery the pacer
    // lets out no whole request for a while. Before, the writer looked again on every poll
    // (here 10 ms) for as long as that lasted, with nothing pending: for ever at low rates
    // (151 wake-ups in these 6 s).
    assert_sleeps_after_one_delivery(
        fast(
            RelayConfig::new()
                .destination(Destination::http("default", receiver.url()).rate_limit(0.2)),
        )
        .lease(Duration::from_secs(10)),
    );
}

#[test]
fn an_idle_relay_wakes_at_most_once_a_second_across_its_threads() {
    let receiver = TestReceiver::ok();
    // Retention on, so its timer is part of what must not be polled. Before timers, the
    // writer and the checkpointer each woke every 100 ms: 120 in these 6 s (the test's poll
    // interval of 10 ms made it 1,200). Now the poll alone, every 5 s.
    assert_sleeps_after_one_delivery(
        fast(RelayConfig::new())
            .destination(Destination::http("default", receiver.url()))
            .retention(Some(Duration::from_secs(3600))),
    );
}
