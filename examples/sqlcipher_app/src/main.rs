//! An app whose file is encrypted with SQLCipher: `sqlcipher-app DB KEY URL ORDERS` places
//! ORDERS orders, each with its event in the same transaction, and runs the outbox's relay
//! until every event is delivered to URL (at most a minute).
//!
//! The key goes to every connection the outbox opens through `on_connect`, the first
//! statement on each, as SQLCipher requires; the app's own connection sets it the same way.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use sqlite_outbox::rusqlite::Connection;
use sqlite_outbox::{Event, Outbox, RelayConfig};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, key, url, orders] = args.as_slice() else {
        eprintln!("usage: sqlcipher-app DB KEY URL ORDERS");
        return ExitCode::from(2);
    };
    let Ok(orders) = orders.parse::<i64>() else {
        eprintln!("ORDERS must be a number, not {orders:?}");
        return ExitCode::from(2);
    };
    match run(db, key, url, orders) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(db: &str, key: &str, url: &str, orders: i64) -> Result<(), Box<dyn std::error::Error>> {
    // The app's own connection: its key first, then its own schema.
    let mut conn = Connection::open(db)?;
    conn.pragma_update(None, "key", key)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)",
    )?;
    let cipher: String = conn.query_row("PRAGMA cipher_version", [], |r| r.get(0))?;
    println!("SQLCipher {cipher}");

    let key_for_outbox = key.to_owned();
    let outbox = Outbox::builder()
        .on_connect(move |c| c.pragma_update(None, "key", &key_for_outbox))
        .open(db)?;

    for n in 0..orders {
        let tx = conn.transaction()?;
        tx.execute("INSERT INTO orders (total_cents) VALUES (?1)", [100 + n])?;
        let id = tx.last_insert_rowid();
        let _ = outbox.enqueue(
            &tx,
            Event::new("order.placed", serde_json::json!({ "id": id })),
        )?;
        tx.commit()?;
    }
    outbox.notify();

    let relay = outbox.relay(RelayConfig::http(url)).start()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox.stats()?.pending > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = relay.shutdown();
    let stats = outbox.stats()?;
    println!(
        "delivered {} pending {} dead {} (shutdown: {report:?})",
        stats.delivered, stats.pending, stats.dead
    );
    if stats.pending > 0 || stats.dead > 0 {
        return Err(format!("{} events not delivered", stats.pending + stats.dead).into());
    }
    Ok(())
}
