//! The `outbox relay` CLI with its clock set wrong by `faketime` (Debian package `faketime`,
//! which `.ci/run` installs): 10 minutes behind, 10 minutes ahead, a day ahead. The app
//! commits with the right time; the receiver checks signatures against the right time.
//! Everything is delivered, nothing is dead-lettered.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::SystemTime;

use common::{unix_secs, Reply, TestReceiver};
use sqlite_outbox::receive::{verify_request, Secret, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const EVENTS: usize = 20;

/// Whether `faketime` can run here; on CI it must (`.ci/run` installs it).
fn faketime_available() -> bool {
    let ok = Command::new("faketime")
        .args(["-f", "+1d", "true"])
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "faketime is missing on CI: .ci/run must install it"
    );
    if !ok {
        eprintln!("skipped: faketime is not installed (apt-get install faketime)");
    }
    ok
}

fn outbox(db: &Path, args: &[&str]) -> Output {
    common::outbox_cli(db, args)
}

fn relay_with_clock_off_by(offset: &str) {
    if !faketime_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    assert!(outbox(&db, &["init"]).status.success());
    let lines: String = (0..EVENTS)
        .map(|i| format!("{{\"type\": \"t\", \"data\": {i}}}\n"))
        .collect();
    let mut enqueue = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["enqueue", "--jsonl"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    enqueue
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    assert!(enqueue.wait().unwrap().success());
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    let receiver = TestReceiver::start(0, move |r| {
        match verify_request(
            &verifier,
            &r.header_pairs(),
            &r.raw,
            unix_secs(SystemTime::now()),
        ) {
            Ok(_) => Reply::Status(204),
            Err(_) => Reply::Status(401),
        }
    });
    // Only the wall clock is wrong, as on a device with a bad real-time clock: its monotonic
    // clock (`Instant`, every wait and timeout) still runs true.
    let relay = Command::new("faketime")
        .args(["-f", offset])
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .arg(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args([
            "relay",
            "--url",
            &receiver.url(),
            "--until-empty",
            "--timeout",
            "60s",
        ])
        .env("OUTBOX_SECRET", SECRET)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&relay.stderr);
    assert!(
        relay.status.success(),
        "relay under faketime {offset}: {stderr}"
    );
    assert!(stderr.contains(&format!("delivered {EVENTS}")), "{stderr}");
    assert!(stderr.contains("dead 0"), "{stderr}");
    let accepted: std::collections::HashSet<String> = receiver
        .received()
        .into_iter()
        .filter(|r| {
            let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
            let now = unix_secs(SystemTime::now());
            verify_request(&verifier, &r.header_pairs(), &r.raw, now).is_ok()
        })
        .map(|r| r.event_id)
        .collect();
    assert_eq!(
        accepted.len(),
        EVENTS,
        "every event arrived with a valid signature"
    );
}

#[test]
fn a_relay_whose_clock_is_ten_minutes_behind_delivers_everything() {
    relay_with_clock_off_by("-10m");
}

#[test]
fn a_relay_whose_clock_is_ten_minutes_ahead_delivers_everything() {
    relay_with_clock_off_by("+10m");
}

#[test]
fn a_relay_whose_clock_is_a_day_ahead_delivers_everything() {
    relay_with_clock_off_by("+1d");
}
