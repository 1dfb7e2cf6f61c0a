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
//!   connections wait in the kernel's listen queue until one closes.
//! - **request head** (`read_timeout`): a head not complete within it closes the connection,
//!   also the wait for the next request on an idle keep-alive connection.
//! - **before the body**: a length declared over `max_body` (413), a source no key may sign
//!   for or no source and no any-source secret (401), missing webhook headers or a
//!   timestamp outside the tolerance (401), a source over `max_rate_per_source` (429 with
//!   `Retry-After`), a declared length (or, undeclared, `max_body`) that does not fit the
//!   budget of bytes in flight across all connections (503 with `Retry-After: 1`); each
//!   closes the connection with the body unread.
//! - **request body** (`read_timeout`, `max_body`): a body not complete within the timeout
//!   gets 408; one found larger than `max_body` gets 413; both close. A gzip body
//!   (`Content-Encoding: gzip`; any other encoding is 415 before the body) is decoded through
//!   a reader that stops past `max_body` decoded bytes or 100 times its size on the wire,
//!   whichever is less: 413, and close, with nothing more decoded. After it, a signature
//!   by none of the source's keys is 401, an event of another source 403.
//! - **database queue** (four jobs per database thread): full, a request gets 503 with
//!   `Retry-After: 1` at once, rather than waiting behind the others.
//! - **answers** are at most a few hundred bytes: they fit the socket's buffer, so a client
//!   that does not read cannot hold a thread either.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use super::admission::{InflightBudget, RefusalLog, SourceRate};
use super::keys::{Entry, Origin, Registry};
use super::lock;
use super::metrics::Metrics;
use super::store::{unstorable, Columns};
use super::workers::{Job, Outcome, Work, Workers};
use super::write_deadline::WriteDeadline;
use sqlite_outbox::receive::{
    check_encoding, decode_body, verify_request, DecodeError, ReceiveError,
};
use sqlite_outbox::wire::{decode_source_header, SOURCE_HEADER};

/// How long a request waits for its database job before it is answered 503.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// The `Retry-After` of a 503 because PostgreSQL is down or failing, in seconds.
const RETRY_AFTER_UNAVAILABLE: &str = "5";
/// The `Retry-After` of a 503 because the database queue is full, in seconds.
const RETRY_AFTER_OVERLOADED: &str = "1";
/// How often the background probe checks PostgreSQL for `/healthz`.
const HEALTH_PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often the table of device keys is read again though its change counter did not
/// move: a key revoked at a time in the future stops counting within this.
const KEYS_TABLE_REREAD: Duration = Duration::from_secs(30);
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
    pub workers: Workers,
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
    /// What `/healthz` answers. Set by the background probe, and to unhealthy at once by a
    /// store that fails: a health check never takes a place in the database queue (one
    /// that comes before the first probe's answer waits for it).
    pub health: watch::Sender<Health>,
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
    fn set_health(&self, health: Health) {
        self.health.send_replace(health);
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

    /// Counts and (at most once a minute per source) logs a refusal; never logs a key.
    fn refuse(&self, source: Option<&str>, reason: &'static str, detail: &str) {
        self.metrics.refusal(reason);
        let Some(source) = source else {
            return;
        };
        if self
            .refusal_log
            .should_log(source, reason, std::time::Instant::now())
        {
            log::warn!("ingest: refused a request for source {source:?}: {reason}: {detail}");
        }
        let mut by_source = lock(&self.refusals_by_source);
        if by_source.len() < MAX_REFUSING_SOURCES || by_source.contains_key(source) {
            *by_source.entry(source.to_string()).or_default() += 1;
        }
    }

    fn take_refusals(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *lock(&self.refusals_by_source))
            .into_iter()
            .collect()
    }
}

/// One probe of PostgreSQL.
async fn probe_once(state: &State) -> Health {
    match run(state, Work::Health).await {
        Outcome::Healthy | Outcome::Stored(_) | Outcome::Keys { .. } => Health::Healthy,
        Outcome::Unavailable(why) | Outcome::Rejected(why) => Health::Unhealthy(why),
        Outcome::Overloaded => Health::Unhealthy("every database thread is busy".to_string()),
    }
}

