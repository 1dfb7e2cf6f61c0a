//! `outbox relay`: deliver pending events to a URL until a signal, an empty outbox, or a
//! timeout.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Outbox, RelayConfig};

use crate::failure::{bad_input, failed, Outcome};
use crate::parse_duration;

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct RelayArgs {
    /// Where to POST events.
    #[arg(long)]
    url: String,
    /// whsec_… signing secret; repeat for rotation. Visible to `ps`: prefer --secret-file or
    /// OUTBOX_SECRET.
    #[arg(long, env = "OUTBOX_SECRET", hide_env_values = true)]
    secret: Vec<String>,
    /// A file of whsec_… secrets, one per line (read once at start).
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
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
}

pub fn run(outbox: &Outbox, args: RelayArgs) -> Outcome {
    let lease = Duration::from_secs(args.lease_secs);
    // Leave room in the lease for the request to finish.
    let http = HttpConfig::new().request_timeout(Duration::from_secs(15).min(lease / 2));
    let mut destination = Destination::http(&args.destination, &args.url).http_config(http);
    for s in &args.secret {
        destination = destination.secret(s);
    }
    if let Some(path) = &args.secret_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("--secret-file {}: {e}", path.display())))?;
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
    if let Some(n) = args.batch {
        destination = destination.batch(n, 1 << 20);
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .map_err(|e| failed(format!("cannot install the signal handler: {e}")))?;
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
