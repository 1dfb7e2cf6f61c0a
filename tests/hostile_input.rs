//! Input and environments that should fail cleanly: a full disk, a file that cannot be
//! written. Each gives a typed error, loses nothing committed before, and the outbox works
//! again once the cause is gone. (Bad payloads, keys, types, files that are not SQLite,
//! newer schemas, bad `Retry-After` values and non-HTTP URLs are tested beside the features
//! they belong to.)

mod common;

use std::process::Command;

use common::rows;
use serde_json::json;
use sqlite_outbox::{Error, Event, Outbox};

fn enqueue(outbox: &Outbox, data: serde_json::Value) -> Result<(), Error> {
    outbox.transaction(|tx| {
        tx.execute("INSERT INTO readings (v) VALUES (?1)", [data.to_string()])?;
        let _ = outbox.enqueue(tx, Event::new("reading", data))?;
        Ok(())
    })
}

/// Caps every pooled connection's file size (`PRAGMA max_page_count`): a disk that is full.
fn cap_pages(outbox: &Outbox, pool_size: usize, pages: Option<i64>) {
    let conns: Vec<_> = (0..pool_size)
        .map(|_| outbox.connection().unwrap())
        .collect();
    for c in &conns {
        let limit = pages.unwrap_or(1_073_741_823);
        let _: i64 = c
            .query_row(&format!("PRAGMA max_page_count = {limit}"), [], |r| {
                r.get(0)
            })
            .unwrap();
    }
}

#[test]
fn a_full_disk_is_a_typed_error_and_the_outbox_recovers_when_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::builder()
        .pool_size(2)
        .open(dir.path().join("full.db"))
        .unwrap();
    outbox
        .transaction(|tx| {
            Ok::<_, sqlite_outbox::Error>(tx.execute_batch("CREATE TABLE readings (v TEXT)")?)
        })
        .unwrap();
    for i in 0..10 {
        enqueue(&outbox, json!({"i": i})).unwrap();
    }
    let pages: i64 = outbox
        .connection()
        .unwrap()
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    cap_pages(&outbox, 2, Some(pages + 2));
    let mut written = 10;
    let err = loop {
        match enqueue(&outbox, json!({"blob": "x".repeat(2000)})) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 1_000, "the cap never hit");
    };
    assert!(matches!(err, Error::DiskFull(_)), "{err:?}");
    assert!(err.to_string().contains("full"), "{err}");
    // Everything committed before is there, business rows and events alike.
    assert_eq!(rows(&outbox).len(), written);
    let integrity: String = outbox
        .connection()
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    // Space is freed: the same handle works again.
    cap_pages(&outbox, 2, None);
    enqueue(&outbox, json!({"after": true})).unwrap();
    assert_eq!(rows(&outbox).len(), written + 1);
}

#[test]
fn a_file_that_cannot_be_written_is_a_typed_error_and_works_again_when_writable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    {
        let outbox = Outbox::open(&path).unwrap();
        outbox
            .transaction(|tx| {
                Ok::<_, sqlite_outbox::Error>(tx.execute_batch("CREATE TABLE readings (v TEXT)")?)
            })
            .unwrap();
        enqueue(&outbox, json!(1)).unwrap();
        outbox.checkpoint().unwrap();
    }
    // Root ignores file modes; an immutable file stops even root.
    let frozen = Command::new("chattr").arg("+i").arg(&path).status();
    assert!(
        frozen.map(|s| s.success()).unwrap_or(false),
        "chattr +i is needed to make a file unwritable for root"
    );
    let result = Outbox::open(&path).and_then(|outbox| enqueue(&outbox, json!(2)));
    let unfrozen = Command::new("chattr")
        .arg("-i")
        .arg(&path)
        .status()
        .unwrap();
    assert!(unfrozen.success());
    let err = result.unwrap_err();
    eprintln!("unwritable file: {err}");
    assert!(matches!(err, Error::ReadOnly(_)), "{err:?}");
    assert!(!err.to_string().is_empty());
    // Writable again: reopened, it works, and the first event is still there.
    let outbox = Outbox::open(&path).unwrap();
    enqueue(&outbox, json!(3)).unwrap();
    assert_eq!(rows(&outbox).len(), 2);
}

#[test]
fn an_unreadable_row_is_dead_lettered_and_the_rest_of_its_batch_delivered() {
    use common::{fast, wait_until, TestReceiver, PATIENCE};
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("unreadable.db")).unwrap();
    outbox
        .transaction(|tx| {
            for n in 0..10 {
                let _ = outbox.enqueue(tx, Event::new("reading", json!(n)))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    // Another program wrote a BLOB where the outbox keeps JSON text.
    outbox
        .connection()
        .unwrap()
        .execute(
            "UPDATE outbox_events SET payload = x'deadbeef' WHERE id = (SELECT MIN(id) + 4 FROM outbox_events)",
            [],
        )
        .unwrap();
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(sqlite_outbox::RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let settled = wait_until(PATIENCE, || {
        rows(&outbox).iter().all(|r| r.delivered || r.dead)
    });
    let stats = relay.shutdown();
    assert!(settled, "{:?}", rows(&outbox));
    let all = rows(&outbox);
    let dead: Vec<_> = all.iter().filter(|r| r.dead).collect();
    assert_eq!(dead.len(), 1, "{all:?}");
    let error = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(error.starts_with("unreadable row: "), "{error}");
    assert_eq!(receiver.count(), 9, "the rest of the batch was delivered");
    assert_eq!(stats.abandoned, 0);
    // The operator sees it, data shown as hex.
    let listed = outbox
        .list(Some(sqlite_outbox::admin::State::Dead), 10)
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].data, "x'deadbeef'");
}
