//! Shared by the benches and `examples/bench.rs`: a counting receiver on 127.0.0.1, the bare
//! baselines (plain rusqlite, plain ureq) and database builders.
#![allow(dead_code)]

#[path = "../../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_server::{HttpServer, Response};

use sqlite_outbox::rusqlite::{params, Connection};

/// A receiver on 127.0.0.1 (the tests' shared server) that answers 204 and counts the
/// events it got (gzip bodies decoded first), the requests, and the bytes on the wire.
pub struct CountingReceiver {
    pub url: String,
    arrivals: Arc<Arrivals>,
    _server: HttpServer,
}

/// The count of events received, and a waiter's target: the server wakes the waiter once,
/// when the count reaches it, not on every request (a wake per request, or a poll every
/// few hundred µs, takes CPU from the two cores the relay and the receiver share), and not
/// late (a coarse poll would add its period to every commit-to-receipt latency).
#[derive(Default)]
struct Arrivals {
    count: AtomicU64,
    requests: AtomicU64,
    wire_bytes: AtomicU64,
    target: AtomicU64,
    lock: std::sync::Mutex<()>,
    reached: std::sync::Condvar,
}

impl CountingReceiver {
    pub fn start() -> CountingReceiver {
        let arrivals = Arc::new(Arrivals {
            target: AtomicU64::new(u64::MAX),
            ..Arrivals::default()
        });
        let counted = arrivals.clone();
        let server = HttpServer::bind("127.0.0.1:0", move |request| {
            counted.requests.fetch_add(1, Ordering::SeqCst);
            counted
                .wire_bytes
                .fetch_add(request.body.len() as u64, Ordering::SeqCst);
            let Ok(body) = sqlite_outbox::receive::decode_body(
                request.header("content-encoding"),
                &request.body,
                64 << 20,
            ) else {
                return Response::status(400);
            };
            let events = count_events(&body);
            let now = counted.count.fetch_add(events, Ordering::SeqCst) + events;
            if now >= counted.target.load(Ordering::SeqCst) {
                // Under the lock: the waiter checks the count under it, so it cannot miss
                // this wake between its check and its wait.
                let _guard = counted.lock.lock().unwrap();
                counted.reached.notify_all();
            }
            Response::status(204)
        })
        .expect("bind receiver");
        CountingReceiver {
            url: format!("http://127.0.0.1:{}/events", server.port()),
            arrivals,
            _server: server,
        }
    }

    pub fn count(&self) -> u64 {
        self.arrivals.count.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.arrivals.requests.load(Ordering::SeqCst)
    }

    /// Request body bytes received so far, as they came over the wire (compressed or not).
    pub fn wire_bytes(&self) -> u64 {
        self.arrivals.wire_bytes.load(Ordering::SeqCst)
    }

    /// Waits until `n` events arrived (or `limit` passes); returns whether they did.
    pub fn wait_for(&self, n: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let a = &self.arrivals;
        let mut guard = a.lock.lock().unwrap();
        a.target.store(n, Ordering::SeqCst);
        let reached = loop {
            if a.count.load(Ordering::SeqCst) >= n {
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            guard = a.reached.wait_timeout(guard, left).unwrap().0;
        };
        a.target.store(u64::MAX, Ordering::SeqCst);
        reached
    }
}

/// A receiver on 127.0.0.1 that notes when each event first arrived, by its data's
/// `order_id` (see [`order_data`]), for per-event commit-to-receipt latencies.
pub struct TimingReceiver {
    pub url: String,
    arrivals: Arc<std::sync::Mutex<std::collections::HashMap<i64, Instant>>>,
    requests: Arc<std::sync::Mutex<Vec<Vec<i64>>>>,
    _server: HttpServer,
}

impl TimingReceiver {
    pub fn start() -> TimingReceiver {
        let arrivals = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (noted, logged) = (arrivals.clone(), requests.clone());
        let server = HttpServer::bind("127.0.0.1:0", move |request| {
            let now = Instant::now();
            let ids = order_ids(&request.body);
            let mut noted = noted.lock().unwrap();
            for &id in &ids {
                noted.entry(id).or_insert(now);
            }
            logged.lock().unwrap().push(ids);
            Response::status(204)
        })
        .expect("bind receiver");
        TimingReceiver {
            url: format!("http://127.0.0.1:{}/events", server.port()),
            arrivals,
            requests,
            _server: server,
        }
    }

