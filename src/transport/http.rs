//! The HTTP transport: one keep-alive ureq `Agent` posting signed CloudEvents to one URL.

use std::fmt;
use std::time::{Duration, SystemTime};

use ureq::http::HeaderValue;
use ureq::Agent;

use super::absolute_form::{AbsoluteForm, ProxyResolver};
use super::proxy::{self, ProxySetting};
use super::resolver::CachingResolver;
use super::tcp;

use crate::error::{Error, Result};
use crate::observe::spans::hop_headers;
use crate::transport::clock_offset::{unix_ms, ClockOffset, THRESHOLD as SKEW_THRESHOLD};
use crate::transport::{Attempt, OutboundEvent, Transport};
use crate::wire;
use crate::wire::cloudevents::CLOUDEVENTS_BATCH_JSON;
use crate::wire::content_encoding::Compression;
use crate::wire::receipt::{Receipt, RECEIPT_HEADER};
use crate::wire::retry_after::parse_retry_after;
use crate::wire::signature::{signature_header, Secret};
use crate::wire::signing_key::{PublicKey, SigningKey};
use crate::wire::source_header::encode_source_header;

/// The names of the headers every request carries, parsed once rather than at every
/// request (at one event a request, building the headers was 4% of a worker's time).
mod names {
    use ureq::http::HeaderName;

    pub(super) static CONTENT_TYPE: HeaderName = HeaderName::from_static("content-type");
    pub(super) static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
    pub(super) static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
    pub(super) static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
    pub(super) static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
    pub(super) static SOURCE: HeaderName =
        HeaderName::from_static(crate::wire::source_header::SOURCE_HEADER);
}

/// How much of a response body is read: enough for an error message, never a flood. Reading it
/// to the end is what returns the connection to the keep-alive pool.
const RESPONSE_BODY_LIMIT: u64 = 64 * 1024;
/// How much of the response body is kept in `last_error`.
const DETAIL_LIMIT: usize = 256;
/// How many kept-alive connections closed under a request it is sent again on, at once
/// and spending no attempt, before the failure counts: the few idle connections a server
/// can close at once when its idle timeout runs out.
const STALE_CONNECTIONS: usize = 4;

/// Timeouts and headers of an [`HttpTransport`], set like every other setting of the crate:
/// setters named after the setting, each documenting its default.
///
/// ```
/// use std::time::Duration;
/// use sqlite_outbox::transport::HttpConfig;
/// let http = HttpConfig::new()
///     .connect_timeout(Duration::from_secs(2))
///     .request_timeout(Duration::from_secs(10))
///     .header("authorization", "Bearer abc");
/// # let _ = http;
/// ```
#[derive(Clone)]
#[must_use = "an HttpConfig does nothing until it is given to a RelayConfig or a transport"]
pub struct HttpConfig {
    connect_timeout: Duration,
    request_timeout: Duration,
    max_idle_connections: usize,
    headers: Vec<(String, String)>,
    binary: bool,
    ca_pem: Option<Vec<u8>>,
    client_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    platform_roots: bool,
    proxy: ProxySetting,
}

impl HttpConfig {
    /// The defaults: 5 s to connect, 15 s per request, 16 idle connections, no extra headers.
    pub fn new() -> HttpConfig {
        HttpConfig::default()
    }

