//! A run of every benchmark comparison, printed as one table: each figure, its bare baseline
//! measured in the same run, and the ratio. All sections take a quarter of an hour or so on
//! two cores; name the ones wanted to run fewer.
//!
//! ```text
//! cargo run --release --example bench
//! ```
//!
//! `-- relay mqtt …` runs only those sections (`-- frugal`, about three and a half minutes
//! of it: an idle minute, a trickle of 100 s; see `bench/frugal.rs`; Linux only, and with
//! `--all-features` for the WAL watch); `-- probe relay|least-relay|bare WORKERS`
//! runs one drain at one event per request alone, for a profiler, and prints each thread's
//! CPU time an event, `-- probe-enqueue VARIANT` one
//! enqueue variant (see `probe_enqueue`) and `-- probe-claim VARIANT` one claim + ack loop
//! (see `probe_claim`), `-- probe-idle ROUNDS` the idle commit → receipt alone. The
//! criterion benches under `benches/`
//! measure the same things more thoroughly.

#[path = "../benches/support/mod.rs"]
mod support;
#[cfg(feature = "mqtt")]
#[path = "../benches/support/mqtt.rs"]
mod support_mqtt;

#[cfg(target_os = "linux")]
#[path = "bench/frugal.rs"]
mod frugal;

#[path = "bench/budget.rs"]
mod budget;
// The budget's accuracy rows count bytes as the tests do: a forwarder in front of the
// receiver, and the tests' HTTPS receiver and CA.
#[path = "../tests/common/byte_counter.rs"]
mod byte_counter;
#[path = "../tests/common/https_receiver.rs"]
mod https_receiver;
#[path = "../tests/common/test_ca.rs"]
mod test_ca;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::transport::OutboundEvent;
use sqlite_outbox::{
    internal as bench_support, Destination, Event, Outbox, RelayConfig, Synchronous,
};
use support::*;

/// A "now" after every event's commit time, for claiming outside a relay.
const FAR: i64 = 4_000_000_000_000_000;

struct Line {
    what: String,
    outbox: String,
    baseline: String,
    ratio: String,
    target: &'static str,
}

impl Line {
    /// A row of two rates measured in the same run: ours against a baseline (named in
    /// brackets after its figure when `baseline_name` is not empty), and their ratio.
    fn rates(
        what: String,
        unit: &str,
        ours: f64,
        baseline: f64,
        baseline_name: &str,
        target: &'static str,
    ) -> Line {
        let baseline_figure = if baseline_name.is_empty() {
            per_s(baseline)
        } else {
            format!("{} ({baseline_name})", per_s(baseline))
        };
        Line {
            what,
            outbox: format!("{} {unit}", per_s(ours)),
            baseline: baseline_figure,
            ratio: format!("{:.2}×", ours / baseline),
            target,
        }
    }
}

impl Line {
    /// The ratio column with the spread of the rounds' own ratios beside the median's.
    fn with_spread(mut self, alternated: &Alternated) -> Line {
        self.ratio = format!(
            "{} ({:.2}–{:.2} over {} rounds)",
            self.ratio, alternated.lowest_ratio, alternated.highest_ratio, alternated.rounds
        );
        self
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn per_s(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.0}k/s", r / 1000.0)
    } else {
        format!("{r:.0}/s")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// Median of `rounds` alternating runs of `a` and `b`, so drift hits both alike.
fn alternate(rounds: usize, a: impl FnMut() -> f64, b: impl FnMut() -> f64) -> (f64, f64) {
    let alternated = alternate_spread(rounds, a, b);
    (alternated.a, alternated.b)
}

/// What [`alternate_spread`] measured: the medians, and the spread of the rounds' ratios.
struct Alternated {
    a: f64,
    b: f64,
    lowest_ratio: f64,
    highest_ratio: f64,
    rounds: usize,
}

/// As [`alternate`], keeping the lowest and highest ratio `a / b` of a round, for the noisy
/// rows (the table then shows the spread beside the median ratio).
fn alternate_spread(
    rounds: usize,
    mut a: impl FnMut() -> f64,
    mut b: impl FnMut() -> f64,
) -> Alternated {
    let (mut xs, mut ys, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (x, y) = (a(), b());
        xs.push(x);
        ys.push(y);
        ratios.push(x / y);
    }
    xs.sort_by(f64::total_cmp);
    ys.sort_by(f64::total_cmp);
    ratios.sort_by(f64::total_cmp);
    Alternated {
        a: xs[rounds / 2],
        b: ys[rounds / 2],
        lowest_ratio: ratios[0],
        highest_ratio: ratios[rounds - 1],
        rounds,
    }
}

/// Runs `txs` transactions of `per_tx` events through `one_tx` (given the running event
/// count `next` after each), and returns events per second.
fn rate_of_txs(txs: i64, per_tx: i64, next: &mut i64, mut one_tx: impl FnMut(i64)) -> f64 {
    let t = Instant::now();
    for _ in 0..txs {
        *next += per_tx;
        one_tx(*next);
    }
    rate((txs * per_tx) as usize, t.elapsed())
}

/// The two files an enqueue comparison writes, named after `file`: a bare connection, and
/// an `Outbox` with the app's own connection to its file, both at `sync` and with the same
/// automatic checkpoint.
fn enqueue_files(
    dir: &std::path::Path,
    file: &str,
    sync: Synchronous,
) -> (Connection, Outbox, Connection) {
    let pragma = if sync == Synchronous::Full {
        "FULL"
    } else {
        "NORMAL"
    };
    let bare = bare_connection(&dir.join(format!("bare-{file}.db")), pragma);
    bare.execute_batch("PRAGMA wal_autocheckpoint=4096")
        .unwrap();
    let path = dir.join(format!("outbox-{file}.db"));
    let outbox = Outbox::builder().synchronous(sync).open(&path).unwrap();
    let own = Connection::open(&path).unwrap();
    own.execute_batch(&format!(
        "PRAGMA synchronous={pragma}; PRAGMA wal_autocheckpoint=4096; {BUSINESS_TABLE}"
    ))
    .unwrap();
    (bare, outbox, own)
}

fn enqueue(dir: &std::path::Path, label: &str, sync: Synchronous, per_tx: i64, txs: i64) -> Line {
    let file: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    let (mut bare, outbox, mut own) = enqueue_files(dir, &file, sync);
    let (mut n1, mut n2) = (0, 0);
    let alternated = alternate_spread(
        5,
        || {
            rate_of_txs(txs, per_tx, &mut n1, |n| {
                outbox_enqueue_tx(&outbox, &mut own, n, per_tx)
            })
        },
        || {
            rate_of_txs(txs, per_tx, &mut n2, |n| {
                bare_enqueue_tx(&mut bare, n, per_tx)
            })
        },
    );
    // One event a transaction is what apps write: it must stay at the bare speed.
    let target = if per_tx == 1 {
        "≥ 0.95×"
    } else {
        "≥ 0.9×"
    };
    Line::rates(
        format!("enqueue, {label}"),
        "events",
        alternated.a,
        alternated.b,
        "",
        target,
    )
    .with_spread(&alternated)
}

/// `Outbox::enqueue` with stream numbers (issue 58) against the same without them (the
/// bench's switch, `internal::set_stream_numbers`), each on its own file, alternating in
/// the same run.
fn stream_numbers(dir: &std::path::Path, label: &str, per_tx: i64, txs: i64) -> Line {
    let file: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    let (_, numbered, mut numbered_conn) =
        enqueue_files(dir, &format!("numbered{file}"), Synchronous::Normal);

    let (_, plain, mut plain_conn) =
        enqueue_files(dir, &format!("unnumbered{file}"), Synchronous::Normal);
    // Without numbers: none given (the switch), no trigger of the numbering.
    plain_conn
        .execute_batch(
            "DROP TRIGGER outbox_events_stream_delete;
             DROP TRIGGER outbox_events_unnumbered_delete",
        )
        .unwrap();
    let (mut n1, mut n2) = (0, 0);
    let alternated = alternate_spread(
        5,
        || {
            bench_support::set_stream_numbers(true);
            rate_of_txs(txs, per_tx, &mut n1, |n| {
                outbox_enqueue_tx(&numbered, &mut numbered_conn, n, per_tx)
            })
        },
        || {
            bench_support::set_stream_numbers(false);
            let rate = rate_of_txs(txs, per_tx, &mut n2, |n| {
                outbox_enqueue_tx(&plain, &mut plain_conn, n, per_tx)
            });
            bench_support::set_stream_numbers(true);
            rate
        },
    );
    Line::rates(
        format!("enqueue with stream numbers, {label}"),
        "events",
        alternated.a,
        alternated.b,
        "without numbers",
        "≥ 0.95×",
    )
    .with_spread(&alternated)
}

/// Where numbering's cost went: the relay numbers the rows it claims (schema version 16).
/// Claim + ack of the same rows with numbering against the same without (the switch), in
/// the same run.
fn stream_numbers_claim(dir: &std::path::Path) -> Line {
    let n = 50_000;
    let numbered = Outbox::open(dir.join("claim-numbered.db")).unwrap();
    let plain = Outbox::open(dir.join("claim-unnumbered.db")).unwrap();
    let alternated = alternate_spread(
        5,
        || {
            bench_support::set_stream_numbers(true);
            fill_pending(&numbered, n);
            let t = Instant::now();
            assert_eq!(outbox_claim_ack(&numbered, FAR), n);
            rate(n, t.elapsed())
        },
        || {
            bench_support::set_stream_numbers(false);
            fill_pending(&plain, n);
            let t = Instant::now();
            assert_eq!(outbox_claim_ack(&plain, FAR), n);
            bench_support::set_stream_numbers(true);
            rate(n, t.elapsed())
        },
    );
    Line::rates(
        "claim + ack with stream numbers, batches of 100".into(),
        "rows",
        alternated.a,
        alternated.b,
        "without numbers",
        "",
    )
    .with_spread(&alternated)
}

/// The bytes of one stream's accounting (what the relay tells a destination when a fate
/// changes, and every accounting interval) for a stream of 1,000 events of which 20,
/// scattered, went dead, against the bytes of those 1,000 events as sent.
fn accounting_bytes(dir: &std::path::Path) -> Line {
    let outbox = Outbox::open(dir.join("accounting.db")).unwrap();
    let mut conn = outbox.connection().unwrap();
    conn.execute_batch(BUSINESS_TABLE).unwrap();
    for n in 0..1_000 {
        outbox_enqueue_tx(&outbox, &mut conn, n, 1);
    }
    // Every event as the relay sends it (claimed and acked in turn: a key's next event is
    // due once its head is delivered).
    let mut event_bytes = 0;
    loop {
        let events = bench_support::claim(&conn, "default", "bench", FAR, 1_000).unwrap();
        if events.is_empty() {
            break;
        }
        event_bytes += events
            .iter()
            .map(|e| sqlite_outbox::wire::structured_body(e).unwrap().len())
            .sum::<usize>();
        bench_support::ack_delivered(&mut conn, &events, FAR).unwrap();
    }
    conn.execute_batch(
        "UPDATE outbox_events SET delivered_at = NULL, dead_at = 1, lease_owner = NULL
          WHERE stream_seq % 50 = 7",
    )
    .unwrap();
    drop(conn);
    let (source, account) = outbox.stream_accounts("default").unwrap().remove(0);
    let mut told = OutboundEvent::new(
        sqlite_outbox::wire::ACCOUNTING_TYPE,
        &serde_json::to_value(&account).unwrap(),
    );
    told.source = source;
    let told_bytes = sqlite_outbox::wire::structured_body(&told).unwrap().len();
    Line {
        what: "a stream's accounting, 1,000 events, 20 dead (scattered)".into(),
        outbox: format!("{told_bytes} bytes"),
        baseline: format!("{event_bytes} bytes (the 1,000 events)"),
        ratio: format!("{:.2}%", told_bytes as f64 * 100.0 / event_bytes as f64),
        target: "",
    }
}

/// `Outbox::enqueue_many` of `per_tx` keyed events a transaction against the bare loop of
/// an `INSERT` per event (the baseline of the `enqueue` rows), then against a bare
/// transaction that writes its rows with one `INSERT`, each pair alternating in the same run.
fn enqueue_many(dir: &std::path::Path, per_tx: i64, txs: i64) -> Vec<Line> {
    let listed_sql = bare_listed_insert_sql(per_tx);
    let mut lines = Vec::new();
    for (file, baseline) in [
        ("many", "bare, an INSERT per event"),
        ("manylisted", "bare, one INSERT per transaction"),
    ] {
        let (mut bare, outbox, mut own) = enqueue_files(dir, file, Synchronous::Normal);
        let (mut n1, mut n2) = (0, 0);
        let alternated = alternate_spread(
            5,
            || {
                rate_of_txs(txs, per_tx, &mut n1, |n| {
                    outbox_enqueue_many_tx(&outbox, &mut own, n, per_tx)
                })
            },
            || {
                rate_of_txs(txs, per_tx, &mut n2, |n| {
                    if file == "many" {
                        bare_enqueue_tx(&mut bare, n, per_tx)
                    } else {
                        bare_enqueue_listed_tx(&mut bare, &listed_sql, n, per_tx)
                    }
                })
            },
        );
        lines.push(
            Line::rates(
                format!("enqueue_many, NORMAL, {per_tx} keyed events/tx"),
                "events",
                alternated.a,
                alternated.b,
                baseline,
                if file == "many" { "≥ 0.9×" } else { "" },
            )
            .with_spread(&alternated),
        );
    }
    lines
}

/// The SQL contract (`INSERT INTO outbox_enqueue`, as an app in another language writes)
/// against `Outbox::enqueue`, the same business row and event per transaction, each on its
/// own file, alternating in the same run.
fn enqueue_sql(dir: &std::path::Path, label: &str, per_tx: i64, txs: i64) -> Line {
    let file: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    let open = |name: &str| {
        let path = dir.join(format!("{name}-{file}.db"));
        let outbox = Outbox::open(&path).unwrap();
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=4096; {BUSINESS_TABLE}"
        ))
        .unwrap();
        (outbox, conn)
    };
    let (rust, mut rust_conn) = open("rust");
    let (_sql, mut sql_conn) = open("sql");
    let (mut n1, mut n2) = (0, 0);
    let alternated = alternate_spread(
        5,
        || {
            rate_of_txs(txs, per_tx, &mut n1, |n| {
                sql_enqueue_tx(&mut sql_conn, n, per_tx)
            })
        },
        || {
            rate_of_txs(txs, per_tx, &mut n2, |n| {
                outbox_enqueue_tx(&rust, &mut rust_conn, n, per_tx)
            })
        },
    );
    Line::rates(
        format!("enqueue through SQL (INSERT INTO outbox_enqueue), {label}"),
        "events",
        alternated.a,
        alternated.b,
        "Outbox::enqueue",
        "≥ 0.8×",
    )
    .with_spread(&alternated)
}

