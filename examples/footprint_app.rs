//! The smallest app that uses the crate for its main job, for the bench's footprint rows: it
//! opens an outbox, commits a business row and its event in one transaction, and runs an
//! HTTPS relay for a moment. `footprint_bare` does the same with only rusqlite and ureq; the
//! difference of their stripped release sizes is the crate's own share of a binary.
//!
//! ```text
//! cargo run --release --example footprint_app -- app.db https://127.0.0.1:1/hooks
//! ```

use std::time::Duration;

use serde_json::json;
use sqlite_outbox::{Event, Outbox, RelayConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "footprint.db".into());
    let url = args
        .next()
        .unwrap_or_else(|| "https://127.0.0.1:1/hooks".into());
    let outbox = Outbox::open(&path)?;
    outbox.transaction(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)",
            (),
        )?;
        tx.execute("INSERT INTO orders (total) VALUES (?1)", (990,))?;
        let _ = outbox.enqueue(tx, Event::new("order.created", json!({"total": 990})))?;
        Ok::<_, sqlite_outbox::Error>(())
    })?;
    let relay = outbox.relay(RelayConfig::http(url)).start()?;
    std::thread::sleep(Duration::from_millis(200));
    let _ = relay.shutdown();
    Ok(())
}
