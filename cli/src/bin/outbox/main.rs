//! `outbox`: inspect, deliver, retry and prune an outbox database from the shell, with or
//! without the app running.
//!
//! One file per command group: `enqueue.rs`, `config.rs`, `relay.rs`, `inspect.rs` (stats, list, show,
//! health), `repair.rs` (retry, purge-dead, prune, enable), `ingest.rs` (the receiving
//! end, in PostgreSQL) and `keygen.rs` (a device's signing key); `failure.rs` maps errors to exit codes and `output.rs` formats tables.

mod bundle;
mod closed_pipe;
mod config;
mod enqueue;
mod failure;
#[cfg(feature = "ingest")]
mod fleet;
#[cfg(feature = "ingest")]
mod ingest;
mod inspect;
mod keygen;
mod output;
mod relay;
mod repair;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use sqlite_outbox::{Error, Outbox, OutboxBuilder, Synchronous};

use failure::{bad_input, Failure, Outcome};

/// Inspect and operate a sqlite-outbox database.
#[derive(Parser)]
#[command(name = "outbox", version, about)]
struct Cli {
    /// The database file.
    #[arg(long, env = "OUTBOX_DB", global = true)]
    db: Option<PathBuf>,
    /// Durability of this command's commits on power loss (the app's own setting).
    ///
    /// How hard SQLite works to keep this command's commits on power loss: `normal` (the
    /// default) or `full`; give the app's own setting. A relay never sends an event before
    /// its commit is on disk, whichever is chosen.
    #[arg(
        long,
        env = "OUTBOX_SYNCHRONOUS",
        global = true,
        value_enum,
        ignore_case = true,
        default_value = "normal"
    )]
    synchronous: SynchronousArg,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest variant (the relay's flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Create the database (or bring an existing one's schema up to date).
    Init,
    /// Bring an existing database's schema up to date (the only command besides `init` that
    /// changes it: an app on an older release then refuses the file).
    Migrate,
    /// Commit one event, or one per line of JSON from stdin with --jsonl.
    Enqueue(enqueue::EnqueueArgs),
    /// Show or change the settings every writer of the file follows (routes, limits, …).
    Config(config::ConfigArgs),
    /// Deliver pending events to a URL until SIGINT/SIGTERM (or until none is pending).
    Relay(relay::RelayArgs),
    /// Receive signed events from devices and store each once in PostgreSQL (no --db).
    #[cfg(feature = "ingest")]
    Ingest(ingest::IngestArgs),
    /// Counts by state and destination, ages, sizes.
    Stats(inspect::StatsArgs),
    /// List deliveries.
    List(inspect::ListArgs),
    /// Show one event (one delivery per destination).
    Show(inspect::ShowArgs),
    /// Make events due now with a fresh attempt budget.
    Retry(repair::RetryArgs),
    /// Delete dead letters (all, or dead for longer than --older-than).
    PurgeDead(repair::PurgeDeadArgs),
    /// Delete delivered events older than --older-than (default 7d), in small pages.
    Prune(repair::PruneArgs),
    /// Exit 0 if ok, 1 if degraded (dead letters, old pending events, disabled destination).
    Health(inspect::HealthArgs),
    /// Re-enable a destination disabled by a 410 or an operator.
    Enable(repair::EnableArgs),
    /// Stop deliveries to a destination until `enable`; its events stay pending.
    Disable(repair::DisableArgs),
    /// Send delivered events again to a destination, with their original ids.
    Redeliver(repair::RedeliverArgs),
    /// Write pending events to a signed bundle file, for a site with no uplink.
    Export(bundle::ExportArgs),
    /// Verify a bundle file and deliver its events to a URL (no --db).
    Import(bundle::ImportArgs),
    /// What the fleet holds of each device's streams, from the ingest's PostgreSQL (no
    /// --db): exit 0 if nothing is missing or reused, 1 if a stream is incomplete.
    #[cfg(feature = "ingest")]
    Fleet(fleet::FleetArgs),
    /// Make a device's Ed25519 signing key: the private key to --out (mode 0600), the
    /// public key (whpk_…) printed for the ingest's key registry (no --db).
    Keygen(keygen::KeygenArgs),
}

/// The `--synchronous` values.
#[derive(Clone, Copy, ValueEnum)]
enum SynchronousArg {
    Normal,
    Full,
}

impl From<SynchronousArg> for Synchronous {
    fn from(arg: SynchronousArg) -> Synchronous {
        match arg {
            SynchronousArg::Normal => Synchronous::Normal,
            SynchronousArg::Full => Synchronous::Full,
        }
    }
}

/// Parses durations like `30s`, `15m`, `7d` for any flag that takes one.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 30s, 15m, 7d: {e:#}"))
}

