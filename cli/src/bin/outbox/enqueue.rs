//! `outbox enqueue`: commit one event from flags, or one per line of JSON from stdin.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;
use sqlite_outbox::{Enqueued, Event, Outbox};

use crate::failure::{bad_input, failed, Failure, Outcome};

// The command's help text is the doc comment of its variant in main.rs.
#[derive(Args)]
pub struct EnqueueArgs {
    /// Event type.
    #[arg(long = "type", required_unless_present = "jsonl")]
    event_type: Option<String>,
    /// Partition key: events with the same key are delivered in commit order.
    #[arg(long)]
    key: Option<String>,
    /// Idempotency key: a repeat returns the first event's id.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Subject.
    #[arg(long)]
    subject: Option<String>,
    /// Event data as JSON.
    #[arg(long, default_value = "{}")]
    data: String,
    /// Priority, 0 (least urgent) to 9 (most urgent); default: the type's, else 5. With
    /// --jsonl, the default for lines without "priority".
    #[arg(long, value_parser = parse_priority)]
    priority: Option<u8>,
    /// Expire if not delivered this long after the commit (e.g. 30s, 1h, 7d); with
    /// --jsonl, the default for lines without "expires_in".
    #[arg(long, value_parser = parse_lifetime, allow_hyphen_values = true)]
    expires_in: Option<std::time::Duration>,
    /// The W3C traceparent of the work that wrote the event
    /// (00-{32 hex trace id}-{16 hex span id}-{2 hex flags}), carried to every receiver.
    #[arg(long)]
    traceparent: Option<String>,
    /// The W3C tracestate that goes with --traceparent.
    #[arg(long, requires = "traceparent")]
    tracestate: Option<String>,
    /// The CloudEvents dataschema: an absolute URI of the schema the data follows.
    #[arg(long)]
    dataschema: Option<String>,
    /// Read events from stdin, one JSON object per line:
    /// {"type": …, "data": …, "key": …, "idempotency_key": …, "subject": …, "priority": …,
    /// "expires_in": "1h", "traceparent": …, "tracestate": …, "dataschema": …}.
    #[arg(long, conflicts_with_all = ["event_type", "key", "idempotency_key", "subject",
        "traceparent", "tracestate", "dataschema"])]
    jsonl: bool,
}

pub fn run(outbox: &Outbox, args: EnqueueArgs) -> Outcome {
    if args.jsonl {
        return enqueue_jsonl(outbox, args.priority, args.expires_in);
    }
    let data: Value = serde_json::from_str(&args.data)
        .map_err(|e| bad_input(format!("--data is not valid JSON: {e:#}")))?;
    let fields = EventFields {
        event_type: args.event_type.unwrap_or_default(),
        data,
        key: args.key,
        idempotency_key: args.idempotency_key,
        subject: args.subject,
        priority: args.priority,
        expires_in: args.expires_in,
        traceparent: args.traceparent,
        tracestate: args.tracestate,
        dataschema: args.dataschema,
    };
    let enqueued = enqueue_one(outbox, fields)?;
    println!("{}", enqueued.event_id());
    Ok(ExitCode::SUCCESS)
}

struct EventFields {
    event_type: String,
    data: Value,
    key: Option<String>,
    idempotency_key: Option<String>,
    subject: Option<String>,
    priority: Option<u8>,
    expires_in: Option<std::time::Duration>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    dataschema: Option<String>,
}

/// A lifetime of at least a millisecond, like 30s or 1h.
fn parse_lifetime(text: &str) -> Result<std::time::Duration, String> {
    let lifetime = crate::parse_duration(text)
        .map_err(|_| format!("{text:?} is not an expiry: a duration like 30s, 1h, 7d"))?;
    if lifetime.as_millis() == 0 {
        return Err(format!(
            "{text:?} is not an expiry: it must be at least 1 ms after the commit"
        ));
    }
    Ok(lifetime)
}

/// A priority from 0 to 9.
fn parse_priority(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(p) if p <= Event::MAX_PRIORITY => Ok(p),
        _ => Err(format!(
            "{text:?} is not a priority: 0 (least urgent) to 9 (most urgent)"
        )),
    }
}

