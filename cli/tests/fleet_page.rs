//! The fleet at a glance (issue 58, item 5): `GET /fleet` on the ingest's metrics listener,
//! read by a real browser (Debian's chromium, headless, at a phone's width) against a real
//! ingest and PostgreSQL; the fleet's totals in `/metrics`, with no label per source.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/ingest_process.rs"]
mod ingest_process;
#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;

use std::process::Command;
use std::time::Duration;

use ingest_process::Ingest;
use pg::Postgres;
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A device `source` with `n` events, of which the numbers in `deleted` are deleted by hand
/// before its relay delivers the rest to `url`.
fn device(dir: &std::path::Path, source: &str, n: usize, deleted: &[i64], url: &str) {
    let outbox = Outbox::builder()
        .default_source(source)
        .route("*", "fleet")
        .open(dir.join(format!("{}.db", source.replace('/', "_"))))
        .unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..n {
                let _ = outbox.enqueue(tx, Event::new("reading", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // Deleted by hand before any relay saw them: the n-th event takes number n.
    for seq in deleted {
        outbox
            .connection()
            .unwrap()
            .execute(
                "DELETE FROM outbox_events WHERE payload = json_object('i', ?1 - 1)",
                [seq],
            )
            .unwrap();
    }
    let relay = outbox
        .relay(common::fast(
            RelayConfig::new().destination(Destination::http("fleet", url).secret(SECRET)),
        ))
        .start()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(30), || {
        outbox.pending_count(None).unwrap() == 0
    }));
    let _ = relay.shutdown();
}

/// The page as a headless chromium renders it at a phone's width: its DOM.
fn browse(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--window-size=390,844",
            &format!("--user-data-dir={}", profile.path().display()),
            "--dump-dom",
            url,
        ])
        .output()
        .expect("chromium (Debian package chromium; scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_fleet_page_shows_every_stream_the_incomplete_first_in_a_real_browser() {
    let postgres = Postgres::start();
    let ingest = Ingest::start(
        &postgres,
        &[
            "--secret",
            SECRET,
            "--metrics-listen",
            "127.0.0.1:0",
            "--fleet-refresh",
            "1s",
        ],
    );
    assert!(ingest.wait_healthy(Duration::from_secs(20)));
    let dir = tempfile::tempdir().unwrap();
    device(dir.path(), "/devices/a-complete", 3, &[], &ingest.url());
    device(
        dir.path(),
        "/devices/b-<lossy>",
        6,
        &[2, 4, 5],
        &ingest.url(),
    );
    let page_url = format!("http://{}/fleet", ingest.metrics.unwrap());
    assert!(common::wait_until(Duration::from_secs(20), || {
        ingest.metrics().contains("outbox_ingest_fleet_streams 2")
    }));

    let dom = browse(&page_url);
    // Both streams, the incomplete one first, its missing numbers named, the device's
    // source shown as text (escaped), and no script anywhere.
    let rows: Vec<&str> = dom.split("<tr class=\"").skip(1).collect();
    assert_eq!(rows.len(), 2, "{dom}");
    assert!(rows[0].starts_with("incomplete"), "{dom}");
    assert!(rows[0].contains("/devices/b-&lt;lossy&gt;"), "{dom}");
    assert!(rows[0].contains("<td>2, 4–5</td>"), "{dom}");
    assert!(rows[1].starts_with("complete"), "{dom}");
    assert!(rows[1].contains("/devices/a-complete"));
    assert!(rows[1].contains("3 of 3"));
    assert!(dom.contains("2 streams, 1 incomplete"), "{dom}");
    assert!(!dom.contains("<script"), "{dom}");
    assert!(dom.contains("name=\"viewport\""), "{dom}");

    // The totals, with no label per source; the events port serves no page.
    let metrics = ingest.metrics();
    assert!(
        metrics.contains("outbox_ingest_fleet_streams_missing 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outbox_ingest_fleet_missing_events 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outbox_ingest_fleet_reused_numbers 0"),
        "{metrics}"
    );
    assert!(!metrics.contains("/devices/"), "{metrics}");
    let on_events_port = raw_http::request(ingest.addr, "GET", "/fleet", &[], b"").unwrap();
    assert_eq!(on_events_port.status, 404);
    let page = raw_http::request(ingest.metrics.unwrap(), "GET", "/fleet", &[], b"").unwrap();
    assert_eq!(page.status, 200);
}
