//! Which keys may sign for which sources, and verification that holds a request to it.
//!
//! A [`Verifier`] built from every device's public key accepts any device's signature for
//! any source: a device (or anyone who took its key off its pole) could write as every
//! other. A [`KeyRegistry`] binds each key to the sources it may sign for, and
//! [`verify_request_for`] checks the request against the keys of the source it names in
//! `outbox-source` and then that every event in it is of that source.

use std::collections::HashMap;
use std::time::Duration;

use crate::receive::inbox::{verify_request, ReceiveError};
use crate::wire::cloudevents::CloudEvent;
use crate::wire::signature::{Verifier, VerifyError, VerifyingKey};
use crate::wire::source_header::{decode_source_header, SOURCE_HEADER};

/// Which sources a key signs for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Any,
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, VerifyError> {
        let bad = |why: String| VerifyError::InvalidSourcePattern(why);
        if text.is_empty() {
            return Err(bad("the source pattern is empty".into()));
        }
        Ok(match text.strip_suffix('*') {
            Some("") => Pattern::Any,
            Some(prefix) if prefix.contains('*') => {
                return Err(bad(format!("{text:?}: `*` may only end a prefix")))
            }
            Some(prefix) => Pattern::Prefix(prefix.to_string()),
            None if text.contains('*') => {
                return Err(bad(format!("{text:?}: `*` may only end a prefix")))
            }
            None => Pattern::Exact(text.to_string()),
        })
    }
}

/// Keys by the sources they may sign for: an exact source (`/devices/42`), a prefix ending
/// in `*` (`/site-7/*`), or `*` for any source (a secret the whole fleet shares). Several
/// keys may sign for one source (a rotation: the old and the new key until the old one is
/// removed).
///
/// ```
/// use sqlite_outbox::receive::{verify_request_for, KeyRegistry, SigningKey, VerifyingKey};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (device, _) = SigningKey::generate()?; // on the device; the receiver has the public key
/// let mut registry = KeyRegistry::new();
/// registry.add("/devices/42", VerifyingKey::Public(device.public_key()))?;
///
/// let body = br#"{"specversion":"1.0","id":"e1","source":"/devices/42","type":"t"}"#;
/// let now = 1_700_000_000;
/// let headers = [
///     ("content-type", "application/cloudevents+json".to_string()),
///     ("outbox-source", "/devices/42".to_string()),
///     ("webhook-id", "m1".to_string()),
///     ("webhook-timestamp", now.to_string()),
///     ("webhook-signature", device.sign("m1", now, body)),
/// ];
/// let events = verify_request_for(&registry, &headers, body, now)?;
/// assert_eq!(events[0].source, "/devices/42");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct KeyRegistry {
    exact: HashMap<String, Vec<VerifyingKey>>,
    prefixes: Vec<(String, VerifyingKey)>,
    any: Vec<VerifyingKey>,
    tolerance: Option<Duration>,
}

impl KeyRegistry {
    /// An empty registry: it verifies nothing until keys are added.
    pub fn new() -> KeyRegistry {
        KeyRegistry::default()
    }

    /// Lets `key` sign for the sources `source_pattern` names: one source, a prefix ending
    /// in `*`, or `*` for any.
    ///
    /// # Errors
    ///
    /// [`VerifyError::InvalidSourcePattern`] for an empty pattern or a `*` anywhere but at
    /// its end.
    pub fn add(
        &mut self,
        source_pattern: &str,
        key: VerifyingKey,
    ) -> Result<&mut KeyRegistry, VerifyError> {
        match Pattern::parse(source_pattern)? {
            Pattern::Any => self.any.push(key),
            Pattern::Exact(source) => self.exact.entry(source).or_default().push(key),
            Pattern::Prefix(prefix) => self.prefixes.push((prefix, key)),
        }
        Ok(self)
    }

    /// Whether `source_pattern` is one [`add`](Self::add) takes.
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    pub fn check_pattern(source_pattern: &str) -> Result<(), VerifyError> {
        Pattern::parse(source_pattern).map(drop)
    }

