//! The receiving side: verify a signed request, read its CloudEvents, and apply each event
//! exactly once with an inbox table kept in the receiver's own transaction.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Transaction};

use crate::error::Result;
use crate::wire::cloudevents::{parse_request, CloudEvent, ParseError};
use crate::wire::signature::{Verifier, VerifyError};

/// Rows deleted per transaction when pruning, so the receiver's writers never wait long.
const PRUNE_PAGE: i64 = 1_000;

/// Whether an event was seen before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First time: apply its effect in the same transaction.
    New,
    /// Already received (a re-delivery): skip it, and still answer 2xx.
    Duplicate,
}

/// An inbox of received event ids, in the receiver's SQLite database.
///
/// ```
/// use sqlite_outbox::receive::{Inbox, Receipt};
/// use sqlite_outbox::rusqlite::Connection;
/// # fn main() -> Result<(), sqlite_outbox::Error> {
/// let mut conn = Connection::open_in_memory()?;
/// sqlite_outbox::receive::migrate(&mut conn)?;
/// let tx = conn.transaction()?;
/// assert_eq!(Inbox::receive(&tx, "/shop", "evt-1")?, Receipt::New);
/// assert_eq!(Inbox::receive(&tx, "/shop", "evt-1")?, Receipt::Duplicate);
/// tx.commit()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Inbox;

impl Inbox {
    /// Records `(source, event_id)` inside `tx` and tells a new event from a duplicate.
    ///
    /// Do the event's work in the same transaction: if it rolls back, the id is not recorded
    /// either, and the re-delivery is applied then. Together, every event takes effect once.
    ///
    /// # Errors
    ///
    /// SQLite errors (the table comes from [`migrate`](crate::receive::migrate)).
    pub fn receive(tx: &Transaction<'_>, source: &str, event_id: &str) -> Result<Receipt> {
        let inserted = tx
            .prepare_cached(
                "INSERT INTO outbox_inbox (source, event_id, received_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![source, event_id, unix_ms()])?;
        Ok(if inserted == 1 {
            Receipt::New
        } else {
            Receipt::Duplicate
        })
    }

    /// Deletes inbox rows received more than `older_than` ago, a page per transaction;
    /// returns how many. Keep more than the senders' longest retry horizon: an event
    /// re-delivered after its row is gone would be applied again.
    ///
    /// # Errors
    ///
    /// SQLite errors; pages already deleted stay deleted.
    pub fn prune(conn: &Connection, older_than: Duration) -> Result<usize> {
        let cutoff = unix_ms().saturating_sub(older_than.as_millis() as i64);
        let mut total = 0;
        loop {
            let deleted = conn
                .prepare_cached(
                    "DELETE FROM outbox_inbox WHERE (source, event_id) IN (
                         SELECT source, event_id FROM outbox_inbox
                          WHERE received_at < ?1 LIMIT CAST(?2 AS INTEGER))",
                )?
                .execute(params![cutoff, PRUNE_PAGE])?;
            total += deleted;
            if deleted < PRUNE_PAGE as usize {
                return Ok(total);
            }
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Why a request was refused by [`verify_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The signature check failed: answer 400 (or 401).
    Signature(VerifyError),
    /// The body is not valid CloudEvents: answer 400.
    Body(ParseError),
    /// No key may sign for the source the request names (or, naming none, no key signs
    /// for any source): answer 401, as to a bad signature, so the answer does not tell
    /// which sources are registered.
    UnknownSource,
    /// An event of another source than the one the request is signed for (nothing of the
    /// request is to be kept): answer 403.
    ForgedSource {
        /// The first such event's id.
        event_id: String,
        /// Its source.
        event_source: String,
    },
    /// The `outbox-source` header is not a percent-encoded UTF-8 source: answer 400.
    MalformedSourceHeader,
}

impl ReceiveError {
    /// A stable snake-case name for the error kind: the [`VerifyError::kind`] of a
    /// signature error, `invalid_body`, `unknown_source`, `forged_source` or
    /// `malformed_source_header`.
    pub fn kind(&self) -> &'static str {
        match self {
            ReceiveError::Signature(e) => e.kind(),
            ReceiveError::Body(_) => "invalid_body",
            ReceiveError::UnknownSource => "unknown_source",
            ReceiveError::ForgedSource { .. } => "forged_source",
            ReceiveError::MalformedSourceHeader => "malformed_source_header",
        }
    }
}

impl fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReceiveError::Signature(e) => write!(f, "signature: {e:#}"),
            ReceiveError::Body(e) => write!(f, "body: {e:#}"),
            ReceiveError::UnknownSource => write!(f, "no key may sign for the request's source"),
            ReceiveError::ForgedSource {
                event_id,
                event_source,
            } => write!(
                f,
                "event {event_id:?} has source {event_source:?}, not the source the request \
                 is signed for"
            ),
            ReceiveError::MalformedSourceHeader => {
                write!(f, "outbox-source is not a percent-encoded UTF-8 source")
            }
        }
    }
}

impl std::error::Error for ReceiveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReceiveError::Signature(e) => Some(e),
            ReceiveError::Body(e) => Some(e),
            _ => None,
        }
    }
}

/// Verifies a signed request and parses its CloudEvents (structured or batched, by its
/// `content-type`), at `now` (unix seconds).
///
/// # Errors
///
/// [`ReceiveError::Signature`] before the body is even parsed, or [`ReceiveError::Body`].
pub fn verify_request<K, V>(
    verifier: &Verifier,
    headers: &[(K, V)],
    body: &[u8],
    now: i64,
) -> Result<Vec<CloudEvent>, ReceiveError>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    verifier
        .verify(
            headers.iter().map(|(k, v)| (k.as_ref(), v.as_ref())),
            body,
            now,
        )
        .map_err(ReceiveError::Signature)?;
    let content_type = headers
        .iter()
        .find(|(k, _)| k.as_ref().eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_ref());
    parse_request(content_type, body).map_err(ReceiveError::Body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolled_back_receipt_is_not_remembered() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::database::migrate(&mut conn, std::path::Path::new(":memory:")).unwrap();
        {
            let tx = conn.transaction().unwrap();
            assert_eq!(Inbox::receive(&tx, "s", "e").unwrap(), Receipt::New);
            // dropped: rolled back
        }
        let tx = conn.transaction().unwrap();
        assert_eq!(Inbox::receive(&tx, "s", "e").unwrap(), Receipt::New);
        assert_eq!(Inbox::receive(&tx, "other", "e").unwrap(), Receipt::New);
        tx.commit().unwrap();
    }

    #[test]
    fn prune_removes_only_old_rows_in_pages() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::database::migrate(&mut conn, std::path::Path::new(":memory:")).unwrap();
        let old = unix_ms() - 10 * 86_400_000;
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500)
             INSERT INTO outbox_inbox SELECT 's', 'old-' || i, ?1 FROM n",
            [old],
        )
        .unwrap();
        let tx = conn.transaction().unwrap();
        Inbox::receive(&tx, "s", "fresh").unwrap();
        tx.commit().unwrap();
        let pruned = Inbox::prune(&conn, Duration::from_secs(86_400)).unwrap();
        assert_eq!(pruned, 2500);
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM outbox_inbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1);
    }
}
