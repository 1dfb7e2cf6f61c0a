//! The bench's rows for the edge (issue 42, `-- frugal`): what an idle relay wakes and spends
//! beside honker's watcher; commit → receipt for another process's commits; gzip's bytes on
//! the wire and its cost; linger's requests and delay; the relay's CPU per delivered event at
//! a trickle and at a full drain.
//!
//! Wake-ups and CPU are read per thread from `/proc/self/task` ([`thread_samples`]).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlite_outbox::{Compression, Destination, Event, Outbox, RelayConfig};

use super::support::*;
use super::{alternate_spread, quantile, rate, timed_least_relay, Line, ThreadCpu};

/// The wake-ups and CPU nanoseconds that the threads `chosen` picks spent between two
/// samples (a thread born in between counts from zero).
fn spent(
    before: &HashMap<u32, ThreadSample>,
    after: &HashMap<u32, ThreadSample>,
    chosen: impl Fn(u32, &str) -> bool,
) -> (u64, u64) {
    let (mut wake_ups, mut cpu_ns) = (0, 0);
    for (tid, now) in after {
        if !chosen(*tid, &now.name) {
            continue;
        }
        let (w, c) = before.get(tid).map_or((0, 0), |b| (b.wake_ups, b.cpu_ns));
        wake_ups += now.wake_ups.saturating_sub(w);
        cpu_ns += now.cpu_ns.saturating_sub(c);
    }
    (wake_ups, cpu_ns)
}

/// The relay's threads: writer, checkpointer, workers, and the WAL watch's (the `notify`
/// crate's inotify loop).
fn relay_thread(name: &str) -> bool {
    name.starts_with("outbox-") || name.starts_with("notify-rs")
}

/// The relay threads born since `before` was sampled: those of the relay started since.
fn relay_threads_since(before: &HashMap<u32, ThreadSample>) -> HashSet<u32> {
    thread_samples()
        .into_iter()
        .filter(|(tid, t)| !before.contains_key(tid) && relay_thread(&t.name))
        .map(|(tid, _)| tid)
        .collect()
}

/// The median of `xs` and its lowest and highest.
fn median_spread(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

pub fn rows(dir: &Path) -> Vec<Line> {
    let mut lines = idle(dir);
    lines.extend(cross_process(dir));
    lines.extend(compression(dir));
    lines.extend(drain_cpu(dir));
    lines.extend(trickle(dir));
    lines
}

/// Windows of [`idle`]'s 60 s: the rows give the median window and the spread.
const IDLE_WINDOWS: usize = 6;
const IDLE_WINDOW: Duration = Duration::from_secs(10);

/// A relay (receiver up, nothing pending after one delivery) idle for 60 s, beside honker's
/// update watcher (its default 1 ms poll, which gives its cross-process wake) on a file of
/// its own, over the same 60 s.
fn idle(dir: &Path) -> Vec<Line> {
    let receiver = CountingReceiver::start();
    let outbox = Outbox::open(dir.join("idle.db")).unwrap();
    let relay = outbox
        .relay(RelayConfig::http(&receiver.url).retention(Some(Duration::from_secs(3600))))
        .start()
        .unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, order_event(1)))
        .unwrap();
    assert!(receiver.wait_for(1, Duration::from_secs(10)));
    let honker = honker::Database::open(dir.join("idle-honker.db")).unwrap();
    let _woken_by_honker = honker.update_events();
    // What follows a delivery (the checkpointer's look, a sweep) settles first.
    std::thread::sleep(Duration::from_secs(2));
    let honker_thread = |_: u32, name: &str| name.starts_with("honker");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut before = thread_samples();
    for _ in 0..IDLE_WINDOWS {
        std::thread::sleep(IDLE_WINDOW);
        let after = thread_samples();
        ours.push(spent(&before, &after, |_, name| relay_thread(name)));
        theirs.push(spent(&before, &after, honker_thread));
        before = after;
    }
    let _ = relay.shutdown();
    assert!(
        theirs.iter().any(|(w, _)| *w > 0),
        "honker's watcher thread not found"
    );
    let window = IDLE_WINDOW.as_secs_f64();
    let per_s = |xs: &[(u64, u64)]| median_spread(xs.iter().map(|x| x.0 as f64 / window).collect());
    let ms_per_min = |xs: &[(u64, u64)]| {
        median_spread(
            xs.iter()
                .map(|x| x.1 as f64 / 1e6 * 60.0 / window)
                .collect(),
        )
    };
    let (wake, wake_low, wake_high) = per_s(&ours);
    let (honker_wake, ..) = per_s(&theirs);
    let (cpu, cpu_low, cpu_high) = ms_per_min(&ours);
    let (honker_cpu, ..) = ms_per_min(&theirs);
    let spread = format!("over {IDLE_WINDOWS} × {}s", IDLE_WINDOW.as_secs());
    vec![
        Line {
            what: "idle relay, 60 s: wake-ups a second, all its threads".into(),
            outbox: format!("{wake:.2}/s ({wake_low:.2}–{wake_high:.2} {spread})"),
            baseline: format!("{honker_wake:.0}/s (honker's watcher)"),
            ratio: format!("{:.4}×", wake / honker_wake),
            target: "≤ 1/s",
        },
        Line {
            what: "idle relay, 60 s: CPU a minute, all its threads".into(),
            outbox: format!("{cpu:.1} ms ({cpu_low:.1}–{cpu_high:.1} {spread})"),
            baseline: format!("{honker_cpu:.0} ms (honker's watcher)"),
            ratio: format!("{:.4}×", cpu / honker_cpu),
            target: "≤ 100 ms",
        },
    ]
}

