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
use crate::relay::spending::{Spending, Verdict};
use crate::store::stream_accounts;
use crate::transport::{Attempt, OutboundEvent, Transport};
use crate::wire::{Fates, Ranges, StreamAccount, ACCOUNTING_TYPE};

/// The longest wait between two looks at the fates.
const MOST_CHECK: Duration = Duration::from_secs(15);

/// When a destination is told its streams' accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tells {
    /// From the start ([`Destination::accounting`](crate::Destination::accounting)`(true)`).
    Always,
    /// Once its receiver said it takes them (an HTTP destination's default).
    WhenAsked,
    /// Never.
    Never,
}

/// One destination the accountant keeps track of.
pub(crate) struct Told {
    pub name: String,
    /// When it takes accounting ([`Destination::accounting`](crate::Destination::accounting)):
    /// one that does not costs the accountant nothing, and its streams keep no
    /// synced-through number (no fate of theirs is ever acknowledged).
    pub tells: Tells,
    pub transport: Arc<dyn Transport>,
    pub gate: Arc<Gate>,
    /// The destination's data budget: the accounting spends it as events do, and waits
    /// while the destination holds events for it.
    pub spending: Option<Arc<Spending>>,
}

/// What a stream's destination took, and when it was last told.
struct LastTold {
    /// The high water and pending numbers of the last report taken.
    high_water: i64,
    pending: Ranges,
    /// The fates it acknowledged that the file still held at the last look: a report
    /// tells only the others.
    fates: Fates,
    at: Instant,
}

/// The most ranges of fates one report carries: a longer history goes over several
/// reports, each well under a receiver's body limit (`outbox ingest` takes 1 MiB by
/// default; 20,000 ranges of the largest numbers are about 700 KB).
pub(crate) const REPORT_RANGES: usize = 20_000;

