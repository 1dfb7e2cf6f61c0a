//! Test helpers: a real HTTP receiver on 127.0.0.1 and deadline-bounded waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The event id (structured) or the first event's id (batch).
    pub event_id: String,
    /// Every event id in the request, in order.
    pub ids: Vec<String>,
    pub raw: Vec<u8>,
    pub body: serde_json::Value,
    pub headers: HashMap<String, String>,
    /// How many requests for this event id arrived before this one.
    pub earlier: usize,
}

/// How the receiver answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    StatusBody(u16, &'static str),
    StatusHeader(u16, &'static str, String),
    /// Hold the request this long (or until the receiver stops), then answer 200.
    Hang(Duration),
}

type Responder = Arc<dyn Fn(&Received) -> Reply + Send + Sync>;

/// A plain HTTP/1.1 server on 127.0.0.1 (a thread per connection, keep-alive) that records
/// every request and answers as told. Written by hand rather than with tiny_http, whose task
/// pool can leave a new connection queued for seconds when several are open at once.
pub struct TestReceiver {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestReceiver {
    /// Starts a receiver that answers 200 to everything.
    pub fn ok() -> Self {
        Self::start(0, |_| Reply::Status(200))
    }

    /// Starts a receiver on `port` (0 for any free one) answering with `responder`.
    pub fn start(
        port: u16,
        responder: impl Fn(&Received) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind receiver");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::<Received>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let responder: Responder = Arc::new(responder);
        let thread = {
            let received = received.clone();
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("test-receiver-{port}"))
                .spawn(move || accept_loop(listener, received, stop, responder))
                .expect("spawn receiver")
        };
        TestReceiver {
            port,
            received,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/events", self.port)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Events received, counting every event of a batch.
    pub fn event_count(&self) -> usize {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.ids.len())
            .sum()
    }

    /// Stops the server and closes its port.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("receiver thread");
        }
    }
}

impl Drop for TestReceiver {
    fn drop(&mut self) {
        self.shut();
    }
}

fn accept_loop(
    listener: TcpListener,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    responder: Responder,
) {
    let mut connections = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (received, stop, responder) =
                    (received.clone(), stop.clone(), responder.clone());
                connections.push(thread::spawn(move || {
                    serve_connection(stream, received, stop, responder)
                }));
            }
            Err(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
    // Closing the listener (dropping it) refuses new connections; wait for the open ones.
    drop(listener);
    for c in connections {
        let _ = c.join();
    }
}

/// Reads one request: headers (lower-cased names) and a content-length body.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(HashMap<String, String>, Vec<u8>)> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    if line.trim().is_empty() {
        return None;
    }
    let mut headers = HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((headers, body))
}

fn serve_connection(
    stream: TcpStream,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    responder: Responder,
) {
    let _ = stream.set_nonblocking(false);
    // Wake up now and then to notice a stop.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::SeqCst) {
        // Wait for the first byte of the next request without consuming it.
        match reader.fill_buf() {
            Ok([]) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        let _ = reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(5)));
        let Some((headers, raw)) = read_request(&mut reader) else {
            return;
        };
        let _ = reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(100)));
        let body: serde_json::Value =
            serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null);
        let ids: Vec<String> = match &body {
            serde_json::Value::Array(items) => items
                .iter()
                .map(|e| e["id"].as_str().unwrap_or_default().to_string())
                .collect(),
            other => vec![other["id"].as_str().unwrap_or_default().to_string()],
        };
        let event_id = ids.first().cloned().unwrap_or_default();
        let rec = {
            let mut all = received.lock().unwrap();
            let earlier = all.iter().filter(|r| r.event_id == event_id).count();
            let rec = Received {
                event_id,
                ids,
                raw,
                body,
                headers,
                earlier,
            };
            all.push(rec.clone());
            rec
        };
        let (status, extra, text) = match responder(&rec) {
            Reply::Status(s) => (s, None, ""),
            Reply::StatusBody(s, b) => (s, None, b),
            Reply::StatusHeader(s, name, value) => (s, Some((name, value)), ""),
            Reply::Hang(d) => {
                let until = Instant::now() + d;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(10));
                }
                (200, None, "")
            }
        };
        let mut response = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", text.len());
        if let Some((name, value)) = extra {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str("\r\n");
        response.push_str(text);
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// A port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The default bound on how long a test waits for deliveries.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// One row's delivery state, read straight from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub event_id: String,
    pub attempts: i64,
    pub delivered: bool,
    pub dead: bool,
    pub last_error: Option<String>,
    pub available_at: i64,
}

pub fn rows(outbox: &sqlite_outbox::Outbox) -> Vec<Row> {
    let conn = outbox.connection().unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT event_id, attempts, delivered_at IS NOT NULL, dead_at IS NOT NULL,
                    last_error, available_at
               FROM outbox_events ORDER BY id",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok(Row {
            event_id: r.get(0)?,
            attempts: r.get(1)?,
            delivered: r.get(2)?,
            dead: r.get(3)?,
            last_error: r.get(4)?,
            available_at: r.get(5)?,
        })
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

pub fn delivered_count(outbox: &sqlite_outbox::Outbox) -> i64 {
    outbox
        .connection()
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM outbox_events WHERE delivered_at IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Relay settings for tests: short backoffs so retries happen within a test's patience.
pub fn fast(config: sqlite_outbox::RelayConfig) -> sqlite_outbox::RelayConfig {
    config
        .poll_interval(Duration::from_millis(10))
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .offline_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .http_config(
            sqlite_outbox::transport::HttpConfig::new()
                .connect_timeout(Duration::from_secs(2))
                .request_timeout(Duration::from_secs(5)),
        )
        .lease(Duration::from_secs(30))
        .shutdown_timeout(Duration::from_secs(5))
}

/// An example binary built by `cargo test` (built here if this test runs on its own).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--example", name])
            .status()
            .expect("run cargo build --example");
        assert!(status.success());
    }
    path
}

/// Every event id stored in the database at `path`.
pub fn stored_event_ids(path: &std::path::Path) -> std::collections::HashSet<String> {
    sqlite_outbox::rusqlite::Connection::open(path)
        .unwrap()
        .prepare("SELECT event_id FROM outbox_events")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}
