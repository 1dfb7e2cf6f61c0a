//! The writer's housekeeping between claims and acks: retention, handing freed pages back,
//! and the metrics gauges. Each runs on a timer and costs the delivery path nothing in
//! between. Checkpoints run on a thread of their own ([`super::checkpointer`]).

use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::error::Result;
use crate::relay::config::RelayConfig;
use crate::store::database;
use crate::store::disk_room::DiskRoom;
use crate::store::queue::{self, Finished, DELETE_PAGE_ROWS};
use crate::store::right_of_way::RelayWrite;

/// How often the pending, age and size gauges are refreshed (they cost a query).
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);

/// Under disk pressure, how soon after a page that found the history empty another is tried
/// (acknowledgements meanwhile make more): a write transaction each time, so not every turn.
const ROOM_PRUNE_PAUSE: Duration = Duration::from_millis(250);

/// Timers and progress of the writer's housekeeping.
pub(crate) struct Housekeeping {
    relay_id: String,
    retention: Option<Duration>,
    retention_interval: Duration,
    /// When retention last started, and rows pruned in the current run (if one is going on).
    last_retention: Option<Instant>,
    pruning: Option<usize>,
    /// Whether free pages are being handed back, and how many were left at the last step
    /// (a step that frees nothing ends it).
    reclaiming: bool,
    last_free: Option<i64>,
    last_gauges: Option<Instant>,
    /// Under disk pressure: delivered rows deleted to make room in this episode, and when
    /// the next page may run.
    making_room: Option<usize>,
    next_room_prune: Option<Instant>,
}

impl Housekeeping {
    pub fn new(config: &RelayConfig, relay_id: &str) -> Housekeeping {
        Housekeeping {
            relay_id: relay_id.to_string(),
            retention: config.retention,
            retention_interval: config.retention_interval,
            last_retention: None,
            pruning: None,
            reclaiming: false,
            last_free: None,
            last_gauges: None,
            making_room: None,
            next_room_prune: None,
        }
    }

