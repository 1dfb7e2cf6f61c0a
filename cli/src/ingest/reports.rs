//! The streams' accountings a request carries (events of type `ACCOUNTING_TYPE`), kept in
//! `outbox_stream_reports`, one row per source and stream.
//!
//! A report with a `seq` (a device's count of its stream's reports) tells only the fates that
//! changed since its destination last took one: its fates are merged into those held (a
//! number takes its newest fate), its pending numbers replace those held only if it is
//! newer than the newest report held, so a report that arrives late never undoes a newer
//! one. A report without `seq` (from a device of an earlier release) replaces what is held.
//! The highest high water any report gave is kept.

use sqlite_outbox::wire::{Fates, Ranges, StreamAccount};

use super::store::StoreError;

/// The most ranges of fates one stream's row may hold: a device's history of scattered
/// fates at a hundred a day for thirty years fits; more is a forgery that would grow a row
/// without end.
pub(crate) const MAX_STORED_FATE_RANGES: usize = 1_000_000;

/// A request's accountings, in the order they came, each with its source.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    reports: Vec<(String, StreamAccount)>,
}

/// A stream's report as held.
struct Held {
    high_water: i64,
    seq: Option<i64>,
    pending: Ranges,
    accounted: Fates,
}

impl Reports {
    /// Adds `account` of `source`.
    pub fn push(&mut self, source: String, account: StreamAccount) {
        self.reports.push((source, account));
    }

    /// How many reports.
    pub fn len(&self) -> usize {
        self.reports.len()
    }

    /// The source of the first report, if any.
    pub fn first_source(&self) -> Option<&String> {
        self.reports.first().map(|(source, _)| source)
    }

    /// Each report's `(source, stream)`.
    pub fn streams(&self) -> impl Iterator<Item = (&str, &str)> {
        self.reports
            .iter()
            .map(|(source, account)| (source.as_str(), account.stream.as_str()))
    }

    /// Merges every report into the row of its stream, inside the request's transaction:
    /// each row is locked (`FOR UPDATE`), so two reports of one stream merge in turn.
    pub fn store(&self, tx: &mut postgres::Transaction<'_>) -> Result<(), StoreError> {
        for (source, report) in &self.reports {
            let held = tx
                .query_opt(
                    "SELECT high_water, report_seq, pending::text, accounted::text
                       FROM outbox_stream_reports WHERE source = $1 AND stream = $2
                        FOR UPDATE",
                    &[source, &report.stream],
                )?
                .and_then(|row| {
                    // Checked when stored; a row edited by hand that no longer reads
                    // counts as none.
                    let pending: String = row.get(2);
                    let accounted: String = row.get(3);
                    Some(Held {
                        high_water: row.get(0),
                        seq: row.get(1),
                        pending: serde_json::from_str(&pending).ok()?,
                        accounted: serde_json::from_str(&accounted).ok()?,
                    })
                });
            let merged = merge(held, report);
            if merged.accounted.ranges() > MAX_STORED_FATE_RANGES {
                return Err(StoreError::Refused {
                    reason: "stream_fates",
                    why: format!(
                        "stream {} of {source} would hold more than {MAX_STORED_FATE_RANGES} \
                         ranges of fates",
                        report.stream
                    ),
                });
            }
            let pending = serde_json::to_value(&merged.pending).unwrap_or_default();
            let accounted = serde_json::to_value(&merged.accounted).unwrap_or_default();
            tx.execute(
                "INSERT INTO outbox_stream_reports AS r
                        (source, stream, high_water, report_seq, pending, accounted)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (source, stream) DO UPDATE
                    SET high_water = GREATEST(r.high_water, EXCLUDED.high_water),
                        report_seq = EXCLUDED.report_seq,
                        pending = EXCLUDED.pending,
                        accounted = EXCLUDED.accounted,
                        reported_at = now()",
                &[
                    source,
                    &report.stream,
                    &merged.high_water,
                    &merged.seq,
                    &pending,
                    &accounted,
                ],
            )?;
        }
        Ok(())
    }
}

/// What a stream holds once `report` is taken over `held`.
fn merge(held: Option<Held>, report: &StreamAccount) -> Held {
    let Some(held) = held else {
        return Held {
            high_water: report.high_water,
            seq: report.seq,
            pending: report.pending.clone(),
            accounted: report.accounted.clone(),
        };
    };
    let high_water = held.high_water.max(report.high_water);
    match report.seq {
        // An earlier release's report: all it knows, replacing what is held.
        None => Held {
            high_water,
            seq: held.seq,
            pending: report.pending.clone(),
            accounted: report.accounted.clone(),
        },
        Some(seq) => {
            let newer = held.seq.is_none_or(|held| seq > held);
            Held {
                high_water,
                seq: if newer { Some(seq) } else { held.seq },
                pending: if newer {
                    report.pending.clone()
                } else {
                    held.pending
                },
                accounted: held.accounted.merged(&report.accounted),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(seq: Option<i64>, high_water: i64, pending: Ranges, dead: Ranges) -> StreamAccount {
        let mut account = StreamAccount::new("fleet", high_water);
        account.seq = seq;
        account.pending = pending;
        account.accounted.dead = dead;
        account
    }

    #[test]
    fn reports_merge_their_fates_and_a_late_one_never_undoes_a_newer() {
        let first = merge(None, &report(Some(1), 10, vec![[9, 10]], vec![[2, 2]]));
        // Report 3 arrives before report 2: 4 is dead, 2 was purged since.
        let mut third = report(Some(3), 12, vec![[12, 12]], vec![[4, 4]]);
        third.accounted.purged = vec![[2, 2]];
        let after_third = merge(Some(first), &third);
        assert_eq!(after_third.accounted.dead, vec![[4, 4]]);
        assert_eq!(after_third.accounted.purged, vec![[2, 2]]);
        assert_eq!(after_third.pending, vec![[12, 12]]);
        // Report 2, late: its fates join, its pending numbers do not replace report 3's.
        let after_second = merge(
            Some(after_third),
            &report(Some(2), 11, vec![[10, 11]], vec![[7, 7]]),
        );
        assert_eq!(after_second.accounted.dead, vec![[4, 4], [7, 7]]);
        assert_eq!(after_second.pending, vec![[12, 12]]);
        assert_eq!((after_second.seq, after_second.high_water), (Some(3), 12));
        // An earlier release's report replaces what is held.
        let legacy = merge(Some(after_second), &report(None, 12, vec![], vec![[5, 5]]));
        assert_eq!(legacy.accounted.dead, vec![[5, 5]]);
        assert!(legacy.accounted.purged.is_empty());
        assert_eq!(legacy.seq, Some(3));
    }
}
