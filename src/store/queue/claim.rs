//! Claim: the due rows of one destination, level by level, chosen within the claim's bytes
//! and leased in one `UPDATE`; rows that cannot be read dead-lettered alone; the reanchor of future
//! rows at a relay's start.

#[allow(unused_imports)]
use super::*;
use rusqlite::types::Value;

/// One priority level's due rows, in due order: each event as [`decode_event`] reads it
/// (`?6` the default source), then the size of its data ([`CANDIDATE_SIZE`]) and whether
/// it has no source of its own (such a row belongs to no stream, see `numbering`). What
/// [`LEASE_RANGE_SQL`] or [`LEASE_LIST_SQL`] then leases, cut to the claim's byte bound on
/// the way (see [`fitting_candidates`]). The events are read here, where the walk reads
/// each row anyway, not returned by the lease's `UPDATE`: SQLite keeps a `RETURNING` list
/// in a table of its own before handing out its first row, which cost the claim a fifth.
///
/// It walks the partial index `(destination, priority, available_at, id)` as one range and
/// stops at its first row not yet due or at `limit`, so the cost depends on the due rows,
/// not on how many rows are parked, backing off or delivered (a test pins the query plan).
/// The `NOT EXISTS` keeps a key's events in commit order even for rows that were written
/// without parking (by hand, or by an older version). Dead rows do not block their key, so
/// one poison event stops only itself.
///
/// Every `LIMIT` here is `LIMIT CAST(?n AS INTEGER)`, never a bare `LIMIT ?n`: SQLite's
/// planner reads a bare bound limit, and a statement whose plan read a bound value is
/// compiled again each time it is bound, which made every claim pay a full prepare.
macro_rules! claim_candidates {
    ($($after_step:expr)?) => {
        concat!(
            "SELECT e.id, e.event_id, e.event_type, COALESCE(e.source, ?6), e.subject,
                    e.partition_key, e.idempotency_key, e.payload, e.created_at, e.attempts,
                    e.expires_at, e.traceparent, e.tracestate, e.dataschema, e.stream_seq,
                    octet_length(e.payload), e.source IS NULL
               FROM outbox_events AS e
              WHERE ",
            pending!("e."),
            " AND e.destination = ?4 AND e.priority = ?8 AND e.available_at <= ?3
              AND (e.expires_at IS NULL OR e.expires_at > ?3) AND ",
            lease_claimable!("e.", "?3", "?7"),
            $(" AND ", $after_step,)?
            " AND ",
            not_spared!("e.", "?9"),
            " AND (e.partition_key IS NULL OR NOT EXISTS (
                     SELECT 1 FROM outbox_events AS k
                      WHERE k.partition_key = e.partition_key AND k.destination = e.destination
                        AND k.id < e.id AND ",
            pending!("k."),
            "))
              ORDER BY e.available_at, e.id
              LIMIT CAST(?5 AS INTEGER)"
        )
    };
}
pub(crate) const CLAIM_CANDIDATES_SQL: &str = claim_candidates!();

/// [`CLAIM_CANDIDATES_SQL`] within a while after a step of the wall clock: another relay's
/// lease must be free on the clock of before the step too (`?10` now on that clock, `?11`
/// the latest a lease may have been taken on it; see `ClaimRequest::clock_step_ms`). A
/// statement of its own, so the claims of every other moment pay nothing for it.
pub(crate) const CLAIM_CANDIDATES_AFTER_STEP_SQL: &str =
    claim_candidates!(lease_claimable!("e.", "?10", "?11"));

/// The column of a candidate's data size, after the event's columns.
const CANDIDATE_SIZE: usize = 15;
/// The column of whether a candidate's stored source is null.
const CANDIDATE_UNSOURCED: usize = 16;

