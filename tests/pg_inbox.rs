//! The PostgreSQL inbox against a real PostgreSQL: migrations that several processes may run
//! at once, a receipt that commits (or rolls back) with the receiver's transaction, two
//! transactions racing for one event, and pruning in pages.
#![cfg(feature = "postgres")]

mod common;
#[path = "common/postgres.rs"]
mod pg;

use std::time::Duration;

use pg::Postgres;
use sqlite_outbox::receive::{pg_migrate, pg_schema_version, PgInbox, Receipt};

#[test]
fn migrations_run_concurrently_and_again_and_refuse_a_newer_schema() {
    let postgres = Postgres::start();
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let url = postgres.url();
            std::thread::spawn(move || {
                let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                pg_migrate(&mut client)
            })
        })
        .collect();
    for racer in racers {
        racer.join().unwrap().unwrap();
    }
    let mut client = postgres.client();
    pg_migrate(&mut client).unwrap();
    let versions: i64 = client
        .query_one("SELECT count(*) FROM outbox_pg_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(versions, i64::from(pg_schema_version()));
    client
        .execute(
            "INSERT INTO outbox_pg_migrations (version) VALUES (99)",
            &[],
        )
        .unwrap();
    let e = pg_migrate(&mut client).unwrap_err().to_string();
    assert!(e.contains("99 is newer"), "{e}");
}

#[test]
fn a_receipt_commits_with_the_transaction_and_a_racing_one_sees_a_duplicate() {
    let postgres = Postgres::start();
    let mut client = postgres.client();
    pg_migrate(&mut client).unwrap();
    {
        let mut tx = client.transaction().unwrap();
        assert_eq!(PgInbox::receive(&mut tx, "/d", "e1").unwrap(), Receipt::New);
        assert_eq!(
            PgInbox::receive(&mut tx, "/d", "e1").unwrap(),
            Receipt::Duplicate
        );
        // Dropped: rolled back, so the event is new again.
    }
    let mut first = client.transaction().unwrap();
    assert_eq!(
        PgInbox::receive(&mut first, "/d", "e1").unwrap(),
        Receipt::New
    );
    // A second receiver takes the same event while the first has not committed: it waits,
    // and sees a duplicate once the first commits.
    let url = postgres.url();
    let racer = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        let receipt = PgInbox::receive(&mut tx, "/d", "e1").unwrap();
        tx.commit().unwrap();
        receipt
    });
    std::thread::sleep(Duration::from_millis(300));
    first.commit().unwrap();
    assert_eq!(racer.join().unwrap(), Receipt::Duplicate);
}

#[test]
fn prune_deletes_old_receipts_in_pages() {
    let postgres = Postgres::start();
    let mut client = postgres.client();
    pg_migrate(&mut client).unwrap();
    client
        .execute(
            "INSERT INTO outbox_inbox (source, event_id, received_at)
             SELECT '/d', 'old-' || i, now() - interval '10 days' FROM generate_series(1, 2500) i",
            &[],
        )
        .unwrap();
    let mut tx = client.transaction().unwrap();
    PgInbox::receive(&mut tx, "/d", "fresh").unwrap();
    tx.commit().unwrap();
    let pruned = PgInbox::prune(&mut client, Duration::from_secs(86_400)).unwrap();
    assert_eq!(pruned, 2500);
    let left: i64 = client
        .query_one("SELECT count(*) FROM outbox_inbox", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 1);
}
