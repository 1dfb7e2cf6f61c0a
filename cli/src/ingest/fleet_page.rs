//! The fleet at a glance for people: `GET /fleet` on the ingest's metrics listener (never
//! the events port), one HTML page of every stream (see [`crate::fleet`]), the incomplete
//! ones first; and the fleet's totals for `/metrics`, without one label per source.
//!
//! The view is read by the probe's connection every [`FLEET_EVERY`] (only when a metrics
//! listener is configured) and kept here; the page and the metrics show the last one read.
//! The page has no script, inline styles only, and every value from a device escaped.

use std::fmt::Write;
use std::time::Duration;

use crate::fleet::StreamView;
use sqlite_outbox::wire::Ranges;

/// How often the probe reads the fleet's view again.
pub(crate) const FLEET_EVERY: Duration = Duration::from_secs(15);

/// The fleet's view as last read, and when (RFC 3339, the ingest's clock).
#[derive(Debug, Default, Clone)]
pub(crate) struct FleetSnapshot {
    pub views: Vec<StreamView>,
    pub read_at: Option<String>,
    /// When it was read, for its age: a view that could not be read again grows old
    /// rather than reading zero.
    pub read_instant: Option<std::time::Instant>,
}

impl FleetSnapshot {
    /// The Prometheus lines of the fleet's totals, and the view's age. Before the view was
    /// first read the totals are `NaN` (unknown), never 0: an alert on "streams missing
    /// > 0" must not read a fleet it cannot see as complete. Sums saturate.
    pub fn metrics(&self) -> String {
        let known = |value: i64| -> String {
            if self.read_instant.is_some() {
                value.to_string()
            } else {
                "NaN".into()
            }
        };
        let streams = known(self.views.len() as i64);
        let incomplete = known(self.views.iter().filter(|v| !v.missing.is_empty()).count() as i64);
        let silent = known(self.views.iter().filter(|v| v.silent).count() as i64);
        let missing = known(
            self.views
                .iter()
                .map(StreamView::missing_count)
                .fold(0i64, i64::saturating_add),
        );
        let reused = known(
            self.views
                .iter()
                .map(|v| sqlite_outbox::wire::count_of(&v.reused))
                .fold(0i64, i64::saturating_add),
        );
        let age = self.read_instant.map_or("NaN".to_string(), |at| {
            format!("{:.3}", at.elapsed().as_secs_f64())
        });
        format!(
            "# HELP outbox_ingest_fleet_streams Streams (source and destination) the fleet knows.\n\
             # TYPE outbox_ingest_fleet_streams gauge\n\
             outbox_ingest_fleet_streams {streams}\n\
             # HELP outbox_ingest_fleet_streams_missing Streams with missing numbers.\n\
             # TYPE outbox_ingest_fleet_streams_missing gauge\n\
             outbox_ingest_fleet_streams_missing {incomplete}\n\
             # HELP outbox_ingest_fleet_streams_silent Streams whose device went silent with numbers pending.\n\
             # TYPE outbox_ingest_fleet_streams_silent gauge\n\
             outbox_ingest_fleet_streams_silent {silent}\n\
             # HELP outbox_ingest_fleet_missing_events Numbers neither stored, pending nor accounted.\n\
             # TYPE outbox_ingest_fleet_missing_events gauge\n\
             outbox_ingest_fleet_missing_events {missing}\n\
             # HELP outbox_ingest_fleet_reused_numbers Numbers stored under two event ids.\n\
             # TYPE outbox_ingest_fleet_reused_numbers gauge\n\
             outbox_ingest_fleet_reused_numbers {reused}\n\
             # HELP outbox_ingest_fleet_read_age_seconds Seconds since the fleet's view was last read (NaN: never).\n\
             # TYPE outbox_ingest_fleet_read_age_seconds gauge\n\
             outbox_ingest_fleet_read_age_seconds {age}\n"
        )
    }