/// Leases the rows `?4` (a JSON array of ids, chosen by [`CLAIM_CANDIDATES_SQL`] in the same
/// transaction) with one `UPDATE`.
///
/// SQLite has one writer at a time and the claim runs in a write transaction, so choosing
/// and leasing are atomic: two relays (threads or processes) never both claim a row while
/// its lease is valid. [`claim`] runs both for each level that has due rows, most urgent
/// first.
///
/// Every event goes out with its stream number. When the rows it claims take consecutive
/// numbers in the order listed (`?5`, then `?5 + 1`, …: a backlog of one stream drained
/// oldest first), this `UPDATE` writes them itself, for nothing more than the lease's own
/// write; otherwise `?5` is null and `numbering` wrote them just before.
pub(crate) const LEASE_LIST_SQL: &str = "UPDATE outbox_events
        SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3,
            stream_seq = COALESCE(stream_seq, ?5 + c.key)
       FROM json_each(?4) AS c
      WHERE outbox_events.id = c.value";

/// [`LEASE_LIST_SQL`] for candidates whose ids run on without a gap (`?4` to `?6`), as a
/// backlog of one destination drained oldest first claims them: a walk of the table's
/// rowids, no list to build or read. The row `?4 + n` takes number `?5 + n`.
pub(crate) const LEASE_RANGE_SQL: &str = "UPDATE outbox_events
        SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3,
            stream_seq = COALESCE(stream_seq, ?5 + (id - ?4))
      WHERE id BETWEEN ?4 AND ?6";

/// A due row the claim chose: its event, or why it cannot be read as one.
struct Candidate {
    id: i64,
    event: std::result::Result<OutboundEvent, String>,
    /// No source stored (the event goes with the default, and takes no stream number).
    unsourced: bool,
}

/// The candidates of [`CLAIM_CANDIDATES_SQL`] with `params`, in order, as many as fit in
/// `max_bytes` of data (the first whatever its size): a row goes while the rows before it
/// hold less than `max_bytes`. Reading stops at the first that does not fit, so the index
/// walk stops there too. Each is read as the event `lease` will send.
fn fitting_candidates(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
    max_bytes: i64,
    lease: &Lease<'_>,
) -> Result<Vec<Candidate>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut candidates = Vec::new();
    let mut bytes = 0i64;
    while let Some(row) = rows.next()? {
        if !candidates.is_empty() && bytes >= max_bytes {
            break;
        }
        // The row id is an INTEGER PRIMARY KEY: always readable.
        let id = row.get::<_, i64>(0)?;
        let event = decode_event(row, lease).map_err(|e| format!("unreadable row: {e:#}"));
        let unsourced = row.get::<_, bool>(CANDIDATE_UNSOURCED)?;
        candidates.push(Candidate {
            id,
            event,
            unsourced,
        });
        bytes = bytes.saturating_add(row.get::<_, Option<i64>>(CANDIDATE_SIZE)?.unwrap_or(0));
    }
    Ok(candidates)
}

