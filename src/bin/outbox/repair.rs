//! Commands that change rows or settings: `outbox retry`, `purge-dead`, `prune`, `enable`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use sqlite_outbox::admin::DeadFilter;
use sqlite_outbox::Outbox;

use crate::failure::{failed, Outcome};
use crate::parse_duration;

// Each command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct RetryArgs {
    /// Event ids.
    #[arg(required_unless_present = "all_dead")]
    event_ids: Vec<String>,
    /// Every dead letter (optionally only --type).
    #[arg(long, conflicts_with = "event_ids")]
    all_dead: bool,
    /// With --all-dead: only types matching this pattern (exact, prefix*, *).
    #[arg(long = "type", requires = "all_dead")]
    event_type: Option<String>,
}

#[derive(Args)]
pub struct PurgeDeadArgs {
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,
}

#[derive(Args)]
pub struct PruneArgs {
    #[arg(long, value_parser = parse_duration, default_value = "7d")]
    older_than: Duration,
}

#[derive(Args)]
pub struct EnableArgs {
    destination: String,
}

pub fn retry(outbox: &Outbox, args: RetryArgs) -> Outcome {
    let reset = if args.all_dead {
        outbox.retry_dead(&DeadFilter {
            event_type: args.event_type,
            ..DeadFilter::default()
        })?
    } else {
        let refs: Vec<&str> = args.event_ids.iter().map(String::as_str).collect();
        outbox.retry(&refs)?
    };
    println!("reset {reset} deliveries; they are due now");
    if !args.all_dead && reset == 0 {
        return Err(failed("no pending or dead delivery has those ids"));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn purge_dead(outbox: &Outbox, args: PurgeDeadArgs) -> Outcome {
    let report = outbox.purge_dead(args.older_than)?;
    println!("purged {} dead letters", report.deleted);
    Ok(ExitCode::SUCCESS)
}

pub fn prune(outbox: &Outbox, args: PruneArgs) -> Outcome {
    let spinner = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("pruning");
        bar
    });
    let report = outbox.prune_delivered_with_progress(args.older_than, |n| {
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
        humantime::format_duration(args.older_than),
        report.pages
    );
    Ok(ExitCode::SUCCESS)
}

pub fn enable(outbox: &Outbox, args: EnableArgs) -> Outcome {
    if outbox.enable_destination(&args.destination)? {
        println!("enabled {}", args.destination);
    } else {
        println!("{} was not disabled", args.destination);
    }
    Ok(ExitCode::SUCCESS)
}
