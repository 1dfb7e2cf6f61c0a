//! Outcomes back to the app: a channel of notices from the relays of this process, so a
//! desktop app can mark a record "synced" when its event is delivered, or show a dead one.
//!
//! The channel is bounded and a relay never waits for it: a subscriber that falls behind
//! loses the notices that do not fit, and they are counted
//! ([`Outbox::lost_notices`](crate::Outbox::lost_notices)). What a notice says can always be
//! asked again from the file with [`Outbox::status`](crate::Outbox::status), so a lost
//! notice costs a query, never a wrong answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::admin::State;
use crate::error::Result;
use crate::Outbox;

/// Notices one subscriber's channel holds before new ones are lost.
pub const NOTICE_CAPACITY: usize = 4096;

/// What happened to one event at one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryNotice {
    /// The event's id, as [`Enqueued::event_id`](crate::Enqueued::event_id) gave it.
    pub event_id: String,
    /// The destination.
    pub destination: String,
    /// Delivered, dead or expired.
    pub outcome: DeliveryOutcome,
    /// When the relay recorded it (unix ms, the outbox's clock).
    pub at_ms: i64,
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryOutcome {
    /// The receiver (or broker) acknowledged it.
    Delivered,
    /// Given up on, with the reason.
    Dead {
        /// The last error.
        error: String,
    },
    /// Not delivered by its deadline ([`Event::expires_in`](crate::Event::expires_in)).
    Expired,
}

/// Where one event stands at one destination, as the file says now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryStatus {
    /// The destination.
    pub destination: String,
    /// Pending, delivered, dead or expired.
    pub state: State,
    /// When it was delivered, dead-lettered or expired (unix ms), if it was.
    pub at_ms: Option<i64>,
}

/// The subscribers of one outbox.
#[derive(Debug, Default)]
pub(crate) struct Subscribers {
    senders: Mutex<Vec<Sender<DeliveryNotice>>>,
    lost: AtomicU64,
}

impl Subscribers {
    pub fn subscribe(&self) -> Receiver<DeliveryNotice> {
        let (tx, rx) = crossbeam_channel::bounded(NOTICE_CAPACITY);
        self.lock().push(tx);
        rx
    }

    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Hands `notice` to every subscriber without waiting: a full channel loses it (counted),
    /// a dropped receiver is forgotten.
    pub fn publish(&self, notice: impl FnOnce() -> DeliveryNotice) {
        let mut senders = self.lock();
        if senders.is_empty() {
            return;
        }
        let notice = notice();
        senders.retain(|tx| match tx.try_send(notice.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.lost.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Sender<DeliveryNotice>>> {
        self.senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Outbox {
    /// A channel of delivery notices from the relays started from this `Outbox` (or its
    /// clones): one per event and destination that is delivered or dead-lettered from now
    /// on. Bounded ([`NOTICE_CAPACITY`]); the relay never waits for it, so a subscriber
    /// that falls behind loses notices, counted in [`lost_notices`](Self::lost_notices).
    /// Drop the receiver to unsubscribe.
    pub fn subscribe(&self) -> Receiver<DeliveryNotice> {
        self.subscribers().subscribe()
    }

    /// Notices lost because a subscriber's channel was full.
    pub fn lost_notices(&self) -> u64 {
        self.subscribers().lost()
    }

    /// Where the event `event_id` stands at each of its destinations, from the file (empty
    /// for an id the file does not hold, or no longer: pruned).
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn status(&self, event_id: &str) -> Result<Vec<DeliveryStatus>> {
        let conn = self.connection()?;
        let mut stmt = conn.prepare_cached(
            "SELECT destination, delivered_at, dead_at, expired_at, exported_at FROM outbox_events
              INDEXED BY outbox_events_event_id WHERE event_id = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map([event_id], |r| {
                let delivered_at: Option<i64> = r.get(1)?;
                let dead_at: Option<i64> = r.get(2)?;
                let expired_at: Option<i64> = r.get(3)?;
                let exported_at: Option<i64> = r.get(4)?;
                let (state, at_ms) = match (delivered_at, expired_at, exported_at, dead_at) {
                    (Some(at), _, _, _) => (State::Delivered, Some(at)),
                    (None, Some(at), _, _) => (State::Expired, Some(at)),
                    (None, None, Some(at), _) => (State::Exported, Some(at)),
                    (None, None, None, Some(at)) => (State::Dead, Some(at)),
                    (None, None, None, None) => (State::Pending, None),
                };
                Ok(DeliveryStatus {
                    destination: r.get(0)?,
                    state,
                    at_ms,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}
