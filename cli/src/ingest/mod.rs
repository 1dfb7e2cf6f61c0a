//! The fleet's receiving end (feature `postgres`): an HTTP server that verifies, de-duplicates
//! and stores device events in PostgreSQL, as many processes as the fleet needs.
//!
//! ```text
//! devices (outbox relay) ──HTTPS──▶ load balancer ──▶ outbox ingest × N ──▶ PostgreSQL
//!                                                                           │
//!                                   your consumers (SQL, logical replication, Debezium → Kafka)
//! ```
//!
//! Each request is verified (Standard Webhooks signature and timestamp, with the keys the
//! registry holds for the request's `outbox-source`: see [`IngestConfig::keys_file`]),
//! parsed (structured or batched CloudEvents), and its events stored in **one** PostgreSQL
//! transaction in
//! `outbox_ingested`, whose primary key is `(source, id)`: an event already stored is
//! skipped. Only after the commit does the device get its 204, so a 2xx means stored; a
//! device that gets no answer (a killed process, a lost connection) sends the same events
//! again, and the primary key drops them. Every event is therefore stored exactly once,
//! whichever ingest process each attempt reached. The processes share nothing but the
//! database, so a load balancer may send any request anywhere.
//!
//! [`IngestServer::start`] binds, starts the threads, and returns; its probe thread creates
//! or upgrades the tables (the start waits up to two seconds for that; a migration of a big
//! table goes on after it, without a statement timeout, and while PostgreSQL is down the
//! probe tries every second): until they are current every request gets 503 with
//! `Retry-After`, and `/healthz` is not 200. With `--keys-table`, `/healthz` is 200 only once the table of
//! device keys was read. The command-line form is `outbox ingest`.
//!
//! **Order.** A device's relay sends a partition key's events one at a time, in commit
//! order, each only after the previous one was acknowledged; so within `(source,
//! partitionkey)` rows are *committed* in `sequence` order, whichever process stored each
//! of them. `received_at` is each ingest process's own clock and must not be used for order.
//! Read a key's events in order with the function the migrations create:
//!
//! ```sql
//! SELECT id, sequence, data FROM outbox_key_events('/devices/42', 'order-7');
//! -- the same as
//! SELECT id, sequence, data FROM outbox_ingested
//!  WHERE source = '/devices/42' AND partitionkey = 'order-7' ORDER BY sequence;
//! ```
//!
//! A consumer that tails the table (by `received_at`, or through logical replication) may
//! see a key's event before a later one only in commit order: replication streams commits
//! in commit order, so per key it sees `sequence` ascending. Across keys and devices there
//! is no order.

mod admission;
mod fleet_page;
mod keys;
mod metrics;
mod prepared;
mod probe;
mod reports;
mod server;
pub(crate) mod store;
mod verification;
mod workers;
mod write_deadline;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use admission::{InflightBudget, PeerConnections, RefusalLog, SourceRate};
use keys::{Entry, Origin, Registry};
use probe::Probe;

/// How long [`IngestServer::start`] waits for the probe's first round (the tables created or
/// migrated, the keys read) before it returns.
const FIRST_ROUND_WAIT: Duration = Duration::from_secs(2);
use server::{Health, State};
use verification::VerifyPool;

pub use server::{BODY_RATE_GRACE, MAX_SOURCE_BYTES};

/// How long a statement may run on PostgreSQL: below the 30 s a request waits for its
/// database job, so a store that cannot finish is cancelled by the server, not left running
/// after its device was answered 503.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long data sent to PostgreSQL may stay unacknowledged, and how soon an idle
/// connection is probed: after a failover that drops packets, a database thread learns its
/// connection is dead within this, not the operating system's 15 minutes.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// Verification threads (gzip, signatures, parsing), off the I/O threads.
const VERIFY_THREADS: usize = 2;
use sqlite_outbox::receive::{pg_connect_config, PgTls, Secret, SigningKey, VerifyingKey};
use sqlite_outbox::{Error, Result};
use workers::Workers;

