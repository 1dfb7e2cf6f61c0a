//! The `outbox` binary, run as a subprocess against real database files.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{wait_until, Reply, TestReceiver, PATIENCE};
use serde_json::Value;
use sqlite_outbox::receive::{Secret, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn outbox(db: &Path, args: &[&str]) -> Output {
    common::outbox_cli(db, args)
}

fn outbox_stdin(db: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outbox");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn init(dir: &tempfile::TempDir) -> PathBuf {
    let db = dir.path().join("app.db");
    let o = outbox(&db, &["init"]);
    assert!(o.status.success(), "{}", stderr(&o));
    db
}

fn enqueue(db: &Path, event_type: &str, extra: &[&str]) -> String {
    let mut args = vec!["enqueue", "--type", event_type];
    args.extend_from_slice(extra);
    let o = outbox(db, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).trim().to_string()
}

fn stats_json(db: &Path) -> Value {
    let o = outbox(db, &["stats", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn bad_files_and_bad_input_give_clear_messages_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let o = outbox(&missing, &["stats"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(!missing.exists(), "a read command must not create the file");

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some text ".repeat(50)).unwrap();
    let o = outbox(&text, &["list"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not a SQLite database"),
        "{}",
        stderr(&o)
    );

    let other = dir.path().join("other.db");
    sqlite_outbox::rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let o = outbox(&other, &["stats"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not an outbox database"),
        "{}",
        stderr(&o)
    );

    let db = init(&dir);
    let o = outbox(&db, &["enqueue", "--type", "t", "--data", "{nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not valid JSON"), "{}", stderr(&o));
    let o = outbox(&db, &["prune", "--older-than", "soon"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a duration"), "{}", stderr(&o));
    let o = outbox(&db, &["enqueue", "--type", ""]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("event type is empty"), "{}", stderr(&o));
    let o = outbox(&db, &["--synchronous", "sometimes", "stats"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("possible values: normal, full"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stats_json(&db)["pending"], 0);
}

#[test]
fn synchronous_is_taken_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let o = outbox(&db, &["--synchronous", "full", "enqueue", "--type", "t"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--db", db.to_str().unwrap(), "enqueue", "--type", "t"])
        .env("OUTBOX_SYNCHRONOUS", "FULL")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--db", db.to_str().unwrap(), "stats"])
        .env("OUTBOX_SYNCHRONOUS", "off")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stats_json(&db)["pending"], 2);
}

#[test]
fn enqueue_jsonl_prints_each_id_after_its_commit_and_stops_at_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let input = concat!(
        r#"{"type": "order.created", "data": {"id": 1}, "key": "c-1", "subject": "orders/1"}"#,
        "\n",
        r#"{"type": "order.created", "data": {"id": 2}, "idempotency_key": "o-2"}"#,
        "\n\n",
        r#"{"type": "order.created", "data": {"id": 2}, "idempotency_key": "o-2"}"#,
        "\n",
        "{broken\n",
        r#"{"type": "never.reached"}"#,
        "\n"
    );
    let o = outbox_stdin(&db, &["enqueue", "--jsonl"], input.as_bytes());
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 5"), "{}", stderr(&o));
    let ids: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[1], ids[2], "the duplicate prints the first id");
    assert_eq!(stats_json(&db)["pending"], 2);

    let o = outbox_stdin(
        &db,
        &["enqueue", "--jsonl"],
        b"{\"type\": \"t\"}\n\xff\xfe\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("line 2: not valid UTF-8"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stats_json(&db)["pending"], 3);

    let listed = outbox(&db, &["list", "--json"]);
    let rows: Vec<Value> = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for field in [
        "id",
        "event_id",
        "type",
        "key",
        "state",
        "attempts",
        "last_error",
    ] {
        assert!(rows[0].get(field).is_some(), "{field} missing");
    }
    assert_eq!(rows[0]["key"], "c-1");
    assert_eq!(rows[0]["state"], "pending");
}

#[test]
fn relay_until_empty_delivers_signed_batches_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let lines: String = (0..120)
        .map(|i| format!("{{\"type\": \"reading\", \"data\": {{\"i\": {i}}}}}\n"))
        .collect();
    assert!(outbox_stdin(&db, &["enqueue", "--jsonl"], lines.as_bytes())
        .status
        .success());
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--secret",
            SECRET,
            "--batch",
            "50",
            "--until-empty",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("delivered 120"), "{}", stderr(&o));
    assert_eq!(receiver.event_count(), 120);
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    for r in receiver.received() {
        let headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let now = r.headers["webhook-timestamp"].parse().unwrap();
        sqlite_outbox::receive::verify_request(&verifier, &headers, &r.raw, now).unwrap();
    }
    let s = stats_json(&db);
    assert_eq!(
        (s["pending"].clone(), s["delivered"].clone()),
        (0.into(), 120.into())
    );
}

#[test]
fn relay_stops_gracefully_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let receiver = TestReceiver::ok();
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["relay", "--url", &receiver.url()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    enqueue(&db, "t", &[]);
    assert!(wait_until(PATIENCE, || receiver.count() == 1));
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "relay did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert_eq!(stats_json(&db)["delivered"], 1);
}

#[test]
fn relay_timeout_exits_3_when_events_stay_pending() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    enqueue(&db, "t", &[]);
    let port = common::closed_port();
    let url = format!("http://127.0.0.1:{port}/");
    let o = outbox(
        &db,
        &["relay", "--url", &url, "--until-empty", "--timeout", "1s"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let s = stats_json(&db);
    assert_eq!(
        (s["pending"].clone(), s["dead"].clone()),
        (1.into(), 0.into())
    );
}

#[test]
fn relay_timeout_exits_0_when_nothing_is_pending() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let receiver = TestReceiver::ok();
    enqueue(&db, "t", &[]);
    // Without --until-empty: the relay runs to its timeout, having delivered everything.
    let o = outbox(&db, &["relay", "--url", &receiver.url(), "--timeout", "1s"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stats_json(&db)["delivered"], 1);
}

#[test]
fn dead_letters_show_retry_purge_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let a = enqueue(&db, "order.created", &["--key", "c-1"]);
    let b = enqueue(&db, "order.created", &[]);
    let c = enqueue(&db, "user.signup", &[]);
    let refuse = TestReceiver::start(0, |_| Reply::StatusBody(400, "missing field total"));
    let o = outbox(&db, &["relay", "--url", &refuse.url(), "--until-empty"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stats_json(&db)["dead"], 3);

    let h = outbox(&db, &["health"]);
    assert_eq!(h.status.code(), Some(1));
    assert!(stdout(&h).contains("3 dead letters"), "{}", stdout(&h));
    let hj = outbox(&db, &["health", "--json"]);
    let hv: Value = serde_json::from_slice(&hj.stdout).unwrap();
    assert_eq!(hv["ok"], false);

    let shown = outbox(&db, &["show", &a]);
    assert!(shown.status.success());
    assert!(
        stdout(&shown).contains("HTTP 400: missing field total"),
        "{}",
        stdout(&shown)
    );
    let listed = outbox(&db, &["list", "--state", "dead"]);
    assert!(stdout(&listed).contains("missing field total"));
    assert_eq!(outbox(&db, &["show", "nope"]).status.code(), Some(1));

    let ok = TestReceiver::ok();
    let r = outbox(&db, &["retry", &a]);
    assert!(stdout(&r).contains("reset 1"), "{}", stdout(&r));
    let r = outbox(&db, &["retry", "--all-dead", "--type", "order.*"]);
    assert!(stdout(&r).contains("reset 1"), "{}", stdout(&r));
    assert!(outbox(&db, &["relay", "--url", &ok.url(), "--until-empty"])
        .status
        .success());
    let mut got: Vec<String> = ok.received().into_iter().map(|r| r.event_id).collect();
    got.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(got, want);

    // A destination disabled (by a 410, here by hand) shows in health until enabled.
    sqlite_outbox::Outbox::open(&db)
        .unwrap()
        .disable_destination("default", "HTTP 410")
        .unwrap();
    let h = outbox(&db, &["health"]);
    assert!(stdout(&h).contains("default is disabled"), "{}", stdout(&h));
    let e = outbox(&db, &["enable", "default"]);
    assert!(stdout(&e).contains("enabled default"), "{}", stdout(&e));

    let p = outbox(&db, &["purge-dead"]);
    assert!(stdout(&p).contains("purged 1"), "{}", stdout(&p));
    assert!(outbox(&db, &["show", &c]).status.code() == Some(1));
    assert_eq!(outbox(&db, &["health"]).status.code(), Some(0));
}

#[test]
fn prune_and_stats_in_human_form() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    for _ in 0..5 {
        enqueue(&db, "t", &[]);
    }
    sqlite_outbox::rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("UPDATE outbox_events SET delivered_at = 1 WHERE id <= 3")
        .unwrap();
    let p = outbox(&db, &["prune", "--older-than", "1d"]);
    assert!(
        stdout(&p).contains("pruned 3 delivered events"),
        "{}",
        stdout(&p)
    );
    let s = outbox(&db, &["stats"]);
    let text = stdout(&s);
    assert!(
        text.contains("pending") && text.contains("DESTINATION"),
        "{text}"
    );
    assert!(text
        .lines()
        .any(|l| l.starts_with("default") && l.contains("enabled")));
    let j = stats_json(&db);
    assert_eq!(
        (j["pending"].clone(), j["delivered"].clone()),
        (2.into(), 0.into())
    );
}

/// Every request `receiver` got verifies with `SECRET`.
fn all_signed_with_secret(receiver: &TestReceiver) -> bool {
    let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
    receiver.received().iter().all(|r| {
        let headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let now = r.headers["webhook-timestamp"].parse().unwrap();
        sqlite_outbox::receive::verify_request(&verifier, &headers, &r.raw, now).is_ok()
    })
}

#[test]
fn relay_takes_secrets_from_a_file_or_the_environment_out_of_sight_of_ps() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    let file = dir.path().join("secrets");
    std::fs::write(&file, format!("\n{SECRET}\n")).unwrap();
    enqueue(&db, "t", &[]);
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--secret-file",
            file.to_str().unwrap(),
            "--until-empty",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    enqueue(&db, "t", &[]);
    let o = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(&db)
        .args(["relay", "--url", &url, "--until-empty"])
        .env("OUTBOX_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(receiver.count(), 2);
    assert!(all_signed_with_secret(&receiver));
    // A secret file that holds nothing, or a malformed secret, is bad input.
    std::fs::write(&file, "\n").unwrap();
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            &url,
            "--secret-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = outbox(&db, &["relay", "--url", &url, "--secret", "whsec_!!!"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("!!!"),
        "the secret is not repeated: {}",
        stderr(&o)
    );
}

#[test]
fn an_absurd_lease_is_bad_input_not_a_spinning_relay() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            "http://127.0.0.1:9/",
            "--lease-secs",
            "9300000000000000",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("lease"), "{}", stderr(&o));
    let o = outbox(
        &db,
        &["relay", "--url", "http://127.0.0.1:9/", "--workers", "0"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// Issue 38, item 10: every command that takes a secret refuses one shorter than 24 bytes
/// with exit 2 and the minimum, before it does anything.
#[test]
fn a_short_secret_is_refused_by_every_command_that_takes_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let bundle = dir.path().join("b.bundle");
    let bundle = bundle.to_str().unwrap();
    let url = "http://127.0.0.1:9/events";
    for args in [
        vec!["relay", "--url", url, "--secret", "whsec_AA"],
        vec!["export", "--out", bundle, "--secret", "whsec_AAAAAAAA"],
        vec!["import", bundle, "--url", url, "--secret", "whsec_AA"],
    ] {
        let o = outbox(&db, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("at least 24"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert!(!std::path::Path::new(bundle).exists(), "no bundle written");
}

#[test]
fn enqueue_takes_trace_context_and_dataschema_from_flags_and_jsonl_and_refuses_malformed_ones() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const SCHEMA: &str = "https://example.com/schemas/reading/v2.json";
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let from_flags = enqueue(
        &db,
        "reading.taken",
        &[
            "--traceparent",
            TP,
            "--tracestate",
            "rojo=00f067aa0ba902b7",
            "--dataschema",
            SCHEMA,
        ],
    );
    let line = format!(
        "{{\"type\": \"reading.taken\", \"traceparent\": \"{TP}\", \"tracestate\": \"congo=t61\", \
         \"dataschema\": \"urn:reading:v3\"}}\n"
    );
    let o = outbox_stdin(&db, &["enqueue", "--jsonl"], line.as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    let from_jsonl = stdout(&o).trim().to_string();

    // Malformed: exit 2 naming the field and the rule; nothing written.
    for (args, field) in [
        (vec!["--traceparent", "00-abc-01"], "traceparent"),
        (
            vec![
                "--traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            ],
            "traceparent",
        ),
        (
            vec!["--traceparent", TP, "--tracestate", "Rojo=1"],
            "tracestate",
        ),
        (vec!["--dataschema", "schemas/reading.json"], "dataschema"),
    ] {
        let mut all = vec!["enqueue", "--type", "reading.taken"];
        all.extend(args);
        let o = outbox(&db, &all);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(field), "{all:?}: {}", stderr(&o));
    }
    // --tracestate alone is a usage error: it belongs to a traceparent.
    let o = outbox(&db, &["enqueue", "--type", "t", "--tracestate", "rojo=1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = outbox_stdin(
        &db,
        &["enqueue", "--jsonl"],
        b"{\"type\": \"t\", \"traceparent\": \"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 1: traceparent"), "{}", stderr(&o));
    assert_eq!(stats_json(&db)["pending"], 2);

    let conn = sqlite_outbox::rusqlite::Connection::open(&db).unwrap();
    let stored = |id: &str| -> (String, String, String) {
        conn.query_row(
            "SELECT traceparent, tracestate, dataschema FROM outbox_events WHERE event_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    assert_eq!(
        stored(&from_flags),
        (TP.into(), "rojo=00f067aa0ba902b7".into(), SCHEMA.into())
    );
    assert_eq!(
        stored(&from_jsonl),
        (TP.into(), "congo=t61".into(), "urn:reading:v3".into())
    );
}

#[test]
fn relay_compress_takes_gzip_or_none_and_only_for_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            "http://127.0.0.1:1/",
            "--compress",
            "zstd",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("gzip or none"), "{}", stderr(&o));
    let o = outbox(
        &db,
        &["relay", "--url", "mqtt://127.0.0.1:1", "--compress", "gzip"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("compression is for HTTP destinations"),
        "{}",
        stderr(&o)
    );
    // Accepted for HTTP: the relay runs, and with nothing pending --until-empty ends it.
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            "http://127.0.0.1:1/",
            "--compress",
            "gzip",
            "--until-empty",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn relay_linger_needs_batch_and_fits_in_a_quarter_of_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = init(&dir);
    let url = "http://127.0.0.1:1/";
    let o = outbox(&db, &["relay", "--url", url, "--linger", "2s"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("set batch too"), "{}", stderr(&o));
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            url,
            "--batch",
            "100",
            "--linger",
            "20s",
            "--lease-secs",
            "60",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("at most a quarter of the lease"),
        "{}",
        stderr(&o)
    );
    let o = outbox(
        &db,
        &[
            "relay",
            "--url",
            url,
            "--batch",
            "100",
            "--linger",
            "2s",
            "--until-empty",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}
