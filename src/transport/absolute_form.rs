//! Plain `http://` destinations through a forward proxy, the way HTTP/1.1 sends them: to
//! the proxy's address, each request line in absolute form (`POST http://host:port/path
//! HTTP/1.1`, RFC 9112 §3.2.2) with the proxy's credentials in `Proxy-Authorization`.
//!
//! ureq sends every proxied request through a `CONNECT` tunnel, which many company proxies
//! allow only to port 443, and which hides plain requests from the proxy that is meant to
//! see them. So for plain HTTP the transport keeps its own connections
//! ([`super::tcp`]): [`ProxyResolver`] gives them the proxy's addresses, and each request's
//! head is rewritten by [`AbsoluteForm::rewrite`] as it is handed over. HTTPS keeps going
//! through ureq's `CONNECT`.

use std::sync::Arc;

use base64::Engine;
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

use super::resolver::CachingResolver;

/// How one destination's request heads are rewritten for its proxy.
pub(crate) struct AbsoluteForm {
    /// `http://host[:port]`, put before the path of every request line.
    origin: Vec<u8>,
    /// `Proxy-Authorization: Basic …\r\n`, when the proxy's URL has credentials.
    authorization: Option<Vec<u8>>,
}

impl std::fmt::Debug for AbsoluteForm {
    /// The origin only: the credentials are never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbsoluteForm")
            .field("origin", &String::from_utf8_lossy(&self.origin))
            .field("authorization", &self.authorization.as_ref().map(|_| "***"))
            .finish()
    }
}

impl AbsoluteForm {
    /// The rewrite for requests to `destination` (an `http://` URL) through `proxy`.
    pub(crate) fn new(destination: &Uri, proxy: &ureq::Proxy) -> Arc<AbsoluteForm> {
        let authority = destination.authority().map_or("", |a| a.as_str());
        // Credentials in the destination's URL are not part of a request target.
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let authorization = (proxy.username().is_some() || proxy.password().is_some()).then(|| {
            let credentials = format!(
                "{}:{}",
                proxy.username().unwrap_or_default(),
                proxy.password().unwrap_or_default()
            );
            let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
            format!("Proxy-Authorization: Basic {encoded}\r\n").into_bytes()
        });
        Arc::new(AbsoluteForm {
            origin: format!("http://{authority}").into_bytes(),
            authorization,
        })
    }

    /// The first bytes of a request (`head`, starting with its request line) with the
    /// target in absolute form and the proxy's credentials after the request line; `None`
    /// when `head` does not hold a whole request line in origin form.
    pub(crate) fn rewrite(&self, head: &[u8]) -> Option<Vec<u8>> {
        let target = head.iter().position(|&b| b == b' ')? + 1;
        if head.get(target) != Some(&b'/') {
            return None;
        }
        let line_end = head.windows(2).position(|w| w == b"\r\n")? + 2;
        if line_end <= target {
            return None;
        }
        let extra = self.origin.len() + self.authorization.as_ref().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(head.len() + extra);
        out.extend_from_slice(&head[..target]);
        out.extend_from_slice(&self.origin);
        out.extend_from_slice(&head[target..line_end]);
        if let Some(authorization) = &self.authorization {
            out.extend_from_slice(authorization);
        }
        out.extend_from_slice(&head[line_end..]);
        Some(out)
    }
}

/// Looks up the proxy's host, whatever the request's URL: the connections go to the proxy.
#[derive(Debug)]
pub(crate) struct ProxyResolver {
    /// `http://proxy-host:port`, without credentials.
    proxy: Uri,
    inner: CachingResolver,
}

impl ProxyResolver {
    /// The resolver for connections to `proxy`.
    pub(crate) fn new(proxy: &ureq::Proxy) -> Result<ProxyResolver, ureq::http::uri::InvalidUri> {
        let host = proxy.host();
        // An IPv6 address keeps its brackets in a URL.
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let proxy = format!("http://{host}:{}", proxy.port()).parse()?;
        Ok(ProxyResolver {
            proxy,
            inner: CachingResolver::default(),
        })
    }
}

impl Resolver for ProxyResolver {
    fn resolve(
        &self,
        _uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        self.inner.resolve(&self.proxy, config, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(destination: &str, proxy: &str) -> Arc<AbsoluteForm> {
        AbsoluteForm::new(
            &destination.parse().unwrap(),
            &ureq::Proxy::new(proxy).unwrap(),
        )
    }

    #[test]
    fn the_request_line_takes_the_origin_and_the_credentials_follow_it() {
        let form = form(
            "http://receiver.local:8080/events",
            "http://al%40ce:pa%3Ass@proxy:3128",
        );
        let head = b"POST /events?x=1 HTTP/1.1\r\nhost: receiver.local:8080\r\n\r\n{}";
        let out = String::from_utf8(form.rewrite(head).unwrap()).unwrap();
        // "al@ce:pa:ss", decoded from the URL, in base64.
        assert_eq!(
            out,
            "POST http://receiver.local:8080/events?x=1 HTTP/1.1\r\n\
             Proxy-Authorization: Basic YWxAY2U6cGE6c3M=\r\n\
             host: receiver.local:8080\r\n\r\n{}"
        );
        assert!(!format!("{form:?}").contains("YWx"));
    }

    #[test]
    fn without_credentials_only_the_target_changes() {
        let form = form("http://10.0.0.7/in", "http://proxy:3128");
        let out = form.rewrite(b"POST /in HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(out, b"POST http://10.0.0.7/in HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn bytes_that_do_not_begin_a_request_are_refused() {
        let form = form("http://h/in", "http://proxy:3128");
        assert!(form.rewrite(b"POST /in HTTP/1.1").is_none(), "no line end");
        assert!(form.rewrite(b"{\"id\": 1}\r\n").is_none(), "a body");
        assert!(
            form.rewrite(b"POST http://h/in HTTP/1.1\r\n").is_none(),
            "already absolute"
        );
    }

    #[test]
    fn the_resolver_looks_up_the_proxy_and_not_the_destination() {
        let proxy = ureq::Proxy::new("http://u:p@127.0.0.1:3128").unwrap();
        let resolver = ProxyResolver::new(&proxy).unwrap();
        let addrs = resolver
            .resolve(
                &"http://receiver.invalid/events".parse().unwrap(),
                &Config::default(),
                NextTimeout::default(),
            )
            .unwrap();
        assert_eq!(
            addrs.iter().copied().collect::<Vec<_>>(),
            vec!["127.0.0.1:3128".parse().unwrap()]
        );
    }
}