    /// Sets the time allowed to open the TCP connection, and to look the host up. Defaults
    /// to 5 s. A looked-up address is kept for 30 s, so requests on a kept-alive connection
    /// do not wait on DNS.
    pub fn connect_timeout(mut self, timeout: Duration) -> HttpConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the time allowed for the whole request and response. Defaults to 15 s (Standard
    /// Webhooks asks senders for 15–30 s). A relay's lease must be at least twice this.
    /// Enforced to within a quarter of a second: the socket's timeouts are changed only in
    /// steps of 250 ms, not before every read and write.
    pub fn request_timeout(mut self, timeout: Duration) -> HttpConfig {
        self.request_timeout = timeout;
        self
    }

    /// Sets how many idle connections are kept open for reuse. Defaults to 16.
    pub fn max_idle_connections(mut self, n: usize) -> HttpConfig {
        self.max_idle_connections = n;
        self
    }

    /// Whether an `Authorization` header is set (credentials of their own: not unsigned).
    pub(crate) fn has_authorization(&self) -> bool {
        self.headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
    }

    /// Adds a header sent with every request (credentials, say: `Debug` shows only its name).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> HttpConfig {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Binary content mode (the CloudEvents HTTP binding): the body is the event's data
    /// (`application/json`), its attributes are `ce-` headers (`ce-id`, `ce-type`,
    /// `ce-traceparent`, …), one event per request. Off: structured mode, the whole JSON
    /// envelope as the body. Binary mode cannot batch (a destination's
    /// [`batch`](crate::Destination::batch) with it is refused at start), and the signature
    /// covers the body only: a receiver that needs the attributes signed uses structured
    /// mode, as `outbox ingest` requires.
    pub fn binary_mode(mut self, binary: bool) -> HttpConfig {
        self.binary = binary;
        self
    }

    /// Trusts the certificates in `pem` (one or more, PEM) as the roots for HTTPS instead of
    /// the built-in Mozilla roots: a receiver behind a private CA (a factory floor's, an
    /// on-premises gateway's). A PEM that holds no certificate is refused at start.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> HttpConfig {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Sends every request through the HTTP proxy at `url` (`http://host:port`, with
    /// `user:password@` when it asks for credentials: sent as `Proxy-Authorization: Basic`,
    /// never logged or shown): plain HTTP in absolute form, HTTPS through `CONNECT`. Without
    /// this or [`proxy_from_env`](Self::proxy_from_env) no proxy is used, whatever the
    /// environment says. A proxy that refuses (`407`) or cannot reach the receiver (`502`,
    /// `504` from the proxy) is the network being down: no attempt spent, the destination
    /// waits as when unreachable, a log line names the proxy. Redirects stay refused.
    pub fn proxy(mut self, url: impl Into<String>) -> HttpConfig {
        self.proxy = ProxySetting::Url(url.into());
        self
    }

    /// Uses the proxy the environment names, read at start the way curl reads it:
    /// `https_proxy` (or `HTTPS_PROXY`) for https destinations, `http_proxy` for http ones,
    /// then `all_proxy` (or `ALL_PROXY`); none for a host `no_proxy` (or `NO_PROXY`) lists,
    /// a name under one it lists, or an address in a range it lists (`127.0.0.0/8`).
    /// Opt-in: without it the environment is ignored.
    pub fn proxy_from_env(mut self) -> HttpConfig {
        self.proxy = ProxySetting::FromEnv;
        self
    }

    /// Trusts the operating system's certificate store for HTTPS (Windows, macOS, iOS,
    /// Android; on Linux the system's CA bundle) instead of Mozilla's roots built in: the
    /// roots a company installs on its machines are then trusted too. Needs the crate's
    /// `platform-verifier` feature (refused at start without it); off by default, and
    /// [`ca_pem`](Self::ca_pem) takes precedence.
    pub fn platform_roots(mut self, on: bool) -> HttpConfig {
        self.platform_roots = on;
        self
    }

    /// Presents this client certificate (its chain, PEM, the device's own first) and its
    /// private key (PEM) to an HTTPS receiver that asks for one (mutual TLS). The key is
    /// never shown by `Debug`; a pair that does not parse is refused at start.
    pub fn client_identity_pem(
        mut self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> HttpConfig {
        self.client_identity_pem = Some((cert_chain_pem.into(), key_pem.into()));
        self
    }

    /// The TLS settings these options ask for.
    fn tls_config(&self) -> Result<ureq::tls::TlsConfig> {
        use ureq::tls::{ClientCert, PrivateKey, RootCerts, TlsConfig};
        let mut tls = TlsConfig::builder();
        if self.platform_roots {
            if !cfg!(feature = "platform-verifier") {
                return Err(Error::InvalidConfig(
                    "platform_roots needs the crate's platform-verifier feature".into(),
                ));
            }
            tls = tls.root_certs(RootCerts::PlatformVerifier);
        }
        if let Some(pem) = &self.ca_pem {
            let roots = certificates(pem, "ca_pem")?;
            tls = tls.root_certs(RootCerts::new_with_certs(&roots));
        }
        if let Some((chain, key)) = &self.client_identity_pem {
            let chain = certificates(chain, "the client certificate")?;
            let key = PrivateKey::from_pem(key).map_err(|_| {
                Error::InvalidConfig(
                    "the client key is not a PEM private key (PKCS#8, PKCS#1 or SEC1)".into(),
                )
            })?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        Ok(tls.build())
    }

    /// Whether binary content mode is on.
    pub(crate) fn is_binary(&self) -> bool {
        self.binary
    }

    /// The request timeout, for the relay's lease check.
    pub(crate) fn request_timeout_value(&self) -> Duration {
        self.request_timeout
    }
}

/// A proxy URL as ureq takes it, or why not (never repeating a password).
fn parse_proxy(url: &str) -> Result<ureq::Proxy> {
    let shown = proxy::shown(url);
    if !url.to_ascii_lowercase().starts_with("http://") {
        return Err(Error::InvalidConfig(format!(
            "proxy {shown} is not an http:// proxy URL"
        )));
    }
    ureq::Proxy::new(url)
        .map_err(|_| Error::InvalidConfig(format!("proxy {shown} is not a valid proxy URL")))
}

/// The certificates in `pem`, or why not: `what` names the setting.
fn certificates(pem: &[u8], what: &str) -> Result<Vec<ureq::tls::Certificate<'static>>> {
    let mut certificates = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(certificate)) => certificates.push(certificate),
            Ok(_) => {}
            Err(e) => {
                return Err(Error::InvalidConfig(format!(
                    "{what} is not valid PEM: {e:#}"
                )))
            }
        }
    }
    if certificates.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "{what} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(certificates)
}