fn enqueue_one(outbox: &Outbox, f: EventFields) -> Result<Enqueued, Failure> {
    let mut event = Event::new(f.event_type, f.data);
    if let Some(k) = f.key {
        event = event.partition_key(k);
    }
    if let Some(k) = f.idempotency_key {
        event = event.idempotency_key(k);
    }
    if let Some(s) = f.subject {
        event = event.subject(s);
    }
    if let Some(p) = f.priority {
        event = event.priority(p);
    }
    if let Some(lifetime) = f.expires_in {
        event = event.expires_in(lifetime);
    }
    if let Some(traceparent) = f.traceparent {
        event = event.traceparent(traceparent);
    }
    if let Some(tracestate) = f.tracestate {
        event = event.tracestate(tracestate);
    }
    if let Some(uri) = f.dataschema {
        event = event.dataschema(uri);
    }
    let enqueued = outbox.transaction(|tx| outbox.enqueue(tx, event))?;
    if let Enqueued::Duplicate { existing_event_id } = &enqueued {
        eprintln!("duplicate idempotency key: existing event {existing_event_id}");
    }
    Ok(enqueued)
}

fn optional_string(v: &Value, field: &str, line: usize) -> Result<Option<String>, Failure> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad_input(format!("line {line}: {field} must be a string"))),
    }
}

/// Commits one event per stdin line, each in its own transaction, printing each id as soon
/// as it is committed. Stops at the first bad line (exit 2); earlier lines stay committed.
fn enqueue_jsonl(
    outbox: &Outbox,
    default_priority: Option<u8>,
    default_lifetime: Option<std::time::Duration>,
) -> Outcome {
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for (n, line) in stdin.split(b'\n').enumerate() {
        let line_no = n + 1;
        let bytes = line.map_err(|e| failed(format!("reading stdin: {e:#}")))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| bad_input(format!("line {line_no}: not valid UTF-8")))?;
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| bad_input(format!("line {line_no}: not valid JSON: {e:#}")))?;
        if !v.is_object() {
            return Err(bad_input(format!("line {line_no}: expected a JSON object")));
        }
        let Some(event_type) = optional_string(&v, "type", line_no)? else {
            return Err(bad_input(format!("line {line_no}: \"type\" is required")));
        };
        let fields = EventFields {
            event_type,
            data: v.get("data").cloned().unwrap_or(Value::Null),
            key: optional_string(&v, "key", line_no)?,
            idempotency_key: optional_string(&v, "idempotency_key", line_no)?,
            subject: optional_string(&v, "subject", line_no)?,
            priority: match v.get("priority") {
                None | Some(Value::Null) => default_priority,
                Some(p) => Some(
                    p.as_u64()
                        .and_then(|p| u8::try_from(p).ok())
                        .filter(|p| *p <= Event::MAX_PRIORITY)
                        .ok_or_else(|| {
                            bad_input(format!(
                                "line {line_no}: priority {p} is out of range: 0 (least \
                                 urgent) to 9 (most urgent)"
                            ))
                        })?,
                ),
            },
            expires_in: match v.get("expires_in") {
                None | Some(Value::Null) => default_lifetime,
                Some(Value::String(text)) => Some(
                    parse_lifetime(text)
                        .map_err(|e| bad_input(format!("line {line_no}: {e:#}")))?,
                ),
                Some(other) => {
                    return Err(bad_input(format!(
                        "line {line_no}: expires_in {other} must be a duration string like \"1h\""
                    )))
                }
            },
            traceparent: optional_string(&v, "traceparent", line_no)?,
            tracestate: optional_string(&v, "tracestate", line_no)?,
            dataschema: optional_string(&v, "dataschema", line_no)?,
        };
        let enqueued = enqueue_one(outbox, fields).map_err(|f| Failure {
            code: f.code,
            message: format!("line {line_no}: {}", f.message),
        })?;
        writeln!(stdout, "{}", enqueued.event_id())
            .and_then(|_| stdout.flush())
            .map_err(|e| failed(format!("writing stdout: {e:#}")))?;
    }
    Ok(ExitCode::SUCCESS)
}
