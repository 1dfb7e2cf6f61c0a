//! How a relay delivers: where to, how many at once, and how it retries.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::relay::backoff::Backoff;
use crate::relay::destination::Destination;
use crate::transport::{HttpConfig, Transport};

/// Settings of a relay. Start from [`RelayConfig::http`] for one URL,
/// [`RelayConfig::transport`] for a transport of your own, or [`RelayConfig::new`] plus
/// [`destination`](RelayConfig::destination) for several, and change what you need; every
/// setter documents its default.
#[derive(Clone)]
#[must_use = "a RelayConfig does nothing until `Outbox::relay(config).start()`"]
pub struct RelayConfig {
    pub(crate) destinations: Vec<Destination>,
    /// [`http_config`](Self::http_config), for every HTTP destination without its own.
    pub(crate) http_default: Option<HttpConfig>,
    pub(crate) name: Option<String>,
    pub(crate) workers: usize,
    pub(crate) claim_batch: usize,
    pub(crate) max_in_flight: usize,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) retry: Backoff,
    pub(crate) max_attempts: u32,
    pub(crate) retry_after_cap: Duration,
    pub(crate) offline: Backoff,
    pub(crate) dead_letter_client_errors: bool,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) retention: Option<Duration>,
    pub(crate) retention_interval: Duration,
    /// Whether claims wait for their events' commits to be on disk (always, but for the
    /// benches that measure what that costs: [`crate::internal::without_durability_barrier`]).
    pub(crate) durability_barrier: bool,
    pub(crate) accounting_interval: Duration,
}

impl fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayConfig")
            .field("destinations", &self.destinations)
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("claim_batch", &self.claim_batch)
            .field("max_in_flight", &self.max_in_flight)
            .field("lease", &self.lease)
            .field("poll_interval", &self.poll_interval)
            .field("retry", &self.retry)
            .field("max_attempts", &self.max_attempts)
            .field("retry_after_cap", &self.retry_after_cap)
            .field("offline", &self.offline)
            .field("dead_letter_client_errors", &self.dead_letter_client_errors)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("retention", &self.retention)
            .field("retention_interval", &self.retention_interval)
            .finish()
    }
}

impl RelayConfig {
    /// How often, at most, a destination is told its streams' accounting when nothing but
    /// pending numbers changed: 2 minutes.
    pub const DEFAULT_ACCOUNTING_INTERVAL: Duration = Duration::from_secs(120);

    /// How long delivered events are kept by default: 7 days.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// Delivers every event of the default destination to `url` over HTTP, unsigned, one
    /// event per request. For signatures or batches use [`RelayConfig::new`] with a
    /// [`Destination`].
    pub fn http(url: impl Into<String>) -> Self {
        Self::new().destination(Destination::http(Destination::DEFAULT, url))
    }

    /// Delivers the default destination's events through `transport`: for tests, or a
    /// protocol other than HTTP.
    pub fn transport(transport: impl Transport) -> Self {
        Self::new().destination(Destination::custom(Destination::DEFAULT, transport))
    }

