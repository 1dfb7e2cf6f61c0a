//! The main job, end to end on one machine: an app commits orders and their events in the
//! same SQLite transactions, a relay delivers them as signed CloudEvents (Standard Webhooks)
//! to a local receiver that verifies every request, the receiver goes down for a moment and
//! comes back, and nothing is lost.
//!
//! ```text
//! cargo run --release --example quickstart            # 5,000 orders in a temp folder
//! cargo run --release --example quickstart -- 20000 ./quickstart.db
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use http_server::{HttpServer, Request, Response};

use serde_json::json;
use sqlite_outbox::receive::{verify_request, Secret, Verifier};
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

/// A receiver on 127.0.0.1 that verifies each request's signature, parses its CloudEvents
/// and counts every event id; requests that fail verification are counted as rejected.
struct Receiver {
    server: HttpServer,
}

#[derive(Default)]
struct Tally {
    seen: HashMap<String, u32>,
    rejected: u32,
}

type Seen = Arc<Mutex<Tally>>;

impl Receiver {
    fn start(
        addr: SocketAddr,
        seen: Seen,
        verifier: Arc<Verifier>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        // The port was just closed by the previous receiver: allow a moment to rebind.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (seen, verifier) = (seen.clone(), verifier.clone());
            match HttpServer::bind(addr, move |request| {
                Response::status(verify_and_count(request, &verifier, &seen))
            }) {
                Ok(server) => return Ok(Receiver { server }),
                Err(e) if Instant::now() < deadline => {
                    log::debug!("rebinding {addr}: {e}");
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Takes the receiver down: its port closes and new connections are refused.
    fn stop(self) {
        self.server.stop();
    }
}

/// Verifies one request and counts its events: 204, or 400 if it is refused.
fn verify_and_count(request: &Request, verifier: &Verifier, seen: &Mutex<Tally>) -> u16 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut tally = seen.lock().unwrap_or_else(|e| e.into_inner());
    match verify_request(verifier, &request.headers, &request.body, now) {
        Ok(events) => {
            // The relay's accounting of its streams (for `outbox ingest`) is verified like
            // any event, and not counted as one.
            for event in events {
                if event.event_type != sqlite_outbox::wire::ACCOUNTING_TYPE {
                    *tally.seen.entry(event.id).or_default() += 1;
                }
            }
            204
        }
        Err(e) => {
            log::warn!("rejected: {e}");
            tally.rejected += 1;
            400
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args = std::env::args().skip(1);
    let orders: usize = match args.next() {
        Some(n) => n.parse().map_err(|e| format!("order count {n:?}: {e}"))?,
        None => 5_000,
    };
    let tmp = tempfile::tempdir()?;
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().join("quickstart.db"));

    // 1. The app's database: its own table, and the outbox beside it in the same file.
    let outbox = Outbox::open(&path)?;
    outbox.transaction(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS orders (
                 id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL)",
            [],
        )?;
        Ok::<_, sqlite_outbox::Error>(())
    })?;

    // 2. A local receiver that knows the signing secret, and a relay delivering to it.
    let (secret, secret_text) = Secret::generate()?;
    let verifier = Arc::new(Verifier::new([secret]));
    let seen: Seen = Arc::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    drop(listener);
    let receiver = Receiver::start(addr, seen.clone(), verifier.clone())?;
    let destination = Destination::http("default", format!("http://{addr}/events"))
        .secret(&secret_text)
        .http_config(HttpConfig::new().request_timeout(Duration::from_secs(2)));
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(destination)
                .workers(4)
                .lease(Duration::from_secs(10))
                .offline_backoff(Duration::from_millis(50), Duration::from_millis(500)),
        )
        .start()?;

    println!("database  {}", path.display());
    println!("receiver  http://{addr}/events");
    let started = Instant::now();

    // 3. The app commits orders; each order and its event in one transaction. A third of
    //    the way in, the receiver goes down for a second.
    let mut receiver = Some(receiver);
    let mut outage = Duration::ZERO;
    let mut down_since = None;
    for n in 0..orders {
        if n == orders / 3 {
            if let Some(r) = receiver.take() {
                r.stop();
                down_since = Some(Instant::now());
                println!("receiver  down after {n} orders");
            }
        }
        if let Some(since) = down_since {
            if since.elapsed() >= Duration::from_secs(1) {
                receiver = Some(Receiver::start(addr, seen.clone(), verifier.clone())?);
                outage = since.elapsed();
                down_since = None;
                println!("receiver  back up after {outage:.1?}");
            }
        }
        let customer = format!("customer-{}", n % 50);
        outbox.transaction(|tx| {
            tx.execute(
                "INSERT INTO orders (customer, total_cents) VALUES (?1, ?2)",
                (&customer, 100 + n as i64),
            )?;
            let order_id = tx.last_insert_rowid();
            let _ = outbox.enqueue(
                tx,
                Event::new(
                    "order.created",
                    json!({"order_id": order_id, "total_cents": 100 + n}),
                )
                .partition_key(customer.clone())
                .subject(format!("orders/{order_id}")),
            )?;
            Ok::<_, sqlite_outbox::Error>(())
        })?;
    }
    if let Some(since) = down_since {
        // Few orders: the outage outlasted the writes. Bring the receiver back now.
        thread::sleep(Duration::from_secs(1).saturating_sub(since.elapsed()));
        receiver = Some(Receiver::start(addr, seen.clone(), verifier.clone())?);
        outage = since.elapsed();
        println!("receiver  back up after {outage:.1?}");
    }
    let committed = orders;

    // 4. Wait for the backlog to drain.
    let deadline = Instant::now() + Duration::from_secs(120);
    let delivered = |outbox: &Outbox| -> Result<i64, sqlite_outbox::Error> {
        Ok(outbox.connection()?.query_row(
            "SELECT COUNT(*) FROM outbox_events WHERE delivered_at IS NOT NULL",
            [],
            |r| r.get(0),
        )?)
    };
    while delivered(&outbox)? < committed as i64 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    let stats = relay.stats();
    let _ = relay.shutdown();
    if let Some(r) = receiver {
        r.stop();
    }

    let delivered = delivered(&outbox)?;
    let tally = seen.lock().unwrap();
    let requests: u32 = tally.seen.values().sum();
    let unique = tally.seen.len();
    let duplicates = requests as usize - unique;
    let lost = committed.saturating_sub(unique);
    println!();
    println!("committed   {committed} orders, each with its event in the same transaction");
    println!(
        "delivered   {delivered} (relay: {} acks, {} retries, {} dead, {} released while the receiver was down)",
        stats.delivered, stats.retried, stats.dead, stats.released
    );
    println!(
        "received    {unique} distinct events in {requests} signed CloudEvents requests, \
         every signature verified ({} rejected)",
        tally.rejected
    );
    println!("duplicates  {duplicates}");
    println!("lost        {lost}");
    println!(
        "took        {elapsed:.2?} ({:.0} events/s end to end, including a {outage:.1?} outage)",
        committed as f64 / elapsed.as_secs_f64()
    );
    if lost > 0 || delivered != committed as i64 || tally.rejected > 0 {
        return Err(format!("{lost} events were not delivered").into());
    }
    Ok(())
}
