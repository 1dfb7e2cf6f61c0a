//! The database threads of `outbox ingest`: a fixed number of named threads, each taking a
//! pooled PostgreSQL connection per job. The HTTP side never blocks on PostgreSQL; it hands
//! a job over a bounded queue and awaits the answer, so the threads that talk to PostgreSQL
//! are bounded by configuration, not by the number of clients.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use r2d2_postgres::PostgresConnectionManager;

use super::prepared::Manager;

use sqlite_outbox::receive::PgTls;

use super::store::{self, Columns};

/// How long a job waits for a pooled connection before the request is answered 503.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// The shortest pause between two attempts to create the tables while PostgreSQL is down.
const MIGRATION_RETRY: Duration = Duration::from_secs(1);

type Pool = r2d2::Pool<Manager>;

/// What a job came to.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Committed: how many of the request's events were new.
    Stored(u64),
    /// PostgreSQL cannot be reached, is not migrated yet, or failed for a reason worth a
    /// retry: 503.
    Unavailable(String),
    /// PostgreSQL refused the data itself (SQLSTATE class 22, data exception): 400.
    Rejected(String),
    /// The request would give its source more streams than `--max-streams-per-source`
    /// allows, or a stream more fates than it may hold: 422, nothing stored; the refusal's
    /// reason (for the metrics) and why.
    Refused { reason: &'static str, why: String },
    /// Every database thread is busy and the queue is full: 503, retry soon.
    Overloaded,
}

/// A unit of work and where its outcome goes.
pub(crate) struct Job {
    pub work: Work,
    pub reply: tokio::sync::oneshot::Sender<Outcome>,
}

/// What a job asks for: store a request's events (the health probe and the key reloads
/// have their own connection, see [`probe`](super::probe)).
pub(crate) enum Work {
    Store(Box<Columns>),
}

/// The database threads, their queue and their pool.
pub(crate) struct Workers {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// What the threads share.
struct Shared {
    pool: Pool,
    /// Whether the tables exist in their current version.
    ready: AtomicBool,
    /// When creating the tables was last tried (one thread at a time tries).
    last_migration: Mutex<Option<Instant>>,
    /// The most streams one source may have.
    max_streams_per_source: usize,
    /// Whether the streams' summaries are kept (off only in a bench, to measure them).
    summaries: bool,
}

impl Workers {
    /// Starts `threads` database threads behind a queue of `queue` jobs. Until the health
    /// probe has created or migrated the tables, every job is answered 503.
    pub fn start(
        config: postgres::Config,
        tls: PgTls,
        threads: usize,
        queue: usize,
        max_streams_per_source: usize,
        summaries: bool,
    ) -> std::io::Result<Workers> {
        let manager = Manager(PostgresConnectionManager::new(config, tls));
        let pool = r2d2::Pool::builder()
            .max_size(threads as u32)
            .min_idle(Some(0))
            // A broken connection is found by its error and dropped (`has_broken`); a check
            // per checkout would cost a round trip per request.
            .test_on_check_out(false)
            .connection_timeout(CONNECTION_TIMEOUT)
            .build_unchecked(manager);
        let shared = Arc::new(Shared {
            pool,
            ready: AtomicBool::new(false),
            last_migration: Mutex::new(None),
            max_streams_per_source,
            summaries,
        });
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(queue);
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads {
            let shared = Arc::clone(&shared);
            let jobs: Receiver<Job> = jobs_rx.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("outbox-ingest-db-{index}"))
                    .spawn(move || {
                        for job in jobs {
                            let outcome = shared.run(job.work);
                            // The HTTP side may have given up (its client left): fine.
                            let _ = job.reply.send(outcome);
                        }
                    })?,
            );
        }
        Ok(Workers {
            jobs: Some(jobs_tx),
            threads: handles,
        })
    }

    /// Queues `job`; false when the queue is full (the server is overloaded) or closed.
    pub fn submit(&self, job: Job) -> bool {
        match &self.jobs {
            Some(jobs) => match jobs.try_send(job) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        }
    }

    /// Jobs waiting for a database thread.
    pub fn queue_depth(&self) -> usize {
        self.jobs.as_ref().map_or(0, Sender::len)
    }

    /// Closes the queue and joins the threads once they finished the jobs already queued.
    pub fn shutdown(&mut self) {
        drop(self.jobs.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    fn run(&self, work: Work) -> Outcome {
        if let Err(e) = self.ensure_tables() {
            return Outcome::Unavailable(format!("PostgreSQL is not ready: {e:#}"));
        }
        let mut client = match self.pool.get() {
            Ok(client) => client,
            Err(e) => return Outcome::Unavailable(format!("PostgreSQL is unreachable: {e:#}")),
        };
        let result = match &work {
            Work::Store(columns) => store::store(
                &mut client,
                columns,
                self.max_streams_per_source,
                self.summaries,
            )
            .map(Outcome::Stored),
        };
        result.unwrap_or_else(|e| match e {
            store::StoreError::Postgres(e) => classify(&e),
            store::StoreError::Refused { reason, why } => Outcome::Refused { reason, why },
        })
    }

    /// Whether the tables are at this build's version; looks at most once a second until
    /// they are. The threads here never create or migrate them: the health probe's thread
    /// does (see `probe`), as long as it takes on a big table, while every request is
    /// answered 503 with Retry-After.
    fn ensure_tables(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut last = self
            .last_migration
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        if last.is_some_and(|at| at.elapsed() < MIGRATION_RETRY) {
            return Err("the tables are being created or migrated; retry shortly".into());
        }
        *last = Some(Instant::now());
        let mut client = self.pool.get().map_err(|e| e.to_string())?;
        let wanted = sqlite_outbox::receive::pg_schema_version();
        let found: Option<i32> = client
            .client
            .query_one("SELECT max(version) FROM outbox_pg_migrations", &[])
            .ok()
            .and_then(|row| row.get(0));
        if found.is_none_or(|found| found < wanted) {
            return Err(format!(
                "the tables are being created or migrated (version {} of {wanted}); retry \
                 shortly",
                found.unwrap_or(0)
            ));
        }
        self.ready.store(true, Ordering::Release);
        log::info!("ingest: PostgreSQL tables ready");
        Ok(())
    }
}

/// A data exception (SQLSTATE class 22: a value PostgreSQL cannot take, like a NUL
/// character in JSON) is the request's fault and would fail again: 400. Anything else (a
/// lost connection, a shutdown, a serialization failure, too many connections) may pass on
/// a retry: 503.
fn classify(error: &postgres::Error) -> Outcome {
    // The server's own words ("canceling statement due to statement timeout"), where the
    // error's display says only "db error".
    let why = match error.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => error.to_string(),
    };
    match error.code() {
        Some(code) if code.code().starts_with("22") => {
            Outcome::Rejected(format!("PostgreSQL refused the data: {why}"))
        }
        _ => Outcome::Unavailable(format!("PostgreSQL failed: {why}")),
    }
}
