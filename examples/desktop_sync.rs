//! A desktop notes app that shows which notes reached the server: each save commits the note
//! and its `note.saved` event together, and a "synced" mark is set when the relay reports the
//! event delivered, from `Outbox::subscribe`. A lost notice (the app was busy) costs only a
//! query: `Outbox::status` answers from the file.
//!
//! ```text
//! cargo run --example desktop_sync
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::time::{Duration, Instant};

use http_server::{HttpServer, Response};
use serde_json::json;
use sqlite_outbox::admin::State;
use sqlite_outbox::notices::DeliveryOutcome;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let outbox = Outbox::open(dir.path().join("notes.db"))?;
    let mut app = outbox.connection()?;
    app.execute_batch(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL, event_id TEXT,
                             synced INTEGER NOT NULL DEFAULT 0)",
    )?;
    // The server the notes sync to (here a local one that accepts everything).
    let server = HttpServer::bind(("127.0.0.1", 0), |_| Response::status(204))?;
    let notices = outbox.subscribe();
    let relay = outbox
        .relay(RelayConfig::new().destination(Destination::http(
            "default",
            format!("http://127.0.0.1:{}/notes", server.port()),
        )))
        .start()?;

    // The user saves five notes; each save is one transaction: the note and its event.
    for text in [
        "groceries",
        "call Ana",
        "book flights",
        "renew passport",
        "water plants",
    ] {
        let tx = app.transaction()?;
        tx.execute("INSERT INTO notes (text) VALUES (?1)", [text])?;
        let note = tx.last_insert_rowid();
        let event = outbox.enqueue(
            &tx,
            Event::new("note.saved", json!({"id": note, "text": text})).subject(note.to_string()),
        )?;
        tx.execute(
            "UPDATE notes SET event_id = ?1 WHERE id = ?2",
            (event.event_id(), note),
        )?;
        tx.commit()?;
        outbox.notify();
    }
    println!("saved 5 notes; waiting for the server to have them");

    // The app's loop: mark notes synced as notices arrive.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut synced = 0;
    while synced < 5 && Instant::now() < deadline {
        let Some(notice) = notices.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if notice.outcome == DeliveryOutcome::Delivered {
            synced += app.execute(
                "UPDATE notes SET synced = 1 WHERE event_id = ?1",
                [&notice.event_id],
            )?;
        }
    }
    let _ = relay.shutdown();
    server.stop();

    // Had a notice been lost, the file still knows: ask it for the notes not marked yet.
    let mut unmarked = app.prepare("SELECT id, event_id FROM notes WHERE synced = 0")?;
    let late: Vec<(i64, String)> = unmarked
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (id, event_id) in late {
        if outbox
            .status(&event_id)?
            .iter()
            .all(|s| s.state == State::Delivered)
        {
            app.execute("UPDATE notes SET synced = 1 WHERE id = ?1", [id])?;
        }
    }
    let mut list = app.prepare("SELECT id, text, synced FROM notes ORDER BY id")?;
    for row in list.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, bool>(2)?,
        ))
    })? {
        let (id, text, synced) = row?;
        println!(
            "note {id} {:<16} {}",
            text,
            if synced { "synced" } else { "not yet" }
        );
    }
    println!("notices lost: {}", outbox.lost_notices());
    Ok(())
}
