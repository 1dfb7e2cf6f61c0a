//! A relay's spending of one destination's data budget: which requests it may start, what
//! they cost as the network counts it, and when the destination holds events for the next
//! period. Shared by the destination's workers (who ask before each request and count after
//! it) and the writer (who claims only exempt events while holding, keeps the spending in
//! the file and tells the app).
//!
//! A request is started only if what the period has spent, what requests under way may
//! still spend, and this request's bound fit in the budget. The bound is its events' data
//! plus the costliest request beyond its events' data measured so far on this destination
//! (the envelope, its head, the answer, a TLS handshake when a connection was opened): so
//! the relay never starts a request the rest of the budget cannot carry, and a period
//! spends at most the budget plus what one answer larger than any before can add. (The
//! events' data, not the encoded body: encoding each request twice cost a drain of one
//! event a request 10% of its rate.)

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::clock::Clock;
use crate::error::Result;
use crate::relay::budget::Budget;
use crate::store::budget_spend::{self, BudgetRecord};

/// What a request is assumed to cost beyond its events' data before one was measured: an
/// HTTPS request's first connection (a TLS handshake is about 6.5 KB), its envelope, head
/// and answer.
pub(crate) const FIRST_OVERHEAD_TLS: u64 = 8_000;
/// The same over plain TCP: a request's envelope, head and answer.
pub(crate) const FIRST_OVERHEAD_PLAIN: u64 = 1_500;

/// How often at most the spending is written to the file while nothing else changes: a
/// crash loses at most this much of it. A change of holding is written at once. (Written
/// with every transaction of outcomes, it cost a drain of one event a request a few
/// percent.)
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(1);

/// One destination's budget as a relay spends it.
pub(crate) struct Spending {
    destination: String,
    budget: Budget,
    exempt_priority: Option<u8>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// When this spending was made: its first write is due from then.
    made_at: Instant,
}

#[derive(Debug)]
struct State {
    /// When the period this relay counts in began (unix ms).
    period_started: i64,
    /// What the file said the period had spent, at the last sync.
    saved: u64,
    /// Spent since, not yet in the file.
    unsaved: u64,
    /// Taken out of `unsaved` by a sync under way.
    syncing: u64,
    /// The bounds of requests started and not yet counted.
    reserved: u64,
    /// What a request is assumed to cost beyond its events' data until one is measured.
    first_overhead: u64,
    /// The costliest request beyond its events' data measured so far.
    learned_overhead: Option<u64>,
    /// Whether events below the exempt priority wait for the next period.
    holding: bool,
    /// Whether the app was last told the destination holds.
    announced: bool,
    /// When the spending was last written to the file, and whether it said holding.
    synced_at: Option<Instant>,
    synced_holding: bool,
}

impl State {
    fn used(&self) -> u64 {
        self.saved
            .saturating_add(self.unsaved)
            .saturating_add(self.syncing)
    }
}

/// What the budget says of a request about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It may go: count it against this reservation once sent ([`Spending::spent`]).
    Go(u64),
    /// It fits what is left once the requests under way are counted: ask again then.
    Wait,
    /// The budget cannot carry it: the destination holds events until the next period.
    Hold,
}

/// A change of whether a destination holds events for its budget, for the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldChange {
    /// The budget is spent: events below the exempt priority wait until `period_ends`.
    Holding { used: u64, period_ends: i64 },
    /// A new period began: everything goes again.
    Resumed,
}

