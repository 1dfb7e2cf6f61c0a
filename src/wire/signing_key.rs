//! Standard Webhooks' asymmetric signatures (`v1a`): a device signs with its own Ed25519
//! private key, and the receiver verifies with the public key alone.
//!
//! A shared `whsec_` secret signs for whoever holds it, so a fleet that shares one lets any
//! device (or anyone who opens one) sign as every other. With `v1a`, the receiver's key
//! registry holds only public keys: a leaked registry signs nothing, and a device holding
//! its own private key cannot sign for another.
//!
//! The signed content is the same as `v1`'s, `{webhook-id}.{webhook-timestamp}.{body}`; the
//! header entry is `v1a,` and the standard base64 of the 64-byte Ed25519 signature. Keys are
//! texts: `whsk_` + base64 of the 32-byte seed (or of the 64-byte seed and public key some
//! libraries print: both are read), `whpk_` + base64 of the 32-byte public key.

use std::fmt;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use crate::wire::key_text::LENIENT;
use crate::wire::verify_error::VerifyError;

/// The prefix of a Standard Webhooks Ed25519 private key.
pub const SIGNING_KEY_PREFIX: &str = "whsk_";
/// The prefix of a Standard Webhooks Ed25519 public key.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// An Ed25519 private key a device signs its requests with (`v1a`). Its `Debug` output shows
/// the public key only.
#[derive(Clone)]
pub struct SigningKey {
    // ring's key pair is not `Clone`; the key is shared by every worker of a relay.
    pair: Arc<Ed25519KeyPair>,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.public_key().to_text())
    }
}

impl SigningKey {
    /// Parses a `whsk_<base64>` key: a 32-byte seed, or a 64-byte seed followed by its public
    /// key (which must then be the seed's).
    ///
    /// # Errors
    ///
    /// [`VerifyError::InvalidSigningKey`] naming what is wrong; it never repeats the key.
    pub fn parse(text: &str) -> Result<SigningKey, VerifyError> {
        let bad = |why: &str| VerifyError::InvalidSigningKey(why.to_string());
        let encoded = text
            .trim()
            .strip_prefix(SIGNING_KEY_PREFIX)
            .ok_or_else(|| bad("it does not start with whsk_"))?;
        let bytes = LENIENT
            .decode(encoded)
            .map_err(|_| bad("it is not valid base64"))?;
        let (seed, public) = match bytes.len() {
            32 => (&bytes[..], None),
            64 => (&bytes[..32], Some(&bytes[32..])),
            n => {
                return Err(bad(&format!(
                    "it holds {n} bytes: a 32-byte seed or 64 bytes of seed and public key \
                     are expected"
                )))
            }
        };
        let pair =
            Ed25519KeyPair::from_seed_unchecked(seed).map_err(|_| bad("ring refused the seed"))?;
        if public.is_some_and(|p| p != pair.public_key().as_ref()) {
            return Err(bad(
                "its last 32 bytes are not the public key of its first 32 (the seed)",
            ));
        }
        Ok(SigningKey {
            pair: Arc::new(pair),
        })
    }

    /// A new key from the operating system's random source, and its `whsk_…` text (the
    /// 32-byte seed).
    ///
    /// # Errors
    ///
    /// [`std::io::Error`] if the operating system has no random source.
    pub fn generate() -> std::io::Result<(SigningKey, String)> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(std::io::Error::other)?;
        let text = format!("{SIGNING_KEY_PREFIX}{}", STANDARD.encode(seed));
        let key = SigningKey::parse(&text).map_err(std::io::Error::other)?;
        Ok((key, text))
    }

    /// The public key a receiver verifies this key's signatures with.
    pub fn public_key(&self) -> PublicKey {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey { bytes }
    }

    /// The Ed25519 signature of `content` (64 bytes).
    pub(crate) fn sign_bytes(&self, content: &[u8]) -> Vec<u8> {
        self.pair.sign(content).as_ref().to_vec()
    }

    /// The `v1a,<base64>` signature of one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let content = signed_content(id, &timestamp.to_string(), body);
        let signature = self.pair.sign(&content);
        format!("v1a,{}", STANDARD.encode(signature.as_ref()))
    }
}

