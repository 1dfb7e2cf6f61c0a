//! An async app whose database layer is sqlx: it cannot hand over a `rusqlite::Transaction`,
//! so it writes each order and its event in its own sqlx transaction through the SQL contract
//! (`INSERT INTO outbox_enqueue`), and the crate's relay, opened on the same file, delivers
//! them. A bad event fails its statement with `outbox: …`; the transaction is still the app's
//! to roll back or to commit without it.
//!
//! ```text
//! cargo run --example sqlx_app            # 100 orders
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_server::{HttpServer, Response};
use sqlite_outbox::{Outbox, RelayConfig};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let orders: i64 = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|_| format!("not an order count: {n}"))?,
        None => 100,
    };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.db");
    // The crate creates (or migrates) the outbox's tables on open; the app's own tables are
    // the app's, here made through sqlx.
    let outbox = Outbox::open(&path)?;
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5)),
        )
        .await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        .execute(&pool)
        .await?;

    let received = Arc::new(AtomicUsize::new(0));
    let counted = received.clone();
    let server = HttpServer::bind(("127.0.0.1", 0), move |request| {
        // The relay also tells the receiver what became of every event (its streams'
        // accounting, for `outbox ingest`): answered, not counted.
        if !request.is_stream_accounting() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        Response::status(204)
    })?;
    let relay = outbox
        .relay(RelayConfig::http(format!(
            "http://127.0.0.1:{}/events",
            server.port()
        )))
        .start()?;

    for id in 1..=orders {
        // The order and its event, one sqlx transaction. Its first statement writes, so it
        // takes the write lock at once (waiting up to the busy timeout if another holds it).
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, total) VALUES (?, ?)")
            .bind(id)
            .bind(100 + id)
            .execute(&mut *tx)
            .await?;
        let data = serde_json::json!({"id": id, "total": 100 + id}).to_string();
        sqlx::query(
            "INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)",
        )
        .bind("order.placed")
        .bind(data)
        .bind(format!("customer-{}", id % 7))
        .bind(format!("order-{id}-placed"))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    println!("committed {orders} orders, each with its event, through sqlx");

    // A bad event: the statement fails with the contract's message, the order stays in the
    // transaction, and the app decides (here: roll back).
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, total) VALUES (?, ?)")
        .bind(orders + 1)
        .bind(1)
        .execute(&mut *tx)
        .await?;
    let refused = sqlx::query("INSERT INTO outbox_enqueue (type, data) VALUES (?, ?)")
        .bind("order.placed")
        .bind("not json")
        .execute(&mut *tx)
        .await;
    match refused {
        Err(e) => println!("refused: {e}"),
        Ok(_) => return Err("a bad event was accepted".into()),
    }
    tx.rollback().await?;

    // The relay polls the file for other connections' commits; wait until all arrived.
    let all = usize::try_from(orders)?;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while received.load(Ordering::SeqCst) < all {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let report = tokio::task::spawn_blocking(move || relay.shutdown()).await?;
    let stats = outbox.stats()?;
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&pool)
        .await?;
    println!(
        "delivered {}, {} pending, {} received, {} orders stored; relay shut down ({} abandoned)",
        stats.delivered,
        stats.pending,
        received.load(Ordering::SeqCst),
        stored,
        report.abandoned
    );
    pool.close().await;
    server.stop();
    if waited.is_err() {
        return Err(format!(
            "only {} of {all} delivered in 30 s",
            received.load(Ordering::SeqCst)
        )
        .into());
    }
    Ok(())
}
