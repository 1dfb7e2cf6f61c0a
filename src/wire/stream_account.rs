//! The accounting of a stream: what a device tells its destination about the numbers it
//! gave (see [`STREAM_SEQ_ATTRIBUTE`](crate::wire::STREAM_SEQ_ATTRIBUTE)), so that the
//! fleet can tell an event lost from one that left on purpose.
//!
//! It travels as a CloudEvent of type [`ACCOUNTING_TYPE`], signed like any event, with the
//! stream's `source`, the `outboxstream` attribute naming the stream, and this data:
//!
//! ```json
//! {"stream": "fleet", "high_water": 120, "seq": 7,
//!  "pending": [[118, 120]],
//!  "accounted": {"expired": [[3, 4]], "dropped": [], "coalesced": [[9, 9]], "dead": [],
//!                "purged": [], "exported": [[40, 59]]}}
//! ```
//!
//! Every list holds inclusive `[first, last]` ranges, ascending and apart. `high_water` is
//! the highest number the device has committed; `pending` the numbers it still holds to
//! send; `accounted` the numbers that left without a delivery, by fate. A number the fleet
//! has stored counts as stored whatever the device says of it (an exported event imported
//! later, a dead event retried). Receivers that are not `outbox ingest` can ignore events of
//! this type.
//!
//! `seq` is the device's own count of the stream's reports, rising across restarts. A
//! report with a `seq` tells the fates that changed since the destination last
//! acknowledged one: the receiver adds them to the fates it holds (a number moves to its
//! newest fate), takes `pending` only from a report newer than the newest it holds, and the
//! device forgets the fates acknowledged, so what it sends stays bounded by what changed
//! (a long history is told over several reports, each well under a receiver's body
//! limit). A report without `seq` (from a release before 0.3) replaces what the receiver
//! holds.

use serde::{Deserialize, Serialize};

/// The CloudEvents `type` reserved for a stream's accounting.
pub const ACCOUNTING_TYPE: &str = "dev.sqlite-outbox.accounting";

/// The answer header by which a receiver says it takes streams' accounting
/// (`outbox-accounting: 1`, on its 2xx answers; `outbox ingest` sends it). A relay tells an
/// HTTP destination its streams' state only once it has seen it (or when the destination
/// is configured to take it), so a generic receiver gets only the app's events.
pub const ACCOUNTING_HEADER: &str = "outbox-accounting";

/// The most ranges one accounting may hold in all (a receiver refuses more).
pub const MAX_ACCOUNT_RANGES: usize = 100_000;

/// The highest stream number a receiver takes (2^53 - 1, the largest integer every JSON
/// reader holds exactly): a device that commits a million events a second reaches it in
/// 285 years, so a higher one is a forgery, and refusing it keeps every count and sum of
/// numbers far from overflowing.
pub const MAX_STREAM_NUMBER: i64 = (1 << 53) - 1;

/// Inclusive `[first, last]` ranges of stream numbers, ascending and apart.
pub type Ranges = Vec<[i64; 2]>;

/// The numbers of a stream that left the device without a delivery, by fate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Fates {
    /// Not delivered by their deadline.
    pub expired: Ranges,
    /// Dropped by a storage limit.
    pub dropped: Ranges,
    /// Replaced by a newer event of their coalescing key.
    pub coalesced: Ranges,
    /// Out of attempts or refused (a later retry that delivers them supersedes this).
    pub dead: Ranges,
    /// Dead, then purged from the file.
    pub purged: Ranges,
    /// Written to an offline bundle.
    pub exported: Ranges,
}

impl Fates {
    /// The fates' names and ranges, in a fixed order.
    pub fn each(&self) -> [(&'static str, &Ranges); 6] {
        [
            ("expired", &self.expired),
            ("dropped", &self.dropped),
            ("coalesced", &self.coalesced),
            ("dead", &self.dead),
            ("purged", &self.purged),
            ("exported", &self.exported),
        ]
    }

    /// The ranges of the fate named `name`, to fill in.
    pub fn named_mut(&mut self, name: &str) -> Option<&mut Ranges> {
        Some(match name {
            "expired" => &mut self.expired,
            "dropped" => &mut self.dropped,
            "coalesced" => &mut self.coalesced,
            "dead" => &mut self.dead,
            "purged" => &mut self.purged,
            "exported" => &mut self.exported,
            _ => return None,
        })
    }
}

/// One stream's accounting: the data of an [`ACCOUNTING_TYPE`] event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StreamAccount {
    /// The stream: the destination's name on the device.
    pub stream: String,
    /// The highest number the device has committed in this stream.
    pub high_water: i64,
    /// The device's count of this stream's reports (rising across restarts), when the
    /// report tells only what changed since the last acknowledged one (see the module's
    /// documentation); `None` for a report that replaces what the receiver holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    /// The numbers still waiting on the device to be sent.
    #[serde(default)]
    pub pending: Ranges,
    /// The numbers that left without a delivery, by fate.
    #[serde(default)]
    pub accounted: Fates,
}

