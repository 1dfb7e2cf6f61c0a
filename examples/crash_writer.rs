//! A writer for the crash tests: commits business rows and their events, one transaction
//! each, and prints each event's id only after its commit returned. Every seventh
//! transaction is rolled back on purpose (its event must never be delivered).
//!
//! ```text
//! cargo run --example crash_writer -- DB_PATH FIRST_SEQ [COUNT [PAUSE_MICROS]]
//! ```
//!
//! `OUTBOX_SYNCHRONOUS=full` (any case) opens the database with `synchronous=FULL` (default
//! NORMAL), as the `outbox` CLI reads the same variable.

use std::io::Write;

use serde_json::json;
use sqlite_outbox::{Error, Event, Outbox, Synchronous};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let db = args
        .next()
        .ok_or("usage: crash_writer DB FIRST_SEQ [COUNT]")?;
    let first: i64 = args.next().ok_or("FIRST_SEQ missing")?.parse()?;
    let count: i64 = args.next().map_or(Ok(i64::MAX), |c| c.parse())?;
    let pause = std::time::Duration::from_micros(args.next().map_or(Ok(0), |p| p.parse())?);
    let synchronous = match std::env::var("OUTBOX_SYNCHRONOUS") {
        Ok(s) if s.eq_ignore_ascii_case("full") => Synchronous::Full,
        _ => Synchronous::Normal,
    };
    let outbox = Outbox::builder().synchronous(synchronous).open(&db)?;
    outbox.transaction(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS orders (seq INTEGER PRIMARY KEY, event_id TEXT NOT NULL)",
            [],
        )?;
        Ok::<_, sqlite_outbox::Error>(())
    })?;
    let mut out = std::io::stdout().lock();
    for seq in first..first.saturating_add(count) {
        let key = format!("k{}", seq % 5);
        let rollback = seq % 7 == 0;
        let result = outbox.transaction(|tx| {
            let event = Event::new(
                "order.created",
                json!({"seq": seq, "rolled_back": rollback}),
            )
            .partition_key(key.clone());
            let id = outbox.enqueue(tx, event)?.event_id().to_string();
            tx.execute(
                "INSERT INTO orders (seq, event_id) VALUES (?1, ?2)",
                (seq, &id),
            )?;
            if rollback {
                return Err(Error::InvalidConfig("rolled back on purpose".into()));
            }
            Ok(id)
        });
        match result {
            Ok(id) => writeln!(out, "{id} {seq} {key}")?,
            Err(Error::InvalidConfig(_)) => {}
            Err(e) => return Err(e.into()),
        }
        out.flush()?;
        std::thread::sleep(pause);
    }
    Ok(())
}
