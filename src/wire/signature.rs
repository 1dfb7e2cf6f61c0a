//! Standard Webhooks signatures: signing on the way out, verification on the way in.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}`, HMAC-SHA256 keyed with
//! the base64-decoded secret (after its `whsec_` prefix); the header carries one
//! `v1,<base64>` entry per secret, space-separated, so secrets can be rotated without a gap.
//! A device may sign with its own Ed25519 key instead (`v1a`, see [`crate::wire::signing_key`]);
//! a [`Verifier`] takes secrets and public keys alike.

use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::hmac;
use subtle::ConstantTimeEq;

use crate::wire::key_text::LENIENT;
pub use crate::wire::key_text::MIN_SECRET_BYTES;
use crate::wire::signing_key::{signed_content, PublicKey, PUBLIC_KEY_PREFIX};
pub use crate::wire::verify_error::VerifyError;

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A signing key. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Parses a `whsec_<base64>` secret (the prefix is optional).
    ///
    /// # Errors
    ///
    /// [`VerifyError::EmptySecret`] for an empty key, [`VerifyError::InvalidSecret`] if it is
    /// not base64, [`VerifyError::SecretTooShort`] for a key of fewer than
    /// [`MIN_SECRET_BYTES`] bytes. No error repeats the secret.
    pub fn parse(text: &str) -> Result<Secret, VerifyError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .unwrap_or(text.trim());
        if encoded.is_empty() {
            return Err(VerifyError::EmptySecret);
        }
        let key = LENIENT
            .decode(encoded)
            .map_err(|_| VerifyError::InvalidSecret)?;
        Secret::from_bytes(key)
    }

    /// Creates a secret from raw key bytes.
    ///
    /// # Errors
    ///
    /// [`VerifyError::EmptySecret`] for no bytes, [`VerifyError::SecretTooShort`] for fewer
    /// than [`MIN_SECRET_BYTES`].
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Result<Secret, VerifyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(VerifyError::EmptySecret);
        }
        if key.len() < MIN_SECRET_BYTES {
            return Err(VerifyError::SecretTooShort { bytes: key.len() });
        }
        Ok(Secret { key })
    }

    /// A new random 32-byte secret from the operating system's RNG, and its `whsec_…` text,
    /// for setting up a destination.
    ///
    /// # Errors
    ///
    /// [`std::io::Error`] if the operating system has no random source.
    pub fn generate() -> std::io::Result<(Secret, String)> {
        let mut key = vec![0u8; 32];
        getrandom::fill(&mut key).map_err(std::io::Error::other)?;
        let text = format!("{SECRET_PREFIX}{}", STANDARD.encode(&key));
        Ok((Secret { key }, text))
    }

    /// HMAC-SHA256 of `{id}.{timestamp}.{body}` under this key.
    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> hmac::Tag {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.key);
        let mut mac = hmac::Context::with_key(&key);
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.sign()
    }

    /// The `v1,<base64>` signature of one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self.mac(id, &timestamp.to_string(), body);
        format!("v1,{}", STANDARD.encode(tag.as_ref()))
    }
}

/// The `webhook-signature` header value: one `v1,` entry per secret, space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Entries of `webhook-signature` looked at, at most: a sender lists one per secret it
/// signs with (two during a rotation).
pub(crate) const MAX_SIGNATURE_ENTRIES: usize = 16;

/// A key a request may be verified with: a shared secret (`v1`, HMAC-SHA256) or a device's
/// Ed25519 public key (`v1a`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyingKey {
    /// A `whsec_` secret.
    Secret(Secret),
    /// A `whpk_` public key.
    Public(PublicKey),
}

impl VerifyingKey {
    /// Parses a `whpk_…` public key or a `whsec_…` secret (by its prefix).
    ///
    /// # Errors
    ///
    /// As [`PublicKey::parse`] or [`Secret::parse`].
    pub fn parse(text: &str) -> Result<VerifyingKey, VerifyError> {
        if text.trim().starts_with(PUBLIC_KEY_PREFIX) {
            PublicKey::parse(text).map(VerifyingKey::Public)
        } else {
            Secret::parse(text).map(VerifyingKey::Secret)
        }
    }
}

/// Checks signed requests against one or more secrets or public keys.
#[derive(Debug, Clone)]
#[must_use = "a Verifier checks nothing until it is used"]
pub struct Verifier {
    secrets: Vec<Secret>,
    public_keys: Vec<PublicKey>,
    tolerance: Duration,
}

