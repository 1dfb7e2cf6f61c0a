//! Test helpers: a real HTTP receiver on 127.0.0.1 and deadline-bounded waits.
#![allow(dead_code)]

pub mod http_server;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub use http_server::{HttpServer, Request, Response};

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
    /// When it arrived.
    pub at: std::time::Instant,
}

impl Received {
    /// The headers as name-value pairs, as `verify_request` takes them.
    pub fn header_pairs(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// The unix time in seconds at `at`.
pub fn unix_secs(at: std::time::SystemTime) -> i64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The `outbox` CLI on `db` with `args`, without the environment's OUTBOX_* settings.
pub fn cli_command(db: &std::path::Path, args: &[&str]) -> std::process::Command {
    // Set by cargo for the tests of the package with the binary (cli/): the tests of the
    // library at the top share these helpers but never run the CLI.
    let Some(binary) = option_env!("CARGO_BIN_EXE_outbox") else {
        panic!("the `outbox` binary is built for the tests in cli/tests only");
    };
    let mut command = std::process::Command::new(binary);
    command
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("OUTBOX_DB")
        .env_remove("OUTBOX_SECRET")
        .env_remove("OUTBOX_SYNCHRONOUS");
    command
}

/// Runs the `outbox` CLI on `db` with `args`, without the environment's OUTBOX_* settings.
pub fn outbox_cli(db: &std::path::Path, args: &[&str]) -> std::process::Output {
    cli_command(db, args).output().expect("run outbox")
}

/// Runs the `outbox` CLI on `db` with `args`, feeding it `stdin` (for `enqueue --jsonl`).
pub fn outbox_cli_with_stdin(
    db: &std::path::Path,
    args: &[&str],
    stdin: &[u8],
) -> std::process::Output {
    use std::io::Write;
    let mut child = cli_command(db, args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run outbox");
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin).expect("write the CLI's stdin");
    drop(input);
    child.wait_with_output().expect("wait for outbox")
}

/// How the receiver answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    StatusBody(u16, &'static str),
    StatusHeader(u16, &'static str, String),
    /// Hold the request this long (or until the receiver stops), then answer 200.
    Hang(Duration),
    /// Close the connection without answering.
    Reset,
    /// Answer with this status and this `Date` header.
    StatusAt(u16, std::time::SystemTime),
}

/// A receiver on 127.0.0.1 (the shared [`HttpServer`]) that records every request and
/// answers as told.
pub struct TestReceiver {
    pub port: u16,
    received: Arc<Mutex<Log>>,
    server: Option<HttpServer>,
}

/// Every request received, and how many requests each event id came first in.
#[derive(Default)]
struct Log {
    requests: Vec<Received>,
    /// The streams' accounting events received (not counted as requests).
    accountings: Vec<serde_json::Value>,
    seen: std::collections::HashMap<String, usize>,
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
        let received = Arc::new(Mutex::new(Log::default()));
        let log = received.clone();
        let server = HttpServer::bind(("127.0.0.1", port), move |request| {
            let rec = record(&log, request);
            match responder(&rec) {
                Reply::Status(s) => Response::status(s),
                Reply::StatusBody(s, b) => Response::status(s).body(b),
                Reply::StatusHeader(s, name, value) => Response::status(s).header(name, value),
                Reply::Hang(d) => Response::status(200).after(d),
                Reply::Reset => Response::reset(),
                Reply::StatusAt(s, at) => {
                    Response::status(s).header("date", httpdate::fmt_http_date(at))
                }
            }
        })
        .expect("bind receiver");
        TestReceiver {
            port: server.port(),
            received,
            server: Some(server),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/events", self.port)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().requests.clone()
    }

    /// The id of every event received, once per receipt (batches counted event by event).
    pub fn event_ids(&self) -> Vec<String> {
        let log = self.received.lock().unwrap();
        log.requests.iter().flat_map(|r| r.ids.clone()).collect()
    }

    /// The accounting events received, in order (each a CloudEvent of type
    /// `wire::ACCOUNTING_TYPE`).
    pub fn accountings(&self) -> Vec<serde_json::Value> {
        self.received.lock().unwrap().accountings.clone()
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().requests.len()
    }

    /// Events received, counting every event of a batch.
    pub fn event_count(&self) -> usize {
        self.received
            .lock()
            .unwrap()
            .requests
            .iter()
            .map(|r| r.ids.len())
            .sum()
    }

    /// Stops the server and closes its port.
    pub fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop();
        }
    }
}

