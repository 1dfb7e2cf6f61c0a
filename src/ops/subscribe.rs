//! Outcomes back to the app, the [`Outbox`]'s side: subscribing to the relays' notices, and
//! where an event stands, read from the file.

use crate::error::Result;
use crate::observe::notices::{DeliveryStatus, Notices};
use crate::outbox::Outbox;
use crate::state::State;

impl Outbox {
    /// A channel of delivery notices from the relays started from this `Outbox` (or its
    /// clones): one per event and destination that is delivered or dead-lettered from now
    /// on. Bounded ([`NOTICE_CAPACITY`](crate::notices::NOTICE_CAPACITY)); the relay never waits for it, so a subscriber
    /// that falls behind loses notices, counted in [`lost_notices`](Self::lost_notices).
    /// Drop the [`Notices`] to unsubscribe.
    pub fn subscribe(&self) -> Notices {
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
