//! What an operator waits for at scale (issue 66, item 8): the `outbox` command's read
//! commands on a file of 1.1 million rows (1,000,000 delivered, 100,000 pending, as a device
//! that relayed for months and then went offline leaves it; then folded; then with a
//! million more delivered since the fold), each against the least a
//! command costs: `config show`, which opens the file read-only and reads the settings
//! only (the floor: the process's start, the open, the schema check). Medians of 21 runs of
//! the release binary, each a process of its own, as an operator runs them.
//!
//! ```text
//! cargo build --release -p outbox-cli --bin outbox
//! cargo run --release -p outbox-cli --example bench_commands            # 1.1M rows
//! cargo run --release -p outbox-cli --example bench_commands -- 110000  # a quick look
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sqlite_outbox::{Event, Outbox};

const RUNS: usize = 21;

/// The release `outbox` beside this example (target/release/examples/ → target/release/).
fn outbox_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the example's own path");
    let release = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/release/examples");
    let binary = release.join("outbox");
    assert!(
        binary.exists(),
        "{} is missing: cargo build --release -p outbox-cli --bin outbox",
        binary.display()
    );
    binary
}

/// `rows` rows: a tenth pending, the rest delivered history.
fn fill(path: &Path, rows: usize) {
    let outbox = Outbox::open(path).expect("the file opens");
    let pending = rows / 11;
    let delivered = rows - pending;
    add_delivered(&outbox, delivered);
    let mut done = 0;
    while done < pending {
        let end = (done + 10_000).min(pending);
        outbox
            .transaction(|tx| {
                for i in done..end {
                    let _ = outbox.enqueue(
                        tx,
                        Event::new("order.created", serde_json::json!({"order_id": i})),
                    )?;
                }
                Ok::<(), sqlite_outbox::Error>(())
            })
            .expect("pending events written");
        done = end;
    }
}

fn median_of_runs(binary: &Path, db: &Path, args: &[&str]) -> Duration {
    let mut runs: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let out = Command::new(binary)
                .arg("--db")
                .arg(db)
                .args(args)
                .output()
                .expect("outbox runs");
            let took = started.elapsed();
            assert!(
                out.status.success(),
                "outbox {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            took
        })
        .collect();
    runs.sort();
    runs[RUNS / 2]
}

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("a number of rows"))
        .unwrap_or(1_100_000);
    let binary = outbox_binary();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("big.db");
    let started = Instant::now();
    fill(&db, rows);
    println!(
        "{rows} rows ({} pending) written in {:.1} s",
        rows / 11,
        started.elapsed().as_secs_f64()
    );
    println!("\nAs the app left it: pending rows never folded into the queue's totals (only a");
    println!("read-write `stats` folds), which a read-only command counts one by one.\n");
    table(&binary, &db);
    // What a relay (or any read-write `stats`) does as it runs: the pending rows folded
    // into the queue's totals, a range at a time.
    let outbox = Outbox::open(&db).expect("the file opens");
    for _ in 0..20 {
        let _ = outbox.stats().expect("stats");
    }
    drop(outbox);
    println!("\nAfter a read-write `stats` folded the pending rows into the queue's totals.\n");
    table(&binary, &db);
    // Months later: a relay delivered a million more (a relay does not fold; only a
    // read-write `stats` does), all of it above the rows the totals cover.
    let outbox = Outbox::open(&db).expect("the file opens");
    add_delivered(&outbox, rows - rows / 11);
    drop(outbox);
    println!("\nWith as much delivered history again since the totals were folded.\n");
    table(&binary, &db);
}

/// `n` delivered rows of history, above every row there is.
fn add_delivered(outbox: &Outbox, n: usize) {
    let conn = outbox.connection().expect("a connection");
    conn.execute(
        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?1)
         INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at,
                                    attempts, delivered_at)
         SELECT printf('h%031x', i), 'order.created', '{\"order_id\":1}', 1, 1, 1, 2 FROM k",
        [n as i64],
    )
    .expect("history written");
}

fn table(binary: &Path, db: &Path) {
    let floor = median_of_runs(binary, db, &["config", "show"]);
    println!("| command | median of {RUNS} | over the floor |");
    println!("|---|--:|--:|");
    println!(
        "| `config show` (the floor) | {:.1} ms | |",
        floor.as_secs_f64() * 1000.0
    );
    for args in [
        &["stats"][..],
        &["stats", "--json"],
        &["health"],
        &["list", "--limit", "10"],
    ] {
        let took = median_of_runs(binary, db, args);
        println!(
            "| `{}` | {:.1} ms | +{:.1} ms |",
            args.join(" "),
            took.as_secs_f64() * 1000.0,
            (took.as_secs_f64() - floor.as_secs_f64()) * 1000.0
        );
    }
}
