//! What a Rust app expects of the API: its own connection setup on every connection the
//! outbox opens, its own error type out of `transaction`, events in a savepoint, a refusal
//! outside any transaction, paths that cannot hold an outbox refused, a relay handle kept in
//! shared state and shut down from there.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use common::{delivered_count, fast, wait_until, TestReceiver, PATIENCE};
use serde_json::json;
use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::{Error, Event, Outbox, RelayConfig, RelayHandle};

#[test]
fn on_connect_runs_first_on_every_connection_the_outbox_opens() {
    let dir = tempfile::tempdir().unwrap();
    let opened = Arc::new(AtomicUsize::new(0));
    let counter = opened.clone();
    let outbox = Outbox::builder()
        .pool_size(2)
        .on_connect(move |c| {
            counter.fetch_add(1, Ordering::SeqCst);
            c.execute_batch("PRAGMA cache_size = -1234")
        })
        .open(dir.path().join("app.db"))
        .unwrap();
    let after_open = opened.load(Ordering::SeqCst);
    // The migrating connection and the pool's first.
    assert!(after_open >= 2, "{after_open}");
    {
        let a = outbox.connection().unwrap();
        let b = outbox.connection().unwrap();
        for conn in [&a, &b] {
            let cache: i64 = conn
                .query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap();
            assert_eq!(cache, -1234);
        }
    }
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    // The relay's checkpointer opens a connection of its own.
    assert!(opened.load(Ordering::SeqCst) > after_open);
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let _ = relay.shutdown();
}

#[test]
fn a_failing_on_connect_fails_open_with_an_error_naming_it_and_creates_nothing_of_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let err = Outbox::builder()
        .on_connect(|c| c.execute_batch("PRAGMA no_such_thing = 1; SELECT * FROM missing"))
        .open(&path)
        .unwrap_err();
    assert!(matches!(err, Error::OnConnect(_)), "{err:?}");
    assert!(err.to_string().contains("on_connect"), "{err}");
    let tables: i64 = Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'outbox%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0);
}

#[test]
fn paths_that_give_each_connection_its_own_database_are_refused() {
    for path in [
        ":memory:",
        "",
        "file::memory:",
        "file:app?mode=memory&cache=shared",
    ] {
        let err = Outbox::open(path).unwrap_err();
        assert!(
            matches!(err, Error::InvalidPath { .. }),
            "{path:?}: {err:?}"
        );
        assert!(err.to_string().contains("path"), "{err}");
    }
}

#[test]
fn outbox_path_is_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    assert!(outbox.path().is_absolute());
}

#[derive(Debug)]
enum OrderError {
    OutOfStock,
    Outbox(Error),
}

impl From<Error> for OrderError {
    fn from(e: Error) -> Self {
        OrderError::Outbox(e)
    }
}

#[test]
fn transaction_returns_the_apps_own_error_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let result = outbox.transaction(|tx| {
        let _ = outbox.enqueue(tx, Event::new("order.placed", json!({"id": 1})))?;
        Err::<(), _>(OrderError::OutOfStock)
    });
    assert!(matches!(result, Err(OrderError::OutOfStock)), "{result:?}");
    assert_eq!(outbox.stats().unwrap().pending, 0, "rolled back");
    // The crate's errors come through the app's type.
    let result = outbox.transaction(|tx| -> Result<(), OrderError> {
        let _ = outbox.enqueue(tx, Event::new("", json!(null)))?;
        Ok(())
    });
    assert!(
        matches!(
            result,
            Err(OrderError::Outbox(Error::InvalidEventType { .. }))
        ),
        "{result:?}"
    );
}

