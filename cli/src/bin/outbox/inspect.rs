//! Read-only commands: `outbox stats`, `list`, `show` and `health`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use sqlite_outbox::admin::{HealthThresholds, State};
use sqlite_outbox::Outbox;

use crate::failure::{failed, Outcome};
use crate::output;
use crate::parse_duration;

// Each command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct StatsArgs {
    /// One JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ListArgs {
    #[arg(long, default_value = "pending", value_parser = ["pending", "delivered", "dead", "expired", "exported", "all"])]
    state: String,
    /// The most deliveries listed.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// JSON Lines: one object per delivery.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ShowArgs {
    event_id: String,
    /// JSON Lines: one object per delivery of the event.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct HealthArgs {
    /// One JSON document.
    #[arg(long)]
    json: bool,
    /// Oldest pending event allowed.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    max_pending_age: Duration,
}

pub fn stats(outbox: &Outbox, args: StatsArgs) -> Outcome {
    let s = outbox.stats()?;
    if args.json {
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
        "expired     {:>8}  (not delivered by their deadline)",
        s.expired
    );
    println!(
        "database    {:>8}  (WAL {})",
        output::bytes(s.database_bytes),
        output::bytes(s.wal_bytes)
    );
    println!(
        "disk        {:>8}  free{} (reserve held {}; {} delivered events deleted to make room)",
        s.disk_free_bytes
            .map_or("?".to_owned(), |b| output::bytes(b as i64)),
        if s.disk_full { ", FULL" } else { "" },
        output::bytes(s.disk_reserve_bytes as i64),
        s.pruned_for_room
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
    let budgets: Vec<Vec<String>> = s
        .destinations
        .iter()
        .filter_map(|d| d.budget.as_ref().map(|b| (d, b)))
        .map(|(d, b)| {
            vec![
                d.name.clone(),
                format!(
                    "{} of {}",
                    output::decimal_bytes(b.used_bytes),
                    output::decimal_bytes(b.limit_bytes)
                ),
                output::time(Some(b.period_ends)),
                match (b.holding, b.forecast) {
                    (true, _) => "HOLDING until the period ends".to_string(),
                    (false, Some(at)) => format!("runs out {}", output::time(Some(at))),
                    (false, None) => "lasts the period".to_string(),
                },
            ]
        })
        .collect();
    if !budgets.is_empty() {
        println!();
        output::table(
            &["DESTINATION", "BUDGET USED", "PERIOD ENDS", "AT THIS RATE"],
            &budgets,
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn list(outbox: &Outbox, args: ListArgs) -> Outcome {
    let state: Option<State> = match args.state.as_str() {
        "all" => None,
        s => Some(s.parse()?),
    };
    let records = outbox.list(state, args.limit)?;
    if args.json {
        let mut out = std::io::stdout().lock();
        for r in &records {
            let _ = writeln!(out, "{}", output::record_json(r));
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

pub fn show(outbox: &Outbox, args: ShowArgs) -> Outcome {
    let records = outbox.show(&args.event_id)?;
    if records.is_empty() {
        return Err(failed(format!("no event with id {}", args.event_id)));
    }
    if args.json {
        for r in &records {
            println!("{}", output::record_json(r));
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
        if r.is_parked() {
            println!("next due     after the earlier pending events of its key");
        } else {
            println!("next due     {}", output::time(Some(r.available_at)));
        }
        println!("priority     {}", r.priority);
        println!("delivered    {}", output::time(r.delivered_at));
        println!("dead         {}", output::time(r.dead_at));
        println!("last error   {}", r.last_error.as_deref().unwrap_or("-"));
        println!("data         {}", r.data);
        println!();
    }
    Ok(ExitCode::SUCCESS)
}

pub fn health(outbox: &Outbox, args: HealthArgs) -> Outcome {
    let h = outbox.health(HealthThresholds::default().max_pending_age(args.max_pending_age))?;
    if args.json {
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