/// The accountant thread's state.
pub(crate) struct Accountant {
    outbox: Outbox,
    destinations: Vec<Told>,
    stop: Receiver<bool>,
    interval: Duration,
    /// Per `(destination, source)`.
    last: HashMap<(String, String), LastTold>,
    /// Streams whose accounting the destination refused (4xx) since it last took one: the
    /// refusal is logged as a warning once, not every round.
    refused: std::collections::HashSet<(String, String)>,
    started: Instant,
    /// Its own connection (opened at the first look): its `PRAGMA data_version` moves only
    /// when another connection commits, so an idle file costs a look one pragma.
    conn: Option<rusqlite::Connection>,
    /// The file's data version at the last round, and when that round was.
    seen: Option<(i64, Instant)>,
    /// Per destination: its fates' fingerprint at its last full read, and when that was.
    /// A round reads a destination's streams in full (every pending row) only when the
    /// fingerprint moved (a fate to tell at once), its last pending row left (its
    /// synced-through number can move up to its high water), an interval passed (the
    /// pending numbers are told every interval), or the relay stops: a draining relay's
    /// other rounds read no pending row.
    looked: HashMap<String, (stream_accounts::FatesFingerprint, Instant)>,
    /// Destinations whose fingerprint (or report count) could not be read (warned once).
    fingerprint_failed: std::collections::HashSet<String>,
    /// Destinations (by index) an earlier relay told reports: see `told_before`.
    told_before: std::collections::HashSet<usize>,
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
            refused: Default::default(),
            started: Instant::now(),
            conn: None,
            seen: None,
            looked: HashMap::new(),
            fingerprint_failed: Default::default(),
            told_before: Default::default(),
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
            // A destination that takes no accounting costs nothing here (its streams keep
            // no synced-through number: no fate of theirs is ever acknowledged).
            let tells = match self.destinations[index].tells {
                Tells::Always => true,
                Tells::WhenAsked => {
                    self.destinations[index].transport.takes_accounting() || self.told_before(index)
                }
                Tells::Never => false,
            };
            let destination = &self.destinations[index];
            if !tells || destination.gate.is_down() || destination.gate.is_closed() {
                continue;
            }
            let name = destination.name.clone();
            if !last_round && !self.full_read_due(&name) {
                continue;
            }
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
                        "destination {name}: the streams' accounting could not be read: {e:#}"
                    );
                    continue;
                }
            };
            for stream in accounts {
                let key = (name.clone(), stream.source);
                self.forget_gone_fates(&key, &stream.account.accounted);
                if self.is_due(&key, &stream.account, last_round) {
                    self.tell(index, &key, &stream.account);
                }
                self.advance_synced(&key, &stream.account, &stream.lost);
            }
        }
    }

    /// Whether an earlier relay told destination number `index` a report (its streams'
    /// report count, kept in the file, is above 0): its receiver asked for them then, so a
    /// relay that delivers nothing this run (only fates to tell) still tells them. Once
    /// true, not read again.
    fn told_before(&mut self, index: usize) -> bool {
        if self.told_before.contains(&index) {
            return true;
        }
        let name = &self.destinations[index].name;
        let told = match self
            .conn
            .as_ref()
            .map(|conn| stream_accounts::any_report_told(conn, name))
        {
            Some(Ok(told)) => told,
            Some(Err(e)) => {
                // Counted as not told: its accounting waits for the receiver's header.
                if self
                    .fingerprint_failed
                    .insert(format!("{name} (reports told)"))
                {
                    log::warn!(
                        "accounting for {name}: whether an earlier relay told it reports could \
                         not be read ({e:#}); it is told once its receiver asks"
                    );
                }
                false
            }
            None => false,
        };
        if told {
            self.told_before.insert(index);
        }
        told
    }

    /// Whether `destination`'s streams are to be read in full this round (see `looked`);
    /// keeps the fingerprint when they are. Unknown (an error) counts as due.
    fn full_read_due(&mut self, destination: &str) -> bool {
        let fingerprint = match &self.conn {
            Some(conn) => stream_accounts::fates_fingerprint(conn, destination),
            None => return true,
        };
        let fingerprint = match fingerprint {
            Ok(fingerprint) => {
                self.fingerprint_failed.remove(destination);
                fingerprint
            }
            Err(e) => {
                // Every round then reads in full: said once, not every round.
                if self.fingerprint_failed.insert(destination.to_string()) {
                    log::warn!(
                        "accounting for {destination}: the fates could not be looked at ({e:#}); \
                         each round reads every pending row until they can"
                    );
                }
                return true;
            }
        };
        // A change of `any_pending` (the last pending row left) is a change of fingerprint.
        let due = match self.looked.get(destination) {
            None => true,
            Some((then, at)) => at.elapsed() >= self.interval || fingerprint != *then,
        };
        if due {
            self.looked
                .insert(destination.to_string(), (fingerprint, Instant::now()));
        }
        due
    }

    /// Keeps of a stream's acknowledged fates only those the file still holds (the others
    /// were forgotten once taken, or their rows left): memory bounded by the file.
    fn forget_gone_fates(&mut self, key: &(String, String), now: &Fates) {
        if let Some(last) = self.last.get_mut(key) {
            let gone = last.fates.without(now);
            if !gone.is_empty() {
                last.fates = last.fates.without(&gone);
            }
        }
    }

    /// Moves the stream's synced-through number as far as deliveries and the fates the
    /// destination took allow; a lost number stops it.
    fn advance_synced(&self, key: &(String, String), account: &StreamAccount, lost: &Ranges) {
        let told = self.last.get(key).map(|last| &last.fates);
        let through = stream_accounts::synced_candidate(account, lost, told);
        let now = self.outbox.now_ms();
        let result = match &self.conn {
            Some(conn) => stream_accounts::advance_synced(conn, &key.0, &key.1, through, now),
            None => self.outbox.connection().and_then(|conn| {
                stream_accounts::advance_synced(&conn, &key.0, &key.1, through, now)
            }),
        };
        if let Err(e) = result {
            log::warn!("destination {}: synced-through not kept: {e:#}", key.0);
        }
    }

    /// Whether a stream's `account` is to be told now: fates the destination has not taken
    /// (at once), or any other change once an interval passed or as the relay stops.
    fn is_due(&self, key: &(String, String), account: &StreamAccount, last_round: bool) -> bool {
        let Some(last) = self.last.get(key) else {
            return !account.accounted.is_empty()
                || last_round
                || self.started.elapsed() >= self.interval;
        };
        let new_fates = !account.accounted.without(&last.fates).is_empty();
        let changed = last.high_water != account.high_water || last.pending != account.pending;
        new_fates || (changed && (last_round || last.at.elapsed() >= self.interval))
    }

    /// Tells one stream's accounting: the fates the destination has not taken, over as
    /// many reports as they need ([`REPORT_RANGES`] ranges each), each with the stream's
    /// next report number; the fates each report delivers are then forgotten in the file.
    /// Stops at the first report not taken (told again next round).
    fn tell(&mut self, index: usize, key: &(String, String), account: &StreamAccount) {
        let told = self
            .last
            .get(key)
            .map(|last| last.fates.clone())
            .unwrap_or_default();
        let mut untold = account.accounted.without(&told);
        let mut taken = told;
        loop {
            let (chunk, rest) = untold.split_at(REPORT_RANGES);
            let seq = match self.next_seq(key) {
                Ok(seq) => seq,
                Err(e) => {
                    log::warn!("destination {}: the accounting not numbered: {e:#}", key.0);
                    return;
                }
            };
            let mut report = account.clone();
            report.accounted = chunk.clone();
            report.seq = Some(seq);
            if !self.send(index, key, &report) {
                return;
            }
            taken = taken.merged(&chunk);
            self.forget_in_file(key, &chunk);
            self.last.insert(
                key.clone(),
                LastTold {
                    high_water: account.high_water,
                    pending: account.pending.clone(),
                    fates: taken.clone(),
                    at: Instant::now(),
                },
            );
            if rest.is_empty() {
                return;
            }
            untold = rest;
        }
    }

    /// The stream's next report number, counted in the file.
    fn next_seq(&mut self, key: &(String, String)) -> crate::error::Result<i64> {
        match &self.conn {
            Some(conn) => stream_accounts::next_report_seq(conn, &key.0, &key.1),
            None => {
                let conn = self.outbox.connection()?;
                stream_accounts::next_report_seq(&conn, &key.0, &key.1)
            }
        }
    }

    /// Forgets in the file the fates a destination took (see
    /// [`stream_accounts::forget_told`]); a failure only leaves them to be told again.
    fn forget_in_file(&mut self, key: &(String, String), fates: &Fates) {
        let result = match self.conn.as_mut() {
            Some(conn) => stream_accounts::forget_told(conn, &key.0, &key.1, fates),
            None => self.outbox.connection().and_then(|mut conn| {
                stream_accounts::forget_told(&mut conn, &key.0, &key.1, fates)
            }),
        };
        if let Err(e) = result {
            log::warn!(
                "destination {}: fates taken by the destination not forgotten: {e:#}",
                key.0
            );
        }
    }

    /// Sends one report; whether the destination took it (2xx).
    fn send(&mut self, index: usize, key: &(String, String), report: &StreamAccount) -> bool {
        let destination = &self.destinations[index];
        let data = match serde_json::to_value(report) {
            Ok(data) => data,
            Err(e) => {
                log::error!(
                    "destination {}: accounting not encoded: {e:#}",
                    destination.name
                );
                return false;
            }
        };
        let mut event = OutboundEvent::new(ACCOUNTING_TYPE, &data);
        event.source = key.1.clone();
        event.destination = destination.name.clone();
        event.created_at = self.outbox.now_ms();
        let body = event.payload.len() as u64;
        let admitted = match &destination.spending {
            None => None,
            Some(spending) => match spending.admit(body, false) {
                Verdict::Go(reservation) => Some((spending, reservation)),
                Verdict::Wait | Verdict::Hold => {
                    log::debug!(
                        "destination {}: the accounting of {} waits for the data budget",
                        destination.name,
                        key.1
                    );
                    return false;
                }
            },
        };
        let wire_before = crate::transport::wire_bytes_here();
        let attempt = destination.transport.send(std::slice::from_ref(&event));
        if let Some((spending, reservation)) = admitted {
            let measured = crate::transport::wire_bytes_here().wrapping_sub(wire_before);
            spending.spent(reservation, body, measured);
        }
        match attempt {
            Attempt::Answered { status, .. } if (200..300).contains(&status) => {
                self.refused.remove(key);
                log::debug!(
                    "destination {}: told the accounting of {} through {} (report {:?})",
                    destination.name,
                    key.1,
                    report.high_water,
                    report.seq
                );
                true
            }
            // Refused (a receiver's bound, a malformed report): retrying will not pass, and
            // the fleet names this stream's fates missing until an operator acts.
            Attempt::Answered { status, .. }
                if (400..500).contains(&status) && self.refused.insert(key.clone()) =>
            {
                log::warn!(
                    "destination {}: the accounting of {} was refused ({status}); the fleet \
                     cannot see this stream's fates until it takes one (logged once; told \
                     again every round)",
                    destination.name,
                    key.1
                );
                false
            }
            other => {
                log::info!(
                    "destination {}: the accounting of {} was not taken ({other:?}); told \
                     again next round",
                    destination.name,
                    key.1
                );
                false
            }
        }
    }
}