/// Side by side with honker 0.5 (a queue in the app's SQLite file, enqueued in the app's
/// transaction: the closest design to this crate), each with its own defaults, on its own
/// file, alternating in the same run: enqueue one and 100 events per transaction (with the
/// business row), claim + ack one at a time and in batches of 100, at NORMAL and FULL.
/// Events are unkeyed here: honker has no partition keys. honker deletes a job on ack; this
/// crate keeps the row as delivered history.
fn versus_honker(dir: &std::path::Path) -> Vec<Line> {
    use honker::{EnqueueOpts, QueueOpts};
    let mut lines = Vec::new();
    let round = std::cell::Cell::new(0);
    let next_file = |name: &str| {
        round.set(round.get() + 1);
        dir.join(format!("vs-{name}-{}.db", round.get()))
    };
    for (sync, pragma) in [(Synchronous::Normal, "NORMAL"), (Synchronous::Full, "FULL")] {
        let ours_open = |path: &std::path::Path| {
            let outbox = Outbox::builder().synchronous(sync).open(path).unwrap();
            let own = Connection::open(path).unwrap();
            own.execute_batch(&format!("PRAGMA synchronous={pragma}; {BUSINESS_TABLE}"))
                .unwrap();
            (outbox, own)
        };
        let honker_open = |path: &std::path::Path| {
            let db = honker::Database::open(path).unwrap();
            db.with_conn(|c| {
                c.execute_batch(&format!("PRAGMA synchronous={pragma}; {BUSINESS_TABLE}"))
            })
            .unwrap();
            let queue = db.queue("orders", QueueOpts::default());
            (db, queue)
        };
        let enqueue_txs = if sync == Synchronous::Full {
            300
        } else {
            3_000
        };
        for (per_tx, txs) in [(1, enqueue_txs), (100, 40)] {
            let (outbox, mut own) = ours_open(&next_file("ours"));
            let (db, queue) = honker_open(&next_file("honker"));
            let (mut n1, mut n2) = (0i64, 0i64);
            let (o, h) = alternate(
                5,
                || {
                    let t = Instant::now();
                    for _ in 0..txs {
                        let tx = own
                            .transaction_with_behavior(
                                sqlite_outbox::rusqlite::TransactionBehavior::Immediate,
                            )
                            .unwrap();
                        for _ in 0..per_tx {
                            n1 += 1;
                            insert_order(&tx, n1);
                            let _ = outbox
                                .enqueue(&tx, Event::new("order.created", order_data(n1)))
                                .unwrap();
                        }
                        tx.commit().unwrap();
                    }
                    rate((txs * per_tx) as usize, t.elapsed())
                },
                || {
                    let t = Instant::now();
                    for _ in 0..txs {
                        let tx = db.transaction().unwrap();
                        for _ in 0..per_tx {
                            n2 += 1;
                            tx.execute(
                                "INSERT INTO orders (customer, total) VALUES (?1, ?2)",
                                sqlite_outbox::rusqlite::params!["customer-7", n2],
                            )
                            .unwrap();
                            queue
                                .enqueue_tx(&tx, &order_data(n2), EnqueueOpts::default())
                                .unwrap();
                        }
                        tx.commit().unwrap();
                    }
                    rate((txs * per_tx) as usize, t.elapsed())
                },
            );
            lines.push(Line::rates(
                format!("vs honker: enqueue, {pragma}, {per_tx} event(s)/tx"),
                "events",
                o,
                h,
                "honker",
                "> 1×",
            ));
        }
        let events = if sync == Synchronous::Full {
            600
        } else {
            5_000
        };
        for (batch, n) in [(1i64, events), (100, events * 10)] {
            let (o, h) = alternate(
                3,
                || {
                    let (outbox, _) = ours_open(&next_file("ours-claim"));
                    fill_pending(&outbox, n);
                    let mut conn = outbox.connection().unwrap();
                    let t = Instant::now();
                    let mut done = 0;
                    for seq in 0.. {
                        let owner = format!("bench:{seq}");
                        let claimed =
                            sqlite_outbox::internal::claim(&conn, "default", &owner, FAR, batch)
                                .unwrap();
                        if claimed.is_empty() {
                            break;
                        }
                        done += sqlite_outbox::internal::ack_delivered(&mut conn, &claimed, FAR)
                            .unwrap();
                    }
                    assert_eq!(done, n);
                    rate(n, t.elapsed())
                },
                || {
                    let (db, queue) = honker_open(&next_file("honker-claim"));
                    for chunk in 0..n.div_ceil(10_000) {
                        let tx = db.transaction().unwrap();
                        for i in chunk * 10_000..((chunk + 1) * 10_000).min(n) {
                            queue
                                .enqueue_tx(&tx, &order_data(i as i64), EnqueueOpts::default())
                                .unwrap();
                        }
                        tx.commit().unwrap();
                    }
                    let t = Instant::now();
                    let mut done = 0;
                    loop {
                        let jobs = queue.claim_batch("bench", batch).unwrap();
                        if jobs.is_empty() {
                            break;
                        }
                        let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
                        done += queue.ack_batch(&ids, "bench").unwrap() as usize;
                    }
                    assert_eq!(done, n);
                    rate(n, t.elapsed())
                },
            );
            lines.push(Line::rates(
                format!("vs honker: claim + ack, {pragma}, batches of {batch}, {n} queued"),
                "events",
                o,
                h,
                "honker",
                "> 1×",
            ));
        }
    }
    lines
}

