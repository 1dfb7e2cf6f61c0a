//! A data budget: at most so many bytes in each period (a minute to a month) to one
//! destination, as the network counts them. What a budget is and how it is written
//! (`50MB/30d`); what a relay has spent of it is [`spending`](super::spending)'s.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// At most `limit_bytes` in each `period` to one destination, counted as the network counts
/// them: every byte the relay writes to and reads from the destination's sockets (request
/// lines, headers, bodies, answers, TLS handshakes and records), retries included. Set with
/// [`Destination::budget`](crate::Destination::budget); `outbox relay --budget 50MB/30d`.
///
/// ```
/// use sqlite_outbox::Budget;
/// let plan: Budget = "50MB/30d".parse().unwrap();
/// assert_eq!(plan.limit_bytes(), 50_000_000);
/// assert_eq!(plan.period().as_secs(), 30 * 86_400);
/// assert_eq!(plan.to_string(), "50MB/30d");
/// assert!("50MB/30s".parse::<Budget>().is_err()); // a period is a minute at least
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    limit_bytes: u64,
    period: Duration,
}

impl Budget {
    /// The shortest period: a minute.
    pub const MIN_PERIOD: Duration = Duration::from_secs(60);
    /// The longest period: 31 days (a month).
    pub const MAX_PERIOD: Duration = Duration::from_secs(31 * 86_400);
    /// The largest budget: 1,000 GB a period.
    pub const MAX_BYTES: u64 = 1_000_000_000_000;

    /// At most `limit_bytes` (1 to [`MAX_BYTES`](Self::MAX_BYTES)) in each `period`
    /// (whole seconds, [`MIN_PERIOD`](Self::MIN_PERIOD) to
    /// [`MAX_PERIOD`](Self::MAX_PERIOD)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the value out of range and the range.
    pub fn new(limit_bytes: u64, period: Duration) -> Result<Budget> {
        if !(1..=Self::MAX_BYTES).contains(&limit_bytes) {
            return Err(Error::InvalidConfig(format!(
                "a budget of {limit_bytes} bytes is out of range: from 1 byte to 1000GB a period"
            )));
        }
        if period < Self::MIN_PERIOD || period > Self::MAX_PERIOD || period.subsec_nanos() != 0 {
            return Err(Error::InvalidConfig(format!(
                "a budget period of {period:?} is out of range: whole seconds, from a minute \
                 (1m) to a month (31d)"
            )));
        }
        Ok(Budget {
            limit_bytes,
            period,
        })
    }

    /// The bytes a period may spend.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The period in milliseconds, as the file keeps it.
    pub(crate) fn period_ms(&self) -> i64 {
        // At most 31 days: far inside an i64.
        self.period.as_millis() as i64
    }
}

/// Size units, powers of 1000 (as carriers bill), largest first for `Display`.
const SIZE_UNITS: [(&str, u64); 4] = [
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

/// Period units, largest first for `Display`.
const PERIOD_UNITS: [(&str, u64); 3] = [("d", 86_400), ("h", 3_600), ("m", 60)];

impl FromStr for Budget {
    type Err = Error;

    /// `SIZE/PERIOD`: a whole number of `B`, `KB`, `MB` or `GB` (powers of 1000), a slash,
    /// a whole number of `m` (minutes), `h` or `d`: `50MB/30d`, `2MB/1d`, `60KB/1m`.
    fn from_str(text: &str) -> Result<Budget> {
        let wrong = |why: &str| {
            Error::InvalidConfig(format!(
                "budget {text:?} {why}: write SIZE/PERIOD, a size in B, KB, MB or GB (powers \
                 of 1000) and a period in m, h or d from 1m to 31d, e.g. 50MB/30d"
            ))
        };
        let (size, period) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| wrong("has no '/'"))?;
        let bytes =
            number_with_unit(size.trim(), &SIZE_UNITS).ok_or_else(|| wrong("has no valid size"))?;
        let seconds = number_with_unit(period.trim(), &PERIOD_UNITS)
            .ok_or_else(|| wrong("has no valid period"))?;
        Budget::new(bytes, Duration::from_secs(seconds))
    }
}

/// `text` as a whole number followed by one of `units` (matched case-insensitively, the
/// longest first), times that unit; `None` if it is not one or overflows.
fn number_with_unit(text: &str, units: &[(&str, u64)]) -> Option<u64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let (_, scale) = units
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit.trim()))?;
    number.checked_mul(*scale)
}

/// `value` in the largest of `units` that divides it.
fn with_unit(value: u64, units: &[(&str, u64)]) -> String {
    let (name, scale) = units
        .iter()
        .find(|(_, scale)| value.is_multiple_of(*scale))
        .unwrap_or(&units[units.len() - 1]);
    format!("{}{name}", value / scale)
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            with_unit(self.limit_bytes, &SIZE_UNITS),
            // Periods are whole minutes when parsed; a `Budget::new` of seconds shows them.
            if self.period.as_secs().is_multiple_of(60) {
                with_unit(self.period.as_secs(), &PERIOD_UNITS)
            } else {
                format!("{}s", self.period.as_secs())
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issues_examples_parse_as_powers_of_1000() {
        let cases = [
            ("50MB/30d", 50_000_000, 30 * 86_400),
            ("2MB/1d", 2_000_000, 86_400),
            ("60KB/1m", 60_000, 60),
            ("1GB/12h", 1_000_000_000, 12 * 3_600),
            ("500B/1m", 500, 60),
            ("3kb/2M", 3_000, 120),
        ];
        for (text, bytes, seconds) in cases {
            let budget: Budget = text.parse().unwrap();
            assert_eq!(
                (budget.limit_bytes(), budget.period().as_secs()),
                (bytes, seconds),
                "{text}"
            );
        }
        assert_eq!("3kb/2M".parse::<Budget>().unwrap().to_string(), "3KB/2m");
        assert_eq!(
            "1000KB/60m".parse::<Budget>().unwrap().to_string(),
            "1MB/1h"
        );
    }

    #[test]
    fn a_budget_out_of_range_or_malformed_names_what_is_wrong_and_the_limits() {
        for (text, says) in [
            ("50MB", "no '/'"),
            ("50/30d", "no valid size"),
            ("50TB/30d", "no valid size"),
            ("-5MB/1d", "no valid size"),
            ("50MB/30", "no valid period"),
            ("50MB/30s", "no valid period"),
            ("0B/1d", "from 1 byte"),
            ("50MB/32d", "from a minute"),
            ("50MB/0m", "from a minute"),
            ("99999999999999999999GB/1d", "no valid size"),
            ("2000GB/1d", "1000GB"),
        ] {
            let e = text.parse::<Budget>().unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
