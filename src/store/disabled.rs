//! Which destinations are disabled, persisted so a 410 Gone (or an operator) survives a restart.

use std::collections::HashMap;

use rusqlite::{params, Connection};

use crate::error::Result;

/// A destination that is not delivered to until it is enabled again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DisabledDestination {
    /// The destination's name.
    pub name: String,
    /// When it was disabled (unix ms).
    pub disabled_at: i64,
    /// Why: the 410 answer, or the operator's note.
    pub reason: String,
}

/// Every disabled destination.
pub(crate) fn list(conn: &Connection) -> Result<Vec<DisabledDestination>> {
    let mut stmt = conn.prepare_cached(
        "SELECT name, disabled_at, COALESCE(disabled_reason, '') FROM outbox_destinations
          WHERE disabled_at IS NOT NULL ORDER BY name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(DisabledDestination {
            name: r.get(0)?,
            disabled_at: r.get(1)?,
            reason: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Disabled destinations by name, with their reasons.
pub(crate) fn reasons(conn: &Connection) -> Result<HashMap<String, String>> {
    Ok(list(conn)?
        .into_iter()
        .map(|d| (d.name, d.reason))
        .collect())
}

/// Disables `name` (again, if it already is: the reason is updated).
pub(crate) fn disable(conn: &Connection, name: &str, reason: &str, now: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO outbox_destinations (name, disabled_at, disabled_reason) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET disabled_at = ?2, disabled_reason = ?3",
    )?
    .execute(params![name, now, reason])?;
    Ok(())
}

/// Enables `name`; returns whether it was disabled.
pub(crate) fn enable(conn: &Connection, name: &str) -> Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE outbox_destinations SET disabled_at = NULL, disabled_reason = NULL
              WHERE name = ?1 AND disabled_at IS NOT NULL",
        )?
        .execute([name])?;
    Ok(changed == 1)
}