impl Verifier {
    /// A verifier accepting a signature by any of `secrets`, with a 5-minute tolerance.
    pub fn new(secrets: impl IntoIterator<Item = Secret>) -> Verifier {
        Verifier::with_keys(secrets.into_iter().map(VerifyingKey::Secret))
    }

    /// A verifier accepting a `v1` signature by any of the secrets, or a `v1a` signature by
    /// any of the public keys, among `keys`; 5-minute tolerance.
    pub fn with_keys(keys: impl IntoIterator<Item = VerifyingKey>) -> Verifier {
        let (mut secrets, mut public_keys) = (Vec::new(), Vec::new());
        for key in keys {
            match key {
                VerifyingKey::Secret(secret) => secrets.push(secret),
                VerifyingKey::Public(public) => public_keys.push(public),
            }
        }
        Verifier {
            secrets,
            public_keys,
            tolerance: Duration::from_secs(300),
        }
    }

    /// Sets how far `webhook-timestamp` may be from now, either way. Defaults to 5 minutes.
    pub fn tolerance(mut self, tolerance: Duration) -> Verifier {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a request's headers and raw body at `now` (unix seconds).
    ///
    /// Header names are matched case-insensitively. The timestamp is checked before the
    /// signature; every comparison of signatures is constant-time.
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`VerifyError`].
    pub fn verify<K, V>(
        &self,
        headers: impl IntoIterator<Item = (K, V)>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        self.check(headers, body, Some(now))
    }

    /// Verifies the signature only, without the timestamp window: for re-checking a stored
    /// request later.
    ///
    /// # Errors
    ///
    /// As [`verify`](Self::verify), except the timestamp's age.
    pub fn verify_ignoring_timestamp<K, V>(
        &self,
        headers: impl IntoIterator<Item = (K, V)>,
        body: &[u8],
    ) -> Result<(), VerifyError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        self.check(headers, body, None)
    }

    /// The checks that need no body, for a server to run before it reads one: the three
    /// headers are there and the timestamp is a whole number of seconds within the
    /// tolerance of `now`. [`verify`](Self::verify) runs them too; a request that fails
    /// them can be refused without its body being read.
    ///
    /// # Errors
    ///
    /// [`VerifyError::MissingHeader`], [`VerifyError::InvalidTimestamp`],
    /// [`VerifyError::TimestampTooOld`] or [`VerifyError::TimestampTooNew`].
    pub fn verify_headers<K, V>(
        &self,
        headers: impl IntoIterator<Item = (K, V)>,
        now: i64,
    ) -> Result<(), VerifyError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let (_, timestamp, _) = webhook_headers(headers)?;
        self.check_timestamp(&timestamp, Some(now)).map(drop)
    }

    /// The timestamp as a number, and, given `now`, within the tolerance.
    fn check_timestamp(&self, timestamp: &str, now: Option<i64>) -> Result<i64, VerifyError> {
        let ts: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| VerifyError::InvalidTimestamp)?;
        if let Some(now) = now {
            // Before 1970 is no time a sender can have signed at.
            if ts < 0 {
                return Err(VerifyError::InvalidTimestamp);
            }
            let tolerance = self.tolerance.as_secs().min(i64::MAX as u64) as i64;
            if now.saturating_sub(ts) > tolerance {
                return Err(VerifyError::TimestampTooOld);
            }
            if ts.saturating_sub(now) > tolerance {
                return Err(VerifyError::TimestampTooNew);
            }
        }
        Ok(ts)
    }

    fn check<K, V>(
        &self,
        headers: impl IntoIterator<Item = (K, V)>,
        body: &[u8],
        now: Option<i64>,
    ) -> Result<(), VerifyError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let (id, timestamp, signature) = webhook_headers(headers)?;
        self.check_timestamp(&timestamp, now)?;
        if self.secrets.is_empty() && self.public_keys.is_empty() {
            return Err(VerifyError::EmptySecret);
        }
        // One HMAC per secret, however many entries the header lists: the body is hashed
        // `secrets` times, not `secrets × entries` (an unauthenticated request with a
        // thousand entries over a large body would otherwise cost gigabytes of hashing).
        let expected: Vec<hmac::Tag> = self
            .secrets
            .iter()
            .map(|s| s.mac(&id, timestamp.trim(), body))
            .collect();
        // The v1a content is built once, and only when a v1a entry meets a public key. Each
        // Ed25519 check hashes the whole content again, so a request gets one check per
        // public key and no more: the first well-formed v1a entry is tried against each key
        // (a sender signs with one key per receiver), and entries after it cost nothing.
        let mut content: Option<Vec<u8>> = None;
        let mut v1a_tried = false;
        for entry in signature.split(' ').take(MAX_SIGNATURE_ENTRIES) {
            let (version, encoded) = match entry.split_once(',') {
                Some(("v1", encoded)) => ("v1", encoded),
                Some(("v1a", encoded)) if !self.public_keys.is_empty() => ("v1a", encoded),
                _ => continue,
            };
            let Ok(tag) = STANDARD.decode(encoded) else {
                continue;
            };
            if version == "v1a" {
                if tag.len() != 64 || v1a_tried {
                    continue;
                }
                v1a_tried = true;
                let content =
                    content.get_or_insert_with(|| signed_content(&id, timestamp.trim(), body));
                if self.public_keys.iter().any(|k| k.verifies(content, &tag)) {
                    return Ok(());
                }
                continue;
            }
            if tag.len() != hmac::HMAC_SHA256.digest_algorithm().output_len() {
                continue;
            }
            // Compared in constant time: how long a wrong tag took must not say how much of
            // it was right.
            if expected
                .iter()
                .any(|e| bool::from(e.as_ref().ct_eq(tag.as_slice())))
            {
                return Ok(());
            }
        }
        Err(VerifyError::InvalidSignature)
    }
}