    /// A relay with no destinations yet; add them with [`destination`](Self::destination).
    pub fn new() -> Self {
        RelayConfig {
            destinations: Vec::new(),
            http_default: None,
            name: None,
            workers: 4,
            claim_batch: 100,
            max_in_flight: 400,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_millis(100),
            retry: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(300),
            },
            max_attempts: 25,
            retry_after_cap: Duration::from_secs(3600),
            offline: Backoff {
                base: Duration::from_millis(250),
                cap: Duration::from_secs(30),
            },
            dead_letter_client_errors: true,
            shutdown_timeout: Duration::from_secs(10),
            retention: Some(Self::DEFAULT_RETENTION),
            retention_interval: Duration::from_secs(3600),
            durability_barrier: true,
            accounting_interval: Self::DEFAULT_ACCOUNTING_INTERVAL,
        }
    }

    /// Adds a destination. Each destination has its own workers, in-flight limit, backoff
    /// and pause state, so one that is down or slow never holds back another.
    pub fn destination(mut self, destination: Destination) -> Self {
        let destination = match &self.http_default {
            Some(http) => destination.with_relay_http_config(http),
            None => destination,
        };
        self.destinations.push(destination);
        self
    }

    /// Sets the HTTP timeouts and extra headers of every HTTP destination that does not set
    /// its own ([`Destination::http_config`]), added before this call or after it.
    /// Defaults to [`HttpConfig::default`].
    pub fn http_config(mut self, config: HttpConfig) -> Self {
        self.destinations = self
            .destinations
            .into_iter()
            .map(|d| d.with_relay_http_config(&config))
            .collect();
        self.http_default = Some(config);
        self
    }

    /// Sets the relay's name, used in lease owners, thread names and logs. Defaults to a
    /// fresh UUID per start.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the number of delivery threads (concurrent requests) of each destination that
    /// does not set its own. Defaults to 4.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Sets how many events one claim takes at most. Defaults to 100. A destination that
    /// batches ([`Destination::batch`](crate::Destination::batch)) claims whole batches: at
    /// least one per worker, and up to four per worker while that stays within four times
    /// this.
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = n;
        self
    }

    /// Sets how many claimed events of one destination may wait for or be in delivery at
    /// once. Defaults to 400.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Sets how long a claim is valid. Another relay may take an event over once its lease
    /// expires, so it must comfortably exceed one request's timeout. Defaults to 60 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how often an idle relay checks for commits from other connections and processes
    /// (`PRAGMA data_version`, a few microseconds) when nothing tells it of them. Commits
    /// through [`Outbox::transaction`] (or followed by [`Outbox::notify`]) wake it at once,
    /// and so, with the `wal-watch` feature, does any commit to the file: the poll then runs
    /// every 5 s (or this interval, if longer) as a fallback. Defaults to 100 ms.
    ///
    /// [`Outbox::transaction`]: crate::Outbox::transaction
    /// [`Outbox::notify`]: crate::Outbox::notify
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets the retry backoff after an answered failure (5xx, 408, 429): full jitter over
    /// `base · 2^(attempt-1)`, capped. Defaults to 1 s base, 5 min cap.
    pub fn retry_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.retry = Backoff { base, cap };
        self
    }

    /// Sets the answered attempts after which an event is dead-lettered. Defaults to 25.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Sets the longest `Retry-After` honoured; longer requests are cut to this.
    /// Defaults to 1 h.
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// Sets the backoff of a whole destination that cannot be reached (refused, DNS,
    /// timeout). No event spends an attempt meanwhile. Defaults to 250 ms base, 30 s cap.
    pub fn offline_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.offline = Backoff { base, cap };
        self
    }

    /// Sets whether a 4xx other than 408 and 429 dead-letters an event at once (`true`) or
    /// is retried like a 5xx. Defaults to `true`.
    pub fn dead_letter_client_errors(mut self, yes: bool) -> Self {
        self.dead_letter_client_errors = yes;
        self
    }

    /// Sets how long [`RelayHandle::shutdown`](crate::RelayHandle::shutdown) waits for
    /// in-flight deliveries before it returns. Defaults to 10 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Sets how long delivered events are kept; the relay prunes older ones by itself, a
    /// small page per transaction, never touching pending or dead events. `None` keeps them
    /// forever. Defaults to 7 days.
    pub fn retention(mut self, keep: Option<Duration>) -> Self {
        self.retention = keep;
        self
    }

    /// Sets how often the relay prunes. The first prune runs right after start.
    /// Defaults to 1 hour.
    pub fn retention_interval(mut self, interval: Duration) -> Self {
        self.retention_interval = interval;
        self
    }

    /// How often each destination that takes accounting
    /// ([`Destination::accounting`]) is told its streams' state while it is reachable
    /// (default [`DEFAULT_ACCOUNTING_INTERVAL`](Self::DEFAULT_ACCOUNTING_INTERVAL), from 1 s
    /// to a day). A change of fate (an event expired, dropped, coalesced, dead, purged or
    /// exported) is told within a quarter of it (at most 15 s), and the relay tells the
    /// latest state once more as it stops.
    pub fn accounting_interval(mut self, interval: Duration) -> Self {
        self.accounting_interval = interval;
        self
    }

    /// The lease in milliseconds, as leases are stored.
    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Checks the settings and builds one transport per destination.
    pub(crate) fn build_transports(&self) -> Result<Vec<Arc<dyn Transport>>> {
        self.check_ranges()?;
        if self.destinations.is_empty() {
            return Err(Error::InvalidConfig("the relay has no destination".into()));
        }
        let mut transports = Vec::with_capacity(self.destinations.len());
        for (i, d) in self.destinations.iter().enumerate() {
            if self.destinations[..i].iter().any(|o| o.name() == d.name()) {
                return Err(Error::InvalidConfig(format!(
                    "destination {} is configured twice",
                    d.name()
                )));
            }
            let (rate, bandwidth) = d.pacing();
            if rate.is_some_and(|r| !(r > 0.0 && r <= 1_000_000.0)) {
                return Err(Error::InvalidConfig(format!(
                    "destination {}: a rate of {} requests per second is out of range (more \
                     than 0, at most 1,000,000)",
                    d.name(),
                    rate.unwrap_or_default()
                )));
            }
            d.budget_checked()?;
            if bandwidth == Some(0) {
                return Err(Error::InvalidConfig(format!(
                    "destination {}: a bandwidth of 0 bytes per second sends nothing (more than 0)",
                    d.name()
                )));
            }
            if let Some(linger) = d.linger_time() {
                if d.batching().is_none() {
                    return Err(Error::InvalidConfig(format!(
                        "destination {}: linger waits for events to fill a batch; set batch too",
                        d.name()
                    )));
                }
                // A worker hands back an event whose lease is half gone, unsent; lingering
                // must leave the request most of the lease.
                if linger.checked_mul(4).is_none_or(|l| l > self.lease) {
                    return Err(Error::InvalidConfig(format!(
                        "destination {}: a linger of {linger:?} is out of range: at most a \
                         quarter of the lease of {:?}",
                        d.name(),
                        self.lease
                    )));
                }
            }
            if d.worker_count() == Some(0) {
                return Err(Error::InvalidConfig(format!(
                    "destination {}: workers must be at least 1",
                    d.name()
                )));
            }
            // A worker skips an event once half its lease is gone, so a request that starts
            // must be able to finish inside the other half.
            if let Some(timeout) = d.request_timeout() {
                if timeout.checked_mul(2).is_none_or(|t| t > self.lease) {
                    return Err(Error::InvalidConfig(format!(
                        "lease of {:?} must be at least twice the request timeout of {:?} \
                         (destination {})",
                        self.lease,
                        timeout,
                        d.name()
                    )));
                }
            }
            transports.push(d.build_transport(d.worker_count().unwrap_or(self.workers))?);
        }
        Ok(transports)
    }
}

