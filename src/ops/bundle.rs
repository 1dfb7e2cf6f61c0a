//! The offline bundle, for a site with no uplink at all: pending events written to one signed
//! file (carried out on a USB stick), and delivered from that file by `import` wherever there
//! is a network.
//!
//! The file is JSON Lines:
//!
//! ```text
//! {"specversion":"1.0","id":"01a2…","source":"/site-7","type":"reading.taken",…}   one line per event,
//! …                                                                                  in commit order
//! {"bundle":"sqlite-outbox/1","count":2,"destination":"default","first_sequence":…,"last_sequence":…,"sha256":"…","created":"…"}
//! {"webhook-id":"bundle_…","webhook-timestamp":"1764…","webhook-signature":"v1,…"}
//! ```
//!
//! Each event line is the event's structured CloudEvent, exactly the body a relay would POST.
//! The manifest counts them and holds the SHA-256 of the event lines (each with its newline);
//! the last line signs the manifest line's bytes the Standard Webhooks way. So `import` can
//! refuse a tampered, truncated or foreign file before it sends anything: it checks the
//! signature, then the count and the hash.
//!
//! `export` leases the events page by page (relays leave them alone), each page in a short
//! transaction of its own and written out before the next is read, so neither memory nor the
//! app's commits pay for the bundle's size. It writes the file next to its final name,
//! syncs it, renames it into place, syncs the folder, and only then marks the events
//! **exported**, again page by page. A crash before that leaves them pending (the lease
//! runs out): exported again later, they reach the receiver twice, and it drops the repeat
//! by id.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ring::digest::{Context as Sha256, SHA256};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::queue;
use crate::wire::signature::{Secret, Verifier, VerifyingKey};
use crate::wire::signing_key::SigningKey;
use crate::wire::source_header::{encode_source_header, SOURCE_HEADER};
use crate::{wire, Outbox};

/// What a bundle is signed, checked and imported with: a shared `whsec_` secret, or a
/// device's own `whsk_` key (Standard Webhooks `v1a`), so that an ingest with per-device
/// keys takes the bundle's events as the device's own. `&Secret` and `&SigningKey` turn
/// into one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum BundleKey {
    /// A shared secret (`v1`).
    Secret(Secret),
    /// A device's Ed25519 key (`v1a`); the bundle is checked with its public key.
    Signing(SigningKey),
}

impl BundleKey {
    fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        match self {
            BundleKey::Secret(secret) => secret.sign(id, timestamp, body),
            BundleKey::Signing(key) => key.sign(id, timestamp, body),
        }
    }

    fn verifier(&self) -> Verifier {
        match self {
            BundleKey::Secret(secret) => Verifier::new([secret.clone()]),
            BundleKey::Signing(key) => {
                Verifier::with_keys([VerifyingKey::Public(key.public_key())])
            }
        }
    }
}

impl From<&Secret> for BundleKey {
    fn from(secret: &Secret) -> BundleKey {
        BundleKey::Secret(secret.clone())
    }
}

impl From<&SigningKey> for BundleKey {
    fn from(key: &SigningKey) -> BundleKey {
        BundleKey::Signing(key.clone())
    }
}

/// The format name in the manifest.
const FORMAT: &str = "sqlite-outbox/1";
/// How long an export's lease lasts: writing and syncing a file takes far less.
const EXPORT_LEASE: Duration = Duration::from_secs(300);
/// Events one page of an export leases and writes, in one short transaction.
const EXPORT_PAGE_ROWS: usize = 1_000;
/// Bytes of event data one page of an export holds at most (past its first event).
const EXPORT_PAGE_BYTES: i64 = 4 << 20;

/// The manifest line.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    bundle: String,
    count: usize,
    destination: String,
    first_sequence: Option<String>,
    last_sequence: Option<String>,
    sha256: String,
    created: String,
}

