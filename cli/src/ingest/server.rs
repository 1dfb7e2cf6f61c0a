//! The HTTP side of `outbox ingest`.
//!
//! Why hyper on a private runtime and not a synchronous server crate: the synchronous ones
//! checked (tiny_http, rouille, astra, oxhttp; `../shared/REFERENCE-2.md` §6) either stall
//! when four keep-alive clients arrive together, or bound each socket read but not the
//! whole header, so a client that sends one byte just inside every read timeout (slowloris)
//! holds a thread for as long as it likes; and none can be stopped and joined. hyper has a
//! header-read deadline and a clean shutdown; its runtime is private (two named threads) and
//! nothing async is in the crate's API. PostgreSQL work runs on the database threads of
//! [`workers`](super::workers), never on the runtime.
//!
//! Limits, and what happens at each:
//! - **open connections** (`max_connections`): past the cap the server stops accepting; new
//!   connections wait in the kernel's listen queue until one closes. One address may hold
//!   `max_connections_per_peer` of them: the next is answered 503 with `Retry-After: 1` and
//!   closed.
//! - **request head** (`read_timeout`, 64 KiB): a head not complete within the timeout
//!   closes the connection, also the wait for the next request on an idle keep-alive
//!   connection; a longer head gets 431.
//! - **before the body**: a length declared over `max_body` (413); an `outbox-source` over
//!   [`MAX_SOURCE_BYTES`] (400, before anything is counted or kept for it); missing webhook
//!   headers or a timestamp outside the tolerance (401); a source no key may sign for, or no
//!   source and no any-source secret (401, the same answer as a bad signature, so it does
//!   not tell which sources are registered; 503 with `Retry-After` while the table of
//!   device keys has not been read yet); a source over `max_rate_per_source` (429 with
//!   `Retry-After`); each closes the connection with the body unread.
//! - **request body** (`read_timeout`, `min_body_rate`, `max_body`): the bytes that arrive
//!   are held in the budget of bytes in flight across all connections
//!   (`max_inflight_bytes`) and in the share of one address (`max_inflight_bytes_per_peer`)
//!   as they arrive, not as declared, so a connection that declares a megabyte and sends
//!   nothing holds nothing; past either, 503 with `Retry-After: 1`. A body not complete
//!   within the timeout, or arriving slower than `min_body_rate` after its first
//!   [`BODY_RATE_GRACE`], gets 408; one found larger than `max_body` gets 413; all close.
//! - **verification** (on threads of its own, four requests queued per thread; full, 503
//!   with `Retry-After: 1`): a gzip body (`Content-Encoding: gzip`; any other encoding is
//!   415 before the body) is decoded through a reader that stops past `max_body` decoded
//!   bytes or 100 times its size on the wire, whichever is less (413), and its decoded
//!   bytes are held in the budgets too. A signature by none of the source's keys is 401
//!   (one Ed25519 check per key of the source at most), an event of another source 403.
//! - **database queue** (four jobs per database thread): full, a request gets 503 with
//!   `Retry-After: 1` at once, rather than waiting behind the others.
//! - **answers** are at most a few hundred bytes: they fit the socket's buffer, so a client
//!   that does not read cannot hold a thread either.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use super::admission::{InflightBudget, Over, PeerConnections, RefusalLog, SourceRate};
use super::fleet_page::FleetSnapshot;
use super::keys::Registry;
use super::metrics::Metrics;
use super::verification::{self, Checked, VerifyPool};
use super::workers::{Job, Outcome, Work, Workers};
use super::write_deadline::WriteDeadline;
use super::{lock, loggable};
use sqlite_outbox::receive::{check_encoding, ReceiveError, Verifier, VerifyError};
use sqlite_outbox::wire::{
    decode_source_header, Receipt, ACCOUNTING_HEADER, RECEIPT_HEADER, SOURCE_HEADER,
};

