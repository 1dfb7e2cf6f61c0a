//! `outbox fleet`: what the fleet holds of each device's streams, from the ingest's
//! PostgreSQL: stored, accounted, pending on the device, and the numbers missing or reused.
//! Exits 0 when nothing is missing or reused, 1 when a stream is incomplete (for cron jobs
//! and monitoring checks), 2 for bad input.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use outbox_cli::fleet::{self, StreamView};
use sqlite_outbox::wire::Ranges;

use crate::failure::{bad_input, failed, Outcome};

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct FleetArgs {
    /// The ingest's PostgreSQL database (postgresql://user@host/db or "host=… user=…").
    /// Visible to `ps`: prefer OUTBOX_POSTGRES_URL.
    #[arg(
        long,
        visible_alias = "postgres",
        env = "OUTBOX_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pg: String,
    /// Only this device's streams.
    #[arg(long)]
    source: Option<String>,
    /// JSON Lines: one object per stream.
    #[arg(long)]
    json: bool,
    /// How long a device may stay unheard of while numbers it reported pending are not
    /// stored, before its stream counts as incomplete (marked SILENT, exit 1). Keep it above
    /// the devices' accounting interval (2 min by default, at most a day).
    #[arg(long, value_parser = crate::parse_duration, default_value = "1d", value_name = "DURATION")]
    silent_after: Duration,
}

/// How long connecting and each query may take.
const PG_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(args: FleetArgs) -> Outcome {
    let (mut config, tls) = sqlite_outbox::receive::pg_connect_config(&args.pg)
        .map_err(|e| bad_input(format!("--pg: {e:#}")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(PG_TIMEOUT);
    }
    // Ours first: a statement timeout the URL's own options set comes later and wins.
    let options = format!(
        "-c statement_timeout={} {}",
        PG_TIMEOUT.as_millis(),
        config.get_options().unwrap_or("")
    );
    config.options(options.trim_end());
    let mut client = config
        .connect(tls)
        .map_err(|e| failed(format!("cannot reach PostgreSQL: {e:#}")))?;
    let views =
        fleet::read(&mut client, args.source.as_deref(), args.silent_after).map_err(|e| {
            failed(format!(
            "cannot read the fleet's streams (has `outbox ingest` run against this database?): {e:#}"
        ))
        })?;
    if args.json {
        for view in &views {
            println!("{}", serde_json::to_string(view).unwrap_or_default());
        }
    } else {
        print_table(&views);
    }
    Ok(if views.iter().any(StreamView::is_incomplete) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_table(views: &[StreamView]) {
    if views.is_empty() {
        println!("no streams yet");
        return;
    }
    println!(
        "{:<28} {:<12} {:>8} {:>8} {:>8} {:>8} {:>9} {:<20} {:<12} REPORTED",
        "SOURCE",
        "STREAM",
        "HIGH",
        "STORED",
        "THROUGH",
        "PENDING",
        "ACCOUNTED",
        "MISSING",
        "REUSED"
    );
    for v in views {
        // A device's names are its own: escaped, so that they cannot drive the terminal.
        println!(
            "{:<28} {:<12} {:>8} {:>8} {:>8} {:>8} {:>9} {:<20} {:<12} {}{}",
            fleet::printable(&v.source),
            fleet::printable(&v.destination),
            v.high_water,
            v.stored,
            v.stored_through,
            v.pending_on_device,
            v.accounted.total(),
            shown(&v.missing),
            shown(&v.reused),
            v.reported_at.as_deref().unwrap_or("never"),
            if v.silent { " SILENT" } else { "" }
        );
    }
}

/// Ranges as `3-5,9` (the first few, then how many more).
fn shown(ranges: &Ranges) -> String {
    if ranges.is_empty() {
        return "-".into();
    }
    let mut parts: Vec<String> = ranges
        .iter()
        .take(3)
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    if ranges.len() > 3 {
        parts.push(format!("+{} more", ranges.len() - 3));
    }
    parts.join(",")
}
