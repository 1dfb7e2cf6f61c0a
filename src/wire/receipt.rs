//! Signed receipts: what `outbox ingest --receipt-key` answers with every 2xx, and what a
//! destination configured with the ingest's public key (`Destination::receipt_key`) needs
//! before it counts an answer as a delivery. A 2xx without one (a captive portal, a proxy,
//! the wrong server) proves nothing.
//!
//! The header [`RECEIPT_HEADER`] holds `v1a,<base64 of the receipt's JSON>,<base64 of the
//! Ed25519 signature>`; the signature covers `outbox-receipt.v1a.` followed by the JSON
//! bytes. The JSON:
//!
//! ```json
//! {"source": "/devices/17", "stream": "fleet", "numbers": [[41, 50]],
//!  "webhook_id": "batch_…", "time": 1765015200}
//! ```
//!
//! `numbers` are the stream numbers of the request's events that are stored, newly or
//! before; `time` is the ingest's clock (unix seconds) when it answered.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::wire::signing_key::{PublicKey, SigningKey};
use crate::wire::stream_account::Ranges;

/// The response header that carries a receipt.
pub const RECEIPT_HEADER: &str = "outbox-receipt";

/// The longest receipt header read, in bytes: a receiver cannot make a device decode more.
pub const MAX_RECEIPT_HEADER: usize = 64 * 1024;

/// What the signature covers before the JSON: receipts cannot pass for other signed data.
const CONTEXT: &[u8] = b"outbox-receipt.v1a.";

/// One request's receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Receipt {
    /// The source of the request's events.
    pub source: String,
    /// Their stream, if they carried numbers.
    #[serde(default)]
    pub stream: Option<String>,
    /// The numbers stored, newly or before, as ranges.
    #[serde(default)]
    pub numbers: Ranges,
    /// The request's `webhook-id`.
    pub webhook_id: String,
    /// When the receiver answered (its clock, unix seconds).
    pub time: i64,
}

impl Receipt {
    /// A receipt for the request `webhook_id` of `source`'s events numbered `numbers` in
    /// `stream`, at `time`.
    pub fn new(
        source: impl Into<String>,
        stream: Option<String>,
        numbers: Ranges,
        webhook_id: impl Into<String>,
        time: i64,
    ) -> Receipt {
        Receipt {
            source: source.into(),
            stream,
            numbers,
            webhook_id: webhook_id.into(),
            time,
        }
    }

    /// The header value: the receipt signed with `key`.
    pub fn signed(&self, key: &SigningKey) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut content = CONTEXT.to_vec();
        content.extend_from_slice(&json);
        let signature = key.sign_bytes(&content);
        format!(
            "v1a,{},{}",
            STANDARD.encode(&json),
            STANDARD.encode(signature)
        )
    }

    /// Reads a receipt from its header value, if `key` signed it.
    ///
    /// # Errors
    ///
    /// What is wrong, in words: too long, not this shape, or not signed by `key`.
    pub fn verify(header: &str, key: &PublicKey) -> Result<Receipt, String> {
        if header.len() > MAX_RECEIPT_HEADER {
            return Err(format!("longer than {MAX_RECEIPT_HEADER} bytes"));
        }
        let mut parts = header.trim().split(',');
        let (Some("v1a"), Some(json), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not v1a,<receipt>,<signature>".into());
        };
        let json = STANDARD
            .decode(json)
            .map_err(|_| "the receipt is not base64".to_string())?;
        let signature = STANDARD
            .decode(signature)
            .map_err(|_| "the signature is not base64".to_string())?;
        let mut content = CONTEXT.to_vec();
        content.extend_from_slice(&json);
        if !key.verifies(&content, &signature) {
            return Err("not signed by the receiver's key".into());
        }
        serde_json::from_slice(&json).map_err(|e| format!("not a receipt: {e:#}"))
    }

    /// Whether this receipt is for request `webhook_id` of `source` and covers every one
    /// of `numbers` in `stream`; if not, why.
    ///
    /// # Errors
    ///
    /// What does not match.
    pub fn covers(
        &self,
        webhook_id: &str,
        source: &str,
        stream: &str,
        numbers: impl IntoIterator<Item = i64>,
    ) -> Result<(), String> {
        if self.webhook_id != webhook_id {
            return Err(format!(
                "it is for request {}, not {webhook_id}",
                self.webhook_id
            ));
        }
        if self.source != source {
            return Err(format!("it is for source {}, not {source}", self.source));
        }
        for n in numbers {
            let covered = self.stream.as_deref() == Some(stream)
                && self.numbers.iter().any(|[a, b]| *a <= n && n <= *b);
            if !covered {
                return Err(format!("it does not cover number {n} of stream {stream}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_verifies_with_its_key_only_and_covers_what_it_names() {
        let (key, _) = SigningKey::generate().unwrap();
        let (other, _) = SigningKey::generate().unwrap();
        let receipt = Receipt::new("/d/1", Some("fleet".into()), vec![[3, 5]], "msg_1", 1);
        let header = receipt.signed(&key);
        let read = Receipt::verify(&header, &key.public_key()).unwrap();
        assert_eq!(read, receipt);
        assert!(Receipt::verify(&header, &other.public_key()).is_err());
        // Another receipt's JSON under this signature does not verify.
        let forged = Receipt::new("/d/1", Some("fleet".into()), vec![[3, 9]], "msg_1", 1);
        let parts: Vec<&str> = header.split(',').collect();
        let json = STANDARD.encode(serde_json::to_vec(&forged).unwrap());
        let tampered = format!("v1a,{json},{}", parts[2]);
        assert!(Receipt::verify(&tampered, &key.public_key()).is_err());
        assert!(Receipt::verify("v1a,abc", &key.public_key()).is_err());
        assert!(Receipt::verify(&"x".repeat(MAX_RECEIPT_HEADER + 1), &key.public_key()).is_err());

        assert!(read.covers("msg_1", "/d/1", "fleet", [3, 4, 5]).is_ok());
        assert!(read.covers("msg_2", "/d/1", "fleet", [3]).is_err());
        assert!(read.covers("msg_1", "/d/2", "fleet", [3]).is_err());
        assert!(read.covers("msg_1", "/d/1", "other", [3]).is_err());
        assert!(read.covers("msg_1", "/d/1", "fleet", [6]).is_err());
        assert!(read.covers("msg_1", "/d/1", "fleet", []).is_ok());
    }
}