/// One app transaction: order `n`'s row and the event announcing it.
fn commit_order(outbox: &Outbox, n: i64) {
    outbox
        .transaction(|tx| {
            tx.execute("INSERT INTO orders (customer, total) VALUES ('c', ?1)", [n])?;
            let _ = outbox.enqueue(tx, Event::new("order.created", order_data(n)))?;
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
}

/// The app's commits (an order row and its event, one transaction each) at a steady 2,000
/// a second, a busy desktop app, not a tight loop: an app that never pauses would leave no
/// room for any checkpoint. Stops after `count` commits or once `enough` says so.
fn paced_commits(outbox: &Outbox, count: usize, enough: impl Fn() -> bool) -> Vec<Duration> {
    paced_commits_begun(outbox, count, enough)
        .into_iter()
        .map(|(took, _)| took)
        .collect()
}

/// [`paced_commits`], each commit's time with when it began (since the first slot's start).
fn paced_commits_begun(
    outbox: &Outbox,
    count: usize,
    enough: impl Fn() -> bool,
) -> Vec<(Duration, Duration)> {
    let mut samples = Vec::new();
    let pace = Duration::from_micros(500);
    let start = Instant::now();
    for n in 1..=count as i64 {
        if enough() {
            break;
        }
        let slot = start + pace * n as u32;
        if let Some(wait) = slot.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        commit_order(outbox, n);
        samples.push((t.elapsed(), t - start));
    }
    samples
}

/// Queues 200,000 events and starts a relay (4 workers) draining them to `receiver`;
/// returns it with the receiver's count before.
fn start_draining(
    outbox: &Outbox,
    receiver: &CountingReceiver,
) -> (sqlite_outbox::RelayHandle, u64) {
    fill_pending(outbox, 200_000);
    let before = receiver.count();
    let relay = outbox
        .relay(RelayConfig::http(&receiver.url).workers(4))
        .start()
        .unwrap();
    (relay, before)
}

/// One round of [`commit_latency_while_draining`]'s first row: the app's paced commits while
/// a relay (4 workers) drains 200,000 events, with the slowest commits listed by the time
/// they began (ms since the relay started), to lay beside the relay's debug log
/// (`RUST_LOG=sqlite_outbox=debug`).
fn probe_drain_latency(dir: &std::path::Path, receiver: &CountingReceiver) {
    let _ = env_logger::builder().format_timestamp_millis().try_init();
    let outbox = Outbox::open(dir.join("probe-drain-latency.db")).unwrap();
    outbox
        .transaction(|tx| Ok::<_, sqlite_outbox::Error>(tx.execute_batch(BUSINESS_TABLE)?))
        .unwrap();
    let (relay, before) = start_draining(&outbox, receiver);
    log::info!("probe: relay started");
    let mut timed = paced_commits_begun(&outbox, 10_000, || receiver.count() >= before + 195_000);
    let _ = relay.shutdown();
    let mut took: Vec<Duration> = timed.iter().map(|(d, _)| *d).collect();
    eprintln!(
        "{} commits: p50 {} p99 {} p99.9 {}",
        took.len(),
        ms(quantile(&mut took, 0.5)),
        ms(quantile(&mut took, 0.99)),
        ms(quantile(&mut took, 0.999))
    );
    timed.sort_by_key(|(took, _)| std::cmp::Reverse(*took));
    for (took, at) in timed.iter().take(15) {
        eprintln!("  {} at {:.1} ms", ms(*took), at.as_secs_f64() * 1000.0);
    }
}

/// Rounds of [`commit_latency_while_draining`]: a p99.9 of 10,000 commits is its ten
/// slowest, which move from run to run.
const DRAIN_LATENCY_ROUNDS: usize = 5;

/// The app's commit latency while a relay drains a backlog flat out, against the same
/// commits through the same `Outbox` with no relay at work, alternating in the same run:
/// each quantile is the median of the rounds' own, and the p99.9 row shows the spread of
/// the rounds' ratios. A third row times the same commits while a bare ureq loop posts the
/// same events to the same receiver flat out, with no relay and no SQLite of its own: what
/// the delivery's CPU alone does to the app's tail on this machine's cores. A fourth times
/// them while a bare claim + ack loop (batches of 100, no HTTP) works the same file's
/// backlog at the rate the relay delivered in that round: what the least SQL any relay
/// must run at that rate, holding the file's write lock for its claims and acks, does.
fn commit_latency_while_draining(dir: &std::path::Path, receiver: &CountingReceiver) -> Vec<Line> {
    let path = dir.join("drain-latency.db");
    let outbox = Outbox::open(&path).unwrap();
    let mut bare_sql = bare_connection(&path, "NORMAL");
    outbox
        .transaction(|tx| Ok::<_, sqlite_outbox::Error>(tx.execute_batch(BUSINESS_TABLE)?))
        .unwrap();
    let body =
        sqlite_outbox::wire::structured_body(&bench_support::sample_event(&order_data(1))).unwrap();
    // Per round: (p50, p99.9) of the commits with the relay draining, then idle, then
    // beside the bare delivery loop.
    let mut draining = Vec::new();
    let mut idle = Vec::new();
    let mut beside_bare = Vec::new();
    let mut beside_bare_sql = Vec::new();
    let mut commits = 0;
    for _ in 0..DRAIN_LATENCY_ROUNDS {
        let mut idle_samples = paced_commits(&outbox, 10_000, || false);
        let (relay, before) = start_draining(&outbox, receiver);
        let drain_started = Instant::now();
        let mut samples = paced_commits(&outbox, 10_000, || receiver.count() >= before + 195_000);
        let relay_rate = (receiver.count() - before) as f64 / drain_started.elapsed().as_secs_f64();
        let _ = relay.shutdown();
        commits = commits.max(samples.len());
        draining.push([quantile(&mut samples, 0.5), quantile(&mut samples, 0.999)]);
        idle.push([
            quantile(&mut idle_samples, 0.5),
            quantile(&mut idle_samples, 0.999),
        ]);
        let before = receiver.count();
        let mut loaded = std::thread::scope(|s| {
            let posting = std::thread::Builder::new()
                .name("bare-posts".into())
                .spawn_scoped(s, || {
                    bare_posts(
                        &receiver.url,
                        &body,
                        "application/cloudevents+json",
                        200_000,
                        4,
                    )
                })
                .unwrap();
            let samples = paced_commits(&outbox, 10_000, || receiver.count() >= before + 195_000);
            posting.join().unwrap();
            samples
        });
        commits = commits.max(loaded.len());
        beside_bare.push([quantile(&mut loaded, 0.5), quantile(&mut loaded, 0.999)]);
        fill_pending(&outbox, 200_000);
        let acked = std::sync::atomic::AtomicBool::new(false);
        let mut locked = std::thread::scope(|s| {
            let (bare_sql, acked) = (&mut bare_sql, &acked);
            let claiming = std::thread::Builder::new()
                .name("bare-claims".into())
                .spawn_scoped(s, move || {
                    let pace = Pace {
                        rows_per_second: relay_rate,
                        rows: 195_000,
                    };
                    let returning = BareReturning::EventColumns;
                    bare_claim_ack_paced(bare_sql, 100, FAR, returning, Some(pace));
                    acked.store(true, std::sync::atomic::Ordering::Release);
                })
                .unwrap();
            let samples = paced_commits(&outbox, 10_000, || {
                acked.load(std::sync::atomic::Ordering::Acquire)
            });
            claiming.join().unwrap();
            samples
        });
        commits = commits.max(locked.len());
        beside_bare_sql.push([quantile(&mut locked, 0.5), quantile(&mut locked, 0.999)]);
    }
    let mut lines = Vec::new();
    let rows = [
        (0, "p50", &draining, "while relay drains", ""),
        (1, "p99.9", &draining, "while relay drains", "≤ 1.5×"),
        (
            1,
            "p99.9",
            &beside_bare,
            "while a bare ureq loop posts the same events flat out, no relay",
            "(the floor)",
        ),
        (
            1,
            "p99.9",
            &beside_bare_sql,
            "while a bare claim + ack loop (batches of 100) works the same file at the relay's rate, no HTTP",
            "(the lock's floor)",
        ),
    ];
    for (at, name, rounds, beside, target) in rows {
        let median = |rounds: &[[Duration; 2]]| {
            let mut of: Vec<Duration> = rounds.iter().map(|r| r[at]).collect();
            quantile(&mut of, 0.5)
        };
        let (o, b) = (median(rounds), median(&idle));
        let mut ratios: Vec<f64> = rounds
            .iter()
            .zip(&idle)
            .map(|(d, i)| d[at].as_secs_f64() / i[at].as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        lines.push(Line {
            what: format!("app commit {name} {beside} (up to {commits} commits a round)"),
            outbox: ms(o),
            baseline: format!("{} (same commits, no relay)", ms(b)),
            ratio: format!(
                "{:.2}× ({:.2}–{:.2} over {DRAIN_LATENCY_ROUNDS} rounds)",
                o.as_secs_f64() / b.as_secs_f64(),
                ratios[0],
                ratios[ratios.len() - 1]
            ),
            target,
        });
    }
    lines
}

fn claim_ack(dir: &std::path::Path) -> Vec<Line> {
    let n = 100_000;
    let outbox = Outbox::open(dir.join("claim.db")).unwrap();
    let mut bare = bare_connection(&dir.join("bare-claim.db"), "NORMAL");
    let mut against_bare = |returning: BareReturning| {
        alternate_spread(
            5,
            || {
                fill_pending(&outbox, n);
                let t = Instant::now();
                assert_eq!(outbox_claim_ack(&outbox, FAR), n);
                rate(n, t.elapsed())
            },
            || {
                fill_bare_pending(&mut bare, n);
                let t = Instant::now();
                let done = bare_claim_ack(&mut bare, 100, FAR, returning);
                rate(done, t.elapsed())
            },
        )
    };
    let ids_only = against_bare(BareReturning::Id);
    // The bare loop that returns only ids cannot ship anything; the same loop returning the
    // columns an event is shipped with shows what SQLite's `RETURNING` of them costs.
    let event_columns = against_bare(BareReturning::EventColumns);
    let mut lines = vec![
        Line::rates(
            "claim + ack, batches of 100".into(),
            "rows",
            ids_only.a,
            ids_only.b,
            "bare loop, same table",
            "≥ 0.8×",
        )
        .with_spread(&ids_only),
        Line::rates(
            "claim + ack, batches of 100, bare loop returning the event's columns".into(),
            "rows",
            event_columns.a,
            event_columns.b,
            "bare loop, same table, RETURNING 11 columns",
            "",
        )
        .with_spread(&event_columns),
    ];
    // What keeping the pending totals costs the relay's writes: the same loop over rows that
    // `stats` folded into the totals once they were queued (every claim, ack and lease of
    // them then keeps the totals), against rows that no `stats` call has folded in.
    let tallied = Outbox::open(dir.join("claim-tallied.db")).unwrap();
    let untallied = Outbox::open(dir.join("claim-untallied.db")).unwrap();
    let kept_totals = alternate_spread(
        5,
        || {
            fill_pending(&tallied, n);
            drop(tallied.stats().unwrap());
            let t = Instant::now();
            assert_eq!(outbox_claim_ack(&tallied, FAR), n);
            rate(n, t.elapsed())
        },
        || {
            fill_pending(&untallied, n);
            let t = Instant::now();
            assert_eq!(outbox_claim_ack(&untallied, FAR), n);
            rate(n, t.elapsed())
        },
    );
    lines.push(
        Line::rates(
            "claim + ack, batches of 100, rows in the pending totals (stats folded them in)".into(),
            "rows",
            kept_totals.a,
            kept_totals.b,
            "rows stats has not folded in",
            "",
        )
        .with_spread(&kept_totals),
    );
    // The claim's latency must not grow with delivered history.
    let claim_latency = |history: usize| {
        let path = dir.join(format!("history-{history}.db"));
        let outbox = Outbox::open(&path).unwrap();
        fill_delivered(&outbox.connection().unwrap(), history);
        fill_pending(&outbox, 1_000);
        let conn = outbox.connection().unwrap();
        let mut samples = Vec::new();
        for round in 0..300 {
            samples.push(timed_claim_and_release(
                &conn,
                &format!("r{round}"),
                FAR,
                100,
            ));
        }
        quantile(&mut samples, 0.5)
    };
    let empty = claim_latency(0);
    let full = claim_latency(1_000_000);
    lines.push(Line {
        what: "claim of 100 (1k pending) beside 1M delivered".into(),
        outbox: ms(full),
        baseline: format!("{} (no history)", ms(empty)),
        ratio: format!("{:.2}×", full.as_secs_f64() / empty.as_secs_f64()),
        target: "≤ 1.2×",
    });
    lines
}

/// Growth, against the same operations on a file with 1,000 pending, in the same run: a
/// week offline (1,000,000 events pending), then years of history (10,000,000 delivered
/// rows beside 1,000 pending). Enqueue, claim and stats must each cost at most 1.2× what
/// they cost on the small file.
fn growth(dir: &std::path::Path) -> Vec<Line> {
    // A fresh small file for each comparison: the enqueue rows add to both files.
    let small = |name: &str| growth_file(dir, name, |outbox| fill_pending(outbox, 1_000));
    let large = growth_file(dir, "backlog", |outbox| fill_pending(outbox, 1_000_000));
    let mut lines = growth_rows(&large, &small("small-1"), "1M pending");
    drop(large);
    let history = growth_file(dir, "history", |outbox| {
        let conn = outbox.connection().unwrap();
        fill_delivered(&conn, 10_000_000);
        conn.execute(
            "INSERT INTO outbox_delivered_totals VALUES ('default', 10000000)",
            [],
        )
        .unwrap();
        fill_pending(outbox, 1_000);
    });
    lines.extend(growth_rows(&history, &small("small-2"), "10M delivered"));
    lines
}

/// The medians of `samples` timings of `a` and of `b`, taken in turn.
fn interleaved_medians(
    samples: usize,
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> (Duration, Duration) {
    let (mut of_a, mut of_b) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        of_a.push(a());
        of_b.push(b());
    }
    (quantile(&mut of_a, 0.5), quantile(&mut of_b, 0.5))
}

/// An outbox file with the business table, filled by `fill`.
fn growth_file(dir: &std::path::Path, name: &str, fill: impl FnOnce(&Outbox)) -> Outbox {
    let outbox = Outbox::open(dir.join(format!("growth-{name}.db"))).unwrap();
    outbox
        .transaction(|tx| Ok::<_, sqlite_outbox::Error>(tx.execute_batch(BUSINESS_TABLE)?))
        .unwrap();
    fill(&outbox);
    outbox
}

/// Enqueue (one event a transaction), claim of 100 and stats on `large` against `small`.
fn growth_rows(large: &Outbox, small: &Outbox, beside: &str) -> Vec<Line> {
    let next = std::cell::Cell::new(0);
    let enqueue_rate = |outbox: &Outbox| {
        let t = Instant::now();
        for _ in 0..2_000 {
            next.set(next.get() + 1);
            commit_order(outbox, next.get());
        }
        rate(2_000, t.elapsed())
    };
    let (large_conn, small_conn) = (large.connection().unwrap(), small.connection().unwrap());
    let median_of = |call: &dyn Fn()| {
        let mut samples: Vec<Duration> = (0..21)
            .map(|_| {
                let t = Instant::now();
                call();
                t.elapsed()
            })
            .collect();
        quantile(&mut samples, 0.5)
    };
    // The first call folds the rows no call has counted yet into the pending totals (on the
    // large file, the whole backlog at once); the medians are of the calls after it.
    let first_call = |outbox: &Outbox| {
        let t = Instant::now();
        drop(outbox.stats().unwrap());
        t.elapsed()
    };
    let first = (first_call(large), first_call(small));
    let stats = |outbox: &Outbox| median_of(&|| drop(outbox.stats().unwrap()));
    let health = |outbox: &Outbox| {
        median_of(&|| {
            drop(
                outbox
                    .health(sqlite_outbox::admin::HealthThresholds::default())
                    .unwrap(),
            )
        })
    };
    // Claims and stats first, while both files hold what they were built with; the
    // enqueue rows add to them. The two files' claims alternate, so that a slow spell of
    // the machine falls on both (all of one file's, then all of the other's, once put a
    // claim beside 1M pending at 0.45× and at 1.32× of the small file's in two runs).
    // Stats do not: after a pass over a million rows the small file's stats took three
    // times as long as in a row of their own.
    let claims = interleaved_medians(
        21,
        || timed_claim_and_release(&large_conn, "growth", FAR, 100),
        || timed_claim_and_release(&small_conn, "growth", FAR, 100),
    );
    let stats = (stats(large), stats(small));
    let health = (health(large), health(small));
    let (large_rate, small_rate) = alternate(3, || enqueue_rate(large), || enqueue_rate(small));
    let latency_against = |what: &str, o: Duration, b: Duration, target: &'static str| Line {
        what: format!("{what} beside {beside}"),
        outbox: ms(o),
        baseline: format!("{} (1k pending)", ms(b)),
        ratio: format!("{:.2}×", o.as_secs_f64() / b.as_secs_f64()),
        target,
    };
    let latency = |what: &str, o: Duration, b: Duration| latency_against(what, o, b, "≤ 1.2×");
    vec![
        Line::rates(
            format!("enqueue, 1 event/tx, beside {beside}"),
            "events",
            large_rate,
            small_rate,
            "1k pending",
            "≥ 0.83×",
        ),
        latency("claim of 100", claims.0, claims.1),
        latency_against(
            "stats, first call (folds the pending rows in)",
            first.0,
            first.1,
            "",
        ),
        latency("stats", stats.0, stats.1),
        latency("health", health.0, health.1),
    ]
}

/// What the operator's calls cost beside a million delivered rows, against the same calls
/// on a file without history: each must cost what it returns.
fn admin_beside_history(dir: &std::path::Path) -> Vec<Line> {
    use sqlite_outbox::admin::{DeadFilter, HealthThresholds, State};
    // 1k pending, 20 dead, and `history` delivered rows (counted as the relay counts them).
    let build = |history: usize| {
        let outbox = Outbox::open(dir.join(format!("admin-{history}.db"))).unwrap();
        let conn = outbox.connection().unwrap();
        fill_delivered(&conn, history);
        conn.execute(
            "INSERT INTO outbox_delivered_totals VALUES ('default', ?1)",
            [history as i64],
        )
        .unwrap();
        fill_pending(&outbox, 1_000);
        let kill = "UPDATE outbox_events SET dead_at = 1, last_error = 'HTTP 400'
                     WHERE id IN (SELECT id FROM outbox_events INDEXED BY outbox_events_pending
                                   WHERE delivered_at IS NULL AND dead_at IS NULL
                                   ORDER BY id LIMIT 20)";
        conn.execute(kill, []).unwrap();
        drop(conn);
        (outbox, kill)
    };
    let median = |mut f: Box<dyn FnMut() + '_>| {
        let mut samples: Vec<Duration> = (0..21)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        quantile(&mut samples, 0.5)
    };
    let measure = |outbox: &Outbox, kill: &str| {
        let some_id: String = outbox
            .connection()
            .unwrap()
            .query_row(
                "SELECT event_id FROM outbox_events WHERE id = (SELECT MAX(id) / 2 FROM outbox_events)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let conn = outbox.connection().unwrap();
        vec![
            ("stats", median(Box::new(|| drop(outbox.stats().unwrap())))),
            (
                "health",
                median(Box::new(|| {
                    drop(outbox.health(HealthThresholds::default()).unwrap())
                })),
            ),
            (
                "show EVENT_ID",
                median(Box::new(|| drop(outbox.show(&some_id).unwrap()))),
            ),
            (
                "list --state dead",
                median(Box::new(|| {
                    drop(outbox.list(Some(State::Dead), 50).unwrap())
                })),
            ),
            (
                "retry --all-dead (20)",
                median(Box::new(|| {
                    outbox.retry_dead(&DeadFilter::default()).unwrap();
                    conn.execute(kill, []).unwrap();
                })),
            ),
            (
                "purge-dead (20)",
                median(Box::new(|| {
                    outbox.purge_dead(None).unwrap();
                    conn.execute(
                        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 20)
                         INSERT INTO outbox_events (event_id, event_type, payload, created_at,
                                                    available_at, dead_at)
                         SELECT printf('d%d', i), 't', '1', 1, 1, 1 FROM k",
                        [],
                    )
                    .unwrap();
                })),
            ),
        ]
    };
    let (small, small_kill) = build(0);
    let (large, large_kill) = build(1_000_000);
    let without = measure(&small, small_kill);
    let with = measure(&large, large_kill);
    with.into_iter()
        .zip(without)
        .map(|((what, full), (_, empty))| Line {
            what: format!("{what} beside 1M delivered"),
            outbox: ms(full),
            baseline: format!("{} (no history)", ms(empty)),
            ratio: format!("{:.2}×", full.as_secs_f64() / empty.as_secs_f64()),
            target: "≤ 10 ms",
        })
        .collect()
}

fn relay_http(dir: &std::path::Path, receiver: &CountingReceiver) -> Vec<Line> {
    let n = 20_000;
    let sample = bench_support::sample_event(&order_data(1));
    let single_body = sqlite_outbox::wire::structured_body(&sample).unwrap();
    let batch: Vec<OutboundEvent> = (0..100).map(|_| sample.clone()).collect();
    let batch_body = sqlite_outbox::wire::batch_body(&batch).unwrap();
    let mut lines = Vec::new();
    let mut round = 0;
    // The baseline of every row at one event per request: plain ureq keep-alive posts of
    // the same body over `workers` connections.
    let bare_rate = |workers: usize| {
        let start = receiver.count();
        let t = Instant::now();
        let content_type = "application/cloudevents+json";
        bare_posts(&receiver.url, &single_body, content_type, n, workers);
        assert!(receiver.wait_for(start + n as u64, Duration::from_secs(60)));
        rate(n, t.elapsed())
    };
    let plural = |workers: usize| if workers == 1 { "" } else { "s" };
    for workers in [1, 4, 8, 16] {
        let alternated = alternate_spread(
            5,
            || {
                round += 1;
                let path = dir.join(format!("relay-{round}.db"));
                rate(n, timed_drain(&path, receiver, n, workers, None))
            },
            || bare_rate(workers),
        );
        let plural = plural(workers);
        lines.push(
            Line::rates(
                format!("relay, 1 event/request, {workers} worker{plural}"),
                "events",
                alternated.a,
                alternated.b,
                "bare ureq",
                "≥ 0.85×",
            )
            .with_spread(&alternated),
        );
    }
    // What claiming and acking each event costs delivery on these cores, with none of the
    // crate's own work: the least relay against the same bare ureq loop.
    for workers in [1, 4, 8, 16] {
        let least = alternate_spread(
            5,
            || {
                round += 1;
                let path = dir.join(format!("least-relay-{round}.db"));
                rate(n, timed_least_relay(&path, receiver, n, workers))
            },
            || bare_rate(workers),
        );
        let plural = plural(workers);
        lines.push(
            Line::rates(
                format!("least relay (bare claim + ack, threads posting over ureq), 1 event/request, {workers} worker{plural}"),
                "events",
                least.a,
                least.b,
                "bare ureq",
                "(the floor)",
            )
            .with_spread(&least),
        );
    }
    // Batches: the receiver takes 100 events a request far faster than any claim + ack, so
    // the bound to compare with is the bare claim + ack loop (batches of 100, the crate's
    // own table), in the same run; the bare ureq rate is shown beside it.
    let n = 100_000;
    let mut bare_file = bare_connection(&dir.join("relay-bare-claim.db"), "NORMAL");
    let alternated = alternate_spread(
        5,
        || {
            round += 1;
            let path = dir.join(format!("relay-{round}.db"));
            rate(n, timed_drain(&path, receiver, n, 4, Some(100)))
        },
        || {
            fill_bare_pending(&mut bare_file, n);
            let t = Instant::now();
            let done = bare_claim_ack(&mut bare_file, 100, FAR, BareReturning::Id);
            rate(done, t.elapsed())
        },
    );
    let start = receiver.count();
    let t = Instant::now();
    bare_posts(
        &receiver.url,
        &batch_body,
        "application/cloudevents-batch+json",
        n / 100,
        4,
    );
    assert!(receiver.wait_for(start + n as u64, Duration::from_secs(60)));
    let ureq = rate(n, t.elapsed());
    lines.push(
        Line::rates(
            format!(
                "relay, 100 events/request, 4 workers (bare ureq posts the same: {})",
                per_s(ureq)
            ),
            "events",
            alternated.a,
            alternated.b,
            "bare claim + ack",
            "≥ 0.8×, ≥ 250k/s",
        )
        .with_spread(&alternated),
    );
    lines
}

/// A W3C traceparent of the shape an app's tracer hands out.
const BENCH_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The bench's order event, with a traceparent when `traced`.
fn maybe_traced(n: i64, traced: bool) -> Event {
    let event = order_event(n);
    if traced {
        event.traceparent(BENCH_TRACEPARENT)
    } else {
        event
    }
}

/// Fills `path` with `n` pending order events (traced or not) and times their drain at one
/// event per request over `workers` connections.
fn timed_traced_drain(
    path: &std::path::Path,
    receiver: &CountingReceiver,
    n: usize,
    workers: usize,
    traced: bool,
) -> Duration {
    let outbox = Outbox::open(path).unwrap();
    fill_pending_with(&outbox, n, |i| maybe_traced(i, traced));
    time_drain(&outbox, receiver, n, workers, None, |config| config)
}

/// What trace context costs: enqueue and relay rows with a traceparent on every event
/// against the same rows without, alternating in the same run (target ≥ 0.95×).
fn traced(dir: &std::path::Path, receiver: &CountingReceiver) -> Vec<Line> {
    let mut lines = Vec::new();
    let (_, traced_outbox, mut traced_own) = enqueue_files(dir, "traced", Synchronous::Normal);
    let (_, plain_outbox, mut plain_own) = enqueue_files(dir, "untraced", Synchronous::Normal);
    let (mut n1, mut n2) = (0, 0);
    let one_tx = |outbox: &Outbox, own: &mut Connection, n: i64, traced: bool| {
        let tx = own
            .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        insert_order(&tx, n);
        let _ = outbox.enqueue(&tx, maybe_traced(n, traced)).unwrap();
        tx.commit().unwrap();
    };
    let alternated = alternate_spread(
        5,
        || {
            rate_of_txs(6_000, 1, &mut n1, |n| {
                one_tx(&traced_outbox, &mut traced_own, n, true)
            })
        },
        || {
            rate_of_txs(6_000, 1, &mut n2, |n| {
                one_tx(&plain_outbox, &mut plain_own, n, false)
            })
        },
    );
    lines.push(
        Line::rates(
            "enqueue with a traceparent, NORMAL, 1 event/tx".into(),
            "events",
            alternated.a,
            alternated.b,
            "without",
            "≥ 0.95×",
        )
        .with_spread(&alternated),
    );
    let (mut traced_round, mut plain_round) = (0, 0);
    let n = 20_000;
    let alternated = alternate_spread(
        5,
        || {
            traced_round += 1;
            let path = dir.join(format!("traced-relay-{traced_round}.db"));
            rate(n, timed_traced_drain(&path, receiver, n, 4, true))
        },
        || {
            plain_round += 1;
            let path = dir.join(format!("untraced-relay-{plain_round}.db"));
            rate(n, timed_traced_drain(&path, receiver, n, 4, false))
        },
    );
    lines.push(
        Line::rates(
            "relay with a traceparent on every event, 1 event/request, 4 workers".into(),
            "events",
            alternated.a,
            alternated.b,
            "without",
            "≥ 0.95×",
        )
        .with_spread(&alternated),
    );
    lines
}

/// Relay throughput by worker count and batch size, as CSV on stdout (for the plot in docs/PERFORMANCE.md:
/// `cargo run --release --example bench -- sweep > sweep.csv`).
fn sweep(dir: &std::path::Path, receiver: &CountingReceiver) {
    println!("workers,batch,events_per_second");
    let mut round = 0;
    for batch in [1usize, 10, 100] {
        for workers in [1usize, 2, 4, 8, 16] {
            round += 1;
            let n = if batch == 1 { 20_000 } else { 100_000 };
            let path = dir.join(format!("sweep-{round}.db"));
            let r = rate(
                n,
                timed_drain(&path, receiver, n, workers, (batch > 1).then_some(batch)),
            );
            println!("{workers},{batch},{r:.0}");
            eprintln!("workers {workers}, batch {batch}: {}", per_s(r));
        }
    }
}

/// Commit-to-receipt latencies of 1,000 single commits, each waited for, through an idle
/// relay (with the durability barrier on, or off to show its cost).
fn receipt_latencies(dir: &std::path::Path, barrier: bool, round: usize) -> Vec<Duration> {
    let outbox = Outbox::open(dir.join(format!("latency-{barrier}-{round}.db"))).unwrap();
    let receiver = CountingReceiver::start();
    let mut config = RelayConfig::http(&receiver.url).workers(2);
    if !barrier {
        config = bench_support::without_durability_barrier(config);
    }
    let relay = outbox.relay(config).start().unwrap();
    let mut samples = Vec::new();
    for i in 0..1_000 {
        let before = receiver.count();
        let t = Instant::now();
        let _ = outbox
            .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", order_data(i))))
            .unwrap();
        assert!(receiver.wait_for(before + 1, Duration::from_secs(10)));
        samples.push(t.elapsed());
    }
    let _ = relay.shutdown();
    samples
}

/// The idle row of `commit_to_receipt` alone, barrier on, for comparing builds quickly
/// (`target/release/examples/bench probe-idle 5`, about 3 s): each round's p50 and all of
/// them together.
fn probe_idle(dir: &std::path::Path, rounds: usize) {
    let mut all = Vec::new();
    for round in 0..rounds {
        let mut samples = receipt_latencies(dir, true, round);
        eprint!("{} ", ms(quantile(&mut samples, 0.5)));
        all.extend(samples);
    }
    eprintln!();
    println!(
        "commit → receipt, idle relay, p50 {}",
        ms(quantile(&mut all, 0.5))
    );
}

fn commit_to_receipt(dir: &std::path::Path) -> Vec<Line> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..3 {
        with.extend(receipt_latencies(dir, true, round));
        without.extend(receipt_latencies(dir, false, round));
    }
    let p50 = quantile(&mut with, 0.5);
    let p99 = quantile(&mut with, 0.99);
    let bare_p50 = quantile(&mut without, 0.5);
    vec![
        Line {
            what: "commit → receipt, idle relay, p50".into(),
            outbox: ms(p50),
            baseline: format!("{} (barrier off)", ms(bare_p50)),
            ratio: format!(
                "+{:.3} ms",
                (p50.as_secs_f64() - bare_p50.as_secs_f64()) * 1e3
            ),
            target: "≤ 1 ms, barrier ≤ +0.3 ms",
        },
        Line {
            what: "commit → receipt, idle relay, p99".into(),
            outbox: ms(p99),
            baseline: "".into(),
            ratio: "".into(),
            target: "≤ 2 ms",
        },
    ]
}

