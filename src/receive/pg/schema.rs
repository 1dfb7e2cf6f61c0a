//! The PostgreSQL schema, in versioned migrations applied in order, each in its own
//! transaction together with its row in `outbox_pg_migrations`.
//!
//! Several ingest processes may start at once against one database: each migration
//! transaction first takes a transaction-level advisory lock, so one process applies a
//! version and the others, once they get the lock, see it applied and skip it.

use postgres::GenericClient;

use crate::error::{Error, Result};

/// Key of the advisory lock that serializes migrations (an arbitrary constant: "outbox").
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78;

/// The migrations, oldest first; version `i + 1` is `MIGRATIONS[i]`. Never edit one that
/// shipped: add the next.
const MIGRATIONS: &[&str] = &[
    // 1: the inbox of `PgInbox::receive`.
    "CREATE TABLE outbox_inbox (
         source      text        NOT NULL,
         event_id    text        NOT NULL,
         received_at timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (source, event_id)
     );
     CREATE INDEX outbox_inbox_received_at ON outbox_inbox (received_at);",
    // 2: what `outbox ingest` stores, and a key's events in sequence order.
    "CREATE TABLE outbox_ingested (
         source       text        NOT NULL,
         id           text        NOT NULL,
         type         text        NOT NULL,
         subject      text,
         partitionkey text,
         sequence     bigint,
         time         timestamptz,
         data         jsonb,
         received_at  timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (source, id)
     );
     CREATE INDEX outbox_ingested_key_order
         ON outbox_ingested (source, partitionkey, sequence)
         WHERE partitionkey IS NOT NULL;
     CREATE INDEX outbox_ingested_received_at ON outbox_ingested (received_at);
     CREATE FUNCTION outbox_key_events(p_source text, p_partitionkey text)
         RETURNS SETOF outbox_ingested
         LANGUAGE sql STABLE
         AS $$ SELECT * FROM outbox_ingested
                WHERE source = p_source AND partitionkey = p_partitionkey
                ORDER BY sequence $$;",
    // 3: the ingest's key registry (re-read when its change counter moves) and the fleet at
    // a glance (`outbox_sources`, kept by the ingest).
    "CREATE TABLE outbox_device_keys (
         key_id         text        PRIMARY KEY,
         source_pattern text        NOT NULL,
         key            text        NOT NULL,
         created_at     timestamptz NOT NULL DEFAULT now(),
         revoked_at     timestamptz
     );
     CREATE TABLE outbox_device_keys_changes (
         only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
         changes  bigint  NOT NULL
     );
     INSERT INTO outbox_device_keys_changes (changes) VALUES (0);
     CREATE FUNCTION outbox_device_keys_changed() RETURNS trigger
         LANGUAGE plpgsql
         AS $$ BEGIN
                 UPDATE outbox_device_keys_changes SET changes = changes + 1;
                 RETURN NULL;
               END $$;
     CREATE TRIGGER outbox_device_keys_changed
         AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox_device_keys
         FOR EACH STATEMENT EXECUTE FUNCTION outbox_device_keys_changed();
     CREATE TABLE outbox_sources (
         source            text        PRIMARY KEY,
         first_seen        timestamptz NOT NULL DEFAULT now(),
         last_seen         timestamptz NOT NULL DEFAULT now(),
         events_stored     bigint      NOT NULL DEFAULT 0,
         newest_event_time timestamptz,
         refusals          bigint      NOT NULL DEFAULT 0
     );
     CREATE INDEX outbox_sources_last_seen ON outbox_sources (last_seen);",
    // 4: each event's trace context (W3C, from the CloudEvents Distributed Tracing
    // extension: where the event was written) and its data schema.
    "ALTER TABLE outbox_ingested
         ADD COLUMN traceparent text,
         ADD COLUMN tracestate  text,
         ADD COLUMN dataschema  text;",
    // 5: each event's stream and number (the `outboxstream` and `outboxseq` extensions),
    // and each stream's latest accounting from its device, for `outbox fleet`.
    "ALTER TABLE outbox_ingested
         ADD COLUMN stream     text,
         ADD COLUMN stream_seq bigint;
     CREATE INDEX outbox_ingested_stream_seq
         ON outbox_ingested (source, stream, stream_seq)
         WHERE stream_seq IS NOT NULL;
     CREATE TABLE outbox_stream_reports (
         source      text        NOT NULL,
         stream      text        NOT NULL,
         high_water  bigint      NOT NULL,
         pending     jsonb       NOT NULL,
         accounted   jsonb       NOT NULL,
         reported_at timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (source, stream)
     );",
    // 6: the numbers ride in the primary key's index (`INCLUDE`) instead of an index of their
    // own: one index entry per stored event, as before numbers, and `outbox fleet` reads
    // them from that index alone. The separate index cost the batched ingest 12-15%.
    "ALTER TABLE outbox_ingested
         DROP CONSTRAINT outbox_ingested_pkey,
         ADD CONSTRAINT outbox_ingested_pkey PRIMARY KEY (source, id) INCLUDE (stream, stream_seq);
     DROP INDEX outbox_ingested_stream_seq;",
    // 7: the fleet's view kept as events and reports are stored, so that reading it costs
    // the streams, not the events: one row per source and stream with the numbers stored
    // (a multirange: one range per run of consecutive numbers, whatever the events' count)
    // and the numbers stored under two event ids. A copy of an event stored before under
    // another number (a redelivery, a second destination, an imported bundle) adds its
    // number here though its event is not stored again. Built from the events stored so far.
    // Each request appends its streams' numbers to `outbox_fleet_log` (no index, no lock
    // another request waits for), which the ingest's probe merges into the summaries.
    // And each stream's last report number from its device (`seq`), so that reports that
    // tell only what changed merge in order.
    "CREATE TABLE outbox_fleet_streams (
         source     text           NOT NULL,
         stream     text           NOT NULL,
         stored     int8multirange NOT NULL DEFAULT '{}',
         reused     int8multirange NOT NULL DEFAULT '{}',
         first_seen timestamptz    NOT NULL DEFAULT now(),
         PRIMARY KEY (source, stream)
     );
     INSERT INTO outbox_fleet_streams (source, stream, stored)
     SELECT source, stream, range_agg(int8range(stream_seq, stream_seq, '[]'))
       FROM outbox_ingested
      WHERE stream IS NOT NULL AND stream_seq IS NOT NULL
      GROUP BY source, stream;
     UPDATE outbox_fleet_streams AS f SET reused = twice.numbers
       FROM (SELECT source, stream, range_agg(int8range(stream_seq, stream_seq, '[]')) AS numbers
               FROM (SELECT source, stream, stream_seq FROM outbox_ingested
                      WHERE stream IS NOT NULL AND stream_seq IS NOT NULL
                      GROUP BY source, stream, stream_seq HAVING count(*) > 1) AS d
              GROUP BY source, stream) AS twice
      WHERE f.source = twice.source AND f.stream = twice.stream;
     INSERT INTO outbox_fleet_streams (source, stream)
     SELECT source, stream FROM outbox_stream_reports
     ON CONFLICT (source, stream) DO NOTHING;
     ALTER TABLE outbox_stream_reports ADD COLUMN report_seq bigint;
     CREATE TABLE outbox_fleet_log (
         source  text           NOT NULL,
         stream  text           NOT NULL,
         numbers int8multirange NOT NULL,
         fresh   int8multirange NOT NULL,
         twice   int8multirange NOT NULL
     );",
];

