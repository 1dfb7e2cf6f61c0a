//! `outbox relay`: deliver pending events to a URL until a signal, an empty outbox, or a
//! timeout.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use sqlite_outbox::transport::HttpConfig;
#[cfg(feature = "mqtt")]
use sqlite_outbox::transport::{MqttConfig, MqttVersion};
use sqlite_outbox::{Compression, Destination, Outbox, RelayConfig};

use crate::failure::{bad_input, failed, Failure, Outcome};
use crate::parse_duration;

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct RelayArgs {
    /// Where to deliver: an http(s):// URL to POST events to, or mqtt://host:port
    /// (mqtts:// for TLS) to publish them to an MQTT broker (QoS 1, one message per event).
    #[arg(long)]
    url: String,
    /// MQTT only: the topic template, with {type}, {key}, {source}, {subject} and
    /// {destination} placeholders; {subject?} lets a missing value make an empty level.
    #[arg(long, default_value = "outbox/{type}")]
    topic: String,
    /// MQTT only: the protocol version, 3 (3.1.1) or 5.
    #[arg(long, value_parser = parse_mqtt_version)]
    mqtt_version: Option<MqttProtocol>,
    /// MQTT 5 only: binary content mode (the data as payload, the attributes as user
    /// properties) instead of the JSON envelope.
    #[arg(long)]
    mqtt_binary: bool,
    /// http(s):// only: send through this HTTP proxy (`http://[user:password@]host:port`;
    /// HTTPS goes through CONNECT, plain HTTP in absolute form). Without it or
    /// --proxy-from-env, no proxy is used.
    #[arg(long, value_name = "URL", conflicts_with = "proxy_from_env")]
    proxy: Option<String>,
    /// http(s):// only: use the proxy the environment names, as curl reads it (https_proxy,
    /// http_proxy, all_proxy, no_proxy).
    #[arg(long)]
    proxy_from_env: bool,
    /// https:// or mqtts://: a PEM file of CA certificates to trust for the receiver's or
    /// broker's certificate instead of Mozilla's roots (built in): a private CA.
    #[arg(long, visible_alias = "ca-file")]
    ca: Option<std::path::PathBuf>,
    /// https:// or mqtts://: the device's certificate chain (PEM), for mutual TLS; needs
    /// --client-key.
    #[arg(long, visible_alias = "client-cert")]
    cert: Option<std::path::PathBuf>,
    /// https:// or mqtts://: the private key (PEM) of --cert. (`--key`, its old name, is
    /// still taken: `enqueue --key` is a partition key.)
    #[arg(long = "client-key", alias = "key")]
    key: Option<std::path::PathBuf>,
    /// MQTT only: a fixed client id (default: outbox- and a random suffix per start).
    #[arg(long)]
    client_id: Option<String>,
    /// MQTT only: the user name to connect with (the password comes from --password-file).
    #[arg(long)]
    username: Option<String>,
    /// MQTT only: a file holding the password (its first line), out of sight of ps.
    #[arg(long)]
    password_file: Option<std::path::PathBuf>,
    /// whsec_… signing secret; repeat for rotation. Visible to `ps`: prefer --secret-file or
    /// OUTBOX_SECRET.
    #[arg(long, env = "OUTBOX_SECRET", hide_env_values = true)]
    secret: Vec<String>,
    /// A file of whsec_… secrets, one per line (read once at start).
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// A file holding this device's own Ed25519 key (whsk_…, from `outbox keygen`): every
    /// request is signed with it (Standard Webhooks v1a) and the receiver verifies with its
    /// public key. Read once at start.
    #[arg(long)]
    signing_key: Option<std::path::PathBuf>,
    /// http(s):// only: count a delivery only with a receipt signed by this key (whpk_…,
    /// the public half of `outbox ingest --receipt-key`). A 2xx without one (a captive
    /// portal, a proxy, the wrong server) delivers nothing, spends no attempt, and pauses
    /// the destination for this run.
    #[arg(long, value_name = "WHPK")]
    receipt_public_key: Option<String>,
    /// http(s):// only: never tell the receiver what became of every event (the streams'
    /// accounting, events of type dev.sqlite-outbox.accounting, which `outbox ingest`
    /// stores for `outbox fleet`). By default they go once the receiver says it takes
    /// them (`outbox ingest` does), so a generic receiver never gets them.
    #[arg(long, conflicts_with = "accounting")]
    no_accounting: bool,
    /// http(s):// only: tell the receiver the streams' accounting from the start, whether
    /// or not it says it takes them.
    #[arg(long)]
    accounting: bool,
    /// Send batches of up to N events per request (MQTT: publish N messages back to back
    /// per worker, then await their PUBACKs).
    #[arg(long)]
    batch: Option<usize>,
    /// HTTP only: `gzip` sends request bodies of 1 KiB or more gzip-compressed
    /// (`Content-Encoding: gzip`; signatures stay over the uncompressed body). The receiver
    /// must decode gzip (`outbox ingest` does). `none` is the default.
    #[arg(long)]
    compress: Option<Compression>,
    /// With --batch: while fewer events are due than fill a batch, wait up to this long
    /// (e.g. 2s) for more before sending, so a trickle goes out a batch per request instead
    /// of an event per request. Events of priority 8 or above go at once; stopping sends
    /// what is waiting. At most a quarter of --lease.
    #[arg(long, value_parser = parse_duration)]
    linger: Option<Duration>,
    /// Concurrent requests.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// How long a claim holds its events before another relay may take them over (e.g.
    /// 60s, 5m).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    lease: Duration,
    /// The lease in whole seconds (the old form of --lease).
    #[arg(long, hide = true, conflicts_with = "lease")]
    lease_secs: Option<u64>,
    /// Answered attempts before an event is dead-lettered.
    #[arg(long, default_value_t = 25)]
    max_attempts: u32,
    /// Exit 0 once nothing is pending for the destination (3 if stopped by a signal first,
    /// with events pending). Without a terminal, says where it stands every 5 s.
    #[arg(long)]
    until_empty: bool,
    /// The destination whose events to deliver.
    #[arg(long, default_value = "default")]
    destination: String,
    /// At most N requests per second, paced (a batch or an MQTT publish is one request).
    #[arg(long, allow_negative_numbers = true)]
    rate: Option<f64>,
    /// At most this many bytes of request bodies per second, paced.
    #[arg(long, allow_negative_numbers = true)]
    bandwidth: Option<i64>,
    /// A data budget: at most SIZE in each PERIOD, counted as the network counts it (TLS,
    /// headers, answers and retries included), kept in the file across restarts: e.g.
    /// 50MB/30d, 2MB/1d, 60KB/1m (B, KB, MB, GB are powers of 1000; periods 1m to 31d).
    /// Once spent, events wait for the next period without spending attempts.
    #[arg(long, value_name = "SIZE/PERIOD")]
    budget: Option<String>,
    /// With --budget: events of this priority (0-9) and above go even when the budget is
    /// spent (and are counted).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    budget_exempt_priority: Option<i64>,
    /// Stop after this long (e.g. 30s, 5m): exit 3 if events are still pending, else 0.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
}

