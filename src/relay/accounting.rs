//! The accountant: a relay thread that tells each destination what became of every number
//! of its streams ([`StreamAccount`], sent as an event of type [`ACCOUNTING_TYPE`] through
//! the destination's own transport, signed like any event).
//!
//! It tells a stream's state when its fates changed (an event expired, dropped, coalesced,
//! dead, purged or exported), at least every accounting interval while the destination is
//! reachable, and once more as the relay stops, so a `relay --until-empty` run leaves the
//! destination's view up to date. The accounting is computed from the file each time, never
//! stored as an event: no storage limit can drop it and it never expires. A destination that
//! is down is skipped (its next round tells the latest state); an answer that is not 2xx is
//! logged and the state told again next round.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::outbox::Outbox;
use crate::relay::gate::Gate;
use crate::store::stream_accounts;
use crate::transport::{Attempt, OutboundEvent, Transport};
use crate::wire::{Ranges, StreamAccount, ACCOUNTING_TYPE};

/// The longest wait between two looks at the fates.
const MOST_CHECK: Duration = Duration::from_secs(15);

/// One destination the accountant keeps track of.
pub(crate) struct Told {
    pub name: String,
    /// Whether it takes accounting ([`Destination::accounting`](crate::Destination::accounting));
    /// either way its streams' synced-through numbers are kept.
    pub tells: bool,
    pub transport: Arc<dyn Transport>,
    pub gate: Arc<Gate>,
}

/// What a stream was last told, and when.
struct LastTold {
    account: StreamAccount,
    at: Instant,
}

/// The accountant thread's state.
pub(crate) struct Accountant {
    outbox: Outbox,
    destinations: Vec<Told>,
    stop: Receiver<bool>,
    interval: Duration,
    /// Per `(destination, source)`.
    last: HashMap<(String, String), LastTold>,
    started: Instant,
    /// Its own connection (opened at the first look): its `PRAGMA data_version` moves only
    /// when another connection commits, so an idle file costs a look one pragma.
    conn: Option<rusqlite::Connection>,
    /// The file's data version at the last round, and when that round was.
    seen: Option<(i64, Instant)>,
}

impl Accountant {
    /// An accountant for `destinations`, stopping when `stop` says so (after a last round
    /// if it says `true`) or disconnects.
    pub(crate) fn new(
        outbox: Outbox,
        destinations: Vec<Told>,
        stop: Receiver<bool>,
        interval: Duration,
    ) -> Accountant {
        Accountant {
            outbox,
            destinations,
            stop,
            interval,
            last: HashMap::new(),
            started: Instant::now(),
            conn: None,
            seen: None,
        }
    }

    /// Looks every quarter interval (at most 15 s), tells what is due, and tells the latest
    /// state once more when stopped.
    pub(crate) fn run(mut self) {
        let check = (self.interval / 4).clamp(Duration::from_millis(250), MOST_CHECK);
        loop {
            match self.stop.recv_timeout(check) {
                Err(RecvTimeoutError::Timeout) => {
                    if self.file_changed() {
                        self.round(false);
                    }
                }
                Ok(true) => {
                    self.round(true);
                    return;
                }
                Ok(false) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Whether a round is due: another connection committed since the last one (the
    /// writer's acks, the app's events), or an interval passed (an unreachable destination
    /// may be back). Unknown (no connection) counts as changed.
    fn file_changed(&mut self) -> bool {
        if self.conn.is_none() {
            self.conn = self.outbox.unpooled_connection().ok();
        }
        let version = self.conn.as_ref().and_then(|conn| {
            conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .ok()
        });
        match (version, self.seen) {
            (Some(now), Some((then, at))) => now != then || at.elapsed() >= self.interval,
            _ => true,
        }
    }

    /// One look at every destination's streams; `last_round` tells every stream whose state
    /// changed at all since it was last told.
    fn round(&mut self, last_round: bool) {
        let version = self.conn.as_ref().and_then(|conn| {
            conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .ok()
        });
        self.seen = version.map(|v| (v, Instant::now()));
        for index in 0..self.destinations.len() {
            let destination = &self.destinations[index];
            if destination.gate.is_down() || destination.gate.is_closed() {
                continue;
            }
            let name = destination.name.clone();
            let read = match self.conn.as_mut() {
                Some(conn) => stream_accounts::read(conn, &name),
                None => self
                    .outbox
                    .connection()
                    .and_then(|mut conn| stream_accounts::read(&mut conn, &name)),
            };
            let accounts = match read {
                Ok(accounts) => accounts,
                Err(e) => {
                    log::warn!(
                        "destination {name}: the streams' accounting could not be read: {e}"
                    );
                    continue;
                }
            };
            let tells = self.destinations[index].tells;
            for stream in accounts {
                let key = (name.clone(), stream.source);
                if tells && self.is_due(&key, &stream.account, last_round) {
                    self.tell(index, key.clone(), stream.account.clone());
                }
                self.advance_synced(&key, &stream.account, &stream.lost);
            }
        }
    }

    /// Moves the stream's synced-through number as far as deliveries and the fates the
    /// destination took allow; a lost number stops it.
    fn advance_synced(&self, key: &(String, String), account: &StreamAccount, lost: &Ranges) {
        let told = self.last.get(key).map(|last| &last.account.accounted);
        let through = stream_accounts::synced_candidate(account, lost, told);
        let now = self.outbox.now_ms();
        let result = match &self.conn {
            Some(conn) => stream_accounts::advance_synced(conn, &key.0, &key.1, through, now),
            None => self.outbox.connection().and_then(|conn| {
                stream_accounts::advance_synced(&conn, &key.0, &key.1, through, now)
            }),
        };
        if let Err(e) = result {
            log::warn!("destination {}: synced-through not kept: {e}", key.0);
        }
    }

    /// Whether a stream's `account` is to be told now.
    fn is_due(&self, key: &(String, String), account: &StreamAccount, last_round: bool) -> bool {
        let (told, at) = match self.last.get(key) {
            Some(last) => (Some(&last.account), last.at),
            None => (None, self.started),
        };
        let fates_changed = match told {
            Some(told) => told.accounted != account.accounted,
            None => account.accounted != Default::default(),
        };
        let changed = told != Some(account);
        fates_changed || (changed && (last_round || at.elapsed() >= self.interval))
    }

    /// Sends one stream's accounting; remembers it once the destination took it.
    fn tell(&mut self, index: usize, key: (String, String), account: StreamAccount) {
        let destination = &self.destinations[index];
        let data = match serde_json::to_value(&account) {
            Ok(data) => data,
            Err(e) => {
                log::error!(
                    "destination {}: accounting not encoded: {e}",
                    destination.name
                );
                return;
            }
        };
        let mut event = OutboundEvent::new(ACCOUNTING_TYPE, &data);
        event.source = key.1.clone();
        event.destination = destination.name.clone();
        event.created_at = self.outbox.now_ms();
        match destination.transport.send(std::slice::from_ref(&event)) {
            Attempt::Answered { status, .. } if (200..300).contains(&status) => {
                log::debug!(
                    "destination {}: told the accounting of {} through {}",
                    destination.name,
                    key.1,
                    account.high_water
                );
                self.last.insert(
                    key,
                    LastTold {
                        account,
                        at: Instant::now(),
                    },
                );
            }
            other => log::info!(
                "destination {}: the accounting of {} was not taken ({other:?}); told again \
                 next round",
                destination.name,
                key.1
            ),
        }
    }
}
