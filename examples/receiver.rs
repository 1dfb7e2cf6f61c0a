//! A receiver for what the relay sends: verifies Standard Webhooks signatures, reads
//! CloudEvents (one or a batch), and applies each event exactly once by recording its id in
//! an inbox table inside the same SQLite transaction as the event's effect.
//!
//! ```text
//! cargo run --example receiver -- --db received.db --secret whsec_… [--port 8080]
//! ```
//!
//! Answers: 204 when the events were applied (or were duplicates), 401 for a missing or bad
//! signature (what most webhook verifiers answer: the relay holds the events and warns, it
//! does not dead-letter them), 400 for a body that is not CloudEvents, 413 for a body over 4 MiB (on the wire, or decoded: a
//! `Content-Encoding: gzip` body is decoded through a reader that stops at 4 MiB or 100 times
//! its size), 415 for another encoding, 503 with `Retry-After` while it is overloaded.
//! Prints `listening on http://127.0.0.1:PORT/events` once ready.
//! It stops by itself after `--max-seconds` (default: never).

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlite_outbox::receive::{
    decode_body, verify_request, Data, DecodeError, Inbox, Receipt, ReceiveError, Secret, Verifier,
};
use sqlite_outbox::rusqlite::{params, Connection, TransactionBehavior};

use http_server::{HttpServer, Request, Response};

const MAX_BODY: usize = 4 * 1024 * 1024;
/// Requests handled at once before the receiver answers 503.
const DEFAULT_MAX_CONCURRENT: usize = 4;

struct Args {
    db: String,
    secrets: Vec<String>,
    port: u16,
    max_seconds: Option<u64>,
    max_concurrent: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        db: "received.db".into(),
        secrets: Vec::new(),
        port: 0,
        max_seconds: None,
        max_concurrent: DEFAULT_MAX_CONCURRENT,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--db" => args.db = value()?,
            "--secret" => args.secrets.push(value()?),
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--max-seconds" => {
                args.max_seconds = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--max-seconds: {e}"))?,
                )
            }
            "--max-concurrent" => {
                args.max_concurrent = value()?
                    .parse()
                    .map_err(|e| format!("--max-concurrent: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.secrets.is_empty() {
        if let Ok(s) = std::env::var("OUTBOX_SECRET") {
            args.secrets.push(s);
        }
    }
    if args.secrets.is_empty() {
        return Err("give --secret whsec_… (or OUTBOX_SECRET)".into());
    }
    Ok(args)
}

/// Applies a verified request's events in one transaction; returns (applied, duplicates).
fn apply(
    conn: &mut Connection,
    events: &[sqlite_outbox::receive::CloudEvent],
) -> sqlite_outbox::Result<(usize, usize)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (mut applied, mut duplicates) = (0, 0);
    // The relay's accounting of its streams (for `outbox ingest`'s fleet view) is not an
    // event of the app's: verified with the rest, answered, not applied.
    for event in events
        .iter()
        .filter(|e| e.event_type != sqlite_outbox::wire::ACCOUNTING_TYPE)
    {
        match Inbox::receive(&tx, &event.source, &event.id)? {
            Receipt::Duplicate => duplicates += 1,
            Receipt::New => {
                let data = match &event.data {
                    Data::Json(v) => v.to_string(),
                    Data::Text(t) => t.clone(),
                    Data::Binary(_) | Data::None => String::new(),
                };
                tx.execute(
                    "INSERT INTO received_events (event_id, source, type, subject, data)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        event.id,
                        event.source,
                        event.event_type,
                        event.subject,
                        data
                    ],
                )?;
                applied += 1;
                // Continue the trace of the work that wrote the event: this line is a span
                // of its own (a fresh id) whose parent is the event's creation span, so a
                // log search by trace id finds the order, the event and this receipt.
                if let Some(tp) = event.traceparent() {
                    log::info!(
                        "applied {} {} trace_id={} parent_id={} span_id={:016x}",
                        event.event_type,
                        event.id,
                        tp.trace_id(),
                        tp.parent_id(),
                        fastrand::u64(1..)
                    );
                }
            }
        }
    }
    tx.commit()?;
    Ok((applied, duplicates))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = parse_args()?;
    let secrets = args
        .secrets
        .iter()
        .map(|s| Secret::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let verifier = Arc::new(Verifier::new(secrets));

    let mut conn = Connection::open(&args.db)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")?;
    sqlite_outbox::receive::migrate(&mut conn)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS received_events (
             id INTEGER PRIMARY KEY, event_id TEXT NOT NULL, source TEXT NOT NULL,
             type TEXT NOT NULL, subject TEXT, data TEXT NOT NULL)",
    )?;
    drop(conn);

    // One SQLite connection per request in flight, reused: opening one per request would
    // cost more than the request.
    let connections: Arc<Mutex<Vec<Connection>>> = Arc::default();
    let busy = Arc::new(AtomicUsize::new(0));
    let max_concurrent = args.max_concurrent;
    let db = args.db.clone();
    let server = HttpServer::bind_with_limit(("127.0.0.1", args.port), MAX_BODY, move |request| {
        if busy.fetch_add(1, Ordering::SeqCst) >= max_concurrent {
            busy.fetch_sub(1, Ordering::SeqCst);
            return Response::status(503)
                .header("Retry-After", "1")
                .body("overloaded");
        }
        let pooled = connections.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let (status, message) = match pooled.map_or_else(|| open(&db), Ok) {
            Ok(mut conn) => {
                let answer = handle(request, &verifier, &mut conn);
                connections
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(conn);
                answer
            }
            Err(e) => (503, format!("database unavailable: {e}")),
        };
        busy.fetch_sub(1, Ordering::SeqCst);
        let response = Response::status(status).body(message);
        if status == 503 {
            response.header("Retry-After", "1")
        } else {
            response
        }
    })?;
    println!("listening on http://{}/events", server.addr());
    let stop_at = args
        .max_seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    while stop_at.is_none_or(|t| Instant::now() < t) {
        thread::sleep(Duration::from_millis(100));
    }
    server.stop();
    Ok(())
}

/// A connection to the receiver's database, waiting up to 2 s for its write lock.
fn open(db: &str) -> sqlite_outbox::rusqlite::Result<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    Ok(conn)
}

fn handle(request: &Request, verifier: &Verifier, conn: &mut Connection) -> (u16, String) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let encoding = request
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-encoding"))
        .map(|(_, value)| value.as_str());
    // The signature is over the decoded body: decode first, never past the limit.
    let body = match decode_body(encoding, &request.body, MAX_BODY) {
        Ok(body) => body,
        Err(e @ DecodeError::TooLarge { .. }) => return (413, e.to_string()),
        Err(e @ DecodeError::Unsupported(_)) => return (415, e.to_string()),
        Err(e) => return (400, e.to_string()),
    };
    let events = match verify_request(verifier, &request.headers, &body, now) {
        Ok(events) => events,
        Err(e @ ReceiveError::Signature(_)) => {
            log::warn!("refused: {e}");
            return (401, e.to_string());
        }
        Err(e) => return (400, e.to_string()),
    };
    match apply(conn, &events) {
        Ok((applied, duplicates)) => {
            log::info!(
                "{} events: {applied} applied, {duplicates} duplicates",
                events.len()
            );
            (204, String::new())
        }
        // Busy database or full disk: the sender retries later, nothing was recorded.
        Err(e) => {
            log::warn!("could not apply: {e}");
            (503, "try again".into())
        }
    }
}
