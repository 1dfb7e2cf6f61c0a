//! Outcomes back to the app: a channel of notices from the relays of this process, so a
//! desktop app can mark a record "synced" when its event is delivered, or show a dead one.
//!
//! The channel is bounded and a relay never waits for it: a subscriber that falls behind
//! loses the notices that do not fit, and they are counted
//! ([`Outbox::lost_notices`](crate::Outbox::lost_notices)). What a notice says can always be
//! asked again from the file with [`Outbox::status`](crate::Outbox::status), so a lost
//! notice costs a query, never a wrong answer.

use portable_atomic::AtomicU64;
use std::sync::atomic::Ordering;
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
    /// The destination has spent its data budget
    /// ([`Destination::budget`](crate::Destination::budget)): its events below the exempt
    /// priority wait until `period_ends_ms`. A notice of the destination, not of one
    /// event: its `event_id` is empty.
    BudgetSpent {
        /// When the period ends and the events go again (unix ms).
        period_ends_ms: i64,
    },
    /// A new period of the destination's data budget began: its events go again. A notice
    /// of the destination: its `event_id` is empty.
    BudgetRenewed,
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

/// A subscription to delivery notices, from [`Outbox::subscribe`](crate::Outbox::subscribe).
/// Drop it to unsubscribe.
///
/// The crate's own type (not a channel crate's receiver), so the app is tied to no channel
/// crate's version. Every way to read it is bounded in time: a blocking wait always has a
/// timeout.
#[derive(Debug)]
pub struct Notices {
    rx: Receiver<DeliveryNotice>,
}

impl Notices {
    /// The next notice, waiting up to `timeout`; `None` if none came within it (or the
    /// outbox is gone).
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<DeliveryNotice> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next notice if one is waiting, without waiting.
    pub fn try_recv(&self) -> Option<DeliveryNotice> {
        self.rx.try_recv().ok()
    }

    /// Every notice waiting now, without waiting for more.
    pub fn try_iter(&self) -> impl Iterator<Item = DeliveryNotice> + '_ {
        self.rx.try_iter()
    }

    /// How many notices are waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no notice is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// The subscribers of one outbox.
#[derive(Debug, Default)]
pub(crate) struct Subscribers {
    senders: Mutex<Vec<Sender<DeliveryNotice>>>,
    lost: AtomicU64,
}

impl Subscribers {
    pub fn subscribe(&self) -> Notices {
        let (tx, rx) = crossbeam_channel::bounded(NOTICE_CAPACITY);
        self.lock().push(tx);
        Notices { rx }
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