/// The ids `sql` selects with `params`, for a write that keeps the pending totals with
/// [`tally::around`]; none (without running it) while the totals cover no row.
pub(crate) fn tallied_candidates(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<i64>> {
    if tally::tallied_through(conn)? == 0 {
        return Ok(Vec::new());
    }
    Ok(conn
        .prepare_cached(sql)?
        .query_map(params, |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
}

/// The priority levels of a destination that have a row due (leased or not), most urgent
/// first: ten seeks into the pending index, one per level, so a claim visits only the
/// levels in use (usually just the default, 5).
pub(crate) const DUE_LEVELS_SQL: &str = concat!(
    "SELECT column1 FROM (VALUES (9), (8), (7), (6), (5), (4), (3), (2), (1), (0)) AS level
      WHERE EXISTS (SELECT 1 FROM outbox_events AS e
                     WHERE ",
    pending!("e."),
    " AND e.destination = ?1 AND e.priority = level.column1 AND e.available_at <= ?2)"
);

/// One claim: up to `limit` due rows of `destination`, leased to `owner` until
/// `now + lease_ms`.
pub(crate) struct ClaimRequest<'a> {
    pub destination: &'a str,
    pub default_source: &'a str,
    pub owner: &'a str,
    /// Leases whose owner starts with this are never taken over (`""`: none spared): the
    /// claiming relay's own, in flight whatever the wall clock says.
    pub spare_leases: &'a str,
    pub now: i64,
    /// A step of the wall clock the claiming relay noticed lately (0: none; negative: back).
    /// Other relays' leases are then taken only if they are free on the clock of before
    /// the step too: their owners move them to the new clock at their next look, and
    /// until then a lease in flight looks expired after a step forward, or taken in the
    /// future after a step back.
    pub clock_step_ms: i64,
    pub lease_ms: i64,
    pub limit: i64,
    /// The most bytes of event data one claim takes (past the first event, which goes
    /// whatever its size): with large events a count alone held hundreds of megabytes.
    pub max_bytes: i64,
    /// The most rows not numbered yet a claim numbers up to the newest row it takes (an
    /// urgent event committed behind a backlog of a week offline): past it, the claim
    /// takes nothing more and says which row it needs numbered through
    /// ([`Claimed::numbering_needed`]), for the caller to number in steps of its own and
    /// claim again. `None`: no bound.
    pub numbering_bound: Option<i64>,
    /// The least priority taken (0: every one): a destination holding events for its data
    /// budget takes only those at or above its exempt priority.
    pub min_priority: i64,
}

/// A claimed row that could not be read as an event (a BLOB payload, a REAL time, text that
/// is not UTF-8: written by hand or by another program). The claim dead-letters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    pub id: i64,
    pub error: String,
}

/// What one claim took: the events to deliver, in commit order, and the rows it found
/// unreadable and dead-lettered instead.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub events: Vec<OutboundEvent>,
    pub unreadable: Vec<Unreadable>,
    /// Whether an event of [`Event::URGENT_PRIORITY`](crate::Event::URGENT_PRIORITY) or
    /// above was claimed (it skips a destination's linger).
    pub urgent: bool,
    /// The row through which the claim needed rows numbered, past its request's
    /// `numbering_bound`: it stopped before taking those rows.
    pub numbering_needed: Option<i64>,
}

impl Claimed {
    /// Whether the claim took no row at all (and so wrote nothing).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.unreadable.is_empty()
    }
}

/// Runs the claim. Rows are decoded one by one, so one unreadable row costs only itself:
/// it is dead-lettered (fenced by this claim's lease) with the decoding error kept, and the
/// rest of the batch goes out.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest<'_>) -> Result<Claimed> {
    let mut claimed = Claimed::default();
    let through = tally::tallied_through(conn)?;
    let takes_over = tally::claim_may_take_over(conn, through, req.destination, req.now)?;
    // The levels are read one at a time, and reading stops once the claim is full: with a
    // backlog at the default priority the levels below it are never even looked at.
    let mut probe = conn.prepare_cached(DUE_LEVELS_SQL)?;
    let mut levels = probe.query(params![req.destination, req.now])?;
    while let Some(row) = levels.next()? {
        let level: i64 = row.get(0)?;
        if level < req.min_priority {
            // Levels come most urgent first: none after this one is taken either.
            break;
        }
        let taken = claimed.events.len() + claimed.unreadable.len();
        let left = req.limit - taken as i64;
        let bytes: usize = claimed.events.iter().map(|e| e.payload.len()).sum();
        let bytes_left = req.max_bytes.saturating_sub(bytes as i64);
        if left <= 0 || bytes_left <= 0 {
            break;
        }
        let first = claimed.events.len();
        let room = Room {
            events: left,
            bytes: bytes_left,
        };
        claim_level(conn, req, level, room, takes_over, &mut claimed)?;
        if claimed.numbering_needed.is_some() {
            break;
        }
        if level >= i64::from(crate::Event::URGENT_PRIORITY) && claimed.events.len() > first {
            claimed.urgent = true;
        }
        // RETURNING order is unspecified; hand a level's events to workers oldest first.
        claimed.events[first..].sort_unstable_by_key(|e| e.id);
        if claimed.events.len() + claimed.unreadable.len() >= req.limit as usize {
            break;
        }
    }
    drop(levels);
    drop(probe);
    if !takes_over {
        let lease = tally::Leased {
            through,
            destination: req.destination,
            owner: req.owner,
            expires_at: req.now.saturating_add(req.lease_ms),
            now: req.now,
        };
        let ids = claimed.events.iter().map(|e| e.id);
        tally::leased(
            conn,
            &lease,
            ids.chain(claimed.unreadable.iter().map(|u| u.id)),
        )?;
    }
    for row in &claimed.unreadable {
        tally::around(conn, &[row.id], || {
            dead_letter_unreadable(conn, row, req.owner, req.now)
        })?;
    }
    Ok(claimed)
}