/// A setting's allowed range, for [`RelayConfig::check_ranges`].
struct Range {
    setting: &'static str,
    value: Duration,
    least: Duration,
    most: Duration,
    why: &'static str,
}

impl RelayConfig {
    /// Checks every setting against its range, so that nothing can overflow a time, spin a
    /// loop or hammer a host: each error names the setting, its value and the limit.
    fn check_ranges(&self) -> Result<()> {
        let counts = [
            ("workers", self.workers, 1_024, "each is a thread"),
            (
                "claim_batch",
                self.claim_batch,
                100_000,
                "one claim's rows are held in memory",
            ),
            (
                "max_in_flight",
                self.max_in_flight,
                1_000_000,
                "each is held in memory",
            ),
            (
                "max_attempts",
                self.max_attempts as usize,
                1_000_000,
                "a sanity bound",
            ),
        ];
        for (setting, n, most, why) in counts {
            if n == 0 || n > most {
                return Err(Error::InvalidConfig(format!(
                    "{setting} is {n}; it must be from 1 to {most} ({why})"
                )));
            }
        }
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        let day = 24 * hour;
        let ranges = [
            Range {
                setting: "lease",
                value: self.lease,
                least: ms(100),
                most: day,
                why: "a crashed relay's events wait that long",
            },
            Range {
                setting: "poll_interval",
                value: self.poll_interval,
                least: ms(1),
                most: hour,
                why: "zero would spin",
            },
            Range {
                setting: "retry_backoff base",
                value: self.retry.base,
                least: ms(1),
                most: self.retry.cap,
                why: "at most its cap",
            },
            Range {
                setting: "retry_backoff cap",
                value: self.retry.cap,
                least: ms(1),
                most: 7 * day,
                why: "a retry is due within a week",
            },
            Range {
                setting: "offline_backoff base",
                value: self.offline.base,
                least: ms(1),
                most: self.offline.cap,
                why: "zero would hammer an unreachable host",
            },
            Range {
                setting: "offline_backoff cap",
                value: self.offline.cap,
                least: ms(1),
                most: day,
                why: "a returning network is noticed within a day",
            },
            Range {
                setting: "retry_after_cap",
                value: self.retry_after_cap,
                least: Duration::ZERO,
                most: 7 * day,
                why: "a retry is due within a week",
            },
            Range {
                setting: "shutdown_timeout",
                value: self.shutdown_timeout,
                least: Duration::ZERO,
                most: hour,
                why: "shutdown must end",
            },
            Range {
                setting: "accounting_interval",
                value: self.accounting_interval,
                least: Duration::from_secs(1),
                most: day,
                why: "the fleet hears from a device at least daily",
            },
            Range {
                setting: "retention_interval",
                value: self.retention_interval,
                least: Duration::from_secs(1),
                most: 7 * day,
                why: "pruning is a background job",
            },
        ];
        for r in ranges {
            if r.value < r.least || r.value > r.most {
                return Err(Error::InvalidConfig(format!(
                    "{} of {:?} is out of range: from {:?} to {:?} ({})",
                    r.setting, r.value, r.least, r.most, r.why
                )));
            }
        }
        Ok(())
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Attempt, OutboundEvent};