/// The signature line.
#[derive(Debug, Serialize, Deserialize)]
struct Signature {
    #[serde(rename = "webhook-id")]
    id: String,
    #[serde(rename = "webhook-timestamp")]
    timestamp: String,
    #[serde(rename = "webhook-signature")]
    signature: String,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportReport {
    /// The file.
    pub path: PathBuf,
    /// Events written and marked exported.
    pub count: usize,
    /// SHA-256 of the event lines, hex.
    pub sha256: String,
}

impl Outbox {
    /// Writes up to `limit` of `destination`'s oldest pending events (commit order) to a
    /// signed bundle at `path`, syncs it, and only then marks them exported. Nothing is
    /// marked when there is nothing to export; the file is still written (an empty bundle).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `path` exists; [`Error::Io`] when the file cannot be
    /// written or synced (a full disk): the events are handed back, pending and unchanged;
    /// SQLite errors.
    pub fn export(
        &self,
        path: &Path,
        key: impl Into<BundleKey>,
        destination: &str,
        limit: usize,
    ) -> Result<ExportReport> {
        let key = key.into();
        if path.exists() {
            return Err(Error::InvalidConfig(format!(
                "{} exists: a bundle is never overwritten",
                path.display()
            )));
        }
        let owner = format!("export:{}", uuid::Uuid::now_v7());
        let partial = path.with_extension("partial");
        let mut ids = Vec::new();
        let written = self.write_bundle(path, &partial, &key, destination, limit, &owner, &mut ids);
        let sha256 = match written {
            Ok(sha256) => sha256,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                // Nothing was exported: hand them back, as they were.
                for page in ids.chunks(queue::DELETE_PAGE_ROWS) {
                    let _ = self.transaction(|tx| queue::release_export(tx, &owner, page));
                }
                return Err(e);
            }
        };
        // Marked page by page, each a short transaction: the app's commits never wait for
        // a whole bundle. A crash between pages leaves the rest leased to the export until
        // the lease runs out; they are then delivered (or exported) again, duplicates the
        // receiver drops by id.
        let mut marked = 0;
        for page in ids.chunks(queue::DELETE_PAGE_ROWS) {
            marked +=
                self.transaction(|tx| queue::mark_exported(tx, &owner, page, self.now_ms()))?;
        }
        log::info!("exported {marked} events to {}", path.display());
        Ok(ExportReport {
            path: path.to_path_buf(),
            count: marked,
            sha256,
        })
    }

    /// Leases up to `limit` events page by page, writing each page's lines to `partial`
    /// as it goes (so memory holds one page, not the bundle), then the manifest and the
    /// signature; syncs the file, renames it to `path` and syncs the folder. The ids of
    /// the events leased go to `ids` as they are leased, for marking or handing back.
    /// Returns the hash of the event lines.
    #[allow(clippy::too_many_arguments)]
    fn write_bundle(
        &self,
        path: &Path,
        partial: &Path,
        key: &BundleKey,
        destination: &str,
        limit: usize,
        owner: &str,
        ids: &mut Vec<i64>,
    ) -> Result<String> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(partial)?;
        let mut out = std::io::BufWriter::new(file);
        let mut hasher = Sha256::new(&SHA256);
        let default_source = self.default_source();
        let (mut first, mut last) = (None, None);
        // Every event is numbered before the pages, in transactions no larger than a page:
        // a page's transaction numbers only what was committed since.
        queue::numbering::catch_up(&mut *self.connection()?, EXPORT_PAGE_ROWS as i64 / 2, 0)?;
        loop {
            let left = limit.saturating_sub(ids.len());
            if left == 0 {
                break;
            }
            let page = queue::ExportPage {
                destination,
                owner,
                now: self.now_ms(),
                lease_ms: EXPORT_LEASE.as_millis() as i64,
                limit: left.min(EXPORT_PAGE_ROWS) as i64,
                max_bytes: EXPORT_PAGE_BYTES,
                after: ids.last().copied().unwrap_or(0),
                default_source: &default_source,
            };
            let events = self.transaction(|tx| queue::lease_for_export(tx, &page))?;
            if events.is_empty() {
                break;
            }
            ids.extend(events.iter().map(|e| e.id));
            for event in &events {
                let mut line = wire::structured_body(event).map_err(Error::InvalidData)?;
                line.push(b'\n');
                hasher.update(&line);
                out.write_all(&line)?;
                first.get_or_insert(event.id);
                last = Some(event.id);
            }
        }
        let sha256 = hex(hasher.finish().as_ref());
        let sequence = |id: i64| format!("{id:020}");
        let manifest = serde_json::to_vec(&Manifest {
            bundle: FORMAT.into(),
            count: ids.len(),
            destination: destination.into(),
            first_sequence: first.map(sequence),
            last_sequence: last.map(sequence),
            sha256: sha256.clone(),
            created: wire::rfc3339_millis(unix_ms()),
        })
        .map_err(Error::InvalidData)?;
        let timestamp = unix_ms() / 1000;
        let id = format!("bundle_{}", &sha256[..32]);
        let signature = serde_json::to_vec(&Signature {
            signature: key.sign(&id, timestamp, &manifest),
            id,
            timestamp: timestamp.to_string(),
        })
        .map_err(Error::InvalidData)?;
        out.write_all(&manifest)?;
        out.write_all(b"\n")?;
        out.write_all(&signature)?;
        out.write_all(b"\n")?;
        let file = out.into_inner().map_err(|e| Error::Io(e.into_error()))?;
        file.sync_all()?;
        std::fs::rename(partial, path)?;
        // The rename made durable where a folder can be synced (unix); Windows refuses to
        // open one, and NTFS's journal keeps the rename.
        if let Some(folder) = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty() && crate::platform::can_sync_folders_here())
        {
            std::fs::File::open(folder)?.sync_all()?;
        }
        Ok(sha256)
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A verified bundle: its event lines, in order.
#[derive(Debug)]
#[non_exhaustive]
pub struct Bundle {
    /// The destination the events were exported for.
    pub destination: String,
    /// Each event's structured CloudEvent, as written.
    pub events: Vec<Vec<u8>>,
}