impl Spending {
    /// The spending of `budget` for `destination`, a new period beginning now until
    /// [`load`](Self::load) reads the file's.
    pub fn new(
        destination: &str,
        budget: Budget,
        exempt_priority: Option<u8>,
        first_overhead: u64,
        clock: Arc<dyn Clock>,
    ) -> Spending {
        let now = clock.now_ms();
        Spending {
            destination: destination.to_string(),
            budget,
            exempt_priority,
            clock,
            made_at: Instant::now(),
            state: Mutex::new(State {
                period_started: now,
                saved: 0,
                unsaved: 0,
                syncing: 0,
                reserved: 0,
                first_overhead,
                learned_overhead: None,
                holding: false,
                announced: false,
                synced_at: None,
                synced_holding: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self) -> BudgetRecord<'_> {
        BudgetRecord {
            destination: &self.destination,
            limit_bytes: self.budget.limit_bytes(),
            period_ms: self.budget.period_ms(),
            exempt_priority: self.exempt_priority,
        }
    }

    /// Moves to the period `now` falls in: a new one starts with nothing spent, and holds
    /// nothing back.
    fn roll(&self, state: &mut State, now: i64) {
        let current =
            budget_spend::current_period(state.period_started, self.budget.period_ms(), now);
        if current != state.period_started {
            state.period_started = current;
            state.saved = 0;
            // Spent in the period before and not yet in the file: it counted there.
            state.unsaved = 0;
            state.holding = false;
        }
    }

    /// Takes the period the file keeps (a relay restarted within it spends on from what
    /// was spent) and writes this relay's limit and period there.
    pub fn load(&self, conn: &Connection) -> Result<()> {
        let now = self.clock.now_ms();
        let stored = budget_spend::stored_period(conn, &self.destination)?;
        {
            let mut state = self.lock();
            if let Some(stored) = stored {
                state.period_started = stored.period_started;
                state.saved = stored.used_bytes;
            }
            self.roll(&mut state, now);
        }
        self.sync(conn)
    }

    /// Whether a request whose events' data is `body` bytes may start now. `exempt`: every event of it is at
    /// or above the exempt priority, and it goes whatever is left.
    pub fn admit(&self, body: u64, exempt: bool) -> Verdict {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        let overhead = state.learned_overhead.unwrap_or(state.first_overhead);
        let bound = body.saturating_add(overhead);
        if !exempt {
            if state.holding {
                return Verdict::Hold;
            }
            let limit = self.budget.limit_bytes();
            if state.used().saturating_add(bound) > limit {
                state.holding = true;
                return Verdict::Hold;
            }
            // It fits what is left, but not beside what the requests under way may still
            // spend: it waits for their count (usually less than their bounds).
            if state
                .used()
                .saturating_add(state.reserved)
                .saturating_add(bound)
                > limit
            {
                return Verdict::Wait;
            }
        }
        state.reserved = state.reserved.saturating_add(bound);
        Verdict::Go(bound)
    }

    /// Counts a request admitted with `reservation`: `measured` bytes on its sockets, or
    /// its events' data (`body`) where the transport does not count them (0 measured).
    pub fn spent(&self, reservation: u64, body: u64, measured: u64) {
        let mut state = self.lock();
        state.reserved = state.reserved.saturating_sub(reservation);
        let bytes = if measured > 0 { measured } else { body };
        state.unsaved = state.unsaved.saturating_add(bytes);
        if measured > 0 {
            let beyond = measured.saturating_sub(body);
            state.learned_overhead = Some(state.learned_overhead.map_or(beyond, |o| o.max(beyond)));
        }
    }

    /// Whether events below the exempt priority wait for the next period now.
    pub fn holding(&self) -> bool {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        state.holding
    }

    /// Events of this priority and above go whatever is left.
    pub fn exempt_priority(&self) -> Option<u8> {
        self.exempt_priority
    }

    /// While holding, when the period ends (unix ms): the events wait until then.
    pub fn holding_until(&self) -> Option<i64> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        state
            .holding
            .then(|| state.period_started.saturating_add(self.budget.period_ms()))
    }

    /// While holding, how long until the next period begins (at most a minute: a wall
    /// clock that steps is looked at again by then).
    pub fn renews_in(&self) -> Option<std::time::Duration> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        if !state.holding {
            return None;
        }
        let ends = state.period_started.saturating_add(self.budget.period_ms());
        let left = ends.saturating_sub(now).clamp(0, 60_000);
        Some(std::time::Duration::from_millis(left as u64))
    }

    /// The bytes spent in the current period and the budget's limit.
    pub fn used_and_limit(&self) -> (u64, u64) {
        (self.lock().used(), self.budget.limit_bytes())
    }