fn main() -> ExitCode {
    closed_pipe::end_quietly_on_closed_pipe();
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
    let command = match cli.command {
        #[cfg(feature = "ingest")]
        Command::Ingest(args) => return ingest::run(args),
        Command::Import(args) => return bundle::run_import(args),
        Command::Keygen(args) => return keygen::run(args),
        #[cfg(feature = "ingest")]
        Command::Fleet(args) => return fleet::run(args),
        other => other,
    };
    let Some(db) = cli.db else {
        return Err(bad_input("--db PATH (or OUTBOX_DB) is required"));
    };
    let builder = Outbox::builder().synchronous(cli.synchronous.into());
    if let Command::Migrate = command {
        return migrate(builder, &db);
    }
    if let Command::Init = command {
        if let Some(folder) = db.parent().filter(|f| !f.as_os_str().is_empty()) {
            if !folder.is_dir() {
                return Err(bad_input(format!(
                    "{}: the folder {} does not exist (create it first)",
                    db.display(),
                    folder.display()
                )));
            }
        }
        let _outbox = builder.open(&db)?;
        println!(
            "initialized {} (schema version {})",
            db.display(),
            sqlite_outbox::admin::schema_version()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Read commands open the file read-only: they never migrate it, create no file and
    // change no byte. The others change what they are for, never the schema.
    let only_reads = match &command {
        Command::Stats(_) | Command::List(_) | Command::Show(_) | Command::Health(_) => true,
        Command::Config(args) => args.only_reads(),
        _ => false,
    };
    let outbox = if only_reads {
        open_read_only(builder, &db)?
    } else {
        let _ = open_read_only(Outbox::builder(), &db)?;
        open_existing(builder, &db)?
    };
    match command {
        Command::Init | Command::Migrate | Command::Import(_) | Command::Keygen(_) => {
            unreachable!("handled above")
        }
        #[cfg(feature = "ingest")]
        Command::Ingest(_) | Command::Fleet(_) => unreachable!("handled above"),
        Command::Enqueue(args) => enqueue::run(&outbox, args),
        Command::Config(args) => config::run(&outbox, args),
        Command::Relay(args) => relay::run(&outbox, args),
        Command::Stats(args) => inspect::stats(&outbox, args),
        Command::List(args) => inspect::list(&outbox, args),
        Command::Show(args) => inspect::show(&outbox, args),
        Command::Health(args) => inspect::health(&outbox, args),
        Command::Retry(args) => repair::retry(&outbox, args),
        Command::PurgeDead(args) => repair::purge_dead(&outbox, args),
        Command::Prune(args) => repair::prune(&outbox, args),
        Command::Enable(args) => repair::enable(&outbox, args),
        Command::Disable(args) => repair::disable(&outbox, args),
        Command::Redeliver(args) => repair::redeliver(&outbox, args),
        Command::Export(args) => bundle::export(&outbox, args),
    }
}

/// `outbox migrate`: brings the file's schema up to date.
fn migrate(builder: OutboxBuilder, db: &std::path::Path) -> Outcome {
    let current = sqlite_outbox::admin::schema_version();
    match Outbox::builder().open_read_only(db) {
        Ok(_) => println!("{} is at schema version {current} already", db.display()),
        Err(Error::SchemaOutdated { found, .. }) => {
            let outbox = open_existing(builder, db)?;
            println!(
                "migrated {} from schema version {found} to {current}",
                outbox.path().display()
            );
        }
        Err(other) => return Err(open_failure(db, other)),
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens a database read-only: exit 2 naming the command that migrates a file at an older
/// schema version.
fn open_read_only(builder: OutboxBuilder, db: &std::path::Path) -> Result<Outbox, Failure> {
    builder.open_read_only(db).map_err(|e| match e {
        Error::SchemaOutdated { found, current } => bad_input(format!(
            "{} is at schema version {found} and this outbox reads version {current}; bring \
             it up to date with: outbox --db {} migrate (an app on the older release then \
             refuses the file)",
            db.display(),
            db.display()
        )),
        other => open_failure(db, other),
    })
}

/// Opens a database that must already exist and hold an outbox, without creating anything.
fn open_existing(builder: OutboxBuilder, db: &std::path::Path) -> Result<Outbox, Failure> {
    builder.open_existing(db).map_err(|e| open_failure(db, e))
}

/// What a failed open of `db` says, and its exit code.
fn open_failure(db: &std::path::Path, e: Error) -> Failure {
    match e {
        Error::NotFound { .. } => bad_input(format!(
            "{} does not exist (create it with: outbox --db {} init)",
            db.display(),
            db.display()
        )),
        Error::NotAnOutbox { .. } => bad_input(format!(
            "{} is not an outbox database (create one with: outbox --db PATH init)",
            db.display()
        )),
        Error::Sqlite(e) => bad_input(format!("cannot open {}: {e:#}", db.display())),
        other => Failure::from(other),
    }
}
