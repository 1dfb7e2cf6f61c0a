-- sqlite-outbox schema: the one source of truth, applied by src/store/database.rs.
--
-- Each `-- version N` line starts migration N. A database records the last
-- migration it has applied in its table outbox_schema (never in PRAGMA
-- user_version, which is the app's; releases before 0.2 kept it there, and
-- a file they made is taken over once); opening it applies every
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
-- totals kept by triggers (see src/store/limits.rs, which creates them: they cost
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
-- highest id a delete took when the table keeps nothing as high (and 0 when it does), and
-- an insert continues above it when the table has nothing higher (src/store/queue/,
-- `keep_ids_rising`). AUTOINCREMENT would do the same for every writer but costs one more
-- page write per commit, 12-15% of a one-event enqueue.
ALTER TABLE outbox_stats ADD COLUMN high_water INTEGER NOT NULL DEFAULT 0;
UPDATE outbox_stats SET high_water = (SELECT COALESCE(MAX(id), 0) FROM outbox_events);

-- version 5

-- Costs that must not grow with history (src/ops/admin.rs, src/store/queue/):
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
-- it counts as expired, whatever its length (src/store/queue/).
ALTER TABLE outbox_events ADD COLUMN leased_at INTEGER;
CREATE INDEX outbox_events_droppable
    ON outbox_events (id)
    WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL;

-- version 6

-- Priority, 0 (least urgent) to 9 (most urgent), default 5: among due events a claim
-- takes the most urgent first. The pending index leads with (destination, priority), so a
-- claim is one short range per priority level, each stopping at its first row not yet due
-- (src/store/queue/): its cost stays that of the due rows, as before. A key's events still go
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
-- next event is unparked), while dead-letter queries exclude it (src/store/queue/ `dead!`).
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

-- version 9