/// How often `--until-empty` without a terminal says where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

pub fn run(outbox: &Outbox, args: RelayArgs) -> Outcome {
    let lease = args.lease_secs.map_or(args.lease, Duration::from_secs);
    let mut destination = if args.url.starts_with("mqtt://") || args.url.starts_with("mqtts://") {
        mqtt_destination(&args, lease)?
    } else {
        http_destination(&args, lease)?
    };
    // The relay's start checks these (exit 2 with its reason): linger needs a batch and
    // fits in a quarter of the lease; compression is for HTTP.
    if let Some(linger) = args.linger {
        destination = destination.linger(linger);
    }
    if let Some(compression) = args.compress {
        destination = destination.compress(compression);
    }
    if let Some(rate) = args.rate {
        if !(rate > 0.0 && rate <= 1_000_000.0) {
            return Err(bad_input(format!(
                "--rate {rate} is out of range: more than 0, at most 1000000 requests per second"
            )));
        }
        destination = destination.rate_limit(rate);
    }
    if let Some(bandwidth) = args.bandwidth {
        let Ok(bytes) = u64::try_from(bandwidth) else {
            return Err(bad_input(format!(
                "--bandwidth {bandwidth} is out of range: more than 0 bytes per second"
            )));
        };
        if bytes == 0 {
            return Err(bad_input(
                "--bandwidth 0 is out of range: more than 0 bytes per second",
            ));
        }
        destination = destination.bandwidth_limit(bytes);
    }
    if let Some(text) = &args.budget {
        let budget: sqlite_outbox::Budget = text
            .parse()
            .map_err(|e: sqlite_outbox::Error| bad_input(format!("--budget: {e}")))?;
        destination = destination.budget(budget.limit_bytes(), budget.period());
    }
    if let Some(priority) = args.budget_exempt_priority {
        if args.budget.is_none() {
            return Err(bad_input(
                "--budget-exempt-priority needs --budget SIZE/PERIOD",
            ));
        }
        let Some(priority) = u8::try_from(priority).ok().filter(|p| *p <= 9) else {
            return Err(bad_input(format!(
                "--budget-exempt-priority {priority} is out of range: 0 to 9"
            )));
        };
        destination = destination.budget_exempt_priority(priority);
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .map_err(|e| failed(format!("cannot install the signal handler: {e:#}")))?;
    let handle = outbox
        .relay(
            RelayConfig::new()
                .destination(destination)
                .workers(args.workers)
                .lease(lease)
                .max_attempts(args.max_attempts),
        )
        .start()?;
    let started = Instant::now();
    let initial = outbox.pending_count(Some(&args.destination))?;
    let progress = (args.until_empty && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(initial.max(0) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} delivered {per_sec}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut code = ExitCode::SUCCESS;
    // Watching the outbox empty or drawing progress needs a look every 100 ms; otherwise
    // this thread only waits for the signal or the timeout, so an idle relay stays asleep.
    let watching = args.until_empty || progress.is_some();
    // Without a terminal (a CI job, a service's log) `--until-empty` says where it stands
    // every few seconds instead of drawing a bar: a run that delivers nothing is not silent.
    let mut next_word = (args.until_empty && progress.is_none()).then(|| started + PROGRESS_EVERY);
    loop {
        let look = match args.timeout {
            _ if watching => Duration::from_millis(100),
            Some(t) => t.saturating_sub(started.elapsed()),
            None => Duration::from_secs(3600),
        };
        if stop_rx.recv_timeout(look).is_ok() {
            let pending = outbox.pending_count(Some(&args.destination))?;
            if pending > 0 {
                eprintln!("stopping with {pending} events still pending…");
                // A run meant to empty the outbox (or bounded by a timeout) that was cut
                // short says so in its exit code, as `--timeout` does.
                if args.until_empty || args.timeout.is_some() {
                    code = ExitCode::from(3);
                }
            } else {
                eprintln!("stopping…");
            }
            break;
        }
        if let Some(bar) = &progress {
            bar.set_position(handle.stats().delivered);
        }
        if next_word.is_some_and(|at| Instant::now() >= at) {
            next_word = Some(Instant::now() + PROGRESS_EVERY);
            let pending = outbox.pending_count(Some(&args.destination))?;
            let stats = handle.stats();
            let trouble = handle
                .trouble()
                .map_or_else(String::new, |trouble| format!("; {trouble}"));
            eprintln!(
                "{pending} pending, {} delivered, {} retried, {} dead after {:.0?}{trouble}",
                stats.delivered,
                stats.retried,
                stats.dead,
                Duration::from_secs(started.elapsed().as_secs())
            );
        }
        if args.until_empty && outbox.pending_count(Some(&args.destination))? == 0 {
            break;
        }
        if args.timeout.is_some_and(|t| started.elapsed() >= t) {
            // Exit 3 says events were left behind: only when some are.
            if outbox.pending_count(Some(&args.destination))? > 0 {
                code = ExitCode::from(3);
                eprintln!("timed out with events still pending");
            }
            break;
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let stats = handle.stats();
    let report = handle.shutdown();
    let unwritten = if report.unrecorded > 0 {
        format!(
            ", {} outcomes not written (those events go out again)",
            report.unrecorded
        )
    } else {
        String::new()
    };
    eprintln!(
        "delivered {}, retried {}, dead {} in {:.1?}; {} left in flight{unwritten}",
        stats.delivered,
        stats.retried,
        stats.dead,
        started.elapsed(),
        report.abandoned
    );
    Ok(code)
}

/// The destination for an http(s) URL, with its secrets and batching.
fn http_destination(args: &RelayArgs, lease: Duration) -> Result<Destination, Failure> {
    let mqtt_only = [
        ("--client-id", args.client_id.is_some()),
        ("--username", args.username.is_some()),
        ("--password-file", args.password_file.is_some()),
        ("--topic", args.topic != "outbox/{type}"),
        ("--mqtt-version", args.mqtt_version.is_some()),
        ("--mqtt-binary", args.mqtt_binary),
    ];
    if let Some((flag, _)) = mqtt_only.iter().find(|(_, given)| *given) {
        return Err(bad_input(format!(
            "{flag} is for mqtt:// URLs; {} is not one",
            args.url
        )));
    }
    // Leave room in the lease for the request to finish.
    let mut http = HttpConfig::new().request_timeout(Duration::from_secs(15).min(lease / 2));
    let (ca, identity) = tls_files(args)?;
    if let Some(pem) = ca {
        http = http.ca_pem(pem);
    }
    if let Some(url) = &args.proxy {
        http = http.proxy(url);
    }
    if args.proxy_from_env {
        http = http.proxy_from_env();
    }
    if let Some((cert, key)) = identity {
        http = http.client_identity_pem(cert, key);
    }
    let mut destination = Destination::http(&args.destination, &args.url).http_config(http);
    if args.no_accounting || args.accounting {
        destination = destination.accounting(args.accounting);
    }
    for s in &args.secret {
        destination = destination.secret(s);
    }
    if let Some(path) = &args.secret_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("--secret-file {}: {e:#}", path.display())))?;
        let secrets: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if secrets.is_empty() {
            return Err(bad_input(format!(
                "--secret-file {} holds no secret",
                path.display()
            )));
        }
        for s in secrets {
            destination = destination.secret(s);
        }
    }
    if let Some(path) = &args.signing_key {
        // Checked here so the message names the file; the relay would refuse it too.
        let (key, _) = crate::keygen::read_key_file(path, "--signing-key")?;
        destination = destination.signing_key(key);
    }
    if let Some(key) = &args.receipt_public_key {
        sqlite_outbox::receive::PublicKey::parse(key)
            .map_err(|e| bad_input(format!("--receipt-public-key: {e:#}")))?;
        destination = destination.receipt_key(key);
    }
    if let Some(n) = args.batch {
        destination = destination.batch(n, 1 << 20);
    }
    Ok(destination)
}

/// Without the `mqtt` feature (a device build that relays over HTTP only).
#[cfg(not(feature = "mqtt"))]
fn mqtt_destination(args: &RelayArgs, _: Duration) -> Result<Destination, Failure> {
    Err(bad_input(format!(
        "{}: this outbox was built without MQTT (the cli's `mqtt` feature)",
        args.url
    )))
}

/// The destination for an mqtt:// URL. Signing secrets are refused: an MQTT message carries
/// no signature header.
#[cfg(feature = "mqtt")]
fn mqtt_destination(args: &RelayArgs, lease: Duration) -> Result<Destination, Failure> {
    if !args.secret.is_empty() || args.secret_file.is_some() || args.signing_key.is_some() {
        return Err(bad_input(
            "--secret, --secret-file and --signing-key sign HTTP requests; with an mqtt:// URL \
             they would sign nothing",
        ));
    }
    if args.receipt_public_key.is_some() {
        return Err(bad_input(
            "--receipt-public-key: receipts are answered by outbox ingest over HTTP; an \
             mqtt:// broker answers none",
        ));
    }
    if args.proxy.is_some() || args.proxy_from_env {
        return Err(bad_input(
            "--proxy and --proxy-from-env are for http:// and https:// URLs",
        ));
    }
    let mut config = MqttConfig::new()
        .topic(&args.topic)
        .ack_timeout(Duration::from_secs(15).min(lease / 2));
    if let Some(id) = &args.client_id {
        config = config.client_id(id);
    }
    match (&args.username, &args.password_file) {
        (Some(user), Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--password-file {}: {e:#}", path.display())))?;
            let password = text.lines().next().unwrap_or("").trim_end();
            config = config.credentials(user, password);
        }
        (Some(user), None) => config = config.credentials(user, ""),
        (None, Some(_)) => {
            return Err(bad_input("--password-file needs --username"));
        }
        (None, None) => {}
    }
    let version = match args.mqtt_version {
        Some(MqttProtocol::V5) => MqttVersion::V5,
        Some(MqttProtocol::V311) | None => MqttVersion::V311,
    };
    if args.mqtt_binary && version != MqttVersion::V5 {
        return Err(bad_input(
            "--mqtt-binary needs --mqtt-version 5 (MQTT 3.1.1 has no properties for the \
             attributes)",
        ));
    }
    config = config.version(version).binary_mode(args.mqtt_binary);
    config = tls_settings(args, config)?;
    let mut destination = Destination::mqtt(&args.destination, &args.url).mqtt_config(config);
    if let Some(n) = args.batch {
        // One message per event; a batch is published back to back (n in flight per worker).
        destination = destination.batch(n, usize::MAX);
    }
    Ok(destination)
}

/// The contents of `--ca` and of `--cert` with `--key`, read once at start; only for a
/// URL that speaks TLS.
type TlsFiles = (Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>);

fn tls_files(args: &RelayArgs) -> Result<TlsFiles, Failure> {
    let given = args.ca.is_some() || args.cert.is_some() || args.key.is_some();
    if given && !(args.url.starts_with("mqtts://") || args.url.starts_with("https://")) {
        return Err(bad_input(format!(
            "--ca, --cert and --key are for TLS; {} is not an https:// or mqtts:// URL",
            args.url
        )));
    }
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| bad_input(format!("{flag} {}: {e:#}", path.display())))
    };
    let ca = match &args.ca {
        Some(path) => Some(read("--ca", path)?),
        None => None,
    };
    let identity = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Some((read("--cert", cert)?, read("--key", key)?)),
        (None, None) => None,
        _ => {
            return Err(bad_input(
                "--cert and --client-key go together (mutual TLS)",
            ))
        }
    };
    Ok((ca, identity))
}

/// `--ca`, `--cert` and `--key` for an mqtts:// broker.
#[cfg(feature = "mqtt")]
fn tls_settings(args: &RelayArgs, mut config: MqttConfig) -> Result<MqttConfig, Failure> {
    let (ca, identity) = tls_files(args)?;
    if let Some(pem) = ca {
        config = config.ca_pem(pem);
    }
    if let Some((cert, key)) = identity {
        config = config.client_identity_pem(cert, key);
    }
    Ok(config)
}

/// `--mqtt-version`, parsed whether or not MQTT is built in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MqttProtocol {
    V311,
    V5,
}

/// `3`, `3.1.1` or `5`.
fn parse_mqtt_version(text: &str) -> Result<MqttProtocol, String> {
    match text {
        "3" | "3.1.1" | "4" => Ok(MqttProtocol::V311),
        "5" => Ok(MqttProtocol::V5),
        other => Err(format!(
            "{other:?} is not an MQTT version: use 3 (3.1.1) or 5"
        )),
    }
}
