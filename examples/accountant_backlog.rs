//! What the relay's accountant costs beside a big backlog draining slowly (issue 65, item
//! 4): a file with a backlog of N events (1,000,000 by default) committed offline, a
//! receiver that takes one event every 20 ms per connection (a thin uplink), and a relay
//! delivering to it for 60 s with the default accounting interval (2 minutes). Printed for
//! the destination with accounting off and on: the CPU time of the accountant's thread
//! (`outbox-accounting`) and of the whole process over the window, and the growth of the
//! process's resident memory from the relay's start to its peak.
//!
//! ```text
//! cargo run --release --example accountant_backlog            # 1,000,000 events
//! cargo run --release --example accountant_backlog -- 100000
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::time::{Duration, Instant};

use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// How long the relay delivers.
const WINDOW: Duration = Duration::from_secs(60);

fn backlog_file(path: &std::path::Path, backlog: usize) -> Outbox {
    let outbox = Outbox::open(path).expect("the file");
    for chunk in 0..backlog.div_ceil(10_000) {
        let events: Vec<Event> = (0..10_000.min(backlog - chunk * 10_000))
            .map(|i| Event::new("telemetry.temp", json!({"i": chunk * 10_000 + i})))
            .collect();
        outbox
            .transaction(|tx| outbox.enqueue_many(tx, events))
            .expect("the backlog");
    }
    outbox
}

/// Seconds of CPU (user and system) of this process's threads named `name`, or of all of
/// them with `None`, from /proc.
fn cpu_seconds(name: Option<&str>) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let stat_of = |path: std::path::PathBuf| -> f64 {
        let stat = std::fs::read_to_string(path).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime and stime are 14 and 15.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: f64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        let stime: f64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        (utime + stime) / ticks
    };
    match name {
        None => stat_of("/proc/self/stat".into()),
        Some(name) => std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter(|task| {
                        std::fs::read_to_string(task.path().join("comm"))
                            // The kernel keeps a thread's name to 15 bytes.
                            .is_ok_and(|comm| comm.trim() == &name[..name.len().min(15)])
                    })
                    .map(|task| stat_of(task.path().join("stat")))
                    .sum()
            })
            .unwrap_or(0.0),
    }
}

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let backlog: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |n| n.parse().expect("a number of events"));
    let receiver = http_server::HttpServer::bind("127.0.0.1:0", |_| {
        http_server::Response::status(204).after(Duration::from_millis(20))
    })
    .expect("a receiver");
    let url = format!("http://{}/events", receiver.addr());
    let dir = tempfile::tempdir().expect("a folder");
    println!(
        "| backlog {backlog}, {} s of a slow drain | accountant's CPU | process's CPU | resident memory growth |",
        WINDOW.as_secs()
    );
    println!("|---|---|---|---|");
    for accounting in [false, true] {
        let outbox = backlog_file(&dir.path().join(format!("{accounting}.db")), backlog);
        let rss_before = resident_kib();
        let cpu_before = cpu_seconds(None);
        let relay = outbox
            .relay(
                RelayConfig::new().destination(
                    Destination::http("default", &url)
                        .batch(1, 1 << 20)
                        .accounting(accounting),
                ),
            )
            .start()
            .expect("the relay");
        let started = Instant::now();
        let mut rss_peak = rss_before;
        let mut accountant = 0.0;
        while started.elapsed() < WINDOW {
            std::thread::sleep(Duration::from_millis(100));
            rss_peak = rss_peak.max(resident_kib());
            // Read while the thread lives: its entry leaves /proc when it ends.
            accountant = cpu_seconds(Some("outbox-accounting"));
        }
        let process = cpu_seconds(None) - cpu_before;
        let _ = relay.shutdown();
        println!(
            "| accounting {} | {accountant:.2} s | {process:.2} s | {:.1} MB |",
            if accounting { "on" } else { "off" },
            rss_peak.saturating_sub(rss_before) as f64 / 1024.0
        );
    }
    receiver.stop();
}
