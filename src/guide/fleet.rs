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
//! No writer can skip a number. Row ids are never given twice, whoever deletes: the crate's
//! own deletes keep the id high water, and so does a trigger for any other delete that takes
//! the table's newest row (an app's own cleanup of delivered rows, a hand), so the rows
//! committed after it are numbered like any other. (A file an older release left with
//! such rows, ids taken again and never numbered, is repaired when it opens: schema version
//! 18 numbers those still pending or dead after their stream's high water; those already
//! delivered without a number keep none.) No claim numbers more than 10,000 rows (plus
//! those committed since) under the write lock: a backlog drained oldest first is numbered
//! by the claims that take it, and when a claim would pass that bound (an urgent event
//! behind a backlog committed a week offline), the relay numbers the backlog first in
//! transactions of its own of 500 rows, so an urgent event behind a million offline ones
//! does not hold the app's commits while a million rows are numbered.
//!
//! ## Accounting
//!
//! Events also leave a stream on purpose: expired, dropped by a storage limit, coalesced
//! (replaced by a newer one), dead (out of attempts or refused; a later retry that delivers
//! it supersedes this), purged (dead, then deleted), exported (written to a bundle). The
//! file records each fate with its number (rows deleted since keep theirs in
//! `outbox_fates`); a pending row deleted by hand has no fate, and that is the point: the
//! fleet will name it. The device keeps its number as lost (`outbox_lost_numbers`), so its
//! synced-through number never passes it.
//!
//! The relay tells each HTTP destination its streams' state
//! ([`StreamAccount`](crate::wire::StreamAccount): the high water, the numbers still
//! pending, and the fates as ranges), as an event of type `dev.sqlite-outbox.accounting`:
//! when a fate changes (within a quarter of the accounting interval, at most 15 s), at least
//! every [accounting interval](crate::RelayConfig::accounting_interval) (2 minutes) while the
//! destination is reachable, and once more as it stops, so a `relay --until-empty` run ends
//! with the destination's view up to date. The accounting is computed from the file each
//! time, never stored as an event: no storage limit drops it, it never expires. An HTTP
//! destination is told once its receiver said it takes accountings (`outbox ingest` answers
//! every stored request with `outbox-accounting: 1`), so a generic webhook receiver never
//! gets them; [`Destination::accounting`](crate::Destination::accounting)`(true)` (`relay
//! --accounting`) tells it from the start, `(false)` (`relay --no-accounting`) never; MQTT
//! and custom destinations have it off unless turned on. Once a relay has told a
//! destination a report, the file remembers it: a later relay that only has fates to tell
//! (nothing to deliver, so no answer to read the header from) still tells them. A brand-new
//! device whose first run delivers nothing tells nothing until its first delivery, unless
//! its destination has `accounting(true)`. A
//! destination without accounting costs the relay's accountant nothing, and its streams
//! keep no synced-through number.
//! [`Outbox::stream_accounts`](crate::Outbox::stream_accounts) returns the file's view.
//!
//! What a device tells stays bounded for its lifetime. Each report carries the stream's
//! report number (`seq`, counted in the file, so it rises across restarts) and only the
//! fates its destination has not taken yet; once a destination took a report, the fates it
//! told are forgotten in the file (`outbox_fates`). A long history (100,000 scattered
//! coalesced numbers, say) goes over several reports of at most 20,000 ranges each (under
//! 1 MiB, `outbox ingest`'s default body limit), then nothing is told again. The ingest
//! merges reports: a number takes the newest fate told of it, and the pending numbers come
//! from the newest report, so one that arrives late never undoes a newer. The pending
//! numbers are joined into ranges as they are read, in one walk of ids from the lowest
//! pending one: memory by ranges, not rows. That read is the one cost that grows with
//! the pending rows (0.7 s of CPU for a million on the 2-core VM), and the accountant does
//! it only when a report is due: when a fate's cheap fingerprint moved (dead letters,
//! fates of deleted rows, lost numbers: counts read from their indexes), when a
//! destination's last pending row left (its synced-through number can reach its high
//! water), once an interval, and as the relay stops. Its other looks read no pending row.
//! Beside a million pending draining slowly for a minute, the accountant took 0.69 s of
//! CPU and the process's memory grew 3.9 MB (10.7 s and 10.2 MB before;
//! docs/PERFORMANCE.md, "The accountant beside a big backlog").
//!
//! ## The fleet's view: `outbox fleet`
//!
//! `outbox ingest` stores each event's number and each stream's latest accounting.
//! `outbox fleet --pg URL [--source SOURCE] [--json]` answers, per source and stream (with
//! `--json`, one JSON object per line):
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
//! | `silent` | the device has not reported for longer than `--silent-after` (default 1 day) while numbers it reported pending are not stored |
//!
//! Each number counts once, by the most final thing known of it: stored beats every fate
//! (an exported event imported later is stored; a dead event retried and delivered is
//! stored), a fate beats pending. `missing` is a moment's view: an event that arrives later
//! fills its gap, and numbers committed after the device's last report are not counted
//! until it reports again. The command exits 0 when no stream has missing or reused
//! numbers and no device went silent with numbers pending, and 1 otherwise (as `health`
//! does when degraded), so a cron job or a monitoring check can run it; 2 for bad input.
//! The incomplete streams come first. A device's names are printed with their control
//! characters escaped (`\u{1b}`), so no device can drive the operator's terminal.
//!
//! Its cost grows with the streams, not with the events: the ingest keeps one summary row
//! per source and stream (`outbox_fleet_streams`, PostgreSQL migration 7: the numbers
//! stored and the numbers stored twice, as multiranges). Each request appends its streams'
//! numbers to a log (`outbox_fleet_log`) in the statement that stores its events, so no
//! request waits for another's; the ingest's probe merges the log into the summaries every
//! `--fleet-refresh` (15 s), and `outbox fleet` merges what is left before it reads.
//! `outbox fleet`, `/fleet` and the gauges read the summaries and the last reports. With 10,000 streams it reads in about 0.2 s whether 1 or 10 million
//! events are stored (docs/PERFORMANCE.md, "The fleet's view"); it needs PostgreSQL 14 or
//! newer (multiranges). An event stored before under its `(source, id)` and sent again under
//! another number (a redelivery, a second destination posting to the same ingest, an
//! imported bundle) is not stored again, but its number is recorded as stored, and the
//! receipt covers it. Until the view has been read once, the gauges read `NaN` (unknown),
//! never 0, and `outbox_ingest_fleet_read_age_seconds` tells how old the view is.
//!
//! Two limits, known and not covered. A device restored from an older copy of its file
//! counts its reports again from the copy's number: until it has sent as many reports as it
//! had before, the ingest keeps the pending numbers of the newer report it held (shown
//! pending, where the numbers lost with the newer file are missing); its reused numbers are
//! shown at once. And a number stored under one event id and, in the same merge of the log,
//! under another (a restored device's new event and a redelivered copy of the old one
//! arriving within one `--fleet-refresh`) is counted as stored but not as reused.
//!
//! What a device may claim is bounded: numbers and high waters above 2^53 - 1 are refused
//! (400), every count saturates, and a source may have at most 256 streams (`outbox ingest
//! --max-streams-per-source N`, 1 to 65,536): a request that would give it more is answered
//! 422, nothing of it stored, and counted as a refusal (`streams_per_source`).
//!
//! PostgreSQL migrations run in the health probe's thread, without a statement timeout, as
//! long as they take on a big table; meanwhile every request is answered 503 with
//! `Retry-After`, `/healthz` says why, and the log says each change of health in
//! PostgreSQL's own words (a failed migration shows its SQLSTATE and message). The table
//! of events keeps taking writes (another ingest of the older release, during a rolling
//! upgrade): the index of the new key (migration 6) is built `CONCURRENTLY` and the key
//! swapped onto it in a moment, and an index build cut short (a crash) is dropped and
//! built again at the next start. One process migrates (a session advisory lock); the
//! others poll for the lock, not queue behind it (a queued waiter holds a snapshot the
//! concurrent build would wait for), and retry on their next probe round. From the
//! release before stream numbers, 20 million stored events migrate in about 48 s on the
//! 2-core VM while a writer beside it stores an event every 10 ms, none slower than 40 ms
//! (the old migration held that writer 5 s, past the ingest's statement timeout:
//! docs/PERFORMANCE.md, "Migrations on a big table").
//!
//! What the test suite checks (`cli/tests/fleet.rs` and `fleet_completeness.rs`, a device
//! relay, `outbox ingest` and PostgreSQL): events delivered, expired while the ingest was
//! down, dropped by a full store, coalesced, dead (an event the ingest cannot store),
//! purged, exported and imported, and three rows deleted by hand, which `outbox fleet`
//! names exactly as `missing`; a device restored from a backup of its file, then committing
//! new events, shown as `reused`; an app's own cleanup of its rows; one event routed to two
//! destinations and redelivered; 100,000 scattered fates; hostile accountings; a silent
//! device; the summaries built by migration 7 from the events stored before it.
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
//! its user "everything up to here is safe at the fleet". It moves within a quarter of the
//! accounting interval (at most 15 s) of a delivery, never back, and never past a number
//! that left pending with no fate (deleted by hand): such a gap stops it for good, as the
//! fleet names that number missing for good.
//!
//! ## Costs
//!
//! Measured by `cargo run --release --example bench -- numbers` (enqueue, and the relay's
//! claim and ack, with numbers against the same without, in the same run), the ingest
//! bench (`-p outbox-cli --example bench_ingest`: the store rate keeping the summaries
//! against the same without) and `-p outbox-cli --example bench_fleet` (the view's read
//! at 1 and 10 million stored events); the figures are in docs/PERFORMANCE.md ("Stream
//! numbers and accounting", "The fleet's view").
