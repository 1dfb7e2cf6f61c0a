//! `outbox keygen`: a new Ed25519 key for one device. The private key (`whsk_…`) goes to a
//! file only its owner can read, for `outbox relay --signing-key`; the public key
//! (`whpk_…`) is printed, for the fleet's key registry (`outbox ingest --keys` or the table
//! `outbox_device_keys`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sqlite_outbox::receive::SigningKey;

use crate::failure::{bad_input, failed, Failure, Outcome};

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct KeygenArgs {
    /// Where to write the private key (created with mode 0600; an existing file is never
    /// overwritten).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: KeygenArgs) -> Outcome {
    let (key, text) =
        SigningKey::generate().map_err(|e| failed(format!("no random source: {e:#}")))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&args.out).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
            "the file exists; keygen never overwrites a key".to_string()
        } else {
            e.to_string()
        };
        bad_input(format!("--out {}: {why}", args.out.display()))
    })?;
    file.write_all(format!("{text}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| failed(format!("--out {}: {e:#}", args.out.display())))?;
    println!("{}", key.public_key().to_text());
    Ok(ExitCode::SUCCESS)
}

/// The key in the file `path` (its first non-empty line, a `whsk_…` key as `keygen` writes
/// it), as text and checked; `flag` names the option in the message of a bad file.
pub fn read_key_file(path: &std::path::Path, flag: &str) -> Result<(String, SigningKey), Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad_input(format!("{flag} {}: {e:#}", path.display())))?;
    let key = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string();
    let parsed = SigningKey::parse(&key)
        .map_err(|e| bad_input(format!("{flag} {}: {e:#}", path.display())))?;
    Ok((key, parsed))
}
