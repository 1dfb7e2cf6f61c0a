//! The inbox in PostgreSQL: which `(source, id)` pairs a Rust backend has applied, kept in
//! the backend's own transaction.

use std::time::Duration;

use crate::error::Result;
use crate::receive::inbox::Receipt;

/// Rows deleted per statement when pruning, so that writers never wait long.
const PRUNE_PAGE: i64 = 1_000;

/// An inbox of received event ids, in the receiver's PostgreSQL database (tables from
/// [`pg_migrate`](crate::receive::pg_migrate)).
///
/// ```no_run
/// use sqlite_outbox::receive::{PgInbox, Receipt};
/// # fn main() -> Result<(), sqlite_outbox::Error> {
/// // TLS as libpq's sslmode and sslrootcert say (see `pg_connect_config`).
/// let mut client = sqlite_outbox::receive::pg_connect(
///     "postgresql://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )?;
/// sqlite_outbox::receive::pg_migrate(&mut client)?;
/// let mut tx = client.transaction()?;
/// if PgInbox::receive(&mut tx, "/devices/42", "01a2…")? == Receipt::New {
///     // apply the event's effect here, in the same transaction
/// }
/// tx.commit()?; // the effect and the inbox row commit together
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PgInbox;

impl PgInbox {
    /// Records `(source, event_id)` inside `tx` and tells a new event from a repeat.
    ///
    /// A concurrent transaction recording the same pair waits for this one: if this one
    /// commits, the other gets [`Receipt::Duplicate`]; if it rolls back, the other gets
    /// [`Receipt::New`]. So each event's effect is applied once, by whichever commits.
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`](crate::Error::Postgres).
    pub fn receive(
        tx: &mut postgres::Transaction<'_>,
        source: &str,
        event_id: &str,
    ) -> Result<Receipt> {
        let inserted = tx.execute(
            "INSERT INTO outbox_inbox (source, event_id) VALUES ($1, $2)
             ON CONFLICT DO NOTHING",
            &[&source, &event_id],
        )?;
        Ok(if inserted == 1 {
            Receipt::New
        } else {
            Receipt::Duplicate
        })
    }

    /// Deletes inbox rows received more than `older_than` ago, a page per statement; returns
    /// how many. Keep more than the senders' longest retry horizon: an event re-delivered
    /// after its row is gone would be applied again.
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`](crate::Error::Postgres); pages already deleted stay deleted.
    pub fn prune(client: &mut postgres::Client, older_than: Duration) -> Result<u64> {
        let seconds = older_than.as_secs_f64();
        let mut total = 0;
        loop {
            let deleted = client.execute(
                "DELETE FROM outbox_inbox WHERE ctid IN (
                     SELECT ctid FROM outbox_inbox
                      WHERE received_at < now() - make_interval(secs => $1)
                      LIMIT $2)",
                &[&seconds, &PRUNE_PAGE],
            )?;
            total += deleted;
            if deleted < PRUNE_PAGE as u64 {
                return Ok(total);
            }
        }
    }
}