/// Settings of an ingest server.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    listen: SocketAddr,
    postgres: String,
    secrets: Vec<Secret>,
    keys_file: Option<PathBuf>,
    keys_table: bool,
    events_path: String,
    max_inflight_bytes: usize,
    max_inflight_bytes_per_peer: Option<usize>,
    max_connections_per_peer: Option<usize>,
    min_body_rate: usize,
    max_rate_per_source: Option<f64>,
    metrics_listen: Option<SocketAddr>,
    threads: usize,
    max_body: usize,
    max_connections: usize,
    read_timeout: Duration,
    write_timeout: Duration,
    max_requests_per_connection: usize,
    receipt_key: Option<SigningKey>,
    fleet_refresh: Duration,
    max_streams_per_source: usize,
    fleet_summaries: bool,
}

impl IngestConfig {
    /// Listen on `listen` (port 0: any free port, see [`IngestServer::local_addr`]) and
    /// store in the PostgreSQL database at `postgres` (a `postgresql://` URL or a
    /// `host=… user=…` string). Defaults: 8 database threads, bodies up to 1 MiB, 1,024 open
    /// connections, 10 s to read a request.
    pub fn new(listen: SocketAddr, postgres: impl Into<String>) -> IngestConfig {
        IngestConfig {
            listen,
            postgres: postgres.into(),
            secrets: Vec::new(),
            keys_file: None,
            keys_table: false,
            events_path: "/events".into(),
            max_inflight_bytes: 64 << 20,
            max_inflight_bytes_per_peer: None,
            max_connections_per_peer: None,
            min_body_rate: 1024,
            receipt_key: None,
            fleet_refresh: fleet_page::FLEET_EVERY,
            max_streams_per_source: store::DEFAULT_MAX_STREAMS_PER_SOURCE,
            fleet_summaries: true,
            max_rate_per_source: None,
            metrics_listen: None,
            threads: 8,
            max_body: 1 << 20,
            max_connections: 1024,
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            max_requests_per_connection: 1000,
        }
    }

