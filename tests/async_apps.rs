//! The async guide's examples, run as a user would: `examples/tokio_app.rs` (handlers on
//! tokio enqueueing through `spawn_blocking`, the relay on its own threads, shutdown on a
//! signal) and `examples/sqlx_app.rs` (a sqlx transaction writing its event through the SQL
//! contract, the crate's relay delivering it).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end, bounded: its stdout, or a panic naming what hung.
fn run_bounded(mut cmd: Command, bound: Duration) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
            return (status, out);
        }
        if started.elapsed() > bound {
            child.kill().unwrap();
            panic!("{cmd:?} still running after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn tokio_handlers_enqueue_without_blocking_and_every_order_is_delivered() {
    let mut cmd = Command::new(common::example_binary("tokio_app"));
    cmd.arg("200");
    let (status, out) = run_bounded(cmd, Duration::from_secs(120));
    assert!(status.success(), "{out}");
    assert!(
        out.contains("placed 200 orders from async handlers"),
        "{out}"
    );
    assert!(
        out.contains("delivered 200, 0 pending, 200 received"),
        "{out}"
    );
    assert!(out.contains("0 abandoned"), "{out}");
}

#[test]
fn the_tokio_app_shuts_the_relay_down_cleanly_on_sigterm() {
    let mut child = Command::new(common::example_binary("tokio_app"))
        .args(["50", "--until-signal"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let ready = line.starts_with("ready");
        seen.push(line);
        if ready {
            break;
        }
    }
    assert!(seen.iter().any(|l| l.starts_with("ready")), "{seen:?}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no exit 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(status.success(), "{seen:?} {rest:?}");
    let last = rest.join("\n");
    assert!(last.contains("relay shut down"), "{last}");
    assert!(last.contains("0 abandoned"), "{last}");
}

#[test]
fn a_sqlx_transaction_writes_its_event_through_the_sql_contract_and_the_relay_delivers_it() {
    let mut cmd = Command::new(common::example_binary("sqlx_app"));
    cmd.arg("100");
    let (status, out) = run_bounded(cmd, Duration::from_secs(120));
    assert!(status.success(), "{out}");
    assert!(out.contains("committed 100 orders"), "{out}");
    assert!(
        out.contains("refused:") && out.contains("outbox: data must be JSON text"),
        "{out}"
    );
    // The refused order was rolled back with its transaction: 100 orders, 100 events.
    assert!(
        out.contains("delivered 100, 0 pending, 100 received, 100 orders stored"),
        "{out}"
    );
}
