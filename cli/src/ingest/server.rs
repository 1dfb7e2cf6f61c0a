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
//! - **request body** (`read_timeout`, `max_body`): a body not complete within the timeout
//!   gets 408; one declared or found larger than `max_body` gets 413; both close.
//! - **database queue** (four jobs per database thread): full, a request gets 503 with
//!   `Retry-After: 1` at once, rather than waiting behind the others.
//! - **answers** are at most a few hundred bytes: they fit the socket's buffer, so a client
//!   that does not read cannot hold a thread either.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use super::store::{unstorable, Columns};
use super::workers::{Job, Outcome, Work, Workers};
use super::write_deadline::WriteDeadline;
use sqlite_outbox::receive::Verifier;
use sqlite_outbox::receive::{verify_request, ReceiveError};

/// How long a request waits for its database job before it is answered 503.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// The `Retry-After` of a 503 because PostgreSQL is down or failing, in seconds.
const RETRY_AFTER_UNAVAILABLE: &str = "5";
/// The `Retry-After` of a 503 because the database queue is full, in seconds.
const RETRY_AFTER_OVERLOADED: &str = "1";
/// How often the background probe checks PostgreSQL for `/healthz`.
const HEALTH_PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long shutdown lets open connections finish their request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What every connection's requests need.
pub(crate) struct State {
    pub verifier: Verifier,
    pub workers: Workers,
    pub max_body: usize,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub max_requests_per_connection: usize,
    /// What `/healthz` answers: `Some(None)` while healthy, `Some(Some(why))` when not,
    /// `None` before the first probe has answered. Set by the background probe, and to
    /// unhealthy at once by a store that fails: a health check takes no place in the
    /// database queue (only the ones before the first probe's answer run a probe of their
    /// own).
    pub unhealthy: std::sync::Mutex<Option<Option<String>>>,
}

impl State {
    fn set_health(&self, unhealthy: Option<String>) {
        *self
            .unhealthy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(unhealthy);
    }

    fn health(&self) -> Option<Option<String>> {
        self.unhealthy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// One probe of PostgreSQL: `None` if healthy, else why not.
async fn probe_once(state: &State) -> Option<String> {
    match run(state, Work::Health).await {
        Outcome::Healthy | Outcome::Stored(_) => None,
        Outcome::Unavailable(why) | Outcome::Rejected(why) => Some(why),
        Outcome::Overloaded => Some("every database thread is busy".to_string()),
    }
}

/// Checks PostgreSQL every [`HEALTH_PROBE_EVERY`] for `/healthz`, until shutdown.
async fn probe_health(state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let unhealthy = probe_once(&state).await;
        state.set_health(unhealthy);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(HEALTH_PROBE_EVERY) => {}
        }
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
                    let mut response = handle(request, &state).await;
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

/// One request: `GET` or `HEAD /healthz`, or `POST` of signed CloudEvents to any other path.
async fn handle(request: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    if request.uri().path() == "/healthz" {
        // Only a health check: a POST here once got the health answer, a 200 for events
        // that were never stored, and a relay pointed at this path lost them.
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut refused = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "/healthz answers GET and HEAD only; POST events to another path",
            );
            refused
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return refused;
        }
        let unhealthy = match state.health() {
            Some(known) => known,
            None => probe_once(state).await,
        };
        return match unhealthy {
            None => text(StatusCode::OK, "ok"),
            Some(why) => unavailable(&why, RETRY_AFTER_UNAVAILABLE),
        };
    }
    if request.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST signed CloudEvents, or GET /healthz",
        );
    }
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.max_body as u64) {
        return too_large(state.max_body);
    }
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
    // What needs no body is checked before a byte of it is read: a request without the
    // webhook headers, or with a timestamp outside the tolerance, costs no body buffer.
    let named = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Err(e) = state.verifier.verify_headers(named, now) {
        return close(text(
            StatusCode::UNAUTHORIZED,
            &format!("{}: {e}", e.kind()),
        ));
    }
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
    let events = match verify_request(&state.verifier, &headers, &body, now) {
        Ok(events) => events,
        Err(ReceiveError::Signature(e)) => {
            return text(StatusCode::UNAUTHORIZED, &format!("{}: {e}", e.kind()))
        }
        Err(ReceiveError::Body(e)) => {
            return text(StatusCode::BAD_REQUEST, &format!("not CloudEvents: {e}"))
        }
    };
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
    match run(state, Work::Store(columns)).await {
        Outcome::Stored(new) => {
            // How many of the request's events were new; repeats are answered 204 too.
            let mut response = empty(StatusCode::NO_CONTENT);
            response.headers_mut().insert(
                "outbox-stored",
                HeaderValue::from_str(&new.to_string()).unwrap_or(HeaderValue::from_static("0")),
            );
            response
        }
        Outcome::Healthy => empty(StatusCode::NO_CONTENT),
        Outcome::Rejected(why) => text(StatusCode::BAD_REQUEST, &why),
        Outcome::Unavailable(why) => {
            // Unhealthy at once, until the probe succeeds again.
            state.set_health(Some(why.clone()));
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