/// How long a request waits for its database job before it is answered 503.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// The `Retry-After` of a 503 because PostgreSQL is down or failing, in seconds.
const RETRY_AFTER_UNAVAILABLE: &str = "5";
/// The `Retry-After` of a 503 because the database queue is full, in seconds.
const RETRY_AFTER_OVERLOADED: &str = "1";
/// The longest `outbox-source` taken, in bytes (decoded): a longer one is refused before
/// anything is counted, logged or kept for it.
pub const MAX_SOURCE_BYTES: usize = 1024;
/// The longest request head (request line and headers) taken; past it 431.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// How long a body may take before `min_body_rate` is enforced (a connection's first
/// bytes may wait for a TCP window or a radio waking up).
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(2);
/// How often a body that is not arriving is checked against the rate and the timeout.
const BODY_CHECK_EVERY: Duration = Duration::from_millis(250);
/// The `Retry-After` of a 503 because the table of device keys has not been read yet.
const RETRY_AFTER_KEYS_NOT_READ: &str = "5";
/// Open connections to the metrics listener at most.
const METRICS_CONNECTIONS: usize = 16;
/// How long a health check before the first probe's answer waits for it.
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(5);
/// How long shutdown lets open connections finish their request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What every connection's requests need.
pub(crate) struct State {
    pub keys: Registry,
    /// Whether keys come from the table `outbox_device_keys` too (re-read when it changes).
    pub keys_table: bool,
    /// Whether that table was read once: until then a source no loaded key covers may be
    /// a provisioned device, and gets 503, not 401 (which its relay would take as final).
    pub keys_table_loaded: std::sync::atomic::AtomicBool,
    pub workers: Workers,
    pub verify: VerifyPool,
    pub peers: PeerConnections,
    /// Bytes a second a body must arrive at, after [`BODY_RATE_GRACE`].
    pub min_body_rate: usize,
    pub events_path: String,
    pub max_body: usize,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub max_requests_per_connection: usize,
    pub inflight: InflightBudget,
    pub rate: Option<SourceRate>,
    pub metrics: Metrics,
    pub refusal_log: RefusalLog,
    /// Refusals by source since they were last added to `outbox_sources` (bounded).
    pub refusals_by_source: std::sync::Mutex<HashMap<String, u64>>,
    /// What `/healthz` answers. Set by the probe (its own connection, see
    /// [`probe`](super::probe)), and to unhealthy at once by a store that fails; a health
    /// check that comes before the first probe's answer waits for it.
    pub health: watch::Sender<Health>,
    /// The key receipts are signed with, if any.
    pub receipt_key: Option<sqlite_outbox::receive::SigningKey>,
    /// The fleet's view as the probe last read it, when a metrics listener serves it.
    pub fleet: Option<std::sync::Mutex<FleetSnapshot>>,
    /// How often the probe reads it again.
    pub fleet_refresh: Duration,
}

/// What the background probe last found of PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Health {
    NotProbedYet,
    Healthy,
    Unhealthy(String),
}

/// Sources whose refusals are kept for `outbox_sources` between two flushes, at most.
const MAX_REFUSING_SOURCES: usize = 10_000;

impl State {
    /// Records the probe's (or a failed store's) finding, and logs each change of it: an
    /// operator reads in the log why the ingest answers 503, in PostgreSQL's own words.
    pub(crate) fn set_health(&self, health: Health) {
        let before = self.health.send_replace(health.clone());
        if before != health {
            match &health {
                Health::Unhealthy(why) => log::warn!("ingest: unhealthy: {}", loggable(why)),
                Health::Healthy if before != Health::NotProbedYet => {
                    log::info!("ingest: healthy again")
                }
                _ => {}
            }
        }
    }

