//! W3C Trace Context: the `traceparent` and `tracestate` an event carries from where it was
//! written to every receiver (the CloudEvents Distributed Tracing extension).
//!
//! Checked when the event is written, with the same rules in `schema.sql`'s enqueue trigger,
//! so a malformed value never reaches the wire: version `00` only (the one this crate writes
//! and can vouch for), lowercase hex, trace id and parent id not all zeros; `tracestate` at
//! most 32 `key=value` members (keys as the specification writes them, each once) and 512
//! bytes.

use std::fmt;

/// The longest `tracestate` kept, in bytes (what the specification asks implementations to
/// propagate at least, and what they commonly cap it at).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// The most members a `tracestate` holds.
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The length of a version-00 `traceparent`: `00-` 32 hex `-` 16 hex `-` 2 hex.
const TRACEPARENT_LEN: usize = 55;

/// A W3C `traceparent` of version 00, checked.
///
/// ```
/// use sqlite_outbox::receive::TraceParent;
/// let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(tp.parent_id(), "00f067aa0ba902b7");
/// assert!(tp.is_sampled());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent<'a> {
    text: &'a str,
}

impl<'a> TraceParent<'a> {
    /// Checks `text` as a version-00 `traceparent`.
    ///
    /// # Errors
    ///
    /// [`TraceContextError`] saying what is wrong.
    pub fn parse(text: &'a str) -> Result<TraceParent<'a>, TraceContextError> {
        let bad = |why: &str| Err(TraceContextError(why.to_string()));
        let bytes = text.as_bytes();
        if bytes.len() != TRACEPARENT_LEN {
            return bad("is not W3C Trace Context: expected 55 characters, \
                 00-{32 hex trace id}-{16 hex parent id}-{2 hex flags}");
        }
        if &bytes[..3] != b"00-" {
            return bad("is not W3C Trace Context version 00 (it must start with \"00-\")");
        }
        if bytes[35] != b'-' || bytes[52] != b'-' {
            return bad(
                "is not W3C Trace Context: expected 00-{32 hex trace id}-{16 hex parent id}-{2 hex flags}",
            );
        }
        let lower_hex = |range: std::ops::Range<usize>| {
            bytes[range]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        };
        if !lower_hex(3..35) || !lower_hex(36..52) || !lower_hex(53..55) {
            return bad("is not W3C Trace Context: ids and flags are lowercase hex digits");
        }
        if bytes[3..35].iter().all(|b| *b == b'0') {
            return bad("has an all-zero trace id, which W3C Trace Context forbids");
        }
        if bytes[36..52].iter().all(|b| *b == b'0') {
            return bad("has an all-zero parent id, which W3C Trace Context forbids");
        }
        Ok(TraceParent { text })
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &'a str {
        &self.text[3..35]
    }

    /// The 16 hex digits of the parent (span) id.
    pub fn parent_id(&self) -> &'a str {
        &self.text[36..52]
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.text[53..55], 16).unwrap_or(0)
    }

    /// Whether the caller recorded the trace (flag `01`).
    pub fn is_sampled(&self) -> bool {
        self.flags() & 1 == 1
    }

    /// The whole header value.
    pub fn as_str(&self) -> &'a str {
        self.text
    }
}

impl fmt::Display for TraceParent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

/// Why a `traceparent` or `tracestate` is not W3C Trace Context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContextError(String);

impl fmt::Display for TraceContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceContextError {}