/// What is left of a claim's limits.
struct Room {
    events: i64,
    bytes: i64,
}

/// Claims due rows of priority `level` into `claimed`, within `room`; inside
/// [`tally::around`] if it `takes_over` tallied leases.
fn claim_level(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    level: i64,
    room: Room,
    takes_over: bool,
    claimed: &mut Claimed,
) -> Result<()> {
    let lease = Lease {
        destination: req.destination,
        owner: req.owner,
        expires_at: req.now.saturating_add(req.lease_ms),
        priority: u8::try_from(level).unwrap_or(crate::outbound::DEFAULT_PRIORITY),
    };
    // Now on the clock of before a step noticed lately.
    let before_step = req.now.saturating_sub(req.clock_step_ms);
    let walk = params![
        req.owner,
        lease.expires_at,
        req.now,
        req.destination,
        room.events,
        req.default_source,
        req.now.saturating_add(LEASE_CLOCK_SKEW_MS),
        level,
        req.spare_leases,
        before_step,
        before_step.saturating_add(LEASE_CLOCK_SKEW_MS),
    ];
    let candidates = if req.clock_step_ms == 0 {
        fitting_candidates(conn, CLAIM_CANDIDATES_SQL, &walk[..9], room.bytes, &lease)?
    } else {
        fitting_candidates(
            conn,
            CLAIM_CANDIDATES_AFTER_STEP_SQL,
            walk,
            room.bytes,
            &lease,
        )?
    };
    if candidates.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = candidates.iter().map(|c| c.id).collect();
    if let Some(bound) = req.numbering_bound {
        let newest = ids.iter().copied().max().unwrap_or(0);
        if !numbering::is_off() && newest - numbering::numbered_from(conn)? > bound {
            claimed.numbering_needed = Some(newest);
            return Ok(());
        }
    }
    if takes_over {
        return tally::around(conn, &ids, || {
            lease_rows(conn, req, &lease, &ids, candidates, claimed)
        });
    }
    lease_rows(conn, req, &lease, &ids, candidates, claimed)
}

/// Leases `ids` (the ids of `candidates`, in order) with [`LEASE_RANGE_SQL`] or
/// [`LEASE_LIST_SQL`], numbering them on the way, and hands their events to `claimed`.
fn lease_rows(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    lease: &Lease<'_>,
    ids: &[i64],
    candidates: Vec<Candidate>,
    claimed: &mut Claimed,
) -> Result<()> {
    // The numbers of every row up to the newest claimed, given in this transaction: the
    // lease writes its rows' numbers itself when they run on from the first, the plan
    // writes the rest (and all of them otherwise).
    let mut first_number = None;
    // Ids that run on without a gap are the common case (one destination's backlog, oldest
    // first): leased as a range, and numbered without a second walk if they are one stream's.
    let first_id = ids.first().copied().unwrap_or(0);
    let runs_on = ids.iter().zip(first_id..).all(|(id, next)| *id == next);
    let plan = match one_stream(&candidates).filter(|_| runs_on) {
        Some(stream) => {
            let (first, count) = (ids[0], ids.len() as i64);
            match numbering::plan_run(conn, (req.destination, stream), first, count)? {
                Some(plan) => Some(plan),
                None => numbering::plan(conn, ids.iter().copied().max().unwrap_or(0))?,
            }
        }
        None => numbering::plan(conn, ids.iter().copied().max().unwrap_or(0))?,
    };
    if let Some(plan) = &plan {
        first_number = ids
            .first()
            .and_then(|first| plan.number_of(*first))
            .filter(|first| {
                ids.iter()
                    .zip(*first..)
                    .all(|(id, number)| plan.number_of(*id) == Some(number))
            });
        let mut written = Vec::new();
        if first_number.is_some() {
            written = ids.to_vec();
            written.sort_unstable();
        }
        plan.write(conn, &written)?;
    }
    let (sql, ids_param, param_count) = if runs_on {
        (LEASE_RANGE_SQL, Value::Integer(first_id), 6)
    } else {
        (
            LEASE_LIST_SQL,
            Value::Text(json_ids(ids.iter().copied())),
            5,
        )
    };
    let last_id = first_id.saturating_add(ids.len() as i64 - 1);
    let params = params![
        lease.owner,
        lease.expires_at,
        req.now,
        ids_param,
        first_number,
        last_id
    ];
    let leased = conn.prepare_cached(sql)?.execute(&params[..param_count])?;
    // Chosen in this write transaction, so every one is still there to lease.
    debug_assert_eq!(leased, ids.len());
    for (at, candidate) in candidates.into_iter().enumerate() {
        match candidate.event {
            Ok(mut event) => {
                // The number the lease or the plan just wrote, where the row had none.
                if event.stream_seq.is_none() {
                    event.stream_seq = match (first_number, &plan) {
                        (Some(first), _) => Some(first + at as i64),
                        (None, Some(plan)) => plan.number_of(event.id),
                        (None, None) => None,
                    };
                }
                claimed.events.push(event);
            }
            Err(error) => claimed.unreadable.push(Unreadable {
                id: candidate.id,
                error,
            }),
        }
    }
    Ok(())
}