/// The `webhook-id`, `webhook-timestamp` and `webhook-signature` headers, each required.
fn webhook_headers<K, V>(
    headers: impl IntoIterator<Item = (K, V)>,
) -> Result<(String, String, String), VerifyError>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let (mut id, mut timestamp, mut signature) = (None, None, None);
    for (name, value) in headers {
        let slot = match name.as_ref().to_ascii_lowercase().as_str() {
            "webhook-id" => &mut id,
            "webhook-timestamp" => &mut timestamp,
            "webhook-signature" => &mut signature,
            _ => continue,
        };
        *slot = Some(value.as_ref().to_string());
    }
    Ok((
        id.ok_or(VerifyError::MissingHeader("webhook-id"))?,
        timestamp.ok_or(VerifyError::MissingHeader("webhook-timestamp"))?,
        signature.ok_or(VerifyError::MissingHeader("webhook-signature"))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_sixteen_signature_entries_are_looked_at() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = vec![b'x'; 1 << 20];
        let good = secret.sign("id", 1_000, &body);
        let verifier = Verifier::new([secret]);
        let bogus = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let headers = |sig: String| {
            vec![
                ("webhook-id", "id".to_string()),
                ("webhook-timestamp", "1000".to_string()),
                ("webhook-signature", sig),
            ]
        };
        let late = format!("{} {good}", vec![bogus; 1_000].join(" "));
        assert_eq!(
            verifier.verify(headers(late), &body, 1_000),
            Err(VerifyError::InvalidSignature)
        );
        let early = format!("{} {good}", vec![bogus; 15].join(" "));
        assert_eq!(verifier.verify(headers(early), &body, 1_000), Ok(()));
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn spec_vector_signs() {
        assert_eq!(Secret::parse(SECRET).unwrap().sign(ID, TS, BODY), EXPECTED);
    }

    #[test]
    fn the_checks_that_need_no_body_run_on_headers_alone() {
        let verifier = Verifier::new([Secret::parse(SECRET).unwrap()]);
        let now = 1_700_000_000;
        let headers = |ts: i64| {
            vec![
                ("webhook-id", "m".to_string()),
                ("webhook-timestamp", ts.to_string()),
                ("webhook-signature", "v1,AAAA".to_string()),
            ]
        };
        assert_eq!(verifier.verify_headers(headers(now), now), Ok(()));
        assert_eq!(
            verifier.verify_headers(headers(now - 3600), now),
            Err(VerifyError::TimestampTooOld)
        );
        assert_eq!(
            verifier.verify_headers(headers(now + 3600), now),
            Err(VerifyError::TimestampTooNew)
        );
        assert_eq!(
            verifier.verify_headers(headers(now).into_iter().skip(1), now),
            Err(VerifyError::MissingHeader("webhook-id"))
        );
    }

    #[test]
    fn a_v1a_signature_verifies_with_its_public_key_only() {
        use crate::wire::signing_key::SigningKey;
        let (device, _) = SigningKey::generate().unwrap();
        let (other, _) = SigningKey::generate().unwrap();
        let headers = |signature: String| {
            [
                ("webhook-id", ID.to_string()),
                ("webhook-timestamp", TS.to_string()),
                ("webhook-signature", signature),
            ]
        };
        let verifier = Verifier::with_keys([VerifyingKey::Public(device.public_key())]);
        let signed = device.sign(ID, TS, BODY);
        assert_eq!(verifier.verify(headers(signed.clone()), BODY, TS), Ok(()));
        // Beside a v1 entry of a secret it does not hold, as during a move off secrets.
        let both = format!(
            "{} {signed}",
            Secret::parse(SECRET).unwrap().sign(ID, TS, BODY)
        );
        assert_eq!(verifier.verify(headers(both), BODY, TS), Ok(()));
        assert_eq!(
            verifier.verify(headers(other.sign(ID, TS, BODY)), BODY, TS),
            Err(VerifyError::InvalidSignature)
        );
        assert_eq!(
            verifier.verify(headers(signed), b"{\"test\": 1}", TS),
            Err(VerifyError::InvalidSignature)
        );
        // A secret's verifier ignores v1a entries.
        let secrets_only = Verifier::new([Secret::parse(SECRET).unwrap()]);
        assert_eq!(
            secrets_only.verify(headers(device.sign(ID, TS, BODY)), BODY, TS),
            Err(VerifyError::InvalidSignature)
        );
    }

    #[test]
    fn a_request_costs_one_ed25519_check_per_public_key_at_most() {
        use crate::wire::signing_key::SigningKey;
        let (device, _) = SigningKey::generate().unwrap();
        let (rotated, _) = SigningKey::generate().unwrap();
        let headers = |signature: String| {
            [
                ("webhook-id", ID.to_string()),
                ("webhook-timestamp", TS.to_string()),
                ("webhook-signature", signature),
            ]
        };
        // Two keys of one source (a rotation): the one entry is tried against both.
        let verifier = Verifier::with_keys([
            VerifyingKey::Public(rotated.public_key()),
            VerifyingKey::Public(device.public_key()),
        ]);
        assert_eq!(
            verifier.verify(headers(device.sign(ID, TS, BODY)), BODY, TS),
            Ok(())
        );
        // Entries after the first well-formed v1a one are not checked: garbage in front of
        // a good signature costs one check per key, and the request is refused.
        let garbage = format!("v1a,{}", STANDARD.encode([7u8; 64]));
        let padded = format!(
            "{garbage} {garbage} {garbage} {}",
            device.sign(ID, TS, BODY)
        );
        assert_eq!(
            verifier.verify(headers(padded), BODY, TS),
            Err(VerifyError::InvalidSignature)
        );
        // A malformed entry (not 64 bytes) costs nothing and does not count.
        let short = format!("v1a,AAAA {}", device.sign(ID, TS, BODY));
        assert_eq!(verifier.verify(headers(short), BODY, TS), Ok(()));
    }

    #[test]
    fn secret_never_shows_in_debug() {
        let s = Secret::parse(SECRET).unwrap();
        let shown = format!("{s:?} {:?}", Verifier::new([s.clone()]));
        assert!(!shown.contains("MfKQ9r8"), "{shown}");
    }

    #[test]
    fn generated_secret_round_trips() {
        let (secret, text) = Secret::generate().unwrap();
        assert!(text.starts_with("whsec_"));
        assert_eq!(Secret::parse(&text).unwrap(), secret);
    }

    #[test]
    fn rotation_header_carries_one_entry_per_secret() {
        let old = Secret::parse(SECRET).unwrap();
        let (new, _) = Secret::generate().unwrap();
        let header = signature_header(&[old, new.clone()], ID, TS, BODY);
        assert_eq!(header.split(' ').count(), 2);
        let headers = [
            ("webhook-id", ID.to_string()),
            ("webhook-timestamp", TS.to_string()),
            ("webhook-signature", header),
        ];
        Verifier::new([new]).verify(headers, BODY, TS).unwrap();
    }
}
