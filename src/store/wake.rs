//! Waking the relays of this process after a local commit, so they claim at once instead of
//! at their next poll.

use std::sync::Mutex;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// The wake channels of the relays started from one outbox. Each relay owns its receiver;
/// the outbox keeps only the senders, and forgets one when its relay has gone.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    senders: Mutex<Vec<Sender<()>>>,
}

impl Wakers {
    /// A new relay's wake channel. Capacity one: a wake-up that is already pending covers
    /// every commit after it.
    pub fn register(&self) -> Receiver<()> {
        let (tx, rx) = bounded(1);
        self.lock().push(tx);
        rx
    }

    /// Wakes every running relay. Never blocks on a relay.
    pub fn wake_all(&self) {
        self.lock()
            .retain(|tx| !matches!(tx.try_send(()), Err(TrySendError::Disconnected(()))));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Sender<()>>> {
        // The list stays valid whatever a panicking holder did: senders only come and go.
        self.senders.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relay_is_woken_and_gone_ones_are_forgotten() {
        let wakers = Wakers::default();
        let a = wakers.register();
        let b = wakers.register();
        wakers.wake_all();
        wakers.wake_all(); // a pending wake-up absorbs the second
        assert_eq!((a.try_iter().count(), b.try_iter().count()), (1, 1));
        drop(b);
        wakers.wake_all();
        assert_eq!(wakers.lock().len(), 1);
        assert_eq!(a.try_iter().count(), 1);
    }
}
