//! Destinations: where a relay delivers, and which events go where.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::relay::budget::Budget;
use crate::transport::{HttpConfig, HttpTransport, Transport};
use crate::wire::content_encoding::Compression;
use crate::wire::signature::Secret;
use crate::wire::signing_key::SigningKey;

/// Batched delivery: many events per request, as one CloudEvents batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batching {
    /// At most this many events per request.
    pub max_events: usize,
    /// At most this many bytes of body per request (a single larger event goes alone).
    pub max_bytes: usize,
}

#[derive(Clone)]
enum Target {
    Http {
        url: String,
        /// Boxed: with its TLS and proxy settings it is most of a destination's size.
        config: Box<HttpConfig>,
        /// `whsec_…` texts as given; parsed (and refused if malformed) at `start()`, so a
        /// setter never fails mid-chain. Never shown: `Debug` prints their count.
        secrets: Vec<String>,
        /// The `whsk_…` text of a device's Ed25519 key, parsed at `start()` likewise.
        signing_key: Option<String>,
    },
    Custom(Arc<dyn Transport>),
    #[cfg(feature = "mqtt")]
    Mqtt {
        url: String,
        config: crate::transport::MqttConfig,
    },
}

/// One named place a relay delivers to, with its own attempts, backoff and workers.
///
/// ```
/// use sqlite_outbox::Destination;
/// let billing = Destination::http("billing", "https://billing.example.com/hooks")
///     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///     .batch(100, 1 << 20);
/// # let _ = billing;
/// ```
///
/// Setters never fail; [`Relay::start`](crate::Relay::start) checks the whole destination
/// and names what is wrong.
#[derive(Clone)]
#[must_use = "a Destination does nothing until it is added to a RelayConfig"]
pub struct Destination {
    name: String,
    target: Target,
    batch: Option<Batching>,
    workers: Option<usize>,
    rate: Option<f64>,
    bandwidth: Option<u64>,
    /// Bytes a period may spend, as `(bytes, period)`: checked into a [`Budget`] at start.
    budget: Option<(u64, std::time::Duration)>,
    budget_exempt_priority: Option<u8>,
    compression: Compression,
    linger: Option<std::time::Duration>,
    /// Whether the relay sends this destination its streams' accounting (`None`: the
    /// target's default).
    accounting: Option<bool>,
    /// The `whpk_…` public key of the receiver's receipts, parsed at `start()`.
    receipt_key: Option<String>,
    /// Whether [`http_config`](Self::http_config) was called on it: the relay's
    /// [`RelayConfig::http_config`](crate::RelayConfig::http_config) then leaves it be.
    own_http_config: bool,
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Destination");
        d.field("name", &self.name);
        match &self.target {
            Target::Http {
                url,
                config,
                secrets,
                signing_key,
            } => d
                .field("url", url)
                .field("http", config)
                .field("secrets", &secrets.len())
                .field("signing_key", &signing_key.is_some()),
            Target::Custom(_) => d.field("transport", &"<custom>"),
            #[cfg(feature = "mqtt")]
            Target::Mqtt { url, config } => d.field("url", url).field("mqtt", config),
        };
        d.field("batch", &self.batch)
            .field("compression", &self.compression)
            .field("linger", &self.linger)
            .field("accounting", &self.sends_accounting())
            .field("receipt_key", &self.receipt_key)
            .field("workers", &self.workers)
            .finish()
    }
}

impl Destination {
    /// The destination every event goes to when no routes are configured: `default`.
    pub const DEFAULT: &'static str = crate::store::route::DEFAULT_DESTINATION;

    /// The longest destination name accepted, in bytes.
    pub const MAX_NAME_LEN: usize = crate::store::route::MAX_NAME_LEN;

