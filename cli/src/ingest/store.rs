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
/// devices went silent; the statement returns how many events were new.
pub(crate) const INSERT_EVENTS: &str = "
    WITH stored AS (
        INSERT INTO outbox_ingested (source, id, type, subject, partitionkey, sequence, time, data,
                                     traceparent, tracestate, dataschema, stream, stream_seq)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                             $6::int8[], $7::text[]::timestamptz[], $8::jsonb[],
                             $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[])
        ON CONFLICT (source, id) DO NOTHING
        RETURNING source, id, time
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
    )
    SELECT source, id FROM stored";

/// The statement that keeps each stream's summary (`outbox_fleet_streams`, PostgreSQL
/// migration 7) for a request: the numbers it recorded (`numbers`: its events' newly stored
/// and the copies' of events stored before under another number) join the numbers stored;
/// the numbers of its newly stored events that were stored already (`fresh` within the
/// stored numbers as they were), or twice within the request (`twice`), join the reused.
/// The `UPDATE` locks each stream's row, so two requests of one stream merge in turn and
/// neither's numbers are lost. Streams without a row yet are not returned.
pub(crate) const UPDATE_STREAMS: &str = "
    UPDATE outbox_fleet_streams AS f
       SET stored = f.stored + u.numbers::int8multirange,
           reused = f.reused + (f.stored * u.fresh::int8multirange) + u.twice::int8multirange
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
               AS u(source, stream, numbers, fresh, twice)
     WHERE f.source = u.source AND f.stream = u.stream
    RETURNING f.source, f.stream";

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
                .map_err(|e| format!("accounting {}: {e}", event.id))?;
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

    /// The summaries of the request's streams once its events are stored (`stored`: the
    /// `(source, id)` of those that were new): every number the request recorded, those
    /// of its new events, and the numbers two of its new events both carry. The streams of
    /// its accountings come too, with no numbers: they need their rows.
    pub(crate) fn summaries(
        &self,
        stored: &std::collections::HashSet<(String, String)>,
    ) -> Summaries {
        use std::collections::BTreeMap;
        /// A stream's numbers in the request: every one, and those of its new events.
        #[derive(Default)]
        struct Numbers {
            all: Vec<i64>,
            fresh: Vec<i64>,
        }
        let mut streams: BTreeMap<(&str, &str), Numbers> = BTreeMap::new();
        for i in 0..self.len() {
            let (Some(stream), Some(number)) = (&self.stream[i], self.stream_seq[i]) else {
                continue;
            };
            let entry = streams
                .entry((self.source[i].as_str(), stream.as_str()))
                .or_default();
            entry.all.push(number);
            if stored.contains(&(self.source[i].clone(), self.id[i].clone())) {
                entry.fresh.push(number);
            }
        }
        for (source, stream) in self.reports.streams() {
            streams.entry((source, stream)).or_default();
        }
        let mut summaries = Summaries::default();
        for (
            (source, stream),
            Numbers {
                all: mut numbers,
                mut fresh,
            },
        ) in streams
        {
            numbers.sort_unstable();
            fresh.sort_unstable();
            let twice: Vec<i64> = fresh
                .windows(2)
                .filter(|pair| pair[0] == pair[1])
                .map(|pair| pair[0])
                .collect();
            summaries.push(
                source,
                stream,
                &ranges_of(numbers),
                &ranges_of(fresh),
                &ranges_of(twice),
            );
        }
        summaries
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

/// Stores `columns` in one transaction, with the summaries of their streams (unless a bench
/// turned them off, `summaries_on`); returns how many events were new. A request that would give a source more than `max_streams`
/// streams is refused whole.
pub(crate) fn store(
    client: &mut postgres::Client,
    columns: &Columns,
    max_streams: usize,
    summaries_on: bool,
) -> Result<u64, StoreError> {
    let mut tx = client.transaction()?;
    let stored: std::collections::HashSet<(String, String)> = if columns.len() > 0 {
        let statement = tx.prepare(INSERT_EVENTS)?;
        tx.query(&statement, &columns.params())?
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    } else {
        Default::default()
    };
    let summaries = columns.summaries(&stored);
    if summaries_on && !summaries.is_empty() {
        let statement = tx.prepare(UPDATE_STREAMS)?;
        let updated: std::collections::HashSet<(String, String)> = tx
            .query(&statement, &summaries.params())?
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        if updated.len() < summaries.len() {
            let new = summaries.without(&updated);
            add_streams(&mut tx, &new, max_streams)?;
            tx.query(&statement, &new.params())?;
        }
    }
    columns.reports.store(&mut tx)?;
    tx.commit()?;
    Ok(stored.len() as u64)
}

/// Gives the streams of `new` their rows, unless a source would then have more than
/// `max_streams`: each source's streams are counted under a lock of its own (new streams
/// are rare: a device's first request to each destination), so two requests cannot both
/// pass the bound.
fn add_streams(
    tx: &mut postgres::Transaction<'_>,
    new: &Summaries,
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
        let adding: Vec<&String> = (0..new.len())
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

/// A request's streams as the columns of [`UPDATE_STREAMS`]: ranges as multirange text
/// (`{[1,5],[7,7]}`).
#[derive(Debug, Default)]
pub(crate) struct Summaries {
    source: Vec<String>,
    stream: Vec<String>,
    numbers: Vec<String>,
    fresh: Vec<String>,
    twice: Vec<String>,
}

impl Summaries {
    fn push(
        &mut self,
        source: &str,
        stream: &str,
        numbers: &Ranges,
        fresh: &Ranges,
        twice: &Ranges,
    ) {
        self.source.push(source.to_owned());
        self.stream.push(stream.to_owned());
        self.numbers.push(multirange(numbers));
        self.fresh.push(multirange(fresh));
        self.twice.push(multirange(twice));
    }

    fn len(&self) -> usize {
        self.source.len()
    }

    fn is_empty(&self) -> bool {
        self.source.is_empty()
    }

    /// The streams not in `done`.
    fn without(&self, done: &std::collections::HashSet<(String, String)>) -> Summaries {
        let mut rest = Summaries::default();
        for i in 0..self.len() {
            if !done.contains(&(self.source[i].clone(), self.stream[i].clone())) {
                rest.source.push(self.source[i].clone());
                rest.stream.push(self.stream[i].clone());
                rest.numbers.push(self.numbers[i].clone());
                rest.fresh.push(self.fresh[i].clone());
                rest.twice.push(self.twice[i].clone());
            }
        }
        rest
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 5] {
        [
            &self.source,
            &self.stream,
            &self.numbers,
            &self.fresh,
            &self.twice,
        ]
    }
}

/// Ranges as PostgreSQL's multirange text: `{[1,5],[7,7]}`.
fn multirange(ranges: &Ranges) -> String {
    use std::fmt::Write;
    let mut text = String::from("{");
    for (i, [first, last]) in ranges.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let _ = write!(text, "[{first},{last}]");
    }
    text.push('}');
    text
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
