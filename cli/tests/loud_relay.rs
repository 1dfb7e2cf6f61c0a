//! A relay that cannot deliver says so (issue 66, item 1): a receiver refusing its
//! credentials (401) or a port nobody listens on gets one warning line naming the
//! destination and the answer, at the CLI's default level, not one per retry;
//! `relay --until-empty` without a terminal says where it stands every few seconds; stopped
//! by a signal with events pending it exits 3 and says how many; a destination that no route
//! sends events to is named at once.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Reply, TestReceiver};
use serde_json::json;
use sqlite_outbox::{Event, Outbox};

/// A file with one pending event.
fn one_pending(dir: &std::path::Path) -> std::path::PathBuf {
    let db = dir.join("app.db");
    let outbox = Outbox::open(&db).unwrap();
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("order.placed", json!({"n": 1}))))
        .unwrap();
    db
}

/// `outbox --db DB relay ARGS`, its stderr read line by line into the returned list (a
/// pipe: not a terminal).
fn relay(db: &std::path::Path, args: &[&str]) -> (Child, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(db)
        .arg("relay")
        .args(args)
        .env_remove("OUTBOX_DB")
        .env_remove("OUTBOX_SECRET")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    (child, lines)
}

/// The warnings (log lines, not progress lines) that contain `needle`.
fn warnings(lines: &Arc<Mutex<Vec<String>>>, needle: &str) -> usize {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(" WARN ") && l.contains(needle))
        .count()
}

fn count(lines: &Arc<Mutex<Vec<String>>>, needle: &str) -> usize {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// Waits for the child's exit, at most 30 s (a bound that proves nothing hangs).
fn exit_code(child: &mut Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().expect("an exit code, not a signal");
        }
        assert!(Instant::now() < deadline, "the relay did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_receiver_answering_401_is_warned_once_with_progress_and_sigterm_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let db = one_pending(dir.path());
    let receiver = TestReceiver::start(0, |_| Reply::Status(401));
    let (mut child, lines) = relay(&db, &["--url", &receiver.url(), "--until-empty"]);
    // Long enough for retries and at least one progress line (every 5 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&lines, "1 pending, 0 delivered") == 0 || receiver.received().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no progress line or no retry: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(exit_code(&mut child), 3, "{:?}", lines.lock().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    let said = lines.lock().unwrap().clone();
    assert!(receiver.received().len() >= 2, "tried again: {said:?}");
    assert_eq!(
        warnings(
            &lines,
            "destination default: refuses the relay's credentials"
        ),
        1,
        "one warning for the state, not one per attempt: {said:?}"
    );
    assert!(count(&lines, "401") >= 1, "the answer is named: {said:?}");
    assert_eq!(
        count(&lines, "stopping with 1 events still pending"),
        1,
        "{said:?}"
    );
    assert_eq!(
        warnings(&lines, "destination default: requests are not signed"),
        1,
        "unsigned delivery warned once: {said:?}"
    );
}

#[test]
fn a_closed_port_is_warned_once_and_a_timeout_with_events_pending_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let db = one_pending(dir.path());
    // A port that was free a moment ago: nobody listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/events");
    let (mut child, lines) = relay(&db, &["--url", &url, "--until-empty", "--timeout", "7s"]);
    assert_eq!(exit_code(&mut child), 3, "{:?}", lines.lock().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    let said = lines.lock().unwrap().clone();
    assert_eq!(
        warnings(&lines, "destination default: unreachable"),
        1,
        "{said:?}"
    );
    assert!(
        count(&lines, "1 pending, 0 delivered") >= 1,
        "progress while unreachable, naming why: {said:?}"
    );
    assert!(
        said.iter()
            .any(|l| l.contains("1 pending") && l.contains("unreachable")),
        "{said:?}"
    );
}

#[test]
fn a_destination_no_route_sends_events_to_is_named_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = one_pending(dir.path());
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let (mut child, lines) = relay(
        &db,
        &[
            "--url",
            &receiver.url(),
            "--destination",
            "orders",
            "--until-empty",
        ],
    );
    let code = exit_code(&mut child);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(code, 0, "{:?}", lines.lock().unwrap());
    assert_eq!(
        warnings(&lines, "destination orders: no route sends events to it"),
        1,
        "{:?}",
        lines.lock().unwrap()
    );
}
