//! `outbox export` and `outbox import`: the offline bundle, for a site with no uplink.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sqlite_outbox::bundle::{import, BundleKey, ImportOptions};
use sqlite_outbox::receive::{Secret, SigningKey};
use sqlite_outbox::Outbox;

use crate::failure::{bad_input, Failure, Outcome};

/// What the bundle is signed with: a device's key (--signing-key), or a shared secret
/// (--secret, --secret-file or OUTBOX_SECRET).
#[derive(Args)]
pub struct SecretArgs {
    /// A file holding the device's whsk_… key (from `outbox keygen`): the bundle is signed
    /// and imported as the device's own, for an ingest with per-device keys.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["secret", "secret_file"])]
    signing_key: Option<PathBuf>,
    /// whsec_… secret the bundle is signed with. Visible to `ps`: prefer --secret-file or
    /// OUTBOX_SECRET.
    #[arg(long, env = "OUTBOX_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// A file whose first line is the secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

impl SecretArgs {
    fn key(&self) -> Result<BundleKey, Failure> {
        if let Some(path) = &self.signing_key {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--signing-key {}: {e:#}", path.display())))?;
            let key = SigningKey::parse(text.lines().next().unwrap_or("").trim())
                .map_err(|e| bad_input(format!("--signing-key {}: {e:#}", path.display())))?;
            return Ok(BundleKey::from(&key));
        }
        let text = match (&self.secret, &self.secret_file) {
            (Some(s), _) => s.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--secret-file {}: {e:#}", path.display())))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
            (None, None) => {
                return Err(bad_input(
                    "--signing-key, --secret, --secret-file or OUTBOX_SECRET is required: \
                     bundles are signed",
                ))
            }
        };
        Secret::parse(&text)
            .map(|secret| BundleKey::from(&secret))
            .map_err(|e| bad_input(format!("the secret: {e:#}")))
    }
}

#[derive(Args)]
pub struct ExportArgs {
    /// The bundle file to write (never overwritten).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    secret: SecretArgs,
    /// The destination whose pending events to export.
    #[arg(long, default_value = "default")]
    destination: String,
    /// At most this many events, the oldest first.
    #[arg(long, default_value_t = 100_000)]
    limit: usize,
}

#[derive(Args)]
pub struct ImportArgs {
    /// The bundle file.
    file: PathBuf,
    #[command(flatten)]
    secret: SecretArgs,
    /// Where to POST the events.
    #[arg(long)]
    url: String,
    /// Attempts per event before giving up (exit 1).
    #[arg(long, default_value_t = 25)]
    max_attempts: u32,
}

pub fn export(outbox: &Outbox, args: ExportArgs) -> Outcome {
    let key = args.secret.key()?;
    if args.limit == 0 {
        return Err(bad_input("--limit 0 would export nothing: at least 1"));
    }
    let report = outbox.export(&args.out, key, &args.destination, args.limit)?;
    println!(
        "exported {} events to {} (sha256 {})",
        report.count,
        report.path.display(),
        report.sha256
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run_import(args: ImportArgs) -> Outcome {
    let key = args.secret.key()?;
    if !(args.url.starts_with("http://") || args.url.starts_with("https://")) {
        return Err(bad_input(format!(
            "--url {}: must be http:// or https://",
            args.url
        )));
    }
    if !args.file.is_file() {
        return Err(bad_input(format!(
            "{}: no such bundle file",
            args.file.display()
        )));
    }
    let options = ImportOptions::default().max_attempts(args.max_attempts.max(1));
    let report = import(&args.file, key, &args.url, &options)?;
    println!(
        "delivered {} events, {} given up",
        report.delivered,
        report.failed.len()
    );
    for (id, error) in &report.failed {
        eprintln!("event {id}: {error:#}");
    }
    Ok(if report.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