/// Commit-to-receipt p99 while the app commits steadily at 1, 10 and 100 commits a
/// millisecond for two seconds (one event each; the relay with 4 workers batching up to 100
/// events a request). A rate one thread cannot reach is run flat out, and the row says
/// the rate made.
fn receipt_under_load(dir: &std::path::Path) -> Vec<Line> {
    let mut lines = Vec::new();
    for per_ms in [1usize, 10, 100] {
        let outbox = Outbox::open(dir.join(format!("load-{per_ms}.db"))).unwrap();
        let receiver = TimingReceiver::start();
        let destination = Destination::http("default", &receiver.url).batch(100, 1 << 20);
        let relay = outbox
            .relay(RelayConfig::new().destination(destination).workers(4))
            .start()
            .unwrap();
        let run = Duration::from_secs(2);
        let start = Instant::now();
        let mut committed: Vec<Instant> = Vec::new();
        let mut slot = 0;
        while start.elapsed() < run {
            slot += 1;
            for _ in 0..per_ms {
                let order_id = committed.len() as i64;
                let t = Instant::now();
                let _ = outbox
                    .transaction(|tx| {
                        outbox.enqueue(tx, Event::new("order.created", order_data(order_id)))
                    })
                    .unwrap();
                committed.push(t);
            }
            let due = start + Duration::from_millis(slot);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let made = committed.len() as f64 / start.elapsed().as_secs_f64() / 1e3;
        assert!(
            receiver.wait_for(committed.len(), Duration::from_secs(60)),
            "every event arrives"
        );
        let _ = relay.shutdown();
        let mut samples: Vec<Duration> = committed
            .iter()
            .enumerate()
            .map(|(order_id, t)| {
                let arrived = receiver.arrived(order_id as i64).expect("arrived");
                arrived.saturating_duration_since(*t)
            })
            .collect();
        lines.push(Line {
            what: format!(
                "commit → receipt p99, {per_ms} commits/ms asked ({made:.1}/ms made, {} events), batches ≤ 100",
                committed.len()
            ),
            outbox: ms(quantile(&mut samples, 0.99)),
            baseline: "".into(),
            ratio: "".into(),
            target: "",
        });
    }
    lines
}

/// Events per second to a Mosquitto broker on 127.0.0.1, against a bare rumqttc QoS 1 loop
/// with the same in-flight window, in the same run: 4 workers with one publish each, and 4
/// workers publishing batches of 25 and of 100 back to back (windows of 100 and 400).
#[cfg(feature = "mqtt")]
fn relay_mqtt(dir: &std::path::Path) -> Vec<Line> {
    use sqlite_outbox::transport::MqttConfig;
    let Some(broker) = support_mqtt::Broker::start() else {
        eprintln!("mosquitto is not installed: no MQTT rows");
        return Vec::new();
    };
    let sample = bench_support::sample_event(&order_data(1));
    let payload = sqlite_outbox::wire::structured_body(&sample).unwrap();
    let round = std::cell::Cell::new(0);
    let mut lines = Vec::new();
    for (n, workers, batch) in [(10_000, 4, 1), (30_000, 4, 25), (40_000, 4, 100)] {
        let window = workers * batch;
        let alternated = alternate_spread(
            5,
            || {
                round.set(round.get() + 1);
                let outbox = Outbox::open(dir.join(format!("mqtt-{}.db", round.get()))).unwrap();
                fill_pending(&outbox, n);
                let url = format!("mqtt://127.0.0.1:{}", broker.port);
                let mut destination = Destination::mqtt("default", url)
                    .mqtt_config(MqttConfig::new().topic("bench/outbox/{type}"));
                if batch > 1 {
                    destination = destination.batch(batch, usize::MAX);
                }
                let started = Instant::now();
                let relay = outbox
                    .relay(RelayConfig::new().destination(destination).workers(workers))
                    .start()
                    .unwrap();
                let deadline = Instant::now() + Duration::from_secs(120);
                while relay.stats().delivered < n as u64 {
                    assert!(Instant::now() < deadline, "the MQTT drain stalled");
                    // 1 ms: the bare loop's end is a join, not a poll; a poll every 200 µs
                    // took a wakeup every 200 µs from the two cores the relay and the broker
                    // share. The end is then known to within 1 ms of a run of 0.2 s or more.
                    std::thread::sleep(Duration::from_millis(1));
                }
                let took = started.elapsed();
                let _ = relay.shutdown();
                rate(n, took)
            },
            || {
                rate(
                    n,
                    support_mqtt::bare_publish(broker.port, &payload, n, window as u16),
                )
            },
        );
        lines.push(
            Line::rates(
                format!(
                    "relay to Mosquitto, QoS 1, {window} in flight ({workers} workers × {batch})"
                ),
                "events",
                alternated.a,
                alternated.b,
                "bare rumqttc",
                "≥ 0.7×",
            )
            .with_spread(&alternated),
        );
    }
    lines
}

#[cfg(not(feature = "mqtt"))]
fn relay_mqtt(_dir: &std::path::Path) -> Vec<Line> {
    Vec::new()
}

/// One drain of 60,000 events (or `PROBE_N`) at one event per request, by the relay
/// (`relay`), the least relay (`least-relay`, see [`least_relay`]) or the bare ureq loop
/// (`bare`), alone in the process, so that a profiler sees one configuration: `perf sched
/// record target/release/examples/bench probe relay 4`. Prints the rate and each thread's
/// CPU time an event.
fn probe(dir: &std::path::Path, receiver: &CountingReceiver, what: &str, workers: usize) {
    let n: usize = std::env::var("PROBE_N").map_or(60_000, |v| v.parse().unwrap());
    let cpu = ThreadCpu::start();
    let took = if what == "relay" {
        timed_drain(&dir.join("probe.db"), receiver, n, workers, None)
    } else if what == "least-relay" {
        timed_least_relay(&dir.join("probe-least-relay.db"), receiver, n, workers)
    } else {
        let sample = bench_support::sample_event(&order_data(1));
        let body = sqlite_outbox::wire::structured_body(&sample).unwrap();
        let started = Instant::now();
        bare_posts(
            &receiver.url,
            &body,
            "application/cloudevents+json",
            n,
            workers,
        );
        assert!(receiver.wait_for(n as u64, Duration::from_secs(60)));
        started.elapsed()
    };
    eprintln!("{what}, {workers} workers: {}", per_s(rate(n, took)));
    let by_name = cpu.finish();
    let total: u64 = by_name.iter().map(|(_, ns)| ns).sum();
    let per_event = |ns: u64| ns as f64 / 1_000.0 / n as f64;
    let threads: Vec<String> = by_name
        .iter()
        .map(|(name, ns)| format!("{name} {:.1}", per_event(*ns)))
        .collect();
    eprintln!(
        "  CPU µs an event: {:.1} in all; {}",
        per_event(total),
        threads.join(", ")
    );
}

/// Each thread's CPU time while a probe runs, summed by thread name (the process's main
/// thread, which builds the backlog, left out): read from `/proc` every 5 ms, so a thread
/// that ends meanwhile counts up to its last reading.
struct ThreadCpu {
    stop: Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<std::collections::HashMap<u32, (String, u64)>>,
    at_start: std::collections::HashMap<u32, (String, u64)>,
}

impl ThreadCpu {
    fn read() -> std::collections::HashMap<u32, (String, u64)> {
        let main = std::process::id();
        thread_samples()
            .into_iter()
            .filter(|(tid, t)| *tid != main && t.name != "cpu-sampler")
            .map(|(tid, t)| (tid, (t.name, t.cpu_ns)))
            .collect()
    }

    fn start() -> ThreadCpu {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let at_start = ThreadCpu::read();
        let stopping = stop.clone();
        let sampler = std::thread::Builder::new()
            .name("cpu-sampler".into())
            .spawn(move || {
                let mut last = std::collections::HashMap::new();
                while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                    last.extend(ThreadCpu::read());
                    std::thread::sleep(Duration::from_millis(5));
                }
                last.extend(ThreadCpu::read());
                last
            })
            .unwrap();
        ThreadCpu {
            stop,
            sampler,
            at_start,
        }
    }

    /// CPU ns by thread name, digits dropped so that a pool's threads add up.
    fn finish(self) -> Vec<(String, u64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let last = self.sampler.join().unwrap();
        let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
        for (tid, (comm, ns)) in last {
            let before = self.at_start.get(&tid).map_or(0, |(_, ns)| *ns);
            let name = comm.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
            *by_name.entry(name.to_string()).or_default() += ns.saturating_sub(before);
        }
        by_name.into_iter().filter(|(_, ns)| *ns > 0).collect()
    }
}

