//! `outbox config show | set KEY VALUE | unset KEY`: the settings every writer of the file
//! follows (routes, storage limits and policies, the default source, priorities, lifetimes,
//! the payload limit), kept in the file's `outbox_settings` table.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use sqlite_outbox::Outbox;

use crate::failure::Outcome;

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print every stored setting, one `key = value` per line (`--json`: one JSON object).
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Check and store one setting. Keys: default_source, payload_limit, max_pending,
    /// max_pending_bytes, route:PATTERN (destinations, comma-separated),
    /// policy:PATTERN (drop_oldest or reject), priority:PATTERN (0 to 9),
    /// expiry:PATTERN (a lifetime: 10m, 1h, or milliseconds).
    Set { key: String, value: String },
    /// Remove one setting (it takes its default again).
    Unset { key: String },
}

impl ConfigArgs {
    /// Whether the command only reads the file (`show`).
    pub fn only_reads(&self) -> bool {
        matches!(self.action, ConfigAction::Show { .. })
    }
}

pub fn run(outbox: &Outbox, args: ConfigArgs) -> Outcome {
    match args.action {
        ConfigAction::Show { json } => {
            let settings = outbox.settings()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&settings).unwrap_or_default()
                );
            } else if settings.is_empty() {
                println!("no settings stored: every writer uses the defaults");
            } else {
                for (key, value) in settings {
                    println!("{key} = {value}");
                }
            }
        }
        ConfigAction::Set { key, value } => {
            let stored = outbox.set_setting(&key, &value)?;
            println!("{key} = {stored}");
        }
        ConfigAction::Unset { key } => {
            if outbox.unset_setting(&key)? {
                println!("{key} removed");
            } else {
                println!("{key} was not set");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