    /// When the event of `order_id` first arrived.
    pub fn arrived(&self, order_id: i64) -> Option<Instant> {
        self.arrivals.lock().unwrap().get(&order_id).copied()
    }

    /// The `order_id`s each request so far carried, in arrival order.
    pub fn requests(&self) -> Vec<Vec<i64>> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits until `n` distinct events arrived (or `limit` passes); returns whether they did.
    pub fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.arrivals.lock().unwrap().len() < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// The `order_id`s of the CloudEvents in a body: one event, or a batch (a JSON array).
fn order_ids(body: &[u8]) -> Vec<i64> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let events = match value {
        serde_json::Value::Array(events) => events,
        one => vec![one],
    };
    events
        .iter()
        .filter_map(|e| e["data"]["order_id"].as_i64())
        .collect()
}

/// Events in a body: one per `"specversion"` member (a batch holds several).
fn count_events(body: &[u8]) -> u64 {
    // A stream's accounting (issue 58) is not an event.
    let accounting = sqlite_outbox::wire::ACCOUNTING_TYPE.as_bytes();
    if body.windows(accounting.len()).any(|w| w == accounting) {
        return 0;
    }
    let needle = b"\"specversion\"";
    body.windows(needle.len()).filter(|w| w == needle).count() as u64
}

/// One thread of this process as `/proc/self/task/TID` shows it: its name, its voluntary
/// context switches (each a sleep, so a wake-up to come) and its run time (`schedstat`).
pub struct ThreadSample {
    pub name: String,
    pub wake_ups: u64,
    pub cpu_ns: u64,
}

/// Every thread of this process, by thread id (Linux; empty elsewhere).
pub fn thread_samples() -> std::collections::HashMap<u32, ThreadSample> {
    let mut threads = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return threads;
    };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let read = |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
        let wake_ups = read("status")
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let cpu_ns = read("schedstat")
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse().ok())
            .unwrap_or(0);
        let name = read("comm").trim().to_string();
        threads.insert(
            tid,
            ThreadSample {
                name,
                wake_ups,
                cpu_ns,
            },
        );
    }
    threads
}

/// The app's own table, which every enqueue bench writes a row of beside its event.
pub const BUSINESS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total INTEGER NOT NULL)";

/// The event data every bench writes.
pub fn order_data(n: i64) -> serde_json::Value {
    serde_json::json!({"order_id": n, "customer": "customer-7", "total_cents": 1999, "currency": "EUR"})
}

/// A plain connection with the outbox's PRAGMAs, to a file whose `outbox_events` table is
/// the crate's own, every column, index and file setting included (the file is made by
/// `Outbox::open`, then left alone): the bare loops run the least SQL on the same table
/// shape, so a ratio measures the crate's own work, not an older or slimmer table.
pub fn bare_connection(path: &std::path::Path, synchronous: &str) -> Connection {
    drop(sqlite_outbox::Outbox::open(path).expect("create the outbox table"));
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA foreign_keys=ON; {BUSINESS_TABLE}"
    ))
    .expect("bare schema");
    conn
}

/// The business row every enqueue bench writes beside its event.
pub fn insert_order(tx: &sqlite_outbox::rusqlite::Transaction<'_>, n: i64) {
    tx.prepare_cached("INSERT INTO orders (customer, total) VALUES (?1, ?2)")
        .unwrap()
        .execute(params!["customer-7", n])
        .unwrap();
}

/// One bare transaction: per event, a business row and an outbox row (fresh UUIDv7 id,
/// serialized data), in an IMMEDIATE transaction.
pub fn bare_enqueue_tx(conn: &mut Connection, n: i64, events: i64) {
    let tx = conn
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    for i in 0..events {
        insert_order(&tx, n + i);
        let payload = serde_json::to_string(&order_data(n + i)).unwrap();
        tx.prepare_cached(
            "INSERT INTO outbox_events (event_id, destination, event_type, partition_key,
                 payload, created_at, available_at)
             VALUES (?1, 'default', 'order.created', ?2, ?3, ?4, ?4)",
        )
        .unwrap()
        .execute(params![
            uuid::Uuid::now_v7().to_string(),
            "customer-7",
            payload,
            n
        ])
        .unwrap();
    }
    tx.commit().unwrap();
}