    /// The probe's last finding; before its first, waits for it (up to a bound).
    async fn health(&self) -> Health {
        let mut found = self.health.subscribe();
        let first = found.wait_for(|health| *health != Health::NotProbedYet);
        let health = match tokio::time::timeout(FIRST_PROBE_WAIT, first).await {
            Ok(Ok(health)) => health.clone(),
            _ => Health::Unhealthy("PostgreSQL has not been checked yet".into()),
        };
        health
    }

    /// Counts and (at most once a minute per source) logs a refusal of a request for a
    /// registered `source` (or for none); never logs a key, and escapes every value from
    /// the request.
    fn refuse(&self, source: Option<&str>, reason: &'static str, detail: &str) {
        self.metrics.refusal(reason);
        let Some(source) = source else {
            return;
        };
        if self
            .refusal_log
            .should_log(source, reason, std::time::Instant::now())
        {
            log::warn!(
                "ingest: refused a request for source {}: {reason}: {}",
                loggable(source),
                loggable(detail)
            );
        }
        let mut by_source = lock(&self.refusals_by_source);
        if by_source.len() < MAX_REFUSING_SOURCES || by_source.contains_key(source) {
            *by_source.entry(source.to_string()).or_default() += 1;
        }
    }

    /// Counts a refusal of a request for a source no key is for: logged within one budget
    /// for all such sources, and nothing kept per name (anyone can invent names).
    fn refuse_unregistered(&self, source: &str, reason: &'static str) {
        self.metrics.refusal(reason);
        if self
            .refusal_log
            .should_log_unregistered(std::time::Instant::now())
        {
            log::warn!(
                "ingest: refused a request for source {}: {reason} (refusals of unregistered \
                 sources are logged {} times a minute at most)",
                loggable(source),
                RefusalLog::UNREGISTERED_PER_MINUTE
            );
        }
    }

    pub(crate) fn take_refusals(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *lock(&self.refusals_by_source))
            .into_iter()
            .collect()
    }
}

/// Accepts connections until `shutdown` turns true, at most `max_connections` open at once;
/// then lets open connections finish (up to a grace period) and returns.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    max_connections: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: pause rather than spin.
                    log::warn!("ingest: accept failed: {e:#}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Some(peer_connection) = state.peers.open(peer.ip()) else {
            state.metrics.refusal("peer_connections");
            // It keeps its place among the open connections until it is closed, so a flood
            // of them is bounded by `max_connections` like any other.
            tokio::spawn(refuse_connection(stream, permit));
            continue;
        };
        let state = Arc::clone(&state);
        let read_timeout = state.read_timeout;
        let write_timeout = state.write_timeout;
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            // Requests on this connection so far; the answer to the last one it may carry
            // closes it.
            let served = Arc::new(AtomicUsize::new(0));
            let service = hyper::service::service_fn(move |request| {
                let state = Arc::clone(&state);
                let served = Arc::clone(&served);
                async move {
                    let started = std::time::Instant::now();
                    let on_events_path = request.uri().path() == state.events_path;
                    let mut response = handle(request, peer.ip(), &state).await;
                    if on_events_path {
                        state
                            .metrics
                            .request(response.status().as_u16(), started.elapsed());
                    }
                    let n = served.fetch_add(1, Ordering::Relaxed) + 1;
                    if n >= state.max_requests_per_connection {
                        response
                            .headers_mut()
                            .insert(CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, write_timeout)),
                    service,
                );
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                log::debug!("ingest: connection from {peer}: {e:#}");
            }
            drop(peer_connection);
            drop(permit);
        });
    }
    // Every permit back means every connection is done.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all)).await;
}

/// How long a refused connection's answer may take to write: it fits the socket's buffer.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Answers a connection over its address's share 503 and closes it within a second: a
/// device behind the same address retries, and a hostile peer holds nothing for long.
async fn refuse_connection(
    mut stream: tokio::net::TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    use tokio::io::AsyncWriteExt;
    const WHY: &str = "too many connections from this address; retry soon\n";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: {RETRY_AFTER_OVERLOADED}\r\n\
         connection: close\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\n\r\n{WHY}",
        WHY.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
    drop(permit);
}

