//! Commands that change rows or settings: `outbox retry`, `purge-dead`, `prune`, `enable`,
//! `redeliver`.

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
        let mut filter = DeadFilter::all();
        filter.event_type = args.event_type;
        outbox.retry_dead(&filter)?
    } else {
        let refs: Vec<&str> = args.event_ids.iter().map(String::as_str).collect();
        outbox.retry(&refs)?
    };
    if !args.all_dead && reset == 0 {
        return Err(failed(
            "no pending or dead delivery has those ids; nothing was reset",
        ));
    }
    println!("reset {reset} deliveries; they are due now");
    Ok(ExitCode::SUCCESS)
}

pub fn purge_dead(outbox: &Outbox, args: PurgeDeadArgs) -> Outcome {
    let report = outbox.purge_dead(args.older_than)?;
    println!("purged {} dead letters", report.deleted);
    Ok(ExitCode::SUCCESS)
}

pub fn prune(outbox: &Outbox, args: PruneArgs) -> Outcome {
    let spinner = Spinner::new("pruning");
    let report = outbox
        .prune_delivered_with_progress(args.older_than, |n| spinner.say(format!("pruned {n}")))?;
    spinner.finish();
    println!(
        "pruned {} delivered events older than {} in {} transactions",
        report.deleted,
        humantime::format_duration(args.older_than),
        report.pages
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct DisableArgs {
    destination: String,
    /// Why, as `stats` and `health` will show it.
    #[arg(long, default_value = "disabled by an operator")]
    reason: String,
}

pub fn disable(outbox: &Outbox, args: DisableArgs) -> Outcome {
    outbox.disable_destination(&args.destination, &args.reason)?;
    println!(
        "disabled {}; its events wait until: outbox enable {}",
        args.destination, args.destination
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

#[derive(Args)]
pub struct RedeliverArgs {
    /// The destination to send the events to again.
    #[arg(long)]
    destination: String,
    /// Only these types: an exact type, prefix.* or *.
    #[arg(long = "type")]
    pattern: Option<String>,
    /// Only events delivered at or after TIME: RFC 3339 (2026-11-30T08:00:00Z) or a
    /// duration meaning that long ago (2h, 7d).
    #[arg(long, value_parser = parse_time)]
    since: Option<std::time::SystemTime>,
    /// Only events delivered at or before TIME (same forms).
    #[arg(long, value_parser = parse_time)]
    until: Option<std::time::SystemTime>,
}

/// RFC 3339, or a duration meaning that long before now.
fn parse_time(text: &str) -> Result<std::time::SystemTime, String> {
    if let Ok(t) = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
    {
        let nanos = t.unix_timestamp_nanos();
        let since_epoch =
            std::time::Duration::from_nanos(nanos.unsigned_abs().min(u64::MAX as u128) as u64);
        return Ok(if nanos >= 0 {
            std::time::UNIX_EPOCH + since_epoch
        } else {
            std::time::UNIX_EPOCH - since_epoch
        });
    }
    let ago = crate::parse_duration(text).map_err(|_| {
        format!(
            "{text:?} is neither an RFC 3339 time (2026-11-30T08:00:00Z) nor a duration (2h, 7d)"
        )
    })?;
    std::time::SystemTime::now()
        .checked_sub(ago)
        .ok_or_else(|| format!("{text} ago is before the clock's range"))
}

pub fn redeliver(outbox: &Outbox, args: RedeliverArgs) -> Outcome {
    let mut redelivery = sqlite_outbox::Redelivery::to(&args.destination);
    if let Some(pattern) = &args.pattern {
        redelivery = redelivery.types(pattern);
    }
    if let Some(since) = args.since {
        redelivery = redelivery.delivered_since(since);
    }
    if let Some(until) = args.until {
        redelivery = redelivery.delivered_until(until);
    }
    let spinner = Spinner::new("redelivering");
    let count = outbox
        .redeliver_with_progress(&redelivery, |n| spinner.say(format!("queued {n} again")))?;
    spinner.finish();
    println!(
        "queued {count} delivered events again for destination {}",
        args.destination
    );
    Ok(ExitCode::SUCCESS)
}

/// A progress line on a terminal (stderr), nothing otherwise: for the commands that work
/// through history in pages.
struct Spinner(Option<indicatif::ProgressBar>);

impl Spinner {
    fn new(message: &'static str) -> Spinner {
        Spinner(std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message(message);
            bar
        }))
    }

    fn say(&self, message: String) {
        if let Some(bar) = &self.0 {
            bar.set_message(message);
            bar.tick();
        }
    }

    fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}