/// The `INSERT` of `events` outbox rows at once that [`bare_enqueue_listed_tx`] runs: the
/// same columns and values as [`bare_enqueue_tx`]'s, four parameters a row.
pub fn bare_listed_insert_sql(events: i64) -> String {
    let rows: Vec<String> = (0..events)
        .map(|i| {
            let b = i * 4;
            format!(
                "(?{}, 'default', 'order.created', ?{}, ?{}, ?{}, ?{})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 4
            )
        })
        .collect();
    format!(
        "INSERT INTO outbox_events (event_id, destination, event_type, partition_key,
             payload, created_at, available_at)
         VALUES {}",
        rows.join(", ")
    )
}

/// One bare transaction that writes its outbox rows with one `INSERT` (`sql`, from
/// [`bare_listed_insert_sql`] for `events` rows) after the business rows: the least a bare
/// app can do for a batch.
pub fn bare_enqueue_listed_tx(conn: &mut Connection, sql: &str, n: i64, events: i64) {
    let tx = conn
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let mut rows = Vec::with_capacity(events as usize);
    for i in 0..events {
        insert_order(&tx, n + i);
        let payload = serde_json::to_string(&order_data(n + i)).unwrap();
        rows.push((uuid::Uuid::now_v7().to_string(), payload));
    }
    let mut stmt = tx.prepare_cached(sql).unwrap();
    for (i, (event_id, payload)) in rows.iter().enumerate() {
        let b = i * 4;
        stmt.raw_bind_parameter(b + 1, event_id).unwrap();
        stmt.raw_bind_parameter(b + 2, "customer-7").unwrap();
        stmt.raw_bind_parameter(b + 3, payload).unwrap();
        stmt.raw_bind_parameter(b + 4, n).unwrap();
    }
    stmt.raw_execute().unwrap();
    drop(stmt);
    tx.commit().unwrap();
}

/// The same through the outbox, on the caller's own connection.
/// One transaction of an app in another language: per event, a business row and
/// `INSERT INTO outbox_enqueue` (the SQL contract), in an IMMEDIATE transaction.
pub fn sql_enqueue_tx(conn: &mut Connection, n: i64, events: i64) {
    let tx = conn
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    for i in 0..events {
        insert_order(&tx, n + i);
        let data = serde_json::to_string(&order_data(n + i)).unwrap();
        tx.prepare_cached(
            "INSERT INTO outbox_enqueue (type, data, key) VALUES ('order.created', ?1, ?2)",
        )
        .unwrap()
        .execute(params![data, "customer-7"])
        .unwrap();
    }
    tx.commit().unwrap();
}

/// A device's reading, the event of the metered-link rows: one of 50 pumps, its sequence
/// number, time and sensor values (what a telemetry batch of 100 compresses is their
/// repetition).
pub fn telemetry_event(n: i64) -> sqlite_outbox::Event {
    sqlite_outbox::Event::new(
        "reading.taken",
        serde_json::json!({
            "device": format!("pump-{:04}", n % 50),
            "seq": n,
            "ts": 1_764_800_000_000i64 + n * 100,
            "celsius": 20.0 + (n % 37) as f64 / 10.0,
            "humidity": 40 + n % 23,
            "battery": 0.87,
            "rssi": -70 - n % 9,
            "firmware": "2.4.1",
        }),
    )
}

/// The event every Rust enqueue bench writes for order `n`: keyed by its customer.
pub fn order_event(n: i64) -> sqlite_outbox::Event {
    sqlite_outbox::Event::new("order.created", order_data(n)).partition_key("customer-7")
}

/// One transaction of a Rust app: per event, a business row and `Outbox::enqueue`.
pub fn outbox_enqueue_tx(
    outbox: &sqlite_outbox::Outbox,
    conn: &mut Connection,
    n: i64,
    events: i64,
) {
    in_immediate_transaction(conn, |tx| {
        for i in 0..events {
            insert_order(tx, n + i);
            let _ = outbox.enqueue(tx, order_event(n + i)).unwrap();
        }
    });
}