    /// How far `webhook-timestamp` may be from now, either way (5 minutes by default).
    pub fn tolerance(mut self, tolerance: Duration) -> KeyRegistry {
        self.tolerance = Some(tolerance);
        self
    }

    /// How many keys, counted once per pattern they were added with.
    pub fn len(&self) -> usize {
        self.exact.values().map(Vec::len).sum::<usize>() + self.prefixes.len() + self.any.len()
    }

    /// Whether no key was added.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether any key may sign for `source` (`None`: a request that names no source, which
    /// only keys for any source may sign): [`verifier_for`](Self::verifier_for) without
    /// building the verifier, for a check made before a request's body is read.
    pub fn covers(&self, source: Option<&str>) -> bool {
        !self.any.is_empty()
            || source.is_some_and(|source| {
                self.exact.get(source).is_some_and(|keys| !keys.is_empty())
                    || self
                        .prefixes
                        .iter()
                        .any(|(prefix, _)| source.starts_with(prefix.as_str()))
            })
    }

    /// A verifier with the keys that may sign for `source` (`None`: a request that names
    /// no source, which only keys for any source may sign), or `None` if there are none.
    pub fn verifier_for(&self, source: Option<&str>) -> Option<Verifier> {
        let mut keys: Vec<VerifyingKey> = self.any.clone();
        if let Some(source) = source {
            if let Some(exact) = self.exact.get(source) {
                keys.extend(exact.iter().cloned());
            }
            keys.extend(
                self.prefixes
                    .iter()
                    .filter(|(prefix, _)| source.starts_with(prefix.as_str()))
                    .map(|(_, key)| key.clone()),
            );
        }
        if keys.is_empty() {
            return None;
        }
        let verifier = Verifier::with_keys(keys);
        Some(match self.tolerance {
            Some(tolerance) => verifier.tolerance(tolerance),
            None => verifier,
        })
    }
}

/// The source a request names in its `outbox-source` header, if it names one.
///
/// # Errors
///
/// [`ReceiveError::MalformedSourceHeader`] when the header is not a percent-encoded UTF-8
/// source.
pub fn request_source<K, V>(headers: &[(K, V)]) -> Result<Option<String>, ReceiveError>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    match headers
        .iter()
        .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(SOURCE_HEADER))
    {
        None => Ok(None),
        Some((_, value)) => decode_source_header(value.as_ref().as_bytes())
            .map(Some)
            .ok_or(ReceiveError::MalformedSourceHeader),
    }
}

/// Verifies a request with the keys `registry` holds for the source it names in
/// `outbox-source`, parses its CloudEvents, and checks that every event is of that source;
/// at `now` (unix seconds). A request that names no source is verified with the keys for
/// any source only, and its events may be of any source.
///
/// # Errors
///
/// [`ReceiveError::UnknownSource`] when no key may sign for the source (the body is not
/// looked at), [`ReceiveError::Signature`], [`ReceiveError::Body`],
/// [`ReceiveError::ForgedSource`] naming the first event of another source (nothing of the
/// request should then be kept), [`ReceiveError::MalformedSourceHeader`].
pub fn verify_request_for<K, V>(
    registry: &KeyRegistry,
    headers: &[(K, V)],
    body: &[u8],
    now: i64,
) -> Result<Vec<CloudEvent>, ReceiveError>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let source = request_source(headers)?;
    let verifier = registry
        .verifier_for(source.as_deref())
        .ok_or(ReceiveError::UnknownSource)?;
    let events = verify_request(&verifier, headers, body, now)?;
    check_sources(source.as_deref(), &events)?;
    Ok(events)
}