/// Drains `n` events from a fresh file with [`least_relay`], timed from its first claim to
/// the receiver's count.
fn timed_least_relay(
    path: &std::path::Path,
    receiver: &CountingReceiver,
    n: usize,
    workers: usize,
) -> Duration {
    let mut conn = bare_connection(path, "NORMAL");
    fill_bare_pending(&mut conn, n);
    let before = receiver.count();
    let started = Instant::now();
    let acked = std::thread::scope(|s| {
        let conn = &mut conn;
        std::thread::Builder::new()
            .name("bare-writer".into())
            .spawn_scoped(s, || least_relay(conn, &receiver.url, workers))
            .unwrap()
            .join()
            .unwrap()
    });
    assert_eq!(acked, n);
    assert!(receiver.wait_for(before + n as u64, Duration::from_secs(60)));
    started.elapsed()
}

/// The least relay: one thread claims with the bare loop's statement (batches of 100,
/// returning the event's columns, at most 400 rows in flight) and acks with its `UPDATE`
/// per row, one transaction for the answers gathered over a millisecond; `workers` threads
/// post each claimed row as a structured CloudEvent over plain ureq keep-alive connections
/// and hand its id back. No retries, priorities, keys, signatures, timeouts or checkpoints
/// of its own: what claiming and acking every event costs delivery at one event per
/// request, with none of the crate's features. Returns the rows acked.
fn least_relay(conn: &mut rusqlite::Connection, url: &str, workers: usize) -> usize {
    const IN_FLIGHT: usize = 400;
    let (to_post, posts) = crossbeam_channel::bounded::<(i64, String)>(IN_FLIGHT);
    let (to_ack, answers) = crossbeam_channel::unbounded::<i64>();
    let agent = bare_agent(workers);
    std::thread::scope(|s| {
        for _ in 0..workers {
            let (posts, to_ack, agent) = (posts.clone(), to_ack.clone(), agent.clone());
            let poster = std::thread::Builder::new().name("bare-poster".into());
            poster
                .spawn_scoped(s, move || {
                    for (id, payload) in posts {
                        let mut r = agent
                            .post(url)
                            .header("content-type", "application/cloudevents+json")
                            .send(payload.as_bytes())
                            .expect("bare post");
                        let _ = r.body_mut().read_to_vec();
                        to_ack.send(id).unwrap();
                    }
                })
                .unwrap();
        }
        drop((posts, to_ack));
        let (mut in_flight, mut acked, mut drained) = (0usize, 0usize, false);
        let mut ids = Vec::new();
        loop {
            if !drained && in_flight + 100 <= IN_FLIGHT {
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .unwrap();
                let claim = bare_claim_sql(BareReturning::EventColumns, true);
                let claimed: Vec<(i64, String)> = tx
                    .prepare_cached(&claim)
                    .unwrap()
                    .query_map([100], |row| {
                        // A structured CloudEvent of the row, as the relay sends it.
                        let body = format!(
                            r#"{{"specversion":"1.0","id":"{}","source":"/bench","type":"{}","datacontenttype":"application/json","data":{}}}"#,
                            row.get_ref(1)?.as_str()?,
                            row.get_ref(2)?.as_str()?,
                            row.get_ref(7)?.as_str()?
                        );
                        Ok((row.get(0)?, body))
                    })
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                tx.commit().unwrap();
                drained = claimed.is_empty();
                in_flight += claimed.len();
                for event in claimed {
                    to_post.send(event).unwrap();
                }
            }
            if drained && in_flight == 0 {
                break;
            }
            // Waits for an answer only when it cannot claim.
            if drained || in_flight + 100 > IN_FLIGHT {
                let answer = answers.recv_timeout(Duration::from_secs(60));
                ids.push(answer.expect("a poster answers within a minute"));
                // Gathers answers for 1 ms with a plain sleep, as the relay's writer does:
                // acks in one transaction each time, not one per answer.
                std::thread::sleep(Duration::from_millis(1));
            }
            ids.extend(answers.try_iter());
            if ids.is_empty() {
                continue;
            }
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            for id in ids.drain(..) {
                tx.prepare_cached(BARE_ACK_SQL)
                    .unwrap()
                    .execute([id, FAR])
                    .unwrap();
                in_flight -= 1;
                acked += 1;
            }
            tx.commit().unwrap();
        }
        drop(to_post);
        acked
    })
}

