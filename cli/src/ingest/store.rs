//! Storing one request's events in `outbox_ingested`: one statement, one transaction, each
//! `(source, id)` stored once however often it arrives.

use base64::Engine;
use serde_json::Value;

use sqlite_outbox::receive::{CloudEvent, Data};

use super::reports::Reports;
use sqlite_outbox::wire::{
    ranges_of, Ranges, StreamAccount, ACCOUNTING_TYPE, MAX_STREAM_NUMBER, STREAM_ATTRIBUTE,
    STREAM_SEQ_ATTRIBUTE,
};

/// The statement that stores a request's events: `unnest` turns the per-column arrays into
/// rows, and `ON CONFLICT DO NOTHING` skips every `(source, id)` already stored, also one
/// that a concurrent transaction is storing (it waits for that one, then skips or stores).
///
/// In the same statement, each of the request's sources gets its row in `outbox_sources`
/// (first and last seen, events stored, newest event time), so an operator can ask which
/// devices went silent; and each of its streams a row in `outbox_fleet_log` (PostgreSQL
/// migration 7): every number the request carries (`numbers`: its new events' and the
/// copies' of events stored before under another number: a redelivery, a second
/// destination, an imported bundle), those of its new events (`fresh`) and those two of
/// its new events both carry (`twice`). An append, which no other request waits for: the
/// log is merged into the streams' summaries by the health probe (`fleet::merge_log`).
///
/// It returns one row of how many events were new, then one per stream of the request
/// that has no summary row yet (a device's first request to a destination: its source's
/// streams are counted before it is stored).
pub(crate) const INSERT_EVENTS: &str = "
    WITH stored AS (
        INSERT INTO outbox_ingested (source, id, type, subject, partitionkey, sequence, time, data,
                                     traceparent, tracestate, dataschema, stream, stream_seq)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                             $6::int8[], $7::text[]::timestamptz[], $8::jsonb[],
                             $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[])
        ON CONFLICT (source, id) DO NOTHING
        RETURNING source, id, time, stream, stream_seq
    ), seen AS (
        INSERT INTO outbox_sources AS s (source, events_stored, newest_event_time)
        SELECT requested.source, count(stored.source), max(stored.time)
          FROM (SELECT DISTINCT unnest($1::text[]) AS source) AS requested
          LEFT JOIN stored ON stored.source = requested.source
         GROUP BY requested.source
        ON CONFLICT (source) DO UPDATE
           SET last_seen = now(),
               events_stored = s.events_stored + EXCLUDED.events_stored,
               newest_event_time = GREATEST(s.newest_event_time, EXCLUDED.newest_event_time)
    ), numbered AS (
        SELECT source, stream, stream_seq
          FROM unnest($1::text[], $12::text[], $13::int8[]) AS r(source, stream, stream_seq)
         WHERE stream IS NOT NULL AND stream_seq IS NOT NULL
    ), logged AS (
        INSERT INTO outbox_fleet_log (source, stream, numbers, fresh, twice)
        SELECT n.source, n.stream, range_agg(int8range(n.stream_seq, n.stream_seq, '[]')),
               COALESCE((SELECT range_agg(int8range(f.stream_seq, f.stream_seq, '[]'))
                           FROM stored AS f
                          WHERE f.source = n.source AND f.stream = n.stream), '{}'),
               COALESCE((SELECT range_agg(int8range(t.stream_seq, t.stream_seq, '[]'))
                           FROM (SELECT stream_seq FROM stored AS f
                                  WHERE f.source = n.source AND f.stream = n.stream
                                  GROUP BY stream_seq HAVING count(*) > 1) AS t), '{}')
          FROM numbered AS n
         WHERE $14
         GROUP BY n.source, n.stream
    )
    SELECT (SELECT count(*) FROM stored), NULL::text, NULL::text
    UNION ALL
    SELECT NULL, r.source, r.stream
      FROM (SELECT DISTINCT source, stream FROM numbered) AS r
     WHERE $14 AND NOT EXISTS (SELECT 1 FROM outbox_fleet_streams AS f
                                WHERE f.source = r.source AND f.stream = r.stream)";

/// How many streams one source may have at the fleet unless the ingest is told otherwise
/// (`--max-streams-per-source`): a device has one stream per destination, a handful at
/// most; the bound keeps one device's key from inventing streams without end.
pub const DEFAULT_MAX_STREAMS_PER_SOURCE: usize = 256;

/// The most streams per source `--max-streams-per-source` may allow.
pub const MOST_STREAMS_PER_SOURCE: usize = 65_536;