    /// A shared signing secret that may sign for **any** source: the single-tenant mode,
    /// where every device holds the same secret (add several to rotate). A fleet whose
    /// devices must not sign for one another gives each its own key in a key registry
    /// instead ([`keys_file`](Self::keys_file), [`keys_table`](Self::keys_table)).
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// A key registry file: one `KEY_ID SOURCE_PATTERN KEY` a line (`#` starts a comment),
    /// where the pattern is a source or a prefix ending in `*`, and the key a device's
    /// `whpk_…` public key (or a `whsec_…` secret). Several lines may name one source
    /// (rotation). Re-read by [`IngestServer::reload_keys`] (`outbox ingest` calls it on
    /// SIGHUP) without dropping a connection; a file that no longer reads keeps the keys it
    /// had.
    pub fn keys_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.keys_file = Some(path.into());
        self
    }

    /// Takes keys from the table `outbox_device_keys` too (key_id, source_pattern, key,
    /// revoked_at; the ingest creates it), re-read within a second of any change: one
    /// `INSERT` provisions a device, setting `revoked_at` revokes its key.
    pub fn keys_table(mut self, on: bool) -> Self {
        self.keys_table = on;
        self
    }

    /// The path events are posted to (`/events` by default); any other path but `/healthz`
    /// is answered 404.
    pub fn events_path(mut self, path: impl Into<String>) -> Self {
        self.events_path = path.into();
        self
    }

    /// Body bytes in flight at most across all connections (64 MiB by default; 64 KiB to
    /// 16 GiB): the bytes of a body are counted as they arrive (not as declared) and held
    /// until the request is answered; a request whose bytes do not fit is answered 503 with
    /// `Retry-After: 1`.
    pub fn max_inflight_bytes(mut self, bytes: usize) -> Self {
        self.max_inflight_bytes = bytes;
        self
    }

    /// The share of [`max_inflight_bytes`](Self::max_inflight_bytes) one address (a peer's
    /// IP) may hold (a quarter of it by default; at least the body limit), so one client
    /// cannot take the budget from every device. Behind a load balancer that does not keep
    /// the device's address, every request comes from the balancer: raise it to the whole
    /// budget there.
    pub fn max_inflight_bytes_per_peer(mut self, bytes: usize) -> Self {
        self.max_inflight_bytes_per_peer = Some(bytes);
        self
    }

    /// Open connections one address may hold (a quarter of
    /// [`max_connections`](Self::max_connections) by default; 1 to that): the next is
    /// answered 503 with `Retry-After: 1` and closed. Behind a load balancer, or with many
    /// devices behind one NAT, raise it.
    pub fn max_connections_per_peer(mut self, connections: usize) -> Self {
        self.max_connections_per_peer = Some(connections);
        self
    }

    /// Bytes a second a body must arrive at after its first two seconds (1,024 by default;
    /// 0 to 1 GiB, 0: only the read timeout): a slower one gets 408 and its connection is
    /// closed.
    pub fn min_body_rate(mut self, bytes_per_second: usize) -> Self {
        self.min_body_rate = bytes_per_second;
        self
    }

    /// Signs, on every 2xx answer to events or to a stream's accounting, a receipt in the
    /// `outbox-receipt` header: the source, the stream, the numbers of the request's events
    /// that are stored (newly or before), the request's `webhook-id` and the time (see
    /// `sqlite_outbox::wire::Receipt`). Devices configured with the key's public half
    /// (`Destination::receipt_key`) count a delivery only with one.
    pub fn receipt_key(mut self, key: SigningKey) -> Self {
        self.receipt_key = Some(key);
        self
    }

    /// How often the fleet's view (`/fleet` and the fleet's totals in `/metrics`, on the
    /// metrics listener) is read again from PostgreSQL: default 15 s, at least 1 s.
    pub fn fleet_refresh(mut self, every: Duration) -> Self {
        self.fleet_refresh = every.max(Duration::from_secs(1));
        self
    }

    /// The most streams one source may have at the fleet (default 256, 1 to 65,536): a
    /// request that would give its source more is answered 422, nothing of it stored, and
    /// counted as a refusal (`streams_per_source`). A device has one stream per
    /// destination; the bound keeps one device's key from inventing streams without end.
    pub fn max_streams_per_source(mut self, streams: usize) -> Self {
        self.max_streams_per_source = streams;
        self
    }

    /// Keeps no streams' summaries, for a bench that measures what they cost in the same
    /// run. Never for real use: `outbox fleet` then names every number stored meanwhile
    /// missing.
    #[doc(hidden)]
    pub fn without_fleet_summaries_for_bench(mut self) -> Self {
        self.fleet_summaries = false;
        self
    }

    /// Verified requests a second one source may send (off by default; 0.01 to 100,000):
    /// past it 429 with `Retry-After`, so one device in a loop cannot starve the others.
    pub fn max_rate_per_source(mut self, per_second: Option<f64>) -> Self {
        self.max_rate_per_source = per_second;
        self
    }

    /// Serves `GET /metrics` (Prometheus text format, with the fleet's totals) and `GET
    /// /fleet` (the fleet's view as a page for people) on this address, apart from the
    /// events path; off by default.
    pub fn metrics_listen(mut self, addr: Option<SocketAddr>) -> Self {
        self.metrics_listen = addr;
        self
    }

    /// Database threads, and PostgreSQL connections (1 to 256).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The largest request body taken, in bytes (1 KiB to 256 MiB); larger ones get 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Open connections at most (1 to 1,000,000); past it new ones wait to be accepted.
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// How long a client has to send a request's head, and its body (each, in total).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// How long one write of an answer may wait for the client to read (10 s by default;
    /// 100 ms to 1 h): a client that pipelines requests and never reads its answers loses
    /// its connection then, and its slot of `max_connections` is free again.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// Requests one connection may carry (1,000 by default; 1 to 1,000,000): the answer to
    /// the last says `connection: close` and the connection ends, so no client keeps one
    /// connection (and its place behind a load balancer) for ever.
    pub fn max_requests_per_connection(mut self, requests: usize) -> Self {
        self.max_requests_per_connection = requests;
        self
    }

    fn check(&self) -> Result<(postgres::Config, PgTls)> {
        let bad = |why: String| Error::InvalidConfig(format!("ingest: {why}"));
        if self.secrets.is_empty() && self.keys_file.is_none() && !self.keys_table {
            return Err(bad(
                "needs a key registry (a keys file or the keys table) or a shared secret".into(),
            ));
        }
        if !self.events_path.starts_with('/') || self.events_path == "/healthz" {
            return Err(bad(format!(
                "the events path {:?} must start with / and not be /healthz",
                self.events_path
            )));
        }
        if !(64 << 10..=16 << 30).contains(&self.max_inflight_bytes) {
            return Err(bad(format!(
                "{} bytes in flight is out of range (64 KiB to 16 GiB)",
                self.max_inflight_bytes
            )));
        }
        if self.max_inflight_bytes < self.max_body {
            return Err(bad(format!(
                "the bytes in flight ({}) must be at least the body limit ({})",
                self.max_inflight_bytes, self.max_body
            )));
        }
        let per_peer = self.inflight_bytes_per_peer();
        if per_peer < self.max_body || per_peer > self.max_inflight_bytes {
            return Err(bad(format!(
                "{per_peer} bytes in flight per peer is out of range (the body limit, {}, to \
                 the bytes in flight, {})",
                self.max_body, self.max_inflight_bytes
            )));
        }
        let connections_per_peer = self.connections_per_peer();
        if !(1..=self.max_connections).contains(&connections_per_peer) {
            return Err(bad(format!(
                "{connections_per_peer} connections per peer is out of range (1 to the open \
                 connections, {})",
                self.max_connections
            )));
        }
        if self.min_body_rate > 1 << 30 {
            return Err(bad(format!(
                "a minimum body rate of {} bytes a second is out of range (0 to 1 GiB)",
                self.min_body_rate
            )));
        }
        if let Some(rate) = self.max_rate_per_source {
            if !(0.01..=100_000.0).contains(&rate) {
                return Err(bad(format!(
                    "a rate of {rate} requests a second per source is out of range (0.01 to \
                     100,000)"
                )));
            }
        }
        if !(1..=store::MOST_STREAMS_PER_SOURCE).contains(&self.max_streams_per_source) {
            return Err(bad(format!(
                "{} streams per source is out of range (1 to {})",
                self.max_streams_per_source,
                store::MOST_STREAMS_PER_SOURCE
            )));
        }
        if !(1..=256).contains(&self.threads) {
            return Err(bad(format!(
                "{} database threads is out of range (1 to 256)",
                self.threads
            )));
        }
        if !(1024..=256 << 20).contains(&self.max_body) {
            return Err(bad(format!(
                "a body limit of {} bytes is out of range (1 KiB to 256 MiB)",
                self.max_body
            )));
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err(bad(format!(
                "{} open connections is out of range (1 to 1,000,000)",
                self.max_connections
            )));
        }
        if self.read_timeout < Duration::from_millis(100)
            || self.read_timeout > Duration::from_secs(3600)
        {
            return Err(bad(format!(
                "a read timeout of {:?} is out of range (100 ms to 1 h)",
                self.read_timeout
            )));
        }
        if !(1..=1_000_000).contains(&self.max_requests_per_connection) {
            return Err(bad(format!(
                "{} requests a connection is out of range (1 to 1,000,000)",
                self.max_requests_per_connection
            )));
        }
        if self.write_timeout < Duration::from_millis(100)
            || self.write_timeout > Duration::from_secs(3600)
        {
            return Err(bad(format!(
                "a write timeout of {:?} is out of range (100 ms to 1 h)",
                self.write_timeout
            )));
        }
        let (mut config, tls) = pg_connect_config(&self.postgres).map_err(|e| match e {
            Error::InvalidConfig(why) => bad(why),
            other => other,
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        if config.get_application_name().is_none() {
            config.application_name("outbox-ingest");
        }
        // A dead connection is found within seconds, and a statement cannot outlive the
        // request waiting for it (the server cancels it at the timeout).
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        config
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
        let statement_timeout = format!("-c statement_timeout={}", STATEMENT_TIMEOUT.as_millis());
        let options = match config.get_options() {
            // The URL's own statement_timeout, if it sets one, comes later and wins.
            Some(theirs) => format!("{statement_timeout} {theirs}"),
            None => statement_timeout,
        };
        config.options(&options);
        Ok((config, tls))
    }

    fn inflight_bytes_per_peer(&self) -> usize {
        self.max_inflight_bytes_per_peer
            .unwrap_or((self.max_inflight_bytes / 4).max(self.max_body))
    }

    fn connections_per_peer(&self) -> usize {
        self.max_connections_per_peer
            .unwrap_or((self.max_connections / 4).max(1))
    }
}

/// A running ingest server: two I/O threads (`outbox-ingest-io`), two verification threads
/// (`outbox-ingest-verify-N`: gzip, signatures, parsing), the database threads
/// (`outbox-ingest-db-N`) and the probe (`outbox-ingest-probe`: `/healthz`, the keys
/// table), all joined by [`shutdown`](Self::shutdown) (or on drop).
pub struct IngestServer {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    keys_file: Option<PathBuf>,
    stop: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
    serving: Option<tokio::task::JoinHandle<()>>,
    probe: Probe,
    state: Arc<State>,
}

impl std::fmt::Debug for IngestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl IngestServer {
    /// Checks `config`, binds, and starts serving.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a setting out of range or a bad URL; [`Error::Io`] when
    /// the address cannot be bound or a thread cannot start.
    pub fn start(config: IngestConfig) -> Result<IngestServer> {
        let (postgres, tls) = config.check()?;
        let listener = std::net::TcpListener::bind(config.listen)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let keys = Registry::default();
        keys.replace(
            Origin::Secrets,
            config
                .secrets
                .iter()
                .enumerate()
                .map(|(i, secret)| {
                    Entry::any_source(
                        format!("secret-{}", i + 1),
                        VerifyingKey::Secret(secret.clone()),
                    )
                })
                .collect(),
        );
        if let Some(path) = &config.keys_file {
            let entries = keys::read_file(path)
                .map_err(|e| Error::InvalidConfig(format!("ingest: keys file {e:#}")))?;
            log::info!("ingest: {} keys from {}", entries.len(), path.display());
            keys.replace(Origin::File, entries);
        }
        let metrics_listener = match config.metrics_listen {
            Some(addr) => {
                let listener = std::net::TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                Some(listener)
            }
            None => None,
        };
        let workers = Workers::start(
            postgres.clone(),
            tls.clone(),
            config.threads,
            config.threads * 4,
            config.max_streams_per_source,
            config.fleet_summaries,
        )?;
        let state = Arc::new(State {
            keys,
            keys_table: config.keys_table,
            keys_table_loaded: std::sync::atomic::AtomicBool::new(false),
            workers,
            verify: VerifyPool::start(VERIFY_THREADS)?,
            peers: PeerConnections::new(config.connections_per_peer()),
            min_body_rate: config.min_body_rate,
            events_path: config.events_path.clone(),
            max_body: config.max_body,
            read_timeout: config.read_timeout,
            write_timeout: config.write_timeout,
            max_requests_per_connection: config.max_requests_per_connection,
            inflight: InflightBudget::new(
                config.max_inflight_bytes,
                config.inflight_bytes_per_peer(),
            ),
            rate: config.max_rate_per_source.map(SourceRate::new),
            metrics: Default::default(),
            refusal_log: RefusalLog::default(),
            refusals_by_source: Default::default(),
            health: watch::channel(Health::NotProbedYet).0,
            receipt_key: config.receipt_key.clone(),
            fleet: config.metrics_listen.map(|_| Default::default()),
            fleet_refresh: config.fleet_refresh,
        });
        if config.keys_file.is_some() {
            state.metrics.key_reload_succeeded();
        }
        // Its first round runs now: the tables are created or migrated, and the table of
        // device keys is read. The start waits for that round a moment (a new or current
        // database takes milliseconds); a longer migration goes on while the server
        // answers 503 with Retry-After.
        let probe = Probe::start(postgres, tls, Arc::clone(&state))?;
        let waited = std::time::Instant::now();
        while *state.health.borrow() == Health::NotProbedYet && waited.elapsed() < FIRST_ROUND_WAIT
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(1)
            .thread_name("outbox-ingest-io")
            .enable_io()
            .enable_time()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let mut metrics_addr = None;
        let serving = {
            let _entered = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)?;
            if let Some(listener) = metrics_listener {
                metrics_addr = Some(listener.local_addr()?);
                let listener = tokio::net::TcpListener::from_std(listener)?;
                runtime.spawn(server::serve_metrics(
                    listener,
                    Arc::clone(&state),
                    stopped.clone(),
                ));
            }
            runtime.spawn(server::serve(
                listener,
                Arc::clone(&state),
                config.max_connections,
                stopped,
            ))
        };
        log::info!("ingest: listening on http://{local_addr}");
        Ok(IngestServer {
            local_addr,
            metrics_addr,
            keys_file: config.keys_file,
            stop,
            runtime: Some(runtime),
            serving: Some(serving),
            probe,
            state,
        })
    }

    /// The address `GET /metrics` is served on, if [`IngestConfig::metrics_listen`] was set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Reads the keys file again (what SIGHUP does to `outbox ingest`). A file that does not read, or has a
    /// malformed line, changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the line; nothing when no keys file is configured.
    pub fn reload_keys(&self) -> Result<usize> {
        reload_file(self.keys_file.as_deref(), &self.state)
    }

    /// Refusals counted so far for `reason` (`unknown_source`, `forged_source`,
    /// `invalid_signature`, `rate_limited`, `inflight_budget`, `peer_inflight_budget`,
    /// `peer_connections`, `slow_body`, `source_too_long`, `keys_not_read`, `verify_queue`,
    /// …), as `GET /metrics` shows.
    pub fn refusals(&self, reason: &str) -> u64 {
        self.state.metrics.refusals(reason)
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets open requests finish (up to 5 s), and joins every thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            if let Some(serving) = self.serving.take() {
                let _ = runtime.block_on(serving);
            }
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        self.probe.stop();
        if let Some(state) = Arc::get_mut(&mut self.state) {
            state.verify.shutdown();
            state.workers.shutdown();
        }
    }
}