/// Serves `GET /metrics` on its own listener until `shutdown` turns true: short requests,
/// a few connections, never the events path.
pub(crate) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => return,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let state = Arc::clone(&state);
        let (read_timeout, write_timeout) = (state.read_timeout, state.write_timeout);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let state = Arc::clone(&state);
                async move {
                    let path = request.uri().path();
                    let fleet = state.fleet.as_ref().map(|f| lock(f).clone());
                    let response = if path != "/metrics" && path != "/fleet" {
                        text(StatusCode::NOT_FOUND, "GET /metrics or /fleet")
                    } else if request.method() != Method::GET {
                        allow_get_head(text(
                            StatusCode::METHOD_NOT_ALLOWED,
                            "GET /metrics or /fleet",
                        ))
                    } else if path == "/fleet" {
                        let mut response = text(StatusCode::OK, &fleet.unwrap_or_default().page());
                        response.headers_mut().insert(
                            CONTENT_TYPE,
                            HeaderValue::from_static("text/html; charset=utf-8"),
                        );
                        // Nothing from anywhere else, and no script at all.
                        response.headers_mut().insert(
                            "content-security-policy",
                            HeaderValue::from_static(
                                "default-src 'none'; style-src 'unsafe-inline'",
                            ),
                        );
                        response
                    } else {
                        let mut body = state
                            .metrics
                            .render(state.inflight.in_flight(), state.workers.queue_depth());
                        body.push_str(&fleet.unwrap_or_default().metrics());
                        let mut response = text(StatusCode::OK, &body);
                        response.headers_mut().insert(
                            CONTENT_TYPE,
                            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                        );
                        response
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                .keep_alive(false)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, write_timeout)),
                    service,
                );
            let _ = tokio::time::timeout(read_timeout + write_timeout, connection).await;
            drop(permit);
        });
    }
}

/// One request: `GET` or `HEAD /healthz`, or `POST` of signed CloudEvents to the events
/// path; any other path is 404.
async fn handle(
    request: Request<Incoming>,
    peer: std::net::IpAddr,
    state: &State,
) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if path == "/healthz" {
        // Only a health check: a POST here once got the health answer, a 200 for events
        // that were never stored, and a relay pointed at this path lost them.
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return allow_get_head(text(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!(
                    "/healthz answers GET and HEAD only; POST events to {}",
                    state.events_path
                ),
            ));
        }
        return match state.health().await {
            Health::Healthy => text(StatusCode::OK, "ok"),
            Health::Unhealthy(why) => unavailable(&why, RETRY_AFTER_UNAVAILABLE),
            Health::NotProbedYet => unavailable("not checked yet", RETRY_AFTER_OVERLOADED),
        };
    }
    if path != state.events_path {
        // A relay pointed at a wrong path learns it at once, rather than storing nothing.
        return close(text(
            StatusCode::NOT_FOUND,
            &format!("POST events to {}", state.events_path),
        ));
    }
    if request.method() != Method::POST {
        let mut refused = text(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("POST signed CloudEvents to {}", state.events_path),
        );
        refused
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return close(refused);
    }
    receive_events(request, peer, state).await
}