/// Rounds of [`cross_process`]: each a fresh file, 100 commits from another process and
/// 100 from this one, alternating.
const CROSS_ROUNDS: usize = 3;
const CROSS_COMMITS: usize = 100;
/// 20 commits a second: each lands on an idle relay.
const CROSS_PACE: Duration = Duration::from_millis(50);

/// Commit → receipt for commits from another process (python3's sqlite3, through the SQL
/// contract, 20 a second) with an idle relay, against the same commits from this process
/// (`Outbox::enqueue`, which wakes the relay in-process) at the same pace, same run.
fn cross_process(dir: &Path) -> Vec<Line> {
    let (mut theirs, mut ours) = (Vec::new(), Vec::new());
    let (mut their_p50s, mut our_p50s) = (Vec::new(), Vec::new());
    for round in 0..CROSS_ROUNDS {
        let mut other = receipts(dir, round, true);
        their_p50s.push(quantile(&mut other, 0.5));
        theirs.extend(other);
        let mut own = receipts(dir, round, false);
        our_p50s.push(quantile(&mut own, 0.5));
        ours.extend(own);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let range = |p50s: &mut Vec<Duration>| {
        p50s.sort();
        format!("{:.1}–{:.1}", ms(p50s[0]), ms(p50s[p50s.len() - 1]))
    };
    let (p50, p99, max) = (
        quantile(&mut theirs, 0.5),
        quantile(&mut theirs, 0.99),
        quantile(&mut theirs, 1.0),
    );
    let (own_p50, own_p99) = (quantile(&mut ours, 0.5), quantile(&mut ours, 0.99));
    let spread = format!("rounds' p50 {} ms", range(&mut their_p50s));
    // Without the feature the relay sees other processes' commits at its poll: the figure
    // before the WAL watch.
    let woken_by = if cfg!(feature = "wal-watch") {
        "WAL watch"
    } else {
        "poll only: no wal-watch feature"
    };
    vec![
        Line {
            what: format!(
                "commit → receipt, another process (SQL contract, 20 commits/s, {woken_by}), p50"
            ),
            outbox: format!("{:.1} ms ({spread})", ms(p50)),
            baseline: format!(
                "{:.1} ms (Outbox::enqueue, same pace; rounds {} ms)",
                ms(own_p50),
                range(&mut our_p50s)
            ),
            ratio: format!("+{:.1} ms", ms(p50) - ms(own_p50)),
            target: "≤ 5 ms",
        },
        Line {
            what: format!("commit → receipt, another process ({woken_by}), p99"),
            outbox: format!("{:.1} ms (max {:.1} ms)", ms(p99), ms(max)),
            baseline: format!("{:.1} ms (Outbox::enqueue)", ms(own_p99)),
            ratio: format!("+{:.1} ms", ms(p99) - ms(own_p99)),
            target: "≤ 20 ms",
        },
    ]
}

/// Commits at [`CROSS_PACE`] to a fresh file with an idle relay (every feature on, so the
/// WAL watch too) delivering to a timing receiver; returns each commit's time to receipt,
/// timed from when the commit returned.
fn receipts(dir: &Path, round: usize, from_another_process: bool) -> Vec<Duration> {
    let path = dir.join(format!("cross-{from_another_process}-{round}.db"));
    let outbox = Outbox::open(&path).unwrap();
    let receiver = TimingReceiver::start();
    let relay = outbox
        .relay(RelayConfig::http(&receiver.url))
        .start()
        .unwrap();
    let committed = if from_another_process {
        commits_from_python(&path)
    } else {
        paced_orders(&outbox, CROSS_COMMITS as i64, CROSS_PACE)
    };
    assert!(receiver.wait_for(CROSS_COMMITS, Duration::from_secs(30)));
    let _ = relay.shutdown();
    committed
        .iter()
        .map(|(n, at)| receiver.arrived(*n).unwrap().saturating_duration_since(*at))
        .collect()
}

/// A python3 child commits [`CROSS_COMMITS`] events through the SQL contract at
/// [`CROSS_PACE`] and prints each one's `order_id` once its commit returned; this process
/// notes when it read the line (a pipe's hop, microseconds, after the commit).
fn commits_from_python(path: &Path) -> Vec<(i64, Instant)> {
    let script = format!(
        "import json, sqlite3, sys, time\n\
         c = sqlite3.connect({path:?}, timeout=10, isolation_level=None)\n\
         start = time.monotonic()\n\
         for n in range({count}):\n\
         \x20   time.sleep(max(0.0, start + n * {pace} - time.monotonic()))\n\
         \x20   c.execute(\"INSERT INTO outbox_enqueue (type, data) VALUES ('order.created', ?)\", (json.dumps({{'order_id': n}}),))\n\
         \x20   sys.stdout.write('%d\\n' % n)\n\
         \x20   sys.stdout.flush()\n",
        path = path.display().to_string(),
        count = CROSS_COMMITS,
        pace = CROSS_PACE.as_secs_f64(),
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let stdout = child.stdout.take().unwrap();
    let committed = BufReader::new(stdout)
        .lines()
        .map(|line| (line.unwrap().trim().parse().unwrap(), Instant::now()))
        .collect::<Vec<_>>();
    assert!(child.wait().unwrap().success());
    assert_eq!(committed.len(), CROSS_COMMITS);
    committed
}

/// Telemetry events per drain of [`compression`], in batches of 100.
const METERED_EVENTS: usize = 10_000;

/// Batches of 100 of the bench's telemetry events drained with gzip and without, alternating:
/// bytes on the wire per event, the drain's rate, and the relay's CPU per event.
fn compression(dir: &Path) -> Vec<Line> {
    let receiver = CountingReceiver::start();
    let mut round = 0;
    let (mut bytes, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut drain = |compression: Compression| {
        round += 1;
        let outbox = Outbox::open(dir.join(format!("metered-{round}.db"))).unwrap();
        fill_pending_with(&outbox, METERED_EVENTS, telemetry_event);
        let (wire_before, before) = (receiver.wire_bytes(), thread_samples());
        let destination = Destination::http("default", &receiver.url)
            .batch(100, 1 << 20)
            .compress(compression);
        let config = RelayConfig::new().destination(destination).workers(2);
        let took = time_drain_to(&outbox, &receiver, METERED_EVENTS, config, thread_samples);
        let (_, cpu_ns) = spent(&before, &took.1, |_, name| relay_thread(name));
        let which = usize::from(compression == Compression::Gzip);
        bytes[which].push((receiver.wire_bytes() - wire_before) as f64 / METERED_EVENTS as f64);
        cpu[which].push(cpu_ns as f64 / 1e3 / METERED_EVENTS as f64);
        rate(METERED_EVENTS, took.0)
    };
    let drain = std::cell::RefCell::new(&mut drain);
    let rates = alternate_spread(
        5,
        || (drain.borrow_mut())(Compression::Gzip),
        || (drain.borrow_mut())(Compression::None),
    );
    let [plain_bytes, gzip_bytes] = bytes.map(|b| median_spread(b).0);
    let [plain_cpu, gzip_cpu] = cpu.map(|c| median_spread(c).0);
    vec![
        Line {
            what: "bytes on the wire per event, telemetry in batches of 100, gzip".into(),
            outbox: format!("{gzip_bytes:.0} B"),
            baseline: format!("{plain_bytes:.0} B (uncompressed)"),
            ratio: format!("{:.0}%", gzip_bytes / plain_bytes * 100.0),
            target: "≤ 25%",
        },
        Line::rates(
            format!("relay drain, gzip, telemetry in batches of 100, {METERED_EVENTS} queued"),
            "events",
            rates.a,
            rates.b,
            "uncompressed",
            "≈ 1×",
        )
        .with_spread(&rates),
        Line {
            what: "relay CPU per delivered event, full drain, batches of 100, gzip".into(),
            outbox: format!("{gzip_cpu:.1} µs"),
            baseline: format!("{plain_cpu:.1} µs (uncompressed)"),
            ratio: format!("{:.2}×", gzip_cpu / plain_cpu),
            target: "shown",
        },
    ]
}

/// Events per drain of [`drain_cpu`], one a request.
const DRAIN_EVENTS: usize = 20_000;

/// The relay's CPU per delivered event draining a backlog at one event a request (two
/// workers), against the bench's least relay (one claiming thread, two posters, no features)
/// draining the same backlog: what the crate's features cost a delivered event in CPU. Read
/// with the bench's [`ThreadCpu`] sampler, which keeps the least relay's threads' last
/// reading after they end (up to 5 ms of their CPU is lost, under 3% of a drain's).
fn drain_cpu(dir: &Path) -> Vec<Line> {
    let receiver = CountingReceiver::start();
    let round = std::cell::Cell::new(0);
    let next_file = |name: &str| {
        round.set(round.get() + 1);
        dir.join(format!("cpu-{name}-{}.db", round.get()))
    };
    let per_event = |cpu: ThreadCpu, prefixes: &[&str]| {
        let ns: u64 = cpu
            .finish()
            .iter()
            .filter(|(name, _)| prefixes.iter().any(|p| name.starts_with(p)))
            .map(|(_, ns)| ns)
            .sum();
        ns as f64 / 1e3 / DRAIN_EVENTS as f64
    };
    let cpu = alternate_spread(
        3,
        || {
            let outbox = Outbox::open(next_file("relay")).unwrap();
            fill_pending(&outbox, DRAIN_EVENTS);
            let config = RelayConfig::http(&receiver.url).workers(2);
            let cpu = ThreadCpu::start();
            time_drain_to(&outbox, &receiver, DRAIN_EVENTS, config, || ());
            per_event(cpu, &["outbox", "notify-rs"])
        },
        || {
            let path = next_file("least");
            let cpu = ThreadCpu::start();
            timed_least_relay(&path, &receiver, DRAIN_EVENTS, 2);
            per_event(cpu, &["bare"])
        },
    );
    vec![Line {
        what: format!(
            "relay CPU per delivered event, full drain, 1 event/request, {DRAIN_EVENTS} queued"
        ),
        outbox: format!("{:.1} µs", cpu.a),
        baseline: format!("{:.1} µs (least relay)", cpu.b),
        ratio: format!("{:.2}×", cpu.a / cpu.b),
        target: "shown",
    }
    .with_spread(&cpu)]
}

/// Events of [`trickle`]: 1,000 at 10 a second, so 100 s.
const TRICKLE_EVENTS: i64 = 1_000;
const TRICKLE_PACE: Duration = Duration::from_millis(100);
/// Windows of [`trickle`]'s events (by id) whose requests give the rows' spread.
const TRICKLE_WINDOWS: i64 = 5;
const LINGER: Duration = Duration::from_secs(2);

/// What one relay of [`trickle`] showed.
struct Trickled {
    /// Requests per 1,000 events in each window, by the first event a request carried.
    requests_per_1000: Vec<f64>,
    delays: Vec<Duration>,
    cpu_per_event_us: f64,
}

/// 1,000 events committed at 10 a second to two relays at once (each its own file and
/// receiver), both batching up to 100 events a request, one with a linger of 2 s: requests
/// per 1,000 events, the commit → receipt delay, and the relay's CPU per delivered event.
fn trickle(dir: &Path) -> Vec<Line> {
    let start = |name: &str, linger: Option<Duration>| {
        let outbox = Outbox::open(dir.join(format!("trickle-{name}.db"))).unwrap();
        let receiver = TimingReceiver::start();
        let mut destination = Destination::http("default", &receiver.url).batch(100, 1 << 20);
        if let Some(linger) = linger {
            destination = destination.linger(linger);
        }
        let before = thread_samples();
        let relay = outbox
            .relay(RelayConfig::new().destination(destination))
            .start()
            .unwrap();
        let own = relay_threads_since(&before);
        (outbox, receiver, relay, own)
    };
    let lingering = start("linger", Some(LINGER));
    let direct = start("direct", None);
    let before = &thread_samples();
    let [lingered, sent] = std::thread::scope(|s| {
        [&lingering, &direct]
            .map(|(outbox, receiver, _, own)| {
                s.spawn(move || {
                    let committed = paced_orders(outbox, TRICKLE_EVENTS, TRICKLE_PACE);
                    assert!(receiver.wait_for(TRICKLE_EVENTS as usize, Duration::from_secs(30)));
                    let (_, cpu_ns) = spent(before, &thread_samples(), |tid, _| own.contains(&tid));
                    trickled(receiver, &committed, cpu_ns)
                })
            })
            .map(|t| t.join().unwrap())
    });
    for (_, _, relay, _) in [lingering, direct] {
        let _ = relay.shutdown();
    }
    let (mut lingered, mut sent) = (lingered, sent);
    let (requests, low, high) = median_spread(lingered.requests_per_1000.clone());
    let (direct_requests, ..) = median_spread(sent.requests_per_1000.clone());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let delay = |t: &mut Trickled| (quantile(&mut t.delays, 0.5), quantile(&mut t.delays, 1.0));
    let ((p50, max), (direct_p50, direct_max)) = (delay(&mut lingered), delay(&mut sent));
    let spread = format!(
        "over {TRICKLE_WINDOWS} windows of {} events",
        TRICKLE_EVENTS / TRICKLE_WINDOWS
    );
    vec![
        Line {
            what: "requests per 1,000 events at 10/s, batch 100, linger 2 s".into(),
            outbox: format!("{requests:.0} ({low:.0}–{high:.0} {spread})"),
            baseline: format!("{direct_requests:.0} (no linger)"),
            ratio: format!("{:.3}×", requests / direct_requests),
            target: "≤ 60 vs 1,000",
        },
        Line {
            what: "commit → receipt at 10/s, batch 100, linger 2 s: p50, max".into(),
            outbox: format!("{:.0} ms, {:.0} ms", ms(p50), ms(max)),
            baseline: format!(
                "{:.1} ms, {:.1} ms (no linger)",
                ms(direct_p50),
                ms(direct_max)
            ),
            ratio: format!("+{:.0} ms p50", ms(p50) - ms(direct_p50)),
            target: "added ≤ the linger",
        },
        Line {
            what: "relay CPU per delivered event, trickle of 10/s, batch 100, linger 2 s".into(),
            outbox: format!("{:.0} µs", lingered.cpu_per_event_us),
            baseline: format!("{:.0} µs (no linger)", sent.cpu_per_event_us),
            ratio: format!("{:.2}×", lingered.cpu_per_event_us / sent.cpu_per_event_us),
            target: "shown",
        },
    ]
}

/// Commits `count` events (order `n`'s data, one a transaction) at one per `pace`; returns
/// each one's id and when its commit returned.
fn paced_orders(outbox: &Outbox, count: i64, pace: Duration) -> Vec<(i64, Instant)> {
    let start = Instant::now();
    (0..count)
        .map(|n| {
            if let Some(wait) = (start + pace * n as u32).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let _ = outbox
                .transaction(|tx| outbox.enqueue(tx, Event::new("order.created", order_data(n))))
                .unwrap();
            (n, Instant::now())
        })
        .collect()
}

/// What `receiver` got of the events `committed`, and the relay's CPU spent on them.
fn trickled(receiver: &TimingReceiver, committed: &[(i64, Instant)], cpu_ns: u64) -> Trickled {
    let window = TRICKLE_EVENTS / TRICKLE_WINDOWS;
    let mut per_window = vec![0u64; TRICKLE_WINDOWS as usize];
    for request in receiver.requests() {
        if let Some(first) = request.iter().min() {
            per_window[(*first / window).min(TRICKLE_WINDOWS - 1) as usize] += 1;
        }
    }
    Trickled {
        requests_per_1000: per_window
            .iter()
            .map(|r| *r as f64 * 1000.0 / window as f64)
            .collect(),
        delays: committed
            .iter()
            .map(|(n, at)| receiver.arrived(*n).unwrap().saturating_duration_since(*at))
            .collect(),
        cpu_per_event_us: cpu_ns as f64 / 1e3 / committed.len() as f64,
    }
}
