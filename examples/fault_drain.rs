//! Draining a keyed backlog through a receiver that misbehaves the way real ones do, with
//! the outbox relay and with a naive reference relay measured beside it on the same faults.
//!
//! ```text
//! cargo run --release --example fault_drain            # 5,000 events
//! cargo run --release --example fault_drain -- 20000
//! ```
//!
//! The receiver changes mood in spells, as `tests/hostile_receiver.rs` does: a hostile spell
//! of 500 ms, then a calm one of 1.2 s (calm spells outlast the 1 s pause a 429 or 503 asks
//! for), the hostile ones in turn: 500, resets without an answer, 429 with `Retry-After: 1`,
//! slow answers (50 ms), 503 with `Retry-After: 1`. A third of the way through the backlog
//! the receiver goes away for one second (connections refused) and comes back. The naive relay is what one writes in an afternoon: four threads, each claiming the
//! oldest due row with a lease, posting it, marking it delivered on 2xx and otherwise making
//! it due again 100 ms later; no batching of writes, no key order, no backoff.

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_server::{HttpServer, Response};
use sqlite_outbox::rusqlite::{params, Connection, OptionalExtension};
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const WORKERS: usize = 4;
const KEYS: usize = 50;

/// The receiver's moods count from here, for both relays alike.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
/// A hostile spell (even numbers) and the calm one after it, in milliseconds.
const HOSTILE_MS: u128 = 500;
const CALM_MS: u128 = 1_200;
const CYCLE_MS: u128 = 5 * (HOSTILE_MS + CALM_MS);

/// The spell the receiver is in: 0, 2, 4, 6, 8 hostile, the odd ones calm.
fn spell_now() -> u128 {
    let t = EPOCH.elapsed().as_millis() % CYCLE_MS;
    let (pair, within) = (t / (HOSTILE_MS + CALM_MS), t % (HOSTILE_MS + CALM_MS));
    2 * pair + u128::from(within >= HOSTILE_MS)
}

/// The misbehaving receiver: answers by request number, counts distinct deliveries.
struct Faulty {
    requests: Arc<AtomicUsize>,
    accepted: Arc<AtomicU64>,
    server: Option<HttpServer>,
    addr: SocketAddr,
}

impl Faulty {
    fn start(addr: SocketAddr, requests: Arc<AtomicUsize>, accepted: Arc<AtomicU64>) -> Faulty {
        let deadline = Instant::now() + Duration::from_secs(5);
        let server = loop {
            let (requests, accepted) = (requests.clone(), accepted.clone());
            match HttpServer::bind(addr, move |_| {
                requests.fetch_add(1, Ordering::SeqCst);
                let spell = spell_now();
                let fine = |delay: u64| {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    Response::status(204).after(Duration::from_millis(delay))
                };
                match spell {
                    0 => Response::status(500),
                    2 => Response::reset(),
                    4 => Response::status(429).header("retry-after", "1"),
                    6 => fine(50),
                    8 => Response::status(503).header("retry-after", "1"),
                    _ => fine(0),
                }
            }) {
                Ok(server) => break server,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("bind {addr}: {e}"),
            }
        };
        let addr = server.addr();
        Faulty {
            requests,
            accepted,
            server: Some(server),
            addr,
        }
    }

    /// Takes the receiver away for `outage`, then brings it back on the same port.
    fn outage(&mut self, outage: Duration) {
        if let Some(server) = self.server.take() {
            server.stop();
        }
        thread::sleep(outage);
        *self = Faulty::start(self.addr, self.requests.clone(), self.accepted.clone());
    }
}

fn fill(outbox: &Outbox, n: usize) {
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let event = Event::new("order.created", serde_json::json!({"order": i}))
                    .partition_key(format!("customer-{}", i % KEYS));
                let _ = outbox.enqueue(tx, event)?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .expect("fill");
}

fn pending(path: &std::path::Path) -> i64 {
    Connection::open(path)
        .and_then(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM outbox_events WHERE delivered_at IS NULL",
                [],
                |r| r.get(0),
            )
        })
        .unwrap_or(i64::MAX)
}