/// Checks PostgreSQL every [`HEALTH_PROBE_EVERY`] for `/healthz`, re-reads the table of
/// device keys when it changed (or every [`KEYS_TABLE_REREAD`], for keys revoked at a time
/// in the future), and adds the refusals counted since to `outbox_sources`; until shutdown.
async fn probe_health(state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    let mut keys_seen: Option<(i64, std::time::Instant)> = None;
    loop {
        let health = probe_once(&state).await;
        let healthy = health == Health::Healthy;
        state.set_health(health);
        if healthy && state.keys_table {
            reload_keys_table(&state, &mut keys_seen).await;
        }
        let refusals = state.take_refusals();
        if healthy && !refusals.is_empty() {
            let _ = run(&state, Work::AddRefusals(refusals)).await;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(HEALTH_PROBE_EVERY) => {}
        }
    }
}

/// Re-reads `outbox_device_keys` when its change counter moved or it was read long ago.
async fn reload_keys_table(state: &State, seen: &mut Option<(i64, std::time::Instant)>) {
    let Outcome::Keys { changes, .. } = run(state, Work::KeysChanges).await else {
        return;
    };
    if seen.is_some_and(|(at, when)| at == changes && when.elapsed() < KEYS_TABLE_REREAD) {
        return;
    }
    let Outcome::Keys { changes, rows } = run(state, Work::LoadKeys).await else {
        return;
    };
    let mut entries = Vec::with_capacity(rows.len());
    for (key_id, pattern, key) in rows {
        match Entry::parse(&key_id, &pattern, &key) {
            Ok(entry) => entries.push(entry),
            Err(why) => log::error!("ingest: outbox_device_keys: {why}; that row is skipped"),
        }
    }
    let loaded = entries.len();
    let total = state.keys.replace(Origin::Table, entries);
    if seen.is_none_or(|(at, _)| at != changes) {
        log::info!("ingest: {loaded} keys from outbox_device_keys ({total} in all)");
    }
    *seen = Some((changes, std::time::Instant::now()));
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
    let probe = tokio::spawn(probe_health(Arc::clone(&state), shutdown.clone()));
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
                    log::warn!("ingest: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
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
                    let mut response = handle(request, &state).await;
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
                log::debug!("ingest: connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
    // Every permit back means every connection is done.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all)).await;
    // The probe may be waiting for its database job: it is not joined, only stopped.
    probe.abort();
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
                    let response = if request.uri().path() != "/metrics" {
                        text(StatusCode::NOT_FOUND, "GET /metrics")
                    } else if request.method() != Method::GET {
                        allow_get_head(text(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics"))
                    } else {
                        let mut response = text(
                            StatusCode::OK,
                            &state
                                .metrics
                                .render(state.inflight.in_flight(), state.workers.queue_depth()),
                        );
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
async fn handle(request: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
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
    receive_events(request, state).await
}

/// A `POST` to the events path. Everything that needs no body is checked before a byte of
/// it is read: the declared length, the source and its keys, the webhook headers and the
/// timestamp, the source's rate, and room in the budget of bytes in flight.
async fn receive_events(request: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
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
        Some(value) => match decode_source_header(value.as_bytes()) {
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
    // Only the keys that may sign for this source are tried. Without the header (a relay
    // older than it), only keys for any source (`--secret`) can verify.
    let Some(verifier) = state.keys.verifier_for(source.as_deref()) else {
        let (reason, why) = match &source {
            Some(_) => ("unknown_source", "no key may sign for this source"),
            None => (
                "missing_source",
                "the request names no source in outbox-source, and no key signs for any source",
            ),
        };
        state.refuse(source.as_deref(), reason, why);
        return close(text(StatusCode::UNAUTHORIZED, &format!("{reason}: {why}")));
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
    let named = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Err(e) = verifier.verify_headers(named, now) {
        state.refuse(source.as_deref(), e.kind(), &e.to_string());
        return close(text(
            StatusCode::UNAUTHORIZED,
            &format!("{}: {e}", e.kind()),
        ));
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
    // A body of unknown length may take up to the limit.
    let reserve = declared.map_or(state.max_body, |n| n as usize);
    let Some(_reservation) = state.inflight.reserve(reserve) else {
        state.refuse(source.as_deref(), "inflight_budget", "");
        let mut refused = close(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many request bytes in flight (--max-inflight-bytes); retry soon",
        ));
        refused.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_OVERLOADED),
        );
        return refused;
    };
    let body = Limited::new(request.into_body(), state.max_body).collect();
    let body = match tokio::time::timeout(state.read_timeout, body).await {
        Err(_) => {
            return close(text(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the body did not arrive within {:?}", state.read_timeout),
            ))
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return too_large(state.max_body)
        }
        Ok(Err(e)) => return close(text(StatusCode::BAD_REQUEST, &format!("body: {e}"))),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    // `--max-body` bounds the decoded body too, and decoding stops at it (or at a ratio of
    // 100): a zip bomb costs at most that much. Signatures are over the decoded body.
    let body = match decode_body(content_encoding.as_deref(), &body, state.max_body) {
        Ok(body) => body,
        Err(e @ DecodeError::TooLarge { .. }) => {
            state.refuse(source.as_deref(), "too_large", &e.to_string());
            return close(text(StatusCode::PAYLOAD_TOO_LARGE, &e.to_string()));
        }
        Err(e) => return close(text(StatusCode::BAD_REQUEST, &e.to_string())),
    };
    let events = match verify_request(&verifier, &headers, &body, now) {
        Ok(events) => events,
        Err(ReceiveError::Signature(e)) => {
            state.refuse(source.as_deref(), e.kind(), &e.to_string());
            return text(StatusCode::UNAUTHORIZED, &format!("{}: {e}", e.kind()));
        }
        Err(ReceiveError::Body(e)) => {
            return text(StatusCode::BAD_REQUEST, &format!("not CloudEvents: {e}"))
        }
        Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let (Some(rate), Some(source)) = (&state.rate, &source) {
        rate.take(source, std::time::Instant::now());
    }
    // A key signs for its sources only: an event of another source in a request signed
    // for this one is forged (or a relay mixing sources), and nothing of it is stored.
    if let Some(source) = &source {
        if let Some(other) = events.iter().find(|e| &e.source != source) {
            let why = format!(
                "event {} has source {:?}, but the request is signed for {source:?}",
                other.id, other.source
            );
            state.refuse(Some(source), "forged_source", &why);
            return text(StatusCode::FORBIDDEN, &format!("forged_source: {why}"));
        }
    }
    let refused = unstorable(&events);
    if !refused.is_empty() {
        return unprocessable(&refused);
    }
    let columns = match Columns::new(events) {
        Ok(columns) => columns,
        Err(why) => return text(StatusCode::BAD_REQUEST, &why),
    };
    if columns.len() == 0 {
        return text(StatusCode::BAD_REQUEST, "the batch holds no event");
    }
    match run(state, Work::Store(Box::new(columns))).await {
        Outcome::Stored(new) => {
            state.metrics.stored(new);
            // How many of the request's events were new; repeats are answered 204 too.
            let mut response = empty(StatusCode::NO_CONTENT);
            response.headers_mut().insert(
                "outbox-stored",
                HeaderValue::from_str(&new.to_string()).unwrap_or(HeaderValue::from_static("0")),
            );
            response
        }
        Outcome::Healthy | Outcome::Keys { .. } => empty(StatusCode::NO_CONTENT),
        Outcome::Rejected(why) => text(StatusCode::BAD_REQUEST, &why),
        Outcome::Unavailable(why) => {
            // Unhealthy at once, until the probe succeeds again.
            state.set_health(Health::Unhealthy(why.clone()));
            unavailable(&why, RETRY_AFTER_UNAVAILABLE)
        }
        Outcome::Overloaded => overloaded(),
    }
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
