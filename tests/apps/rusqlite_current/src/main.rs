//! An app on rusqlite 0.43 with its own table, writing its change and the event that
//! announces it in one transaction of its own connection, then delivering it over HTTP to a
//! receiver on 127.0.0.1: it compiles and runs against the crate with one SQLite in the build,
//! and its lock file holds ureq at the lowest release the crate allows (3.5.0), so the HTTP
//! transport is run on both ends of its ureq range (the workspace is on the newest).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use sqlite_outbox::{Event, Outbox, RelayConfig};

/// Answers one request with 204 and returns the `webhook-id` it carried.
fn receive_one(listener: TcpListener) -> std::io::Result<String> {
    let (stream, _) = listener.accept()?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let (mut id, mut length) = (String::new(), 0usize);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("webhook-id:") {
            id = v.trim().to_string();
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    (&stream).write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")?;
    Ok(id)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("rusqlite-current-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("app.db");
    let outbox = Outbox::open(&path)?;
    let mut conn = Connection::open(&path)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")?;
    let tx = conn.transaction()?;
    tx.execute("INSERT INTO orders (total) VALUES (?1)", [990])?;
    let event_id = outbox
        .enqueue(&tx, Event::new("order.placed", serde_json::json!({"total": 990})))?
        .event_id()
        .to_string();
    tx.commit()?;
    assert_eq!(outbox.pending_count(None)?, 1);
    assert_eq!(rusqlite::version_number(), sqlite_outbox::rusqlite::version_number());

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let receiver = std::thread::Builder::new()
        .name("receiver".into())
        .spawn(move || receive_one(listener))?;
    let report = outbox.deliver_pending(RelayConfig::http(url), Instant::now() + Duration::from_secs(20))?;
    let received = receiver.join().map_err(|_| "the receiver panicked")??;
    assert_eq!(report.delivered, 1, "{report:?}");
    assert_eq!(outbox.pending_count(None)?, 0);
    assert_eq!(received, event_id);
    println!("rusqlite 0.43 app: 1 order, its event delivered over HTTP (id {received})");
    drop(outbox);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
