//! What `synchronous=NORMAL` and `FULL` promise, tested where a test can: a process killed
//! with SIGKILL right after its commits returned loses none of them, with either setting.
//!
//! Power loss cannot be simulated here. What SQLite documents, and the README repeats: with
//! FULL a commit that returned survives power loss; with NORMAL the last commits before a
//! power loss or OS crash may roll back (the file stays consistent).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::example_binary;
use sqlite_outbox::rusqlite::Connection;

fn committed_then_killed(synchronous: &str) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("durable.db");
    let mut writer = Command::new(example_binary("crash_writer"))
        .arg(&db)
        .arg("1")
        .env("OUTBOX_SYNCHRONOUS", synchronous)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    // Wait for 300 commits to return, then kill at once.
    while printed.len() < 300 {
        let line = lines.next().expect("writer still running").unwrap();
        printed.push(line.split(' ').next().unwrap().to_string());
    }
    writer.kill().unwrap();
    writer.wait().unwrap();

    let conn = Connection::open(&db).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let stored = common::stored_event_ids(&db);
    let lost: Vec<&String> = printed.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{synchronous}: {} committed events lost",
        lost.len()
    );
}

#[test]
fn normal_loses_no_commit_when_the_process_is_killed() {
    committed_then_killed("NORMAL");
}

#[test]
fn full_loses_no_commit_when_the_process_is_killed() {
    committed_then_killed("FULL");
}
