//! Operating: outcomes back to the app, replay, offline bundles, the `outbox` command, metrics, schema migrations.
//!
//! # Outcomes back to the app
//!
//! [`Outbox::subscribe`](crate::Outbox::subscribe) returns [`Notices`](crate::notices::Notices), a subscription of [`notices::DeliveryNotice`](crate::notices::DeliveryNotice)s (event id,
//! destination, delivered or dead with the error, when) from the relays started from this
//! outbox, so an app can mark a record "synced" or show a failure. The channel is bounded
//! ([`notices::NOTICE_CAPACITY`](crate::notices::NOTICE_CAPACITY)) and a relay never waits for it: a subscriber that falls behind
//! loses notices, counted in [`Outbox::lost_notices`](crate::Outbox::lost_notices). [`Outbox::status`](crate::Outbox::status)`(event_id)` answers
//! from the file at any time, so a lost notice costs a query. `cargo run --example
//! desktop_sync` is a notes app that marks each note synced when its event is delivered.
//!
//! # Replay to a destination
//!
//! [`Outbox::redeliver`](crate::Outbox::redeliver)`(&`[`Redelivery`](crate::Redelivery)`::to("warehouse").types("order.*")
//! .delivered_since(t))` (CLI: `outbox redeliver --destination D [--type PATTERN] [--since
//! TIME] [--until TIME]`, TIME an RFC 3339 time or a duration meaning that long ago) queues
//! delivered events again for a destination, to fill one added later or one that lost data.
//! Each keeps its original id, data and time (receivers de-duplicate), goes once even if it
//! was delivered to several destinations, and is skipped if already pending there; they go
//! in commit order, a key's events parked behind each other. Only what retention kept can be
//! replayed (`prune` deletes delivered rows). The count is returned (printed).
//!
//! # The offline bundle: a site with no uplink
//!
//! Some sites never get a network: events leave on a USB stick. `outbox export --out FILE
//! --secret whsec_… [--destination D] [--limit N]` ([`Outbox::export`](crate::Outbox::export)) writes the oldest
//! pending events, in commit order, to one JSON Lines file: one structured CloudEvent per
//! line (exactly the body a relay would send), then a manifest (count, first and last
//! `sequence`, SHA-256 of the event lines), then a Standard Webhooks signature of the
//! manifest. The events are leased page by page (1,000 events or 4 MiB of data, each page
//! a short transaction of its own, written to the file before the next is read: neither
//! memory nor the app's commits pay for the bundle's size), the file is synced and renamed
//! into place, and only then are they marked **exported**, 500 a transaction (a state of its own: `list --state exported`,
//! [`admin::State::Exported`](crate::admin::State::Exported); their keys' next events go). A crash before that leaves them
//! pending, so they are exported again and receivers drop the repeats by id; a write that
//! fails (a full disk) hands them back unchanged. `outbox import FILE --secret whsec_… --url
//! URL` ([`bundle::import`](crate::bundle::import)) needs no outbox database: it verifies the whole file first (a
//! tampered or truncated file or another secret is refused before anything is sent, exit 2),
//! then posts the events in order, each signed with the same secret and naming its
//! event's source in `outbox-source`, retrying with backoff; it exits 1 if it had to give
//! up on any. For an ingest with per-device keys, sign with the device's own key instead of
//! a secret: `outbox export --signing-key /etc/outbox/device.key …` and `outbox import FILE
//! --signing-key device.key --url URL` (library: a [`bundle::BundleKey`](crate::bundle::BundleKey),
//! from a `&Secret` or a `&SigningKey`); the ingest then takes each event as the device's
//! own, and refuses it under any other source. A bundle's last lines:
//!
//! ```text
//! {"bundle":"sqlite-outbox/1","count":20,"destination":"default","first_sequence":"00000000000000000001","last_sequence":"00000000000000000020","sha256":"a0861956…","created":"2026-11-30T18:14:46.555Z"}
//! {"webhook-id":"bundle_a0861956a8f5c92e4c719dbc36b88a97","webhook-timestamp":"1796062486","webhook-signature":"v1,EyEkqXPx…"}
//! ```
//!
//! Expired and exported rows are finished like delivered ones: `prune` and the relay's
//! retention delete them after the same age.
//!
//! # Operating
//!
//! The `outbox` command (the crate `outbox-cli`) works on any plain database file the crate
//! created, while the app runs or not; its commands, flags, outputs and exit codes are a
//! contract for scripts (`outbox --help`). The same from code: the methods listed in
//! [`admin`](crate::admin). A running relay prunes delivered events older than its retention (7 days by
//! default) by itself, a page of 500 rows per transaction.
//!
//! With the `metrics` feature the crate reports through the `metrics` facade (plug in any
//! exporter). Labels are bounded: event type and destination, never ids.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `outbox_enqueued_total`, `outbox_delivered_total`, `outbox_retried_total`, `outbox_dead_total` | counter | `type`, `destination` |
//! | `outbox_dropped_total` | counter | |
//! | `outbox_coalesced_total` | counter | `type` |
//! | `outbox_pending`, `outbox_oldest_pending_age_seconds`, `outbox_database_bytes` | gauge | |
//! | `outbox_delivery_latency_seconds` (commit to delivery) | histogram | `type`, `destination` |
//!
//! Every log line about an event (through `log`) names its event id.
//!
//! # Schema and migrations
//!
//! `schema.sql` is the one source of the schema; each `-- version N` section is one
//! migration, applied in order and recorded in the outbox's own table `outbox_schema`. The
//! outbox never writes `PRAGMA user_version`: it is the app's (rusqlite_migration keeps the
//! app's schema version there). A file made by 0.1, which kept the outbox's version in
//! `user_version`, is taken over once, every row and setting intact and `user_version` left
//! as found. Opening a file written by a newer version of the crate
//! fails with [`Error::SchemaTooNew`](crate::Error::SchemaTooNew) and changes nothing; a file that is not SQLite gives
//! [`Error::NotADatabase`](crate::Error::NotADatabase), also untouched. [`Outbox::open_existing`](crate::Outbox::open_existing) also refuses a missing
//! file ([`Error::NotFound`](crate::Error::NotFound)) and a database without an outbox ([`Error::NotAnOutbox`](crate::Error::NotAnOutbox)).
