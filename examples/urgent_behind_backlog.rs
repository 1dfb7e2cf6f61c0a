//! The app's worst commit while a relay comes back to a big backlog committed offline (not
//! numbered yet), with and without an urgent event behind it (issue 65, item 6). The relay
//! claims the urgent event first; before the relay numbered in steps, that one claim
//! numbered the whole backlog under the write lock and held the app's commits for seconds.
//! An app thread commits one event every 5 ms through the measured window; this prints its
//! slowest commit and 99.9th percentile in each case, and their ratio (target: at most 2×).
//!
//! ```text
//! cargo run --release --example urgent_behind_backlog            # a backlog of 1,000,000
//! cargo run --release --example urgent_behind_backlog -- 200000
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// How long the app's commits are watched after the relay starts.
const WINDOW: Duration = Duration::from_secs(8);

fn backlog_file(dir: &std::path::Path, backlog: usize, urgent: bool) -> Outbox {
    let outbox = Outbox::open(dir.join(format!("urgent-{urgent}.db"))).expect("the file");
    for chunk in 0..backlog.div_ceil(10_000) {
        let events: Vec<Event> = (0..10_000.min(backlog - chunk * 10_000))
            .map(|i| Event::new("telemetry.temp", json!({"i": chunk * 10_000 + i})))
            .collect();
        outbox
            .transaction(|tx| outbox.enqueue_many(tx, events))
            .expect("the backlog");
    }
    if urgent {
        let alarm =
            Event::new("alarm.raised", json!({"door": "open"})).priority(Event::URGENT_PRIORITY);
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, alarm))
            .expect("the urgent event");
    }
    outbox
}

/// The app's commit times (one every 5 ms) while a relay delivers, for [`WINDOW`].
fn app_commits_beside_relay(outbox: &Outbox, url: &str) -> Vec<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let app = {
        let outbox = outbox.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("app".into())
            .spawn(move || {
                let mut waits = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let _ = outbox
                        .transaction(|tx| {
                            outbox.enqueue(tx, Event::new("order.placed", json!({"n": 1})))
                        })
                        .expect("the app's commit");
                    waits.push(started.elapsed());
                    std::thread::sleep(Duration::from_millis(5));
                }
                waits
            })
            .expect("the app thread")
    };
    std::thread::sleep(Duration::from_millis(200));
    let relay = outbox
        .relay(
            RelayConfig::new().destination(Destination::http("default", url).batch(100, 1 << 20)),
        )
        .start()
        .expect("the relay");
    std::thread::sleep(WINDOW);
    let _ = relay.shutdown();
    stop.store(true, Ordering::Relaxed);
    app.join().expect("the app thread")
}

fn worst_and_p999(mut waits: Vec<Duration>) -> (Duration, Duration) {
    waits.sort();
    let p999 = waits[(waits.len() * 999 / 1000).min(waits.len() - 1)];
    (waits[waits.len() - 1], p999)
}

fn main() {
    let backlog: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |n| n.parse().expect("a number of events"));
    let receiver =
        http_server::HttpServer::bind("127.0.0.1:0", |_| http_server::Response::status(204))
            .expect("a receiver");
    let url = format!("http://{}/events", receiver.addr());
    let dir = tempfile::tempdir().expect("a folder");
    println!("| backlog | case | app's worst commit | p99.9 |");
    println!("|---|---|---|---|");
    let mut worst = Vec::new();
    for urgent in [false, true] {
        let outbox = backlog_file(dir.path(), backlog, urgent);
        let (max, p999) = worst_and_p999(app_commits_beside_relay(&outbox, &url));
        println!(
            "| {backlog} | {} | {:.1} ms | {:.1} ms |",
            if urgent {
                "an urgent event behind it"
            } else {
                "the backlog alone"
            },
            max.as_secs_f64() * 1000.0,
            p999.as_secs_f64() * 1000.0
        );
        worst.push(max);
    }
    println!(
        "\nworst commit with the urgent event against without: {:.2}× (target ≤ 2×); largest numbering step: {} rows",
        worst[1].as_secs_f64() / worst[0].as_secs_f64(),
        sqlite_outbox::internal::largest_numbering_step()
    );
    receiver.stop();
}
