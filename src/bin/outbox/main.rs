//! `outbox`: inspect, deliver, retry and prune an outbox database from the shell, with or
//! without the app running.

mod output;

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::Value;
use sqlite_outbox::rusqlite::{Connection, OpenFlags};
use sqlite_outbox::{
    DeadFilter, Destination, Enqueued, Error, Event, HealthThresholds, HttpConfig, Outbox,
    RelayConfig, State,
};

/// Inspect and operate a sqlite-outbox database.
#[derive(Parser)]
#[command(name = "outbox", version, about)]
struct Cli {
    /// The database file.
    #[arg(long, env = "OUTBOX_DB", global = true)]
    db: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the database (or bring an existing one's schema up to date).
    Init,
    /// Commit one event, or one per line of JSON from stdin with --jsonl.
    Enqueue {
        /// Event type.
        #[arg(long = "type", required_unless_present = "jsonl")]
        event_type: Option<String>,
        /// Partition key: events with the same key are delivered in commit order.
        #[arg(long)]
        key: Option<String>,
        /// Idempotency key: a repeat returns the first event's id.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Subject.
        #[arg(long)]
        subject: Option<String>,
        /// Event data as JSON.
        #[arg(long, default_value = "{}")]
        data: String,
        /// Read events from stdin, one JSON object per line:
        /// {"type": …, "data": …, "key": …, "idempotency_key": …, "subject": …}.
        #[arg(long, conflicts_with_all = ["event_type", "key", "idempotency_key", "subject"])]
        jsonl: bool,
    },
    /// Deliver pending events to a URL until SIGINT/SIGTERM (or until none is pending).
    Relay {
        /// Where to POST events.
        #[arg(long)]
        url: String,
        /// whsec_… signing secret; repeat for rotation.
        #[arg(long)]
        secret: Vec<String>,
        /// Send batches of up to N events per request.
        #[arg(long)]
        batch: Option<usize>,
        /// Concurrent requests.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// Lease length in seconds.
        #[arg(long, default_value_t = 60)]
        lease_secs: u64,
        /// Answered attempts before an event is dead-lettered.
        #[arg(long, default_value_t = 25)]
        max_attempts: u32,
        /// Exit 0 once nothing is pending for the destination.
        #[arg(long)]
        until_empty: bool,
        /// The destination whose events to deliver.
        #[arg(long, default_value = "default")]
        destination: String,
        /// Give up after this long (e.g. 30s, 5m): exit 3 if events are still pending.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Counts by state and destination, ages, sizes.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// List deliveries.
    List {
        #[arg(long, default_value = "pending", value_parser = ["pending", "delivered", "dead", "all"])]
        state: String,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Show one event (one delivery per destination).
    Show {
        event_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Make events due now with a fresh attempt budget.
    Retry {
        /// Event ids.
        #[arg(required_unless_present = "all_dead")]
        event_ids: Vec<String>,
        /// Every dead letter (optionally only --type).
        #[arg(long, conflicts_with = "event_ids")]
        all_dead: bool,
        /// With --all-dead: only types matching this pattern (exact, prefix*, *).
        #[arg(long = "type", requires = "all_dead")]
        event_type: Option<String>,
    },
    /// Delete dead letters (all, or dead for longer than --older-than).
    PurgeDead {
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
    },
    /// Delete delivered events older than --older-than (default 7d), in small pages.
    Prune {
        #[arg(long, value_parser = parse_duration, default_value = "7d")]
        older_than: Duration,
    },
    /// Exit 0 if ok, 1 if degraded (dead letters, old pending events, disabled destination).
    Health {
        #[arg(long)]
        json: bool,
        /// Oldest pending event allowed.
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        max_pending_age: Duration,
    },
    /// Re-enable a destination disabled by a 410 or an operator.
    Enable { destination: String },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 30s, 15m, 7d: {e}"))
}

/// A failure and its exit code: 2 for bad input, 1 otherwise.
struct Failure {
    code: u8,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::PayloadTooLarge { .. }
            | Error::InvalidEventType { .. }
            | Error::FieldTooLong { .. }
            | Error::InvalidData(_)
            | Error::InvalidConfig(_)
            | Error::NoRoute { .. }
            | Error::NotADatabase { .. }
            | Error::SchemaTooNew { .. } => 2,
            _ => 1,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn bad_input(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

type Outcome = Result<ExitCode, Failure>;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(cli: Cli) -> Outcome {
    let Some(db) = cli.db else {
        return Err(bad_input("--db PATH (or OUTBOX_DB) is required"));
    };
    if let Command::Init = cli.command {
        let outbox = Outbox::open(&db)?;
        println!(
            "initialized {} (schema version {})",
            outbox.path().display(),
            sqlite_outbox::schema_version()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let outbox = open_existing(&db)?;
    match cli.command {
        Command::Init => unreachable!("handled above"),
        Command::Enqueue {
            event_type,
            key,
            idempotency_key,
            subject,
            data,
            jsonl,
        } => {
            if jsonl {
                enqueue_jsonl(&outbox)
            } else {
                let data: Value = serde_json::from_str(&data)
                    .map_err(|e| bad_input(format!("--data is not valid JSON: {e}")))?;
                let fields = EventFields {
                    event_type: event_type.unwrap_or_default(),
                    data,
                    key,
                    idempotency_key,
                    subject,
                };
                let enqueued = enqueue_one(&outbox, fields)?;
                println!("{}", enqueued.event_id());
                Ok(ExitCode::SUCCESS)
            }
        }
        Command::Relay {
            url,
            secret,
            batch,
            workers,
            lease_secs,
            max_attempts,
            until_empty,
            destination,
            timeout,
        } => relay(
            &outbox,
            RelayArgs {
                url,
                secrets: secret,
                batch,
                workers,
                lease: Duration::from_secs(lease_secs),
                max_attempts,
                until_empty,
                destination,
                timeout,
            },
        ),
        Command::Stats { json } => stats(&outbox, json),
        Command::List { state, limit, json } => list(&outbox, &state, limit, json),
        Command::Show { event_id, json } => show(&outbox, &event_id, json),
        Command::Retry {
            event_ids,
            all_dead,
            event_type,
        } => retry(&outbox, &event_ids, all_dead, event_type),
        Command::PurgeDead { older_than } => {
            let report = outbox.purge_dead(older_than)?;
            println!("purged {} dead letters", report.deleted);
            Ok(ExitCode::SUCCESS)
        }
        Command::Prune { older_than } => prune(&outbox, older_than),
        Command::Health {
            json,
            max_pending_age,
        } => health(&outbox, json, max_pending_age),
        Command::Enable { destination } => {
            if outbox.enable_destination(&destination)? {
                println!("enabled {destination}");
            } else {
                println!("{destination} was not disabled");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Opens a database that must already exist and hold an outbox, without creating anything.
fn open_existing(db: &Path) -> Result<Outbox, Failure> {
    if !db.exists() {
        return Err(bad_input(format!(
            "{} does not exist (create it with: outbox --db {} init)",
            db.display(),
            db.display()
        )));
    }
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| bad_input(format!("cannot open {}: {e}", db.display())))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|_| bad_input(format!("{} is not a SQLite database", db.display())))?;
    let has_table: bool = conn
        .query_row(
            "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'outbox_events'",
            [],
            |r| r.get(0),
        )
        .unwrap_or(false);
    drop(conn);
    if version < 1 || !has_table {
        return Err(bad_input(format!(
            "{} is not an outbox database (create one with: outbox --db PATH init)",
            db.display()
        )));
    }
    Ok(Outbox::open(db)?)
}

struct EventFields {
    event_type: String,
    data: Value,
    key: Option<String>,
    idempotency_key: Option<String>,
    subject: Option<String>,
}

fn enqueue_one(outbox: &Outbox, f: EventFields) -> Result<Enqueued, Failure> {
    let mut event = Event::new(f.event_type, f.data);
    if let Some(k) = f.key {
        event = event.partition_key(k);
    }
    if let Some(k) = f.idempotency_key {
        event = event.idempotency_key(k);
    }
    if let Some(s) = f.subject {
        event = event.subject(s);
    }
    let enqueued = outbox.transaction(|tx| outbox.enqueue(tx, event))?;
    if let Enqueued::Duplicate { existing_event_id } = &enqueued {
        eprintln!("duplicate idempotency key: existing event {existing_event_id}");
    }
    Ok(enqueued)
}

fn optional_string(v: &Value, field: &str, line: usize) -> Result<Option<String>, Failure> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad_input(format!("line {line}: {field} must be a string"))),
    }
}

/// Commits one event per stdin line, each in its own transaction, printing each id as soon
/// as it is committed. Stops at the first bad line (exit 2); earlier lines stay committed.
fn enqueue_jsonl(outbox: &Outbox) -> Outcome {
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for (n, line) in stdin.split(b'\n').enumerate() {
        let line_no = n + 1;
        let bytes = line.map_err(|e| Failure {
            code: 1,
            message: format!("reading stdin: {e}"),
        })?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| bad_input(format!("line {line_no}: not valid UTF-8")))?;
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| bad_input(format!("line {line_no}: not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(bad_input(format!("line {line_no}: expected a JSON object")));
        }
        let Some(event_type) = optional_string(&v, "type", line_no)? else {
            return Err(bad_input(format!("line {line_no}: \"type\" is required")));
        };
        let fields = EventFields {
            event_type,
            data: v.get("data").cloned().unwrap_or(Value::Null),
            key: optional_string(&v, "key", line_no)?,
            idempotency_key: optional_string(&v, "idempotency_key", line_no)?,
            subject: optional_string(&v, "subject", line_no)?,
        };
        let enqueued = enqueue_one(outbox, fields).map_err(|f| Failure {
            code: f.code,
            message: format!("line {line_no}: {}", f.message),
        })?;
        writeln!(stdout, "{}", enqueued.event_id())
            .and_then(|_| stdout.flush())
            .map_err(|e| Failure {
                code: 1,
                message: format!("writing stdout: {e}"),
            })?;
    }
    Ok(ExitCode::SUCCESS)
}

struct RelayArgs {
    url: String,
    secrets: Vec<String>,
    batch: Option<usize>,
    workers: usize,
    lease: Duration,
    max_attempts: u32,
    until_empty: bool,
    destination: String,
    timeout: Option<Duration>,
}

fn relay(outbox: &Outbox, args: RelayArgs) -> Outcome {
    let mut destination = Destination::http(&args.destination, &args.url).http_config(HttpConfig {
        // Leave room in the lease for the request to finish.
        request_timeout: Duration::from_secs(15).min(args.lease / 2),
        ..HttpConfig::default()
    });
    for s in &args.secrets {
        destination = destination.secret(s)?;
    }
    if let Some(n) = args.batch {
        destination = destination.batch(n, 1 << 20);
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .map_err(|e| Failure {
        code: 1,
        message: format!("cannot install the signal handler: {e}"),
    })?;
    let handle = outbox
        .relay(
            RelayConfig::new()
                .destination(destination)
                .workers(args.workers)
                .lease(args.lease)
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
    loop {
        if stop_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            eprintln!("stopping…");
            break;
        }
        if let Some(bar) = &progress {
            bar.set_position(handle.stats().delivered);
        }
        if args.until_empty && outbox.pending_count(Some(&args.destination))? == 0 {
            break;
        }
        if args.timeout.is_some_and(|t| started.elapsed() >= t) {
            code = ExitCode::from(3);
            eprintln!("timed out with events still pending");
            break;
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let stats = handle.stats();
    let report = handle.shutdown();
    eprintln!(
        "delivered {}, retried {}, dead {} in {:.1?}; {} left in flight",
        stats.delivered,
        stats.retried,
        stats.dead,
        started.elapsed(),
        report.abandoned
    );
    Ok(code)
}

fn stats(outbox: &Outbox, json: bool) -> Outcome {
    let s = outbox.stats()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "pending     {:>8}  (in flight {}, {}, oldest {})",
        s.pending,
        s.in_flight,
        output::bytes(s.pending_bytes),
        output::age(s.oldest_pending_age_ms)
    );
    println!("delivered   {:>8}", s.delivered);
    println!("dead        {:>8}", s.dead);
    println!("dropped     {:>8}  (by a DropOldest policy)", s.dropped);
    println!("coalesced   {:>8}", s.coalesced);
    println!(
        "database    {:>8}  (WAL {})",
        output::bytes(s.database_bytes),
        output::bytes(s.wal_bytes)
    );
    let histogram: Vec<String> = s
        .attempts_histogram
        .iter()
        .map(|(a, n)| format!("{a}:{n}"))
        .collect();
    if histogram.is_empty() {
        println!("attempts           -");
    } else {
        println!(
            "attempts    {}  (attempts:count, undelivered)",
            histogram.join(" ")
        );
    }
    println!();
    let rows: Vec<Vec<String>> = s
        .destinations
        .iter()
        .map(|d| {
            vec![
                d.name.clone(),
                d.pending.to_string(),
                d.delivered.to_string(),
                d.dead.to_string(),
                output::age(d.oldest_pending_age_ms),
                d.disabled.as_ref().map_or("enabled".into(), |r| {
                    format!("DISABLED: {}", output::clip(r, 40))
                }),
            ]
        })
        .collect();
    output::table(
        &[
            "DESTINATION",
            "PENDING",
            "DELIVERED",
            "DEAD",
            "OLDEST",
            "STATUS",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

fn list(outbox: &Outbox, state: &str, limit: usize, json: bool) -> Outcome {
    let state: Option<State> = match state {
        "all" => None,
        s => Some(s.parse()?),
    };
    let records = outbox.list(state, limit)?;
    if json {
        let mut out = std::io::stdout().lock();
        for r in &records {
            let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.event_id.clone(),
                output::clip(&r.event_type, 30),
                output::clip(r.key.as_deref().unwrap_or("-"), 20),
                r.destination.clone(),
                format!("{:?}", r.state).to_lowercase(),
                r.attempts.to_string(),
                output::clip(r.last_error.as_deref().unwrap_or("-"), 50),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "EVENT_ID",
            "TYPE",
            "KEY",
            "DESTINATION",
            "STATE",
            "ATTEMPTS",
            "LAST_ERROR",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

fn show(outbox: &Outbox, event_id: &str, json: bool) -> Outcome {
    let records = outbox.show(event_id)?;
    if records.is_empty() {
        return Err(Failure {
            code: 1,
            message: format!("no event with id {event_id}"),
        });
    }
    if json {
        for r in &records {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        return Ok(ExitCode::SUCCESS);
    }
    for r in &records {
        println!("event        {}", r.event_id);
        println!("type         {}", r.event_type);
        println!("destination  {}", r.destination);
        println!("state        {:?}", r.state);
        println!("attempts     {}", r.attempts);
        println!("key          {}", r.key.as_deref().unwrap_or("-"));
        println!("subject      {}", r.subject.as_deref().unwrap_or("-"));
        println!("committed    {}", output::time(Some(r.created_at)));
        if r.available_at == sqlite_outbox::PARKED {
            println!("next due     after the earlier pending events of its key");
        } else {
            println!("next due     {}", output::time(Some(r.available_at)));
        }
        println!("delivered    {}", output::time(r.delivered_at));
        println!("dead         {}", output::time(r.dead_at));
        println!("last error   {}", r.last_error.as_deref().unwrap_or("-"));
        println!("data         {}", r.data);
        println!();
    }
    Ok(ExitCode::SUCCESS)
}

fn retry(outbox: &Outbox, ids: &[String], all_dead: bool, event_type: Option<String>) -> Outcome {
    let reset = if all_dead {
        outbox.retry_dead(&DeadFilter {
            event_type,
            ..DeadFilter::default()
        })?
    } else {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        outbox.retry(&refs)?
    };
    println!("reset {reset} deliveries; they are due now");
    if !all_dead && reset == 0 {
        return Err(Failure {
            code: 1,
            message: "no pending or dead delivery has those ids".into(),
        });
    }
    Ok(ExitCode::SUCCESS)
}

fn prune(outbox: &Outbox, older_than: Duration) -> Outcome {
    let spinner = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("pruning");
        bar
    });
    let report = outbox.prune_delivered_with_progress(older_than, |n| {
        if let Some(bar) = &spinner {
            bar.set_message(format!("pruned {n}"));
            bar.tick();
        }
    })?;
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    println!(
        "pruned {} delivered events older than {} in {} transactions",
        report.deleted,
        humantime::format_duration(older_than),
        report.pages
    );
    Ok(ExitCode::SUCCESS)
}

fn health(outbox: &Outbox, json: bool, max_pending_age: Duration) -> Outcome {
    let h = outbox.health(HealthThresholds { max_pending_age })?;
    if json {
        println!("{}", serde_json::to_string(&h).unwrap_or_default());
    } else if h.ok {
        println!("ok");
    } else {
        println!("degraded");
        for r in &h.reasons {
            println!("  - {r}");
        }
    }
    Ok(if h.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
