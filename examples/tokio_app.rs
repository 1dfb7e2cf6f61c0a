//! An async web app on tokio that places orders from its handlers: each handler commits the
//! order and its `order.placed` event in one SQLite transaction, on tokio's blocking pool
//! (`spawn_blocking`), so a commit waiting for the write lock never stalls the runtime's
//! worker threads. The relay needs no runtime: it runs on its own threads beside tokio's, and
//! is shut down on Ctrl-C (or SIGTERM) or once every order reached the receiver.
//!
//! ```text
//! cargo run --example tokio_app              # 200 orders, then a clean shutdown
//! cargo run --example tokio_app -- 50 --until-signal   # 50 orders, then wait for Ctrl-C
//! ```

#[path = "../tests/common/http_server.rs"]
mod http_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_server::{HttpServer, Response};
use serde_json::json;
use sqlite_outbox::{Event, Outbox, RelayConfig};

/// What a request handler does: the order and its event, one transaction. The closure runs on
/// the blocking pool; the handler awaits it like any other I/O.
async fn place_order(outbox: Outbox, id: i64, total: i64) -> Result<String, sqlite_outbox::Error> {
    let committed = tokio::task::spawn_blocking(move || {
        let event_id = outbox.transaction(|tx| {
            tx.execute(
                "INSERT INTO orders (id, total) VALUES (?1, ?2)",
                (id, total),
            )?;
            let event = Event::new("order.placed", json!({"id": id, "total": total}))
                .partition_key(format!("customer-{}", id % 7));
            Ok::<_, sqlite_outbox::Error>(outbox.enqueue(tx, event)?.event_id().to_owned())
        })?;
        // Wakes this process's relay at once instead of at its next poll.
        outbox.notify();
        Ok(event_id)
    })
    .await;
    committed.map_err(|e| sqlite_outbox::Error::InvalidConfig(format!("handler task: {e}")))?
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => drop(tokio::signal::ctrl_c().await),
        }
    }
    #[cfg(not(unix))]
    drop(tokio::signal::ctrl_c().await);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let orders: i64 = match args.next() {
        Some(n) => n.parse().map_err(|_| format!("not an order count: {n}"))?,
        None => 200,
    };
    let until_signal = args.any(|a| a == "--until-signal");

    let dir = tempfile::tempdir()?;
    let outbox = Outbox::open(dir.path().join("shop.db"))?;
    outbox
        .connection()?
        .execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")?;
    // The receiver the events go to: a local one that counts what arrives.
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
    // The relay on its own threads; starting it blocks only briefly (it opens its connections).
    let relay = outbox
        .relay(RelayConfig::http(format!(
            "http://127.0.0.1:{}/events",
            server.port()
        )))
        .start()?;

    // The handlers, concurrently, as a web framework would run them.
    let mut handlers = tokio::task::JoinSet::new();
    for id in 1..=orders {
        handlers.spawn(place_order(outbox.clone(), id, 100 + id));
    }
    let mut placed = 0;
    while let Some(done) = handlers.join_next().await {
        done??;
        placed += 1;
    }
    println!("placed {placed} orders from async handlers");
    if until_signal {
        println!("ready: waiting for Ctrl-C or SIGTERM");
        shutdown_signal().await;
    } else {
        // Until the receiver has them all (the timeout bounds a broken run).
        let all = usize::try_from(orders)?;
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while received.load(Ordering::SeqCst) < all {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        if waited.is_err() {
            return Err(format!(
                "only {} of {all} delivered in 30 s",
                received.load(Ordering::SeqCst)
            )
            .into());
        }
    }
    // Shutdown waits (bounded) for requests in flight: off the runtime's threads too.
    let report = tokio::task::spawn_blocking(move || relay.shutdown()).await?;
    let stats = outbox.stats()?;
    println!(
        "delivered {}, {} pending, {} received; relay shut down ({} released unsent, {} abandoned)",
        stats.delivered,
        stats.pending,
        received.load(Ordering::SeqCst),
        report.released,
        report.abandoned
    );
    server.stop();
    Ok(())
}
