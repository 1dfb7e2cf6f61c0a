//! # Nothing silently missing
//!
//! At-least-once delivery with de-duplication says nothing is lost; this page is how the
//! fleet checks it, event by event, and how an app tells its user what is safe.
//!
//! ## Numbers
//!
//! Every event takes, when its transaction commits, the next number of a gapless sequence
//! per destination and source: its *stream*. `Outbox::enqueue`, `enqueue_many` and the SQL
//! contract number alike; a rolled-back transaction and a repeated idempotency key take
//! none. The number travels with the event as the CloudEvents extension attributes
//! `outboxstream` (the destination's name) and `outboxseq` (the number), in HTTP requests,
//! MQTT messages and offline bundles (so an imported bundle lands in the same stream). The
//! per-key `sequence` is unchanged.
//!
//! A stream's numbers follow commit order, so a row's number is fixed the moment it
//! commits; the crate writes it into the row (`outbox_events.stream_seq`) when it is first
//! needed, not inside the app's `INSERT`, which pays nothing for it: the relay numbers the
//! rows it claims (with their lease, when one stream's backlog drains oldest first), an
//! export the rows it writes, and a row deleted before it was numbered (by hand, say) takes
//! its number as it goes, so that number stays given and the fleet names it missing.
//! [`Outbox::stream_numbers`](crate::Outbox::stream_numbers) returns an event's numbers (and
//! writes them). `outbox_streams` holds each stream's highest number written.
//!
//! ## Accounting
//!
//! Events also leave a stream on purpose: expired, dropped by a storage limit, coalesced
//! (replaced by a newer one), dead (out of attempts or refused; a later retry that delivers
//! it supersedes this), purged (dead, then deleted), exported (written to a bundle). The
//! file records each fate with its number (rows deleted since keep theirs in
//! `outbox_fates`); a pending row deleted by hand is recorded nowhere, and that is the
//! point: the fleet will name it.
//!
//! The relay tells each HTTP destination its streams' state
//! ([`StreamAccount`](crate::wire::StreamAccount): the high water, the numbers still
//! pending, and the fates as ranges), as an event of type `dev.sqlite-outbox.accounting`:
//! when a fate changes (within a quarter of the accounting interval, at most 15 s), at least
//! every [accounting interval](crate::RelayConfig::accounting_interval) (2 minutes) while the
//! destination is reachable, and once more as it stops, so a `relay --until-empty` run ends
//! with the destination's view up to date. The accounting is computed from the file each
//! time, never stored as an event: no storage limit drops it, it never expires. Turn it off
//! per destination with [`Destination::accounting`](crate::Destination::accounting)`(false)`
//! or `relay --no-accounting`; MQTT and custom destinations have it off unless turned on.
//! [`Outbox::stream_accounts`](crate::Outbox::stream_accounts) returns what would be told.
//!
//! ## The fleet's view: `outbox fleet`
//!
//! `outbox ingest` stores each event's number and each stream's latest accounting.
//! `outbox fleet --pg URL [--source SOURCE] [--json]` answers, per source and stream:
//!
//! | field | meaning |
//! |---|---|
//! | `high_water` | the highest number the device ever reported committed (or stored) |
//! | `stored` | distinct numbers stored |
//! | `stored_through` | the number through which every number is stored or accounted |
//! | `pending_on_device` | numbers still pending, as the device last reported |
//! | `accounted` | counts by fate: `expired`, `dropped`, `coalesced`, `dead`, `purged`, `exported` |
//! | `missing` | `[first, last]` ranges at or below `high_water` neither stored, pending nor accounted |
//! | `reused` | ranges of numbers stored under two event ids: a device restored from an older copy of its file |
//! | `reported_at` | when the device last reported (the ingest's clock) |
//!
//! Each number counts once, by the most final thing known of it: stored beats every fate
//! (an exported event imported later is stored; a dead event retried and delivered is
//! stored), a fate beats pending. `missing` is a moment's view: an event that arrives later
//! fills its gap, and numbers committed after the device's last report are not counted
//! until it reports again. The command exits 0 when no stream has missing or reused
//! numbers and 1 when one has (as `health` does when degraded), so a cron job or a
//! monitoring check can run it; 2 for bad input. The incomplete streams come first.
//!
//! What the test suite checks (`cli/tests/fleet.rs`, a device relay, `outbox ingest` and
//! PostgreSQL): events delivered, expired while the ingest was down, dropped by a full
//! store, coalesced, dead (an event the ingest cannot store), purged, exported and
//! imported, and three rows deleted by hand, which `outbox fleet` names exactly as
//! `missing`; a device restored from a backup of its file, then committing new events,
//! shown as `reused`.
//!
//! ## Receipts and "synced through"
//!
//! A 2xx proves little on its own: a captive portal, a proxy or the wrong server answers
//! 200 too. `outbox ingest --receipt-key FILE` (a key from `outbox keygen`) signs, on every
//! 2xx, a receipt in the `outbox-receipt` header: the source, the stream, the numbers of the
//! request's events that are stored (newly or before), the request's `webhook-id` and the
//! time ([`Receipt`](crate::wire::Receipt)). A destination given the ingest's public key
//! ([`Destination::receipt_key`](crate::Destination::receipt_key), `relay
//! --receipt-public-key whpk_…`) counts an answer as a delivery only with a valid receipt
//! for that request covering every event of it. Without one nothing is delivered, no
//! attempt is spent, and the destination waits as when unreachable, with "without a valid
//! receipt" in each event's `last_error`: for the relay's run only, nothing is stored in the
//! file, so the receiver's return delivers without an operator's step.
//!
//! The relay keeps, per destination, the number through which every event of the outbox's
//! default source is delivered (with a receipt where they are required) or accounted to the
//! destination, which took that accounting: [`Outbox::synced_through`](crate::Outbox::synced_through)
//! returns it and when it was reached, `outbox stats --json` shows it as `synced_through`
//! in each destination's object (null before the first). An app compares it with the
//! number its event took ([`Outbox::stream_numbers`](crate::Outbox::stream_numbers)) to tell
//! its user "everything up to here is safe at the fleet". It moves within a quarter of the accounting interval (at
//! most 15 s) of a delivery, and never back.
//!
//! ## Costs
//!
//! Measured by `cargo run --release --example bench -- numbers` (enqueue, and the relay's
//! claim and ack, with numbers against the same without, in the same run) and the ingest
//! bench; the figures are in docs/PERFORMANCE.md ("Stream numbers and accounting").