/// The HTTP client settings of everything that delivers (the relay, `import`): statuses as
/// answers, no redirect followed (a captive portal's 302 would turn a POST into a GET
/// without its body, and its 2xx would count as delivered), no proxy from the environment,
/// and a deadline for each part of a request.
pub(crate) fn agent_config(
    connect_timeout: Duration,
    request_timeout: Duration,
    max_idle_connections: usize,
) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    ureq::config::Config::builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .timeout_resolve(Some(connect_timeout))
        .timeout_connect(Some(connect_timeout))
        .timeout_global(Some(request_timeout))
        .max_idle_connections(max_idle_connections)
        .max_idle_connections_per_host(max_idle_connections)
        .user_agent(concat!("sqlite-outbox/", env!("CARGO_PKG_VERSION")))
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
            max_idle_connections: 16,
            headers: Vec::new(),
            binary: false,
            ca_pem: None,
            client_identity_pem: None,
            platform_roots: false,
            proxy: ProxySetting::Off,
        }
    }
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Extra headers often carry credentials: show their names only.
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("HttpConfig")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_idle_connections", &self.max_idle_connections)
            .field("headers", &names)
            .field("binary", &self.binary)
            .field("ca_pem", &self.ca_pem.is_some())
            .field("client_identity", &self.client_identity_pem.is_some())
            .field("platform_roots", &self.platform_roots)
            .field(
                "proxy",
                &match &self.proxy {
                    ProxySetting::Off => "off".to_string(),
                    ProxySetting::Url(url) => proxy::shown(url),
                    ProxySetting::FromEnv => "from the environment".to_string(),
                },
            )
            .finish()
    }
}

