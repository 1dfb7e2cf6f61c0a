//! Name lookups for the HTTP transport: once per host every [`LOOKUP_TTL`], not once per
//! request.
//!
//! ureq looks the host up before every request, even one that goes out on a pooled
//! keep-alive connection, and with a lookup timeout set (the relay sets one: a hung DNS
//! server must not hold a worker) it spawns a thread per lookup to enforce it. At one event
//! per request that was a thread created and torn down per event, on every worker
//! (`perf`: `clone3`, `copy_process` and TLB shootdowns in the workers' profile). This
//! resolver keeps the answer for a while and asks ureq's own resolver, timeout included,
//! only when it has none or it is stale. A failed lookup is not kept.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long a looked-up address is used before the host is looked up again: short enough
/// to follow a DNS fail-over within a minute, long enough that a busy relay looks up a
/// handful of times a minute instead of thousands of times a second.
pub(crate) const LOOKUP_TTL: Duration = Duration::from_secs(30);

/// ureq's resolver, with its last answer per host kept for [`LOOKUP_TTL`].
#[derive(Debug, Default)]
pub(crate) struct CachingResolver {
    inner: DefaultResolver,
    /// The latest answers: `(scheme://authority, when looked up, addresses)`. A transport
    /// posts to one URL, so this holds one entry, or a few after redirects of the config.
    answers: Mutex<Vec<(String, Instant, ResolvedSocketAddrs)>>,
}

/// At most this many hosts are remembered (a transport talks to one).
const MAX_HOSTS: usize = 4;

impl Resolver for CachingResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let scheme = uri.scheme_str().unwrap_or("");
        let authority = uri.authority().map_or("", |a| a.as_str());
        if let Some(addresses) = self.fresh(scheme, authority) {
            return Ok(addresses);
        }
        // Built only on a miss: a hit costs no allocation (this runs once per request).
        let key = format!("{scheme}://{authority}");
        let addresses = self.inner.resolve(uri, config, timeout)?;
        let mut answers = self
            .answers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        answers.retain(|(k, _, _)| *k != key);
        if answers.len() >= MAX_HOSTS {
            answers.remove(0);
        }
        answers.push((key, Instant::now(), addresses.clone()));
        Ok(addresses)
    }
}

impl CachingResolver {
    /// The kept answer for `scheme://authority`, if it is younger than [`LOOKUP_TTL`].
    fn fresh(&self, scheme: &str, authority: &str) -> Option<ResolvedSocketAddrs> {
        let is_key = |k: &str| {
            k.strip_prefix(scheme)
                .and_then(|rest| rest.strip_prefix("://"))
                .is_some_and(|rest| rest == authority)
        };
        let answers = self
            .answers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        answers
            .iter()
            .find(|(k, at, _)| is_key(k) && at.elapsed() < LOOKUP_TTL)
            .map(|(_, _, addresses)| addresses.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(resolver: &CachingResolver, url: &str) -> Vec<std::net::SocketAddr> {
        let uri: Uri = url.parse().unwrap();
        let config = Config::default();
        // No deadline: the lookup of an address literal needs none.
        let timeout = NextTimeout::default();
        resolver
            .resolve(&uri, &config, timeout)
            .unwrap()
            .iter()
            .copied()
            .collect()
    }

    #[test]
    fn an_answer_is_kept_per_host_and_port() {
        let resolver = CachingResolver::default();
        let first = resolve(&resolver, "http://127.0.0.1:8080/events");
        assert_eq!(first, ["127.0.0.1:8080".parse().unwrap()]);
        assert_eq!(resolver.answers.lock().unwrap().len(), 1);
        // The same host again: the kept answer, no second entry.
        assert_eq!(resolve(&resolver, "http://127.0.0.1:8080/other"), first);
        assert_eq!(resolver.answers.lock().unwrap().len(), 1);
        // Another port is another answer.
        assert_eq!(
            resolve(&resolver, "http://127.0.0.1:9090/"),
            ["127.0.0.1:9090".parse::<std::net::SocketAddr>().unwrap()]
        );
        assert_eq!(resolver.answers.lock().unwrap().len(), 2);
        // The same authority under another scheme, or a longer one, is not a hit.
        assert!(resolver.fresh("http", "127.0.0.1:8080").is_some());
        assert!(resolver.fresh("https", "127.0.0.1:8080").is_none());
        assert!(resolver.fresh("http", "127.0.0.1:80").is_none());
        assert!(resolver.fresh("http", "127.0.0.1:80800").is_none());
    }

    #[test]
    fn a_stale_answer_is_looked_up_again() {
        let resolver = CachingResolver::default();
        resolve(&resolver, "http://127.0.0.1:8080/");
        let stale = Instant::now().checked_sub(LOOKUP_TTL + Duration::from_secs(1));
        let Some(stale) = stale else { return };
        resolver.answers.lock().unwrap()[0].1 = stale;
        assert!(resolver.fresh("http", "127.0.0.1:8080").is_none());
        resolve(&resolver, "http://127.0.0.1:8080/");
        let answers = resolver.answers.lock().unwrap();
        assert_eq!(answers.len(), 1);
        assert!(answers[0].1.elapsed() < LOOKUP_TTL, "looked up afresh");
    }
}
