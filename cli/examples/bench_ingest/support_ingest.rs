#![allow(dead_code)]
//! The ingest comparison of the bench example: signed CloudEvents posted to `ingest`
//! servers, one event per request or batches, against a bare loop of the same INSERT
//! statement over one PostgreSQL connection, in the same run.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sqlite_outbox::receive::{Secret, SigningKey};

/// The content types of one event and of a batch.
const ONE: &str = "application/cloudevents+json";
const BATCH: &str = "application/cloudevents-batch+json";

/// How requests are signed: one secret for the fleet, or each device with its own key.
pub enum Signing<'a> {
    /// Every request signed with this `whsec_` secret, all of source `/devices/bench`.
    Shared(&'a Secret),
    /// Request `i` from device `i % keys.len()`, source `/devices/bench-{device}`, signed
    /// with that device's key (`v1a`) and naming its source in `outbox-source`.
    Devices(&'a [SigningKey]),
}

impl Signing<'_> {
    /// The source of request `i`.
    pub fn source(&self, i: usize) -> String {
        match self {
            Signing::Shared(_) => "/devices/bench".to_string(),
            Signing::Devices(keys) => format!("/devices/bench-{}", i % keys.len()),
        }
    }
}

fn event(run: &str, i: usize, source: &str) -> serde_json::Value {
    let mut event = unnumbered_event(run, i, source);
    event["outboxstream"] = json!("default");
    event["outboxseq"] = json!(i + 1);
    event
}

/// An event as a relay before issue 58 sent it: no stream number.
fn unnumbered_event(run: &str, i: usize, source: &str) -> serde_json::Value {
    json!({
        "specversion": "1.0", "id": format!("{run}-{i}"), "source": source,
        "type": "reading.taken", "partitionkey": format!("k{}", i % 16),
        "sequence": format!("{:020}", i), "time": "2026-11-30T12:00:00.000Z",
        "datacontenttype": "application/json",
        "data": {"sensor": "s-1", "celsius": 21.5, "n": i}
    })
}

/// A stream's accounting as a relay tells it after `events` events, a few of them dead.
fn accounting(run: &str, n: usize, source: &str, events: usize) -> serde_json::Value {
    let high = events as i64;
    json!({
        "specversion": "1.0", "id": format!("{run}-accounting-{n}"), "source": source,
        "type": sqlite_outbox::wire::ACCOUNTING_TYPE, "time": "2026-11-30T12:00:00.000Z",
        "datacontenttype": "application/json",
        "data": {"stream": "default", "high_water": high, "pending": [[high, high]],
                 "accounted": {"dead": [[3, 3], [50, 51]], "expired": [[7, 7]]}}
    })
}

/// Request bodies as [`bodies`], with stream numbers and, after every hundredth request, a
/// stream's accounting (`numbered`), or without either, as a relay before issue 58.
pub fn bodies_numbered(
    run: &str,
    events: usize,
    per_request: usize,
    signing: &Signing,
    numbered: bool,
) -> Vec<Vec<u8>> {
    let make = |i: usize, source: &str| {
        if numbered {
            event(run, i, source)
        } else {
            unnumbered_event(run, i, source)
        }
    };
    let mut out = Vec::new();
    for (request, chunk) in (0..events)
        .collect::<Vec<_>>()
        .chunks(per_request)
        .enumerate()
    {
        let source = signing.source(request);
        let body = if per_request == 1 {
            make(chunk[0], &source)
        } else {
            json!(chunk.iter().map(|&i| make(i, &source)).collect::<Vec<_>>())
        };
        out.push(serde_json::to_vec(&body).unwrap());
        if numbered && request % 100 == 99 {
            let told = accounting(run, request, &source, chunk[chunk.len() - 1] + 1);
            let told = if per_request == 1 {
                told
            } else {
                json!([told])
            };
            out.push(serde_json::to_vec(&told).unwrap());
        }
    }
    out
}

