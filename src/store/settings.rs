//! Settings kept in the file: routes, storage limits and policies, the default source,
//! priorities and lifetimes, and the payload limit, in the table `outbox_settings`.
//!
//! Every writer follows them: [`Outbox::enqueue`](crate::Outbox::enqueue) (which reads them
//! again within a quarter second of a change), the CLI's `enqueue`, and the SQL contract
//! (`INSERT INTO outbox_enqueue …`, whose trigger reads the table on every insert). One
//! row per setting; the keys:
//!
//! | key | value |
//! |---|---|
//! | `default_source` | the CloudEvents `source` of events that set none |
//! | `payload_limit` | the largest event data, in bytes (default 262144) |
//! | `max_pending` | pending deliveries at most |
//! | `max_pending_bytes` | bytes of pending event data at most |
//! | `route:<pattern>` | the destinations of matching types, a JSON array of names |
//! | `policy:<pattern>` | `drop_oldest` or `reject` when the outbox is full |
//! | `priority:<pattern>` | 0 (least urgent) to 9 (most urgent) |
//! | `expiry:<pattern>` | the lifetime of matching events, in milliseconds |
//!
//! A pattern is an exact type (`order.created`), a prefix ending in `*` (`order.*`) or `*`.
//! An event goes to the destinations of every matching route (to `default` when there is
//! no route at all). For policies, priorities and lifetimes the most specific matching
//! pattern wins: the exact type, then the longest prefix, then `*`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

use crate::error::{Error, Result};
use crate::event::Event;
use crate::store::limits::{StorageLimits, StoragePolicy};
use crate::store::route::{self, Route};
use crate::store::type_pattern::most_specific;

/// The CloudEvents `source` of events that set none, unless the file says otherwise.
pub(crate) const DEFAULT_SOURCE: &str = "/sqlite-outbox";

/// The largest event data accepted, unless the file says otherwise: 256 KiB.
pub(crate) const DEFAULT_PAYLOAD_LIMIT: usize = 256 * 1024;

/// The largest payload limit a setting may ask for: SQLite's default maximum string length
/// is 1 GB, and an outbox is no place for such events anyway.
const MAX_PAYLOAD_LIMIT: usize = 64 * 1024 * 1024;

/// The setting keys that name one value each.
const SINGLE_KEYS: [&str; 4] = [
    "default_source",
    "payload_limit",
    "max_pending",
    "max_pending_bytes",
];

/// The setting key prefixes that take a type pattern.
const PATTERN_PREFIXES: [&str; 4] = ["route:", "policy:", "priority:", "expiry:"];

/// The policy every writer follows, as read from `outbox_settings`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub default_source: String,
    pub payload_limit: usize,
    pub routes: Vec<Route>,
    pub priorities: Vec<(String, u8)>,
    pub expiries: Vec<(String, Duration)>,
    pub limits: StorageLimits,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_source: DEFAULT_SOURCE.to_string(),
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            routes: Vec::new(),
            priorities: Vec::new(),
            expiries: Vec::new(),
            limits: StorageLimits::default(),
        }
    }
}

impl Settings {
    /// The settings the rows `rows` (key → value) make. A row that does not parse (written by
    /// hand, past `outbox config set`) is left out with a warning, so one bad row never stops
    /// every writer.
    pub fn from_rows(rows: &BTreeMap<String, String>) -> Settings {
        let mut settings = Settings::default();
        for (key, value) in rows {
            if let Err(why) = settings.apply(key, value) {
                log::warn!("outbox setting {key} = {value:?} is ignored: {why}");
            }
        }
        settings
    }

    /// Takes one stored row into these settings.
    fn apply(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        let value = canonical_value(key, value)?;
        match key {
            "default_source" => self.default_source = value,
            "payload_limit" => self.payload_limit = parse_count(&value)? as usize,
            "max_pending" => self.limits.max_pending = Some(parse_count(&value)? as i64),
            "max_pending_bytes" => {
                self.limits.max_pending_bytes = Some(parse_count(&value)? as i64)
            }
            _ => {
                let (prefix, pattern) = split_pattern_key(key)?;
                let pattern = pattern.to_string();
                match prefix {
                    "route:" => {
                        let names: Vec<String> =
                            serde_json::from_str(&value).map_err(|e| e.to_string())?;
                        for name in names {
                            self.routes.push(Route::new(pattern.clone(), name));
                        }
                    }
                    "policy:" => {
                        let policy = if value == "drop_oldest" {
                            StoragePolicy::DropOldest
                        } else {
                            StoragePolicy::Reject
                        };
                        self.limits.policies.push((pattern, policy));
                    }
                    "priority:" => self.priorities.push((pattern, value.parse().unwrap_or(5))),
                    _ => self
                        .expiries
                        .push((pattern, Duration::from_millis(value.parse().unwrap_or(1)))),
                }
            }
        }
        Ok(())
    }