/// Reads and verifies the bundle at `path` with `key` (the secret, or the device key, it
/// was signed with): the signature of the manifest,
/// then the count and hash of the event lines. Nothing is trusted before all three hold.
///
/// # Errors
///
/// [`Error::InvalidBundle`] saying what is wrong (not a bundle, cut short, a bad signature,
/// a count or hash that does not match); [`Error::Io`] when it cannot be read.
pub fn read_bundle(path: &Path, key: impl Into<BundleKey>) -> Result<Bundle> {
    let key = key.into();
    let bad = |reason: String| Error::InvalidBundle { reason };
    let text = std::fs::read(path)?;
    let Some(body) = text.strip_suffix(b"\n") else {
        return Err(bad("it does not end with a newline: cut short?".into()));
    };
    let mut lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    let (Some(signature_line), Some(manifest_line)) = (lines.pop(), lines.pop()) else {
        return Err(bad(
            "it has no manifest and signature lines: cut short?".into()
        ));
    };
    let signature: Signature = serde_json::from_slice(signature_line).map_err(|e| {
        bad(format!(
            "the last line is not a signature: {e:#} (cut short?)"
        ))
    })?;
    let headers = [
        ("webhook-id", signature.id.as_str()),
        ("webhook-timestamp", signature.timestamp.as_str()),
        ("webhook-signature", signature.signature.as_str()),
    ];
    // A bundle may travel for weeks: its age is no reason to refuse it.
    key.verifier()
        .verify_ignoring_timestamp(headers, manifest_line)
        .map_err(|e| bad(format!("the manifest's signature does not verify: {e:#}")))?;
    let manifest: Manifest = serde_json::from_slice(manifest_line)
        .map_err(|e| bad(format!("the manifest is not valid: {e:#}")))?;
    if manifest.bundle != FORMAT {
        return Err(bad(format!("unknown bundle format {:?}", manifest.bundle)));
    }
    if lines.len() != manifest.count {
        return Err(bad(format!(
            "it holds {} event lines; the manifest says {}",
            lines.len(),
            manifest.count
        )));
    }
    let mut hash = Sha256::new(&SHA256);
    for line in &lines {
        hash.update(line);
        hash.update(b"\n");
    }
    let sha256 = hex(hash.finish().as_ref());
    if sha256 != manifest.sha256 {
        return Err(bad(
            "the event lines do not match the manifest's SHA-256: the file was changed".into(),
        ));
    }
    Ok(Bundle {
        destination: manifest.destination,
        events: lines.into_iter().map(<[u8]>::to_vec).collect(),
    })
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportReport {
    /// Events the receiver accepted (2xx).
    pub delivered: usize,
    /// Events given up on, with the last error: the receiver refused them for good, or
    /// every attempt failed.
    pub failed: Vec<(String, String)>,
}

/// How `import` retries.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "ImportOptions do nothing until `bundle::import`"]
pub struct ImportOptions {
    /// Attempts per event before it is given up on.
    pub max_attempts: u32,
    /// The first pause after a failed attempt; it doubles (with jitter) up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// How long one request may take.
    pub request_timeout: Duration,
}

impl ImportOptions {
    /// Attempts per event before it is given up on. Defaults to 25.
    pub fn max_attempts(mut self, attempts: u32) -> ImportOptions {
        self.max_attempts = attempts;
        self
    }

    /// The first pause after a failed attempt and the longest pause. Defaults to 500 ms and
    /// 60 s.
    pub fn backoff(mut self, first: Duration, max: Duration) -> ImportOptions {
        self.first_backoff = first;
        self.max_backoff = max;
        self
    }

    /// How long one request may take. Defaults to 15 s.
    pub fn request_timeout(mut self, timeout: Duration) -> ImportOptions {
        self.request_timeout = timeout;
        self
    }
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            max_attempts: 25,
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
            request_timeout: Duration::from_secs(15),
        }
    }
}