/// The bare enqueue's `INSERT` with one of the crate's additions at a time, for
/// [`probe_enqueue`]: what each costs per event, counted by a profiler.
fn bare_insert_variant(variant: &str) -> Option<String> {
    let (id, id_value) = match variant {
        "bare+high-water" => (
            "id, ",
            "(SELECT high_water + 1 FROM outbox_stats WHERE id = 1 AND high_water > 0
               AND high_water >= (SELECT COALESCE(MAX(id), 0) FROM outbox_events)), ",
        ),
        _ => ("", ""),
    };
    let available_at = match variant {
        "bare+parking" => {
            "CASE WHEN ?2 IS NOT NULL AND EXISTS (
                 SELECT 1 FROM outbox_events AS k
                  WHERE k.partition_key = ?2 AND k.destination = 'default'
                    AND k.delivered_at IS NULL AND k.dead_at IS NULL)
             THEN 9223372036854775807 ELSE ?4 END"
        }
        _ => "?4",
    };
    let (columns, values) = match variant {
        "bare+columns" => (
            ", source, subject, idempotency_key, coalesce_key, droppable, priority, expires_at",
            ", '/bench', NULL, NULL, NULL, 0, 5, NULL) ON CONFLICT DO NOTHING",
        ),
        "bare" | "bare+high-water" | "bare+parking" => ("", ")"),
        _ => return None,
    };
    Some(format!(
        "INSERT INTO outbox_events ({id}event_id, destination, event_type, partition_key,
             payload, created_at, available_at{columns})
         VALUES ({id_value}?1, 'default', 'order.created', ?2, ?3, ?4, {available_at}{values}"
    ))
}