    /// Runs whatever is due: a page of retention or a step of reclaiming; returns whether it
    /// wrote. `relay_write` marks a write of the relay's under way (see
    /// [`crate::store::right_of_way`]) for as long as its guard lives: taken only when there is
    /// something to write.
    pub fn tick<'w>(
        &mut self,
        conn: &mut Connection,
        now_ms: i64,
        room: &DiskRoom,
        relay_write: impl FnOnce() -> RelayWrite<'w>,
    ) -> bool {
        if room.under_pressure() {
            return self.make_room(conn, room, relay_write);
        }
        if let Some(total) = self.making_room.take() {
            log::info!(
                "relay {}: the disk has room again; {total} delivered events were deleted to \
                 make room",
                self.relay_id
            );
        }
        if self.reclaiming {
            self.reclaim_step(conn, relay_write);
            true
        } else {
            self.retention(conn, now_ms, room, relay_write)
        }
    }

    /// Whether a prune or a reclaim is under way: it goes on a step per writer turn.
    pub fn busy(&self) -> bool {
        self.reclaiming
            || self.pruning.is_some()
            || (self.making_room.is_some() && self.next_room_prune.is_none())
    }

    /// When the next timer falls due (the next retention run, the next gauges), so that an
    /// idle writer sleeps until then instead of looking on every turn.
    pub fn next_due(&self) -> Option<Instant> {
        let retention = self.retention.map(|_| match self.last_retention {
            Some(t) => t + self.retention_interval,
            None => Instant::now(),
        });
        let gauges = crate::observe::telemetry::GAUGES_ENABLED.then(|| match self.last_gauges {
            Some(t) => t + GAUGE_INTERVAL,
            None => Instant::now(),
        });
        [retention, gauges].into_iter().flatten().min()
    }

    /// Under disk pressure: deletes a page of delivered history whatever the retention,
    /// oldest first, so that the app's next commits fit in the pages it frees inside the
    /// file (they are not handed back to the file system, where another program could take
    /// them); once there is none left, tries now and then to take the reserve back, which
    /// ends the pressure. Returns whether it wrote.
    fn make_room<'w>(
        &mut self,
        conn: &mut Connection,
        room: &DiskRoom,
        relay_write: impl FnOnce() -> RelayWrite<'w>,
    ) -> bool {
        let total = match self.making_room {
            Some(total) => total,
            None => {
                log::warn!(
                    "relay {}: the disk is full: deleting delivered history, oldest first and \
                     whatever the retention, so that the app's commits fit",
                    self.relay_id
                );
                self.reclaiming = false;
                0
            }
        };
        self.making_room = Some(total);
        if self.next_room_prune.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let write = relay_write();
        let page = queue::delete_page_for_room(conn);
        drop(write);
        match page {
            Ok(n) => {
                self.making_room = Some(total + n);
                crate::observe::telemetry::pruned_for_room(n);
                if n < DELETE_PAGE_ROWS {
                    self.next_room_prune = Some(Instant::now() + ROOM_PRUNE_PAUSE);
                    room.retake_now_and_then();
                }
                n > 0
            }
            Err(e) => {
                if e.is_disk_full() {
                    room.mark_full();
                }
                self.next_room_prune = Some(Instant::now() + ROOM_PRUNE_PAUSE);
                log::warn!(
                    "relay {}: making room failed, will retry: {e:#}",
                    self.relay_id
                );
                false
            }
        }
    }

    /// Hands a bounded step of free pages back to the file system.
    fn reclaim_step<'w>(
        &mut self,
        conn: &Connection,
        relay_write: impl FnOnce() -> RelayWrite<'w>,
    ) {
        let write = relay_write();
        let step = database::reclaim_step(conn);
        drop(write);
        match step {
            Ok(left) => {
                let progressed = self.last_free.is_none_or(|before| left < before);
                self.reclaiming = left > 0 && progressed;
                self.last_free = Some(left);
            }
            Err(e) => {
                self.reclaiming = false;
                log::warn!("relay {}: reclaiming space failed: {e:#}", self.relay_id);
            }
        }
        if !self.reclaiming {
            self.last_free = None;
        }
    }

    /// Prunes delivered events past the retention, one small page per loop turn so claims
    /// and acks go on in between; returns whether it wrote.
    fn retention<'w>(
        &mut self,
        conn: &mut Connection,
        now_ms: i64,
        room: &DiskRoom,
        relay_write: impl FnOnce() -> RelayWrite<'w>,
    ) -> bool {
        let Some(keep) = self.retention else {
            return false;
        };
        if self.pruning.is_none()
            && self
                .last_retention
                .is_none_or(|t| t.elapsed() >= self.retention_interval)
        {
            self.last_retention = Some(Instant::now());
            self.pruning = Some(0);
        }
        let Some(total) = self.pruning else {
            return false;
        };
        let cutoff = now_ms.saturating_sub(keep.as_millis() as i64);
        // Delivered rows first, then expired and exported ones, a page per turn.
        let write = relay_write();
        let page = queue::delete_page(conn, Finished::DeliveredBefore(cutoff)).and_then(|n| {
            if n == DELETE_PAGE_ROWS {
                Ok(n)
            } else {
                queue::delete_page(conn, Finished::SettledBefore(cutoff)).map(|m| n + m)
            }
        });
        drop(write);
        match page {
            Ok(n) if n >= DELETE_PAGE_ROWS => self.pruning = Some(total + n),
            Ok(n) => {
                self.pruning = None;
                let total = total + n;
                if total > 0 {
                    log::info!(
                        "relay {}: pruned {total} delivered, expired or exported events",
                        self.relay_id
                    );
                }
                // The pages the prune freed go back to the file system a step per turn.
                self.reclaiming = total > 0;
            }
            Err(e) => {
                self.pruning = None;
                if e.is_disk_full() {
                    room.mark_full();
                }
                log::warn!("relay {}: pruning failed, will retry: {e:#}", self.relay_id);
            }
        }
        true
    }

    /// Refreshes the pending, age and size gauges every `GAUGE_INTERVAL` (metrics only).
    pub fn gauges(&mut self, conn: &Connection, now_ms: i64, room: &DiskRoom) {
        if crate::observe::telemetry::GAUGES_ENABLED
            && self
                .last_gauges
                .is_none_or(|t| t.elapsed() >= GAUGE_INTERVAL)
        {
            self.last_gauges = Some(Instant::now());
            if let Err(e) = update_gauges(conn, now_ms) {
                log::debug!("relay {}: gauges not updated: {e:#}", self.relay_id);
            }
            crate::observe::telemetry::disk_room(room.is_full(), room.held_bytes());
        }
    }
}

fn update_gauges(conn: &Connection, now_ms: i64) -> Result<()> {
    // As `stats` counts them (without folding: the writer leaves that to `stats`), in one
    // read transaction so that the totals and the rows above them are of one moment.
    let snapshot = conn.unchecked_transaction()?;
    let pending = crate::store::queue::tally::pending_rows(&snapshot)?;
    let oldest = crate::store::oldest::oldest_pending_anywhere(&snapshot)?;
    let database_bytes = crate::store::database::database_bytes(&snapshot)?;
    drop(snapshot);
    crate::observe::telemetry::gauges(pending, oldest.map(|t| now_ms - t), database_bytes);
    Ok(())
}
