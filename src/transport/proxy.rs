//! Which HTTP proxy a destination goes through: one given (`HttpConfig::proxy`), or the
//! environment's read the way curl reads it (`HttpConfig::proxy_from_env`), and the
//! destination hosts `NO_PROXY` exempts.

use std::net::IpAddr;

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

/// Whether `host` is in a `NO_PROXY` list, as curl (7.86 and later) reads it: `*` exempts
/// every host; an entry exempts the host itself and every name under it (`example.com` and
/// `.example.com` both exempt `api.example.com`); a port on an entry is ignored; an IP
/// address matches the same address however it is written, and a range (`127.0.0.0/8`,
/// `fd00::/8`) every address in it. Ranges match addresses only: a name is not resolved to
/// be matched against them, as curl does not.
pub(crate) fn exempt(no_proxy: &str, host: &str) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let address = host.parse::<IpAddr>().ok();
    no_proxy.split(',').map(str::trim).any(|entry| {
        if entry == "*" {
            return true;
        }
        if let Some(address) = address {
            if let Some(hit) = address_entry_matches(entry, address) {
                return hit;
            }
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

/// Whether an entry that is an address (`10.1.2.3`, `::1`, `[::1]`) or a range
/// (`127.0.0.0/8`, `fd00::/8`) holds `address`; None when the entry is a name.
fn address_entry_matches(entry: &str, address: IpAddr) -> Option<bool> {
    let (network, bits) = match entry.split_once('/') {
        Some((network, bits)) => (network, Some(bits)),
        None => (entry, None),
    };
    let network = network
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()?;
    let width = match network {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let bits = match bits {
        None => width,
        // A malformed or too wide prefix matches nothing (curl's reading too).
        Some(bits) => match bits.parse::<u32>() {
            Ok(bits) if bits <= width => bits,
            _ => return Some(false),
        },
    };
    // An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is the IPv4 one.
    let address = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    };
    Some(match (network, address) {
        (IpAddr::V4(network), IpAddr::V4(address)) => {
            same_prefix(&network.octets(), &address.octets(), bits)
        }
        (IpAddr::V6(network), IpAddr::V6(address)) => {
            same_prefix(&network.octets(), &address.octets(), bits)
        }
        _ => false,
    })
}

/// Whether the first `bits` bits of `a` and `b` are the same.
fn same_prefix(a: &[u8], b: &[u8], bits: u32) -> bool {
    let whole = (bits / 8) as usize;
    let rest = bits % 8;
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
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
            // Ranges, as curl 7.86 and later read them.
            ("localhost,127.0.0.0/8,::1", "127.0.0.1", true),
            ("127.0.0.0/8", "127.255.1.2", true),
            ("127.0.0.0/8", "128.0.0.1", false),
            ("10.1.0.0/16", "10.1.255.255", true),
            ("10.1.0.0/16", "10.2.0.1", false),
            ("192.168.1.128/25", "192.168.1.200", true),
            ("192.168.1.128/25", "192.168.1.100", false),
            ("0.0.0.0/0", "8.8.8.8", true),
            ("10.0.0.0/33", "10.0.0.1", false),
            ("10.0.0.0/x", "10.0.0.1", false),
            ("::1", "[::1]", true),
            ("::1", "[0:0:0:0:0:0:0:1]", true),
            ("fd00::/8", "[fd12:3456::1]", true),
            ("fd00::/8", "[fe80::1]", false),
            ("[fd00::]/8", "[fdff::1]", true),
            ("127.0.0.0/8", "[::ffff:127.0.0.1]", true),
            ("127.0.0.0/8", "[::1]", false),
            // A range holds addresses, not names (curl does not resolve to match either).
            ("127.0.0.0/8", "localhost", false),
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
