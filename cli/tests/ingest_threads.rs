//! An ingest server names its threads and joins them all on shutdown; the CLI refuses bad
//! settings with exit code 2 before it binds anything. (A file of its own: thread names are
//! per process, and other tests' servers would show up.)
#![cfg(target_os = "linux")]

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/postgres.rs"]
mod pg;

use std::time::Duration;

use common::wait_until;
use outbox_cli::ingest::{IngestConfig, IngestServer};
use pg::Postgres;
use sqlite_outbox::receive::Secret;

/// The names of this process's `outbox-ingest-*` threads (`/proc/self/task/*/comm`, which
/// holds the first 15 bytes of a name).
fn ingest_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("outbox-ingest"))
        .collect()
}

#[test]
fn an_ingest_server_names_its_threads_and_joins_them_on_shutdown() {
    let postgres = Postgres::start();
    let server = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), postgres.url())
            .secret(Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap())
            .threads(3),
    )
    .unwrap();
    // A new thread sets its own name once it runs: wait for all of them to have.
    let named =
        |names: &[String], prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
    wait_until(Duration::from_secs(5), || {
        let names = ingest_threads();
        named(&names, "outbox-ingest-d") == 3 && named(&names, "outbox-ingest-i") == 2
    });
    let names = ingest_threads();
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("outbox-ingest-d"))
            .count(),
        3,
        "{names:?}"
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("outbox-ingest-i"))
            .count(),
        2,
        "{names:?}"
    );
    server.shutdown();
    // Joined: gone at once (the wait only absorbs the kernel's bookkeeping).
    assert!(
        wait_until(Duration::from_secs(2), || ingest_threads().is_empty()),
        "{:?}",
        ingest_threads()
    );
}

#[test]
fn the_cli_refuses_bad_settings_with_exit_code_2() {
    let cli = |args: &[&str], envs: &[(&str, &str)]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
        command.arg("ingest").args(args);
        command
            .env_remove("OUTBOX_SECRET")
            .env_remove("OUTBOX_POSTGRES_URL");
        for (k, v) in envs {
            command.env(k, v);
        }
        // Bounded: a setting wrongly taken would leave the server running.
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if !wait_until(Duration::from_secs(20), || {
            child.try_wait().ok().flatten().is_some()
        }) {
            let _ = child.kill();
        }
        child.wait_with_output().unwrap()
    };
    let listen = ["--listen", "127.0.0.1:0"];
    let secret = ("OUTBOX_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let pg = ("OUTBOX_POSTGRES_URL", "host=127.0.0.1 port=1 user=x");
    for (args, envs, why) in [
        (listen.to_vec(), vec![secret], "--postgres URL"),
        (listen.to_vec(), vec![pg], "signed requests only"),
        (
            [&listen[..], &["--secret", "whsec_!!!"]].concat(),
            vec![pg],
            "a secret",
        ),
        (
            [&listen[..], &["--secret", "whsec_AA"]].concat(),
            vec![pg],
            "at least 24",
        ),
        (
            [&listen[..], &["--threads", "0"]].concat(),
            vec![pg, secret],
            "database threads is out of range",
        ),
        (
            [&listen[..], &["--max-body", "10"]].concat(),
            vec![pg, secret],
            "body limit",
        ),
        (
            listen.to_vec(),
            vec![("OUTBOX_POSTGRES_URL", "not a url ==="), secret],
            "PostgreSQL URL is not valid",
        ),
    ] {
        let o = cli(&args, &envs);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}