/// Verifies the bundle at `path` with `key` (refusing it before sending anything if it
/// does not verify), then POSTs its events to `url` in order, each signed with the same
/// key and naming its event's source in `outbox-source` (so an ingest with per-device keys
/// checks it against that source's keys, as a relay's requests), one at a time, retrying each with backoff: a 2xx delivers it, a 4xx other than
/// 408 and 429 refuses it for good, anything else is tried again (a `Retry-After` is waited
/// out, up to an hour). A redirect is not followed and counts as a failure; proxy settings
/// in the environment are not used. Needs no outbox database.
///
/// # Errors
///
/// As [`read_bundle`]; undeliverable events are in [`ImportReport::failed`], not errors.
pub fn import(
    path: &Path,
    key: impl Into<BundleKey>,
    url: &str,
    options: &ImportOptions,
) -> Result<ImportReport> {
    let key = key.into();
    let bundle = read_bundle(path, key.clone())?;
    // The relay's own settings: no redirect, no proxy, timeouts.
    let agent = ureq::Agent::new_with_config(
        crate::transport::agent_config(
            options.request_timeout.min(IMPORT_CONNECT_TIMEOUT),
            options.request_timeout,
            1,
        )
        .build(),
    );
    let mut report = ImportReport {
        delivered: 0,
        failed: Vec::new(),
    };
    for body in &bundle.events {
        let event = serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
        let id = event["id"].as_str().unwrap_or_default().to_string();
        let source = event["source"].as_str().unwrap_or_default().to_string();
        let sending = Sending {
            key: &key,
            id: &id,
            source: &source,
            body,
        };
        match send_with_retries(&agent, url, &sending, options) {
            Ok(()) => report.delivered += 1,
            Err(error) => {
                log::warn!("event {id}: given up: {error:#}");
                report.failed.push((id, error));
            }
        }
    }
    Ok(report)
}

/// How long import waits for a connection (or the whole request, if that is shorter).
const IMPORT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest `Retry-After` import waits out, as the relay's default cap.
const IMPORT_RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// One event of a bundle on its way.
struct Sending<'a> {
    key: &'a BundleKey,
    id: &'a str,
    source: &'a str,
    body: &'a [u8],
}

fn send_with_retries(
    agent: &ureq::Agent,
    url: &str,
    sending: &Sending<'_>,
    options: &ImportOptions,
) -> std::result::Result<(), String> {
    let Sending {
        key,
        id,
        source,
        body,
    } = *sending;
    let mut pause = options.first_backoff;
    let mut last = String::new();
    let attempts = options.max_attempts.max(1);
    for attempt in 1..=attempts {
        let timestamp = unix_ms() / 1000;
        let sent = agent
            .post(url)
            .header("content-type", wire::CLOUDEVENTS_JSON)
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", key.sign(id, timestamp, body))
            .header(SOURCE_HEADER, encode_source_header(source))
            .send(body);
        let mut wait = pause;
        match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                if (200..300).contains(&status) {
                    return Ok(());
                }
                last = format!("HTTP {status}");
                if (400..500).contains(&status) && status != 408 && status != 429 {
                    return Err(last);
                }
                if let Some(after) = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| wire::parse_retry_after(v, SystemTime::now()))
                {
                    wait = wait.max(after.min(IMPORT_RETRY_AFTER_CAP));
                }
            }
            Err(e) => last = e.to_string(),
        }
        // No pause after the last attempt: the import ends with its failure at once.
        if attempt == attempts {
            break;
        }
        // Jitter keeps importers that started together from retrying together.
        let jittered = wait.mul_f64(0.5 + fastrand::f64() * 0.5);
        let until = Instant::now() + jittered;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        pause = (pause * 2).min(options.max_backoff);
    }
    Err(format!("{last} ({} attempts)", options.max_attempts))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lowercase_and_two_digits_a_byte() {
        assert_eq!(super::hex(&[0, 15, 255]), "000fff");
    }
}
