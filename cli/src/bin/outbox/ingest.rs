//! `outbox ingest`: the fleet's receiving end. Verifies signed CloudEvents from devices and
//! stores each event once in PostgreSQL, until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use outbox_cli::ingest::{IngestConfig, IngestServer};
use sqlite_outbox::receive::Secret;

use crate::failure::{bad_input, failed, Outcome};
use crate::parse_duration;

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct IngestArgs {
    /// The address to listen on, like 0.0.0.0:8080 (port 0: any free port, printed).
    #[arg(long)]
    listen: SocketAddr,
    /// The PostgreSQL database (postgresql://user@host/db or "host=… user=…"). Visible to
    /// `ps`: prefer --postgres-file or OUTBOX_POSTGRES_URL.
    #[arg(long, env = "OUTBOX_POSTGRES_URL", hide_env_values = true)]
    postgres: Option<String>,
    /// A file whose first line is the PostgreSQL URL.
    #[arg(long)]
    postgres_file: Option<PathBuf>,
    /// whsec_… secret requests are signed with; repeat for rotation. Visible to `ps`: prefer
    /// --secret-file or OUTBOX_SECRET.
    #[arg(long, env = "OUTBOX_SECRET", hide_env_values = true)]
    secret: Vec<String>,
    /// A file of whsec_… secrets, one per line.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Database threads and PostgreSQL connections.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// The largest request body, in bytes; larger ones get 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Open connections at most; past it, new ones wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Time a client has to send a request's head, and its body (e.g. 10s).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    read_timeout: Duration,
    /// Time one write of an answer may wait for the client to read it; a client that
    /// pipelines requests and reads nothing loses its connection then (e.g. 10s).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    write_timeout: Duration,
    /// Requests one connection may carry; the answer to the last closes it.
    #[arg(long, default_value_t = 1000)]
    max_requests_per_connection: usize,
}

pub fn run(args: IngestArgs) -> Outcome {
    let url = match (&args.postgres, &args.postgres_file) {
        (Some(_), Some(_)) => {
            return Err(bad_input("give --postgres or --postgres-file, not both"));
        }
        (Some(url), None) => url.clone(),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--postgres-file {}: {e}", path.display())))?;
            text.lines().next().unwrap_or("").trim().to_string()
        }
        (None, None) => {
            return Err(bad_input(
                "--postgres URL, --postgres-file F or OUTBOX_POSTGRES_URL is required",
            ));
        }
    };
    let mut texts = args.secret.clone();
    if let Some(path) = &args.secret_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("--secret-file {}: {e}", path.display())))?;
        texts.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() {
        return Err(bad_input(
            "--secret, --secret-file or OUTBOX_SECRET is required: ingest takes signed requests only",
        ));
    }
    let mut config = IngestConfig::new(args.listen, url)
        .threads(args.threads)
        .max_body(args.max_body)
        .max_connections(args.max_connections)
        .read_timeout(args.read_timeout)
        .write_timeout(args.write_timeout)
        .max_requests_per_connection(args.max_requests_per_connection);
    for text in &texts {
        let secret = Secret::parse(text).map_err(|e| bad_input(format!("a secret: {e}")))?;
        config = config.secret(secret);
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .map_err(|e| failed(format!("cannot install the signal handler: {e}")))?;
    let server = IngestServer::start(config)?;
    // The one line a supervisor or a test reads to learn the port.
    println!("listening on http://{}", server.local_addr());
    let _ = std::io::stdout().flush();
    let _ = stop_rx.recv();
    server.shutdown();
    Ok(ExitCode::SUCCESS)
}
