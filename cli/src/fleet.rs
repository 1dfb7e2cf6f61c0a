//! The fleet's view of its devices' streams, from what `outbox ingest` stored: per source
//! and stream, the numbers stored, the device's last accounting, and from both the numbers
//! the fleet lacks (`missing`) and the numbers it holds twice under different event ids
//! (`reused`: a device restored from an older copy of its file). `outbox fleet` prints it;
//! the ingest's metrics listener serves it as `/fleet` and counts it in `/metrics`.
//!
//! Each number counts once, by the most final thing known of it: stored beats every fate the
//! device reported (an exported event imported later, a dead event retried and delivered),
//! a fate beats pending. Missing is a moment's view: an event that arrives later fills its
//! gap.

use serde::Serialize;

use sqlite_outbox::wire::{count_of, subtract, union, Fates, Ranges};

/// One stream as the fleet sees it (the JSON object `outbox fleet --json` prints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamView {
    /// The device's source.
    pub source: String,
    /// The stream: the destination's name on the device.
    pub destination: String,
    /// The highest number the device ever reported committed (or the highest stored, if
    /// higher or if it never reported).
    pub high_water: i64,
    /// Distinct numbers stored.
    pub stored: i64,
    /// The number through which every number is stored or accounted.
    pub stored_through: i64,
    /// Numbers the device last reported still pending (and not stored since).
    pub pending_on_device: i64,
    /// Numbers accounted by fate (and not stored).
    pub accounted: Accounted,
    /// Numbers at or below `high_water` neither stored, nor pending, nor accounted.
    pub missing: Ranges,
    /// Numbers stored under two or more event ids.
    pub reused: Ranges,
    /// When the device last reported (RFC 3339, the ingest's clock), if ever.
    pub reported_at: Option<String>,
    /// The device has not reported for longer than the silence allowed (`outbox fleet
    /// --silent-after`) while numbers it reported pending are not stored: they may never
    /// come.
    pub silent: bool,
}

impl StreamView {
    /// Whether the stream lacks numbers, holds one twice, or its device went silent with
    /// numbers pending.
    pub fn is_incomplete(&self) -> bool {
        !self.missing.is_empty() || !self.reused.is_empty() || self.silent
    }

    /// Missing numbers, counted.
    pub fn missing_count(&self) -> i64 {
        count_of(&self.missing)
    }
}

/// The counts of accounted numbers by fate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Accounted {
    pub expired: i64,
    pub dropped: i64,
    pub coalesced: i64,
    pub dead: i64,
    pub purged: i64,
    pub exported: i64,
}

impl Accounted {
    /// Every fate together (saturating).
    pub fn total(&self) -> i64 {
        [
            self.expired,
            self.dropped,
            self.coalesced,
            self.dead,
            self.purged,
            self.exported,
        ]
        .into_iter()
        .fold(0i64, i64::saturating_add)
    }
}

/// A device's last accounting of a stream, as stored.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub high_water: i64,
    pub pending: Ranges,
    pub accounted: Fates,
    pub reported_at: String,
}

/// The view of one stream from its stored ranges, its reused numbers and its last report.
pub fn view(
    source: String,
    destination: String,
    stored: &Ranges,
    reused: Ranges,
    report: Option<&Report>,
) -> StreamView {
    let high_water = report
        .map_or(0, |r| r.high_water)
        .max(stored.last().map_or(0, |[_, last]| *last));
    let everything: Ranges = if high_water > 0 {
        vec![[1, high_water]]
    } else {
        Vec::new()
    };
    let empty = Fates::default();
    let fates = report.map_or(&empty, |r| &r.accounted);
    // Each fate without what is stored: stored beats every fate.
    let unstored = |ranges: &Ranges| subtract(ranges, stored);
    let accounted = Accounted {
        expired: count_of(&unstored(&fates.expired)),
        dropped: count_of(&unstored(&fates.dropped)),
        coalesced: count_of(&unstored(&fates.coalesced)),
        dead: count_of(&unstored(&fates.dead)),
        purged: count_of(&unstored(&fates.purged)),
        exported: count_of(&unstored(&fates.exported)),
    };
    let mut known = stored.clone();
    for (_, ranges) in fates.each() {
        known = union(&known, ranges);
    }
    let stored_through = match known.first() {
        Some([1, last]) => (*last).min(high_water),
        _ => 0,
    };
    let pending = report.map_or_else(Vec::new, |r| subtract(&r.pending, &known));
    let missing = subtract(&subtract(&everything, &known), &pending);
    StreamView {
        source,
        destination,
        high_water,
        stored: count_of(stored),
        stored_through,
        pending_on_device: count_of(&pending),
        accounted,
        missing,
        reused,
        reported_at: report.map(|r| r.reported_at.clone()),
        silent: false,
    }
}