/// The same with `Outbox::enqueue_many`: the business rows, then their events in one call.
pub fn outbox_enqueue_many_tx(
    outbox: &sqlite_outbox::Outbox,
    conn: &mut Connection,
    n: i64,
    events: i64,
) {
    in_immediate_transaction(conn, |tx| {
        (0..events).for_each(|i| insert_order(tx, n + i));
        let batch = (0..events).map(|i| order_event(n + i));
        outbox.enqueue_many(tx, batch).unwrap();
    });
}

/// Runs `write` in an IMMEDIATE transaction on `conn` and commits.
fn in_immediate_transaction(
    conn: &mut Connection,
    write: impl FnOnce(&sqlite_outbox::rusqlite::Transaction<'_>),
) {
    let tx = conn
        .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    write(&tx);
    tx.commit().unwrap();
}

/// Fills an outbox database with `n` pending events quickly (one transaction per 10,000).
pub fn fill_pending(outbox: &sqlite_outbox::Outbox, n: usize) {
    fill_pending_with(outbox, n, |i| {
        sqlite_outbox::Event::new("order.created", order_data(i))
    });
}

/// As [`fill_pending`], event `i` made by `event`.
pub fn fill_pending_with(
    outbox: &sqlite_outbox::Outbox,
    n: usize,
    event: impl Fn(i64) -> sqlite_outbox::Event,
) {
    let mut conn = outbox.connection().unwrap();
    let mut done = 0;
    while done < n {
        let tx = conn.transaction().unwrap();
        for i in done..(done + 10_000).min(n) {
            let _ = outbox.enqueue(&tx, event(i as i64)).unwrap();
        }
        tx.commit().unwrap();
        done = (done + 10_000).min(n);
    }
}

/// Adds `n` delivered rows of history with one statement.
pub fn fill_delivered(conn: &Connection, n: usize) {
    conn.execute(
        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?1)
         INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at,
                                    attempts, delivered_at)
         SELECT printf('%032x', i), 'order.created', '{\"order_id\":1}', 1, 1, 1, 2 FROM k",
        [n as i64],
    )
    .unwrap();
}

/// What the bare claim returns of each row it leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BareReturning {
    /// Only the row id: the least SQLite can be asked for, though no relay could ship it.
    Id,
    /// The columns an event is shipped with (the crate's claim returns the same), each read
    /// in place as SQLite hands it over, without copying it out.
    EventColumns,
}

impl BareReturning {
    fn columns(self) -> &'static str {
        match self {
            BareReturning::Id => "id",
            BareReturning::EventColumns => {
                "id, event_id, event_type, source, subject, partition_key, idempotency_key,
                 payload, created_at, attempts, expires_at"
            }
        }
    }
}

/// The bare loops' claim of up to `?1` due rows, returning `returning`. With
/// `skip_leased`, rows already leased are passed over (a loop that claims again before it
/// has acked everything needs it; the condition reads each candidate's row).
pub fn bare_claim_sql(returning: BareReturning, skip_leased: bool) -> String {
    format!(
        "UPDATE outbox_events SET lease_owner = 'bare', lease_expires_at = 9e15
          WHERE id IN (SELECT id FROM outbox_events
                        WHERE delivered_at IS NULL AND dead_at IS NULL
                          AND destination = 'default' AND priority = 5
                          AND available_at <= 9e15{}
                        ORDER BY available_at, id LIMIT CAST(?1 AS INTEGER))
         RETURNING {}",
        if skip_leased {
            " AND lease_owner IS NULL"
        } else {
            ""
        },
        returning.columns()
    )
}

/// The bare loops' ack of row `?1`, delivered at `?2`, if the bare loop still holds it.
pub const BARE_ACK_SQL: &str = "UPDATE outbox_events SET delivered_at = ?2, lease_owner = NULL,
        lease_expires_at = NULL WHERE id = ?1 AND lease_owner = 'bare'";