impl StreamAccount {
    /// An accounting of `stream` up to `high_water`, with nothing pending or accounted.
    pub fn new(stream: impl Into<String>, high_water: i64) -> StreamAccount {
        StreamAccount {
            stream: stream.into(),
            high_water,
            seq: None,
            pending: Vec::new(),
            accounted: Fates::default(),
        }
    }

    /// Reads an accounting from an event's data, checking what a receiver relies on: ranges
    /// ascending, apart and within `1..=high_water`, and at most [`MAX_ACCOUNT_RANGES`] in
    /// all.
    ///
    /// # Errors
    ///
    /// What is wrong, in words (the data is not this shape, or a range breaks a rule).
    pub fn from_data(data: &serde_json::Value) -> Result<StreamAccount, String> {
        let account: StreamAccount = serde_json::from_value(data.clone())
            .map_err(|e| format!("not a stream accounting: {e:#}"))?;
        if !(0..=MAX_STREAM_NUMBER).contains(&account.high_water) {
            return Err(format!(
                "high_water {} is out of range: 0 to {MAX_STREAM_NUMBER}",
                account.high_water
            ));
        }
        if account
            .seq
            .is_some_and(|seq| !(1..=MAX_STREAM_NUMBER).contains(&seq))
        {
            return Err(format!("seq is out of range: 1 to {MAX_STREAM_NUMBER}"));
        }
        if account.stream.is_empty() || account.stream.len() > 255 {
            return Err("stream must be a name of 1 to 255 bytes".into());
        }
        let lists = std::iter::once(("pending", &account.pending)).chain(account.accounted.each());
        let mut total = 0usize;
        for (name, ranges) in lists {
            total += ranges.len();
            if total > MAX_ACCOUNT_RANGES {
                return Err(format!(
                    "more than {MAX_ACCOUNT_RANGES} ranges in one accounting"
                ));
            }
            let mut after = 0i64;
            for [first, last] in ranges {
                if *first <= after || first > last || *last > account.high_water {
                    return Err(format!(
                        "{name}: range [{first}, {last}] is not ascending, apart and within \
                         1..={}",
                        account.high_water
                    ));
                }
                after = *last + 1;
            }
        }
        Ok(account)
    }
}

impl Fates {
    /// Every fate's ranges together.
    pub fn all(&self) -> Ranges {
        let mut all = Ranges::new();
        for (_, ranges) in self.each() {
            all = union(&all, ranges);
        }
        all
    }

    /// How many ranges in all.
    pub fn ranges(&self) -> usize {
        self.each().iter().map(|(_, r)| r.len()).sum()
    }

    /// `self` with the fates of `newer` added: a number `newer` names takes its fate there
    /// and leaves any other it had here.
    pub fn merged(&self, newer: &Fates) -> Fates {
        let renamed = newer.all();
        let mut out = Fates::default();
        for (name, ranges) in self.each() {
            let added = newer
                .each()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, r)| r);
            let kept = subtract(ranges, &renamed);
            if let Some(slot) = out.named_mut(name) {
                *slot = union(&kept, added.unwrap_or(&Vec::new()));
            }
        }
        out
    }

    /// `self` without what `told` holds, fate by fate.
    pub fn without(&self, told: &Fates) -> Fates {
        let mut out = Fates::default();
        for ((name, ranges), (_, taken)) in self.each().into_iter().zip(told.each()) {
            if let Some(slot) = out.named_mut(name) {
                *slot = subtract(ranges, taken);
            }
        }
        out
    }

    /// Whether no fate holds a number.
    pub fn is_empty(&self) -> bool {
        self.each().iter().all(|(_, r)| r.is_empty())
    }

    /// The first `most` ranges (in the fates' fixed order), and the rest.
    pub fn split_at(&self, most: usize) -> (Fates, Fates) {
        let (mut head, mut tail) = (Fates::default(), Fates::default());
        let mut left = most;
        for (name, ranges) in self.each() {
            let take = left.min(ranges.len());
            left -= take;
            if let Some(slot) = head.named_mut(name) {
                *slot = ranges[..take].to_vec();
            }
            if let Some(slot) = tail.named_mut(name) {
                *slot = ranges[take..].to_vec();
            }
        }
        (head, tail)
    }
}

/// Ranges of `numbers` (ascending).
pub fn ranges_of(numbers: impl IntoIterator<Item = i64>) -> Ranges {
    let mut ranges: Ranges = Vec::new();
    for n in numbers {
        match ranges.last_mut() {
            Some([_, last]) if n == *last + 1 => *last = n,
            Some([_, last]) if n <= *last => {}
            _ => ranges.push([n, n]),
        }
    }
    ranges
}

