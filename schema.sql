-- sqlite-outbox schema: the one source of truth, applied by src/database.rs.
--
-- Each `-- version N` line starts migration N. A database records the last
-- migration it has applied in PRAGMA user_version; opening it applies every
-- later migration, each in its own transaction. Never edit a released
-- migration: append a new one.

-- version 1

-- One row is one delivery of one event to one destination. `id` is the
-- commit order; `event_id` is the stable UUIDv7 receivers de-duplicate on.
-- Times are unix milliseconds.
CREATE TABLE outbox_events (
    id                INTEGER PRIMARY KEY,
    event_id          TEXT    NOT NULL,
    destination       TEXT    NOT NULL DEFAULT 'default',
    idempotency_key   TEXT,
    event_type        TEXT    NOT NULL,
    source            TEXT,
    subject           TEXT,
    partition_key     TEXT,
    payload           TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    available_at      INTEGER NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    last_attempted_at INTEGER,
    last_error        TEXT,
    delivered_at      INTEGER,
    dead_at           INTEGER
);

-- The claim seeks to its destination, walks this index in (available_at, id)
-- order and stops at the first row that is not yet due, so its cost depends
-- on that destination's due rows only: never on delivered history, nor on a
-- backlog held for another destination that is down.
CREATE INDEX outbox_events_pending
    ON outbox_events (destination, available_at, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;

-- "Is there an older undelivered event with my partition key?" is one seek
-- here; it is what keeps a key's events in commit order.
CREATE INDEX outbox_events_pending_by_key
    ON outbox_events (partition_key, destination, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL AND partition_key IS NOT NULL;

-- Pruning old deliveries walks only delivered rows.
CREATE INDEX outbox_events_delivered
    ON outbox_events (delivered_at)
    WHERE delivered_at IS NOT NULL;

-- A repeated idempotency key for the same destination is a duplicate, not a
-- second event.
CREATE UNIQUE INDEX outbox_events_idempotency
    ON outbox_events (destination, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- version 2

-- Destinations an operator (or a 410 Gone answer) disabled. A disabled
-- destination's events stay pending until it is enabled again.
CREATE TABLE outbox_destinations (
    name            TEXT PRIMARY KEY,
    disabled_at     INTEGER,
    disabled_reason TEXT
) WITHOUT ROWID;

-- The receiving side: one row per (source, event id) already applied, so a
-- re-delivered event is recognised inside the receiver's own transaction.
CREATE TABLE outbox_inbox (
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;

CREATE INDEX outbox_inbox_received ON outbox_inbox (received_at);

-- version 3

-- Replace-while-pending: an event enqueued with a coalescing key replaces a
-- still-pending, not yet claimed event of the same type, key and destination.
ALTER TABLE outbox_events ADD COLUMN coalesce_key TEXT;

CREATE INDEX outbox_events_pending_by_coalesce_key
    ON outbox_events (event_type, coalesce_key, destination)
    WHERE coalesce_key IS NOT NULL AND delivered_at IS NULL AND dead_at IS NULL;

-- Totals of events dropped by a storage policy and replaced by coalescing,
-- and, while any opener of the file sets a storage limit, exact pending
-- totals kept by triggers (see src/limits.rs, which creates them: they cost
-- every write a little, so files without limits do without them).
CREATE TABLE outbox_stats (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    pending_count INTEGER NOT NULL DEFAULT 0,
    pending_bytes INTEGER NOT NULL DEFAULT 0,
    dropped       INTEGER NOT NULL DEFAULT 0,
    coalesced     INTEGER NOT NULL DEFAULT 0
);

INSERT INTO outbox_stats (id) VALUES (1);

-- version 4

-- Row ids are the `sequence` receivers order a key's events by, so they must never go
-- back. SQLite gives a new row the highest id in the table plus one, so once the newest
-- rows are deleted (pruned, purged, replaced) their ids would be given out again, and after
-- a quiet week a key's sequence would start again at 1. The queue therefore records the
-- highest id before it deletes anything, and an insert continues above it when the table
-- has nothing higher (src/queue.rs). AUTOINCREMENT would do the same for every writer but
-- costs one more page write per commit, 12-15% of a one-event enqueue.
ALTER TABLE outbox_stats ADD COLUMN high_water INTEGER NOT NULL DEFAULT 0;
UPDATE outbox_stats SET high_water = (SELECT COALESCE(MAX(id), 0) FROM outbox_events);

-- version 5

-- Costs that must not grow with history (src/admin.rs, src/queue.rs):
-- `show EVENT_ID` seeks by event id;
CREATE INDEX outbox_events_event_id ON outbox_events (event_id);
-- dead letters are found without reading delivered rows (purge, retry, stats, listing);
CREATE INDEX outbox_events_dead
    ON outbox_events (dead_at)
    WHERE dead_at IS NOT NULL AND delivered_at IS NULL;
-- delivered counts are kept, not counted: the queue adds to them when it acks and takes
-- from them when it prunes.
CREATE TABLE outbox_delivered_totals (
    destination TEXT PRIMARY KEY,
    delivered   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO outbox_delivered_totals (destination, delivered)
SELECT destination, COUNT(*) FROM outbox_events
 WHERE delivered_at IS NOT NULL GROUP BY destination;

-- A full outbox drops the oldest pending events of types the user marked DropOldest. The
-- type's policy is recorded at enqueue (and again for pending rows whenever an outbox with
-- a policy opens the file), so finding the oldest droppable rows is a walk of this index.
ALTER TABLE outbox_events ADD COLUMN droppable INTEGER NOT NULL DEFAULT 0;

-- When the current lease was taken (unix ms, the claiming relay's clock). A lease taken
-- later than now (by more than a few seconds of skew) was taken while the clock was ahead:
-- it counts as expired, whatever its length (src/queue.rs).
ALTER TABLE outbox_events ADD COLUMN leased_at INTEGER;
CREATE INDEX outbox_events_droppable
    ON outbox_events (id)
    WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL;

-- version 6

-- Priority, 0 (least urgent) to 9 (most urgent), default 5: among due events a claim
-- takes the most urgent first. The pending index leads with (destination, priority), so a
-- claim is one short range per priority level, each stopping at its first row not yet due
-- (src/queue.rs): its cost stays that of the due rows, as before. A key's events still go
-- in commit order whatever their priorities, since only a key's head is ever due.
ALTER TABLE outbox_events ADD COLUMN priority INTEGER NOT NULL DEFAULT 5
    CHECK (priority BETWEEN 0 AND 9);
DROP INDEX outbox_events_pending;
CREATE INDEX outbox_events_pending
    ON outbox_events (destination, priority, available_at, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;

-- version 7

-- Expiry: an event not delivered by `expires_at` (unix ms) leaves the pending set as
-- expired, a state of its own. It is stored as a dead row with `expired_at` set, so every
-- pending index and the parking rules treat it like any row that left pending (its key's
-- next event is unparked), while dead-letter queries exclude it (src/queue.rs `dead!`).
-- A claim never takes a row past its deadline; the relay's sweep walks this index.
ALTER TABLE outbox_events ADD COLUMN expires_at INTEGER;
ALTER TABLE outbox_events ADD COLUMN expired_at INTEGER;
CREATE INDEX outbox_events_expiring
    ON outbox_events (expires_at)
    WHERE expires_at IS NOT NULL AND delivered_at IS NULL AND dead_at IS NULL;
-- Events that expired, ever (kept like `dropped`: a count that costs nothing to read).
ALTER TABLE outbox_stats ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;

-- version 8

-- The offline bundle: events written to a signed file (carried out of a site with no uplink)
-- leave the pending set as exported, a state of its own. Like expired, an exported row
-- carries `dead_at` too, so it leaves the pending indexes and unparks its key, while
-- dead-letter queries exclude it.
ALTER TABLE outbox_events ADD COLUMN exported_at INTEGER;