/// A `POST` to the events path. Everything that needs no body is checked before a byte of
/// it is read: the declared length, the source's length, the webhook headers and the
/// timestamp, the source and its keys, and the source's rate.
async fn receive_events(
    request: Request<Incoming>,
    peer: std::net::IpAddr,
    state: &State,
) -> Response<Full<Bytes>> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.max_body as u64) {
        state.refuse(None, "too_large", "");
        return too_large(state.max_body);
    }
    let content_encoding = request
        .headers()
        .get(CONTENT_ENCODING)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Err(e) = check_encoding(content_encoding.as_deref()) {
        state.refuse(None, "unsupported_encoding", "");
        return close(text(StatusCode::UNSUPPORTED_MEDIA_TYPE, &e.to_string()));
    }
    let source = match request.headers().get(SOURCE_HEADER) {
        None => None,
        // Three bytes a character at most on the wire (`%XX`): longer cannot decode short.
        Some(value) if value.len() > 3 * MAX_SOURCE_BYTES => {
            return source_too_long(state);
        }
        Some(value) => match decode_source_header(value.as_bytes()) {
            Some(source) if source.len() > MAX_SOURCE_BYTES => return source_too_long(state),
            Some(source) => Some(source),
            None => {
                state.refuse(None, "malformed_source_header", "");
                return close(text(
                    StatusCode::BAD_REQUEST,
                    "outbox-source is not a percent-encoded UTF-8 source",
                ));
            }
        },
    };
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    // The headers and the timestamp first: their answers are the same for every source, so
    // they do not tell which sources are registered.
    let named = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Err(e) = Verifier::with_keys([]).verify_headers(named, now) {
        state.metrics.refusal(e.kind());
        return close(text(
            StatusCode::UNAUTHORIZED,
            &format!("{}: {e:#}", e.kind()),
        ));
    }
    // Only the keys that may sign for this source are tried, from one snapshot of the
    // registry. Without the header (a relay older than it), only keys for any source
    // (`--secret`) can verify.
    let registry = state.keys.current();
    if !registry.covers(source.as_deref()) {
        if state.keys_table && !state.keys_table_loaded.load(Ordering::Acquire) {
            // Maybe a provisioned device: the table that would say so has not been read.
            state.metrics.refusal("keys_not_read");
            return close(unavailable(
                "the table of device keys has not been read yet; retry soon",
                RETRY_AFTER_KEYS_NOT_READ,
            ));
        }
        match &source {
            Some(source) => state.refuse_unregistered(source, "unknown_source"),
            None => state.refuse(None, "missing_source", ""),
        }
        // The answer to a bad signature, word for word.
        return close(not_signed());
    }
    if let (Some(rate), Some(source)) = (&state.rate, &source) {
        if let Err(wait) = rate.check(source, std::time::Instant::now()) {
            state.refuse(Some(source), "rate_limited", "over --max-rate-per-source");
            let mut refused = close(text(
                StatusCode::TOO_MANY_REQUESTS,
                "this source sends more requests a second than --max-rate-per-source allows",
            ));
            let seconds = wait.as_secs() + 1;
            refused.headers_mut().insert(
                RETRY_AFTER,
                HeaderValue::from_str(&seconds.to_string())
                    .unwrap_or(HeaderValue::from_static("1")),
            );
            return refused;
        }
    }
    let mut reservation = state.inflight.reservation(peer);
    let body = match read_body(
        request.into_body(),
        &mut reservation,
        state,
        source.as_deref(),
    )
    .await
    {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let encoded = content_encoding.is_some();
    let webhook_id = headers
        .iter()
        .find(|(name, _)| name == "webhook-id")
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    let checking = state.verify.submit(verification::Request {
        registry,
        headers,
        content_encoding,
        body,
        max_body: state.max_body,
        now,
    });
    let Some(checking) = checking else {
        state.refuse(source.as_deref(), "verify_queue", "");
        return overloaded();
    };
    let columns = match checking.await {
        Err(_) => return overloaded(),
        Ok(Checked::Ready { columns, decoded }) => {
            // A decoded body is held beside the one that arrived, until it is stored.
            if encoded {
                if let Err(over) = reservation.grow(decoded) {
                    return over_budget(state, source.as_deref(), over);
                }
            }
            columns
        }
        Ok(Checked::TooLarge(why)) => {
            state.refuse(source.as_deref(), "too_large", &why);
            return close(text(StatusCode::PAYLOAD_TOO_LARGE, &why));
        }
        Ok(Checked::Malformed(why)) => return close(text(StatusCode::BAD_REQUEST, &why)),
        Ok(Checked::Unstorable(refused)) => return unprocessable(&refused),
        Ok(Checked::Refused(e)) => return refused_by_registry(state, source.as_deref(), &e),
    };
    if let (Some(rate), Some(source)) = (&state.rate, &source) {
        rate.take(source, std::time::Instant::now());
    }
    // What a receipt would say, taken before the columns go to the database thread.
    let receipt = state.receipt_key.as_ref().map(|_| columns.receipt_facts());
    match run(state, Work::Store(columns)).await {
        Outcome::Stored(new) => {
            state.metrics.stored(new);
            // How many of the request's events were new; repeats are answered 204 too.
            let mut response = empty(StatusCode::NO_CONTENT);
            // This receiver takes streams' accounting: a relay left to its default starts
            // telling it (a generic receiver never says so, and never gets them).
            response
                .headers_mut()
                .insert(ACCOUNTING_HEADER, HeaderValue::from_static("1"));
            response.headers_mut().insert(
                "outbox-stored",
                HeaderValue::from_str(&new.to_string()).unwrap_or(HeaderValue::from_static("0")),
            );
            // Only now, with every event of the request stored (newly or before).
            if let (Some(key), Some((source, stream, numbers))) = (&state.receipt_key, receipt) {
                let time = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                let signed = Receipt::new(source, stream, numbers, webhook_id, time).signed(key);
                if let Ok(value) = HeaderValue::from_str(&signed) {
                    response.headers_mut().insert(RECEIPT_HEADER, value);
                }
            }
            response
        }
        Outcome::Rejected(why) => text(StatusCode::BAD_REQUEST, &why),
        Outcome::Refused { reason, why } => {
            state.refuse(source.as_deref(), reason, &why);
            text(StatusCode::UNPROCESSABLE_ENTITY, &why)
        }
        Outcome::Unavailable(why) => {
            // Unhealthy at once, until the probe succeeds again.
            state.set_health(Health::Unhealthy(why.clone()));
            unavailable(&why, RETRY_AFTER_UNAVAILABLE)
        }
        Outcome::Overloaded => overloaded(),
    }
}