/// Records one request, noting how many requests for its event id came before.
fn record(log: &Mutex<Log>, request: &Request) -> Received {
    let body: serde_json::Value =
        serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
    let ids: Vec<String> = match &body {
        serde_json::Value::Array(items) => items
            .iter()
            .map(|e| e["id"].as_str().unwrap_or_default().to_string())
            .collect(),
        other => vec![other["id"].as_str().unwrap_or_default().to_string()],
    };
    let event_id = ids.first().cloned().unwrap_or_default();
    let mut log = log.lock().unwrap();
    // A stream's accounting (issue 58) is not an event: kept apart, answered like the rest.
    let first = match &body {
        serde_json::Value::Array(items) => items.first().cloned().unwrap_or_default(),
        other => other.clone(),
    };
    if first["type"] == sqlite_outbox::wire::ACCOUNTING_TYPE {
        log.accountings.push(first);
        return Received {
            event_id,
            ids,
            raw: request.body.clone(),
            body,
            headers: request.headers.iter().cloned().collect(),
            earlier: 0,
            at: std::time::Instant::now(),
        };
    }
    let seen = log.seen.entry(event_id.clone()).or_default();
    let earlier = *seen;
    *seen += 1;
    let rec = Received {
        event_id,
        ids,
        raw: request.body.clone(),
        body,
        headers: request.headers.iter().cloned().collect(),
        earlier,
        at: std::time::Instant::now(),
    };
    log.requests.push(rec.clone());
    rec
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

/// Sets its flag when dropped, so a scoped thread looping until the flag is set stops even
/// when the test's own thread panics: `std::thread::scope` joins its threads before it
/// passes the panic on, and a loop nobody stops would turn a failing test into a hang.
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The default bound on how long a test waits for deliveries.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// One row's delivery state, read straight from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub event_id: String,
    pub event_type: String,
    pub attempts: i64,
    pub delivered: bool,
    pub dead: bool,
    pub last_error: Option<String>,
    pub available_at: i64,
}

/// Waits up to `limit` for every row of `outbox` to be delivered; whether they were.
pub fn all_delivered_within(outbox: &sqlite_outbox::Outbox, limit: Duration) -> bool {
    wait_until(limit, || rows(outbox).iter().all(|r| r.delivered))
}

/// Every row `sql` returns from `outbox`'s file, each read by `read`.
pub fn query_rows<T>(
    outbox: &sqlite_outbox::Outbox,
    sql: &str,
    read: impl FnMut(&sqlite_outbox::rusqlite::Row<'_>) -> sqlite_outbox::rusqlite::Result<T>,
) -> Vec<T> {
    let conn = outbox.connection().unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt
        .query_map([], read)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows
}

pub fn rows(outbox: &sqlite_outbox::Outbox) -> Vec<Row> {
    let conn = outbox.connection().unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT event_id, attempts, delivered_at IS NOT NULL, dead_at IS NOT NULL,
                    last_error, available_at, event_type
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
            event_type: r.get(6)?,
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

/// Test settings ([`fast`]) delivering to `receiver`, with a poll of a minute: within a
/// test's patience only a wake-up (a notification, `Outbox::notify`) or a timer brings an
/// event out.
pub fn minute_poll(receiver: &TestReceiver) -> sqlite_outbox::RelayConfig {
    fast(sqlite_outbox::RelayConfig::new())
        .poll_interval(Duration::from_secs(60))
        .destination(sqlite_outbox::Destination::http("default", receiver.url()))
}

/// An example binary, built now for this test run's profile: always, so a test never runs
/// a stale binary left from an earlier build (cargo does nothing when it is up to date).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    // Built once a test process: each cargo run costs about a second, and some tests start
    // an example in a loop (cli/tests/crash.rs: 30 rounds).
    static BUILT: std::sync::Mutex<Vec<(String, std::path::PathBuf)>> =
        std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let path = build_example(name);
    built.push((name.to_string(), path.clone()));
    path
}

fn build_example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>: the profile folder is two up.
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    // Without the variables Cargo set for this test (CARGO_MANIFEST_DIR, CARGO_PKG_*, …):
    // build scripts track some of them (ring's tracks CARGO_MANIFEST_DIR), so a build with
    // them differs from the workspace's own, and each built ring, rustls, ureq and the
    // library again, about 30 s, then again for the next plain `cargo build`.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo_for_the_test = key == "CARGO_MANIFEST_DIR"
            || key == "CARGO_MANIFEST_PATH"
            || key == "CARGO_MANIFEST_LINKS"
            || key == "CARGO_CRATE_NAME"
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR"
            || key == "CARGO_RUSTC_CURRENT_DIR"
            || key == "OUT_DIR"
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_");
        if set_by_cargo_for_the_test {
            build.env_remove(&*key);
        }
    }
    // The examples are the library's (the package at the top), whichever package this test
    // belongs to; built as the workspace's, as `cargo test --workspace --all-features` builds
    // everything, so the dependencies' features are the same and nothing is built twice.
    build.args(["build", "--workspace", "--all-features", "--example", name]);
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build --example");
    assert!(status.success(), "cargo build --example {name} failed");
    let path = profile_dir.join("examples").join(name);
    assert!(path.exists(), "{} was not built", path.display());
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

