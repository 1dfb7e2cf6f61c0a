//! `outbox ingest`: the fleet's receiving end. Verifies signed CloudEvents from devices and
//! stores each event once in PostgreSQL, until SIGINT or SIGTERM; SIGHUP re-reads `--keys`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use outbox_cli::ingest::{check_keys_file, IngestConfig, IngestServer};
use sqlite_outbox::receive::Secret;

use crate::failure::{bad_input, failed, Outcome};
use crate::parse_duration;

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct IngestArgs {
    /// The address to listen on, like 0.0.0.0:8080 (port 0: any free port, printed).
    #[arg(long, required_unless_present = "check_keys")]
    listen: Option<SocketAddr>,
    /// Check a keys file as SIGHUP would read it, print how many keys it holds, and exit
    /// (0: it reads; 2: the first malformed line is named). Nothing is served.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["listen", "keys_table"])]
    check_keys: Option<PathBuf>,
    /// The PostgreSQL database (postgresql://user@host/db or "host=… user=…"). Visible to
    /// `ps`: prefer --postgres-file or OUTBOX_POSTGRES_URL.
    #[arg(long, env = "OUTBOX_POSTGRES_URL", hide_env_values = true)]
    postgres: Option<String>,
    /// A file whose first line is the PostgreSQL URL.
    #[arg(long)]
    postgres_file: Option<PathBuf>,
    /// whsec_… secret shared by the whole fleet, which may sign for ANY source (the
    /// single-tenant mode); repeat for rotation. Per-device keys: --keys or --keys-table.
    /// Visible to `ps`: prefer --secret-file or OUTBOX_SECRET.
    #[arg(long, env = "OUTBOX_SECRET", hide_env_values = true)]
    secret: Vec<String>,
    /// A file of whsec_… secrets, one per line.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// The key registry: one `KEY_ID SOURCE_PATTERN KEY` a line (# starts a comment); the
    /// pattern is a source or a prefix ending in *, the key a device's whpk_… public key
    /// (from `outbox keygen`) or a whsec_… secret. Re-read on SIGHUP.
    #[arg(long)]
    keys: Option<PathBuf>,
    /// Take keys from the table outbox_device_keys too, re-read within a second of a change.
    #[arg(long)]
    keys_table: bool,
    /// The path events are posted to; any other path but /healthz is 404.
    #[arg(long, default_value = "/events")]
    events_path: String,
    /// Request body bytes in flight at most across all connections; past it 503 with
    /// Retry-After, before the body is read.
    #[arg(long, default_value_t = 64 << 20)]
    max_inflight_bytes: usize,
    /// The share of --max-inflight-bytes one address may hold (default: a quarter). Behind
    /// a load balancer that hides devices' addresses, set it to --max-inflight-bytes.
    #[arg(long)]
    max_inflight_bytes_per_peer: Option<usize>,
    /// Open connections one address may hold; the next gets 503 (default: a quarter of
    /// --max-connections). Raise it behind a load balancer or a NAT with many devices.
    #[arg(long)]
    max_connections_per_peer: Option<usize>,
    /// Bytes a second a body must arrive at after its first 2 s; slower gets 408 (0: only
    /// --read-timeout).
    #[arg(long, default_value_t = 1024)]
    min_body_rate: usize,
    /// Verified requests a second one source may send; past it 429 with Retry-After
    /// (default: no limit).
    #[arg(long)]
    max_rate_per_source: Option<f64>,
    /// A file holding the ingest's own Ed25519 key (whsk_…, from `outbox keygen`): every
    /// 2xx carries a receipt signed with it (header outbox-receipt), which relays given its
    /// public key (--receipt-public-key) require before they count a delivery.
    #[arg(long, value_name = "FILE")]
    receipt_key: Option<PathBuf>,
    /// How often the fleet's view (GET /fleet and the fleet's totals in /metrics, on
    /// --metrics-listen) is read again from PostgreSQL.
    #[arg(long, value_parser = crate::parse_duration, default_value = "15s")]
    fleet_refresh: std::time::Duration,
    /// The most streams one source may have at the fleet (a device has one per
    /// destination): a request that would give its source more is answered 422 and counted
    /// as a refusal. 1 to 65536.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_streams_per_source: usize,
    /// Serve GET /metrics (Prometheus text format) and GET /fleet (the fleet's streams as
    /// a page) on this address, e.g. 127.0.0.1:9090; never on the events port.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Database threads and PostgreSQL connections.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// The largest request body, in bytes; larger ones get 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Open connections at most; past it, new ones wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Time a client has to send a request's head, and its body (e.g. 10s).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    read_timeout: Duration,
    /// Time one write of an answer may wait for the client to read it; a client that
    /// pipelines requests and reads nothing loses its connection then (e.g. 10s).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    write_timeout: Duration,
    /// Requests one connection may carry; the answer to the last closes it.
    #[arg(long, default_value_t = 1000)]
    max_requests_per_connection: usize,
}