/// Re-reads the keys file; how many keys there are then in all.
fn reload_file(path: Option<&std::path::Path>, state: &State) -> Result<usize> {
    let Some(path) = path else {
        return Ok(0);
    };
    let entries = keys::read_file(path).map_err(|e| {
        state.metrics.key_reload_failed();
        log::error!("ingest: keys file not reloaded, the keys stay as they were: {e:#}");
        Error::InvalidConfig(format!("ingest: keys file {e:#}"))
    })?;
    state.metrics.key_reload_succeeded();
    let loaded = entries.len();
    let total = state.keys.replace(Origin::File, entries);
    log::info!(
        "ingest: reloaded {loaded} keys from {} ({total} in all)",
        path.display()
    );
    Ok(total)
}

/// Checks a keys file as a reload would read it (what `outbox ingest --check-keys` does):
/// how many keys it holds.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the first malformed line (never a key).
pub fn check_keys_file(path: &std::path::Path) -> Result<usize> {
    keys::read_file(path)
        .map(|entries| entries.len())
        .map_err(|e| Error::InvalidConfig(format!("keys file {e:#}")))
}

/// A value from a request (or anything a client chose) as it may go into a log line:
/// escaped, so it cannot start a line of its own or hide what follows, and cut to 200
/// characters.
pub(crate) fn loggable(text: &str) -> String {
    const MAX_CHARS: usize = 200;
    let mut shown: String = text.chars().take(MAX_CHARS).collect();
    let cut = shown.len() < text.len();
    shown = format!("{:?}", shown);
    if cut {
        shown.push_str(&format!("… ({} bytes)", text.len()));
    }
    shown
}