#[test]
fn enqueue_works_in_a_savepoint_and_rolls_back_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let outbox = Outbox::open(&path).unwrap();
    let mut conn = Connection::open(&path).unwrap();
    let mut tx = conn.transaction().unwrap();
    {
        let kept = tx.savepoint().unwrap();
        let _ = outbox.enqueue(&kept, Event::new("kept", json!(1))).unwrap();
        kept.commit().unwrap();
    }
    {
        let mut undone = tx.savepoint().unwrap();
        let _ = outbox
            .enqueue_many(&undone, [Event::new("undone", json!(2))])
            .unwrap();
        undone.rollback().unwrap();
    }
    tx.commit().unwrap();
    let types = common::query_rows(&outbox, "SELECT event_type FROM outbox_events", |r| {
        r.get::<_, String>(0)
    });
    assert_eq!(types, ["kept"]);
}

#[test]
fn enqueue_outside_a_transaction_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let outbox = Outbox::open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    let err = outbox
        .enqueue(&conn, Event::new("t", json!(1)))
        .unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    let err = outbox
        .enqueue_many(&conn, [Event::new("t", json!(1))])
        .unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert!(!err.is_busy());
    assert_eq!(outbox.stats().unwrap().pending, 0);
}

/// The app's shared state: a relay handle in a `static`, stopped from the exit path.
static RELAY: OnceLock<RelayHandle> = OnceLock::new();

#[test]
fn a_relay_handle_in_shared_state_shuts_down_through_a_shared_reference() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let receiver = TestReceiver::ok();
    let handle = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    assert!(RELAY.set(handle).is_ok());
    let _ = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .unwrap();
    assert!(wait_until(PATIENCE, || delivered_count(&outbox) == 1));
    let relay = RELAY.get().unwrap();
    assert!(relay.is_running());
    let _ = relay.shutdown();
    assert!(!relay.is_running());
    // A second shutdown finds it stopped.
    assert_eq!(relay.shutdown().released, 0);
}

#[test]
fn notices_are_read_through_the_crates_own_type() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("app.db")).unwrap();
    let notices: sqlite_outbox::notices::Notices = outbox.subscribe();
    assert!(notices.is_empty());
    assert!(notices.try_recv().is_none());
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(fast(RelayConfig::http(receiver.url())))
        .start()
        .unwrap();
    let id = outbox
        .transaction(|tx| outbox.enqueue(tx, Event::new("t", json!(1))))
        .unwrap()
        .event_id()
        .to_string();
    let notice = notices
        .recv_timeout(PATIENCE)
        .expect("a notice for the delivered event");
    assert_eq!(notice.event_id, id);
    let _ = relay.shutdown();
}

#[test]
fn enqueue_on_a_transaction_of_another_file_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = Outbox::open(dir.path().join("a.db")).unwrap();
    let b = Outbox::open(dir.path().join("b.db")).unwrap();
    let mut conn = Connection::open(dir.path().join("b.db")).unwrap();
    let tx = conn.transaction().unwrap();
    let refused = a.enqueue(&tx, Event::new("order.placed", json!({"n": 1})));
    match refused {
        Err(Error::WrongDatabase { outbox, connection }) => {
            assert!(outbox.ends_with("a.db"), "{outbox}");
            assert!(connection.ends_with("b.db"), "{connection}");
        }
        other => panic!("expected WrongDatabase, got {other:?}"),
    }
    let refused_many = a.enqueue_many(&tx, vec![Event::new("x", json!({}))]);
    assert!(matches!(refused_many, Err(Error::WrongDatabase { .. })));
    tx.commit().unwrap();
    assert_eq!(a.pending_count(None).unwrap(), 0);
    assert_eq!(
        b.pending_count(None).unwrap(),
        0,
        "nothing went into b.db's outbox"
    );

    // The same file through another name (a symlink) is the outbox's own.
    #[cfg(unix)]
    {
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(dir.path().join("a.db"), &link).unwrap();
        let mut conn = Connection::open(&link).unwrap();
        let tx = conn.transaction().unwrap();
        let _ = a
            .enqueue(&tx, Event::new("order.placed", json!({"n": 2})))
            .unwrap();
        tx.commit().unwrap();
        assert_eq!(a.pending_count(None).unwrap(), 1);
    }
}