/// Every event of a request signed for `source` must be of it: a key signs for its sources
/// only.
pub(crate) fn check_sources(
    source: Option<&str>,
    events: &[CloudEvent],
) -> Result<(), ReceiveError> {
    let Some(source) = source else {
        return Ok(());
    };
    match events.iter().find(|e| e.source != source) {
        Some(other) => Err(ReceiveError::ForgedSource {
            event_id: other.id.clone(),
            event_source: other.source.clone(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::signing_key::SigningKey;

    fn signed(
        key: &SigningKey,
        source: &str,
        event_source: &str,
    ) -> (Vec<(String, String)>, Vec<u8>) {
        let body = serde_json::json!({
            "specversion": "1.0", "id": "e1", "source": event_source, "type": "t"
        })
        .to_string()
        .into_bytes();
        let headers = vec![
            ("content-type".into(), "application/cloudevents+json".into()),
            ("outbox-source".into(), source.into()),
            ("webhook-id".into(), "m1".into()),
            ("webhook-timestamp".into(), "1000".into()),
            ("webhook-signature".into(), key.sign("m1", 1000, &body)),
        ];
        (headers, body)
    }

    #[test]
    fn a_key_signs_for_its_sources_only_and_every_event_must_be_of_the_named_source() {
        let (a, _) = SigningKey::generate().unwrap();
        let (b, _) = SigningKey::generate().unwrap();
        let mut registry = KeyRegistry::new();
        registry
            .add("/devices/a", VerifyingKey::Public(a.public_key()))
            .unwrap()
            .add("/site-7/*", VerifyingKey::Public(b.public_key()))
            .unwrap();
        assert_eq!(registry.len(), 2);
        // What the ingest checks before it reads a body, as the verifier would find it.
        for source in [
            Some("/devices/a"),
            Some("/site-7/pump"),
            Some("/devices/zzz"),
            None,
        ] {
            assert_eq!(
                registry.covers(source),
                registry.verifier_for(source).is_some(),
                "{source:?}"
            );
        }
        assert!(registry.covers(Some("/site-7/x")) && !registry.covers(Some("/devices/b")));
        let (h, body) = signed(&a, "/devices/a", "/devices/a");
        assert_eq!(
            verify_request_for(&registry, &h, &body, 1000)
                .unwrap()
                .len(),
            1
        );
        let (h, body) = signed(&b, "/site-7/pump", "/site-7/pump");
        assert!(verify_request_for(&registry, &h, &body, 1000).is_ok());
        // a's key naming b's source: b's keys do not verify it.
        let (h, body) = signed(&a, "/site-7/pump", "/site-7/pump");
        assert_eq!(
            verify_request_for(&registry, &h, &body, 1000),
            Err(ReceiveError::Signature(VerifyError::InvalidSignature))
        );
        // a's own source in the header, another in the event: forged.
        let (h, body) = signed(&a, "/devices/a", "/devices/b");
        assert_eq!(
            verify_request_for(&registry, &h, &body, 1000),
            Err(ReceiveError::ForgedSource {
                event_id: "e1".into(),
                event_source: "/devices/b".into()
            })
        );
        let (h, body) = signed(&a, "/devices/zzz", "/devices/zzz");
        assert_eq!(
            verify_request_for(&registry, &h, &body, 1000),
            Err(ReceiveError::UnknownSource)
        );
        // No header: only keys for any source may sign, and there are none here.
        let (h, body) = signed(&a, "/devices/a", "/devices/a");
        let unnamed: Vec<_> = h
            .into_iter()
            .filter(|(k, _)| k != "outbox-source")
            .collect();
        assert_eq!(
            verify_request_for(&registry, &unnamed, &body, 1000),
            Err(ReceiveError::UnknownSource)
        );
        let (h, body) = signed(&a, "%zz", "/devices/a");
        assert_eq!(
            verify_request_for(&registry, &h, &body, 1000),
            Err(ReceiveError::MalformedSourceHeader)
        );
    }

    #[test]
    fn patterns_with_a_star_inside_are_refused() {
        for bad in ["", "/a*b", "/a**", "*/a"] {
            assert!(
                matches!(
                    KeyRegistry::check_pattern(bad),
                    Err(VerifyError::InvalidSourcePattern(_))
                ),
                "{bad:?}"
            );
        }
        for good in ["*", "/a", "/a/*"] {
            assert!(KeyRegistry::check_pattern(good).is_ok(), "{good:?}");
        }
    }
}