/// A request's events as the columns of [`INSERT_EVENTS`].
#[derive(Debug, Default)]
pub(crate) struct Columns {
    source: Vec<String>,
    id: Vec<String>,
    event_type: Vec<String>,
    subject: Vec<Option<String>>,
    partitionkey: Vec<Option<String>>,
    sequence: Vec<Option<i64>>,
    time: Vec<Option<String>>,
    data: Vec<Option<Value>>,
    traceparent: Vec<Option<String>>,
    tracestate: Vec<Option<String>>,
    dataschema: Vec<Option<String>>,
    stream: Vec<Option<String>>,
    stream_seq: Vec<Option<i64>>,
    /// The streams' accountings the request holds (not stored as events).
    pub reports: Reports,
}

impl Columns {
    /// The columns of `events`, or why one cannot be stored (its `sequence` or `outboxseq`
    /// is not a decimal integer, its `outboxstream` not a name, an accounting not well
    /// formed): the whole request is then refused with a 400.
    pub fn new(events: Vec<CloudEvent>) -> Result<Columns, String> {
        let mut columns = Columns::default();
        for event in events {
            if event.event_type == ACCOUNTING_TYPE {
                let account = match &event.data {
                    Data::Json(data) => StreamAccount::from_data(data),
                    _ => Err("its data is not JSON".to_string()),
                }
                .map_err(|e| format!("accounting {}: {e:#}", event.id))?;
                columns.reports.push(event.source, account);
                continue;
            }
            let (stream, stream_seq) = stream_number(&event)?;
            columns.stream.push(stream);
            columns.stream_seq.push(stream_seq);
            let sequence = match event.extensions.get("sequence") {
                None => None,
                Some(value) => Some(decimal(value).ok_or_else(|| {
                    format!(
                        "event {}: sequence {value} is not a decimal integer",
                        event.id
                    )
                })?),
            };
            let partitionkey = event.extensions.get("partitionkey").map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            // Stored only when well formed: a malformed context is ignored, as W3C asks
            // of a receiver, rather than handed on.
            columns
                .traceparent
                .push(event.traceparent().map(|tp| tp.as_str().to_owned()));
            columns
                .tracestate
                .push(event.tracestate().map(str::to_owned));
            columns.data.push(match event.data {
                Data::None => None,
                Data::Json(value) => Some(value),
                Data::Text(text) => Some(Value::String(text)),
                Data::Binary(bytes) => Some(serde_json::json!({
                    "data_base64": base64::engine::general_purpose::STANDARD.encode(bytes)
                })),
            });
            columns.source.push(event.source);
            columns.id.push(event.id);
            columns.event_type.push(event.event_type);
            columns.subject.push(event.subject);
            columns.partitionkey.push(partitionkey);
            columns.sequence.push(sequence);
            columns.time.push(event.time);
            columns.dataschema.push(event.dataschema);
        }
        Ok(columns)
    }

    /// What a receipt for this request says: the source of its first event (or
    /// accounting), the stream of its first event, and the numbers of that source's events
    /// in that stream.
    pub fn receipt_facts(&self) -> (String, Option<String>, Ranges) {
        let source = self
            .source
            .first()
            .or(self.reports.first_source())
            .cloned()
            .unwrap_or_default();
        let stream = self.stream.first().cloned().flatten();
        let mut numbers: Vec<i64> = (0..self.len())
            .filter(|&i| self.source[i] == source && self.stream[i] == stream)
            .filter_map(|i| self.stream_seq[i])
            .collect();
        numbers.sort_unstable();
        (source, stream, ranges_of(numbers))
    }

    /// How many events (accountings not counted).
    pub fn len(&self) -> usize {
        self.id.len()
    }

    /// The parameters of [`INSERT_EVENTS`].
    pub fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 13] {
        [
            &self.source,
            &self.id,
            &self.event_type,
            &self.subject,
            &self.partitionkey,
            &self.sequence,
            &self.time,
            &self.data,
            &self.traceparent,
            &self.tracestate,
            &self.dataschema,
            &self.stream,
            &self.stream_seq,
        ]
    }
}