/// An Ed25519 public key a receiver verifies `v1a` signatures with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey {
    bytes: [u8; 32],
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_text())
    }
}

impl PublicKey {
    /// Parses a `whpk_<base64>` key of 32 bytes.
    ///
    /// # Errors
    ///
    /// [`VerifyError::InvalidPublicKey`] naming what is wrong.
    pub fn parse(text: &str) -> Result<PublicKey, VerifyError> {
        let bad = |why: &str| VerifyError::InvalidPublicKey(why.to_string());
        let encoded = text
            .trim()
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or_else(|| bad("it does not start with whpk_"))?;
        let decoded = LENIENT
            .decode(encoded)
            .map_err(|_| bad("it is not valid base64"))?;
        let bytes = <[u8; 32]>::try_from(decoded.as_slice())
            .map_err(|_| bad(&format!("it holds {} bytes, not 32", decoded.len())))?;
        if !is_canonical(&bytes) {
            return Err(bad(
                "it is not a canonical encoding of a curve point (its y is not below 2^255 - 19)",
            ));
        }
        if has_small_order(&bytes) {
            // With such a key one fixed signature verifies every message: a registry that
            // held it would let anyone sign for its sources.
            return Err(bad(
                "it is a point of small order, for which one signature verifies anything",
            ));
        }
        Ok(PublicKey { bytes })
    }

    /// The key as `whpk_<base64>`.
    pub fn to_text(&self) -> String {
        format!("{PUBLIC_KEY_PREFIX}{}", STANDARD.encode(self.bytes))
    }

    /// Whether `signature` (64 bytes) is this key's signature of `content`.
    pub(crate) fn verifies(&self, content: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.bytes)
            .verify(content, signature)
            .is_ok()
    }
}

/// The y coordinates (little-endian, the sign bit of x cleared) of the eight points whose
/// order divides 8: y = 0 (order 4, both signs), 1 (the identity), p - 1 (order 2), and the
/// two y values of the four points of order 8. The same list as libsodium's
/// `ge25519_has_small_order`, whose non-canonical spellings (y ≥ p) [`is_canonical`]
/// refuses.
const SMALL_ORDER_Y: [[u8; 32]; 5] = [
    [0; 32],
    [
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0,
    ],
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ],
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ],
    [
        0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0x7f,
    ],
];

/// The y coordinate of an encoded point: the sign bit of x cleared.
fn y_of(encoded: &[u8; 32]) -> [u8; 32] {
    let mut y = *encoded;
    y[31] &= 0x7f;
    y
}

/// Whether `encoded`'s y is below p = 2^255 - 19 (RFC 8032 §5.1.3 asks a decoder to refuse
/// it otherwise; ring does not).
fn is_canonical(encoded: &[u8; 32]) -> bool {
    let y = y_of(encoded);
    // y ≥ p only when bytes 1..=30 are 0xff, the top byte 0x7f and the lowest ≥ 0xed.
    !(y[31] == 0x7f && y[1..31].iter().all(|&b| b == 0xff) && y[0] >= 0xed)
}

/// Whether `encoded` is one of the eight points of order dividing 8 (either sign of x).
fn has_small_order(encoded: &[u8; 32]) -> bool {
    let y = y_of(encoded);
    SMALL_ORDER_Y.contains(&y)
}

