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
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
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
