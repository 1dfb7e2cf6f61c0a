//! The SQLCipher app end to end: a receiver on 127.0.0.1 gets every event, the file on disk
//! cannot be read without the key (the `sqlite3` shell, or Python's sqlite3 where the shell
//! is missing, says "file is not a database"), and it opens again with the key.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::{Error, Outbox};

const KEY: &str = "correct horse battery staple";

/// A receiver that answers 200 to every request and keeps the bodies' event ids.
fn receiver() -> (String, Arc<Mutex<HashSet<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let ids = Arc::new(Mutex::new(HashSet::new()));
    let seen = ids.clone();
    std::thread::Builder::new()
        .name("test-receiver".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = seen.clone();
                std::thread::spawn(move || serve(stream, &seen));
            }
        })
        .unwrap();
    (url, ids)
}

/// Answers the requests of one connection (keep-alive) until it closes or idles 10 s.
fn serve(stream: std::net::TcpStream, seen: &Mutex<HashSet<String>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // The relay's accounting of its streams (for `outbox ingest`) is not an event.
        let accounting = event["type"] == sqlite_outbox::wire::ACCOUNTING_TYPE;
        if let (Some(id), false) = (event["id"].as_str(), accounting) {
            seen.lock().unwrap().insert(id.to_owned());
        }
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// What an SQLite without the key says of the file.
fn read_without_key(path: &Path) -> String {
    let shell = Command::new("sqlite3")
        .arg(path)
        .arg("SELECT COUNT(*) FROM orders;")
        .output();
    match shell {
        Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
        Err(_) => {
            let out = Command::new("python3")
                .arg("-c")
                .arg("import sqlite3, sys\ntry:\n    sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM orders')\nexcept Exception as e:\n    print(e)")
                .arg(path)
                .output()
                .expect("sqlite3 or python3");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    }
}

#[test]
fn an_encrypted_apps_orders_and_events_commit_together_and_every_event_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let (url, received) = receiver();
    let out = Command::new(env!("CARGO_BIN_EXE_sqlcipher-app"))
        .args([db.to_str().unwrap(), KEY, &url, "25"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("delivered 25 pending 0 dead 0"), "{stdout}");
    assert_eq!(received.lock().unwrap().len(), 25);

    // On disk: no SQLite header, and an SQLite without the key cannot read it.
    let head = std::fs::read(&db).unwrap();
    assert!(!head.starts_with(b"SQLite format 3\0"));
    let said = read_without_key(&db);
    assert!(said.contains("file is not a database"), "{said}");

    // Without the key the outbox refuses the file; nothing changed.
    let before = std::fs::read(&db).unwrap();
    let err = Outbox::open(&db).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err:?}");
    // (The app may have left its WAL, as any process may: it stays as it was too.)
    assert!(std::fs::read(&db).unwrap() == before, "the file changed");

    // With the key: the app's orders and the outbox's record of every event.
    let outbox = Outbox::builder()
        .on_connect(|c| c.pragma_update(None, "key", KEY))
        .open(&db)
        .unwrap();
    assert_eq!(outbox.stats().unwrap().delivered, 25);
    let conn = Connection::open(&db).unwrap();
    conn.pragma_update(None, "key", KEY).unwrap();
    let orders: i64 = conn
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orders, 25);
}