    /// A change of holding not yet told to the app, if there is one.
    pub fn take_change(&self) -> Option<HoldChange> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        if state.holding == state.announced {
            return None;
        }
        state.announced = state.holding;
        Some(if state.holding {
            HoldChange::Holding {
                used: state.used(),
                period_ends: state.period_started.saturating_add(self.budget.period_ms()),
            }
        } else {
            HoldChange::Resumed
        })
    }

    /// When the spending should next be written to the file ([`sync`](Self::sync)): at once
    /// (an instant already past) if whether the destination holds changed or it was never
    /// written, [`SYNC_EVERY`] after the last write while something is unwritten, else
    /// never.
    pub fn sync_due(&self) -> Option<Instant> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        self.roll(&mut state, now);
        // "At once" is an instant already past: the last write (or the spending's making).
        match state.synced_at {
            None => Some(self.made_at),
            Some(at) if state.holding != state.synced_holding => Some(at),
            Some(at) if state.unsaved > 0 => Some(at + SYNC_EVERY),
            Some(_) => None,
        }
    }

    /// Adds what was spent since the last sync to the file (inside the caller's
    /// transaction) and takes back what every relay of the file has spent in the period.
    pub fn sync(&self, conn: &Connection) -> Result<()> {
        let (period_started, spent, holding) = {
            let mut state = self.lock();
            let spent = state.unsaved;
            state.unsaved = 0;
            state.syncing = spent;
            (state.period_started, spent, state.holding)
        };
        let written = budget_spend::add_spent(conn, &self.record(), period_started, spent, holding);
        let mut state = self.lock();
        state.syncing = 0;
        state.synced_at = Some(Instant::now());
        state.synced_holding = holding;
        match written {
            Ok(file) => {
                if file.period_started >= state.period_started {
                    state.period_started = file.period_started;
                    state.saved = file.used_bytes;
                }
                Ok(())
            }
            Err(e) => {
                state.unsaved = state.unsaved.saturating_add(spent);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    fn spending(limit: u64, exempt: Option<u8>) -> (Spending, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let budget = Budget::new(limit, Duration::from_secs(60)).unwrap();
        let s = Spending::new("d", budget, exempt, 100, clock.clone());
        (s, clock)
    }

    fn go(verdict: Verdict) -> u64 {
        match verdict {
            Verdict::Go(reservation) => reservation,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_starts_only_if_its_bound_fits_and_then_the_destination_holds() {
        let (s, _) = spending(1_000, None);
        // 300 body + 100 overhead: two fit (800) beside each other; a third waits for
        // their count.
        let a = go(s.admit(300, false));
        let b = go(s.admit(300, false));
        assert_eq!(s.admit(300, false), Verdict::Wait);
        assert!(!s.holding());
        s.spent(a, 300, 350);
        s.spent(b, 300, 0);
        // 650 spent: a 300-byte request's bound (300 + the 50 measured beyond the body)
        // fits; then one that does not makes the destination hold, and even a small one
        // waits for the next period.
        let c = go(s.admit(300, false));
        s.spent(c, 300, 340);
        assert_eq!(s.admit(300, false), Verdict::Hold);
        assert!(s.holding());
        assert_eq!(s.admit(1, false), Verdict::Hold);
        assert_eq!(s.used_and_limit(), (990, 1_000));
        assert_eq!(
            s.take_change(),
            Some(HoldChange::Holding {
                used: 990,
                period_ends: 1_060_000
            })
        );
        assert_eq!(s.take_change(), None);
    }

    #[test]
    fn exempt_requests_go_whatever_is_left_and_are_counted() {
        let (s, _) = spending(500, Some(8));
        assert_eq!(s.admit(450, false), Verdict::Hold);
        let r = go(s.admit(450, true));
        s.spent(r, 450, 700);
        assert_eq!(s.used_and_limit().0, 700);
        // What it cost beyond its body is the bound's overhead from now on.
        assert_eq!(s.admit(10, true), Verdict::Go(260));
    }

    #[test]
    fn a_new_period_starts_with_nothing_spent_and_holds_nothing_back() {
        let (s, clock) = spending(500, None);
        let r = go(s.admit(300, false));
        s.spent(r, 300, 0);
        assert_eq!(s.admit(300, false), Verdict::Hold);
        assert!(matches!(s.take_change(), Some(HoldChange::Holding { .. })));
        clock.advance_ms(60_000);
        assert!(!s.holding());
        assert_eq!(s.take_change(), Some(HoldChange::Resumed));
        assert_eq!(s.used_and_limit().0, 0);
        let r = go(s.admit(300, false));
        assert_eq!(s.renews_in(), None);
        s.spent(r, 300, 0);
        assert_eq!(s.admit(300, false), Verdict::Hold);
        // Holding, 59.5 s before the period that began at 1,060,000 ends.
        clock.advance_ms(500);
        assert_eq!(
            s.renews_in(),
            Some(std::time::Duration::from_millis(59_500))
        );
    }

    #[test]
    fn a_change_of_holding_is_due_at_once_and_spending_within_a_second() {
        let conn = budget_spend::file_for_tests();
        let (s, _) = spending(500, None);
        // Never written: due at once.
        assert!(s.sync_due().is_some_and(|due| due <= Instant::now()));
        s.load(&conn).unwrap();
        assert_eq!(s.sync_due(), None);
        let r = go(s.admit(100, false));
        s.spent(r, 100, 150);
        let due = s.sync_due().unwrap();
        assert!(due > Instant::now() && due <= Instant::now() + SYNC_EVERY);
        // Holding: at once.
        assert_eq!(s.admit(400, false), Verdict::Hold);
        assert!(s.sync_due().is_some_and(|due| due <= Instant::now()));
        s.sync(&conn).unwrap();
        assert_eq!(s.sync_due(), None);
        let kept: (i64, bool) = conn
            .query_row("SELECT used_bytes, holding FROM outbox_budgets", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(kept, (150, true));
    }
}
