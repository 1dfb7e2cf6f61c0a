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

use crate::state::State;

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