/// `a` without `b` (both ascending and apart).
pub fn subtract(a: &Ranges, b: &Ranges) -> Ranges {
    let mut out = Vec::new();
    let mut j = 0;
    for &[first, last] in a {
        let mut from = first;
        while j < b.len() && b[j][1] < from {
            j += 1;
        }
        let mut k = j;
        while from <= last {
            match b.get(k) {
                Some(&[bf, bl]) if bf <= last => {
                    if bf > from {
                        out.push([from, bf - 1]);
                    }
                    from = from.max(bl.saturating_add(1));
                    k += 1;
                }
                _ => {
                    out.push([from, last]);
                    break;
                }
            }
        }
    }
    out
}

/// `a` and `b` together (both ascending and apart), as ranges ascending and apart.
pub fn union(a: &Ranges, b: &Ranges) -> Ranges {
    let mut all: Ranges = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(all.len());
    for [first, last] in all {
        match out.last_mut() {
            Some([_, end]) if first <= end.saturating_add(1) => *end = (*end).max(last),
            _ => out.push([first, last]),
        }
    }
    out
}

/// How many numbers `ranges` hold (saturating: never wraps, whatever the ranges).
pub fn count_of(ranges: &[[i64; 2]]) -> i64 {
    ranges.iter().fold(0i64, |total, [a, b]| {
        total.saturating_add(b.saturating_sub(*a).saturating_add(1).max(0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fates_merge_split_and_count_without_overflow() {
        let held = Fates {
            dead: vec![[1, 3]],
            ..Fates::default()
        };
        let newer = Fates {
            purged: vec![[2, 2]],
            expired: vec![[7, 8]],
            ..Fates::default()
        };
        let merged = held.merged(&newer);
        assert_eq!(merged.dead, vec![[1, 1], [3, 3]]);
        assert_eq!(merged.purged, vec![[2, 2]]);
        assert_eq!(merged.without(&newer).all(), vec![[1, 1], [3, 3]]);
        let (head, tail) = merged.split_at(2);
        assert_eq!(head.ranges() + tail.ranges(), merged.ranges());
        assert_eq!(head.expired, vec![[7, 8]]);
        assert_eq!(head.dead, vec![[1, 1]]);
        assert_eq!(count_of(&[[i64::MIN, i64::MAX], [0, i64::MAX]]), i64::MAX);
    }

    #[test]
    fn ranges_subtract_and_join() {
        assert_eq!(
            subtract(&vec![[1, 10]], &vec![[2, 3], [5, 5], [9, 12]]),
            vec![[1, 1], [4, 4], [6, 8]]
        );
        assert_eq!(
            subtract(&vec![[1, 3], [7, 9]], &vec![]),
            vec![[1, 3], [7, 9]]
        );
        assert_eq!(
            subtract(&vec![[4, 6]], &vec![[1, 10]]),
            Vec::<[i64; 2]>::new()
        );
        assert_eq!(
            subtract(&vec![[1, 2], [4, 8]], &vec![[2, 5]]),
            vec![[1, 1], [6, 8]]
        );
        assert_eq!(
            union(&vec![[1, 2], [7, 8]], &vec![[3, 4], [8, 10]]),
            vec![[1, 4], [7, 10]]
        );
    }

    #[test]
    fn numbers_fold_into_ranges_and_count_back() {
        let r = ranges_of([1, 2, 3, 5, 7, 8, 8, 9]);
        assert_eq!(r, vec![[1, 3], [5, 5], [7, 9]]);
        assert_eq!(count_of(&r), 7);
        assert!(ranges_of([]).is_empty());
    }

    #[test]
    fn an_accounting_reads_back_and_bad_ranges_are_refused() {
        let mut account = StreamAccount::new("fleet", 10);
        account.pending = vec![[9, 10]];
        account.accounted.expired = vec![[1, 2], [4, 4]];
        let data = serde_json::to_value(&account).unwrap();
        assert_eq!(StreamAccount::from_data(&data).unwrap(), account);
        for bad in [
            json!({"stream": "s", "high_water": 5, "pending": [[4, 6]]}),
            json!({"stream": "s", "high_water": 5, "pending": [[3, 2]]}),
            json!({"stream": "s", "high_water": 5, "pending": [[0, 1]]}),
            json!({"stream": "s", "high_water": 5, "accounted": {"dead": [[2, 3], [3, 4]]}}),
            json!({"stream": "s", "high_water": -1}),
            json!({"stream": "", "high_water": 1}),
            json!({"stream": "s", "high_water": 5, "accounted": {"stolen": [[1, 1]]}}),
            json!({"high_water": 5}),
            json!({"stream": "s", "high_water": MAX_STREAM_NUMBER + 1}),
            json!({"stream": "s", "high_water": 5, "seq": 0}),
        ] {
            assert!(StreamAccount::from_data(&bad).is_err(), "{bad}");
        }
        let many: Vec<[i64; 2]> = (1..=MAX_ACCOUNT_RANGES as i64 + 1)
            .map(|n| [2 * n, 2 * n])
            .collect();
        let data = json!({"stream": "s", "high_water": MAX_STREAM_NUMBER, "pending": many});
        assert!(StreamAccount::from_data(&data)
            .unwrap_err()
            .contains("more than"));
    }
}
