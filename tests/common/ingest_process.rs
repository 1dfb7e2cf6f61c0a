//! An `outbox ingest` process for the tests of `cli/tests`: started on a free loopback port
//! with the arguments given, its log (stderr) in a file, killed when dropped.
//!
//! Include with `#[path = "../../tests/common/ingest_process.rs"] mod ingest_process;` beside
//! the `common`, `pg` and `raw_http` modules it uses.

// Each test file uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sqlite_outbox::receive::SigningKey;

use crate::pg::Postgres;
use crate::raw_http::{device_signed_headers, request, Answer};

/// An `outbox ingest` process, its stderr (the log) in a file.
pub struct Ingest {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: Option<SocketAddr>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ingest {
    pub fn start(postgres: &Postgres, args: &[&str]) -> Ingest {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("ingest.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args([
                "ingest",
                "--listen",
                "127.0.0.1:0",
                "--postgres",
                &postgres.url(),
            ])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = lines
            .next()
            .unwrap()
            .unwrap()
            .trim_start_matches("listening on http://")
            .parse()
            .unwrap();
        let metrics = args.contains(&"--metrics-listen").then(|| {
            lines
                .next()
                .unwrap()
                .unwrap()
                .trim_start_matches("metrics on http://")
                .trim_end_matches("/metrics")
                .parse()
                .unwrap()
        });
        Ingest {
            child,
            addr,
            metrics,
            log,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/events", self.addr)
    }

    pub fn post(&self, key: &SigningKey, source: &str, id: &str) -> Answer {
        let body = event_body(id, source);
        request(
            self.addr,
            "POST",
            "/events",
            &device_signed_headers(key, source, id, &body),
            &body,
        )
        .unwrap()
    }

    /// Waits until `/healthz` answers 200, as a load balancer would before sending traffic.
    pub fn wait_healthy(&self, within: Duration) -> bool {
        crate::common::wait_until(within, || self.healthz() == 200)
    }

    pub fn healthz(&self) -> u16 {
        request(self.addr, "GET", "/healthz", &[], b"").map_or(0, |a| a.status)
    }

    pub fn metrics(&self) -> String {
        request(self.metrics.unwrap(), "GET", "/metrics", &[], b"")
            .unwrap()
            .body
    }

    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// User and system CPU time of the process so far.
    pub fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_name.split(' ').collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A structured CloudEvent of `source`.
pub fn event_body(id: &str, source: &str) -> Vec<u8> {
    json!({"specversion": "1.0", "id": id, "source": source, "type": "t", "data": {"n": 1}})
        .to_string()
        .into_bytes()
}

/// Events of `source` stored in `outbox_ingested`.
pub fn stored(postgres: &Postgres, source: &str) -> i64 {
    postgres
        .client()
        .query_one(
            "SELECT count(*) FROM outbox_ingested WHERE source = $1",
            &[&source],
        )
        .unwrap()
        .get(0)
}

/// `outbox fleet --pg … --json` with `args`: its streams and its exit code.
pub fn fleet_json(postgres: &Postgres, args: &[&str]) -> (Vec<serde_json::Value>, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["fleet", "--pg", &postgres.url(), "--json"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // JSON Lines: an object per stream.
    let streams: Vec<serde_json::Value> = text
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
        })
        .collect();
    (streams, out.status.code().unwrap_or(-1))
}

/// `outbox keygen` into `dir`: the key file and the public key it printed.
pub fn keygen(dir: &std::path::Path, name: &str) -> (PathBuf, String) {
    let file = dir.join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["keygen", "--out", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    (
        file,
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    )
}
