//! The ingest's key registry: which keys may sign for which sources.
//!
//! Each entry maps a key id to a source pattern and a key: an exact source (`/devices/42`),
//! a prefix ending in `*` (`/site-7/*`), or `*` for any source; the key is a device's
//! Ed25519 public key (`whpk_…`, Standard Webhooks v1a) or a shared secret (`whsec_…`, v1).
//! Several entries may name one source (rotation: the old and the new key, both accepted
//! until the old one is removed or revoked).
//!
//! The entries come from three places, merged: the `--secret` secrets (pattern `*`: the
//! single-tenant mode, any accepted secret signs for any source), the `--keys` file (re-read
//! on SIGHUP) and the table `outbox_device_keys` (re-read when it changes). A request names
//! its source in `outbox-source`; only the keys for that source are tried, and a source no
//! key is for is refused before the body is read.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use sqlite_outbox::receive::{KeyRegistry, VerifyingKey};

/// Where an entry came from; a reload replaces the entries of its origin only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Origin {
    Secrets,
    File,
    Table,
}

/// One registry entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    key_id: String,
    pattern: String,
    key: VerifyingKey,
}

impl Entry {
    /// An entry from its three texts; the error names what is wrong (never the key).
    pub fn parse(key_id: &str, pattern: &str, key: &str) -> Result<Entry, String> {
        if key_id.is_empty() {
            return Err("the key id is empty".into());
        }
        KeyRegistry::check_pattern(pattern).map_err(|e| e.to_string())?;
        Ok(Entry {
            key_id: key_id.to_string(),
            pattern: pattern.to_string(),
            key: VerifyingKey::parse(key).map_err(|e| format!("key {key_id}: {e:#}"))?,
        })
    }

    /// A `--secret` secret: signs for any source.
    pub fn any_source(key_id: String, key: VerifyingKey) -> Entry {
        Entry {
            key_id,
            pattern: "*".into(),
            key,
        }
    }
}

/// Reads a keys file: one `KEY_ID SOURCE_PATTERN KEY` a line, `#` starts a comment, blank
/// lines are skipped. Any malformed line refuses the whole file (naming the line), so a
/// typo never silently drops a device's key.
pub(crate) fn read_file(path: &Path) -> Result<Vec<Entry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e:#}", path.display()))?;
    let mut entries = Vec::new();
    let mut key_ids = std::collections::HashSet::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [key_id, pattern, key] = fields[..] else {
            return Err(format!(
                "{} line {}: {} fields; KEY_ID SOURCE_PATTERN KEY expected",
                path.display(),
                number + 1,
                fields.len()
            ));
        };
        let entry = Entry::parse(key_id, pattern, key)
            .map_err(|e| format!("{} line {}: {e:#}", path.display(), number + 1))?;
        if !key_ids.insert(entry.key_id.clone()) {
            return Err(format!(
                "{} line {}: key id {key_id} is given twice",
                path.display(),
                number + 1
            ));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The entries by where they came from, and the library's registry built from them.
#[derive(Default)]
pub(crate) struct Registry {
    origins: RwLock<HashMap<Origin, Vec<Entry>>>,
    current: RwLock<Arc<KeyRegistry>>,
}

impl Registry {
    /// Replaces the entries of `origin`; returns how many there are in all.
    pub fn replace(&self, origin: Origin, entries: Vec<Entry>) -> usize {
        let mut origins = self
            .origins
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        origins.insert(origin, entries);
        let mut registry = KeyRegistry::new();
        for entry in origins.values().flatten() {
            // Every pattern was checked when its entry was parsed.
            let _ = registry.add(&entry.pattern, entry.key.clone());
        }
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(registry);
        origins.values().map(Vec::len).sum()
    }

    /// The registry as it is now: a request is checked against one snapshot, before and
    /// after its body, whatever reloads happen meanwhile.
    pub fn current(&self) -> Arc<KeyRegistry> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "whpk_tgIVHJiSPYVvk7QM55HUNbg0Mr1a0GNLdAqehM4kqtI=";
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn keys_are_chosen_by_exact_source_prefix_or_any() {
        let registry = Registry::default();
        registry.replace(
            Origin::File,
            vec![
                Entry::parse("d42", "/devices/42", A).unwrap(),
                Entry::parse("site", "/site-7/*", A).unwrap(),
            ],
        );
        assert!(registry
            .current()
            .verifier_for(Some("/devices/42"))
            .is_some());
        assert!(registry
            .current()
            .verifier_for(Some("/devices/43"))
            .is_none());
        assert!(registry
            .current()
            .verifier_for(Some("/site-7/pump-1"))
            .is_some());
        assert!(registry.current().verifier_for(None).is_none());
        registry.replace(
            Origin::Secrets,
            vec![Entry::any_source(
                "secret-1".into(),
                VerifyingKey::parse(SECRET).unwrap(),
            )],
        );
        assert!(registry
            .current()
            .verifier_for(Some("/devices/43"))
            .is_some());
        // A reload of the file leaves the secrets.
        assert_eq!(registry.replace(Origin::File, Vec::new()), 1);
    }

    #[test]
    fn a_malformed_line_refuses_the_file_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            format!("# fleet keys\n\nd42 /devices/42 {A}  # pump\nd43 /devices/43\n"),
        )
        .unwrap();
        let e = read_file(&path).unwrap_err();
        assert!(e.contains("line 4") && e.contains("2 fields"), "{e:#}");
        std::fs::write(&path, format!("d42 /dev*ces/42 {A}\n")).unwrap();
        assert!(read_file(&path).unwrap_err().contains("line 1"));
        std::fs::write(&path, "d42 /devices/42 whpk_AAAA\n").unwrap();
        assert!(read_file(&path).unwrap_err().contains("whpk_ public key"));
        std::fs::write(&path, format!("d42 /devices/42 {A} # pump\n")).unwrap();
        assert_eq!(read_file(&path).unwrap().len(), 1);
    }
}
