//! The durability barrier: the relay never sends an event before the transaction that
//! committed it is on disk, whatever `synchronous` the app chose.
//!
//! At `synchronous=NORMAL` a WAL commit is not synced: after a power loss the last commits
//! roll back, the business row and its event together. A relay that delivered such an event
//! a millisecond after its commit would leave the receiver holding an event for a change the
//! device no longer has (a *ghost*).
//!
//! So before a claim's events go out, the WAL is synced: the claim commits at the app's own
//! setting, releases the write lock, and then `fdatasync`s the WAL file through a handle of
//! its own (a sync is per file, whichever handle asks). The claimed rows were committed
//! before the claim read them, so their frames sit before the claim's own in the file and
//! that one sync covers them too. Frames already copied into the database file were synced
//! there by the checkpoint that copied them (it syncs the WAL before copying and the
//! database after), so a WAL that started over in between loses nothing. The sync happens
//! after the lock is released: a first form committed the claim with `synchronous=FULL`,
//! and every app commit that met a claim waited for the claim's `fsync` (2 to 40 ms under
//! a drain on this disk).
//!
//! One sync covers every commit before it, so a claim syncs only if another connection
//! committed since the last claim that synced (`PRAGMA data_version`, read under the claim's
//! write lock, says so). Draining a backlog therefore costs one sync, not one per claim;
//! while the app keeps committing, each claim syncs once for all the commits before it. A
//! claim that takes nothing writes nothing and syncs nothing, so it proves nothing either.
//!
//! Only claims pay: acks keep the app's setting. An ack lost in a power cut makes the event
//! pending again, and it is sent again: a duplicate, which receivers drop by id.

use std::fs::File;
use std::path::PathBuf;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::Result;
use crate::relay::wal_file::WalFile;
use crate::store::database::Synchronous;
use crate::store::queue::Claimed;
use crate::store::right_of_way::RelayWrite;

/// What the barrier knows of the WAL's durability.
pub(crate) struct Barrier {
    /// Off only in benches that measure the barrier's cost.
    enabled: bool,
    /// The app's setting: at FULL every commit is synced already.
    usual: Synchronous,
    /// The WAL file, opened at the first sync (and again after a failed one).
    wal: Option<File>,
    /// `data_version` when a claim last synced: until it changes, every commit of another
    /// connection is on disk.
    synced_version: Option<i64>,
}

impl Barrier {
    pub fn new(usual: Synchronous, enabled: bool) -> Barrier {
        Barrier {
            enabled,
            usual,
            wal: None,
            synced_version: None,
        }
    }

    /// Runs `claim` in a write transaction, marked under way by `write` until it ends, and,
    /// if it took events and another connection committed since the last sync, syncs the
    /// WAL once the transaction is over. An error of the sync is returned: the claimed
    /// events are then not sent, and go out again once their lease ends.
    pub fn claim(
        &mut self,
        conn: &mut Connection,
        write: RelayWrite<'_>,
        claim: impl FnOnce(&Connection) -> Result<Claimed>,
    ) -> Result<Claimed> {
        if !self.enabled {
            return claim(conn);
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock: every commit this version counts came before the
        // claim's, so is in the WAL before it (or already copied out of it).
        let version = data_version(&tx)?;
        let claimed = claim(&tx)?;
        tx.commit()?;
        drop(write);
        let needs_sync = self.usual != Synchronous::Full
            && !claimed.is_empty()
            && self.synced_version != Some(version);
        if needs_sync {
            self.sync_wal(conn)?;
            self.synced_version = Some(version);
        }
        Ok(claimed)
    }

    /// `fdatasync` of `conn`'s WAL file, outside any transaction.
    fn sync_wal(&mut self, conn: &Connection) -> Result<()> {
        let wal = match self.wal.take() {
            Some(wal) => wal,
            None => WalFile::of(&db_path(conn)?).open_to_sync()?,
        };
        wal.sync_data()?;
        self.wal = Some(wal);
        Ok(())
    }
}

/// The file of `conn`'s main database.
fn db_path(conn: &Connection) -> Result<PathBuf> {
    match conn.path().filter(|p| !p.is_empty()) {
        Some(path) => Ok(PathBuf::from(path)),
        None => Err(crate::error::Error::InvalidConfig(
            "the durability barrier needs a database file, not an in-memory database".into(),
        )),
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
    use crate::store::database;
    use crate::store::queue::{self, ClaimRequest};
    use crate::store::right_of_way::RightOfWay;
    use std::time::Duration;

    fn claim_all(barrier: &mut Barrier, conn: &mut Connection) -> usize {
        let request = ClaimRequest {
            destination: "default",
            default_source: "/test",
            owner: "barrier-test",
            spare_leases: "",
            now: 10,
            clock_step_ms: 0,
            lease_ms: 1_000,
            max_bytes: i64::MAX,
            numbering_bound: None,
            min_priority: 0,
            limit: 100,
        };
        let way = RightOfWay::default();
        let write = way.relay_write(Duration::ZERO);
        let claimed = barrier
            .claim(conn, write, |c| queue::claim(c, &request))
            .unwrap();
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
        // The claim's own commit kept the app's setting (1 = NORMAL): the sync came after.
        assert_eq!(synchronous(&relay), 1);
        assert!(
            barrier.wal.is_some(),
            "the WAL file is held open for the next sync"
        );
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
