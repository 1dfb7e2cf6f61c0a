//! Why a signed request, or a key, was refused.

use std::fmt;

use crate::wire::key_text::MIN_SECRET_BYTES;

/// Why a request failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyError {
    /// A required header is absent (`webhook-id`, `webhook-timestamp`, `webhook-signature`).
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not a non-negative integer.
    InvalidTimestamp,
    /// The timestamp is older than the tolerance allows (a replay, or a very slow retry).
    TimestampTooOld,
    /// The timestamp is further in the future than the tolerance allows.
    TimestampTooNew,
    /// No `v1` signature matches any known secret: the body, id or timestamp was altered, or
    /// the secret is wrong.
    InvalidSignature,
    /// The secret is empty.
    EmptySecret,
    /// The secret is not valid base64.
    InvalidSecret,
    /// The secret's key has fewer than [`MIN_SECRET_BYTES`] bytes.
    SecretTooShort {
        /// How many it has.
        bytes: usize,
    },
    /// A `whsk_` Ed25519 private key is malformed; says why (never the key).
    InvalidSigningKey(String),
    /// A `whpk_` Ed25519 public key is malformed; says why.
    InvalidPublicKey(String),
    /// A key registry's source pattern is malformed; says why.
    InvalidSourcePattern(String),
}

impl VerifyError {
    /// A stable snake-case name for the error kind (`missing_header`, `invalid_signature`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => "missing_header",
            VerifyError::InvalidTimestamp => "invalid_timestamp",
            VerifyError::TimestampTooOld => "timestamp_too_old",
            VerifyError::TimestampTooNew => "timestamp_too_new",
            VerifyError::InvalidSignature => "invalid_signature",
            VerifyError::EmptySecret => "empty_secret",
            VerifyError::InvalidSecret => "invalid_secret",
            VerifyError::SecretTooShort { .. } => "secret_too_short",
            VerifyError::InvalidSigningKey(_) => "invalid_signing_key",
            VerifyError::InvalidPublicKey(_) => "invalid_public_key",
            VerifyError::InvalidSourcePattern(_) => "invalid_source_pattern",
        }
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::MissingHeader(h) => write!(f, "missing header {h}"),
            VerifyError::InvalidTimestamp => {
                write!(f, "webhook-timestamp is not a unix time in whole seconds")
            }
            VerifyError::TimestampTooOld => write!(f, "webhook-timestamp is too old"),
            VerifyError::TimestampTooNew => write!(f, "webhook-timestamp is too far in the future"),
            VerifyError::InvalidSignature => write!(f, "no valid v1 or v1a signature"),
            VerifyError::EmptySecret => write!(f, "the webhook secret is empty"),
            VerifyError::InvalidSecret => write!(f, "the webhook secret is not valid base64"),
            VerifyError::SecretTooShort { bytes } => write!(
                f,
                "the webhook secret's key is {bytes} bytes: at least {MIN_SECRET_BYTES} are \
                 needed (Standard Webhooks asks for 24 to 64)"
            ),
            VerifyError::InvalidSigningKey(why) => {
                write!(f, "the whsk_ signing key is not valid: {why}")
            }
            VerifyError::InvalidPublicKey(why) => {
                write!(f, "the whpk_ public key is not valid: {why}")
            }
            VerifyError::InvalidSourcePattern(why) => {
                write!(f, "the source pattern is not valid: {why}")
            }
        }
    }
}

impl std::error::Error for VerifyError {}
