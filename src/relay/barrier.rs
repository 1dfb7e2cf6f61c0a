//! The durability barrier: the relay never sends an event before the transaction that
//! committed it is on disk, whatever `synchronous` the app chose.
//!
//! At `synchronous=NORMAL` a WAL commit is not synced: after a power loss the last commits
//! roll back, the business row and its event together. A relay that delivered such an event
//! a millisecond after its commit would leave the receiver holding an event for a change the
//! device no longer has (a *ghost*).
//!
//! So a claim that takes events commits with `synchronous=FULL`: SQLite syncs the WAL before
//! the claim returns. The WAL is append-only between resets, and the claimed rows were
//! committed before the claim read them, so their frames sit before the claim's own in the
//! file and that one sync covers them too (frames already copied into the database file were
//! synced there by the checkpoint that copied them, before the WAL could be reset).
//!
//! One sync covers every commit before it, so a claim syncs only if another connection
//! committed since the last claim that synced (`PRAGMA data_version`, read under the claim's
//! write lock, says so). Draining a backlog therefore costs one sync, not one per claim;
//! while the app keeps committing, each claim syncs once for all the commits before it. A
//! claim that takes nothing writes nothing and syncs nothing, so it proves nothing either.
//!
//! Only claims pay: acks keep the app's setting. An ack lost in a power cut makes the event
//! pending again, and it is sent again: a duplicate, which receivers drop by id.

use rusqlite::{Connection, TransactionBehavior};

use crate::database::Synchronous;
use crate::error::Result;
use crate::queue::Claimed;

/// What the barrier knows of the WAL's durability.
pub(crate) struct Barrier {
    /// Off only in benches that measure the barrier's cost.
    enabled: bool,
    /// The app's setting, for every write but a claim's.
    usual: Synchronous,
    /// `data_version` when a claim last synced: until it changes, every commit of another
    /// connection is on disk.
    synced_version: Option<i64>,
}

impl Barrier {
    pub fn new(usual: Synchronous, enabled: bool) -> Barrier {
        Barrier {
            enabled,
            usual,
            synced_version: None,
        }
    }

    /// Runs `claim` in a write transaction that, if any other connection committed since the
    /// last sync, commits with `synchronous=FULL`.
    pub fn claim(
        &mut self,
        conn: &mut Connection,
        claim: impl FnOnce(&Connection) -> Result<Claimed>,
    ) -> Result<Claimed> {
        if !self.enabled {
            return claim(conn);
        }
        // SQLite refuses to change `synchronous` inside a transaction, so decide before it
        // begins, and check again under the write lock: a commit landing in between means
        // starting over with the sync.
        let mut sync = self.synced_version != Some(data_version(conn)?);
        loop {
            if sync {
                conn.pragma_update(None, "synchronous", Synchronous::Full.pragma_value())?;
            }
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let version = data_version(&tx)?;
            if !sync && self.synced_version != Some(version) {
                drop(tx);
                sync = true;
                continue;
            }
            let claimed = claim(&tx).and_then(|claimed| {
                tx.commit()?;
                Ok(claimed)
            });
            if sync {
                conn.pragma_update(None, "synchronous", self.usual.pragma_value())?;
                if claimed.as_ref().is_ok_and(|c| !c.is_empty()) {
                    self.synced_version = Some(version);
                }
            }
            return claimed;
        }
    }
}

/// Changes whenever another connection commits.
fn data_version(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database;
    use crate::queue::{self, ClaimRequest};

    fn claim_all(barrier: &mut Barrier, conn: &mut Connection) -> usize {
        let request = ClaimRequest {
            destination: "default",
            default_source: "/test",
            owner: "barrier-test",
            now: 10,
            lease_ms: 1_000,
            limit: 100,
        };
        let claimed = barrier.claim(conn, |c| queue::claim(c, &request)).unwrap();
        claimed.events.len()
    }

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_claim_syncs_only_after_another_connection_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("barrier.db");
        let mut relay = Connection::open(&path).unwrap();
        database::migrate(&mut relay, &path).unwrap();
        relay
            .execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .unwrap();
        let app = Connection::open(&path).unwrap();
        let commit_event = || {
            app.execute(
                "INSERT INTO outbox_events (event_id, event_type, payload, created_at, available_at)
                 VALUES (lower(hex(randomblob(16))), 't', '{}', 0, 0)",
                [],
            )
            .unwrap();
        };
        let mut barrier = Barrier::new(Synchronous::Normal, true);
        // Nothing claimed: nothing written, so nothing proven synced.
        assert_eq!(claim_all(&mut barrier, &mut relay), 0);
        assert_eq!(barrier.synced_version, None);
        commit_event();
        assert_eq!(claim_all(&mut barrier, &mut relay), 1);
        let synced = barrier.synced_version.expect("the claim synced");
        // The app's setting is back for every other write (1 = NORMAL).
        assert_eq!(synchronous(&relay), 1);
        commit_event();
        assert_eq!(claim_all(&mut barrier, &mut relay), 1);
        assert_ne!(
            barrier.synced_version,
            Some(synced),
            "a new commit needs a new sync"
        );
        assert_eq!(synchronous(&relay), 1);
    }
}