/// Now, as RFC 3339 (UTC, milliseconds).
pub fn now_rfc3339() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    sqlite_outbox::wire::rfc3339_millis(ms)
}

/// How long a stream's device may stay unheard of, with numbers it reported pending and the
/// fleet has not stored, before the stream counts as incomplete (`outbox fleet
/// --silent-after`): one day, at least the longest accounting interval a relay takes
/// (`RelayConfig::accounting_interval`, at most a day).
pub const DEFAULT_SILENT_AFTER: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Rows of `outbox_fleet_log` one transaction of [`merge_log`] takes at most.
const MERGE_ROWS: i64 = 20_000;

/// Key of the advisory lock that lets one merger at a time at the log (any process).
const MERGE_LOCK: i64 = 0x6f75_7466_6c74;

/// Merges what requests logged (`outbox_fleet_log`) into the streams' summaries, in
/// transactions of at most 20,000 log rows, one merger at a time (an advisory lock:
/// a second waits, then finds the log empty): the numbers join the stored ones; a number of
/// a new event that was stored already, or that two new events carry, joins the reused.
/// Returns how many log rows were merged. The ingest's probe calls it every fleet refresh;
/// `outbox fleet` before it reads.
///
/// # Errors
///
/// PostgreSQL's.
pub fn merge_log(client: &mut postgres::Client) -> Result<u64, postgres::Error> {
    let mut merged = 0u64;
    loop {
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MERGE_LOCK])?;
        // Per stream, in one statement: the log rows taken (deleted), their numbers joined,
        // and the new events' numbers found among the stored ones, or in two rows (ranges
        // swept in order: one that starts below the reach of those before it overlaps).
        let row = tx.query_one(
            "WITH taken AS (
                 DELETE FROM outbox_fleet_log
                  WHERE ctid = ANY (ARRAY(SELECT ctid FROM outbox_fleet_log LIMIT $1))
                 RETURNING source, stream, numbers, fresh, twice
             ), per_stream AS (
                 SELECT source, stream, range_agg(numbers) AS numbers,
                        range_agg(fresh) AS fresh, range_agg(twice) AS twice
                   FROM taken GROUP BY source, stream
             ), swept AS (
                 SELECT source, stream, r,
                        max(upper(r)) OVER (PARTITION BY source, stream
                                            ORDER BY lower(r), upper(r)
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                            AS reach
                   FROM taken, unnest(fresh) AS r
             ), across AS (
                 SELECT source, stream,
                        range_agg(int8range(lower(r), LEAST(upper(r), reach))) AS numbers
                   FROM swept WHERE reach > lower(r)
                  GROUP BY source, stream
             ), updated AS (
                 UPDATE outbox_fleet_streams AS f
                    SET stored = f.stored + p.numbers,
                        reused = f.reused + (f.stored * p.fresh) + p.twice
                                          + COALESCE(a.numbers, '{}')
                   FROM per_stream AS p
                   LEFT JOIN across AS a ON a.source = p.source AND a.stream = p.stream
                  WHERE f.source = p.source AND f.stream = p.stream
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM taken), (SELECT count(*) FROM updated)",
            &[&MERGE_ROWS],
        )?;
        let taken: i64 = row.get(0);
        tx.commit()?;
        merged += taken as u64;
        if taken < MERGE_ROWS {
            return Ok(merged);
        }
    }
}