/// An event's stream and number (the `outboxstream` and `outboxseq` extensions), both or
/// neither; a number is a positive decimal integer, a stream name 1 to 255 bytes.
fn stream_number(event: &CloudEvent) -> Result<(Option<String>, Option<i64>), String> {
    let stream = event.extensions.get(STREAM_ATTRIBUTE);
    let seq = event.extensions.get(STREAM_SEQ_ATTRIBUTE);
    match (stream, seq) {
        (None, None) => Ok((None, None)),
        (Some(Value::String(stream)), Some(seq)) if !stream.is_empty() && stream.len() <= 255 => {
            match decimal(seq) {
                Some(n) if (1..=MAX_STREAM_NUMBER).contains(&n) => {
                    Ok((Some(stream.clone()), Some(n)))
                }
                _ => Err(format!(
                    "event {}: {STREAM_SEQ_ATTRIBUTE} {seq} is not a decimal integer from 1 to \
                     {MAX_STREAM_NUMBER}",
                    event.id
                )),
            }
        }
        _ => Err(format!(
            "event {}: {STREAM_ATTRIBUTE} (a name of 1 to 255 bytes) and \
             {STREAM_SEQ_ATTRIBUTE} go together",
            event.id
        )),
    }
}

/// The events of a request that PostgreSQL cannot hold, each with why: a NUL character
/// (`\u0000`) in its data (jsonb refuses it) or in one of its text attributes (text columns
/// refuse it). Checked before the store, so the answer can name each event and the rest of
/// a batch is not lost with it (the relay splits a refused batch and sends the rest again).
pub(crate) fn unstorable(events: &[CloudEvent]) -> Vec<(String, String)> {
    let mut refused = Vec::new();
    for event in events {
        let attributes = [
            ("id", Some(event.id.as_str())),
            ("source", Some(event.source.as_str())),
            ("type", Some(event.event_type.as_str())),
            ("subject", event.subject.as_deref()),
        ];
        let why = if let Some((name, _)) = attributes
            .iter()
            .find(|(_, value)| value.is_some_and(|v| v.contains('\0')))
        {
            Some(format!(
                "{name} holds a NUL character, which PostgreSQL text cannot store"
            ))
        } else if event.extensions.values().any(holds_nul) {
            Some(
                "an extension attribute holds a NUL character, which PostgreSQL cannot store"
                    .into(),
            )
        } else {
            let nul_in_data = match &event.data {
                Data::Json(value) => holds_nul(value),
                Data::Text(text) => text.contains('\0'),
                Data::None | Data::Binary(_) => false,
            };
            nul_in_data
                .then(|| "data holds \\u0000, which PostgreSQL's jsonb cannot store".to_string())
        };
        if let Some(why) = why {
            refused.push((event.id.clone(), why));
        }
    }
    refused
}

/// Whether a NUL character is in any string or key of `value`.
fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(members) => members
            .iter()
            .any(|(key, member)| key.contains('\0') || holds_nul(member)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// `sequence` as a decimal integer: a string of digits (the crate's relay sends zero-padded
/// ones) or a JSON integer.
fn decimal(value: &Value) -> Option<i64> {
    match value {
        Value::String(s) => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        }
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Why a request was not stored.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// PostgreSQL failed.
    Postgres(postgres::Error),
    /// The request would give a source more streams than allowed, or a stream more fates
    /// than a stream may hold: refused whole (nothing stored), with the refusal's reason
    /// (for the metrics) and why.
    Refused { reason: &'static str, why: String },
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        StoreError::Postgres(e)
    }
}

/// Stores `columns` in one transaction, with their streams' numbers logged for the
/// summaries (unless a bench turned them off, `summaries_on`); returns how many events were
/// new. A request that would give a source more than `max_streams` streams is refused
/// whole.
pub(crate) fn store(
    conn: &mut super::prepared::Connection,
    columns: &Columns,
    max_streams: usize,
    summaries_on: bool,
) -> Result<u64, StoreError> {
    let statement = conn.prepared(INSERT_EVENTS)?;
    let mut tx = conn.client.transaction()?;
    let mut stored = 0i64;
    let mut new = NewStreams::default();
    if columns.len() > 0 {
        let mut params = columns.params().to_vec();
        params.push(&summaries_on);
        for row in tx.query(&statement, &params)? {
            match row.get::<_, Option<i64>>(0) {
                Some(count) => stored = count,
                None => new.push(row.get(1), row.get(2)),
            }
        }
    }
    if summaries_on && columns.reports.len() > 0 {
        let (sources, streams): (Vec<&str>, Vec<&str>) = columns.reports.streams().unzip();
        for row in tx.query(
            "SELECT DISTINCT r.source, r.stream
               FROM unnest($1::text[], $2::text[]) AS r(source, stream)
              WHERE NOT EXISTS (SELECT 1 FROM outbox_fleet_streams AS f
                                 WHERE f.source = r.source AND f.stream = r.stream)",
            &[&sources, &streams],
        )? {
            new.push(row.get(0), row.get(1));
        }
    }
    if !new.source.is_empty() {
        add_streams(&mut tx, &new, max_streams)?;
    }
    columns.reports.store(&mut tx)?;
    tx.commit()?;
    Ok(stored as u64)
}

/// Streams seen without a summary row, by source.
#[derive(Debug, Default)]
struct NewStreams {
    source: Vec<String>,
    stream: Vec<String>,
}

impl NewStreams {
    fn push(&mut self, source: String, stream: String) {
        if !(0..self.source.len()).any(|i| self.source[i] == source && self.stream[i] == stream) {
            self.source.push(source);
            self.stream.push(stream);
        }
    }
}

/// Gives the streams of `new` their rows, unless a source would then have more than
/// `max_streams`: each source's streams are counted under a lock of its own (new streams
/// are rare: a device's first request to each destination), so two requests cannot both
/// pass the bound.
fn add_streams(
    tx: &mut postgres::Transaction<'_>,
    new: &NewStreams,
    max_streams: usize,
) -> Result<(), StoreError> {
    let mut sources: Vec<&String> = new.source.iter().collect();
    sources.sort();
    sources.dedup();
    for source in sources {
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 7303007))",
            &[source],
        )?;
        let had: i64 = tx
            .query_one(
                "SELECT count(*) FROM outbox_fleet_streams WHERE source = $1",
                &[source],
            )?
            .get(0);
        let adding: Vec<&String> = (0..new.source.len())
            .filter(|&i| &new.source[i] == source)
            .map(|i| &new.stream[i])
            .collect();
        let existing: i64 = tx
            .query_one(
                "SELECT count(*) FROM outbox_fleet_streams WHERE source = $1 AND stream = ANY($2)",
                &[source, &adding],
            )?
            .get(0);
        let total = had + adding.len() as i64 - existing;
        if total > max_streams as i64 {
            return Err(StoreError::Refused {
                reason: "streams_per_source",
                why: format!(
                    "source {source} would have {total} streams; at most {max_streams} per \
                     source (outbox ingest --max-streams-per-source)"
                ),
            });
        }
        tx.execute(
            "INSERT INTO outbox_fleet_streams (source, stream)
             SELECT $1, unnest($2::text[]) ON CONFLICT (source, stream) DO NOTHING",
            &[source, &adding],
        )?;
    }
    Ok(())
}