/// Reads a body as it arrives, holding each piece in the budgets of bytes in flight: the
/// whole body, or the answer that refuses it (408, 413, 503, 400).
async fn read_body(
    mut incoming: Incoming,
    reservation: &mut super::admission::Reservation<'_>,
    state: &State,
    source: Option<&str>,
) -> Result<Vec<u8>, Response<Full<Bytes>>> {
    let started = std::time::Instant::now();
    let mut body = Vec::new();
    loop {
        let elapsed = started.elapsed();
        if elapsed >= state.read_timeout {
            state.refuse(source, "body_timeout", "");
            return Err(close(text(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the body did not arrive within {:?}", state.read_timeout),
            )));
        }
        if let Some(late) = elapsed.checked_sub(BODY_RATE_GRACE) {
            let due = late.as_secs_f64() * state.min_body_rate as f64;
            if (body.len() as f64) < due {
                state.refuse(source, "slow_body", "");
                return Err(close(text(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!(
                        "the body arrives slower than {} bytes a second",
                        state.min_body_rate
                    ),
                )));
            }
        }
        let wait = (state.read_timeout - elapsed).min(BODY_CHECK_EVERY);
        // `frame` takes nothing until it is ready: dropping it at the timeout loses no byte.
        let frame = match tokio::time::timeout(wait, incoming.frame()).await {
            Err(_) => continue,
            Ok(None) => return Ok(body),
            Ok(Some(Err(e))) => {
                return Err(close(text(
                    StatusCode::BAD_REQUEST,
                    &format!("body: {e:#}"),
                )))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if body.len() + data.len() > state.max_body {
            state.refuse(source, "too_large", "");
            return Err(too_large(state.max_body));
        }
        if let Err(over) = reservation.grow(data.len()) {
            return Err(over_budget(state, source, over));
        }
        body.extend_from_slice(&data);
    }
}

/// 503 for bytes that do not fit the budget of bytes in flight (or the address's share).
fn over_budget(state: &State, source: Option<&str>, over: Over) -> Response<Full<Bytes>> {
    let (reason, why) = match over {
        Over::All => (
            "inflight_budget",
            "too many request bytes in flight (--max-inflight-bytes); retry soon",
        ),
        Over::Peer => (
            "peer_inflight_budget",
            "too many request bytes in flight from this address \
             (--max-inflight-bytes-per-peer); retry soon",
        ),
    };
    state.refuse(source, reason, "");
    close(unavailable(why, RETRY_AFTER_OVERLOADED))
}

/// The answer to a request the registry refused after its body was read.
fn refused_by_registry(
    state: &State,
    source: Option<&str>,
    error: &ReceiveError,
) -> Response<Full<Bytes>> {
    match error {
        ReceiveError::ForgedSource { .. } => {
            state.refuse(source, "forged_source", &error.to_string());
            text(StatusCode::FORBIDDEN, &format!("forged_source: {error:#}"))
        }
        ReceiveError::Signature(VerifyError::InvalidSignature) | ReceiveError::UnknownSource => {
            state.refuse(source, "invalid_signature", "");
            not_signed()
        }
        ReceiveError::Signature(e) => {
            state.refuse(source, e.kind(), &e.to_string());
            text(StatusCode::UNAUTHORIZED, &format!("{}: {e:#}", e.kind()))
        }
        other => close(text(StatusCode::BAD_REQUEST, &other.to_string())),
    }
}

/// 401 for a request no key of its source signed, and for a source no key is for: the
/// same words, so the answer does not tell which sources are registered.
fn not_signed() -> Response<Full<Bytes>> {
    text(
        StatusCode::UNAUTHORIZED,
        &format!(
            "{}: {}",
            VerifyError::InvalidSignature.kind(),
            VerifyError::InvalidSignature
        ),
    )
}

fn source_too_long(state: &State) -> Response<Full<Bytes>> {
    state.refuse(None, "source_too_long", "");
    close(text(
        StatusCode::BAD_REQUEST,
        &format!("outbox-source is longer than {MAX_SOURCE_BYTES} bytes"),
    ))
}

/// Runs `work` on a database thread; 503 outcomes when the queue is full or the job takes
/// too long.
async fn run(state: &State, work: Work) -> Outcome {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !state.workers.submit(Job { work, reply }) {
        return Outcome::Overloaded;
    }
    match tokio::time::timeout(JOB_TIMEOUT, answer).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Outcome::Unavailable("the database thread stopped".into()),
        Err(_) => Outcome::Unavailable(format!("no answer from PostgreSQL within {JOB_TIMEOUT:?}")),
    }
}

fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// 422 naming each event the store cannot hold and why, as JSON:
/// `{"refused": [{"id": …, "reason": …}, …]}`. Nothing of the request was stored.
fn unprocessable(refused: &[(String, String)]) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "refused": refused
            .iter()
            .map(|(id, reason)| serde_json::json!({"id": id, "reason": reason}))
            .collect::<Vec<_>>(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn allow_get_head(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

fn overloaded() -> Response<Full<Bytes>> {
    unavailable(
        "overloaded: every database thread is busy",
        RETRY_AFTER_OVERLOADED,
    )
}

fn unavailable(why: &str, retry_after: &'static str) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::SERVICE_UNAVAILABLE, why);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static(retry_after));
    response
}

fn too_large(limit: usize) -> Response<Full<Bytes>> {
    close(text(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the body is over the limit of {limit} bytes"),
    ))
}

/// Asks hyper to close the connection after this answer: the rest of the body is unread.
fn close(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    response
}