/// A plain claim-with-lease + ack loop over the pending rows: the least a relay must do. It
/// records the delivery time `now` (the outbox's loop is given the same), so both write
/// rows of the same size.
pub fn bare_claim_ack(
    conn: &mut Connection,
    batch: i64,
    now: i64,
    returning: BareReturning,
) -> usize {
    bare_claim_ack_paced(conn, batch, now, returning, None)
}

/// How fast [`bare_claim_ack_paced`] goes, and when it stops.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Rows claimed and acked a second, at most: a batch waits for its slot.
    pub rows_per_second: f64,
    /// Stops once this many rows are acked.
    pub rows: usize,
}

/// [`bare_claim_ack`], at most `pace.rows_per_second` and `pace.rows` in all when a pace
/// is given: the least SQL a relay that delivers at that rate must run on the app's file.
pub fn bare_claim_ack_paced(
    conn: &mut Connection,
    batch: i64,
    now: i64,
    returning: BareReturning,
    pace: Option<Pace>,
) -> usize {
    let started = Instant::now();
    let claim = bare_claim_sql(returning, false);
    let mut total = 0;
    loop {
        if let Some(pace) = pace {
            if total >= pace.rows {
                return total;
            }
            let slot = started + Duration::from_secs_f64(total as f64 / pace.rows_per_second);
            if let Some(wait) = slot.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let tx = conn
            .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        let mut ids: Vec<i64> = Vec::new();
        {
            let mut stmt = tx.prepare_cached(&claim).unwrap();
            let mut rows = stmt.query([batch]).unwrap();
            while let Some(row) = rows.next().unwrap() {
                ids.push(row.get(0).unwrap());
                for column in 1..row.as_ref().column_count() {
                    std::hint::black_box(row.get_ref(column).unwrap());
                }
            }
        }
        tx.commit().unwrap();
        if ids.is_empty() {
            return total;
        }
        let tx = conn
            .transaction_with_behavior(sqlite_outbox::rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        for id in &ids {
            tx.prepare_cached(BARE_ACK_SQL)
                .unwrap()
                .execute([*id, now])
                .unwrap();
        }
        tx.commit().unwrap();
        total += ids.len();
    }
}

/// A plain ureq agent keeping `connections` keep-alive connections, as the bare loops use.
pub fn bare_agent(connections: usize) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_idle_connections(connections)
        .max_idle_connections_per_host(connections)
        // No timeouts: with one set, ureq spawns a thread per request to time the name
        // lookup (the relay keeps its lookups instead, see `transport::resolver`); without,
        // it looks up 127.0.0.1 in place. The fastest a plain ureq loop posts.
        .build()
        .into()
}

/// Plain ureq keep-alive POSTs of `body`, `n` in all over `connections` threads.
pub fn bare_posts(url: &str, body: &[u8], content_type: &str, n: usize, connections: usize) {
    let agent = bare_agent(connections);
    std::thread::scope(|s| {
        for t in 0..connections {
            let agent = agent.clone();
            let per = n / connections + usize::from(t < n % connections);
            s.spawn(move || {
                for _ in 0..per {
                    let mut r = agent
                        .post(url)
                        .header("content-type", content_type)
                        .send(body)
                        .expect("bare post");
                    let _ = r.body_mut().read_to_vec();
                }
            });
        }
    });
}

/// The `q` quantile (0..=1) of `samples`, sorted in place.
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let idx = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[idx.min(samples.len() - 1)]
}

/// Claims `limit` events as the relay does and times only the claim; the claimed rows are
/// handed back (by id: a scan would evict the page cache) so the next claim finds them.
pub fn timed_claim_and_release(conn: &Connection, owner: &str, far: i64, limit: i64) -> Duration {
    let start = Instant::now();
    let got = sqlite_outbox::internal::claim(conn, "default", owner, far, limit).unwrap();
    let took = start.elapsed();
    assert_eq!(got.len() as i64, limit);
    for e in &got {
        conn.execute(
            "UPDATE outbox_events SET lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
            [e.id],
        )
        .unwrap();
    }
    took
}