/// Request bodies for `events` events, `per_request` in each, of the sources `signing` gives
/// each request.
pub fn bodies(run: &str, events: usize, per_request: usize, signing: &Signing) -> Vec<Vec<u8>> {
    (0..events)
        .collect::<Vec<_>>()
        .chunks(per_request)
        .enumerate()
        .map(|(request, chunk)| {
            let source = signing.source(request);
            if per_request == 1 {
                serde_json::to_vec(&event(run, chunk[0], &source)).unwrap()
            } else {
                let items: Vec<_> = chunk.iter().map(|&i| event(run, i, &source)).collect();
                serde_json::to_vec(&items).unwrap()
            }
        })
        .collect()
}

/// Posts `bodies`, signed, over `connections` keep-alive connections spread over `servers`;
/// how long until every one was answered 204.
pub fn post_all(
    servers: &[SocketAddr],
    signing: &Signing,
    bodies: &[Vec<u8>],
    batch: bool,
    connections: usize,
) -> Duration {
    let content_type = if batch { BATCH } else { ONE };
    let started = Instant::now();
    std::thread::scope(|s| {
        for c in 0..connections {
            let url = format!("http://{}/events", servers[c % servers.len()]);
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .proxy(None)
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .into();
            s.spawn(move || {
                for (i, body) in bodies.iter().enumerate().skip(c).step_by(connections) {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap()
                        .as_secs() as i64;
                    let id = format!("msg-{c}-{i}");
                    let request = agent
                        .post(&url)
                        .header("content-type", content_type)
                        .header("webhook-id", &id)
                        .header("webhook-timestamp", now.to_string());
                    let request = match signing {
                        Signing::Shared(secret) => {
                            request.header("webhook-signature", secret.sign(&id, now, body))
                        }
                        Signing::Devices(keys) => request
                            .header(
                                "webhook-signature",
                                keys[i % keys.len()].sign(&id, now, body),
                            )
                            .header("outbox-source", signing.source(i)),
                    };
                    let response = request.send(body).expect("post to ingest");
                    assert_eq!(response.status().as_u16(), 204, "ingest refused a request");
                }
            });
        }
    });
    started.elapsed()
}

/// The columns of one INSERT of events `chunk` of `run`.
type Columns = (
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<Option<String>>,
    Vec<Option<String>>,
    Vec<Option<i64>>,
    Vec<Option<String>>,
    Vec<Option<serde_json::Value>>,
    // traceparent, tracestate, dataschema: none, as the bench's events carry none.
    Vec<Option<String>>,
    Vec<Option<String>>,
    Vec<Option<String>>,
    // stream, stream_seq: as the relay numbers them.
    Vec<Option<String>>,
    Vec<Option<i64>>,
);

fn columns(run: &str, chunk: &[usize]) -> Columns {
    let mut columns: Columns = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for &i in chunk {
        let e = event(run, i, "/devices/bench");
        columns.0.push("/devices/bench".into());
        columns.1.push(format!("{run}-{i}"));
        columns.2.push("reading.taken".into());
        columns.3.push(None);
        columns.4.push(Some(format!("k{}", i % 16)));
        columns.5.push(Some(i as i64));
        columns.6.push(Some("2026-11-30T12:00:00.000Z".into()));
        columns.7.push(Some(e["data"].clone()));
        columns.8.push(None);
        columns.9.push(None);
        columns.10.push(None);
        columns.11.push(Some("default".into()));
        columns.12.push(Some(i as i64 + 1));
    }
    columns
}

/// The same INSERT statement as ingest, `per_statement` events each, one transaction per
/// statement, over one connection; the values are built before the clock starts.
pub fn bare_inserts(
    client: &mut postgres::Client,
    run: &str,
    events: usize,
    per_statement: usize,
) -> Duration {
    let statement = client.prepare(outbox_cli::INGEST_INSERT).unwrap();
    let all: Vec<Columns> = (0..events)
        .collect::<Vec<_>>()
        .chunks(per_statement)
        .map(|chunk| columns(run, chunk))
        .collect();
    let started = Instant::now();
    for c in &all {
        let mut tx = client.transaction().unwrap();
        tx.execute(
            &statement,
            &[
                &c.0, &c.1, &c.2, &c.3, &c.4, &c.5, &c.6, &c.7, &c.8, &c.9, &c.10, &c.11, &c.12,
                // The streams' numbers logged, as the ingest does.
                &true,
            ],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    started.elapsed()
}
