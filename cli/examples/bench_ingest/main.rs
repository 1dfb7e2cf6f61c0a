//! Events stored per second by `ingest` servers (in this process, each with its own runtime
//! and 8 database threads) from 8 keep-alive clients, one event per request and batches of
//! 100, against a bare loop of the same INSERT statement over one connection, in the same
//! run, on a PostgreSQL cluster of the bench's own (`fsync=off` for both); and the same
//! traffic from 8 devices each signing with its own Ed25519 key, checked against a key
//! registry of 1,000 devices, against the shared secret, in the same run. The rows of the
//! performance record's ingest section (docs/PERFORMANCE.md).
//!
//! ```text
//! cargo run --release -p outbox-cli --example bench_ingest
//! ```

mod support_ingest;
#[path = "../../../tests/common/postgres.rs"]
mod support_postgres;

use std::time::Duration;

use outbox_cli::ingest::{IngestConfig, IngestServer};
use sqlite_outbox::receive::{Secret, SigningKey};
use support_ingest::Signing;

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn per_s(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.0}k/s", r / 1000.0)
    } else {
        format!("{r:.0}/s")
    }
}

/// Medians of `rounds` alternating runs of `a` and `b`, so drift hits both alike.
fn alternate(rounds: usize, mut a: impl FnMut() -> f64, mut b: impl FnMut() -> f64) -> (f64, f64) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        xs.push(a());
        ys.push(b());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut xs), median(&mut ys))
}

fn main() {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("PostgreSQL is not installed: no ingest rows");
        std::process::exit(1);
    }
    let postgres = support_postgres::Postgres::start();
    let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a valid secret");
    let start = |_| {
        IngestServer::start(
            IngestConfig::new("127.0.0.1:0".parse().expect("an address"), postgres.url())
                .secret(secret.clone())
                .threads(8),
        )
        .expect("the ingest server starts")
    };
    let servers: Vec<IngestServer> = (0..3).map(start).collect();
    // A registry of 1,000 devices, of which the bench's 8 clients are the first.
    let keys: Vec<SigningKey> = (0..1_000)
        .map(|_| SigningKey::generate().expect("a random source").0)
        .collect();
    let registry = tempfile::NamedTempFile::new().expect("a temp file");
    let lines: String = keys
        .iter()
        .enumerate()
        .map(|(d, key)| {
            format!(
                "dev-{d} /devices/bench-{d} {}\n",
                key.public_key().to_text()
            )
        })
        .collect();
    std::fs::write(registry.path(), lines).expect("write the registry");
    let device_server = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().expect("an address"), postgres.url())
            .keys_file(registry.path())
            .threads(8),
    )
    .expect("the ingest server starts");
    let shared = Signing::Shared(&secret);
    let devices = Signing::Devices(&keys[..8]);
    let addrs: Vec<_> = servers.iter().map(IngestServer::local_addr).collect();
    let mut bare_client = postgres.client();
    let round = std::cell::Cell::new(0);
    let next_run = || {
        round.set(round.get() + 1);
        format!("r{}", round.get())
    };
    println!("| measure | outbox | baseline (same run) | ratio | target |");
    println!("|---|---|---|---|---|");
    for (events, per_request) in [(4_000, 1), (50_000, 100)] {
        for processes in [1, 3] {
            let (ours, bare) = alternate(
                3,
                || {
                    let bodies = support_ingest::bodies(&next_run(), events, per_request, &shared);
                    let took = support_ingest::post_all(
                        &addrs[..processes],
                        &shared,
                        &bodies,
                        per_request > 1,
                        8,
                    );
                    rate(events, took)
                },
                || {
                    rate(
                        events,
                        support_ingest::bare_inserts(
                            &mut bare_client,
                            &next_run(),
                            events,
                            per_request,
                        ),
                    )
                },
            );
            println!(
                "| ingest into PostgreSQL, {per_request} event(s)/request, {processes} server(s) | {} events | {} (bare INSERT loop) | {:.2}× | {} |",
                per_s(ours),
                per_s(bare),
                ours / bare,
                if per_request > 1 { "≥ 0.5×" } else { "" },
            );
        }
    }
    for (events, per_request) in [(4_000, 1), (50_000, 100)] {
        let post = |signing: &Signing, addr| {
            let bodies = support_ingest::bodies(&next_run(), events, per_request, signing);
            rate(
                events,
                support_ingest::post_all(&[addr], signing, &bodies, per_request > 1, 8),
            )
        };
        let (per_device, shared_rate) = alternate(
            3,
            || post(&devices, device_server.local_addr()),
            || post(&shared, addrs[0]),
        );
        println!(
            "| ingest, {per_request} event(s)/request, per-device keys (v1a, 1,000 in the registry) | {} events | {} (shared secret) | {:.2}× | ≥ 0.9× |",
            per_s(per_device),
            per_s(shared_rate),
            per_device / shared_rate,
        );
    }
    // Stream numbers and accounting (issue 58): the same events with numbers and a stream's
    // accounting every hundred requests, against the same without either, same server.
    for (events, per_request) in [(4_000, 1), (50_000, 100)] {
        let post = |numbered: bool| {
            let bodies = support_ingest::bodies_numbered(
                &next_run(),
                events,
                per_request,
                &shared,
                numbered,
            );
            rate(
                events,
                support_ingest::post_all(&addrs[..1], &shared, &bodies, per_request > 1, 8),
            )
        };
        let (numbered, plain) = alternate(3, || post(true), || post(false));
        println!(
            "| ingest, {per_request} event(s)/request, with stream numbers and accounting | {} events | {} (without either) | {:.2}× | ≥ 0.9× |",
            per_s(numbered),
            per_s(plain),
            numbered / plain,
        );
    }
    // The streams' summaries (issue 65): the same numbered events and accountings, to one
    // server that keeps the summaries and one that does not (same PostgreSQL). Every
    // request of the shared secret is of one source and stream, so the eight clients'
    // requests all merge into one summary row: the worst case for its lock.
    let unsummarized = IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().expect("an address"), postgres.url())
            .secret(secret.clone())
            .threads(8)
            .without_fleet_summaries_for_bench(),
    )
    .expect("the ingest server starts");
    for (events, per_request) in [(4_000, 1), (50_000, 100)] {
        let post = |addr| {
            let bodies =
                support_ingest::bodies_numbered(&next_run(), events, per_request, &shared, true);
            rate(
                events,
                support_ingest::post_all(&[addr], &shared, &bodies, per_request > 1, 8),
            )
        };
        let (with, without) = alternate(3, || post(addrs[0]), || post(unsummarized.local_addr()));
        println!(
            "| ingest, {per_request} event(s)/request, keeping the streams' summaries | {} events | {} (without them) | {:.2}× | {} |",
            per_s(with),
            per_s(without),
            with / without,
            if per_request > 1 { "≥ 0.9×" } else { "" },
        );
    }
    unsummarized.shutdown();
    device_server.shutdown();
    for server in servers {
        server.shutdown();
    }
}