/// Checks `text` as a W3C `tracestate`: comma-separated `key=value` members (empty ones and
/// spaces or tabs around them allowed), at most [`MAX_TRACESTATE_MEMBERS`], each key once,
/// at most [`MAX_TRACESTATE_LEN`] bytes in all.
///
/// # Errors
///
/// [`TraceContextError`] naming the member that is wrong.
pub fn check_tracestate(text: &str) -> Result<(), TraceContextError> {
    let bad = |why: String| Err(TraceContextError(why));
    if text.len() > MAX_TRACESTATE_LEN {
        return bad(format!(
            "is {} bytes long, over the limit of {MAX_TRACESTATE_LEN} bytes",
            text.len()
        ));
    }
    let members: Vec<&str> = text.split(',').collect();
    if members.len() > MAX_TRACESTATE_MEMBERS {
        return bad(format!(
            "has {} members, over the limit of {MAX_TRACESTATE_MEMBERS}",
            members.len()
        ));
    }
    let mut keys: Vec<&str> = Vec::with_capacity(members.len());
    for member in members {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, value)) = member.split_once('=') else {
            return bad(format!("member {member:?} is not key=value"));
        };
        if !is_tracestate_key(key) {
            return bad(format!(
                "key {key:?} is not a tracestate key (lowercase letters, digits, _ - * /, \
                 an optional tenant@system, at most 256 characters)"
            ));
        }
        if !is_tracestate_value(value) {
            return bad(format!(
                "the value of {key:?} is not a tracestate value (1 to 256 printable ASCII \
                 characters but , and =, not ending in a space)"
            ));
        }
        if keys.contains(&key) {
            return bad(format!("key {key:?} appears twice"));
        }
        keys.push(key);
    }
    Ok(())
}

/// `lcalpha / DIGIT / "_" / "-" / "*" / "/"`: what follows a key's first character.
fn is_key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

/// `simple-key` (a lowercase letter, then up to 255 key characters) or `multi-tenant-key`
/// (`tenant@system`: a tenant of a lowercase letter or digit and up to 240 more, a system
/// of a lowercase letter and up to 13 more).
fn is_tracestate_key(key: &str) -> bool {
    let rest_ok = |s: &[u8], most: usize| s.len() <= most && s.iter().all(|b| is_key_char(*b));
    match key.split_once('@') {
        None => match key.as_bytes() {
            [first, rest @ ..] => first.is_ascii_lowercase() && rest_ok(rest, 255),
            [] => false,
        },
        Some((tenant, system)) => {
            let tenant_ok = match tenant.as_bytes() {
                [first, rest @ ..] => {
                    (first.is_ascii_lowercase() || first.is_ascii_digit()) && rest_ok(rest, 240)
                }
                [] => false,
            };
            let system_ok = match system.as_bytes() {
                [first, rest @ ..] => first.is_ascii_lowercase() && rest_ok(rest, 13),
                [] => false,
            };
            tenant_ok && system_ok
        }
    }
}

/// `0*255(chr) nblk-chr`: printable ASCII but `,` and `=`, spaces inside only.
fn is_tracestate_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 256
        && bytes
            .iter()
            .all(|b| (0x20..=0x7e).contains(b) && *b != b',' && *b != b'=')
        && bytes.last() != Some(&b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_parses_into_its_parts() {
        let tp = TraceParent::parse(GOOD).unwrap();
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id(), "00f067aa0ba902b7");
        assert_eq!(tp.flags(), 1);
        assert!(TraceParent::parse(&GOOD.replace("-01", "-00")).is_ok_and(|tp| !tp.is_sampled()));
    }

    #[test]
    fn malformed_traceparents_are_refused_with_the_reason() {
        let cases = [
            ("", "55 characters"),
            (&GOOD[..54], "55 characters"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version 00",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version 00",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "lowercase",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "all-zero trace",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "all-zero parent",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                "expected",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                "lowercase",
            ),
        ];
        for (text, why) in cases {
            let err = TraceParent::parse(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err:#}");
        }
    }

    #[test]
    fn tracestate_follows_the_list_rules() {
        for good in [
            "rojo=00f067aa0ba902b7",
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            " rojo=1 ,\tcongo=2 ,, ",
            "tenant1@vendor=a b",
            "0tenant@sys=x",
            "",
        ] {
            assert!(check_tracestate(good).is_ok(), "{good:?}");
        }
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let long = format!("k={}", "v".repeat(255)) + &format!(",j={}", "v".repeat(255));
        for (bad, why) in [
            ("rojo", "not key=value"),
            ("Rojo=1", "not a tracestate key"),
            ("1rojo=1", "not a tracestate key"),
            ("rojo=", "not a tracestate value"),
            ("rojo=a=b", "not a tracestate value"),
            ("rojo=\u{e9}", "not a tracestate value"),
            ("a@toolongsystemid=1", "not a tracestate key"),
            ("rojo=1,rojo=2", "twice"),
            (many.as_str(), "33 members"),
            (long.as_str(), "over the limit of 512 bytes"),
        ] {
            let err = check_tracestate(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err:#}");
        }
    }
}
