//! Human-readable output: aligned tables, sizes and ages.

use std::time::Duration;

/// Prints rows as a table with a header, columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// `1536` → `1.5 KiB`.
pub fn bytes(n: i64) -> String {
    scaled(n as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"])
}

/// `n` bytes in the largest of `units` (each `step` times the one before) it reaches: a
/// whole number of bytes, else one decimal.
fn scaled(n: f64, step: f64, units: &[&str]) -> String {
    let mut value = n;
    let mut unit = 0;
    while value >= step && unit < units.len() - 1 {
        value /= step;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// A size in powers of 1000 (B, KB, MB, GB), as carriers bill and data budgets are
/// written (`--budget 50MB/30d`).
pub fn decimal_bytes(n: u64) -> String {
    scaled(n as f64, 1000.0, &["B", "KB", "MB", "GB"])
}

/// An age in milliseconds, to the second.
pub fn age(ms: Option<i64>) -> String {
    match ms {
        Some(ms) => {
            humantime::format_duration(Duration::from_secs((ms.max(0) / 1000) as u64)).to_string()
        }
        None => "-".into(),
    }
}

/// Unix milliseconds as RFC 3339.
pub fn time(ms: Option<i64>) -> String {
    ms.map_or("-".into(), sqlite_outbox::wire::rfc3339_millis)
}

/// At most `max` characters, with an ellipsis when cut; newlines flattened.
pub fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// One delivery as the commands' JSON shows it: the record's fields, its `data` as JSON
/// (not a string holding JSON), and beside each time in unix milliseconds (`created_at`,
/// …) the same time in RFC 3339 (`created_time`, …), `null` where the time is.
pub fn record_json(record: &sqlite_outbox::admin::EventRecord) -> String {
    let mut value = serde_json::to_value(record).unwrap_or_default();
    if let Some(serde_json::Value::String(data)) = value.get("data") {
        if let Ok(parsed) = serde_json::from_str::<serde_json::Value>(data) {
            value["data"] = parsed;
        }
    }
    for (millis, time) in [
        ("created_at", "created_time"),
        ("available_at", "available_time"),
        ("delivered_at", "delivered_time"),
        ("dead_at", "dead_time"),
    ] {
        let text = value
            .get(millis)
            .and_then(serde_json::Value::as_i64)
            .and_then(rfc3339);
        value[time] = text.map_or(serde_json::Value::Null, serde_json::Value::String);
    }
    value.to_string()
}

/// Unix milliseconds as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(unix_ms: i64) -> Option<String> {
    let at =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000).ok()?;
    at.format(&time::format_description::well_known::Rfc3339)
        .ok()
}