/// 100 transactions (or `PROBE_TXS`) of 100 keyed events, through `Outbox::enqueue`
/// (`outbox`), `Outbox::enqueue_many` (`outbox-many`), the bare loop (`bare`), the bare
/// loop plus one of the crate's additions (`bare+high-water`, `bare+parking`,
/// `bare+columns`) or a bare transaction that writes its rows with one `INSERT`
/// (`bare+listed`), alone in the process after the same setup (`none` stops there), so
/// that a profiler counts one variant: `valgrind --tool=callgrind
/// target/release/examples/bench probe-enqueue bare+parking`, less the `none` run, is
/// what the variant costs.
fn probe_enqueue(dir: &std::path::Path, variant: &str) {
    let (txs, per_tx) = (
        std::env::var("PROBE_TXS")
            .map(|v| v.parse().unwrap())
            .unwrap_or(100),
        100,
    );
    let (mut bare, outbox, mut own) = enqueue_files(dir, "probe", Synchronous::Normal);
    let sql = bare_insert_variant(variant);
    let listed_sql = bare_listed_insert_sql(per_tx);
    let started = Instant::now();
    for t in 0..txs {
        let n = t * per_tx;
        match (variant, &sql) {
            ("none", _) => return,
            ("outbox", _) => outbox_enqueue_tx(&outbox, &mut own, n, per_tx),
            ("outbox-many", _) => outbox_enqueue_many_tx(&outbox, &mut own, n, per_tx),
            ("bare+listed", _) => bare_enqueue_listed_tx(&mut bare, &listed_sql, n, per_tx),
            (_, Some(sql)) => {
                let tx = bare
                    .transaction_with_behavior(
                        sqlite_outbox::rusqlite::TransactionBehavior::Immediate,
                    )
                    .unwrap();
                for i in 0..per_tx {
                    insert_order(&tx, n + i);
                    let payload = serde_json::to_string(&order_data(n + i)).unwrap();
                    tx.prepare_cached(sql)
                        .unwrap()
                        .execute(sqlite_outbox::rusqlite::params![
                            uuid::Uuid::now_v7().to_string(),
                            "customer-7",
                            payload,
                            n
                        ])
                        .unwrap();
                }
                tx.commit().unwrap();
            }
            (_, None) => panic!(
                "probe-enqueue: none, outbox, outbox-many, bare, bare+high-water, bare+parking, bare+columns or bare+listed"
            ),
        }
    }
    eprintln!(
        "{variant}: {}",
        per_s(rate((txs * per_tx) as usize, started.elapsed()))
    );
}

/// Pending events (20,000, or `PROBE_N`) claimed and acked in batches of 100 through the
/// crate (`outbox`; `outbox-keyed` for a backlog of 500 partition keys), the bare loop
/// (`bare`) or the bare loop returning the event's columns (`bare+columns`), alone in the process after the same setup (`none` stops there), so
/// that a profiler counts one of them: `valgrind --tool=callgrind
/// target/release/examples/bench probe-claim outbox`, less the `none` run, is what the
/// crate's claim + ack costs. Prints the rate and the CPU time of the loop's thread (from
/// `/proc/thread-self/schedstat`), which other work on the machine moves less than the rate.
/// `PROBE_NUMBERING=off` turns stream numbers off (`internal::set_stream_numbers`), to show
/// their share.
fn probe_claim(dir: &std::path::Path, variant: &str) {
    let n: usize = std::env::var("PROBE_N")
        .map(|v| v.parse().unwrap())
        .unwrap_or(20_000);
    let outbox = Outbox::open(dir.join("probe-claim.db")).unwrap();
    if std::env::var("PROBE_NUMBERING").as_deref() == Ok("off") {
        sqlite_outbox::internal::set_stream_numbers(false);
    }
    let mut bare = bare_connection(&dir.join("probe-bare-claim.db"), "NORMAL");
    if variant == "outbox-keyed" {
        // 500 keys, each with its events in commit order: a claim takes only keys' heads,
        // and every ack unparks the next event of each key it acked.
        let mut conn = outbox.connection().unwrap();
        let tx = conn.transaction().unwrap();
        for i in 0..n {
            let event = Event::new("order.created", order_data(i as i64))
                .partition_key(format!("customer-{}", i % 500));
            let _ = outbox.enqueue(&tx, event).unwrap();
        }
        tx.commit().unwrap();
    } else {
        fill_pending(&outbox, n);
    }
    fill_bare_pending(&mut bare, n);
    // The thread's time on the CPU so far, in ns (the first field).
    let cpu = || -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let cpu0 = cpu();
    let started = Instant::now();
    let done = match variant {
        "none" => return,
        "outbox" | "outbox-keyed" => outbox_claim_ack(&outbox, FAR),
        "bare" => bare_claim_ack(&mut bare, 100, FAR, BareReturning::Id),
        "bare+columns" => bare_claim_ack(&mut bare, 100, FAR, BareReturning::EventColumns),
        _ => panic!("probe-claim: none, outbox, outbox-keyed, bare or bare+columns"),
    };
    assert_eq!(done, n);
    eprintln!(
        "{variant}: {} cpu {} ms",
        per_s(rate(done, started.elapsed())),
        (cpu() - cpu0) / 1_000_000
    );
}

