//! The `outbox` command follows Unix habits (issue 66, item 6): a closed pipe ends it
//! quietly; bad input (a missing folder, a missing file) exits 2 naming the path; JSON lists
//! are JSON Lines with `data` as JSON and RFC 3339 times beside the milliseconds; durations
//! are written `30s` everywhere; `disable` beside `enable`; a `retry` that reset nothing
//! prints no success.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn outbox(db: &Path, args: &[&str]) -> Output {
    common::outbox_cli(db, args)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A file with one pending event; its id.
fn one_event(db: &Path) -> String {
    assert!(outbox(db, &["init"]).status.success());
    let out = outbox(
        db,
        &["enqueue", "--type", "order.placed", "--data", r#"{"n":1}"#],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let _ = one_event(&db);
    // A pipe whose reading end is closed before the command writes: every write fails
    // with EPIPE, as `outbox stats | head -0` does.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .arg("stats")
        .env_remove("OUTBOX_DB")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_input_exits_2_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing_folder = dir.path().join("no-such-folder").join("app.db");
    let out = outbox(&missing_folder, &["init"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no-such-folder"),
        "{}",
        text(&out.stderr)
    );

    let bundle = dir.path().join("no-such-bundle.outbox");
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["import", "--url", "http://127.0.0.1:9/events", "--secret"])
        .arg("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .arg(&bundle)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no-such-bundle.outbox"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn json_lists_carry_data_as_json_and_rfc_3339_times() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let id = one_event(&db);
    for args in [vec!["list", "--json"], vec!["show", id.as_str(), "--json"]] {
        let out = outbox(&db, &args);
        let lines: Vec<Value> = text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}");
        let record = &lines[0];
        assert_eq!(record["data"], serde_json::json!({"n": 1}), "{record}");
        let created = record["created_time"].as_str().unwrap();
        assert!(created.ends_with('Z') && created.contains('T'), "{record}");
        assert!(record["created_at"].as_i64().is_some());
        assert!(record["delivered_time"].is_null());
    }
}

#[test]
fn retry_of_an_unknown_id_prints_no_success_and_disable_pairs_with_enable() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let _ = one_event(&db);
    let out = outbox(&db, &["retry", "01a22a94-0000-7000-8000-000000000000"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("nothing was reset"));

    let out = outbox(&db, &["disable", "default", "--reason", "maintenance"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let health = outbox(&db, &["health"]);
    assert_eq!(health.status.code(), Some(1), "a disabled destination");
    assert!(
        text(&health.stdout).contains("maintenance"),
        "{}",
        text(&health.stdout)
    );
    let out = outbox(&db, &["enable", "default"]);
    assert!(text(&out.stdout).contains("enabled default"));

    // Durations are written as everywhere else; the old whole-seconds flag still works.
    for lease in [["--lease", "30s"], ["--lease-secs", "30"]] {
        let out = outbox(
            &db,
            &[
                "relay",
                "--url",
                "http://127.0.0.1:9/events",
                lease[0],
                lease[1],
                "--timeout",
                "1s",
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "{lease:?}: {}",
            text(&out.stderr)
        );
    }
}