    fn base() -> RelayConfig {
        RelayConfig::transport(|_: &[OutboundEvent]| Attempt::Answered {
            status: 204,
            retry_after: None,
            detail: String::new(),
        })
    }

    fn refused(config: RelayConfig) -> String {
        match config.build_transports() {
            Err(Error::InvalidConfig(msg)) => msg,
            other => panic!("accepted: {:?}", other.map(|t| t.len())),
        }
    }

    #[test]
    fn every_setting_out_of_range_is_refused_by_name() {
        let big = Duration::from_secs(9_300_000_000_000_000);
        let cases = [
            (base().lease(big), "lease"),
            (base().poll_interval(Duration::ZERO), "poll_interval"),
            (
                base().offline_backoff(Duration::ZERO, Duration::ZERO),
                "offline_backoff base",
            ),
            (
                base().retry_backoff(Duration::from_secs(10), Duration::from_secs(1)),
                "retry_backoff base",
            ),
            (base().shutdown_timeout(big), "shutdown_timeout"),
            (base().retry_after_cap(big), "retry_after_cap"),
            (base().workers(0), "workers"),
            (base().workers(100_000), "workers"),
            (base().claim_batch(0), "claim_batch"),
            (base().max_attempts(0), "max_attempts"),
            (
                base().retention_interval(Duration::ZERO),
                "retention_interval",
            ),
        ];
        for (config, setting) in cases {
            let msg = refused(config);
            assert!(msg.starts_with(setting), "{setting}: {msg}");
        }
        assert!(base().build_transports().is_ok());
    }

    #[test]
    fn a_request_timeout_that_overflows_twice_is_refused_not_a_panic() {
        let http = HttpConfig::new().request_timeout(Duration::MAX);
        let config = RelayConfig::new()
            .destination(Destination::http("d", "http://127.0.0.1:9/").http_config(http));
        let msg = refused(config);
        assert!(
            msg.contains("request_timeout") || msg.contains("twice"),
            "{msg}"
        );
    }

    #[test]
    fn the_relays_http_config_reaches_destinations_added_after_it_and_a_destinations_own_wins() {
        let timeout_of = |config: &RelayConfig, name: &str| {
            config
                .destinations
                .iter()
                .find(|d| d.name() == name)
                .and_then(Destination::request_timeout)
        };
        let relay_wide = HttpConfig::new().request_timeout(Duration::from_secs(7));
        let own = HttpConfig::new().request_timeout(Duration::from_secs(3));
        let config = RelayConfig::new()
            .destination(Destination::http("before", "http://127.0.0.1:9/"))
            .http_config(relay_wide)
            .destination(Destination::http("after", "http://127.0.0.1:9/"))
            .destination(Destination::http("own", "http://127.0.0.1:9/").http_config(own.clone()));
        assert_eq!(timeout_of(&config, "before"), Some(Duration::from_secs(7)));
        assert_eq!(timeout_of(&config, "after"), Some(Duration::from_secs(7)));
        assert_eq!(timeout_of(&config, "own"), Some(Duration::from_secs(3)));
        // Its own wins even when the relay's comes after it.
        let config = RelayConfig::new()
            .destination(Destination::http("own", "http://127.0.0.1:9/").http_config(own))
            .http_config(HttpConfig::new().request_timeout(Duration::from_secs(9)));
        assert_eq!(timeout_of(&config, "own"), Some(Duration::from_secs(3)));
    }
}
