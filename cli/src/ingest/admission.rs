//! What the ingest decides before a body is read, and while it arrives: whether the bytes
//! that arrived fit the budget shared by all connections and the share one peer may hold,
//! whether a peer has too many connections, whether its source has sent too much lately,
//! and how often a refusal is logged.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::lock;
use std::time::{Duration, Instant};

/// Sources tracked at most by the rate limiter and the refusal log: past it the ones not
/// seen for a while are forgotten, so a client inventing sources cannot grow them.
const MAX_TRACKED_SOURCES: usize = 100_000;

/// Sources (with a reason) the refusal log remembers at most, each for a minute.
const MAX_LOGGED_SOURCES: usize = 10_000;

/// Body bytes held (arrived and not yet answered), across every connection and by peer,
/// and the most there may be.
pub(crate) struct InflightBudget {
    used: AtomicUsize,
    limit: usize,
    per_peer_limit: usize,
    by_peer: Mutex<HashMap<IpAddr, usize>>,
}

/// Which budget a reservation did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// The bytes in flight across all connections.
    All,
    /// The share of one peer (an address).
    Peer,
}

/// Bytes held for one request, given back when dropped. It starts empty and grows as the
/// body arrives: a request that declares a megabyte and sends nothing holds nothing.
pub(crate) struct Reservation<'a> {
    budget: &'a InflightBudget,
    peer: IpAddr,
    bytes: usize,
}