/// The schema version this build creates.
pub fn schema_version() -> i32 {
    MIGRATIONS.len() as i32
}

/// Creates or upgrades the tables of the inbox and of `outbox ingest` in the database of
/// `client`. Safe to run from several processes at once, and again at every start.
///
/// # Errors
///
/// [`Error::Postgres`] from the server; [`Error::SchemaTooNew`] when the database was
/// migrated by a newer build than this one.
pub fn migrate(client: &mut impl GenericClient) -> Result<()> {
    // Under the lock too: two `CREATE TABLE IF NOT EXISTS` at once can both miss the table
    // and one then fails on the catalog's unique index.
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS outbox_pg_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )?;
    tx.commit()?;
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i32 + 1;
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        // A migration of a big table takes as long as it takes: the connection's statement
        // timeout (the ingest's 5 s) would cancel it for ever. (Taken after the lock: a
        // process waiting for another's migration still waits within its own timeout.)
        tx.batch_execute("SET LOCAL statement_timeout = 0")?;
        let applied = tx
            .query_opt(
                "SELECT 1 FROM outbox_pg_migrations WHERE version = $1",
                &[&version],
            )?
            .is_some();
        if !applied {
            tx.batch_execute(sql)?;
            tx.execute(
                "INSERT INTO outbox_pg_migrations (version) VALUES ($1)",
                &[&version],
            )?;
        }
        tx.commit()?;
    }
    let newest: Option<i32> = client
        .query_one("SELECT max(version) FROM outbox_pg_migrations", &[])?
        .get(0);
    match newest {
        Some(found) if found > schema_version() => Err(Error::SchemaTooNew {
            found: found as i64,
            supported: schema_version() as i64,
        }),
        _ => Ok(()),
    }
}