/// The source of `candidates` when they are one stream's rows, none numbered yet: with ids
/// that run on, their numbers can be planned without reading them again
/// ([`numbering::plan_run`]).
fn one_stream(candidates: &[Candidate]) -> Option<&str> {
    let source = candidates.first()?.event.as_ref().ok()?.source.as_str();
    candidates
        .iter()
        .all(|c| {
            c.event.as_ref().is_ok_and(|event| {
                !c.unsourced && event.stream_seq.is_none() && event.source == source
            })
        })
        .then_some(source)
}

/// The lease a claim writes, which every row it returns carries: known before the claim,
/// so not read back from each row.
pub(crate) struct Lease<'a> {
    pub destination: &'a str,
    pub owner: &'a str,
    pub expires_at: i64,
    /// The priority level the rows were claimed at (a claim takes one level at a time).
    pub priority: u8,
}

/// Reads one row of the claim's candidates (what the lease does not write), or of a
/// `RETURNING` list in that order.
pub(crate) fn decode_event(
    r: &rusqlite::Row<'_>,
    lease: &Lease<'_>,
) -> rusqlite::Result<OutboundEvent> {
    Ok(OutboundEvent {
        id: r.get(0)?,
        event_id: r.get(1)?,
        destination: lease.destination.to_string(),
        event_type: r.get(2)?,
        source: r.get(3)?,
        subject: r.get(4)?,
        partition_key: r.get(5)?,
        idempotency_key: r.get(6)?,
        payload: r.get(7)?,
        created_at: r.get(8)?,
        attempts: r.get(9)?,
        lease_owner: lease.owner.to_string(),
        lease_expires_at: lease.expires_at,
        expires_at: r.get(10)?,
        traceparent: r.get(11)?,
        tracestate: r.get(12)?,
        dataschema: r.get(13)?,
        stream_seq: r.get(14)?,
        priority: lease.priority,
        lease_ends: None,
    })
}

/// Dead-letters a claimed row that could not be read, and lets its key's next event go
/// (found in SQL, since the row's own key may be what is unreadable).
fn dead_letter_unreadable(
    conn: &Connection,
    row: &Unreadable,
    owner: &str,
    now: i64,
) -> Result<()> {
    let changed = conn
        .prepare_cached(
            "UPDATE outbox_events
                SET dead_at = ?3, last_error = ?4, last_attempted_at = ?3,
                    lease_owner = NULL, lease_expires_at = NULL
              WHERE id = ?1 AND lease_owner = ?2",
        )?
        .execute(params![row.id, owner, now, row.error])?;
    if changed == 1 {
        conn.prepare_cached(concat!(
            "UPDATE outbox_events SET available_at = ?2
              WHERE available_at = ",
            parked!(),
            " AND id = (
                    SELECT MIN(k.id) FROM outbox_events AS k, outbox_events AS d
                     WHERE d.id = ?1 AND k.partition_key = d.partition_key
                       AND k.destination = d.destination AND ",
            pending!("k."),
            ")"
        ))?
        .execute(params![row.id, now])?;
    }
    Ok(())
}