    /// The priority of events of `event_type` that set none.
    pub fn priority_for(&self, event_type: &str) -> u8 {
        most_specific(&self.priorities, event_type).map_or(Event::DEFAULT_PRIORITY, |p| *p)
    }

    /// The lifetime of events of `event_type` that set none.
    pub fn lifetime_for(&self, event_type: &str) -> Option<Duration> {
        most_specific(&self.expiries, event_type).copied()
    }
}

/// Splits `route:order.*` into `("route:", "order.*")`, checking the pattern.
fn split_pattern_key(key: &str) -> std::result::Result<(&'static str, &str), String> {
    let Some(prefix) = PATTERN_PREFIXES.iter().find(|p| key.starts_with(**p)) else {
        return Err(format!(
            "unknown setting; the settings are {}, and {} followed by a type pattern",
            SINGLE_KEYS.join(", "),
            PATTERN_PREFIXES.join(", ")
        ));
    };
    let pattern = &key[prefix.len()..];
    check_pattern(pattern)?;
    Ok((prefix, pattern))
}

/// A type pattern: an exact type, a prefix ending in `*`, or `*`.
fn check_pattern(pattern: &str) -> std::result::Result<(), String> {
    if pattern.is_empty() || pattern.len() > Event::MAX_TYPE_LEN {
        return Err(format!(
            "the type pattern must be 1 to {} bytes (an exact type, a prefix ending in '*', \
             or '*')",
            Event::MAX_TYPE_LEN
        ));
    }
    if pattern[..pattern.len() - 1].contains('*') {
        return Err(format!(
            "the type pattern {pattern:?} may hold '*' only at its end"
        ));
    }
    Ok(())
}

fn parse_count(value: &str) -> std::result::Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(n) if n >= 1 && n <= i64::MAX as u64 => Ok(n),
        _ => Err(format!("{value:?} is not a whole number of at least 1")),
    }
}

/// Checks `value` for `key` and returns it as stored: routes as a JSON array of names (a
/// comma-separated list is accepted), lifetimes in milliseconds (`10m` is accepted), policies
/// in lower case.
pub(crate) fn canonical_value(key: &str, value: &str) -> std::result::Result<String, String> {
    match key {
        "default_source" => {
            if value.is_empty() || value.len() > Event::MAX_SOURCE_LEN {
                return Err(format!(
                    "the default source must be 1 to {} bytes",
                    Event::MAX_SOURCE_LEN
                ));
            }
            Ok(value.to_string())
        }
        "payload_limit" => {
            let n = parse_count(value)?;
            if n as usize > MAX_PAYLOAD_LIMIT {
                return Err(format!(
                    "a payload limit of {n} bytes is over the most allowed, {MAX_PAYLOAD_LIMIT}"
                ));
            }
            Ok(n.to_string())
        }
        "max_pending" | "max_pending_bytes" => Ok(parse_count(value)?.to_string()),
        _ => {
            let (prefix, _) = split_pattern_key(key)?;
            match prefix {
                "route:" => {
                    let names: Vec<String> = if value.trim_start().starts_with('[') {
                        serde_json::from_str(value)
                            .map_err(|e| format!("not a JSON array of destination names: {e:#}"))?
                    } else {
                        value.split(',').map(|s| s.trim().to_string()).collect()
                    };
                    if names.is_empty() {
                        return Err("a route needs at least one destination".into());
                    }
                    for name in &names {
                        route::validate_name(name).map_err(|e| e.to_string())?;
                    }
                    let mut unique: Vec<String> = Vec::new();
                    for name in names {
                        if !unique.contains(&name) {
                            unique.push(name);
                        }
                    }
                    serde_json::to_string(&unique).map_err(|e| e.to_string())
                }
                "policy:" => match value.trim().to_ascii_lowercase().replace('-', "_").as_str() {
                    "drop_oldest" => Ok("drop_oldest".into()),
                    "reject" => Ok("reject".into()),
                    _ => Err(format!("{value:?} is not a policy: drop_oldest or reject")),
                },
                "priority:" => match value.trim().parse::<u8>() {
                    Ok(p) if p <= Event::MAX_PRIORITY => Ok(p.to_string()),
                    _ => Err(format!(
                        "{value:?} is not a priority: 0 (least urgent) to {} (most urgent)",
                        Event::MAX_PRIORITY
                    )),
                },
                _ => {
                    let millis = match value.trim().parse::<u64>() {
                        Ok(ms) => ms,
                        Err(_) => humantime::parse_duration(value.trim())
                            .map_err(|e| {
                                format!(
                                    "{value:?} is not a lifetime like 600000 (ms) or 10m: {e:#}"
                                )
                            })?
                            .as_millis()
                            .try_into()
                            .unwrap_or(u64::MAX),
                    };
                    if millis == 0 || millis > i64::MAX as u64 {
                        return Err(format!(
                            "a lifetime of {value:?} is out of range: at least 1 ms, at most {} ms",
                            i64::MAX
                        ));
                    }
                    Ok(millis.to_string())
                }
            }
        }
    }
}

