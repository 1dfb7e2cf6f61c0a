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
/// `outbox relay` until nothing is pending, or a minute.
const UNTIL_EMPTY: [&str; 3] = ["--until-empty", "--timeout", "60s"];

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
        .args(["relay", "--url", &receiver.url()])
        .args(UNTIL_EMPTY)
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

/// libfaketime's library, to preload with an offset read from a file at every call (the
/// `faketime` wrapper takes a fixed one): `None` where it is not installed.
fn libfaketime() -> Option<std::path::PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|dir| dir.path().join("faketime/libfaketime.so.1"))
        .find(|lib| lib.exists());
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "libfaketime is missing on CI: .ci/run must install faketime"
    );
    found
}

/// `outbox` under libfaketime, its wall clock offset by what `offset_file` says at each
/// read, its monotonic clocks (and the time since boot) left true.
fn outbox_with_clock_from(lib: &Path, offset_file: &Path, db: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .env("LD_PRELOAD", lib)
        .env("FAKETIME_TIMESTAMP_FILE", offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env_remove("FAKETIME")
        .arg("--db")
        .arg(db);
    command
}

#[test]
fn events_queued_a_week_behind_survive_ntp_stepping_the_relays_clock_forward() {
    // Issue 67, item 3, with real processes: a device without a real-time clock boots a
    // week behind, queues 5 events that expire in an hour while its receiver is down, and
    // NTP steps the clock forward a week under the running relay. Before, the relay
    // expired all 5.
    let Some(lib) = libfaketime() else {
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("behind.db");
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "-7d\n").unwrap();
    assert!(outbox(&db, &["init"]).status.success());
    for i in 0..5 {
        let data = i.to_string();
        let enqueued = outbox_with_clock_from(&lib, &offset, &db)
            .args([
                "enqueue",
                "--type",
                "t",
                "--data",
                &data,
                "--expires-in",
                "1h",
            ])
            .output()
            .unwrap();
        assert!(enqueued.status.success(), "{enqueued:?}");
    }
    let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let receiver = {
        let up = up.clone();
        TestReceiver::start(0, move |_| {
            Reply::Status(if up.load(std::sync::atomic::Ordering::SeqCst) {
                204
            } else {
                503
            })
        })
    };
    let relay = outbox_with_clock_from(&lib, &offset, &db)
        .args(["relay", "--url", &receiver.url()])
        .args(UNTIL_EMPTY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let tried = common::wait_until(common::PATIENCE, || {
        let ids: std::collections::HashSet<String> = receiver.event_ids().into_iter().collect();
        ids.len() == 5
    });
    assert!(tried, "each tried while the receiver is down");
    std::fs::write(&offset, "+0\n").unwrap();
    // Past an idle relay's 5 s between looks at the clock.
    std::thread::sleep(std::time::Duration::from_secs(6));
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    let ended = relay.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert!(stderr.contains("delivered 5"), "{stderr}");
    assert!(stderr.contains("dead 0"), "{stderr}");
}