/// Re-anchors rows of `destination` whose due time was written while the clock was ahead:
/// a row whose anchor (its last attempt, or its commit for a fresh row) lies after `now`
/// keeps the wait it was given, counted from `now` instead. A fresh row is due at once; a
/// retry scheduled 5 minutes after an attempt "tomorrow" is due 5 minutes from now. Returns
/// how many rows moved. Walks only rows not yet due (the pending index), so the writer runs
/// it at start and when it sees the clock jump, not on every turn.
pub(crate) fn reanchor_future(conn: &Connection, destination: &str, now: i64) -> Result<usize> {
    Ok(conn
        .prepare_cached(REANCHOR_SQL)?
        .execute(params![destination, now])?)
}

/// When the next row of `destination` becomes claimable after `now` (unix ms): a row
/// written with a delay or a retry scheduled by another relay or an earlier run falling due,
/// or the lease of a due row held by another relay ending (a crashed one's). Leases whose
/// owner starts with `own_leases` (this relay's, in flight) are left out: its workers
/// answer for those. The writer sleeps until then instead of claiming on a timer. Parked
/// rows (behind their key) are not counted: the ack that unparks them wakes the writer.
pub(crate) fn next_due_after(
    conn: &Connection,
    destination: &str,
    now: i64,
    own_leases: &str,
) -> Result<Option<i64>> {
    let due: Option<i64> = conn
        .prepare_cached(NEXT_DUE_SQL)?
        .query_row(params![destination, now], |r| r.get(0))?;
    let lease_ends: Option<i64> = conn
        .prepare_cached(NEXT_LEASE_END_SQL)?
        .query_row(params![destination, now, own_leases], |r| r.get(0))?;
    Ok([due, lease_ends].into_iter().flatten().min())
}

/// The earliest end of a lease on a due row of `?1` after `?2` whose owner does not start
/// with `?3`. Walks the due rows the claim left (after a short claim: the leased ones, this
/// relay's in flight and other relays'), so it costs what is in flight, not the backlog.
const NEXT_LEASE_END_SQL: &str = concat!(
    "SELECT min(lease_expires_at) FROM outbox_events
      WHERE destination = ?1 AND priority IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) AND ",
    pending!(""),
    " AND available_at <= ?2 AND lease_expires_at > ?2
      AND substr(lease_owner, 1, length(?3)) <> ?3"
);

/// [`next_due_after`]'s statement: one seek into the pending index per priority level.
const NEXT_DUE_SQL: &str = concat!(
    "SELECT min((SELECT e.available_at FROM outbox_events AS e
                  WHERE e.destination = ?1 AND e.priority = level.column1 AND ",
    pending!("e."),
    " AND e.available_at > ?2 AND e.available_at < ",
    parked!(),
    "       ORDER BY e.available_at LIMIT 1))
       FROM (VALUES (9), (8), (7), (6), (5), (4), (3), (2), (1), (0)) AS level"
);

/// [`reanchor_future`]'s statement, `?1` the destination and `?2` now. It runs under the
/// write lock at every relay start, so it seeks the rows due after now instead of walking
/// the destination's backlog: the pending index orders by priority before due time, so
/// only `priority IN (…)` (every level, as the column's CHECK allows) lets the due-time
/// bound narrow it. Without it, 2M pending rows held the lock 160 ms and an app's commit
/// from another process waited 130 to 230 ms at each relay start.
pub(super) const REANCHOR_SQL: &str = concat!(
    "UPDATE outbox_events
        SET available_at = ?2 + MAX(0, available_at - COALESCE(last_attempted_at, created_at))
      WHERE destination = ?1 AND priority IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) AND ",
    pending!(""),
    " AND available_at > ?2 AND available_at < ",
    parked!(),
    " AND COALESCE(last_attempted_at, created_at) > ?2"
);
