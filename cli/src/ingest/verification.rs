//! The CPU-heavy part of a request, on threads of its own (`outbox-ingest-verify-N`): the
//! gzip decoding, the signature over the decoded body, the CloudEvents parse and the
//! columns to store. On the I/O threads a large compressed body with garbage signatures
//! once cost milliseconds a request, enough for a few megabytes a second of upload to
//! slow every other connection and `/healthz`; here the work waits in a bounded queue, and
//! a full queue is answered 503 with `Retry-After` at once.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TrySendError};

use sqlite_outbox::receive::{
    decode_body, verify_request_for, DecodeError, KeyRegistry, ReceiveError,
};

use super::store::{unstorable, Columns};

/// Jobs waiting for a verification thread, at most, per thread: each holds one body.
const QUEUE_PER_THREAD: usize = 4;

/// A request's body and what is needed to check it.
pub(crate) struct Request {
    pub registry: Arc<KeyRegistry>,
    pub headers: Vec<(String, String)>,
    pub content_encoding: Option<String>,
    pub body: Vec<u8>,
    pub max_body: usize,
    pub now: i64,
}

/// What checking a request came to.
pub(crate) enum Checked {
    /// Verified, parsed, and ready to store; with the size of the decoded body (the
    /// request's body itself when not compressed).
    Ready {
        columns: Box<Columns>,
        decoded: usize,
    },
    /// Decoded past `--max-body` (or a ratio of 100): 413.
    TooLarge(String),
    /// Not decodable, not CloudEvents, or nothing in it: 400.
    Malformed(String),
    /// Refused by the key registry: a signature by none of the source's keys (401), an
    /// event of another source (403).
    Refused(ReceiveError),
    /// Events PostgreSQL cannot hold, each with why: 422.
    Unstorable(Vec<(String, String)>),
}

/// Decodes, verifies, parses and turns into columns.
pub(crate) fn check(request: Request) -> Checked {
    let body = match decode_body(
        request.content_encoding.as_deref(),
        &request.body,
        request.max_body,
    ) {
        Ok(body) => body,
        Err(e @ DecodeError::TooLarge { .. }) => return Checked::TooLarge(e.to_string()),
        Err(e) => return Checked::Malformed(e.to_string()),
    };
    let events = match verify_request_for(&request.registry, &request.headers, &body, request.now) {
        Ok(events) => events,
        Err(ReceiveError::Body(e)) => return Checked::Malformed(format!("not CloudEvents: {e:#}")),
        Err(e) => return Checked::Refused(e),
    };
    let refused = unstorable(&events);
    if !refused.is_empty() {
        return Checked::Unstorable(refused);
    }
    match Columns::new(events) {
        Ok(columns) if columns.len() == 0 && columns.reports.len() == 0 => {
            Checked::Malformed("the batch holds no event".into())
        }
        Ok(columns) => Checked::Ready {
            columns: Box::new(columns),
            decoded: body.len(),
        },
        Err(why) => Checked::Malformed(why),
    }
}

/// A job: the request, and where its outcome goes.
struct Job {
    request: Request,
    reply: tokio::sync::oneshot::Sender<Checked>,
}

/// The verification threads and their bounded queue.
pub(crate) struct VerifyPool {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl VerifyPool {
    /// Starts `threads` named threads.
    pub fn start(threads: usize) -> std::io::Result<VerifyPool> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(threads * QUEUE_PER_THREAD);
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads {
            let jobs = jobs_rx.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("outbox-ingest-verify-{index}"))
                    .spawn(move || {
                        for job in jobs {
                            // The request may be gone (its client left): fine.
                            let _ = job.reply.send(check(job.request));
                        }
                    })?,
            );
        }
        Ok(VerifyPool {
            jobs: Some(jobs_tx),
            threads: handles,
        })
    }

    /// Queues `request`; `None` when the queue is full (or closed): answer 503.
    pub fn submit(&self, request: Request) -> Option<tokio::sync::oneshot::Receiver<Checked>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.jobs.as_ref()?.try_send(Job { request, reply }) {
            Ok(()) => Some(answer),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => None,
        }
    }

    /// Closes the queue and joins the threads once they finished what was queued.
    pub fn shutdown(&mut self) {
        drop(self.jobs.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for VerifyPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}