/// Locks `mutex`; a panic elsewhere while it was held leaves counters and maps that are
/// still usable, so the poison is ignored.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for IngestServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(url: &str) -> postgres::Config {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), url)
            .secret(secret)
            .check()
            .unwrap()
            .0
    }

    #[test]
    fn connections_to_postgresql_carry_keepalives_a_tcp_user_timeout_and_a_statement_timeout() {
        let config = checked("postgresql://u@127.0.0.1/db");
        assert_eq!(config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(config.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(config.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(config.get_options(), Some("-c statement_timeout=20000"));
        // A URL's own settings come last, and win.
        let config = checked("postgresql://u@127.0.0.1/db?options=-c%20statement_timeout%3D5000");
        assert_eq!(
            config.get_options(),
            Some("-c statement_timeout=20000 -c statement_timeout=5000")
        );
    }

    #[test]
    fn per_address_shares_default_to_a_quarter_and_are_checked() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let config =
            IngestConfig::new("127.0.0.1:0".parse().unwrap(), "postgresql://u@h/db").secret(secret);
        assert_eq!(config.inflight_bytes_per_peer(), 16 << 20);
        assert_eq!(config.connections_per_peer(), 256);
        for bad in [
            config.clone().max_inflight_bytes_per_peer(1024),
            config.clone().max_inflight_bytes_per_peer(128 << 20),
            config.clone().max_connections_per_peer(0),
            config.clone().max_connections_per_peer(2048),
            config.clone().min_body_rate(2 << 30),
        ] {
            let Err(e) = bad.check() else {
                panic!("accepted");
            };
            let e = e.to_string();
            assert!(e.contains("out of range"), "{e:#}");
        }
    }
}
