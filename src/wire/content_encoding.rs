//! Request body compression: gzip on the way out (`Content-Encoding: gzip`), and a decoder
//! for receivers that stops at a limit instead of finding out after.
//!
//! Signatures are over the body as the application sees it, uncompressed: a receiver
//! decodes first and verifies what its handler will parse, so the signature scheme is the
//! same with and without compression, and a proxy that re-encodes changes nothing.

use std::borrow::Cow;
use std::fmt;
use std::io::{Read, Write};

/// How a destination compresses its request bodies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    /// Bodies go as they are (the default).
    #[default]
    None,
    /// Bodies of [`Compression::MIN_BYTES`] or more go gzip-compressed, with
    /// `Content-Encoding: gzip`. JSON events compress 4 to 10 times; a body that would
    /// shrink more than [`MAX_DECODE_RATIO`] times goes plain, since receivers refuse it.
    Gzip,
}

impl Compression {
    /// Bodies smaller than this go uncompressed whatever the setting: gzip's 18-byte frame
    /// and the CPU would buy little.
    pub const MIN_BYTES: usize = 1024;

    /// The body to send and its `Content-Encoding`, if any.
    pub(crate) fn encode(self, body: Vec<u8>) -> (Vec<u8>, Option<&'static str>) {
        match self {
            Compression::Gzip if body.len() >= Self::MIN_BYTES => {
                let mut encoder = flate2::write::GzEncoder::new(
                    Vec::with_capacity(body.len() / 4),
                    flate2::Compression::fast(),
                );
                // Writing to a Vec cannot fail.
                match encoder.write_all(&body).and_then(|()| encoder.finish()) {
                    // A body that shrinks more than receivers let a body expand (a long run
                    // of one character) would be refused as a zip bomb (413): it goes plain.
                    Ok(gzipped) if body.len() <= gzipped.len().saturating_mul(MAX_DECODE_RATIO) => {
                        (gzipped, Some("gzip"))
                    }
                    _ => (body, None),
                }
            }
            _ => (body, None),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gzip" => Ok(Compression::Gzip),
            "none" => Ok(Compression::None),
            other => Err(format!("unknown compression {other:?}: gzip or none")),
        }
    }
}

/// How far a body may expand as it is decoded: a ratio of 100 passes JSON (which gzip
/// shrinks 4 to 20 times) and refuses a zip bomb (1,000 times and more).
pub const MAX_DECODE_RATIO: usize = 100;