/// A row of `outbox_device_keys`: key id, source pattern, key.
pub(crate) type KeyRow = (String, String, String);

/// The change counter of `outbox_device_keys`, bumped by a trigger on every change.
pub(crate) fn keys_changes(client: &mut postgres::Client) -> Result<i64, postgres::Error> {
    Ok(client
        .query_one("SELECT changes FROM outbox_device_keys_changes", &[])?
        .get(0))
}

/// The keys not revoked (now), with the change counter read in the same snapshot.
pub(crate) fn load_keys(
    client: &mut postgres::Client,
) -> Result<(i64, Vec<KeyRow>), postgres::Error> {
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    let changes: i64 = tx
        .query_one("SELECT changes FROM outbox_device_keys_changes", &[])?
        .get(0);
    let rows = tx
        .query(
            "SELECT key_id, source_pattern, key FROM outbox_device_keys
              WHERE revoked_at IS NULL OR revoked_at > now()",
            &[],
        )?
        .into_iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    tx.commit()?;
    Ok((changes, rows))
}

/// Adds refusals to the rows of known sources in `outbox_sources` (a refused request for a
/// source never stored creates no row: anyone can name any source).
pub(crate) fn add_refusals(
    client: &mut postgres::Client,
    refusals: &[(String, u64)],
) -> Result<(), postgres::Error> {
    let sources: Vec<&str> = refusals.iter().map(|(s, _)| s.as_str()).collect();
    let counts: Vec<i64> = refusals.iter().map(|(_, n)| *n as i64).collect();
    client.execute(
        "UPDATE outbox_sources AS s SET refusals = s.refusals + r.n
           FROM unnest($1::text[], $2::int8[]) AS r(source, n)
          WHERE s.source = r.source",
        &[&sources, &counts],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sequence_must_be_a_decimal_integer() {
        assert_eq!(decimal(&json!("00000000000000000042")), Some(42));
        assert_eq!(decimal(&json!(7)), Some(7));
        assert_eq!(decimal(&json!("-3")), Some(-3));
        for bad in [
            json!("4e2"),
            json!("+1"),
            json!(""),
            json!("x"),
            json!(1.5),
            json!(true),
        ] {
            assert_eq!(decimal(&bad), None, "{bad}");
        }
        assert_eq!(decimal(&json!("99999999999999999999")), None, "out of i64");
    }
}