/// What an app pays to link the crate: the crates a project that depends on it with default
/// features builds (`cargo tree -e normal`), against rusqlite and ureq alone, and the stripped
/// release size of `examples/footprint_app.rs` (open, enqueue in a transaction, HTTPS relay)
/// against `examples/footprint_bare.rs` (the same with only rusqlite and ureq).
fn footprint() -> Vec<Line> {
    let root = env!("CARGO_MANIFEST_DIR");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let crates = |packages: &[&str]| -> usize {
        let mut command = std::process::Command::new(&cargo);
        command
            .current_dir(root)
            .args(["tree", "-e", "normal", "--prefix", "none", "--locked"]);
        for package in packages {
            command.args(["-p", package]);
        }
        let out = command.output().expect("run cargo tree");
        assert!(
            out.status.success(),
            "cargo tree: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let unique: std::collections::BTreeSet<&str> = text
            .lines()
            .map(|l| l.trim_end_matches(" (*)").trim())
            .filter(|l| !l.is_empty())
            .collect();
        unique.len()
    };
    let ours = crates(&["sqlite-outbox"]);
    let bare = crates(&["rusqlite", "ureq"]);
    let built = std::process::Command::new(&cargo)
        .current_dir(root)
        .args([
            "build",
            "--locked",
            "--profile",
            "footprint",
            "--example",
            "footprint_app",
            "--example",
            "footprint_bare",
        ])
        .status()
        .expect("run cargo build");
    assert!(built.success(), "cargo build --profile footprint failed");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{root}/target"));
    let size = |name: &str| {
        std::fs::metadata(format!("{target}/footprint/examples/{name}"))
            .expect("the footprint example was built")
            .len() as f64
    };
    let (app, bare_app) = (size("footprint_app"), size("footprint_bare"));
    let mib = |b: f64| format!("{:.2} MiB", b / (1024.0 * 1024.0));
    vec![
        Line {
            what: "crates an app builds to depend on it (default features, cargo tree -e normal)"
                .into(),
            outbox: format!("{ours} crates"),
            baseline: format!("{bare} (rusqlite bundled + ureq alone)"),
            ratio: format!(
                "{:.2}× (+{})",
                ours as f64 / bare as f64,
                ours - bare.min(ours)
            ),
            target: "",
        },
        Line {
            what: "stripped release size of a minimal app (examples/footprint_app.rs)".into(),
            outbox: mib(app),
            baseline: format!(
                "{} (footprint_bare: rusqlite bundled + ureq)",
                mib(bare_app)
            ),
            ratio: format!(
                "{:.2}× (the crate's share: {})",
                app / bare_app,
                mib(app - bare_app)
            ),
            target: "",
        },
    ]
}

/// What the durability barrier costs a drain, barrier on against off: of a backlog committed
/// just before (the worst case: the first claim syncs the whole backlog's WAL, which without
/// the barrier the background checkpoint would sync instead), and of a backlog already on
/// disk, as one that built up while the device was offline is.
fn barrier_drain(dir: &std::path::Path, receiver: &CountingReceiver, on_disk: bool) -> Line {
    // Drains of 60,000 events: one of 30,000 took about 0.2 s once acks were listed, and
    // the rows swung from 0.80× to 1.09× from run to run.
    let n = 60_000;
    let round = std::cell::Cell::new(0);
    let drain = |barrier: bool| {
        round.set(round.get() + 1);
        let path = dir.join(format!("barrier-{on_disk}-{}.db", round.get()));
        let took = timed_drain_with(&path, receiver, n, 4, Some(100), on_disk, |config| {
            if barrier {
                config
            } else {
                bench_support::without_durability_barrier(config)
            }
        });
        rate(n, took)
    };
    let alternated = alternate_spread(5, || drain(true), || drain(false));
    let backlog = if on_disk {
        "backlog on disk"
    } else {
        "backlog just committed"
    };
    Line::rates(
        format!("relay, 100 events/request, 4 workers, {backlog}: barrier on / off"),
        "events",
        alternated.a,
        alternated.b,
        "barrier off",
        "≥ 0.9×",
    )
    .with_spread(&alternated)
}

/// Runs in a child process: drains the backlog at `path` to `url`, prints peak RSS in KiB.
fn rss_child(path: &str, url: &str, n: u64) {
    let outbox = Outbox::open(path).unwrap();
    let relay = outbox
        .relay(
            RelayConfig::new().destination(Destination::http("default", url).batch(100, 1 << 20)),
        )
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(100);
    while relay.stats().delivered < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = relay.shutdown();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("0")
            .to_string()
    };
    // The peak, then what the process holds at the end, split into its own memory (heap,
    // stacks, SQLite's caches) and mapped files (mostly this bench binary's code, which a
    // program linking only the crate would not carry).
    println!("{} {} {}", kib("VmHWM:"), kib("RssAnon:"), kib("RssFile:"));
}

fn peak_rss(dir: &std::path::Path, receiver: &CountingReceiver) -> Line {
    let n = 1_000_000u64;
    let path = dir.join("rss.db");
    {
        let outbox = Outbox::open(&path).unwrap();
        fill_pending(&outbox, n as usize);
    }
    let t = Instant::now();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--rss-child",
            path.to_str().unwrap(),
            &receiver.url,
            &n.to_string(),
        ])
        .output()
        .unwrap();
    let kib: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().unwrap_or(0.0))
        .collect();
    let mib = |i: usize| kib.get(i).copied().unwrap_or(0.0) / 1024.0;
    Line {
        what: format!("peak RSS draining 1M events (batched, {:.1?})", t.elapsed()),
        outbox: format!("{:.1} MiB", mib(0)),
        baseline: format!(
            "at the end {:.1} MiB own memory, {:.1} MiB mapped files (the bench binary)",
            mib(1),
            mib(2)
        ),
        ratio: "".into(),
        target: "≤ 16 MiB",
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 5 && args[1] == "--rss-child" {
        rss_child(&args[2], &args[3], args[4].parse().unwrap());
        return;
    }
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let receiver = Arc::new(CountingReceiver::start());
    if let (Some("probe"), Some(what), Some(workers)) = (
        args.get(1).map(String::as_str),
        args.get(2),
        args.get(3).and_then(|w| w.parse().ok()),
    ) {
        probe(dir, &receiver, what, workers);
        return;
    }
    if let (Some("probe-enqueue"), Some(variant)) = (args.get(1).map(String::as_str), args.get(2)) {
        probe_enqueue(dir, variant);
        return;
    }
    if args.get(1).map(String::as_str) == Some("probe-drain-latency") {
        probe_drain_latency(dir, &receiver);
        return;
    }
    if let (Some("probe-claim"), Some(variant)) = (args.get(1).map(String::as_str), args.get(2)) {
        probe_claim(dir, variant);
        return;
    }
    if let (Some("probe-idle"), Some(rounds)) = (
        args.get(1).map(String::as_str),
        args.get(2).and_then(|r| r.parse().ok()),
    ) {
        probe_idle(dir, rounds);
        return;
    }
    if args.get(1).map(String::as_str) == Some("sweep") {
        sweep(dir, &receiver);
        return;
    }
    // `cargo run --release --example bench -- relay latency` runs only those sections.
    let only: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let run = |name: &str| only.is_empty() || only.contains(&name);
    let mut lines = Vec::new();
    if run("enqueue") {
        eprintln!("enqueue…");
        lines.push(enqueue(
            dir,
            "NORMAL, 1 event/tx",
            Synchronous::Normal,
            1,
            6_000,
        ));
        lines.push(enqueue(dir, "FULL, 1 event/tx", Synchronous::Full, 1, 300));
        lines.push(enqueue(
            dir,
            "NORMAL, 100 events/tx",
            Synchronous::Normal,
            100,
            200,
        ));
        lines.extend(enqueue_many(dir, 100, 200));
    }
    if run("numbers") {
        eprintln!("numbers…");
        lines.push(stream_numbers(dir, "NORMAL, 1 event/tx", 1, 6_000));
        lines.push(stream_numbers(dir, "NORMAL, 100 events/tx", 100, 200));
        lines.push(stream_numbers_claim(dir));
        lines.push(accounting_bytes(dir));
    }
    if run("sql") {
        eprintln!("sql…");
        lines.push(enqueue_sql(dir, "NORMAL, 1 event/tx", 1, 3_000));
        lines.push(enqueue_sql(dir, "NORMAL, 100 events/tx", 100, 40));
    }
    if run("honker") {
        eprintln!("honker…");
        lines.extend(versus_honker(dir));
    }
    if run("claim") {
        eprintln!("claim…");
        lines.extend(claim_ack(dir));
    }
    if run("relay") {
        eprintln!("relay…");
        lines.extend(relay_http(dir, &receiver));
        lines.push(barrier_drain(dir, &receiver, false));
        lines.push(barrier_drain(dir, &receiver, true));
    }
    if run("traced") {
        eprintln!("traced…");
        lines.extend(traced(dir, &receiver));
    }
    if run("mqtt") {
        eprintln!("mqtt…");
        lines.extend(relay_mqtt(dir));
    }
    if run("latency") {
        eprintln!("latency…");
        lines.extend(commit_to_receipt(dir));
        lines.extend(receipt_under_load(dir));
        lines.extend(commit_latency_while_draining(dir, &receiver));
    }
    if run("admin") {
        eprintln!("admin…");
        lines.extend(admin_beside_history(dir));
    }
    if run("growth") {
        eprintln!("growth…");
        lines.extend(growth(dir));
    }
    #[cfg(target_os = "linux")]
    if run("frugal") {
        eprintln!("frugal (about three and a half minutes)…");
        lines.extend(frugal::rows(dir));
    }
    if run("frugal") || run("budget") {
        eprintln!("budget…");
        lines.extend(budget::rows(dir));
    }
    if run("footprint") {
        eprintln!("footprint…");
        lines.extend(footprint());
    }
    if run("memory") {
        eprintln!("memory…");
        lines.push(peak_rss(dir, &receiver));
    }

    let header = [
        "measure",
        "outbox",
        "baseline (same run)",
        "ratio",
        "target",
    ];
    let rows: Vec<[String; 5]> = lines
        .iter()
        .map(|l| {
            [
                l.what.clone(),
                l.outbox.clone(),
                l.baseline.clone(),
                l.ratio.clone(),
                l.target.to_string(),
            ]
        })
        .collect();
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    eprintln!("took {:.0?}", started.elapsed());
}
