//! The baseline of the bench's footprint rows: what `footprint_app` does, written with only
//! rusqlite (bundled) and ureq, the two crates any SQLite app that posts over HTTPS links
//! anyway: a business row and an event row in one transaction, then one HTTPS POST of it.
//!
//! ```text
//! cargo run --release --example footprint_bare -- bare.db https://127.0.0.1:1/hooks
//! ```

use rusqlite::Connection;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "footprint-bare.db".into());
    let url = args
        .next()
        .unwrap_or_else(|| "https://127.0.0.1:1/hooks".into());
    let mut conn = Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "wal")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER);
         CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
    )?;
    let tx = conn.transaction()?;
    tx.execute("INSERT INTO orders (total) VALUES (?1)", (990,))?;
    tx.execute(
        "INSERT INTO events (body) VALUES (?1)",
        (r#"{"total":990}"#,),
    )?;
    tx.commit()?;
    let body: String = conn.query_row("SELECT body FROM events ORDER BY id LIMIT 1", (), |r| {
        r.get(0)
    })?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .build()
        .into();
    if let Err(e) = agent
        .post(&url)
        .header("content-type", "application/json")
        .send(body)
    {
        eprintln!("not delivered: {e}");
    }
    Ok(())
}
