//! The `Retry-After` header: delta-seconds or an HTTP date (RFC 9110, section 10.2.3).

use std::time::{Duration, SystemTime};

/// Parses a `Retry-After` header value: delta-seconds or an HTTP date.
///
/// Returns `None` for anything else (negative numbers, garbage), so a broken header falls back
/// to ordinary backoff. A date in the past means "now" (zero). The caller caps the result.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits only: delta-seconds. Saturate instead of failing on absurd values.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn retry_after_http_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let later = "Sun, 06 Nov 1994 08:50:37 GMT";
        assert_eq!(parse_retry_after(later, now), Some(Duration::from_secs(60)));
        let earlier = "Sun, 06 Nov 1994 08:48:37 GMT";
        assert_eq!(parse_retry_after(earlier, now), Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_garbage_negative_and_huge() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        let huge = parse_retry_after("99999999999999999999999", now).unwrap();
        assert_eq!(huge, Duration::from_secs(u64::MAX));
    }
}