    /// The page.
    pub fn page(&self) -> String {
        let mut html = String::from(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>The fleet</title><style>\
             body{font:15px/1.4 system-ui,sans-serif;margin:1em;color:#222}\
             table{border-collapse:collapse;width:100%}\
             th,td{padding:.35em .5em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}\
             td.n{text-align:right;font-variant-numeric:tabular-nums}\
             tr.incomplete{background:#fdecea}\
             .wrap{overflow-x:auto}\
             @media (max-width:600px){th.opt,td.opt{display:none}}\
             </style></head><body><h1>The fleet</h1>",
        );
        let incomplete = self.views.iter().filter(|v| v.is_incomplete()).count();
        let _ = write!(
            html,
            "<p id=\"summary\">{} streams, {} incomplete. Read at {}.</p>",
            self.views.len(),
            incomplete,
            escape(self.read_at.as_deref().unwrap_or("not yet"))
        );
        html.push_str(
            "<div class=\"wrap\"><table><thead><tr><th>Source</th><th>Stream</th>\
             <th class=\"opt\">Last report</th><th>Stored through</th><th>Pending on device</th>\
             <th class=\"opt\">Accounted</th><th>Missing</th><th>Reused</th></tr></thead><tbody>",
        );
        for v in &self.views {
            let a = &v.accounted;
            let silent = if v.silent { " (silent)" } else { "" };
            let _ = write!(
                html,
                "<tr class=\"{}\"><td>{}</td><td>{}</td><td class=\"opt\">{}</td>\
                 <td class=\"n\">{} of {}</td><td class=\"n\">{}</td>\
                 <td class=\"opt\">{} (expired {}, dropped {}, coalesced {}, dead {}, purged {}, exported {})</td>\
                 <td>{}</td><td>{}</td></tr>",
                if v.is_incomplete() { "incomplete" } else { "complete" },
                escape(&v.source),
                escape(&v.destination),
                escape(v.reported_at.as_deref().unwrap_or("never")) + silent,
                v.stored_through,
                v.high_water,
                v.pending_on_device,
                a.total(),
                a.expired,
                a.dropped,
                a.coalesced,
                a.dead,
                a.purged,
                a.exported,
                ranges(&v.missing),
                ranges(&v.reused),
            );
        }
        html.push_str("</tbody></table></div></body></html>\n");
        html
    }
}

/// The most ranges a cell lists before it says how many more there are.
const RANGES_SHOWN: usize = 20;

/// Ranges as `3–5, 9` (the first [`RANGES_SHOWN`], then how many more), or a dash.
fn ranges(ranges: &Ranges) -> String {
    if ranges.is_empty() {
        return "–".into();
    }
    let more = ranges.len().saturating_sub(RANGES_SHOWN);
    let mut shown = ranges
        .iter()
        .take(RANGES_SHOWN)
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}–{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        shown.push_str(&format!(" and {more} more ranges"));
    }
    shown
}

/// Text as HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::view;

    #[test]
    fn a_view_never_read_is_unknown_not_zero_and_totals_saturate() {
        let unread = FleetSnapshot::default().metrics();
        assert!(
            unread.contains("outbox_ingest_fleet_streams NaN"),
            "{unread}"
        );
        assert!(unread.contains("outbox_ingest_fleet_missing_events NaN"));
        assert!(unread.contains("outbox_ingest_fleet_read_age_seconds NaN"));
        let huge = |source: &str| {
            view(
                source.into(),
                "fleet".into(),
                &vec![[i64::MAX - 1, i64::MAX - 1]],
                vec![],
                None,
            )
        };
        let read = FleetSnapshot {
            views: vec![huge("/a"), huge("/b")],
            read_at: Some("now".into()),
            read_instant: Some(std::time::Instant::now()),
        }
        .metrics();
        assert!(
            read.contains(&format!("outbox_ingest_fleet_missing_events {}", i64::MAX)),
            "{read}"
        );
        assert!(read.contains("outbox_ingest_fleet_streams 2"));
    }

    #[test]
    fn a_device_cannot_put_markup_in_the_page() {
        let v = view(
            "<script>alert(1)</script>".into(),
            "fleet\"><img src=x>".into(),
            &vec![[1, 2]],
            vec![],
            None,
        );
        let page = FleetSnapshot {
            views: vec![v],
            read_at: None,
            read_instant: None,
        }
        .page();
        assert!(!page.contains("<script>alert"));
        assert!(!page.contains("<img"));
        assert!(page.contains("&lt;script&gt;"));
    }
}