/// Posts events as CloudEvents requests (structured, or batched) to one URL, signed per
/// Standard Webhooks.
///
/// Every request carries `webhook-id` (the event id, or a stable batch id),
/// `webhook-timestamp` (the unix time of this attempt: a retry is signed afresh),
/// `webhook-signature` (one `v1,` entry per secret, and a `v1a,` entry for an Ed25519
/// signing key, when there are any), `Idempotency-Key: "<webhook-id>"` and `outbox-source`
/// (the events' CloudEvents source: the relay never mixes sources in one request, so a
/// receiver can pick the keys of that source before it reads the body). A request whose
/// events carry trace context also carries a W3C `traceparent` header (and `tracestate`)
/// continuing the first such event's trace: with the `opentelemetry` feature and a tracer
/// installed, the attempt's `send` span is its parent, else the span that wrote the event.
///
/// Statuses are read, never raised as errors, so a 429's `Retry-After` is seen; redirects are
/// not followed (a redirect is a failed delivery); proxies from the environment are ignored.
///
/// A request leaves in one write (one TCP segment when it fits), head and body together,
/// over plain TCP and TLS alike: one packet per event on a metered uplink rather than two.
pub struct HttpTransport {
    agent: Agent,
    /// The proxy requests go through, as it may be shown (no password).
    proxy: Option<String>,
    /// Whether the proxy is refusing or failing now: its spell is logged once.
    proxy_refusing: std::sync::atomic::AtomicBool,
    url: String,
    /// `url`, parsed once: ureq would parse the text again for every request.
    uri: ureq::http::Uri,
    headers: Vec<(String, String)>,
    secrets: Vec<Secret>,
    signing_key: Option<SigningKey>,
    /// The receiver's receipt key: a 2xx counts only with a receipt it signed.
    receipt_key: Option<PublicKey>,
    batch: bool,
    binary: bool,
    compression: Compression,
    clock_offset: ClockOffset,
    /// Whether a 2xx answer carried the accounting header (see
    /// [`Transport::takes_accounting`]).
    takes_accounting: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("url", &self.url)
            .field("secrets", &self.secrets.len())
            .field("signing_key", &self.signing_key)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl HttpTransport {
    /// Creates a transport posting one unsigned structured event per request to `url`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `url` is not an `http://` or `https://` URL.
    pub fn new(url: &str, config: HttpConfig) -> Result<Self> {
        Self::with_secrets(url, config, Vec::new(), false)
    }

    /// Creates a transport posting to `url`, signing with `secrets`, in batched mode if
    /// `batch` is set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `url` is not an `http://` or `https://` URL.
    pub fn with_secrets(
        url: &str,
        config: HttpConfig,
        secrets: Vec<Secret>,
        batch: bool,
    ) -> Result<Self> {
        let lower = url.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"));
        match rest {
            Some(host) if !host.is_empty() && !host.starts_with('/') => {}
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "destination URL {url:?} is not an http:// or https:// URL"
                )))
            }
        }
        let uri = url.parse::<ureq::http::Uri>().map_err(|e| {
            Error::InvalidConfig(format!("destination URL {url:?} is malformed: {e:#}"))
        })?;
        for (setting, value) in [
            ("connect_timeout", config.connect_timeout),
            ("request_timeout", config.request_timeout),
        ] {
            if value < Duration::from_millis(1) || value > Duration::from_secs(3600) {
                return Err(Error::InvalidConfig(format!(
                    "{setting} of {value:?} is out of range: from 1ms to 1h"
                )));
            }
        }
        // Every part of a request that comes from the configuration is checked here, so a
        // request that cannot be built is an error from `start()`, never a dead letter.
        for (name, value) in &config.headers {
            ureq::http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::InvalidConfig(format!(
                    "header name {name:?} is not a valid HTTP header name"
                ))
            })?;
            // The value may be a credential: the message names the header only.
            ureq::http::HeaderValue::from_str(value).map_err(|_| {
                Error::InvalidConfig(format!(
                    "the value of header {name:?} is not a valid HTTP header value (control \
                     characters such as a trailing newline are not allowed)"
                ))
            })?;
        }
        let tls = config.tls_config()?;
        let proxy_url = match &config.proxy {
            ProxySetting::Off => None,
            ProxySetting::Url(url) => Some(url.clone()),
            ProxySetting::FromEnv => proxy::from_env(
                uri.scheme_str().unwrap_or("http"),
                uri.host().unwrap_or(""),
                |name| std::env::var(name).ok(),
            ),
        };
        let proxy = match &proxy_url {
            None => None,
            Some(url) => Some(parse_proxy(url)?),
        };
        let agent_config = agent_config(
            config.connect_timeout,
            config.request_timeout,
            config.max_idle_connections,
        )
        .tls_config(tls);
        let agent = match proxy {
            // A lookup per host every 30 s, not per request (see `resolver`); each request
            // in one write, TLS or not, and socket timeouts set only when they change (see
            // `tcp`).
            None => Agent::with_parts(
                agent_config.build(),
                super::tcp::connector(),
                CachingResolver::default(),
            ),
            // Plain HTTP through a proxy: these same connections, to the proxy, each
            // request in absolute form (see `absolute_form`).
            Some(proxy) if uri.scheme_str() == Some("http") => {
                let resolver = ProxyResolver::new(&proxy).map_err(|_| {
                    Error::InvalidConfig(format!(
                        "proxy {} is not a valid proxy URL",
                        proxy::shown(proxy_url.as_deref().unwrap_or(""))
                    ))
                })?;
                Agent::with_parts(
                    agent_config.build(),
                    super::tcp::connector_through_proxy(AbsoluteForm::new(&uri, &proxy)),
                    resolver,
                )
            }
            // HTTPS through a proxy: ureq's CONNECT tunnel per connection, over these
            // connections to the proxy (the proxy's name looked up by ureq's resolver).
            Some(proxy) => Agent::with_parts(
                agent_config.proxy(Some(proxy)).build(),
                super::tcp::connector_through_tunnel(),
                ureq::unversioned::resolver::DefaultResolver::default(),
            ),
        };
        Ok(HttpTransport {
            agent,
            proxy: proxy_url.as_deref().map(proxy::shown),
            proxy_refusing: std::sync::atomic::AtomicBool::new(false),
            url: url.to_string(),
            uri,
            headers: config.headers,
            secrets,
            signing_key: None,
            receipt_key: None,
            batch,
            binary: config.binary,
            compression: Compression::None,
            clock_offset: ClockOffset::default(),
            takes_accounting: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Signs every request with `key` too (a `v1a` entry beside any `v1` ones).
    pub fn with_signing_key(mut self, key: SigningKey) -> Self {
        self.signing_key = Some(key);
        self
    }

    /// Counts a 2xx as delivered only with a receipt `key` signed for that request,
    /// covering every event of it (see [`Receipt`](crate::wire::Receipt)); otherwise the
    /// answer is the destination being unreachable: nothing delivered, no attempt spent.
    pub fn with_receipt_key(mut self, key: PublicKey) -> Self {
        self.receipt_key = Some(key);
        self
    }

    /// Compresses request bodies as `compression` says (see [`Compression`]); the
    /// signatures stay over the uncompressed body.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The URL events are posted to.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Whether the answer's receipt is `key`'s for request `message_id` and covers every one of
/// `events`; if not, why.
fn check_receipt(
    key: &PublicKey,
    headers: &ureq::http::HeaderMap,
    message_id: &str,
    events: &[OutboundEvent],
) -> std::result::Result<(), String> {
    let header = headers
        .get(RECEIPT_HEADER)
        .ok_or_else(|| format!("no {RECEIPT_HEADER} header"))?
        .to_str()
        .map_err(|_| format!("{RECEIPT_HEADER} is not text"))?;
    let receipt = Receipt::verify(header, key)?;
    let source = events.first().map_or("", |e| e.source.as_str());
    let stream = events.first().map_or("", |e| e.destination.as_str());
    receipt.covers(
        message_id,
        source,
        stream,
        events.iter().filter_map(|e| e.stream_seq),
    )
}

/// What a ureq error means for the attempt.
///
/// Failures before the request could have reached the receiver (name lookup, connect, TLS
/// handshake) say nothing about the event: the destination is unreachable. Anything later
/// (a read timeout, a reset or close mid-response, a malformed answer) may be this event's
/// doing, so it is the event's failed attempt. The whole-request timeout counts as later:
/// the connect and name-lookup phases have their own, shorter timeout.
fn classify(e: ureq::Error) -> Attempt {
    use std::io::ErrorKind;
    use ureq::Error as E;
    use ureq::Timeout as T;
    let before_sent = match &e {
        // A TLS failure (a certificate that does not verify, an expired one, a handshake
        // refused) comes before the request is sent: it is the connection's, like a host
        // that cannot be reached, and must not spend the events' attempts.
        E::HostNotFound
        | E::ConnectionFailed
        | E::ConnectProxyFailed(_)
        | E::Tls(_)
        | E::Rustls(_) => true,
        E::Timeout(T::Resolve | T::Connect) => true,
        E::Io(io) => {
            matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::NotConnected
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::NetworkDown
            ) || is_tls_failure(io)
        }
        _ => false,
    };
    let local_fault = matches!(
        e,
        E::BadUri(_) | E::Http(_) | E::RequireHttpsOnly(_) | E::TlsRequired
    );
    let reason = e.to_string();
    if local_fault {
        Attempt::Unsendable { reason }
    } else if before_sent {
        Attempt::Unreachable { reason }
    } else {
        Attempt::Failed { reason }
    }
}

/// Whether a request failed because its connection was closed under it before an answer's
/// head came: the end of the stream where the head should be, a reset, or a write into a
/// connection the server had closed.
fn closed_before_answer(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e, ureq::Error::Io(io) if matches!(
        io.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    ))
}