/// Every stored row, key → value.
pub(crate) fn load_rows(conn: &Connection) -> Result<BTreeMap<String, String>> {
    let mut stmt = conn.prepare_cached("SELECT key, value FROM outbox_settings")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// Checks and stores one setting; returns the value as stored.
pub(crate) fn set(conn: &Connection, key: &str, value: &str) -> Result<String> {
    let value = canonical_value(key, value).map_err(|reason| Error::InvalidSetting {
        key: key.to_string(),
        reason,
    })?;
    conn.prepare_cached(
        "INSERT INTO outbox_settings (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(value)
}

/// Removes one setting; returns whether it was there.
pub(crate) fn unset(conn: &Connection, key: &str) -> Result<bool> {
    if !SINGLE_KEYS.contains(&key) {
        split_pattern_key(key).map_err(|reason| Error::InvalidSetting {
            key: key.to_string(),
            reason,
        })?;
    }
    Ok(conn
        .prepare_cached("DELETE FROM outbox_settings WHERE key = ?1")?
        .execute([key])?
        == 1)
}

/// What an app's builder says, as rows, and which keys it speaks for: a builder that sets
/// any route speaks for every `route:` key (a route dropped from the code is dropped from
/// the file), and likewise for each other kind.
#[derive(Debug, Default)]
pub(crate) struct Explicit {
    pub rows: BTreeMap<String, String>,
    /// Single keys the builder set, and pattern prefixes it set any of.
    pub owned: Vec<&'static str>,
}

impl Explicit {
    /// Sets a single key.
    pub fn single(&mut self, key: &'static str, value: String) {
        self.rows.insert(key.to_string(), value);
        self.owned.push(key);
    }

    /// Sets `prefix` + `pattern`.
    pub fn pattern(&mut self, prefix: &'static str, pattern: &str, value: String) {
        self.rows.insert(format!("{prefix}{pattern}"), value);
        if !self.owned.contains(&prefix) {
            self.owned.push(prefix);
        }
    }

    fn owns(&self, key: &str) -> bool {
        self.owned.iter().any(|o| {
            if o.ends_with(':') {
                key.starts_with(o)
            } else {
                key == *o
            }
        })
    }
}

/// Writes what the app's builder set over the stored rows, in one transaction, warning of
/// every stored value it changes or removes; returns the rows now stored.
pub(crate) fn overlay(
    conn: &mut Connection,
    explicit: &Explicit,
) -> Result<BTreeMap<String, String>> {
    for (key, value) in &explicit.rows {
        canonical_value(key, value).map_err(|reason| Error::InvalidSetting {
            key: key.clone(),
            reason,
        })?;
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let stored = load_rows(&tx)?;
    let mut rows = stored.clone();
    for (key, old) in &stored {
        if explicit.owns(key) && !explicit.rows.contains_key(key) {
            log::warn!(
                "outbox setting {key} = {old} was in the file; the app's settings remove it"
            );
            rows.remove(key);
            unset(&tx, key)?;
        }
    }
    for (key, value) in &explicit.rows {
        let value = canonical_value(key, value).unwrap_or_else(|_| value.clone());
        match stored.get(key) {
            Some(old) if *old == value => continue,
            Some(old) => log::warn!(
                "outbox setting {key} was {old} in the file; the app's settings make it {value}"
            ),
            None => log::info!("outbox setting {key} = {value} written by the app"),
        }
        set(&tx, key, &value)?;
        rows.insert(key.clone(), value);
    }
    tx.commit()?;
    Ok(rows)
}

/// How soon a change to the file's settings (by `outbox config set`, another process) is
/// followed by this process's enqueues.
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// The settings an open outbox follows, read again from the file at most every
/// [`REFRESH_INTERVAL`] on a connection of their own (outside the caller's transaction: a
/// read first in a deferred transaction could make its later writes fail with
/// `SQLITE_BUSY_SNAPSHOT`).
pub(crate) struct LiveSettings {
    current: RwLock<Arc<Settings>>,
    refresh: Mutex<Refresh>,
}

struct Refresh {
    /// Opened on the first refresh.
    conn: Option<Connection>,
    path: std::path::PathBuf,
    connection: crate::store::database::ConnectionSettings,
    rows: BTreeMap<String, String>,
    checked: Instant,
    /// False for a read-only outbox: the settings read at open stay (a refresh would open
    /// a read-write connection).
    follows: bool,
}

impl LiveSettings {
    /// Settings read from `rows` at open, refreshed from the file at `path`.
    pub fn new(
        rows: BTreeMap<String, String>,
        path: &std::path::Path,
        connection: &crate::store::database::ConnectionSettings,
    ) -> LiveSettings {
        LiveSettings {
            current: RwLock::new(Arc::new(Settings::from_rows(&rows))),
            refresh: Mutex::new(Refresh {
                conn: None,
                path: path.to_path_buf(),
                connection: connection.clone(),
                rows,
                checked: Instant::now(),
                follows: true,
            }),
        }
    }

    /// Settings read from `rows` at open and never read again (a read-only outbox).
    pub fn fixed(
        rows: BTreeMap<String, String>,
        path: &std::path::Path,
        connection: &crate::store::database::ConnectionSettings,
    ) -> LiveSettings {
        let live = LiveSettings::new(rows, path, connection);
        live.refresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .follows = false;
        live
    }

    /// The settings last read, without looking at the file (for `Debug`).
    pub fn peek(&self) -> Arc<Settings> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes the next [`get`](Self::get) read the file again.
    pub fn invalidate(&self) {
        let mut refresh = self.refresh.lock().unwrap_or_else(|p| p.into_inner());
        refresh.checked = Instant::now() - REFRESH_INTERVAL;
    }

    /// The settings in force: read again first if the last look is older than the refresh
    /// interval (and no other thread is reading them right now).
    pub fn get(&self) -> Arc<Settings> {
        if let Ok(mut refresh) = self.refresh.try_lock() {
            if refresh.follows && refresh.checked.elapsed() >= REFRESH_INTERVAL {
                refresh.checked = Instant::now();
                if let Some(settings) = refresh.reload() {
                    *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(settings);
                }
            }
        }
        self.peek()
    }
}

impl Refresh {
    /// New settings if the file's rows changed since the last look.
    fn reload(&mut self) -> Option<Settings> {
        if self.conn.is_none() {
            match crate::store::database::open_unpooled(&self.path, &self.connection) {
                Ok(conn) => self.conn = Some(conn),
                Err(e) => {
                    log::warn!("outbox settings not read again: {e:#}");
                    return None;
                }
            }
        }
        let rows = match load_rows(self.conn.as_ref()?) {
            Ok(rows) => rows,
            Err(e) => {
                log::warn!("outbox settings not read again: {e:#}");
                return None;
            }
        };
        if rows == self.rows {
            return None;
        }
        log::info!("outbox settings changed in the file; following them");
        self.rows = rows;
        Some(Settings::from_rows(&self.rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_and_stored_in_one_form() {
        let ok = |k: &str, v: &str| canonical_value(k, v).unwrap();
        let bad = |k: &str, v: &str| canonical_value(k, v).unwrap_err();
        assert_eq!(
            ok("route:order.*", "billing, audit,billing"),
            r#"["billing","audit"]"#
        );
        assert_eq!(ok("route:*", r#"["a"]"#), r#"["a"]"#);
        assert_eq!(ok("expiry:telemetry.*", "10m"), "600000");
        assert_eq!(ok("expiry:telemetry.*", "1500"), "1500");
        assert_eq!(ok("policy:telemetry.*", "Drop-Oldest"), "drop_oldest");
        assert!(bad("route:order.*", "bad name!").contains("destination name"));
        assert!(bad("priority:x", "10").contains("0 (least urgent) to 9"));
        assert!(bad("expiry:x", "0").contains("at least 1 ms"));
        assert!(bad("max_pending", "-1").contains("at least 1"));
        assert!(bad("payload_limit", "999999999999").contains("most allowed"));
        assert!(bad("route:a*b", "x").contains("only at its end"));
        assert!(bad("colour", "blue").contains("unknown setting"));
    }
}
