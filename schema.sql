-- sqlite-outbox schema: the one source of truth, applied by src/store.rs.
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

-- The claim walks this index in (available_at, id) order and stops at the
-- first row that is not yet due, so its cost depends on the pending rows
-- only, never on how many delivered rows the table keeps.
CREATE INDEX outbox_events_pending
    ON outbox_events (available_at, id)
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