/// Fills a fresh outbox at `path` with `n` events and times a relay draining them to
/// `receiver` with `workers` connections, batching `batch` events per request if given.
pub fn timed_drain(
    path: &std::path::Path,
    receiver: &CountingReceiver,
    n: usize,
    workers: usize,
    batch: Option<usize>,
) -> Duration {
    timed_drain_with(path, receiver, n, workers, batch, false, |config| config)
}

/// As [`timed_drain`], with `adjust` applied to the relay's configuration (the barrier-cost
/// comparison turns the durability barrier off with it); with `backlog_on_disk`, the backlog
/// is checkpointed into the synced database file before the relay starts, as a backlog that
/// built up over time is.
pub fn timed_drain_with(
    path: &std::path::Path,
    receiver: &CountingReceiver,
    n: usize,
    workers: usize,
    batch: Option<usize>,
    backlog_on_disk: bool,
    adjust: impl FnOnce(sqlite_outbox::RelayConfig) -> sqlite_outbox::RelayConfig,
) -> Duration {
    let outbox = sqlite_outbox::Outbox::open(path).unwrap();
    fill_pending(&outbox, n);
    if backlog_on_disk {
        outbox.checkpoint().unwrap();
    }
    time_drain(&outbox, receiver, n, workers, batch, adjust)
}

/// Times a relay over `workers` connections (batches of `batch`, if set) until the receiver
/// has counted the `n` events pending in `outbox`.
pub fn time_drain(
    outbox: &sqlite_outbox::Outbox,
    receiver: &CountingReceiver,
    n: usize,
    workers: usize,
    batch: Option<usize>,
    adjust: impl FnOnce(sqlite_outbox::RelayConfig) -> sqlite_outbox::RelayConfig,
) -> Duration {
    let mut destination = sqlite_outbox::Destination::http("default", &receiver.url);
    if let Some(size) = batch {
        destination = destination.batch(size, 1 << 20);
    }
    let config = adjust(
        sqlite_outbox::RelayConfig::new()
            .destination(destination)
            .workers(workers),
    );
    time_drain_to(outbox, receiver, n, config, || ()).0
}

/// Times a relay of `config` until the receiver has counted the `n` events pending in
/// `outbox`, and returns what `before_shutdown` (called then, the relay still up) gives.
pub fn time_drain_to<T>(
    outbox: &sqlite_outbox::Outbox,
    receiver: &CountingReceiver,
    n: usize,
    config: sqlite_outbox::RelayConfig,
    before_shutdown: impl FnOnce() -> T,
) -> (Duration, T) {
    let start_count = receiver.count();
    let start = Instant::now();
    let relay = outbox.relay(config).start().unwrap();
    assert!(receiver.wait_for(start_count + n as u64, Duration::from_secs(120)));
    let took = start.elapsed();
    let seen = before_shutdown();
    let _ = relay.shutdown();
    (took, seen)
}

/// Fills the bare table with `n` pending rows of the bench's shape in one transaction,
/// committed now (unix ms, as the crate writes them: a time of 1 would store each row 12
/// bytes smaller, and its index entries 6, than the rows the crate's loop claims).
pub fn fill_bare_pending(conn: &mut Connection, n: usize) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let tx = conn.transaction().unwrap();
    for i in 0..n as i64 {
        tx.prepare_cached(
            "INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at)
             VALUES (?1, 'order.created', ?2, ?3, ?3)",
        )
        .unwrap()
        .execute(params![
            uuid::Uuid::now_v7().to_string(),
            order_data(i).to_string(),
            now
        ])
        .unwrap();
    }
    tx.commit().unwrap();
}

/// Claims (100 at a time) and acks everything pending in `outbox`, as the relay's writer
/// does; returns how many rows were acked.
pub fn outbox_claim_ack(outbox: &sqlite_outbox::Outbox, far: i64) -> usize {
    let mut conn = outbox.connection().unwrap();
    let mut done = 0;
    for seq in 0.. {
        let owner = format!("bench:{seq}");
        let events = sqlite_outbox::internal::claim(&conn, "default", &owner, far, 100).unwrap();
        if events.is_empty() {
            break;
        }
        done += sqlite_outbox::internal::ack_delivered(&mut conn, &events, far).unwrap();
    }
    done
}