/// The millisecond time a UUIDv7 carries, checking that it is one (version 7, RFC 4122
/// variant).
pub fn v7_millis(id: &str) -> u64 {
    let uuid = uuid::Uuid::parse_str(id).unwrap();
    assert_eq!(uuid.get_version_num(), 7, "{id}");
    assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{id}");
    let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
    secs * 1000 + u64::from(nanos) / 1_000_000
}

/// Voluntary context switches (a thread going to sleep: each one a wake-up to come) of this
/// process's threads whose names start with one of `prefixes`, by thread id and name
/// (Linux's `/proc`).
pub fn voluntary_switches(prefixes: &[&str]) -> std::collections::BTreeMap<(String, String), u64> {
    let mut switches = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !prefixes.iter().any(|p| comm.starts_with(p)) {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let count = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let tid = task.file_name().to_string_lossy().into_owned();
        switches.insert((tid, comm.trim().to_string()), count);
    }
    switches
}

/// Commits one event of `event_type` with `data` (JSON text) through the SQL contract from
/// a python3 process: another process writing to the file, as an app in another language.
pub fn insert_from_python(db: &std::path::Path, event_type: &str, data: &str) {
    let script = "import sqlite3, sys\n\
                  c = sqlite3.connect(sys.argv[1], timeout=10)\n\
                  c.execute('INSERT INTO outbox_enqueue (type, data) VALUES (?, ?)', sys.argv[2:4])\n\
                  c.commit()\n";
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(db)
        .args([event_type, data])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "python3's insert failed: {status}");
}

/// An outbox at `path` with `n` events of `event_type` (data `{"i": i}`) committed in one
/// transaction.
pub fn outbox_with_events(
    path: &std::path::Path,
    event_type: &str,
    n: usize,
) -> sqlite_outbox::Outbox {
    let outbox = sqlite_outbox::Outbox::open(path).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let event = sqlite_outbox::Event::new(event_type, serde_json::json!({"i": i}));
                let _ = outbox.enqueue(tx, event)?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    outbox
}

/// A relay of [`fast`] settings delivering to `url` with `http` (2 s to connect, 5 s a
/// request), giving each event `max_attempts`.
pub fn relay_over_http(
    outbox: &sqlite_outbox::Outbox,
    url: &str,
    http: sqlite_outbox::transport::HttpConfig,
    max_attempts: u32,
) -> sqlite_outbox::RelayHandle {
    let destination = sqlite_outbox::Destination::http("default", url);
    outbox
        .relay(
            fast(sqlite_outbox::RelayConfig::new().destination(destination))
                .http_config(
                    http.connect_timeout(Duration::from_secs(2))
                        .request_timeout(Duration::from_secs(5)),
                )
                .max_attempts(max_attempts),
        )
        .start()
        .unwrap()
}