/// Runs `drain` against a fresh faulty receiver and returns how long the backlog took.
fn timed(
    path: &std::path::Path,
    n: usize,
    drain: impl FnOnce(String) -> Box<dyn FnOnce()>,
) -> Duration {
    let requests = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    // Both runs start at the same point of the mood cycle: its beginning.
    let cycle = Duration::from_millis(CYCLE_MS as u64);
    let into = Duration::from_nanos((EPOCH.elapsed().as_nanos() % cycle.as_nanos()) as u64);
    thread::sleep(cycle - into);
    let mut receiver = Faulty::start("127.0.0.1:0".parse().unwrap(), requests, accepted);
    let url = format!("http://{}/events", receiver.addr);
    let started = Instant::now();
    let stop = drain(url);
    let mut outage_done = false;
    let limit = Instant::now() + Duration::from_secs(300);
    loop {
        let left = pending(path);
        if left == 0 || Instant::now() > limit {
            break;
        }
        // FAULT_TRACE=1 prints the backlog as it drains, spell by spell.
        if std::env::var_os("FAULT_TRACE").is_some() {
            eprintln!(
                "{:>6} ms  spell {}  pending {left}",
                started.elapsed().as_millis(),
                spell_now()
            );
        }
        if !outage_done && left <= (n as i64) * 2 / 3 {
            receiver.outage(Duration::from_secs(1));
            outage_done = true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed();
    stop();
    assert_eq!(pending(path), 0, "the backlog did not drain");
    took
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The naive relay: see the module docs.
fn naive(path: std::path::PathBuf, url: String) -> Box<dyn FnOnce()> {
    let stop = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WORKERS)
        .map(|n| {
            let (path, url, stop) = (path.clone(), url.clone(), stop.clone());
            thread::spawn(move || {
                let conn = Connection::open(&path).expect("open");
                conn.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(2)))
                    .build()
                    .into();
                while stop.load(Ordering::SeqCst) == 0 {
                    let now = now_ms();
                    let claimed: Option<(i64, String)> = conn
                        .query_row(
                            "UPDATE outbox_events SET lease_owner = ?1, lease_expires_at = ?2 + 10000
                              WHERE id = (
                                 SELECT e.id FROM outbox_events AS e
                                  WHERE e.delivered_at IS NULL AND e.dead_at IS NULL
                                    AND e.available_at <= ?2
                                    AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= ?2)
                                    AND NOT EXISTS (
                                        SELECT 1 FROM outbox_events AS h
                                         WHERE h.partition_key = e.partition_key
                                           AND h.id < e.id AND h.delivered_at IS NULL
                                           AND h.dead_at IS NULL)
                                  ORDER BY e.id LIMIT 1)
                             RETURNING id, payload",
                            params![format!("naive-{n}"), now],
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
                        .optional()
                        .expect("claim");
                    let Some((id, payload)) = claimed else {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let ok = agent
                        .post(&url)
                        .header("content-type", "application/json")
                        .send(payload.as_bytes())
                        .is_ok_and(|r| r.status().is_success());
                    let sql = if ok {
                        "UPDATE outbox_events SET delivered_at = ?2, lease_owner = NULL WHERE id = ?1"
                    } else {
                        "UPDATE outbox_events SET available_at = ?2 + 100, lease_owner = NULL,
                                lease_expires_at = NULL WHERE id = ?1"
                    };
                    conn.execute(sql, params![id, now_ms()]).expect("ack");
                }
            })
        })
        .collect();
    Box::new(move || {
        stop.store(1, Ordering::SeqCst);
        for t in threads {
            let _ = t.join();
        }
    })
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5_000);
    let dir = tempfile::tempdir().expect("temp dir");

    let relay_path = dir.path().join("relay.db");
    let outbox = Outbox::open(&relay_path).expect("open");
    fill(&outbox, n);
    let relay_time = timed(&relay_path, n, |url| {
        let http = HttpConfig::new()
            .connect_timeout(Duration::from_secs(1))
            .request_timeout(Duration::from_secs(2));
        let relay = outbox
            .relay(
                RelayConfig::new()
                    .destination(Destination::http("default", url).http_config(http))
                    .workers(WORKERS)
                    .retry_backoff(Duration::from_millis(100), Duration::from_secs(2))
                    .offline_backoff(Duration::from_millis(50), Duration::from_secs(1))
                    .lease(Duration::from_secs(10)),
            )
            .start()
            .expect("start");
        Box::new(move || {
            let _ = relay.shutdown();
        })
    });

    let naive_path = dir.path().join("naive.db");
    fill(&Outbox::open(&naive_path).expect("open"), n);
    // The naive relay keeps key order by its claim, not by parking: every event is due.
    Connection::open(&naive_path)
        .and_then(|c| c.execute("UPDATE outbox_events SET available_at = created_at", []))
        .expect("unpark");
    let naive_time = timed(&naive_path, n, |url| naive(naive_path.clone(), url));

    println!(
        "{n} keyed events through spells of 5xx, 429, resets, slow answers and a 1 s outage:\n\
         relay  {relay_time:.2?}\n\
         naive  {naive_time:.2?}\n\
         ratio  {:.2}x (below 1: the relay drains faster)",
        relay_time.as_secs_f64() / naive_time.as_secs_f64()
    );
}