pub fn run(args: IngestArgs) -> Outcome {
    if let Some(path) = &args.check_keys {
        let keys = check_keys_file(path).map_err(|e| bad_input(e.to_string()))?;
        println!("{}: {keys} keys, every line reads", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let Some(listen) = args.listen else {
        return Err(bad_input("--listen ADDRESS is required"));
    };
    let url = match (&args.postgres, &args.postgres_file) {
        (Some(_), Some(_)) => {
            return Err(bad_input("give --postgres or --postgres-file, not both"));
        }
        (Some(url), None) => url.clone(),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--postgres-file {}: {e:#}", path.display())))?;
            text.lines().next().unwrap_or("").trim().to_string()
        }
        (None, None) => {
            return Err(bad_input(
                "--postgres URL, --postgres-file F or OUTBOX_POSTGRES_URL is required",
            ));
        }
    };
    let mut texts = args.secret.clone();
    if let Some(path) = &args.secret_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("--secret-file {}: {e:#}", path.display())))?;
        texts.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() && args.keys.is_none() && !args.keys_table {
        return Err(bad_input(
            "--keys FILE, --keys-table, or --secret (--secret-file, OUTBOX_SECRET) is required: \
             ingest takes signed requests only",
        ));
    }
    let receipt_key = match &args.receipt_key {
        None => None,
        Some(path) => Some(crate::keygen::read_key_file(path, "--receipt-key")?.1),
    };
    let mut config = IngestConfig::new(listen, url)
        .keys_table(args.keys_table)
        .events_path(&args.events_path)
        .max_inflight_bytes(args.max_inflight_bytes)
        .min_body_rate(args.min_body_rate)
        .max_rate_per_source(args.max_rate_per_source)
        .metrics_listen(args.metrics_listen)
        .threads(args.threads)
        .max_body(args.max_body)
        .max_connections(args.max_connections)
        .read_timeout(args.read_timeout)
        .write_timeout(args.write_timeout)
        .max_requests_per_connection(args.max_requests_per_connection);
    if let Some(key) = receipt_key {
        config = config.receipt_key(key);
    }
    config = config
        .fleet_refresh(args.fleet_refresh)
        .max_streams_per_source(args.max_streams_per_source);
    if let Some(path) = &args.keys {
        config = config.keys_file(path);
    }
    if let Some(bytes) = args.max_inflight_bytes_per_peer {
        config = config.max_inflight_bytes_per_peer(bytes);
    }
    if let Some(connections) = args.max_connections_per_peer {
        config = config.max_connections_per_peer(connections);
    }
    for text in &texts {
        let secret = Secret::parse(text).map_err(|e| bad_input(format!("a secret: {e:#}")))?;
        config = config.secret(secret);
    }
    // The stop signals (and, on unix, SIGHUP) are taken before the server starts, so none
    // arriving early ends the process by its default action.
    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| failed(format!("cannot start the signal runtime: {e:#}")))?;
    let mut stop = {
        let _entered = signals.enter();
        StopSignals::listen().map_err(|e| failed(format!("cannot listen for signals: {e:#}")))?
    };
    let server = IngestServer::start(config)?;
    // The one line a supervisor or a test reads to learn the port.
    println!("listening on http://{}", server.local_addr());
    if let Some(addr) = server.metrics_addr() {
        println!("metrics on http://{addr}/metrics");
    }
    let _ = std::io::stdout().flush();
    signals.block_on(stop.serve(&server));
    server.shutdown();
    Ok(ExitCode::SUCCESS)
}

/// The signals `outbox ingest` answers: on unix, SIGINT and SIGTERM stop it and SIGHUP
/// re-reads `--keys`; on Windows, Ctrl-C and closing the console stop it (keys are re-read
/// there by a restart, or taken from `--keys-table`, re-read within a second).
#[cfg(unix)]
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl StopSignals {
    fn listen() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Until a stop signal; each SIGHUP re-reads the keys file.
    async fn serve(&mut self, server: &IngestServer) {
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return,
                _ = self.terminate.recv() => return,
                _ = self.hangup.recv() => {
                    // A file that does not read is logged, counted and changes nothing.
                    let _ = server.reload_keys();
                }
            }
        }
    }
}

#[cfg(windows)]
struct StopSignals {
    ctrl_c: tokio::signal::windows::CtrlC,
    close: tokio::signal::windows::CtrlClose,
}

#[cfg(windows)]
impl StopSignals {
    fn listen() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            ctrl_c: tokio::signal::windows::ctrl_c()?,
            close: tokio::signal::windows::ctrl_close()?,
        })
    }

    /// Until Ctrl-C or the console closes.
    async fn serve(&mut self, _server: &IngestServer) {
        tokio::select! {
            _ = self.ctrl_c.recv() => {}
            _ = self.close.recv() => {}
        }
    }
}