-- Settings every writer follows (src/store/settings.rs has the keys): routes, storage limits and
-- policies, the default source, priorities, lifetimes, the payload limit. The Rust
-- builder writes what it was given, `outbox config set` checks and writes one, the
-- enqueue triggers below read them on every insert.
CREATE TABLE outbox_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- A caller of the SQL contract reads its event's id back by its idempotency key.
CREATE INDEX outbox_events_idempotency_key
    ON outbox_events (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The SQL contract, stable from this version on: any SQLite client (3.40 or later, no
-- extension) enqueues in its own transaction with
--
--   INSERT INTO outbox_enqueue (type, data, key, idempotency_key, subject, source,
--                               coalesce_key, priority, expires_in_ms) VALUES (...);
--
-- every column but `type` optional; `data` is JSON text. The triggers give the event what
-- `Outbox::enqueue` gives it: checks that fail the statement with `RAISE(ABORT, 'outbox:
-- …')` (the caller's transaction and its other writes stay usable), routing, a coalesced
-- event replaced, room made under the storage limits, an idempotency key's repeat ignored,
-- a UUIDv7 id whose time never goes back in commit order, parking behind the key's
-- pending events, and an id (the `sequence`) above every id ever given.
CREATE VIEW outbox_enqueue (type, data, key, idempotency_key, subject, source, coalesce_key,
                            priority, expires_in_ms)
    AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

-- Internal, not part of the contract: making way for an event (rows replaced by
-- coalescing, dropped under a storage limit, or the event refused when nothing can make
-- room). The enqueue trigger inserts here only when the event has a coalescing key or a
-- limit is set, so the common event costs one test (a trigger of its own with a WHEN
-- clause would cost every insert the setup of its program).
CREATE VIEW outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    AS SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER outbox_enqueue_insert INSTEAD OF INSERT ON outbox_enqueue
BEGIN
    -- Checks, with Outbox::enqueue's limits.
    SELECT CASE
           WHEN typeof(NEW.type) <> 'text' OR length(CAST(NEW.type AS BLOB)) NOT BETWEEN 1 AND 255
           THEN RAISE(ABORT, 'outbox: type must be text of 1 to 255 bytes')
           WHEN NEW.data IS NOT NULL AND (typeof(NEW.data) <> 'text' OR NOT json_valid(NEW.data))
           THEN RAISE(ABORT, 'outbox: data must be JSON text (leave it out for null)')
           WHEN NEW.key IS NOT NULL AND (typeof(NEW.key) <> 'text'
                OR length(CAST(NEW.key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: key must be text of at most 255 bytes')
           WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text'
                OR length(CAST(NEW.idempotency_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: idempotency_key must be text of at most 255 bytes')
           WHEN NEW.subject IS NOT NULL AND (typeof(NEW.subject) <> 'text'
                OR length(CAST(NEW.subject AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: subject must be text of at most 255 bytes')
           WHEN NEW.coalesce_key IS NOT NULL AND (typeof(NEW.coalesce_key) <> 'text'
                OR length(CAST(NEW.coalesce_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: coalesce_key must be text of at most 255 bytes')
           WHEN NEW.source IS NOT NULL AND (typeof(NEW.source) <> 'text'
                OR length(CAST(NEW.source AS BLOB)) > 1024)
           THEN RAISE(ABORT, 'outbox: source must be text of at most 1024 bytes')
           WHEN NEW.priority IS NOT NULL
                AND (typeof(NEW.priority) <> 'integer' OR NEW.priority NOT BETWEEN 0 AND 9)
           THEN RAISE(ABORT, 'outbox: priority must be a whole number from 0 (least urgent) to 9 (most urgent)')
           WHEN NEW.expires_in_ms IS NOT NULL
                AND (typeof(NEW.expires_in_ms) <> 'integer' OR NEW.expires_in_ms < 1)
           THEN RAISE(ABORT, 'outbox: expires_in_ms must be a whole number of milliseconds, at least 1')
           WHEN length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB))
                > COALESCE((SELECT CAST(value AS INTEGER) FROM outbox_settings
                             WHERE key = 'payload_limit'), 262144)
           THEN RAISE(ABORT, 'outbox: data is over the payload limit (setting payload_limit, 262144 bytes unless set)')
           END;

    -- Make way (only with a coalescing key or a storage limit, and never for a repeated
    -- idempotency key, which changes nothing at all).
    INSERT INTO outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    SELECT NEW.type, NEW.coalesce_key, routes, json_array_length(routes),
           json_array_length(routes) * length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB)),
           max(CAST(strftime('%s', 'now') AS INTEGER) * 1000
                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER),
               COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0))
      FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END AS routes
             WHERE NEW.coalesce_key IS NOT NULL OR EXISTS (SELECT 1 FROM outbox_settings WHERE key IN ('max_pending', 'max_pending_bytes')))
     WHERE NEW.idempotency_key IS NULL OR EXISTS (
               SELECT 1 FROM json_each(routes) AS d
                WHERE NOT EXISTS (SELECT 1 FROM outbox_events AS e
                                   WHERE e.destination = d.value
                                     AND e.idempotency_key = NEW.idempotency_key));

    -- One row per destination, one event id for all of them.
    INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type, source,
                               subject, partition_key, payload, created_at, available_at,
                               coalesce_key, droppable, priority, expires_at)
    SELECT x.top + d.key + 1, x.eid, d.value, NEW.idempotency_key, NEW.type,
           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                    '/sqlite-outbox'),
           NEW.subject, NEW.key, json(COALESCE(NEW.data, 'null')), x.ms,
           CASE WHEN NEW.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM outbox_events AS k
                     WHERE k.partition_key = NEW.key AND k.destination = d.value
                       AND k.delivered_at IS NULL AND k.dead_at IS NULL)
                THEN 9223372036854775807 ELSE x.ms END,
           NEW.coalesce_key,
           COALESCE((SELECT value FROM (SELECT s.value = 'drop_oldest' AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'policy:' AND s.key < 'policy;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'policy:' AND s.key < 'policy;')), 0),
           COALESCE(NEW.priority, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'priority:' AND s.key < 'priority;'
                   AND (substr(s.key, 10) = NEW.type OR (substr(substr(s.key, 10), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 10)) - 1) = substr(substr(s.key, 10), 1, length(substr(s.key, 10)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'priority:' AND s.key < 'priority;')), 5),
           x.ms + COALESCE(NEW.expires_in_ms, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'expiry:' AND s.key < 'expiry;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'expiry:' AND s.key < 'expiry;')))
      FROM (SELECT ms, printf('%08x-%04x-7%s-%s%s-%s', ms >> 16, ms & 65535, substr(h, 1, 3),
                         substr('89ab', 1 + (abs(random()) % 4), 1), substr(h, 4, 3), substr(h, 7, 12)) AS eid,
                   max(COALESCE((SELECT MAX(id) FROM outbox_events), 0),
                       (SELECT high_water FROM outbox_stats WHERE id = 1)) AS top
              FROM (SELECT max(CAST(strftime('%s', 'now') AS INTEGER) * 1000
                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER),
               COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0)) AS ms, lower(hex(randomblob(9))) AS h) LIMIT 1) AS x,
           json_each(COALESCE(NULLIF(CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END, '[]'),
                     RAISE(ABORT, 'outbox: no route matches this type (settings route:<pattern>)'))) AS d
     WHERE true
    ON CONFLICT DO NOTHING;

END;

-- Coalescing replaces the pending, unleased (lease_owner IS NULL) events of this type and
-- coalescing key; a storage limit drops the oldest pending, unleased events of drop_oldest types until
-- NEW.rows rows of NEW.bytes bytes fit, as Outbox::enqueue does, or refuses the event.
-- Rows leaving are marked dead_at = -1 (replaced) or -2 (dropped): out of pending, into
-- the dead index, where the statements that count them, unpark their keys' next events and
-- delete them find them.
CREATE TRIGGER outbox_enqueue_make_way_insert INSTEAD OF INSERT ON outbox_enqueue_make_way
BEGIN
    UPDATE outbox_events SET dead_at = -1
     WHERE NEW.coalesce_key IS NOT NULL
       AND event_type = NEW.type AND coalesce_key = NEW.coalesce_key
       AND destination IN (SELECT value FROM json_each(NEW.routes))
       AND delivered_at IS NULL AND dead_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= NEW.ms);
    UPDATE outbox_events SET dead_at = -2
     WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= NEW.ms)
       AND id <= max(
           CASE WHEN COALESCE((SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending'), 0) > 0
                THEN (SELECT id FROM outbox_events WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= NEW.ms)
                       ORDER BY id LIMIT 1 OFFSET COALESCE((SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending'), 0) - 1)
                ELSE 0 END,
           CASE WHEN COALESCE((SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes'), 0) > 0
                THEN (SELECT id FROM (
                          SELECT id, SUM(length(CAST(payload AS BLOB))) OVER (ORDER BY id) AS run
                            FROM outbox_events WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= NEW.ms))
                       WHERE run >= COALESCE((SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes'), 0) ORDER BY id LIMIT 1)
                ELSE 0 END);
    UPDATE outbox_stats
       SET coalesced = coalesced + (SELECT COUNT(*) FROM outbox_events
                                     WHERE dead_at = -1 AND delivered_at IS NULL),
           dropped = dropped + (SELECT COUNT(*) FROM outbox_events
                                 WHERE dead_at = -2 AND delivered_at IS NULL),
           high_water = max(high_water, (SELECT COALESCE(MAX(id), 0) FROM outbox_events))
     WHERE id = 1 AND EXISTS (SELECT 1 FROM outbox_events
                               WHERE dead_at IN (-1, -2) AND delivered_at IS NULL);
    UPDATE outbox_events SET available_at = NEW.ms
     WHERE available_at = 9223372036854775807 AND id IN (
           SELECT (SELECT MIN(k.id) FROM outbox_events AS k
                    WHERE k.partition_key = v.partition_key AND k.destination = v.destination
                      AND k.delivered_at IS NULL AND k.dead_at IS NULL)
             FROM outbox_events AS v
            WHERE v.dead_at IN (-1, -2) AND v.delivered_at IS NULL
              AND v.partition_key IS NOT NULL);
    DELETE FROM outbox_events WHERE dead_at IN (-1, -2) AND delivered_at IS NULL;
    -- Over a limit with nothing left to drop: the whole statement is undone.
    SELECT CASE
           WHEN (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending') < (SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows
           THEN RAISE(ABORT, 'outbox: full: the max_pending setting is reached and no drop_oldest policy makes room')
           WHEN (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes') < (SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes
           THEN RAISE(ABORT, 'outbox: full: the max_pending_bytes setting is reached and no drop_oldest policy makes room')
           END;
END;


-- version 10

-- The oldest pending event without a pass over pending rows (`stats`, `health`; see
-- src/store/oldest.rs). An enqueued row is due at its commit time (available_at = created_at)
-- or parked, and a parked row is never the oldest (an older event of its key is pending).
-- Only a later write moves a row's due time elsewhere (a retry's backoff, an unparking, an
-- operator's retry, a re-anchoring): such rows are listed here by age. So the oldest
-- pending row is the first one here or, among the rows still due at their commit time, the
-- first in the pending index's due-time order. An enqueue never writes this index.
CREATE INDEX outbox_events_moved
    ON outbox_events (destination, created_at)
    WHERE delivered_at IS NULL AND dead_at IS NULL
      AND available_at <> created_at AND available_at < 9223372036854775807;

-- version 11

-- Kept totals of the pending rows, so `stats` beside a week's backlog reads what it
-- returns rather than the backlog (src/tally.rs). They cover the rows up to
-- `tallied_through`; rows above it (ids only rise, so every enqueue lands there and pays
-- nothing) are counted when read, and folded in by `stats` when it can take the write lock
-- for a moment. Every write that moves a tallied row into or out of pending, spends its
-- attempts or leases it keeps the totals in the same transaction.
ALTER TABLE outbox_stats ADD COLUMN tallied_through INTEGER NOT NULL DEFAULT 0;

-- Pending rows by destination and attempts spent: how many, and their payload bytes.
CREATE TABLE outbox_pending_tally (
    destination TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    rows        INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    PRIMARY KEY (destination, attempts)
) WITHOUT ROWID;

-- Leased pending rows by lease (one claim's owner) and destination. A lease counts as in
-- flight while it holds: not yet expired, and not taken while the clock was ahead.
CREATE TABLE outbox_lease_tally (
    owner       TEXT    NOT NULL,
    destination TEXT    NOT NULL,
    expires_at  INTEGER NOT NULL,
    leased_at   INTEGER NOT NULL,
    rows        INTEGER NOT NULL,
    PRIMARY KEY (owner, destination)
) WITHOUT ROWID;

-- A pending row deleted (replaced by coalescing, dropped under a storage limit, by this
-- crate or through the SQL contract, which marks them dead_at -1 or -2 first) leaves the
-- totals, and its lease (one that ran out, else it would not be deleted) with it. Only
-- functions of SQLite 3.40, as the enqueue triggers: any writer's SQLite runs it.
CREATE TRIGGER outbox_events_tallied_delete AFTER DELETE ON outbox_events
WHEN OLD.delivered_at IS NULL AND (OLD.dead_at IS NULL OR OLD.dead_at < 0)
     AND OLD.id <= (SELECT tallied_through FROM outbox_stats WHERE id = 1)
BEGIN
    INSERT INTO outbox_pending_tally (destination, attempts, rows, bytes)
    VALUES (OLD.destination, OLD.attempts, -1, -length(CAST(OLD.payload AS BLOB)))
    ON CONFLICT (destination, attempts)
    DO UPDATE SET rows = rows + excluded.rows, bytes = bytes + excluded.bytes;
    INSERT INTO outbox_lease_tally (owner, destination, expires_at, leased_at, rows)
    SELECT OLD.lease_owner, OLD.destination, OLD.lease_expires_at, COALESCE(OLD.leased_at, 0), -1
     WHERE OLD.lease_owner IS NOT NULL AND OLD.lease_expires_at IS NOT NULL
    ON CONFLICT (owner, destination) DO UPDATE SET rows = rows + excluded.rows;
END;

-- version 12

-- The SQL contract after the clock stepped back. The enqueue trigger keeps an event id's
-- time (and `created_at`) from going back in commit order by carrying the newest row's
-- `created_at` forward; it used that same value as the due time, the base of the lifetime
-- and the time that making way compares leases with, so once any row was written while
-- the clock was ahead every later event waited for that old future. Now those use the
-- real now. A lifetime too long to add to now (`expires_in_ms` of i64::MAX, "never") is
-- clamped to the largest time, instead of overflowing into a REAL that a claim cannot read.
DROP TRIGGER outbox_enqueue_insert;

CREATE TRIGGER outbox_enqueue_insert INSTEAD OF INSERT ON outbox_enqueue
BEGIN
    -- Checks, with Outbox::enqueue's limits.
    SELECT CASE
           WHEN typeof(NEW.type) <> 'text' OR length(CAST(NEW.type AS BLOB)) NOT BETWEEN 1 AND 255
           THEN RAISE(ABORT, 'outbox: type must be text of 1 to 255 bytes')
           WHEN NEW.data IS NOT NULL AND (typeof(NEW.data) <> 'text' OR NOT json_valid(NEW.data))
           THEN RAISE(ABORT, 'outbox: data must be JSON text (leave it out for null)')
           WHEN NEW.key IS NOT NULL AND (typeof(NEW.key) <> 'text'
                OR length(CAST(NEW.key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: key must be text of at most 255 bytes')
           WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text'
                OR length(CAST(NEW.idempotency_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: idempotency_key must be text of at most 255 bytes')
           WHEN NEW.subject IS NOT NULL AND (typeof(NEW.subject) <> 'text'
                OR length(CAST(NEW.subject AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: subject must be text of at most 255 bytes')
           WHEN NEW.coalesce_key IS NOT NULL AND (typeof(NEW.coalesce_key) <> 'text'
                OR length(CAST(NEW.coalesce_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: coalesce_key must be text of at most 255 bytes')
           WHEN NEW.source IS NOT NULL AND (typeof(NEW.source) <> 'text'
                OR length(CAST(NEW.source AS BLOB)) > 1024)
           THEN RAISE(ABORT, 'outbox: source must be text of at most 1024 bytes')
           WHEN NEW.priority IS NOT NULL
                AND (typeof(NEW.priority) <> 'integer' OR NEW.priority NOT BETWEEN 0 AND 9)
           THEN RAISE(ABORT, 'outbox: priority must be a whole number from 0 (least urgent) to 9 (most urgent)')
           WHEN NEW.expires_in_ms IS NOT NULL
                AND (typeof(NEW.expires_in_ms) <> 'integer' OR NEW.expires_in_ms < 1)
           THEN RAISE(ABORT, 'outbox: expires_in_ms must be a whole number of milliseconds, at least 1')
           WHEN length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB))
                > COALESCE((SELECT CAST(value AS INTEGER) FROM outbox_settings
                             WHERE key = 'payload_limit'), 262144)
           THEN RAISE(ABORT, 'outbox: data is over the payload limit (setting payload_limit, 262144 bytes unless set)')
           END;

    -- Make way (only with a coalescing key or a storage limit, and never for a repeated
    -- idempotency key, which changes nothing at all).
    INSERT INTO outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    SELECT NEW.type, NEW.coalesce_key, routes, json_array_length(routes),
           json_array_length(routes) * length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB)),
           CAST(strftime('%s', 'now') AS INTEGER) * 1000
               + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)
      FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END AS routes
             WHERE NEW.coalesce_key IS NOT NULL OR EXISTS (SELECT 1 FROM outbox_settings WHERE key IN ('max_pending', 'max_pending_bytes')))
     WHERE NEW.idempotency_key IS NULL OR EXISTS (
               SELECT 1 FROM json_each(routes) AS d
                WHERE NOT EXISTS (SELECT 1 FROM outbox_events AS e
                                   WHERE e.destination = d.value
                                     AND e.idempotency_key = NEW.idempotency_key));

    -- One row per destination, one event id for all of them.
    INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type, source,
                               subject, partition_key, payload, created_at, available_at,
                               coalesce_key, droppable, priority, expires_at)
    SELECT x.top + d.key + 1, x.eid, d.value, NEW.idempotency_key, NEW.type,
           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                    '/sqlite-outbox'),
           NEW.subject, NEW.key, json(COALESCE(NEW.data, 'null')), x.ms,
           CASE WHEN NEW.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM outbox_events AS k
                     WHERE k.partition_key = NEW.key AND k.destination = d.value
                       AND k.delivered_at IS NULL AND k.dead_at IS NULL)
                THEN 9223372036854775807 ELSE x.now END,
           NEW.coalesce_key,
           COALESCE((SELECT value FROM (SELECT s.value = 'drop_oldest' AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'policy:' AND s.key < 'policy;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'policy:' AND s.key < 'policy;')), 0),
           COALESCE(NEW.priority, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'priority:' AND s.key < 'priority;'
                   AND (substr(s.key, 10) = NEW.type OR (substr(substr(s.key, 10), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 10)) - 1) = substr(substr(s.key, 10), 1, length(substr(s.key, 10)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'priority:' AND s.key < 'priority;')), 5),
           CASE WHEN x.life > 9223372036854775807 - x.now THEN 9223372036854775807
                ELSE x.now + x.life END
      FROM (SELECT ms, now, life,
                   printf('%08x-%04x-7%s-%s%s-%s', ms >> 16, ms & 65535, substr(h, 1, 3),
                         substr('89ab', 1 + (abs(random()) % 4), 1), substr(h, 4, 3), substr(h, 7, 12)) AS eid,
                   max(COALESCE((SELECT MAX(id) FROM outbox_events), 0),
                       (SELECT high_water FROM outbox_stats WHERE id = 1)) AS top
              FROM (SELECT max(now, COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0)) AS ms,
                           now, h,
                           COALESCE(NEW.expires_in_ms, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'expiry:' AND s.key < 'expiry;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'expiry:' AND s.key < 'expiry;'))) AS life
                      FROM (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000
                                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) AS now,
                                   lower(hex(randomblob(9))) AS h)) LIMIT 1) AS x,
           json_each(COALESCE(NULLIF(CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END, '[]'),
                     RAISE(ABORT, 'outbox: no route matches this type (settings route:<pattern>)'))) AS d
     WHERE true
    ON CONFLICT DO NOTHING;

END;

-- version 13

-- Trace context and the data's schema, stored with the event: the W3C `traceparent` and
-- `tracestate` of the work that wrote it (the CloudEvents Distributed Tracing extension, set
-- once at creation and sent unchanged on every hop), and the CloudEvents `dataschema` URI.
-- The SQL contract takes them as columns of the same names; the view is made again with
-- them (an INSERT that names its columns, as the contract shows, is unchanged), and its
-- trigger checks them with Outbox::enqueue's rules (src/wire/trace_context.rs).
ALTER TABLE outbox_events ADD COLUMN traceparent TEXT;
ALTER TABLE outbox_events ADD COLUMN tracestate TEXT;
ALTER TABLE outbox_events ADD COLUMN dataschema TEXT;

DROP VIEW outbox_enqueue;

CREATE VIEW outbox_enqueue (type, data, key, idempotency_key, subject, source, coalesce_key,
                            priority, expires_in_ms, traceparent, tracestate, dataschema)
    AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER outbox_enqueue_insert INSTEAD OF INSERT ON outbox_enqueue
BEGIN
    -- Checks, with Outbox::enqueue's limits.
    SELECT CASE
           WHEN typeof(NEW.type) <> 'text' OR length(CAST(NEW.type AS BLOB)) NOT BETWEEN 1 AND 255
           THEN RAISE(ABORT, 'outbox: type must be text of 1 to 255 bytes')
           WHEN NEW.data IS NOT NULL AND (typeof(NEW.data) <> 'text' OR NOT json_valid(NEW.data))
           THEN RAISE(ABORT, 'outbox: data must be JSON text (leave it out for null)')
           WHEN NEW.key IS NOT NULL AND (typeof(NEW.key) <> 'text'
                OR length(CAST(NEW.key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: key must be text of at most 255 bytes')
           WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text'
                OR length(CAST(NEW.idempotency_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: idempotency_key must be text of at most 255 bytes')
           WHEN NEW.subject IS NOT NULL AND (typeof(NEW.subject) <> 'text'
                OR length(CAST(NEW.subject AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: subject must be text of at most 255 bytes')
           WHEN NEW.coalesce_key IS NOT NULL AND (typeof(NEW.coalesce_key) <> 'text'
                OR length(CAST(NEW.coalesce_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: coalesce_key must be text of at most 255 bytes')
           WHEN NEW.source IS NOT NULL AND (typeof(NEW.source) <> 'text'
                OR length(CAST(NEW.source AS BLOB)) > 1024)
           THEN RAISE(ABORT, 'outbox: source must be text of at most 1024 bytes')
           WHEN NEW.priority IS NOT NULL
                AND (typeof(NEW.priority) <> 'integer' OR NEW.priority NOT BETWEEN 0 AND 9)
           THEN RAISE(ABORT, 'outbox: priority must be a whole number from 0 (least urgent) to 9 (most urgent)')
           WHEN NEW.expires_in_ms IS NOT NULL
                AND (typeof(NEW.expires_in_ms) <> 'integer' OR NEW.expires_in_ms < 1)
           THEN RAISE(ABORT, 'outbox: expires_in_ms must be a whole number of milliseconds, at least 1')
           WHEN NEW.traceparent IS NOT NULL AND (typeof(NEW.traceparent) <> 'text'
                OR NOT NEW.traceparent GLOB '00-' || replace(hex(zeroblob(16)), '0', '[0-9a-f]')
                       || '-' || replace(hex(zeroblob(8)), '0', '[0-9a-f]') || '-[0-9a-f][0-9a-f]'
                OR substr(NEW.traceparent, 4, 32) = hex(zeroblob(16))
                OR substr(NEW.traceparent, 37, 16) = hex(zeroblob(8)))
           THEN RAISE(ABORT, 'outbox: traceparent must be W3C Trace Context version 00: 00-{32 lowercase hex trace id}-{16 lowercase hex parent id}-{2 hex flags}, ids not all zeros')
           WHEN NEW.tracestate IS NOT NULL AND NEW.traceparent IS NULL
           THEN RAISE(ABORT, 'outbox: tracestate is set without a traceparent, which it belongs to')
           WHEN NEW.tracestate IS NOT NULL AND (typeof(NEW.tracestate) <> 'text'
                OR length(CAST(NEW.tracestate AS BLOB)) > 512
                OR NEW.tracestate GLOB '*[^ -~' || char(9) || ']*'
                OR length(NEW.tracestate) - length(replace(NEW.tracestate, ',', '')) > 31
                OR EXISTS (
                    SELECT 1 FROM (SELECT m, instr(m, '=') AS eq, instr(m, '@') AS at
                                     FROM (SELECT trim(value, ' ' || char(9)) AS m
                                             FROM json_each('["' || replace(replace(replace(replace(
                                                      NEW.tracestate, '\', '\\'), '"', '\"'),
                                                      char(9), '\t'), ',', '","') || '"]')))
                     WHERE m <> '' AND NOT (
                           eq > 1
                           -- the value: 1 to 256 of printable ASCII but , and =, no trailing space
                           AND length(m) - eq BETWEEN 1 AND 256
                           AND instr(substr(m, eq + 1), '=') = 0
                           AND substr(m, -1) <> ' ' AND instr(m, char(9)) = 0
                           -- the key: simple, or tenant@system
                           AND NOT substr(m, 1, eq - 1) GLOB '*[^a-z0-9_*/@-]*'
                           AND CASE WHEN at = 0 OR at > eq
                                    THEN substr(m, 1, 1) GLOB '[a-z]' AND eq - 1 <= 256
                                    ELSE at BETWEEN 2 AND 242 AND eq - at - 1 BETWEEN 1 AND 14
                                         AND substr(m, 1, 1) GLOB '[a-z0-9]'
                                         AND substr(m, at + 1, 1) GLOB '[a-z]'
                                         AND instr(substr(m, at + 1, eq - at - 1), '@') = 0
                               END))
                OR (SELECT count(*) - count(DISTINCT k)
                      FROM (SELECT substr(m, 1, instr(m, '=') - 1) AS k
                              FROM (SELECT trim(value, ' ' || char(9)) AS m
                                      FROM json_each('["' || replace(replace(replace(replace(
                                               NEW.tracestate, '\', '\\'), '"', '\"'),
                                               char(9), '\t'), ',', '","') || '"]'))
                             WHERE m <> '')) > 0)
           THEN RAISE(ABORT, 'outbox: tracestate must be W3C Trace Context: at most 32 key=value members, each key once, at most 512 bytes')
           WHEN NEW.dataschema IS NOT NULL AND (typeof(NEW.dataschema) <> 'text'
                OR length(CAST(NEW.dataschema AS BLOB)) > 1024
                OR NOT NEW.dataschema GLOB '[A-Za-z]*:*'
                OR substr(NEW.dataschema, 1, instr(NEW.dataschema, ':') - 1) GLOB '*[^A-Za-z0-9+.-]*'
                OR NEW.dataschema GLOB '*[^!-~]*')
           THEN RAISE(ABORT, 'outbox: dataschema must be an absolute URI (a scheme such as https:, visible ASCII, at most 1024 bytes)')
           WHEN length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB))
                > COALESCE((SELECT CAST(value AS INTEGER) FROM outbox_settings
                             WHERE key = 'payload_limit'), 262144)
           THEN RAISE(ABORT, 'outbox: data is over the payload limit (setting payload_limit, 262144 bytes unless set)')
           END;

    -- Make way (only with a coalescing key or a storage limit, and never for a repeated
    -- idempotency key, which changes nothing at all).
    INSERT INTO outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    SELECT NEW.type, NEW.coalesce_key, routes, json_array_length(routes),
           json_array_length(routes) * length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB)),
           CAST(strftime('%s', 'now') AS INTEGER) * 1000
               + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)
      FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END AS routes
             WHERE NEW.coalesce_key IS NOT NULL OR EXISTS (SELECT 1 FROM outbox_settings WHERE key IN ('max_pending', 'max_pending_bytes')))
     WHERE NEW.idempotency_key IS NULL OR EXISTS (
               SELECT 1 FROM json_each(routes) AS d
                WHERE NOT EXISTS (SELECT 1 FROM outbox_events AS e
                                   WHERE e.destination = d.value
                                     AND e.idempotency_key = NEW.idempotency_key));

    -- One row per destination, one event id for all of them.
    INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type, source,
                               subject, partition_key, payload, created_at, available_at,
                               coalesce_key, droppable, priority, expires_at, traceparent,
                               tracestate, dataschema)
    SELECT x.top + d.key + 1, x.eid, d.value, NEW.idempotency_key, NEW.type,
           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                    '/sqlite-outbox'),
           NEW.subject, NEW.key, json(COALESCE(NEW.data, 'null')), x.ms,
           CASE WHEN NEW.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM outbox_events AS k
                     WHERE k.partition_key = NEW.key AND k.destination = d.value
                       AND k.delivered_at IS NULL AND k.dead_at IS NULL)
                THEN 9223372036854775807 ELSE x.now END,
           NEW.coalesce_key,
           COALESCE((SELECT value FROM (SELECT s.value = 'drop_oldest' AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'policy:' AND s.key < 'policy;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'policy:' AND s.key < 'policy;')), 0),
           COALESCE(NEW.priority, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'priority:' AND s.key < 'priority;'
                   AND (substr(s.key, 10) = NEW.type OR (substr(substr(s.key, 10), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 10)) - 1) = substr(substr(s.key, 10), 1, length(substr(s.key, 10)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'priority:' AND s.key < 'priority;')), 5),
           CASE WHEN x.life > 9223372036854775807 - x.now THEN 9223372036854775807
                ELSE x.now + x.life END,
           NEW.traceparent, NEW.tracestate, NEW.dataschema
      FROM (SELECT ms, now, life,
                   printf('%08x-%04x-7%s-%s%s-%s', ms >> 16, ms & 65535, substr(h, 1, 3),
                         substr('89ab', 1 + (abs(random()) % 4), 1), substr(h, 4, 3), substr(h, 7, 12)) AS eid,
                   max(COALESCE((SELECT MAX(id) FROM outbox_events), 0),
                       (SELECT high_water FROM outbox_stats WHERE id = 1)) AS top
              FROM (SELECT max(now, COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0)) AS ms,
                           now, h,
                           COALESCE(NEW.expires_in_ms, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'expiry:' AND s.key < 'expiry;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'expiry:' AND s.key < 'expiry;'))) AS life
                      FROM (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000
                                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) AS now,
                                   lower(hex(randomblob(9))) AS h)) LIMIT 1) AS x,
           json_each(COALESCE(NULLIF(CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END, '[]'),
                     RAISE(ABORT, 'outbox: no route matches this type (settings route:<pattern>)'))) AS d
     WHERE true
    ON CONFLICT DO NOTHING;

END;

-- version 14

-- Delivered history deleted, whatever the retention, to make room on a full disk
-- (src/store/disk_room.rs): counted apart from retention's prunes, as `stats` shows it.
ALTER TABLE outbox_stats ADD COLUMN pruned_for_room INTEGER NOT NULL DEFAULT 0;

-- Coalescing and the storage limit make way only among rows with no lease at all
-- (lease_owner IS NULL), never among rows whose lease merely looks expired by this
-- connection's clock: the wall clock steps, and a row still leased may be in flight right
-- now (a relay judges its own leases by its monotonic clock). A lease a crashed relay left
-- keeps its row until a relay takes it over. Same as Outbox::enqueue (src/store/queue/insert.rs).
DROP TRIGGER outbox_enqueue_make_way_insert;

CREATE TRIGGER outbox_enqueue_make_way_insert INSTEAD OF INSERT ON outbox_enqueue_make_way
BEGIN
    UPDATE outbox_events SET dead_at = -1
     WHERE NEW.coalesce_key IS NOT NULL
       AND event_type = NEW.type AND coalesce_key = NEW.coalesce_key
       AND destination IN (SELECT value FROM json_each(NEW.routes))
       AND delivered_at IS NULL AND dead_at IS NULL AND lease_owner IS NULL;
    UPDATE outbox_events SET dead_at = -2
     WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND lease_owner IS NULL
       AND id <= max(
           CASE WHEN COALESCE((SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending'), 0) > 0
                THEN (SELECT id FROM outbox_events WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND lease_owner IS NULL
                       ORDER BY id LIMIT 1 OFFSET COALESCE((SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending'), 0) - 1)
                ELSE 0 END,
           CASE WHEN COALESCE((SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes'), 0) > 0
                THEN (SELECT id FROM (
                          SELECT id, SUM(length(CAST(payload AS BLOB))) OVER (ORDER BY id) AS run
                            FROM outbox_events WHERE droppable = 1 AND delivered_at IS NULL AND dead_at IS NULL AND lease_owner IS NULL)
                       WHERE run >= COALESCE((SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes - (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes'), 0) ORDER BY id LIMIT 1)
                ELSE 0 END);
    UPDATE outbox_stats
       SET coalesced = coalesced + (SELECT COUNT(*) FROM outbox_events
                                     WHERE dead_at = -1 AND delivered_at IS NULL),
           dropped = dropped + (SELECT COUNT(*) FROM outbox_events
                                 WHERE dead_at = -2 AND delivered_at IS NULL),
           high_water = max(high_water, (SELECT COALESCE(MAX(id), 0) FROM outbox_events))
     WHERE id = 1 AND EXISTS (SELECT 1 FROM outbox_events
                               WHERE dead_at IN (-1, -2) AND delivered_at IS NULL);
    UPDATE outbox_events SET available_at = NEW.ms
     WHERE available_at = 9223372036854775807 AND id IN (
           SELECT (SELECT MIN(k.id) FROM outbox_events AS k
                    WHERE k.partition_key = v.partition_key AND k.destination = v.destination
                      AND k.delivered_at IS NULL AND k.dead_at IS NULL)
             FROM outbox_events AS v
            WHERE v.dead_at IN (-1, -2) AND v.delivered_at IS NULL
              AND v.partition_key IS NOT NULL);
    DELETE FROM outbox_events WHERE dead_at IN (-1, -2) AND delivered_at IS NULL;
    -- Over a limit with nothing left to drop: the whole statement is undone.
    SELECT CASE
           WHEN (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending') < (SELECT pending_count FROM outbox_stats WHERE id = 1) + NEW.rows
           THEN RAISE(ABORT, 'outbox: full: the max_pending setting is reached and no drop_oldest policy makes room')
           WHEN (SELECT CAST(value AS INTEGER) FROM outbox_settings WHERE key = 'max_pending_bytes') < (SELECT pending_bytes FROM outbox_stats WHERE id = 1) + NEW.bytes
           THEN RAISE(ABORT, 'outbox: full: the max_pending_bytes setting is reached and no drop_oldest policy makes room')
           END;
END;

-- version 15

-- Stream numbers: every event gets, when its transaction commits, the next number of a
-- gapless sequence per destination and source (1, 2, 3, ...), so the fleet can tell which
-- numbers it lacks. A row's number is one above the highest its stream holds
-- (`outbox_events_stream`) or ever held (`outbox_streams.high_water`, kept by the trigger
-- below as rows leave), so a rolled-back transaction or a repeated idempotency key takes
-- none, and a deleted number is never given again. `Outbox::enqueue` and `enqueue_many`
-- number their rows (src/store/queue/numbering.rs), the SQL contract's trigger its own.
-- Rows delivered before this version keep no number.
ALTER TABLE outbox_events ADD COLUMN stream_seq INTEGER;

-- `synced_through` is the number through which every event of the stream is delivered (with
-- a receipt where the destination requires them) or accounted to the destination, which
-- took the accounting; `synced_at` when it last moved (unix ms). Kept by the relay.
CREATE TABLE outbox_streams (
    destination    TEXT    NOT NULL,
    source         TEXT    NOT NULL,
    high_water     INTEGER NOT NULL,
    synced_through INTEGER NOT NULL DEFAULT 0,
    synced_at      INTEGER,
    PRIMARY KEY (destination, source)
) WITHOUT ROWID;

UPDATE outbox_events
   SET source = COALESCE(source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                         '/sqlite-outbox')
 WHERE source IS NULL AND delivered_at IS NULL;
UPDATE outbox_events SET stream_seq = n.seq
  FROM (SELECT id, row_number() OVER (PARTITION BY destination, source ORDER BY id) AS seq
          FROM outbox_events WHERE delivered_at IS NULL) AS n
 WHERE n.id = outbox_events.id;

CREATE INDEX outbox_events_stream
    ON outbox_events (destination, source, stream_seq)
    WHERE stream_seq IS NOT NULL;

-- The fates of numbered events that left the file undelivered, kept so the fleet can be
-- told (src/relay/accounting.rs): replaced by coalescing, dropped by a storage limit (this
-- crate's own deletes record those), and rows deleted after they expired, were exported or
-- went dead (purged), recorded by the trigger below. A pending row deleted by hand is
-- recorded nowhere: the fleet names its number as missing, as it should.
CREATE TABLE outbox_fates (
    destination TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    stream_seq  INTEGER NOT NULL,
    fate        TEXT    NOT NULL CHECK (fate IN ('expired', 'dropped', 'coalesced', 'purged', 'exported')),
    PRIMARY KEY (destination, source, stream_seq)
) WITHOUT ROWID;

-- A numbered row leaving the file: its stream keeps the number as given (whatever deleted
-- it: retention, a purge, a hand), and an undelivered one that had left pending keeps its
-- fate.
CREATE TRIGGER outbox_events_stream_delete AFTER DELETE ON outbox_events
WHEN OLD.stream_seq IS NOT NULL
BEGIN
    INSERT INTO outbox_streams (destination, source, high_water)
    VALUES (OLD.destination, OLD.source, OLD.stream_seq)
    ON CONFLICT (destination, source) DO UPDATE SET high_water = max(high_water, excluded.high_water);
    INSERT OR REPLACE INTO outbox_fates (destination, source, stream_seq, fate)
    SELECT OLD.destination, OLD.source, OLD.stream_seq,
           CASE WHEN OLD.dead_at = -1 THEN 'coalesced'
                WHEN OLD.dead_at = -2 THEN 'dropped'
                WHEN OLD.expired_at IS NOT NULL THEN 'expired'
                WHEN OLD.exported_at IS NOT NULL THEN 'exported'
                ELSE 'purged' END
     WHERE OLD.delivered_at IS NULL AND OLD.dead_at IS NOT NULL;
END;

-- The SQL contract numbers its rows as Outbox::enqueue does (the view is unchanged).
DROP TRIGGER outbox_enqueue_insert;

CREATE TRIGGER outbox_enqueue_insert INSTEAD OF INSERT ON outbox_enqueue
BEGIN
    -- Checks, with Outbox::enqueue's limits.
    SELECT CASE
           WHEN typeof(NEW.type) <> 'text' OR length(CAST(NEW.type AS BLOB)) NOT BETWEEN 1 AND 255
           THEN RAISE(ABORT, 'outbox: type must be text of 1 to 255 bytes')
           WHEN NEW.data IS NOT NULL AND (typeof(NEW.data) <> 'text' OR NOT json_valid(NEW.data))
           THEN RAISE(ABORT, 'outbox: data must be JSON text (leave it out for null)')
           WHEN NEW.key IS NOT NULL AND (typeof(NEW.key) <> 'text'
                OR length(CAST(NEW.key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: key must be text of at most 255 bytes')
           WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text'
                OR length(CAST(NEW.idempotency_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: idempotency_key must be text of at most 255 bytes')
           WHEN NEW.subject IS NOT NULL AND (typeof(NEW.subject) <> 'text'
                OR length(CAST(NEW.subject AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: subject must be text of at most 255 bytes')
           WHEN NEW.coalesce_key IS NOT NULL AND (typeof(NEW.coalesce_key) <> 'text'
                OR length(CAST(NEW.coalesce_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: coalesce_key must be text of at most 255 bytes')
           WHEN NEW.source IS NOT NULL AND (typeof(NEW.source) <> 'text'
                OR length(CAST(NEW.source AS BLOB)) > 1024)
           THEN RAISE(ABORT, 'outbox: source must be text of at most 1024 bytes')
           WHEN NEW.priority IS NOT NULL
                AND (typeof(NEW.priority) <> 'integer' OR NEW.priority NOT BETWEEN 0 AND 9)
           THEN RAISE(ABORT, 'outbox: priority must be a whole number from 0 (least urgent) to 9 (most urgent)')
           WHEN NEW.expires_in_ms IS NOT NULL
                AND (typeof(NEW.expires_in_ms) <> 'integer' OR NEW.expires_in_ms < 1)
           THEN RAISE(ABORT, 'outbox: expires_in_ms must be a whole number of milliseconds, at least 1')
           WHEN NEW.traceparent IS NOT NULL AND (typeof(NEW.traceparent) <> 'text'
                OR NOT NEW.traceparent GLOB '00-' || replace(hex(zeroblob(16)), '0', '[0-9a-f]')
                       || '-' || replace(hex(zeroblob(8)), '0', '[0-9a-f]') || '-[0-9a-f][0-9a-f]'
                OR substr(NEW.traceparent, 4, 32) = hex(zeroblob(16))
                OR substr(NEW.traceparent, 37, 16) = hex(zeroblob(8)))
           THEN RAISE(ABORT, 'outbox: traceparent must be W3C Trace Context version 00: 00-{32 lowercase hex trace id}-{16 lowercase hex parent id}-{2 hex flags}, ids not all zeros')
           WHEN NEW.tracestate IS NOT NULL AND NEW.traceparent IS NULL
           THEN RAISE(ABORT, 'outbox: tracestate is set without a traceparent, which it belongs to')
           WHEN NEW.tracestate IS NOT NULL AND (typeof(NEW.tracestate) <> 'text'
                OR length(CAST(NEW.tracestate AS BLOB)) > 512
                OR NEW.tracestate GLOB '*[^ -~' || char(9) || ']*'
                OR length(NEW.tracestate) - length(replace(NEW.tracestate, ',', '')) > 31
                OR EXISTS (
                    SELECT 1 FROM (SELECT m, instr(m, '=') AS eq, instr(m, '@') AS at
                                     FROM (SELECT trim(value, ' ' || char(9)) AS m
                                             FROM json_each('["' || replace(replace(replace(replace(
                                                      NEW.tracestate, '\', '\\'), '"', '\"'),
                                                      char(9), '\t'), ',', '","') || '"]')))
                     WHERE m <> '' AND NOT (
                           eq > 1
                           -- the value: 1 to 256 of printable ASCII but , and =, no trailing space
                           AND length(m) - eq BETWEEN 1 AND 256
                           AND instr(substr(m, eq + 1), '=') = 0
                           AND substr(m, -1) <> ' ' AND instr(m, char(9)) = 0
                           -- the key: simple, or tenant@system
                           AND NOT substr(m, 1, eq - 1) GLOB '*[^a-z0-9_*/@-]*'
                           AND CASE WHEN at = 0 OR at > eq
                                    THEN substr(m, 1, 1) GLOB '[a-z]' AND eq - 1 <= 256
                                    ELSE at BETWEEN 2 AND 242 AND eq - at - 1 BETWEEN 1 AND 14
                                         AND substr(m, 1, 1) GLOB '[a-z0-9]'
                                         AND substr(m, at + 1, 1) GLOB '[a-z]'
                                         AND instr(substr(m, at + 1, eq - at - 1), '@') = 0
                               END))
                OR (SELECT count(*) - count(DISTINCT k)
                      FROM (SELECT substr(m, 1, instr(m, '=') - 1) AS k
                              FROM (SELECT trim(value, ' ' || char(9)) AS m
                                      FROM json_each('["' || replace(replace(replace(replace(
                                               NEW.tracestate, '\', '\\'), '"', '\"'),
                                               char(9), '\t'), ',', '","') || '"]'))
                             WHERE m <> '')) > 0)
           THEN RAISE(ABORT, 'outbox: tracestate must be W3C Trace Context: at most 32 key=value members, each key once, at most 512 bytes')
           WHEN NEW.dataschema IS NOT NULL AND (typeof(NEW.dataschema) <> 'text'
                OR length(CAST(NEW.dataschema AS BLOB)) > 1024
                OR NOT NEW.dataschema GLOB '[A-Za-z]*:*'
                OR substr(NEW.dataschema, 1, instr(NEW.dataschema, ':') - 1) GLOB '*[^A-Za-z0-9+.-]*'
                OR NEW.dataschema GLOB '*[^!-~]*')
           THEN RAISE(ABORT, 'outbox: dataschema must be an absolute URI (a scheme such as https:, visible ASCII, at most 1024 bytes)')
           WHEN length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB))
                > COALESCE((SELECT CAST(value AS INTEGER) FROM outbox_settings
                             WHERE key = 'payload_limit'), 262144)
           THEN RAISE(ABORT, 'outbox: data is over the payload limit (setting payload_limit, 262144 bytes unless set)')
           END;

    -- Make way (only with a coalescing key or a storage limit, and never for a repeated
    -- idempotency key, which changes nothing at all).
    INSERT INTO outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    SELECT NEW.type, NEW.coalesce_key, routes, json_array_length(routes),
           json_array_length(routes) * length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB)),
           CAST(strftime('%s', 'now') AS INTEGER) * 1000
               + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)
      FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END AS routes
             WHERE NEW.coalesce_key IS NOT NULL OR EXISTS (SELECT 1 FROM outbox_settings WHERE key IN ('max_pending', 'max_pending_bytes')))
     WHERE NEW.idempotency_key IS NULL OR EXISTS (
               SELECT 1 FROM json_each(routes) AS d
                WHERE NOT EXISTS (SELECT 1 FROM outbox_events AS e
                                   WHERE e.destination = d.value
                                     AND e.idempotency_key = NEW.idempotency_key));

    -- One row per destination, one event id for all of them.
    INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type, source,
                               subject, partition_key, payload, created_at, available_at,
                               coalesce_key, droppable, priority, expires_at, traceparent,
                               tracestate, dataschema, stream_seq)
    SELECT x.top + d.key + 1, x.eid, d.value, NEW.idempotency_key, NEW.type,
           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                    '/sqlite-outbox'),
           NEW.subject, NEW.key, json(COALESCE(NEW.data, 'null')), x.ms,
           CASE WHEN NEW.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM outbox_events AS k
                     WHERE k.partition_key = NEW.key AND k.destination = d.value
                       AND k.delivered_at IS NULL AND k.dead_at IS NULL)
                THEN 9223372036854775807 ELSE x.now END,
           NEW.coalesce_key,
           COALESCE((SELECT value FROM (SELECT s.value = 'drop_oldest' AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'policy:' AND s.key < 'policy;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'policy:' AND s.key < 'policy;')), 0),
           COALESCE(NEW.priority, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'priority:' AND s.key < 'priority;'
                   AND (substr(s.key, 10) = NEW.type OR (substr(substr(s.key, 10), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 10)) - 1) = substr(substr(s.key, 10), 1, length(substr(s.key, 10)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'priority:' AND s.key < 'priority;')), 5),
           CASE WHEN x.life > 9223372036854775807 - x.now THEN 9223372036854775807
                ELSE x.now + x.life END,
           NEW.traceparent, NEW.tracestate, NEW.dataschema,
           -- The stream's next number: one row per destination, each its own stream.
           max(COALESCE((SELECT MAX(n.stream_seq) FROM outbox_events AS n
                          WHERE n.destination = d.value AND n.source = x.source
                            AND n.stream_seq IS NOT NULL), 0),
               COALESCE((SELECT t.high_water FROM outbox_streams AS t
                          WHERE t.destination = d.value AND t.source = x.source), 0)) + 1
      FROM (SELECT ms, now, life, source,
                   printf('%08x-%04x-7%s-%s%s-%s', ms >> 16, ms & 65535, substr(h, 1, 3),
                         substr('89ab', 1 + (abs(random()) % 4), 1), substr(h, 4, 3), substr(h, 7, 12)) AS eid,
                   max(COALESCE((SELECT MAX(id) FROM outbox_events), 0),
                       (SELECT high_water FROM outbox_stats WHERE id = 1)) AS top
              FROM (SELECT max(now, COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0)) AS ms,
                           now, h,
                           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                                    '/sqlite-outbox') AS source,
                           COALESCE(NEW.expires_in_ms, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'expiry:' AND s.key < 'expiry;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'expiry:' AND s.key < 'expiry;'))) AS life
                      FROM (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000
                                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) AS now,
                                   lower(hex(randomblob(9))) AS h)) LIMIT 1) AS x,
           json_each(COALESCE(NULLIF(CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END, '[]'),
                     RAISE(ABORT, 'outbox: no route matches this type (settings route:<pattern>)'))) AS d
     WHERE true
    ON CONFLICT DO NOTHING;

END;

-- version 16

-- Stream numbers given as the relay takes rows, not inside the app's INSERT. Version 15
-- read each row's number from an index on its stream inside the writer's INSERT: one more
-- index entry per row and one more page per commit, and any read of the table inside the
-- INSERT costs about 10% of a bare one (docs/PERFORMANCE.md). A stream's numbers follow its
-- rows' ids (commit order: the writer holding the lock takes the next id), so a row's number
-- is known from the moment it commits: one above the stream's high water plus its place
-- among the stream's rows not numbered yet. It is written into the row (`stream_seq`) when
-- it is first needed: by the relay before it claims or exports (src/store/queue/numbering.rs),
-- by a read of the streams' accounts, and by the trigger below when such a row is deleted,
-- which numbers every row before it and records the deleted row's number (and its fate). So
-- every number is given exactly once, in commit order, whoever writes or deletes.
-- `numbered_through`: every row with an id at or below it is numbered (or has no source: a row
-- older than numbering). `outbox_streams.high_water` is now exactly the highest number the
-- stream gave.
ALTER TABLE outbox_stats ADD COLUMN numbered_through INTEGER NOT NULL DEFAULT 0;
INSERT INTO outbox_streams (destination, source, high_water)
SELECT destination, source, MAX(stream_seq) FROM outbox_events
 WHERE stream_seq IS NOT NULL
 GROUP BY destination, source
ON CONFLICT (destination, source) DO UPDATE SET high_water = max(high_water, excluded.high_water);
UPDATE outbox_stats SET numbered_through = COALESCE((SELECT MAX(id) FROM outbox_events), 0)
 WHERE id = 1;
DROP INDEX outbox_events_stream;

-- A row deleted before it was numbered (a hand's delete, a purge of rows that expired
-- offline, the SQL contract making way): the rows before it are numbered first, then it takes
-- its own number, which its stream keeps as given, with its fate if it had left pending.
CREATE TRIGGER outbox_events_unnumbered_delete AFTER DELETE ON outbox_events
WHEN OLD.stream_seq IS NULL AND OLD.source IS NOT NULL
     AND OLD.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
BEGIN
    UPDATE outbox_events SET stream_seq = n.seq
      FROM (SELECT e.id AS id,
                   COALESCE((SELECT t.high_water FROM outbox_streams AS t
                              WHERE t.destination = e.destination AND t.source = e.source), 0)
                   + row_number() OVER (PARTITION BY e.destination, e.source ORDER BY e.id) AS seq
              FROM outbox_events AS e
             WHERE e.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
               AND e.id < OLD.id AND e.source IS NOT NULL AND e.stream_seq IS NULL) AS n
     WHERE outbox_events.id = n.id
       AND outbox_events.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
       AND outbox_events.id < OLD.id;
    INSERT INTO outbox_streams (destination, source, high_water)
    SELECT destination, source, MAX(stream_seq) FROM outbox_events
     WHERE id > (SELECT numbered_through FROM outbox_stats WHERE id = 1) AND id < OLD.id
       AND stream_seq IS NOT NULL
     GROUP BY destination, source
    ON CONFLICT (destination, source) DO UPDATE SET high_water = max(high_water, excluded.high_water);
    INSERT INTO outbox_streams (destination, source, high_water)
    VALUES (OLD.destination, OLD.source, 1)
    ON CONFLICT (destination, source) DO UPDATE SET high_water = high_water + 1;
    INSERT OR REPLACE INTO outbox_fates (destination, source, stream_seq, fate)
    SELECT OLD.destination, OLD.source, t.high_water,
           CASE WHEN OLD.dead_at = -1 THEN 'coalesced'
                WHEN OLD.dead_at = -2 THEN 'dropped'
                WHEN OLD.expired_at IS NOT NULL THEN 'expired'
                WHEN OLD.exported_at IS NOT NULL THEN 'exported'
                ELSE 'purged' END
      FROM outbox_streams AS t
     WHERE t.destination = OLD.destination AND t.source = OLD.source
       AND OLD.delivered_at IS NULL AND OLD.dead_at IS NOT NULL;
    UPDATE outbox_stats SET numbered_through = OLD.id WHERE id = 1;
END;

-- The SQL contract writes rows without a number, as `Outbox::enqueue` does (the view is
-- unchanged).
DROP TRIGGER outbox_enqueue_insert;

CREATE TRIGGER outbox_enqueue_insert INSTEAD OF INSERT ON outbox_enqueue
BEGIN
    -- Checks, with Outbox::enqueue's limits.
    SELECT CASE
           WHEN typeof(NEW.type) <> 'text' OR length(CAST(NEW.type AS BLOB)) NOT BETWEEN 1 AND 255
           THEN RAISE(ABORT, 'outbox: type must be text of 1 to 255 bytes')
           WHEN NEW.data IS NOT NULL AND (typeof(NEW.data) <> 'text' OR NOT json_valid(NEW.data))
           THEN RAISE(ABORT, 'outbox: data must be JSON text (leave it out for null)')
           WHEN NEW.key IS NOT NULL AND (typeof(NEW.key) <> 'text'
                OR length(CAST(NEW.key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: key must be text of at most 255 bytes')
           WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text'
                OR length(CAST(NEW.idempotency_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: idempotency_key must be text of at most 255 bytes')
           WHEN NEW.subject IS NOT NULL AND (typeof(NEW.subject) <> 'text'
                OR length(CAST(NEW.subject AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: subject must be text of at most 255 bytes')
           WHEN NEW.coalesce_key IS NOT NULL AND (typeof(NEW.coalesce_key) <> 'text'
                OR length(CAST(NEW.coalesce_key AS BLOB)) > 255)
           THEN RAISE(ABORT, 'outbox: coalesce_key must be text of at most 255 bytes')
           WHEN NEW.source IS NOT NULL AND (typeof(NEW.source) <> 'text'
                OR length(CAST(NEW.source AS BLOB)) > 1024)
           THEN RAISE(ABORT, 'outbox: source must be text of at most 1024 bytes')
           WHEN NEW.priority IS NOT NULL
                AND (typeof(NEW.priority) <> 'integer' OR NEW.priority NOT BETWEEN 0 AND 9)
           THEN RAISE(ABORT, 'outbox: priority must be a whole number from 0 (least urgent) to 9 (most urgent)')
           WHEN NEW.expires_in_ms IS NOT NULL
                AND (typeof(NEW.expires_in_ms) <> 'integer' OR NEW.expires_in_ms < 1)
           THEN RAISE(ABORT, 'outbox: expires_in_ms must be a whole number of milliseconds, at least 1')
           WHEN NEW.traceparent IS NOT NULL AND (typeof(NEW.traceparent) <> 'text'
                OR NOT NEW.traceparent GLOB '00-' || replace(hex(zeroblob(16)), '0', '[0-9a-f]')
                       || '-' || replace(hex(zeroblob(8)), '0', '[0-9a-f]') || '-[0-9a-f][0-9a-f]'
                OR substr(NEW.traceparent, 4, 32) = hex(zeroblob(16))
                OR substr(NEW.traceparent, 37, 16) = hex(zeroblob(8)))
           THEN RAISE(ABORT, 'outbox: traceparent must be W3C Trace Context version 00: 00-{32 lowercase hex trace id}-{16 lowercase hex parent id}-{2 hex flags}, ids not all zeros')
           WHEN NEW.tracestate IS NOT NULL AND NEW.traceparent IS NULL
           THEN RAISE(ABORT, 'outbox: tracestate is set without a traceparent, which it belongs to')
           WHEN NEW.tracestate IS NOT NULL AND (typeof(NEW.tracestate) <> 'text'
                OR length(CAST(NEW.tracestate AS BLOB)) > 512
                OR NEW.tracestate GLOB '*[^ -~' || char(9) || ']*'
                OR length(NEW.tracestate) - length(replace(NEW.tracestate, ',', '')) > 31
                OR EXISTS (
                    SELECT 1 FROM (SELECT m, instr(m, '=') AS eq, instr(m, '@') AS at
                                     FROM (SELECT trim(value, ' ' || char(9)) AS m
                                             FROM json_each('["' || replace(replace(replace(replace(
                                                      NEW.tracestate, '\', '\\'), '"', '\"'),
                                                      char(9), '\t'), ',', '","') || '"]')))
                     WHERE m <> '' AND NOT (
                           eq > 1
                           -- the value: 1 to 256 of printable ASCII but , and =, no trailing space
                           AND length(m) - eq BETWEEN 1 AND 256
                           AND instr(substr(m, eq + 1), '=') = 0
                           AND substr(m, -1) <> ' ' AND instr(m, char(9)) = 0
                           -- the key: simple, or tenant@system
                           AND NOT substr(m, 1, eq - 1) GLOB '*[^a-z0-9_*/@-]*'
                           AND CASE WHEN at = 0 OR at > eq
                                    THEN substr(m, 1, 1) GLOB '[a-z]' AND eq - 1 <= 256
                                    ELSE at BETWEEN 2 AND 242 AND eq - at - 1 BETWEEN 1 AND 14
                                         AND substr(m, 1, 1) GLOB '[a-z0-9]'
                                         AND substr(m, at + 1, 1) GLOB '[a-z]'
                                         AND instr(substr(m, at + 1, eq - at - 1), '@') = 0
                               END))
                OR (SELECT count(*) - count(DISTINCT k)
                      FROM (SELECT substr(m, 1, instr(m, '=') - 1) AS k
                              FROM (SELECT trim(value, ' ' || char(9)) AS m
                                      FROM json_each('["' || replace(replace(replace(replace(
                                               NEW.tracestate, '\', '\\'), '"', '\"'),
                                               char(9), '\t'), ',', '","') || '"]'))
                             WHERE m <> '')) > 0)
           THEN RAISE(ABORT, 'outbox: tracestate must be W3C Trace Context: at most 32 key=value members, each key once, at most 512 bytes')
           WHEN NEW.dataschema IS NOT NULL AND (typeof(NEW.dataschema) <> 'text'
                OR length(CAST(NEW.dataschema AS BLOB)) > 1024
                OR NOT NEW.dataschema GLOB '[A-Za-z]*:*'
                OR substr(NEW.dataschema, 1, instr(NEW.dataschema, ':') - 1) GLOB '*[^A-Za-z0-9+.-]*'
                OR NEW.dataschema GLOB '*[^!-~]*')
           THEN RAISE(ABORT, 'outbox: dataschema must be an absolute URI (a scheme such as https:, visible ASCII, at most 1024 bytes)')
           WHEN length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB))
                > COALESCE((SELECT CAST(value AS INTEGER) FROM outbox_settings
                             WHERE key = 'payload_limit'), 262144)
           THEN RAISE(ABORT, 'outbox: data is over the payload limit (setting payload_limit, 262144 bytes unless set)')
           END;

    -- Make way (only with a coalescing key or a storage limit, and never for a repeated
    -- idempotency key, which changes nothing at all).
    INSERT INTO outbox_enqueue_make_way (type, coalesce_key, routes, rows, bytes, ms)
    SELECT NEW.type, NEW.coalesce_key, routes, json_array_length(routes),
           json_array_length(routes) * length(CAST(json(COALESCE(NEW.data, 'null')) AS BLOB)),
           CAST(strftime('%s', 'now') AS INTEGER) * 1000
               + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)
      FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END AS routes
             WHERE NEW.coalesce_key IS NOT NULL OR EXISTS (SELECT 1 FROM outbox_settings WHERE key IN ('max_pending', 'max_pending_bytes')))
     WHERE NEW.idempotency_key IS NULL OR EXISTS (
               SELECT 1 FROM json_each(routes) AS d
                WHERE NOT EXISTS (SELECT 1 FROM outbox_events AS e
                                   WHERE e.destination = d.value
                                     AND e.idempotency_key = NEW.idempotency_key));

    -- One row per destination, one event id for all of them.
    INSERT INTO outbox_events (id, event_id, destination, idempotency_key, event_type, source,
                               subject, partition_key, payload, created_at, available_at,
                               coalesce_key, droppable, priority, expires_at, traceparent,
                               tracestate, dataschema)
    SELECT x.top + d.key + 1, x.eid, d.value, NEW.idempotency_key, NEW.type,
           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                    '/sqlite-outbox'),
           NEW.subject, NEW.key, json(COALESCE(NEW.data, 'null')), x.ms,
           CASE WHEN NEW.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM outbox_events AS k
                     WHERE k.partition_key = NEW.key AND k.destination = d.value
                       AND k.delivered_at IS NULL AND k.dead_at IS NULL)
                THEN 9223372036854775807 ELSE x.now END,
           NEW.coalesce_key,
           COALESCE((SELECT value FROM (SELECT s.value = 'drop_oldest' AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'policy:' AND s.key < 'policy;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'policy:' AND s.key < 'policy;')), 0),
           COALESCE(NEW.priority, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'priority:' AND s.key < 'priority;'
                   AND (substr(s.key, 10) = NEW.type OR (substr(substr(s.key, 10), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 10)) - 1) = substr(substr(s.key, 10), 1, length(substr(s.key, 10)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'priority:' AND s.key < 'priority;')), 5),
           CASE WHEN x.life > 9223372036854775807 - x.now THEN 9223372036854775807
                ELSE x.now + x.life END,
           NEW.traceparent, NEW.tracestate, NEW.dataschema
      FROM (SELECT ms, now, life, source,
                   printf('%08x-%04x-7%s-%s%s-%s', ms >> 16, ms & 65535, substr(h, 1, 3),
                         substr('89ab', 1 + (abs(random()) % 4), 1), substr(h, 4, 3), substr(h, 7, 12)) AS eid,
                   max(COALESCE((SELECT MAX(id) FROM outbox_events), 0),
                       (SELECT high_water FROM outbox_stats WHERE id = 1)) AS top
              FROM (SELECT max(now, COALESCE((SELECT created_at FROM outbox_events ORDER BY id DESC LIMIT 1), 0)) AS ms,
                           now, h,
                           COALESCE(NEW.source, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                                    '/sqlite-outbox') AS source,
                           COALESCE(NEW.expires_in_ms, (SELECT value FROM (SELECT CAST(s.value AS INTEGER) AS value,
                       max((substr(s.key, -1) <> '*') * 1000 + length(s.key))
                  FROM outbox_settings AS s
                 WHERE s.key >= 'expiry:' AND s.key < 'expiry;'
                   AND (substr(s.key, 8) = NEW.type OR (substr(substr(s.key, 8), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 8)) - 1) = substr(substr(s.key, 8), 1, length(substr(s.key, 8)) - 1))))
         WHERE EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'expiry:' AND s.key < 'expiry;'))) AS life
                      FROM (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000
                                   + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) AS now,
                                   lower(hex(randomblob(9))) AS h)) LIMIT 1) AS x,
           json_each(COALESCE(NULLIF(CASE WHEN EXISTS (SELECT 1 FROM outbox_settings AS s WHERE s.key >= 'route:' AND s.key < 'route;')
                THEN (SELECT json_group_array(DISTINCT d.value)
                        FROM outbox_settings AS s, json_each(s.value) AS d
                       WHERE s.key >= 'route:' AND s.key < 'route;'
                         AND (substr(s.key, 7) = NEW.type OR (substr(substr(s.key, 7), -1) = '*'
                    AND substr(NEW.type, 1, length(substr(s.key, 7)) - 1) = substr(substr(s.key, 7), 1, length(substr(s.key, 7)) - 1))))
                ELSE '["default"]' END, '[]'),
                     RAISE(ABORT, 'outbox: no route matches this type (settings route:<pattern>)'))) AS d
     WHERE true
    ON CONFLICT DO NOTHING;

END;

-- version 17

-- Ids are never given twice, whoever deletes. The crate's own deletes keep the id high water
-- (`keep_ids_rising`); a delete by hand or by the app's own cleanup did not, so after the
-- newest rows were deleted the next rows took their ids again, below `numbered_through`,
-- and were never numbered. This trigger keeps the high water for every delete that takes
-- the table's newest row (a seek on the id; the crate's pruning of old rows never takes it).
CREATE TRIGGER outbox_events_top_delete AFTER DELETE ON outbox_events
WHEN OLD.id > (SELECT high_water FROM outbox_stats WHERE id = 1)
     AND NOT EXISTS (SELECT 1 FROM outbox_events WHERE id > OLD.id)
BEGIN
    UPDATE outbox_stats SET high_water = OLD.id WHERE id = 1;
END;

-- Numbers that left pending with no fate: deleted by a hand (or the app's own cleanup)
-- before any destination took them. They are lost, and the fleet names them missing; the
-- device keeps them here so that a stream's synced-through number never passes one. The
-- crate's own deletes of pending rows (coalescing, a storage limit) record their fate
-- instead and take their numbers out of here (src/store/queue/numbering.rs `record_fates`).
CREATE TABLE outbox_lost_numbers (
    destination TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    stream_seq  INTEGER NOT NULL,
    PRIMARY KEY (destination, source, stream_seq)
) WITHOUT ROWID;

CREATE TRIGGER outbox_events_lost_delete AFTER DELETE ON outbox_events
WHEN OLD.stream_seq IS NOT NULL AND OLD.source IS NOT NULL
     AND OLD.delivered_at IS NULL AND OLD.dead_at IS NULL
BEGIN
    INSERT OR IGNORE INTO outbox_lost_numbers (destination, source, stream_seq)
    VALUES (OLD.destination, OLD.source, OLD.stream_seq);
END;

-- The delete trigger of version 16, which now also records a pending row's number as lost.
DROP TRIGGER outbox_events_unnumbered_delete;

CREATE TRIGGER outbox_events_unnumbered_delete AFTER DELETE ON outbox_events
WHEN OLD.stream_seq IS NULL AND OLD.source IS NOT NULL
     AND OLD.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
BEGIN
    UPDATE outbox_events SET stream_seq = n.seq
      FROM (SELECT e.id AS id,
                   COALESCE((SELECT t.high_water FROM outbox_streams AS t
                              WHERE t.destination = e.destination AND t.source = e.source), 0)
                   + row_number() OVER (PARTITION BY e.destination, e.source ORDER BY e.id) AS seq
              FROM outbox_events AS e
             WHERE e.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
               AND e.id < OLD.id AND e.source IS NOT NULL AND e.stream_seq IS NULL) AS n
     WHERE outbox_events.id = n.id
       AND outbox_events.id > (SELECT numbered_through FROM outbox_stats WHERE id = 1)
       AND outbox_events.id < OLD.id;
    INSERT INTO outbox_streams (destination, source, high_water)
    SELECT destination, source, MAX(stream_seq) FROM outbox_events
     WHERE id > (SELECT numbered_through FROM outbox_stats WHERE id = 1) AND id < OLD.id
       AND stream_seq IS NOT NULL
     GROUP BY destination, source
    ON CONFLICT (destination, source) DO UPDATE SET high_water = max(high_water, excluded.high_water);
    INSERT INTO outbox_streams (destination, source, high_water)
    VALUES (OLD.destination, OLD.source, 1)
    ON CONFLICT (destination, source) DO UPDATE SET high_water = high_water + 1;
    INSERT OR REPLACE INTO outbox_fates (destination, source, stream_seq, fate)
    SELECT OLD.destination, OLD.source, t.high_water,
           CASE WHEN OLD.dead_at = -1 THEN 'coalesced'
                WHEN OLD.dead_at = -2 THEN 'dropped'
                WHEN OLD.expired_at IS NOT NULL THEN 'expired'
                WHEN OLD.exported_at IS NOT NULL THEN 'exported'
                ELSE 'purged' END
      FROM outbox_streams AS t
     WHERE t.destination = OLD.destination AND t.source = OLD.source
       AND OLD.delivered_at IS NULL AND OLD.dead_at IS NOT NULL;
    INSERT OR IGNORE INTO outbox_lost_numbers (destination, source, stream_seq)
    SELECT OLD.destination, OLD.source, t.high_water
      FROM outbox_streams AS t
     WHERE t.destination = OLD.destination AND t.source = OLD.source
       AND OLD.delivered_at IS NULL AND OLD.dead_at IS NULL;
    UPDATE outbox_stats SET numbered_through = OLD.id WHERE id = 1;
END;

-- Each stream's count of the accountings its relays told (`seq` on the wire): a receiver
-- never takes an older report's pending numbers over a newer's, across restarts too.
ALTER TABLE outbox_streams ADD COLUMN report_seq INTEGER NOT NULL DEFAULT 0;

-- version 18

-- Repair of a file a release before version 17 left damaged: after a hand or the app's own
-- cleanup deleted the newest rows, the next rows took their ids again, below
-- `numbered_through`, where no numbering looks. Those still pending (or dead) take their
-- numbers now, after their stream's high water in id order, so that they are sent with
-- numbers and the fleet counts them; rows already delivered without a number keep none
-- (the fleet stored them, under no number). One walk of the table, once.
UPDATE outbox_events SET stream_seq = n.seq
  FROM (SELECT e.id AS id,
               COALESCE((SELECT t.high_water FROM outbox_streams AS t
                          WHERE t.destination = e.destination AND t.source = e.source), 0)
               + row_number() OVER (PARTITION BY e.destination, e.source ORDER BY e.id) AS seq
          FROM outbox_events AS e
         WHERE e.id <= (SELECT numbered_through FROM outbox_stats WHERE id = 1)
           AND e.stream_seq IS NULL AND e.delivered_at IS NULL
           AND typeof(e.destination) = 'text' AND typeof(e.source) = 'text') AS n
 WHERE outbox_events.id = n.id;

INSERT INTO outbox_streams (destination, source, high_water)
SELECT destination, source, MAX(stream_seq) FROM outbox_events
 WHERE id <= (SELECT numbered_through FROM outbox_stats WHERE id = 1)
   AND stream_seq IS NOT NULL AND typeof(destination) = 'text' AND typeof(source) = 'text'
 GROUP BY destination, source
ON CONFLICT (destination, source) DO UPDATE SET high_water = max(high_water, excluded.high_water);

-- version 19

-- Each destination's data budget (`Destination::budget`, `outbox relay --budget`): the
-- relay's limit and period, when the current period began (unix ms, aligned on the first
-- period's start) and the bytes it has spent, so that a relay restarted within a period
-- does not start afresh, and `Outbox::budget` and `outbox stats` can say where it stands.
-- Relays add what they spent to `used_bytes`; a new period sets it back to 0.
CREATE TABLE outbox_budgets (
    destination     TEXT PRIMARY KEY,
    limit_bytes     INTEGER NOT NULL,
    period_ms       INTEGER NOT NULL,
    period_started  INTEGER NOT NULL,
    used_bytes      INTEGER NOT NULL DEFAULT 0,
    exempt_priority INTEGER,
    holding         INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
