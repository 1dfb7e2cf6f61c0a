//! Destinations: where a relay delivers, and which events go where.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::http::{HttpConfig, HttpTransport};
use crate::signature::Secret;
use crate::transport::Transport;

/// The longest destination name accepted, in bytes.
pub const MAX_DESTINATION_NAME_LEN: usize = 64;

/// Batched delivery: many events per request, as one CloudEvents batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// At most this many events per request.
    pub max_events: usize,
    /// At most this many bytes of body per request (a single larger event goes alone).
    pub max_bytes: usize,
}

#[derive(Clone)]
pub(crate) enum Target {
    Http {
        url: String,
        config: HttpConfig,
        secrets: Vec<Secret>,
    },
    Custom(Arc<dyn Transport>),
}

/// One named place a relay delivers to, with its own attempts, backoff and workers.
///
/// ```
/// use sqlite_outbox::Destination;
/// let billing = Destination::http("billing", "https://billing.example.com/hooks")
///     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///     .unwrap()
///     .batch(100, 1 << 20);
/// # let _ = billing;
/// ```
#[derive(Clone)]
pub struct Destination {
    pub(crate) name: String,
    pub(crate) target: Target,
    pub(crate) batch: Option<Batching>,
    pub(crate) workers: Option<usize>,
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
            } => d
                .field("url", url)
                .field("http", config)
                .field("secrets", &secrets.len()),
            Target::Custom(_) => d.field("transport", &"<custom>"),
        };
        d.field("batch", &self.batch)
            .field("workers", &self.workers)
            .finish()
    }
}

impl Destination {
    /// A destination named `name` posting to `url`.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Destination {
        Destination {
            name: name.into(),
            target: Target::Http {
                url: url.into(),
                config: HttpConfig::default(),
                secrets: Vec::new(),
            },
            batch: None,
            workers: None,
        }
    }

    /// A destination named `name` delivering through `transport` (tests, other protocols).
    pub fn custom(name: impl Into<String>, transport: impl Transport) -> Destination {
        Destination {
            name: name.into(),
            target: Target::Custom(Arc::new(transport)),
            batch: None,
            workers: None,
        }
    }

    /// The destination's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a `whsec_…` signing secret. With two or more, every request carries one
    /// signature per secret, so receivers can rotate without a gap. Ignored by custom
    /// transports.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the secret is empty or not base64 (the message does not
    /// repeat it).
    pub fn secret(mut self, secret: &str) -> Result<Destination> {
        let parsed = Secret::parse(secret)
            .map_err(|e| Error::InvalidConfig(format!("destination {}: {e}", self.name)))?;
        if let Target::Http { secrets, .. } = &mut self.target {
            secrets.push(parsed);
        }
        Ok(self)
    }

    /// Sets timeouts and extra headers. Defaults to [`HttpConfig::default`].
    pub fn http_config(mut self, http: HttpConfig) -> Destination {
        if let Target::Http { config, .. } = &mut self.target {
            *config = http;
        }
        self
    }

    /// Sends batches (`application/cloudevents-batch+json`) of at most `max_events` events
    /// and `max_bytes` bytes. A batch succeeds or is retried as a whole. Off by default, as
    /// the CloudEvents spec asks: use it only if the receiver accepts batches.
    pub fn batch(mut self, max_events: usize, max_bytes: usize) -> Destination {
        self.batch = Some(Batching {
            max_events,
            max_bytes,
        });
        self
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
            Target::Http { config, .. } => Some(config.request_timeout),
            Target::Custom(_) => None,
        }
    }

    /// Checks the settings and builds the transport.
    pub(crate) fn build_transport(&self) -> Result<Arc<dyn Transport>> {
        validate_name(&self.name)?;
        if let Some(b) = self.batch {
            if b.max_events == 0 || b.max_bytes == 0 {
                return Err(Error::InvalidConfig(format!(
                    "destination {}: batch limits must be at least 1",
                    self.name
                )));
            }
        }
        match &self.target {
            Target::Custom(t) => Ok(t.clone()),
            Target::Http {
                url,
                config,
                secrets,
            } => Ok(Arc::new(HttpTransport::with_secrets(
                url,
                config.clone(),
                secrets.clone(),
                self.batch.is_some(),
            )?)),
        }
    }
}

/// Checks a destination name: 1 to 64 bytes of letters, digits, `-`, `_` and `.`.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_DESTINATION_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "destination name {name:?} must be 1 to {MAX_DESTINATION_NAME_LEN} letters, digits, '-', '_' or '.'"
        )))
    }
}

/// A routing rule: events whose type matches `pattern` go to `destination`.
///
/// Patterns: an exact type (`order.created`), a prefix ending in `*` (`order.*` matches
/// `order.created` and `order.item.added`), or `*` for every event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub(crate) pattern: String,
    pub(crate) destination: String,
}

impl Route {
    /// Whether `event_type` matches this route's pattern.
    pub fn matches(&self, event_type: &str) -> bool {
        type_matches(&self.pattern, event_type)
    }
}

/// Whether `event_type` matches `pattern`: an exact type, a prefix ending in `*`, or `*`.
pub(crate) fn type_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// The destinations an event of `event_type` goes to, in route order without repeats.
/// With no routes at all, everything goes to the default destination.
pub(crate) fn destinations_for<'a>(routes: &'a [Route], event_type: &str) -> Vec<&'a str> {
    if routes.is_empty() {
        return vec![crate::outbox::DEFAULT_DESTINATION];
    }
    let mut out: Vec<&str> = Vec::new();
    for r in routes.iter().filter(|r| r.matches(event_type)) {
        if !out.contains(&r.destination.as_str()) {
            out.push(&r.destination);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(p: &str, d: &str) -> Route {
        Route {
            pattern: p.into(),
            destination: d.into(),
        }
    }

    #[test]
    fn patterns_match_exact_prefix_and_all() {
        assert!(route("order.created", "d").matches("order.created"));
        assert!(!route("order.created", "d").matches("order.created.v2"));
        assert!(route("order.*", "d").matches("order.item.added"));
        assert!(!route("order.*", "d").matches("orders.x"));
        assert!(route("*", "d").matches("anything"));
    }

    #[test]
    fn destinations_are_unique_and_default_without_routes() {
        assert_eq!(destinations_for(&[], "x"), vec!["default"]);
        let routes = [
            route("order.*", "billing"),
            route("*", "audit"),
            route("order.created", "billing"),
        ];
        assert_eq!(
            destinations_for(&routes, "order.created"),
            vec!["billing", "audit"]
        );
        assert_eq!(destinations_for(&routes, "user.signup"), vec!["audit"]);
        assert!(destinations_for(&routes[..1], "user.signup").is_empty());
    }

    #[test]
    fn secrets_are_checked_and_never_shown() {
        let d = Destination::http("a", "http://127.0.0.1:1/")
            .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        assert!(!format!("{d:?}").contains("MfKQ9r8"));
        let err = Destination::http("a", "http://x/")
            .secret("whsec_!!!not-base64")
            .unwrap_err();
        assert!(!err.to_string().contains("not-base64"), "{err}");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("billing-v2.eu_1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name(&"x".repeat(65)).is_err());
    }
}