impl Reservation<'_> {
    /// Holds `more` bytes too, or says which budget they do not fit (and holds nothing
    /// more).
    pub fn grow(&mut self, more: usize) -> Result<(), Over> {
        let budget = self.budget;
        let mut used = budget.used.load(Ordering::Acquire);
        loop {
            let after = used
                .checked_add(more)
                .filter(|after| *after <= budget.limit)
                .ok_or(Over::All)?;
            match budget.used.compare_exchange_weak(
                used,
                after,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        let mut by_peer = lock(&budget.by_peer);
        let held = by_peer.entry(self.peer).or_default();
        match held
            .checked_add(more)
            .filter(|n| *n <= budget.per_peer_limit)
        {
            Some(after) => {
                *held = after;
                self.bytes += more;
                Ok(())
            }
            None => {
                if *held == 0 {
                    by_peer.remove(&self.peer);
                }
                budget.used.fetch_sub(more, Ordering::AcqRel);
                Err(Over::Peer)
            }
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        let mut by_peer = lock(&self.budget.by_peer);
        if let Some(held) = by_peer.get_mut(&self.peer) {
            *held = held.saturating_sub(self.bytes);
            if *held == 0 {
                by_peer.remove(&self.peer);
            }
        }
    }
}

impl InflightBudget {
    pub fn new(limit: usize, per_peer_limit: usize) -> InflightBudget {
        InflightBudget {
            used: AtomicUsize::new(0),
            limit,
            per_peer_limit,
            by_peer: Mutex::new(HashMap::new()),
        }
    }

    /// An empty reservation for a request of `peer`.
    pub fn reservation(&self, peer: IpAddr) -> Reservation<'_> {
        Reservation {
            budget: self,
            peer,
            bytes: 0,
        }
    }

    /// Bytes held now.
    pub fn in_flight(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Open connections by peer, and the most one peer may have.
pub(crate) struct PeerConnections {
    limit: usize,
    open: std::sync::Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One open connection, counted until dropped (it may move to the connection's task).
pub(crate) struct PeerConnection {
    open: std::sync::Arc<Mutex<HashMap<IpAddr, usize>>>,
    peer: IpAddr,
}

impl Drop for PeerConnection {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

impl PeerConnections {
    pub fn new(limit: usize) -> PeerConnections {
        PeerConnections {
            limit,
            open: Default::default(),
        }
    }

    /// Counts a connection of `peer`, or `None` when it has as many open as it may.
    pub fn open(&self, peer: IpAddr) -> Option<PeerConnection> {
        let mut open = lock(&self.open);
        let n = open.entry(peer).or_default();
        if *n >= self.limit {
            if *n == 0 {
                open.remove(&peer);
            }
            return None;
        }
        *n += 1;
        Some(PeerConnection {
            open: std::sync::Arc::clone(&self.open),
            peer,
        })
    }
}

/// Requests a second per source, as a token bucket of one second's worth.
pub(crate) struct SourceRate {
    per_second: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl SourceRate {
    pub fn new(per_second: f64) -> SourceRate {
        SourceRate {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `source` has a request left now; if not, how long until it has one. Nothing
    /// is taken: [`take`](Self::take) takes it once the request is verified, so requests
    /// forged in a device's name do not spend its rate.
    pub fn check(&self, source: &str, now: Instant) -> Result<(), Duration> {
        let buckets = lock(&self.buckets);
        let tokens = match buckets.get(source) {
            Some(&(tokens, at)) => self.refill(tokens, at, now),
            None => self.per_second,
        };
        if tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - tokens) / self.per_second))
        }
    }

    /// Takes one request of `source`'s rate.
    pub fn take(&self, source: &str, now: Instant) {
        let mut buckets = lock(&self.buckets);
        if buckets.len() >= MAX_TRACKED_SOURCES && !buckets.contains_key(source) {
            // A full bucket again after a second: forgetting those loses nothing.
            buckets.retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(1));
        }
        let (tokens, at) = buckets
            .entry(source.to_string())
            .or_insert((self.per_second, now));
        *tokens = self.refill(*tokens, *at, now) - 1.0;
        *at = now;
    }

    fn refill(&self, tokens: f64, at: Instant, now: Instant) -> f64 {
        (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.per_second)
    }
}

/// Logs a refusal at most once a minute per registered source (and reason), and refusals
/// of sources no key is for within one budget for them all, so neither a device in a loop
/// nor a client inventing names can fill the log or the memory.
#[derive(Default)]
pub(crate) struct RefusalLog {
    last: Mutex<HashMap<(String, &'static str), Instant>>,
    /// When the map was last swept of entries older than [`Self::EVERY`].
    swept: Mutex<Option<Instant>>,
    /// Lines about unregistered sources this minute, and when the minute began.
    unregistered: Mutex<Option<(Instant, u32)>>,
}

impl RefusalLog {
    pub const EVERY: Duration = Duration::from_secs(60);
    /// Lines a minute about sources no key is for, all of them together.
    pub const UNREGISTERED_PER_MINUTE: u32 = 10;

    /// Whether a refusal of the registered `source` for `reason` at `now` should be logged.
    pub fn should_log(&self, source: &str, reason: &'static str, now: Instant) -> bool {
        let mut last = lock(&self.last);
        {
            // Entries older than a minute say nothing any more: swept once a minute.
            let mut swept = lock(&self.swept);
            if swept.is_none_or(|at| now.duration_since(at) >= Self::EVERY) {
                last.retain(|_, at| now.duration_since(*at) < Self::EVERY);
                *swept = Some(now);
            }
        }
        let room = last.len() < MAX_LOGGED_SOURCES;
        match last.get_mut(&(source.to_string(), reason)) {
            Some(at) if now.duration_since(*at) < Self::EVERY => false,
            Some(at) => {
                *at = now;
                true
            }
            None if room => {
                last.insert((source.to_string(), reason), now);
                true
            }
            // Past it (names invented under a prefix a key covers), the shared budget: a
            // name of up to 1 KiB per entry would otherwise keep megabytes.
            None => {
                drop(last);
                self.should_log_unregistered(now)
            }
        }
    }

    /// Whether a refusal of a source no key is for should be logged: at most
    /// [`Self::UNREGISTERED_PER_MINUTE`] a minute in all, and nothing kept per name.
    pub fn should_log_unregistered(&self, now: Instant) -> bool {
        let mut minute = lock(&self.unregistered);
        match minute.as_mut() {
            Some((began, lines)) if now.duration_since(*began) < Self::EVERY => {
                *lines += 1;
                *lines <= Self::UNREGISTERED_PER_MINUTE
            }
            _ => {
                *minute = Some((now, 1));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_what_arrived_within_the_total_and_each_peers_share() {
        let budget = InflightBudget::new(100, 60);
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut first = budget.reservation(a);
        assert_eq!(budget.in_flight(), 0, "an empty reservation holds nothing");
        first.grow(40).unwrap();
        let mut second = budget.reservation(a);
        assert_eq!(second.grow(30), Err(Over::Peer), "a's share is 60");
        second.grow(20).unwrap();
        let mut other = budget.reservation(b);
        assert_eq!(other.grow(41), Err(Over::All));
        other.grow(40).unwrap();
        assert_eq!(budget.in_flight(), 100);
        drop(first);
        assert_eq!(budget.in_flight(), 60);
        second.grow(40).unwrap();
        assert_eq!(second.bytes(), 60);
        assert_eq!(second.grow(usize::MAX), Err(Over::All));
        drop(second);
        drop(other);
        assert_eq!(budget.in_flight(), 0);
        assert!(lock(&budget.by_peer).is_empty(), "no peer is kept at zero");
    }

    #[test]
    fn a_peer_opens_as_many_connections_as_it_may() {
        let peers = PeerConnections::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let one = peers.open(a).unwrap();
        let _two = peers.open(a).unwrap();
        assert!(peers.open(a).is_none());
        assert!(peers.open("10.0.0.2".parse().unwrap()).is_some());
        drop(one);
        assert!(peers.open(a).is_some());
    }

    #[test]
    fn a_source_gets_its_rate_and_others_are_untouched() {
        let rate = SourceRate::new(2.0);
        let start = Instant::now();
        for _ in 0..2 {
            assert!(rate.check("/a", start).is_ok());
            rate.take("/a", start);
        }
        let wait = rate.check("/a", start).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(rate.check("/b", start).is_ok());
        assert!(rate.check("/a", start + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn a_refusal_is_logged_once_a_minute_per_source() {
        let log = RefusalLog::default();
        let start = Instant::now();
        assert!(log.should_log("/a", "forged_source", start));
        assert!(!log.should_log("/a", "forged_source", start + Duration::from_secs(30)));
        assert!(log.should_log("/b", "forged_source", start));
        assert!(log.should_log("/a", "forged_source", start + Duration::from_secs(61)));
        // A minute later the sweep has forgotten b.
        assert_eq!(lock(&log.last).len(), 1);
        // Past the names it remembers, the shared budget.
        let later = start + Duration::from_secs(200);
        let logged = (0..MAX_LOGGED_SOURCES + 1_000)
            .filter(|i| log.should_log(&format!("/s/{i}"), "slow_body", later))
            .count();
        assert_eq!(
            logged,
            MAX_LOGGED_SOURCES + RefusalLog::UNREGISTERED_PER_MINUTE as usize
        );
        assert_eq!(lock(&log.last).len(), MAX_LOGGED_SOURCES);
    }

    #[test]
    fn unregistered_sources_share_one_budget_of_lines() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let logged = (0..1_000)
            .filter(|_| log.should_log_unregistered(start))
            .count();
        assert_eq!(logged, RefusalLog::UNREGISTERED_PER_MINUTE as usize);
        assert!(log.should_log_unregistered(start + Duration::from_secs(61)));
    }
}