/// Reads the view of every stream (of `source` only, if given) from the streams' summaries
/// the ingest keeps (`outbox_fleet_streams`, one row per source and stream, and the last
/// report of each), once what requests logged since the last merge is merged
/// ([`merge_log`]): its cost grows with the streams and the gaps in them, and with what
/// was stored since the last merge, not with the events stored. A stream whose last report is older than `silent_after` while numbers it
/// reported pending are not stored is marked silent (and so incomplete). The incomplete
/// streams come first, then by source and stream.
///
/// # Errors
///
/// PostgreSQL's, when a query fails (tables missing: the ingest never ran against it).
pub fn read(
    client: &mut postgres::Client,
    source: Option<&str>,
    silent_after: std::time::Duration,
) -> Result<Vec<StreamView>, postgres::Error> {
    merge_log(client)?;
    let mut views = Vec::new();
    for row in client.query(
        "SELECT f.source, f.stream,
                ARRAY(SELECT lower(n) FROM unnest(f.stored) AS n),
                ARRAY(SELECT upper(n) - 1 FROM unnest(f.stored) AS n),
                ARRAY(SELECT lower(n) FROM unnest(f.reused) AS n),
                ARRAY(SELECT upper(n) - 1 FROM unnest(f.reused) AS n),
                r.high_water, r.pending::text, r.accounted::text,
                to_char(r.reported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                EXTRACT(EPOCH FROM now() - r.reported_at)::float8
           FROM outbox_fleet_streams AS f
           LEFT JOIN outbox_stream_reports AS r
             ON r.source = f.source AND r.stream = f.stream
          WHERE $1::text IS NULL OR f.source = $1
          ORDER BY f.source, f.stream",
        &[&source],
    )? {
        let ranges = |firsts: Vec<i64>, lasts: Vec<i64>| -> Ranges {
            union(
                &firsts.into_iter().zip(lasts).map(|(a, b)| [a, b]).collect(),
                &Vec::new(),
            )
        };
        let stored = ranges(row.get(2), row.get(3));
        let reused = ranges(row.get(4), row.get(5));
        let high_water: Option<i64> = row.get(6);
        let pending: Option<String> = row.get(7);
        let accounted: Option<String> = row.get(8);
        // Checked when stored (`StreamAccount::from_data`); a row edited by hand that no
        // longer reads counts as no report.
        let report = match (high_water, pending, accounted) {
            (Some(high_water), Some(pending), Some(accounted)) => match (
                serde_json::from_str::<Ranges>(&pending),
                serde_json::from_str::<Fates>(&accounted),
            ) {
                (Ok(pending), Ok(accounted)) => Some(Report {
                    high_water,
                    pending,
                    accounted,
                    reported_at: row.get::<_, Option<String>>(9).unwrap_or_default(),
                }),
                _ => None,
            },
            _ => None,
        };
        let mut view = view(row.get(0), row.get(1), &stored, reused, report.as_ref());
        let age: Option<f64> = row.get(10);
        view.silent = report.is_some()
            && view.pending_on_device > 0
            && age.is_some_and(|age| age > silent_after.as_secs_f64());
        views.push(view);
    }
    views.sort_by_key(|v| !v.is_incomplete());
    Ok(views)
}

/// `text` with its control characters (a terminal's escape sequences among them) written
/// as `\u{1b}`, for printing a device's names to a terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_number_counts_once_by_the_most_final_thing_known_of_it() {
        let mut accounted = Fates::default();
        accounted.expired = vec![[3, 4]];
        accounted.exported = vec![[5, 6]];
        accounted.dead = vec![[7, 7]];
        let report = Report {
            high_water: 12,
            pending: vec![[11, 12]],
            accounted,
            reported_at: "2026-12-06T10:00:00.000Z".into(),
        };
        // 1-2 stored, 3-4 expired, 5 exported then imported (stored), 6 exported, 7 dead
        // then delivered (stored), 8 stored, 9-10 lost, 11-12 pending, 11 since stored.
        let stored = vec![[1, 2], [5, 5], [7, 8], [11, 11]];
        let v = view(
            "/d".into(),
            "fleet".into(),
            &stored,
            vec![[8, 8]],
            Some(&report),
        );
        assert_eq!(v.high_water, 12);
        assert_eq!(v.stored, 6);
        assert_eq!(v.stored_through, 8);
        assert_eq!(v.pending_on_device, 1);
        assert_eq!(
            v.accounted,
            Accounted {
                expired: 2,
                exported: 1,
                ..Default::default()
            }
        );
        assert_eq!(v.missing, vec![[9, 10]]);
        assert_eq!(v.reused, vec![[8, 8]]);
        assert!(v.is_incomplete());
        // No report: the highest stored number is the high water.
        let v = view(
            "/d".into(),
            "fleet".into(),
            &vec![[1, 3], [5, 6]],
            vec![],
            None,
        );
        assert_eq!(
            (v.high_water, v.stored_through, v.missing.clone()),
            (6, 3, vec![[4, 4]])
        );
    }
}
