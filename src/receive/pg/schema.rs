//! The PostgreSQL schema, in versioned migrations applied in order, each in its own
//! transaction together with its row in `outbox_pg_migrations`.
//!
//! Several ingest processes may start at once against one database: the one that takes the
//! session's advisory lock applies the versions not applied yet, the others wait for the
//! lock (polling, never queued behind it: see [`migrate`]) and then find them applied.
//!
//! A big table stays writable while it migrates: an index a migration needs is built
//! `CONCURRENTLY` before the migration's transaction (which then swaps a key onto it in a
//! moment), and no migration runs under a statement timeout. The ingest answers 503 with
//! `Retry-After` until the last version is applied.

use std::time::{Duration, Instant};

use postgres::Client;

use crate::error::{Error, Result};

/// Key of the advisory lock that serializes migrations (an arbitrary constant: "outbox").
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78;

/// How long [`migrate`] waits for another process's migration before it gives up with
/// [`Error::MigrationInProgress`] (the ingest's probe tries again on its next round).
const MIGRATION_WAIT: Duration = Duration::from_secs(10);

/// How often a waiting process looks at the lock again.
const MIGRATION_POLL: Duration = Duration::from_millis(100);

/// An index a migration needs, built `CONCURRENTLY` before its transaction: the table takes
/// writes while it is built, and the migration only swaps it in.
struct BuiltBefore {
    version: i32,
    index: &'static str,
    create: &'static str,
}

const BUILT_BEFORE: &[BuiltBefore] = &[BuiltBefore {
    version: 6,
    index: "outbox_ingested_pkey_v6",
    create: "CREATE UNIQUE INDEX CONCURRENTLY outbox_ingested_pkey_v6
                 ON outbox_ingested (source, id) INCLUDE (stream, stream_seq)",
}];

/// The migrations, oldest first; version `i + 1` is `MIGRATIONS[i]`. Never change what one
/// that shipped leaves behind: add the next. (How it gets there may change: 5 and 6 no
/// longer build their indexes under a lock that stops writes, and leave the same tables.)
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
    // and each stream's latest accounting from its device, for `outbox fleet`. (It built an
    // index of the numbers too, under a lock that stopped writes; 6 drops it, so a database
    // migrated past 6 at once never builds it.)
    "ALTER TABLE outbox_ingested
         ADD COLUMN stream     text,
         ADD COLUMN stream_seq bigint;
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
    // them from that index alone. The separate index cost the batched ingest 12-15%. The
    // new key's index is built concurrently beforehand (`BUILT_BEFORE`); the key is swapped
    // onto it here, which takes the table's lock for a moment, not for a rebuild.
    "ALTER TABLE outbox_ingested
         DROP CONSTRAINT outbox_ingested_pkey,
         ADD CONSTRAINT outbox_ingested_pkey PRIMARY KEY USING INDEX outbox_ingested_pkey_v6;
     DROP INDEX IF EXISTS outbox_ingested_stream_seq;",
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
/// Each version is applied in a transaction of its own with no statement timeout (a big
/// table takes as long as it takes); an index a version needs is built `CONCURRENTLY`
/// first, outside any transaction (so `client` is a connection, not a transaction), and a
/// build cut short (an invalid index left by a crash) is dropped and built again. The
/// process that migrates holds a session advisory lock; another one polls for it (a
/// waiter queued behind the lock would hold a snapshot the concurrent build waits for) and
/// gives up after 10 s with [`Error::MigrationInProgress`]: call again later.
///
/// # Errors
///
/// [`Error::Postgres`] from the server; [`Error::MigrationInProgress`] when another process
/// is still migrating; [`Error::SchemaTooNew`] when the database was migrated by a newer
/// build than this one.
pub fn migrate(client: &mut Client) -> Result<()> {
    let started = Instant::now();
    loop {
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&MIGRATION_LOCK])?
            .get(0);
        if locked {
            break;
        }
        if started.elapsed() >= MIGRATION_WAIT {
            return Err(Error::MigrationInProgress {
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(MIGRATION_POLL);
    }
    let migrated = migrate_locked(client);
    // Released whatever happened (a connection that is gone has released it already).
    let unlocked = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
    migrated?;
    unlocked?;
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

/// Applies the versions not applied yet; the caller holds the migration lock.
fn migrate_locked(client: &mut Client) -> Result<()> {
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS outbox_pg_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )?;
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i32 + 1;
        let applied = client
            .query_opt(
                "SELECT 1 FROM outbox_pg_migrations WHERE version = $1",
                &[&version],
            )?
            .is_some();
        if applied {
            continue;
        }
        for before in BUILT_BEFORE.iter().filter(|b| b.version == version) {
            build_concurrently(client, before)?;
        }
        let mut tx = client.transaction()?;
        // A migration of a big table takes as long as it takes: the connection's statement
        // timeout (the ingest's 5 s) would cancel it for ever.
        tx.batch_execute("SET LOCAL statement_timeout = 0")?;
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO outbox_pg_migrations (version) VALUES ($1)",
            &[&version],
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// Builds `before`'s index unless a valid one is there; an invalid one (a build cut short)
/// is dropped first. Outside any transaction and with no statement timeout; the table
/// takes writes meanwhile.
fn build_concurrently(client: &mut Client, before: &BuiltBefore) -> Result<()> {
    let valid: Option<bool> = client
        .query_opt(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            &[&before.index],
        )?
        .map(|row| row.get(0));
    if valid == Some(true) {
        return Ok(());
    }
    client.batch_execute("SET statement_timeout = 0")?;
    let built = (|| -> Result<()> {
        if valid == Some(false) {
            client.batch_execute(&format!("DROP INDEX CONCURRENTLY {}", before.index))?;
        }
        client.batch_execute(before.create)?;
        Ok(())
    })();
    // Back to the connection's own timeout (the value it started with).
    let reset = client.batch_execute("RESET statement_timeout");
    built?;
    reset?;
    Ok(())
}
