//! An app on rusqlite 0.43 with its own table, writing its change and the event that
//! announces it in one transaction of its own connection, then reading the outbox's
//! count: it compiles and runs against the crate with one SQLite in the build.

use rusqlite::Connection;
use sqlite_outbox::{Event, Outbox};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("rusqlite-current-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("app.db");
    let outbox = Outbox::open(&path)?;
    let mut conn = Connection::open(&path)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")?;
    let tx = conn.transaction()?;
    tx.execute("INSERT INTO orders (total) VALUES (?1)", [990])?;
    let _ = outbox.enqueue(&tx, Event::new("order.placed", serde_json::json!({"total": 990})))?;
    tx.commit()?;
    let pending = outbox.pending_count(None)?;
    assert_eq!(pending, 1);
    assert_eq!(rusqlite::version_number(), sqlite_outbox::rusqlite::version_number());
    println!("rusqlite 0.43 app: 1 order, {pending} event pending");
    drop(outbox);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
