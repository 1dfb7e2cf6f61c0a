//! Which HTTP proxy a destination goes through: one given (`HttpConfig::proxy`), or the
//! environment's read the way curl reads it (`HttpConfig::proxy_from_env`), and the
//! destination hosts `NO_PROXY` exempts.

/// Where a destination's proxy comes from.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) enum ProxySetting {
    /// No proxy, whatever the environment says (the default).
    #[default]
    Off,
    /// This proxy URL.
    Url(String),
    /// The environment's, read at start.
    FromEnv,
}

/// The proxy URL for a destination whose URL has `scheme` and `host`, as curl chooses it
/// from `var` (an environment lookup): `https_proxy` (or `HTTPS_PROXY`) for https,
/// `http_proxy` for http (lowercase only, as curl: a CGI program's `HTTP_PROXY` can come
/// from a request's `Proxy` header), then `all_proxy` (or `ALL_PROXY`); none when the
/// host is in `no_proxy` (or `NO_PROXY`).
pub(crate) fn from_env(
    scheme: &str,
    host: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let first = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| var(name).filter(|v| !v.trim().is_empty()))
    };
    let no_proxy = first(&["no_proxy", "NO_PROXY"]).unwrap_or_default();
    if exempt(&no_proxy, host) {
        return None;
    }
    let by_scheme: &[&str] = if scheme.eq_ignore_ascii_case("https") {
        &["https_proxy", "HTTPS_PROXY"]
    } else {
        &["http_proxy"]
    };
    first(by_scheme).or_else(|| first(&["all_proxy", "ALL_PROXY"]))
}

/// Whether `host` is in a `NO_PROXY` list: `*` exempts every host; an entry exempts the
/// host itself and every name under it (`example.com` and `.example.com` both exempt
/// `api.example.com`); a port on an entry is ignored; IP addresses match exactly.
pub(crate) fn exempt(no_proxy: &str, host: &str) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    no_proxy.split(',').map(str::trim).any(|entry| {
        if entry == "*" {
            return true;
        }
        let entry = entry.trim_start_matches('[');
        let entry = match entry.rsplit_once(']') {
            Some((address, _)) => address,
            None if entry.matches(':').count() == 1 => entry.split(':').next().unwrap_or(entry),
            None => entry,
        };
        let entry = entry.trim_start_matches('.').to_ascii_lowercase();
        !entry.is_empty() && (host == entry || host.ends_with(&format!(".{entry}")))
    })
}

/// A proxy URL as it may be shown: without its password.
pub(crate) fn shown(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{}{user}:***@{}", &url[..scheme_end + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_environment_is_read_as_curl_reads_it() {
        let vars = [
            ("https_proxy", "http://secure:3128"),
            ("http_proxy", "http://plain:3128"),
            ("ALL_PROXY", "http://all:3128"),
        ];
        assert_eq!(
            from_env("https", "api.example.com", env(&vars)).as_deref(),
            Some("http://secure:3128")
        );
        assert_eq!(
            from_env("http", "api.example.com", env(&vars)).as_deref(),
            Some("http://plain:3128")
        );
        // Uppercase HTTP_PROXY is not read (httpoxy); ALL_PROXY is the fallback.
        let upper = [
            ("HTTP_PROXY", "http://evil:1"),
            ("ALL_PROXY", "http://all:3128"),
        ];
        assert_eq!(
            from_env("http", "h", env(&upper)).as_deref(),
            Some("http://all:3128")
        );
        assert_eq!(
            from_env("http", "h", env(&[("HTTP_PROXY", "http://evil:1")])),
            None
        );
        let upper_https = [("HTTPS_PROXY", "http://secure:3128")];
        assert_eq!(
            from_env("https", "h", env(&upper_https)).as_deref(),
            Some("http://secure:3128")
        );
        // NO_PROXY exempts hosts.
        let exempted = [
            ("https_proxy", "http://p:1"),
            ("NO_PROXY", "localhost,.internal"),
        ];
        assert_eq!(from_env("https", "db.internal", env(&exempted)), None);
        assert!(from_env("https", "example.com", env(&exempted)).is_some());
        assert_eq!(from_env("https", "h", env(&[])), None);
    }

    #[test]
    fn no_proxy_entries_match_the_host_and_its_subdomains() {
        for (list, host, expected) in [
            ("*", "anything", true),
            ("example.com", "example.com", true),
            ("example.com", "api.example.com", true),
            (".example.com", "api.example.com", true),
            ("example.com", "badexample.com", false),
            ("example.com:8443", "example.com", true),
            ("10.0.0.1", "10.0.0.1", true),
            ("10.0.0.1", "10.0.0.12", false),
            ("[::1]:80", "[::1]", true),
            (" a.com , B.com ", "b.com", true),
            ("", "x", false),
        ] {
            assert_eq!(exempt(list, host), expected, "{list:?} {host:?}");
        }
    }

    #[test]
    fn a_proxy_is_shown_without_its_password() {
        assert_eq!(
            shown("http://u:s3cret@proxy:3128"),
            "http://u:***@proxy:3128"
        );
        assert_eq!(shown("http://proxy:3128"), "http://proxy:3128");
    }
}