/// Why a request body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// A `Content-Encoding` other than `gzip` or `identity` (HTTP's 415).
    Unsupported(String),
    /// The body decodes past `limit` bytes (the receiver's body limit, or
    /// [`MAX_DECODE_RATIO`] times its size on the wire); decoding stopped there (HTTP's 413).
    TooLarge {
        /// The limit it passed, in decoded bytes.
        limit: usize,
        /// Whether the limit was the ratio's rather than the body limit's.
        by_ratio: bool,
    },
    /// Not valid gzip (HTTP's 400).
    Corrupt(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Unsupported(e) => {
                write!(
                    f,
                    "content-encoding {e:?} is not supported: gzip or identity"
                )
            }
            DecodeError::TooLarge {
                limit,
                by_ratio: false,
            } => write!(
                f,
                "the body decodes to more than the limit of {limit} bytes"
            ),
            DecodeError::TooLarge {
                limit,
                by_ratio: true,
            } => write!(
                f,
                "the body decodes to more than {MAX_DECODE_RATIO} times its size ({limit} bytes)"
            ),
            DecodeError::Corrupt(e) => write!(f, "the body is not valid gzip: {e:#}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Checks a request's `Content-Encoding` before its body is read: `None`, `identity` and
/// `gzip` (any case) pass.
///
/// # Errors
///
/// [`DecodeError::Unsupported`] naming the encoding.
pub fn check_encoding(content_encoding: Option<&str>) -> Result<(), DecodeError> {
    is_gzip(content_encoding).map(|_| ())
}

/// Whether `content_encoding` says gzip; `None` and `identity` say no, anything else is
/// refused.
fn is_gzip(content_encoding: Option<&str>) -> Result<bool, DecodeError> {
    match content_encoding.map(str::trim) {
        None => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("identity") => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("gzip") => Ok(true),
        Some(e) => Err(DecodeError::Unsupported(e.to_string())),
    }
}

/// The body as the sender signed it: decoded if `content_encoding` says gzip, through a
/// reader that stops one byte past `max_decoded` bytes or [`MAX_DECODE_RATIO`] times the
/// body's size, whichever is less, so a zip bomb costs at most that much work and memory.
///
/// # Errors
///
/// [`DecodeError::Unsupported`] for another encoding, [`DecodeError::TooLarge`] past a
/// limit, [`DecodeError::Corrupt`] for a body that is not gzip.
pub fn decode_body<'a>(
    content_encoding: Option<&str>,
    body: &'a [u8],
    max_decoded: usize,
) -> Result<Cow<'a, [u8]>, DecodeError> {
    if !is_gzip(content_encoding)? {
        return Ok(Cow::Borrowed(body));
    }
    let by_ratio_limit = body.len().saturating_mul(MAX_DECODE_RATIO);
    let (limit, by_ratio) = if by_ratio_limit < max_decoded {
        (by_ratio_limit, true)
    } else {
        (max_decoded, false)
    };
    let mut decoded = Vec::with_capacity(limit.min(body.len().saturating_mul(8)));
    let mut reader = flate2::read::MultiGzDecoder::new(body).take(limit as u64 + 1);
    reader
        .read_to_end(&mut decoded)
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    if decoded.len() > limit {
        return Err(DecodeError::TooLarge { limit, by_ratio });
    }
    Ok(Cow::Owned(decoded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(len: usize) -> Vec<u8> {
        let mut body = b"[".to_vec();
        while body.len() < len {
            body.extend_from_slice(br#"{"type":"reading","data":{"c":21.5}},"#);
        }
        body.push(b']');
        body
    }

    #[test]
    fn small_bodies_go_as_they_are_and_large_ones_round_trip() {
        let small = json(500);
        assert_eq!(Compression::Gzip.encode(small.clone()), (small, None));
        let large = json(10_000);
        let (gzipped, encoding) = Compression::Gzip.encode(large.clone());
        assert_eq!(encoding, Some("gzip"));
        assert!(gzipped.len() < large.len() / 4, "{} bytes", gzipped.len());
        assert_eq!(
            decode_body(Some("gzip"), &gzipped, 1 << 20).unwrap(),
            &large[..]
        );
        assert_eq!(Compression::None.encode(large.clone()), (large, None));
    }

    /// `bytes` gzip-compressed, whatever the ratio.
    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_body_that_shrinks_past_the_receivers_ratio_goes_plain() {
        // A valid event of 200 KB of one character: gzip makes it about 1 KB, which a
        // receiver decoding with the ratio limit refuses as a bomb (413). Before, it went
        // gzip'd and was dead at its first attempt.
        let event = format!(r#"{{"data":"{}"}}"#, "a".repeat(200_000)).into_bytes();
        assert!(gzip(&event).len() * MAX_DECODE_RATIO < event.len());
        let (sent, encoding) = Compression::Gzip.encode(event.clone());
        assert_eq!(encoding, None);
        assert_eq!(
            decode_body(encoding, &sent, 1 << 20).unwrap(),
            &event[..],
            "what is sent decodes within the receiver's limits"
        );
    }

    #[test]
    fn a_bomb_stops_at_the_limit_and_other_encodings_are_refused() {
        // 10 MB of zeros: about 10 KB of gzip, a ratio near 1,000.
        let bomb = gzip(&vec![0; 10_000_000]);
        assert_eq!(
            decode_body(Some("gzip"), &bomb, 1 << 30),
            Err(DecodeError::TooLarge {
                limit: bomb.len() * MAX_DECODE_RATIO,
                by_ratio: true
            })
        );
        let fine = gzip(&json(200_000));
        assert_eq!(
            decode_body(Some("GZIP"), &fine, 100_000),
            Err(DecodeError::TooLarge {
                limit: 100_000,
                by_ratio: false
            })
        );
        assert!(matches!(
            decode_body(Some("br"), b"x", 10),
            Err(DecodeError::Unsupported(e)) if e == "br"
        ));
        assert!(matches!(
            decode_body(Some("gzip"), b"not gzip", 10),
            Err(DecodeError::Corrupt(_))
        ));
        assert_eq!(decode_body(None, b"plain", 1).unwrap(), &b"plain"[..]);
        assert_eq!(
            decode_body(Some("identity"), b"plain", 1).unwrap(),
            &b"plain"[..]
        );
    }
}