/// `{id}.{timestamp}.{body}`, the content both versions sign.
pub(crate) fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032, section 7.1, test 2: seed, public key, a one-byte message and its signature.
    const SEED: &str = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
    const PUBLIC: &str = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_seed_and_a_seed_with_its_public_key_give_the_same_key() {
        let seed = hex(SEED);
        let public = hex(PUBLIC);
        let short = SigningKey::parse(&format!("whsk_{}", STANDARD.encode(&seed))).unwrap();
        let long = SigningKey::parse(&format!(
            "whsk_{}",
            STANDARD.encode([seed.clone(), public.clone()].concat())
        ))
        .unwrap();
        assert_eq!(short.public_key().bytes.to_vec(), public);
        assert_eq!(long.public_key(), short.public_key());
        let wrong = [seed.clone(), vec![0u8; 32]].concat();
        assert!(matches!(
            SigningKey::parse(&format!("whsk_{}", STANDARD.encode(wrong))),
            Err(VerifyError::InvalidSigningKey(_))
        ));
    }

    #[test]
    fn the_rfc_8032_signature_verifies_and_a_changed_byte_does_not() {
        // RFC 8032 test 2 signs the one byte 0x72.
        let signature = hex(
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da\
             085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
        );
        let key = PublicKey::parse(&format!("whpk_{}", STANDARD.encode(hex(PUBLIC)))).unwrap();
        assert!(key.verifies(&[0x72], &signature));
        assert!(!key.verifies(&[0x73], &signature));
    }

    #[test]
    fn a_signature_verifies_with_the_public_key_only() {
        let (key, text) = SigningKey::generate().unwrap();
        assert!(text.starts_with("whsk_"));
        let entry = key.sign("msg_1", 1_700_000_000, b"{}");
        let encoded = entry.strip_prefix("v1a,").unwrap();
        let signature = STANDARD.decode(encoded).unwrap();
        let public = PublicKey::parse(&key.public_key().to_text()).unwrap();
        assert!(public.verifies(&signed_content("msg_1", "1700000000", b"{}"), &signature));
        assert!(!public.verifies(&signed_content("msg_1", "1700000001", b"{}"), &signature));
    }

    #[test]
    fn small_order_and_non_canonical_public_keys_are_refused() {
        // The identity point: with it, R = identity and S = 0 verify every message.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let mut forged = [0u8; 64];
        forged[0] = 1;
        let key = PublicKey { bytes: identity };
        assert!(
            key.verifies(b"anything", &forged) && key.verifies(b"else", &forged),
            "ring takes the identity key and its one signature for any message"
        );
        let encoded = |bytes: [u8; 32]| format!("whpk_{}", STANDARD.encode(bytes));
        for y in SMALL_ORDER_Y {
            for sign in [0x00, 0x80] {
                let mut bytes = y;
                bytes[31] |= sign;
                let e = PublicKey::parse(&encoded(bytes)).unwrap_err();
                assert!(e.to_string().contains("small order"), "{e:#}");
            }
        }
        // y = p, p + 1, 2^255 - 1: spellings of points that are not canonical.
        for low in [0xed, 0xee, 0xff] {
            let mut bytes = [0xff; 32];
            bytes[0] = low;
            bytes[31] = 0x7f;
            let e = PublicKey::parse(&encoded(bytes)).unwrap_err();
            assert!(e.to_string().contains("canonical"), "{e:#}");
        }
        // Real keys still parse, and the RFC 8032 one.
        for _ in 0..100 {
            let (key, _) = SigningKey::generate().unwrap();
            assert!(PublicKey::parse(&key.public_key().to_text()).is_ok());
        }
        assert!(PublicKey::parse(&format!("whpk_{}", STANDARD.encode(hex(PUBLIC)))).is_ok());
    }

    #[test]
    fn malformed_keys_are_refused_without_repeating_them() {
        for text in ["whsec_AAAA", "whsk_!!!", "whsk_AAAA"] {
            let e = SigningKey::parse(text).unwrap_err();
            assert!(!e.to_string().contains(text), "{e:#}");
        }
        assert!(PublicKey::parse("whpk_AAAA").is_err());
        assert!(PublicKey::parse("whsk_AAAA").is_err());
        let (key, _) = SigningKey::generate().unwrap();
        assert!(!format!("{key:?}").contains("whsk_"));
    }
}