    /// A destination named `name` posting to `url`.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Destination {
        Destination::with_target(
            name.into(),
            Target::Http {
                url: url.into(),
                config: Box::default(),
                secrets: Vec::new(),
                signing_key: None,
            },
        )
    }

    /// A destination named `name` delivering through `transport` (tests, other protocols).
    pub fn custom(name: impl Into<String>, transport: impl Transport) -> Destination {
        Destination::with_target(name.into(), Target::Custom(Arc::new(transport)))
    }

    /// A destination named `name` publishing to the MQTT broker at `url`
    /// (`mqtt://host:port`, or `mqtts://host:port` for TLS), QoS 1, one PUBLISH per event
    /// (feature `mqtt`). Settings:
    /// [`mqtt_config`](Self::mqtt_config).
    #[cfg(feature = "mqtt")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
    pub fn mqtt(name: impl Into<String>, url: impl Into<String>) -> Destination {
        Destination::with_target(
            name.into(),
            Target::Mqtt {
                url: url.into(),
                config: crate::transport::MqttConfig::default(),
            },
        )
    }

    /// A destination for `target` with every setting at its default.
    fn with_target(name: String, target: Target) -> Destination {
        Destination {
            name,
            target,
            batch: None,
            workers: None,
            rate: None,
            bandwidth: None,
            budget: None,
            budget_exempt_priority: None,
            compression: Compression::None,
            linger: None,
            accounting: None,
            receipt_key: None,
            own_http_config: false,
        }
    }

    /// Sets the MQTT settings of an MQTT destination (ignored by others).
    #[cfg(feature = "mqtt")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
    pub fn mqtt_config(mut self, config: crate::transport::MqttConfig) -> Destination {
        if let Target::Mqtt { config: c, .. } = &mut self.target {
            *c = config;
        }
        self
    }

    /// The destination's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a `whsec_…` signing secret. With two or more, every request carries one
    /// signature per secret, so receivers can rotate without a gap. Ignored by custom
    /// transports. An empty or non-base64 secret, or a key under 24 bytes, is refused by
    /// [`Relay::start`](crate::Relay::start) with an error that does not repeat it.
    pub fn secret(mut self, secret: impl Into<String>) -> Destination {
        if let Target::Http { secrets, .. } = &mut self.target {
            secrets.push(secret.into());
        }
        self
    }

    /// Signs every request with this device's own Ed25519 key (`whsk_…`, Standard Webhooks
    /// `v1a`): the receiver verifies with the public key alone, so neither a leaked key
    /// registry nor another device's key can sign as this one. May be combined with
    /// [`secret`](Self::secret) during a move from shared secrets (both entries are sent).
    /// Ignored by custom transports; a malformed key is refused by
    /// [`Relay::start`](crate::Relay::start). `outbox keygen` makes one.
    pub fn signing_key(mut self, key: impl Into<String>) -> Destination {
        if let Target::Http { signing_key, .. } = &mut self.target {
            *signing_key = Some(key.into());
        }
        self
    }

    /// Sets timeouts and extra headers. Defaults to [`HttpConfig::default`], or to the
    /// relay's [`RelayConfig::http_config`](crate::RelayConfig::http_config) when that is
    /// set; this one wins over the relay's, whatever the order of the calls.
    pub fn http_config(mut self, http: HttpConfig) -> Destination {
        self.own_http_config = true;
        self.with_http_config(http)
    }

    /// The relay's [`RelayConfig::http_config`](crate::RelayConfig::http_config), unless
    /// the destination set its own.
    pub(crate) fn with_relay_http_config(self, http: &HttpConfig) -> Destination {
        if self.own_http_config {
            return self;
        }
        self.with_http_config(http.clone())
    }

    fn with_http_config(mut self, http: HttpConfig) -> Destination {
        if let Target::Http { config, .. } = &mut self.target {
            **config = http;
        }
        self
    }

    /// Sends batches (`application/cloudevents-batch+json`) of at most `max_events` events
    /// and `max_bytes` bytes. A batch succeeds or is retried as a whole. Off by default, as
    /// the CloudEvents spec asks: use it only if the receiver accepts batches. For an MQTT
    /// destination, each worker publishes up to `max_events` messages back to back (one per
    /// event, each with its own outcome) before it awaits their PUBACKs.
    pub fn batch(mut self, max_events: usize, max_bytes: usize) -> Destination {
        self.batch = Some(Batching {
            max_events,
            max_bytes,
        });
        self
    }

    /// Compresses request bodies of [`Compression::MIN_BYTES`] or more (HTTP only; refused
    /// at start for MQTT). With [`Compression::Gzip`] they go with `Content-Encoding: gzip`;
    /// the Standard Webhooks signature stays over the uncompressed body, which is what the
    /// receiver verifies after decoding it. `outbox ingest` and
    /// [`receive::decode_body`](crate::receive::decode_body) accept gzip. Off by default:
    /// a receiver that does not decode would see bytes it cannot parse.
    pub fn compress(mut self, compression: Compression) -> Destination {
        self.compression = compression;
        self
    }

    /// While fewer events are due than fill a batch, waits up to `linger` for more before
    /// sending (as Kafka producers' `linger.ms`): on a trickle, one request and one radio
    /// wake-up per batch instead of per event, each event delayed at most `linger`. Events of
    /// priority [`URGENT_PRIORITY`](crate::Event::URGENT_PRIORITY) (8) or above go at once,
    /// with whatever is waiting; shutdown sends what is waiting. Needs
    /// [`batch`](Self::batch); checked at start: at most a quarter of the relay's lease (the
    /// events are leased while they wait).
    pub fn linger(mut self, linger: std::time::Duration) -> Destination {
        self.linger = Some(linger);
        self
    }

    /// How long a claim short of a batch waits for more, if it does.
    /// Whether the relay tells this destination, now and then, what became of every number
    /// of its streams: events of type [`wire::ACCOUNTING_TYPE`](crate::wire::ACCOUNTING_TYPE)
    /// (see [`wire::StreamAccount`](crate::wire::StreamAccount)), which `outbox ingest`
    /// stores for `outbox fleet`. By default an HTTP destination is told once its receiver
    /// said it takes them (the [`wire::ACCOUNTING_HEADER`](crate::wire::ACCOUNTING_HEADER)
    /// on a 2xx answer, as `outbox ingest` sends), so a generic receiver gets only the app's
    /// events; `true` tells it from the start whatever it answers, `false` never. MQTT
    /// destinations (subscribers of a topic expect the app's events) and custom transports
    /// are told only with `true`.
    pub fn accounting(mut self, on: bool) -> Destination {
        self.accounting = Some(on);
        self
    }

    /// Counts an answer as a delivery only with a receipt signed by this key (`whpk_…`,
    /// the public half of `outbox ingest --receipt-key`) for that very request, covering
    /// every event of it (see [`wire::Receipt`](crate::wire::Receipt)). A 2xx without one
    /// (a captive portal, a proxy, the wrong server) delivers nothing and spends no
    /// attempt: the destination is paused as when unreachable, with the reason in each
    /// event's `last_error`, for this relay's run only (nothing is stored in the file), so
    /// the receiver's return delivers without an operator's step. HTTP destinations only;
    /// a malformed key is refused by [`Relay::start`](crate::Relay::start).
    pub fn receipt_key(mut self, key: impl Into<String>) -> Destination {
        self.receipt_key = Some(key.into());
        self
    }

    /// Whether it is an HTTP destination whose requests carry no signature and no
    /// `Authorization` header: a receiver cannot tell them from anyone else's.
    pub(crate) fn is_unsigned_http(&self) -> bool {
        match &self.target {
            Target::Http {
                config,
                secrets,
                signing_key,
                ..
            } => secrets.is_empty() && signing_key.is_none() && !config.has_authorization(),
            _ => false,
        }
    }

    /// Whether the relay sends this destination its streams' accounting.
    pub(crate) fn sends_accounting(&self) -> crate::relay::accounting::Tells {
        use crate::relay::accounting::Tells;
        match self.accounting {
            Some(true) => Tells::Always,
            Some(false) => Tells::Never,
            None if matches!(self.target, Target::Http { .. }) => Tells::WhenAsked,
            None => Tells::Never,
        }
    }

    pub(crate) fn linger_time(&self) -> Option<std::time::Duration> {
        self.linger
    }

    /// Sets this destination's delivery threads. Defaults to the relay's
    /// [`workers`](crate::RelayConfig::workers).
    pub fn workers(mut self, workers: usize) -> Destination {
        self.workers = Some(workers);
        self
    }

    /// The request timeout, if this is an HTTP destination.
    pub(crate) fn request_timeout(&self) -> Option<std::time::Duration> {
        match &self.target {
            Target::Http { config, .. } => Some(config.request_timeout_value()),
            Target::Custom(_) => None,
            #[cfg(feature = "mqtt")]
            Target::Mqtt { config, .. } => Some(config.ack_timeout),
        }
    }

    /// How requests are batched, if they are.
    /// At most `requests_per_second` requests (a batch is one request; so is one MQTT
    /// publish), paced: at most one second's worth at once after a quiet spell, then an even
    /// pace. For a metered or thin uplink, or a receiver's rate limit. A 429's `Retry-After`
    /// still wins. Checked at start: more than 0, at most 1,000,000.
    pub fn rate_limit(mut self, requests_per_second: f64) -> Destination {
        self.rate = Some(requests_per_second);
        self
    }

    /// At most `bytes_per_second` of request bodies, paced the same way (a request larger
    /// than a second's worth goes, and the ones after it wait its excess off). Checked at
    /// start: more than 0.
    pub fn bandwidth_limit(mut self, bytes_per_second: u64) -> Destination {
        self.bandwidth = Some(bytes_per_second);
        self
    }

    /// At most `bytes` in each `period` (a minute to 31 days, whole seconds), counted as
    /// the network counts them: every byte the relay writes to and reads from the
    /// destination's sockets, TLS handshakes, headers, answers and retries included (for
    /// MQTT, its packets; for a [`custom`](Self::custom) transport, the events' data). The relay never
    /// starts a request the rest of the budget cannot carry; once it is spent, events wait
    /// for the next period without spending attempts (their deadlines still apply), except
    /// those at or above [`budget_exempt_priority`](Self::budget_exempt_priority). What a
    /// period has spent is kept in the file, so a restart does not start afresh;
    /// [`Outbox::budget`](crate::Outbox::budget) says where it stands. How to choose one:
    /// [`guide::metered_links`](crate::guide::metered_links). Checked at start (see
    /// [`Budget::new`](crate::Budget::new)); `outbox relay --budget 50MB/30d`.
    pub fn budget(mut self, bytes: u64, period: std::time::Duration) -> Destination {
        self.budget = Some((bytes, period));
        self
    }

    /// Events of `priority` (0 to 9) and above go even when the budget is spent, with
    /// whatever is left and beyond (and are counted): alarms, say. Without it, every event
    /// waits for the next period. Checked at start: at most 9, and a budget set.
    pub fn budget_exempt_priority(mut self, priority: u8) -> Destination {
        self.budget_exempt_priority = Some(priority);
        self
    }

    /// The budget and its exempt priority, checked.
    pub(crate) fn budget_checked(&self) -> Result<Option<(Budget, Option<u8>)>> {
        let named = |e: Error| match e {
            Error::InvalidConfig(why) => {
                Error::InvalidConfig(format!("destination {}: {why}", self.name))
            }
            other => other,
        };
        match (self.budget, self.budget_exempt_priority) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(named(Error::InvalidConfig(
                "budget_exempt_priority needs a budget; set budget too".into(),
            ))),
            (Some(_), Some(p)) if p > 9 => Err(named(Error::InvalidConfig(format!(
                "a budget exempt priority of {p} is out of range: 0 to 9"
            )))),
            (Some((bytes, period)), exempt) => {
                Ok(Some((Budget::new(bytes, period).map_err(named)?, exempt)))
            }
        }
    }

    /// What a request costs beyond its events' data before one was measured, for the
    /// budget: with a TLS handshake over `https://`.
    pub(crate) fn first_request_overhead(&self) -> u64 {
        match &self.target {
            Target::Http { url, .. } if url.to_ascii_lowercase().starts_with("https://") => {
                crate::relay::spending::FIRST_OVERHEAD_TLS
            }
            Target::Http { .. } => crate::relay::spending::FIRST_OVERHEAD_PLAIN,
            _ => 0,
        }
    }

    /// The rate and bandwidth limits, if any.
    pub(crate) fn pacing(&self) -> (Option<f64>, Option<u64>) {
        (self.rate, self.bandwidth)
    }

    pub(crate) fn batching(&self) -> Option<Batching> {
        self.batch
    }

    /// The delivery threads this destination asked for, if it set its own.
    pub(crate) fn worker_count(&self) -> Option<usize> {
        self.workers
    }

    /// Checks the settings and builds the transport. `workers` is how many delivery threads
    /// the relay gives it: with the batch size, the in-flight window of a transport that
    /// has one (MQTT).
    #[cfg_attr(not(feature = "mqtt"), allow(unused_variables))]
    pub(crate) fn build_transport(&self, workers: usize) -> Result<Arc<dyn Transport>> {
        crate::store::route::validate_name(&self.name)?;
        if let Some(b) = self.batch {
            if b.max_events == 0 || b.max_bytes == 0 {
                return Err(Error::InvalidConfig(format!(
                    "destination {}: batch limits must be at least 1",
                    self.name
                )));
            }
        }
        if self.compression != Compression::None && !matches!(self.target, Target::Http { .. }) {
            return Err(Error::InvalidConfig(format!(
                "destination {}: compression is for HTTP destinations (it sets the request's \
                 Content-Encoding)",
                self.name
            )));
        }
        if self.receipt_key.is_some() && !matches!(self.target, Target::Http { .. }) {
            return Err(Error::InvalidConfig(format!(
                "destination {}: receipts are answered by outbox ingest over HTTP; this \
                 destination is not an HTTP one",
                self.name
            )));
        }
        match &self.target {
            Target::Custom(t) => Ok(t.clone()),
            #[cfg(feature = "mqtt")]
            Target::Mqtt { url, config } => {
                let batch = self.batch.map_or(1, |b| b.max_events);
                Ok(Arc::new(crate::transport::MqttTransport::with_window(
                    &self.name,
                    url,
                    config,
                    workers.saturating_mul(batch),
                )?))
            }
            Target::Http {
                url,
                config,
                secrets,
                signing_key,
            } => {
                let invalid = |e| Error::InvalidConfig(format!("destination {}: {e:#}", self.name));
                if config.is_binary() && self.batch.is_some() {
                    return Err(Error::InvalidConfig(format!(
                        "destination {}: binary content mode sends one event per request; \
                         it cannot batch",
                        self.name
                    )));
                }
                let secrets = secrets
                    .iter()
                    .map(|s| Secret::parse(s))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(invalid)?;
                let mut transport = HttpTransport::with_secrets(
                    url,
                    HttpConfig::clone(config),
                    secrets,
                    self.batch.is_some(),
                )?;
                if let Some(key) = signing_key {
                    transport =
                        transport.with_signing_key(SigningKey::parse(key).map_err(invalid)?);
                }
                if let Some(key) = &self.receipt_key {
                    let key = crate::wire::signing_key::PublicKey::parse(key).map_err(invalid)?;
                    transport = transport.with_receipt_key(key);
                }
                Ok(Arc::new(transport.with_compression(self.compression)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked_at_build_and_never_shown() {
        let d = Destination::http("a", "http://127.0.0.1:1/")
            .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert!(!format!("{d:?}").contains("MfKQ9r8"));
        assert!(d.build_transport(1).is_ok());
        let Err(err) = Destination::http("a", "http://x/")
            .secret("whsec_!!!not-base64")
            .build_transport(1)
        else {
            panic!("a malformed secret was accepted");
        };
        assert!(matches!(err, Error::InvalidConfig(_)));
        assert!(err.to_string().contains("destination a"), "{err:#}");
        assert!(!err.to_string().contains("not-base64"), "{err:#}");
    }
}
