//! On batteries and metered links: an idle relay that sleeps, wake-ups from other processes, gzip and linger, and a data budget per destination.
//!
//! **An idle relay sleeps.** Nothing is looked at on a fixed beat: the writer sleeps until
//! the soonest thing it knows is due (a retry it scheduled, a row written with a delay or
//! another relay's retry falling due, the end of a lease a crashed relay left, the earliest
//! event deadline, the next retention run, a destination's backoff or `Retry-After`
//! ending), the checkpointer sleeps until the writer reports a write, delivery workers
//! block on their queue, and `outbox relay`'s main thread waits for its signal.
//! `tests/idle_relay.rs` holds a relay
//! to at most one wake-up a second, `tests/due_later.rs` sends a row due later at its time
//! with a minute's poll. After a claim, the writer reads when the next row falls due once
//! the claim's requests are answered (100 ms after at the latest), so the read never takes
//! CPU from the request it follows.
//!
//! **Commits from other processes wake it at once** with the `wal-watch` feature (on in
//! `outbox relay`): a file-change notification on the WAL (inotify on Linux, through the
//! `notify` crate) wakes the writer, which reads `PRAGMA data_version` then and a few
//! 1 ms steps later (the commit is published in the `-shm` wal-index a moment after its
//! frames are written, and no notification reports that). The watch is on the file's
//! directory, so a WAL deleted and made again (every connection closed, a restore) is still
//! watched. The `data_version` poll stays as a fallback, every 5 s instead of every
//! [`poll_interval`](crate::RelayConfig::poll_interval) (100 ms). Without the feature, or on a file
//! system without notifications (network mounts, some FUSE layers), the relay polls at the
//! poll interval as before: an app whose every commit goes through this crate's
//! [`Outbox`](crate::Outbox) (which wakes the relay itself) can set a poll interval of seconds instead.
//! While requests are out the watch is paused (the relay's own claims and acks would
//! notify it on every commit, which slows a batched drain) and the relay polls at the poll
//! interval; it watches again 10 ms after the last answer.
//!
//! **Fewer bytes.** [`Destination::compress`](crate::Destination::compress)`(`[`Compression::Gzip`](crate::Compression::Gzip)`)` (CLI: `relay
//! --compress gzip`) sends request bodies of 1 KiB or more gzip-compressed, with
//! `Content-Encoding: gzip`; smaller ones go as they are, and so does a body that would shrink
//! more than 100 times (a long run of one character), which receivers would refuse as a zip
//! bomb. The Standard Webhooks signature is
//! over the **uncompressed** body, what the receiver's handler parses after decoding, so a
//! receiver decodes first ([`receive::decode_body`](crate::receive::decode_body)) and verifies that. `outbox ingest` and
//! `examples/receiver.rs` accept gzip: their body limit (`--max-body`) applies to the
//! decoded size too, and decoding stops one byte past it or past 100 times the body's size on
//! the wire, whichever is less, with 413 (a zip bomb costs that much and no more); another
//! encoding is 415 before the body is read. Off by default: a receiver that does not decode
//! would see bytes it cannot parse.
//!
//! **Fewer radio wake-ups.** [`Destination::linger`](crate::Destination::linger)`(d)` (CLI: `relay --linger 2s`, with
//! `--batch`): while fewer events are due than fill a batch, the relay holds what it claimed
//! for up to `d` for more to arrive, as Kafka producers' `linger.ms` does, so a trickle of
//! ten events a second goes out as one request every `d` instead of ten a second; each event
//! waits at most `d`. Events of priority [`Event::URGENT_PRIORITY`](crate::Event::URGENT_PRIORITY) (8) or above go at once,
//! taking what waits with them; shutdown sends what waits. The held events are leased, so
//! `d` may be at most a quarter of the lease (checked at start).
//!
//! **A data plan the device keeps.** [`Destination::budget`](crate::Destination::budget)`(bytes,
//! period)` (CLI: `relay --budget 50MB/30d`; sizes in B, KB, MB, GB as powers of 1000, as
//! carriers bill; periods from `1m` to `31d`, in `m`, `h` or `d`) caps what one destination
//! may cost in each period, counted as the network counts it:
//!
//! - **What counts**: every byte the relay writes to and reads from the destination's
//!   sockets: request lines, headers, bodies, answers, TLS handshakes and records, a
//!   proxy's `CONNECT` and its answer, retries and the streams' accounting included. Over
//!   HTTP(S) these are the bytes on the crate's own connections, counted as they cross
//!   (within a few bytes of what a byte-counting forwarder in front of the receiver sees:
//!   `tests/budget.rs`); over MQTT, each message's PUBLISH (its size as a bound), its PUBACK
//!   and TLS records' framing, but not the connection's CONNECT, CONNACK, keep-alive PINGs
//!   and TLS handshake (a few hundred bytes, and a handshake's few KB, a connection); a
//!   [`custom`](crate::Destination::custom) transport's requests count their events' data. IP and
//!   TCP headers (40-60 bytes a packet) are the carrier's and are not counted: leave them
//!   room in the plan.
//! - **Never started unless it fits**: a request goes only if what the period spent, what
//!   requests under way may still spend, and its own bound fit in the budget. Its bound is
//!   its events' data plus the costliest request beyond its events' data measured so far on
//!   that destination (its envelope, head and answer, and a TLS handshake where one was
//!   made; 8 KB for the first over TLS, 1.5 KB over plain HTTP): so a period spends at most
//!   the budget plus what one answer larger than any before can add.
//! - **Spent in this order when it runs short**: events of priority
//!   [`budget_exempt_priority`](crate::Destination::budget_exempt_priority)`(n)` and above
//!   (CLI: `--budget-exempt-priority n`) go whatever is left and beyond, counted; they are
//!   claimed first anyway (the claim takes the most urgent first). Every other event waits
//!   for the next period: it spends no attempt and is not dead-lettered (its deadline,
//!   [`Event::expires_in`](crate::Event::expires_in), still applies), and coalescing goes
//!   on replacing what waits as before. A destination's events wait in their usual order.
//! - **Kept across restarts**: what a period spent is kept in the file (`outbox_budgets`),
//!   written within a second (with the outcomes when there are some; a change of holding at
//!   once; everything when the relay stops), so a relay restarted within the period, or
//!   after a crash, spends on from there (a crash loses at most the last second's count);
//!   several relays of one file add to the same total. Periods follow one another from the
//!   first one's start, on the outbox's clock: a clock that steps back does not start a
//!   period afresh. [`Outbox::deliver_pending`](crate::Outbox::deliver_pending) spends the
//!   same budget as a relay.
//! - **Known in advance**: [`Outbox::budget`](crate::Outbox::budget)`(destination)` and
//!   `outbox stats` (text, and in `--json` each destination's `budget`: `limit_bytes`,
//!   `used_bytes`, `period_started`, `period_ends` in unix ms, `forecast`, `holding`,
//!   `exempt_priority`) say where it stands; `forecast` is when the budget runs out at the
//!   rate spent so far in the period (`null` if nothing was spent yet or the period ends
//!   first). With the `metrics` feature, the gauges `outbox_budget_used_bytes` and
//!   `outbox_budget_limit_bytes` (label `destination`). Subscribers
//!   ([`Outbox::subscribe`](crate::Outbox::subscribe)) get a notice when a destination
//!   starts holding events for its budget
//!   ([`DeliveryOutcome::BudgetSpent`](crate::notices::DeliveryOutcome::BudgetSpent)) and
//!   when a new period lets them go ([`DeliveryOutcome::BudgetRenewed`](crate::notices::DeliveryOutcome::BudgetRenewed)),
//!   the relay logs both, and [`RelayHandle::trouble`](crate::RelayHandle::trouble) (the
//!   line `outbox relay --until-empty` prints every 5 s) names a destination holding its
//!   events and until when.
//!
//! **Choosing a budget.** Start from the plan and leave a margin: the carrier counts IP and
//! TCP headers, DNS, and whatever else the device sends. Measure a day of your own traffic
//! first (`Outbox::budget`'s `used_bytes` with a large budget, or the gauge) and divide: a
//! 50 MB month for a device whose day costs 1.2 MB is `--budget 45MB/30d` with headroom for
//! a week offline's backlog to catch up. A shorter period spreads the spending: `2MB/1d`
//! keeps one chatty day from spending the month, at the price of holding events on that
//! day. Reduce what each event costs before capping it: batching (one request's head and
//! answer for many events), gzip, linger, and keeping connections open (a TLS handshake,
//! about 6.5 KB, costs more than many events). Exempt only what must go at any price
//! (alarms, a theft report): exempt events can spend the plan too.
//!
//! What each of these saves (wake-ups of an idle relay, commit → receipt from another
//! process, bytes on the wire, requests and CPU with linger) is measured by `cargo run
//! --release --all-features --example bench -- frugal`; docs/PERFORMANCE.md has the rows.
