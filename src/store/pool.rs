//! The pool of connections to one outbox file, and the one thread that keeps it filled.
//!
//! r2d2 opens connections on a thread pool of its own. Ours has one thread, `outbox-pool`,
//! and when the pool goes (the last `Outbox` clone dropped, or an open that failed) this
//! waits, boundedly, until that thread has finished whatever it was doing: a connection it
//! was opening or closing then never outlives the `Outbox`. A thread still inside SQLite
//! when the process exits races the exit-time cleanup of the libraries SQLite calls into
//! (SQLCipher's OpenSSL), which can crash a process that did nothing wrong.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use crate::error::Result;
use crate::store::connection_manager::SqliteManager;

/// How long dropping the pool waits for its thread to finish the task it is on: an open
/// waits out at most the busy timeout, so this only bounds a wedged file system.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// A pool of connections to one outbox database file. Dereferences to r2d2's pool.
pub(crate) struct Pool {
    connections: Option<r2d2::Pool<SqliteManager>>,
    maintenance: Arc<ScheduledThreadPool>,
}

impl Pool {
    /// Opens the pool: up to `max_size` connections, one kept idle, a borrower waiting up to
    /// `wait` for one.
    pub(crate) fn build(manager: SqliteManager, max_size: u32, wait: Duration) -> Result<Pool> {
        let maintenance = Arc::new(
            ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("outbox-pool")
                .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
                .build(),
        );
        let built = r2d2::Pool::builder()
            .max_size(max_size)
            .min_idle(Some(1))
            .connection_timeout(wait)
            .thread_pool(maintenance.clone())
            .build(manager);
        match built {
            Ok(connections) => Ok(Pool {
                connections: Some(connections),
                maintenance,
            }),
            Err(e) => {
                // The thread may be retrying the open that failed.
                finish_current_task(&maintenance);
                Err(e.into())
            }
        }
    }
}

impl Deref for Pool {
    type Target = r2d2::Pool<SqliteManager>;
    fn deref(&self) -> &Self::Target {
        // Only `drop` takes it.
        self.connections
            .as_ref()
            .unwrap_or_else(|| unreachable!("the pool is taken only when dropped"))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The idle connections close here, on the dropping thread; one the maintenance
        // thread is opening closes there, before the task queued behind it runs.
        drop(self.connections.take());
        finish_current_task(&self.maintenance);
    }
}

/// Queues a task behind whatever the thread is doing and waits (up to [`FINISH_WAIT`]) for it
/// to run. Tasks scheduled for later (r2d2's retries and reaping) are discarded when the last
/// handle to the thread pool goes.
fn finish_current_task(maintenance: &ScheduledThreadPool) {
    let (done, finished) = crossbeam_channel::bounded(1);
    maintenance.execute(move || {
        let _ = done.send(());
    });
    if finished.recv_timeout(FINISH_WAIT).is_err() {
        log::warn!(
            "the outbox's connection pool was dropped with its thread (outbox-pool) still \
             opening or closing a connection after {FINISH_WAIT:?}: the file system holding \
             the database may be stuck; going on without waiting for it"
        );
    }
}