/// Whether an I/O error is rustls refusing the connection: the handshake runs on the
/// request's first write, so a certificate that does not verify, or a receiver that wants a
/// client certificate it did not get, comes back as an I/O error wrapping rustls' own.
fn is_tls_failure(io: &std::io::Error) -> bool {
    io.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

impl HttpTransport {
    /// Posts `body` as `request` builds it. A request that a kept-alive connection's server
    /// closed before its answer's head (its idle timeout ran out as the request arrived:
    /// ureq's probe of the idle connection came a moment before) goes again at once on
    /// another connection, spending no attempt; at most [`STALE_CONNECTIONS`] times, as the
    /// pool loses each closed connection. Safe to repeat: at worst the receiver sees the
    /// request twice, as at any retry, and drops the duplicate by its id.
    fn post(
        &self,
        request: impl Fn() -> ureq::RequestBuilder<ureq::typestate::WithBody>,
        body: &[u8],
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut stale = 0;
        loop {
            let opened = tcp::connections_opened_here();
            match request().send(body) {
                Err(e)
                    if stale < STALE_CONNECTIONS
                        && tcp::connections_opened_here() == opened
                        && closed_before_answer(&e) =>
                {
                    stale += 1;
                    log::debug!(
                        "destination {}: a kept-alive connection was closed before the \
                         answer ({e}); sending again on another",
                        self.url
                    );
                }
                sent => return sent,
            }
        }
    }

    /// Logs, once a spell, that the proxy stands between this destination and its receiver.
    fn through_proxy(&self, attempt: Attempt) -> Attempt {
        if let (Some(proxy), Attempt::Unreachable { reason }) = (&self.proxy, &attempt) {
            let first = !self
                .proxy_refusing
                .swap(true, std::sync::atomic::Ordering::Relaxed);
            if first {
                log::warn!(
                    "destination {}: through proxy {proxy}: {reason}; its events wait, no \
                     attempt spent",
                    self.url
                );
            }
        }
        attempt
    }
}

impl Transport for HttpTransport {
    fn send(&self, events: &[OutboundEvent]) -> Attempt {
        let (body, content_type, message_id) = match (self.batch, events) {
            (_, []) => {
                return Attempt::Unsendable {
                    reason: "nothing to send".into(),
                }
            }
            (false, [event]) if self.binary => (
                Ok(event.payload.as_bytes().to_vec()),
                "application/json",
                event.event_id.clone(),
            ),
            (false, [event]) => (
                wire::structured_body(event),
                wire::CLOUDEVENTS_JSON,
                event.event_id.clone(),
            ),
            _ => (
                wire::batch_body(events),
                CLOUDEVENTS_BATCH_JSON,
                wire::batch_id(events),
            ),
        };
        let body = match body {
            Ok(body) => body,
            Err(e) => {
                return Attempt::Unsendable {
                    reason: format!("stored data is not valid JSON: {e:#}"),
                }
            }
        };
        // Signed with the time of this attempt, so a retry days later is still fresh, and
        // corrected by the receiver's clock once this one is known to be far off.
        let timestamp = self.clock_offset.signing_time(SystemTime::now());
        let mut signature = signature_header(&self.secrets, &message_id, timestamp, &body);
        if let Some(key) = &self.signing_key {
            if !signature.is_empty() {
                signature.push(' ');
            }
            signature.push_str(&key.sign(&message_id, timestamp, &body));
        }
        let (timestamp_header, idempotency_key) =
            (timestamp.to_string(), format!("\"{message_id}\""));
        let source = encode_source_header(&events[0].source);
        // The hop's trace context: the events' own (`traceparent` in the body) is never
        // changed; this header continues the trace of the first event that has one.
        let hop = hop_headers(events);
        let binary = match (self.binary, events) {
            (true, [event]) => wire::binary_headers(event),
            _ => Vec::new(),
        };
        // Signed above as the receiver's handler will see it, after decoding.
        let (body, content_encoding) = self.compression.encode(body);
        // Built again only for a request sent again on another connection (see `post`).
        let request = || {
            let mut request = self
                .agent
                .post(self.uri.clone())
                .header(&names::CONTENT_TYPE, HeaderValue::from_static(content_type))
                .header(&names::WEBHOOK_ID, &message_id)
                .header(&names::WEBHOOK_TIMESTAMP, &timestamp_header)
                .header(&names::IDEMPOTENCY_KEY, &idempotency_key)
                .header(&names::SOURCE, &source);
            if !signature.is_empty() {
                request = request.header(&names::WEBHOOK_SIGNATURE, &signature);
            }
            if let Some((traceparent, tracestate)) = &hop {
                request = request.header("traceparent", traceparent);
                if let Some(tracestate) = tracestate {
                    request = request.header("tracestate", tracestate);
                }
            }
            for (name, value) in &binary {
                request = request.header(name, value);
            }
            for (name, value) in &self.headers {
                request = request.header(name, value);
            }
            if let Some(encoding) = content_encoding {
                request = request.header("content-encoding", encoding);
            }
            request
        };
        let mut response = match self.post(request, &body) {
            Ok(response) => response,
            Err(e) => return self.through_proxy(classify(e)),
        };
        let status = response.status().as_u16();
        // The proxy's own refusal (407) or failure to reach the receiver (502, 504): the
        // network is down for this destination; the events are not at fault.
        if let (Some(proxy), 407 | 502 | 504) = (&self.proxy, status) {
            return self.through_proxy(Attempt::Unreachable {
                reason: format!("proxy {proxy} answered HTTP {status}"),
            });
        }
        self.proxy_refusing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let received = SystemTime::now();
        let receipt = match &self.receipt_key {
            Some(key) if (200..300).contains(&status) => {
                Some(check_receipt(key, response.headers(), &message_id, events))
            }
            _ => None,
        };
        // Read until seen once: after that, an answer costs no header lookup for it.
        if (200..300).contains(&status)
            && !self
                .takes_accounting
                .load(std::sync::atomic::Ordering::Relaxed)
            && response
                .headers()
                .get(crate::wire::ACCOUNTING_HEADER)
                .is_some_and(|v| v.as_bytes() == b"1")
        {
            self.takes_accounting
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let date = response
            .headers()
            .get("date")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok());
        if let Some(date) = date {
            self.clock_offset.observe(date, received, &self.url);
        }
        // A Retry-After date is the receiver's clock: read it against this answer's `Date`
        // (the receiver's now), else against this clock corrected by the offset estimate.
        let receiver_now = date.unwrap_or_else(|| self.clock_offset.receiver_time(received));
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, receiver_now));
        // Drain the body so the connection can be reused; keep its start for `last_error`.
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BODY_LIMIT)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        let mut detail = format!("HTTP {status}");
        let snippet: String = text.trim().chars().take(DETAIL_LIMIT).collect();
        if !snippet.is_empty() {
            detail.push_str(": ");
            detail.push_str(&snippet);
        }
        // A refusal of a request signed far from the receiver's clock may be about the
        // timestamp alone: not a verdict on the event. It is retried, signed with the
        // corrected time, instead of dead-lettering (with the whole backlog after it).
        let signed_off_ms = date.map(|d| unix_ms(d) - timestamp.saturating_mul(1000));
        if matches!(status, 400..=499)
            && !matches!(status, 408 | 410 | 429)
            && signed_off_ms
                .is_some_and(|ms| ms.unsigned_abs() >= SKEW_THRESHOLD.as_millis() as u64)
        {
            return Attempt::Failed {
                reason: format!(
                    "{detail} (signed {} s away from the receiver's clock; retried with the \
                     corrected time)",
                    signed_off_ms.unwrap_or(0) / 1000
                ),
            };
        }
        if let Some(Err(why)) = receipt {
            return Attempt::Unreachable {
                reason: format!(
                    "{detail} without a valid receipt ({why}): nothing counted delivered"
                ),
            };
        }
        Attempt::Answered {
            status,
            retry_after,
            detail,
        }
    }

    fn clock_offset_ms(&self) -> Option<i64> {
        self.clock_offset.estimate_ms()
    }

    fn takes_accounting(&self) -> bool {
        self.takes_accounting
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_http_urls_are_rejected() {
        for url in [
            "ftp://x",
            "localhost:80",
            "",
            "http://",
            "file:///etc/passwd",
        ] {
            let err = HttpTransport::new(url, HttpConfig::default()).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig(_)), "{url}");
        }
        assert!(HttpTransport::new("http://127.0.0.1:9/x", HttpConfig::default()).is_ok());
    }

    #[test]
    fn tls_settings_that_do_not_parse_are_refused_at_start_without_showing_a_key() {
        let url = "https://127.0.0.1:9/";
        let message = |config: HttpConfig| match HttpTransport::new(url, config) {
            Err(Error::InvalidConfig(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(message(HttpConfig::new().ca_pem("not pem")).contains("holds no PEM certificate"));
        let secret_key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n";
        let why = message(HttpConfig::new().client_identity_pem("", secret_key));
        assert!(why.contains("client certificate"), "{why}");
        assert!(!why.contains("c2VjcmV0"), "{why}");
        let shown = format!(
            "{:?}",
            HttpConfig::new().client_identity_pem("c", secret_key)
        );
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        // The operating system's roots need the feature.
        let platform = HttpTransport::new(url, HttpConfig::new().platform_roots(true));
        assert_eq!(platform.is_ok(), cfg!(feature = "platform-verifier"));
    }

    #[test]
    fn a_malformed_header_is_a_configuration_error_that_hides_the_value() {
        let config = HttpConfig::new().header("authorization", "Bearer s3cr3t\n");
        let err = HttpTransport::new("http://127.0.0.1:9/", config).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)));
        let msg = err.to_string();
        assert!(
            msg.contains("authorization") && !msg.contains("s3cr3t"),
            "{msg}"
        );
        let bad_name = HttpConfig::new().header("x token", "v");
        assert!(HttpTransport::new("http://127.0.0.1:9/", bad_name).is_err());
    }

    #[test]
    fn closed_port_is_unreachable() {
        // Bind then drop to get a port that nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = HttpTransport::new(&format!("http://127.0.0.1:{port}/"), HttpConfig::default())
            .unwrap();
        let event = crate::outbound::OutboundEvent {
            id: 1,
            event_id: "e".into(),
            destination: "default".into(),
            event_type: "t".into(),
            source: "/s".into(),
            subject: None,
            partition_key: None,
            idempotency_key: None,
            payload: "1".into(),
            created_at: 0,
            attempts: 0,
            lease_owner: "o".into(),
            lease_expires_at: 0,
            expires_at: None,
            traceparent: None,
            tracestate: None,
            dataschema: None,
            stream_seq: None,
            priority: crate::outbound::DEFAULT_PRIORITY,
            lease_ends: None,
        };
        assert!(matches!(t.send(&[event]), Attempt::Unreachable { .. }));
    }
}
