//! How the relay behaves: every answer and failure, wrong clocks, and its threads.
//!
//! # How the relay behaves
//!
//! | situation | what happens |
//! |---|---|
//! | 2xx | delivered; many acks are written in one transaction |
//! | 5xx, 408, 429 | retried with exponential backoff and full jitter (1 s base, 5 min cap), or at `Retry-After` (seconds or HTTP date, capped at 1 h) if later; dead-lettered after 25 answered attempts |
//! | 429 | also pauses that destination (only) for its `Retry-After`, or the retry base without one |
//! | large events (hundreds of KB each) | a claim takes at most 4 MiB of event data (its first event whatever its size), and a destination keeps at most 16 MiB queued or in flight besides one event, whatever the count limits: memory and the claim's transaction stay small |
//! | a rate or bandwidth limit with a backlog far larger than a lease's worth | the destination claims only what its limits let out within a quarter of the lease; the backlog goes out at the rate, each event once, none handed back unsent for ever |
//! | 410 | the destination is disabled (persisted; its events stay pending, attempts untouched) until [`Outbox::enable_destination`](crate::Outbox::enable_destination) |
//! | 400, 413 or 422 to a batch | the batch is split in halves and sent again at once, halves of halves as long as they are refused, spending no attempt on a split: only an event refused alone is dead-lettered, with the receiver's reason; the rest are delivered. The destination then groups no more events a request than the last halves held, and doubles that back after 16 requests delivered at it, so the bisection carries on when a paced destination hands halves back at half the lease, and a receiver with a size limit is not sent an oversized batch at every claim |
//! | any other answer to a batch that would dead-letter its events (a 4xx, data that cannot be encoded, the last attempt failed by a 5xx, a timeout or a reset) | the batch is split as above instead: an event is dead-lettered only by an answer to a request of its own, so one poison event never takes its batch-mates with it. Before the last attempt a batch's failure is spent by each event, as for a single event |
//! | 401 | the receiver refuses the relay's credentials (a key not provisioned yet or revoked, a secret it does not hold), not the event: no attempt spent, the **destination** backs off as when unreachable (single probes, a growing pause) and every event waits, `last_error` saying so; the first accepted request drains the backlog. A 403 says this request may not be done, which can be the event's own (`outbox ingest` answers 403 to an event of another source than the key's), so it is a client error as below |
//! | other 4xx | dead-lettered at once with status and body start kept ([`RelayConfig::dead_letter_client_errors`](crate::RelayConfig::dead_letter_client_errors)`(false)` retries them instead) |
//! | DNS failure, connection refused, connect timeout, TLS handshake failure (the request never left) | the **destination** backs off as a whole (250 ms doubling to 30 s, jittered), then one probe event is sent; no event spends an attempt, so a device offline for a week dead-letters nothing; the first answer lifts the backoff and the backlog drains at full speed. A released probe moves behind the other due events, so the next probe is another event |
//! | 502, 503 or 504 (or 503/429 with `Retry-After`) to three requests in a row for three different events: the receiver's own backend is down (its store restarting, a load balancer with no healthy upstream) | the answers that made the judgement spent an attempt each; from then on the **destination** is treated as unreachable: no event spends an attempt (requests still in flight included), the destination backs off as a whole for at least the `Retry-After`, single probes, and the first other answer lifts it and the backlog drains at full speed. An hour's outage dead-letters nothing. One event answered so while others succeed (a poison event) never makes three in a row and spends its attempts, each retry waiting out its own `Retry-After`: it holds back its key, not the destination (a 429 with `Retry-After`, about the sender, still pauses the destination) |
//! | the request was written but no valid answer came (read timeout, reset or close mid-response, malformed answer) | that **event** spends an attempt and backs off on its own, like a 5xx; the destination stays open, so a poison event that hangs or crashes the receiver is dead-lettered at `max_attempts` while every other event keeps flowing |
//! | a kept-alive connection was closed under the request before its answer's head came whole (the server's idle timeout ran out as the request arrived) | the request goes again at once on another connection, spending no attempt (at most 4 such connections in a row; then as the row above) |
//! | the event cannot be encoded (stored data not JSON) | dead-lettered at once |
//! | a claimed row cannot be read at all (a BLOB payload, a REAL time, text that is not UTF-8, written by another program) | that row alone is dead-lettered with `last_error` "unreadable row: …"; the rest of its batch is delivered; the operator still sees it in `list` and `show` |
//! | the transport panics | the attempt counts as a failure and is retried with backoff; the worker lives on |
//! | deciding a request's outcomes panics (a bug, a clock that panics) | its events are handed back unsent, nothing recorded, and go out again; the transport's thread lives on |
//! | the disk fills up (`SQLITE_FULL`) | the relay gives back the outbox's reserve, checkpoints so the WAL starts over in the room it has, and goes on claiming, sending and acknowledging; delivered history goes, whatever the retention, so the app's commits fit; see [a full disk](crate::guide::durability#a-full-disk) |
//! | an ack cannot be written (an app transaction holds the write lock past the busy timeout) | the outcomes are kept and written again every 100 ms until written, so a delivered event is not sent again; each write is fenced by its lease, so an outcome whose lease another relay took over meanwhile is discarded then |
//! | the writer thread panics (a bug) | caught and logged; the writer starts again after a pause doubling up to 30 s; counted in [`RelayStats::writer_restarts`](crate::RelayStats::writer_restarts) and [`ShutdownReport::writer_restarts`](crate::ShutdownReport::writer_restarts) |
//! | a setting is out of range (a lease of centuries, a zero poll interval or backoff, a header with a newline, a malformed secret) | [`Relay::start`](crate::Relay::start) refuses it with [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the setting; nothing is ever dead-lettered for it |
//! | the power fails | nothing was sent before its commit reached the disk; after the reboot, events whose ack was lost are sent again (duplicates), the rest wait as before; see [Durability](crate::guide::durability) |
//! | a relay crashes | its leases (60 s) expire and any relay, in this or another process, claims the events again; every start adds a random id to its lease owners, so two relays given one name never share an owner |
//! | a stale relay comes back | every write-back is fenced by the claim's lease owner: an outcome for a lease that was taken over is discarded ([`RelayStats::lease_lost`](crate::RelayStats::lease_lost)) |
//! | `shutdown()` or drop | stops claiming, hands back claimed events no worker started, waits up to `shutdown_timeout` (10 s) for in-flight requests, joins every thread that ended; returns even if the receiver hangs |
//!
//! Each row is decided by one pure function (`src/relay/decide.rs`), with a unit test per
//! row. One writer thread owns every SQLite write of the relay (claims and acks); delivery
//! workers (4 by default, per destination) only do HTTP, so a slow receiver never holds the
//! write lock. The claim is one write transaction: a walk of a partial index that stops at
//! the claim's count or bytes and reads each event on the way, then one `UPDATE` that
//! leases the rows it chose (a range of row ids when they run on), so its
//! cost does not grow with delivered history (a test pins the query plan), and events queued behind an
//! earlier event of their partition key are *parked* until it leaves, so a keyed backlog
//! costs the claim nothing either (`src/store/queue/mod.rs` draws the row's state machine). Acks are
//! gathered (up to 200 per transaction, waiting at most 1 ms for more) and written a hundred
//! rows a statement, each row still fenced by its lease, claims wait until a
//! whole batch fits, and a thread of the relay's own checkpoints the WAL in the background
//! on its own connection (PASSIVE, which takes no lock a writer needs, so neither claims nor
//! the app's commits wait for the copy; and past 16 MiB a RESTART, or a TRUNCATE once the
//! file passed 64 MiB, that never busy-waits: while another process holds a read
//! transaction, a backup or a report query, the reset is skipped and retried after a growing
//! pause, so the app's commits never wait behind it), so the app's own commits do not pay for
//! checkpoints. Past 16 MiB the relay first gives way to the writers of other processes:
//! for up to 200 ms its own writes wait, so an app committing flat out in another process,
//! whose own checkpoint after each commit would start the WAL over but for the relay's
//! claims and acks landing in between, starts it over itself (a RESTART of the relay's
//! cannot: SQLite's write lock is not fair, and such an app holds it most of the time).
//! The WAL so stays within 16 MiB plus what other processes write while the relay looks
//! and gives way, a fraction of a second (19-23 MiB beside an app in Python committing
//! 100 KB rows flat out, about 20 MB/s; 73-248 MiB before, `cli/tests/wal_bound.rs`).
//! While such an app checkpoints, the relay's PASSIVE checkpoint cannot count the WAL's
//! frames, so the relay counts them in the WAL file, by their headers. Of SQLite's files
//! the crate opens only the WAL (to read its header and frame headers, and to sync it):
//! SQLite keeps its locks on the database file and on `-shm`, and a descriptor of either
//! closed by the crate would drop them (POSIX locks belong to the process). A writer
//! waiting for SQLite's lock polls in 25 µs steps at first instead of SQLite's default 1
//! ms sleep.
//!
//! # What the relay says
//!
//! Through the `log` crate, at `warn` (the level `outbox` shows by default), one line each
//! time a destination's state changes, naming it and the answer, and one when it delivers
//! again: unreachable (refused connection, DNS, a TLS handshake, a proxy that would not
//! connect), refusing the relay's credentials (401), refused by a proxy (407), failing on
//! its side (5xx, 429, 408), not answering. A destination down for a week costs two lines,
//! not one per retry; one flapping between two states says each at most once a minute.
//! [`RelayHandle::trouble`](crate::RelayHandle::trouble) gives the current one to show in an
//! app. At start, a destination that no route of the file sends events to (and that has none
//! pending) is named at once, as is an HTTP destination whose requests carry no signature
//! and no `Authorization` header. Events refused one by one (a 400, a 403, a 422) are
//! dead-lettered and each logged as such.
//!
//! # Clocks
//!
//! Devices without a real-time clock boot in 1970 or wherever their last shutdown left them,
//! and NTP, a user or a phone app sets them later. The wall clock is therefore used only as
//! data (commit times, due times, lease ends, signatures); every wait runs on `Instant`.
//!
//! - **Skew against the receiver.** Standard Webhooks receivers refuse a signature whose
//!   timestamp is more than 5 minutes from their own clock. The HTTP transport estimates the
//!   offset from every answer's `Date` header (the median of the last 5 samples) and, once it
//!   reaches 30 s, signs with the corrected time; the correction is logged once and shown in
//!   [`RelayStats::clock_offset_ms`](crate::RelayStats::clock_offset_ms). A 4xx answered to a request signed 30 s or more away
//!   from the receiver's clock is not a verdict on the event: it is retried with the
//!   corrected time (spending an attempt), never dead-lettered with the backlog after it.
//!   A `Retry-After` given as a date is the receiver's time too: it is read against the
//!   answer's own `Date` (or this clock corrected by the estimate), so a device ten minutes
//!   behind waits the seconds the receiver asked for, not ten minutes more.
//! - **Jumps.** A destination's offline backoff and 429 pause run on `Instant`, so a jump
//!   neither stretches nor cuts them. A relay judges its own leases on `Instant`: its
//!   claims and expiry sweeps never take a lease of its own (whatever the wall clock says
//!   of it), and a worker hands a claimed event back unsent once half the lease is gone by
//!   either clock, so a step forward past the lease or back by any amount never puts one
//!   event in flight twice from one relay. The app's coalescing and storage limit replace
//!   or drop only rows with no lease at all, never one that merely looks expired, so a
//!   key's head in flight is never replaced. Another relay's lease taken more than 5 s
//!   later than now was taken while the clock was ahead: it counts as expired (so does one
//!   past its end: across processes the wall clock is the only one shared). Two relays on
//!   one file (a service and `deliver_pending` in the app) stay apart through a step: each
//!   moves its own leases with the step when it sees it, and for a minute after seeing a
//!   step (or twice its poll interval, if longer) a relay takes another's lease only if it
//!   is free on the clock of before the step too, so a lease whose owner has not looked
//!   yet is neither expired by a step forward nor "taken in the future" by a step back. A
//!   crashed relay's leases, which nobody moves, are taken once that minute is over. A due time written while
//!   the clock was ahead (its commit or last attempt lies in the future) is re-anchored on
//!   now, keeping the wait it was given; the relay does this when it starts and whenever it
//!   sees the wall clock step: move more than 2 s further than the time since boot between
//!   two looks (each poll, and before every expiry sweep). The time since boot counts the
//!   hours a device sleeps and no step, so a suspend is not a step: `CLOCK_BOOTTIME` on
//!   Linux and Android, `CLOCK_MONOTONIC` on macOS and iOS (which counts sleep there),
//!   `Instant` on Windows (QueryPerformanceCounter counts standby and hibernation); an
//!   injected [`Clock`](crate::clock::Clock) gives its own through `elapsed_ms`. At a step
//!   it moves the deadlines (`expires_in`) of the events committed before it by as much:
//!   after a step back none lives longer than it was given, after a step forward none
//!   expires early (a device that boots a week behind and queues events expiring in an
//!   hour keeps them when NTP steps its clock forward a week). (After a step back, events
//!   committed between the relay's last look and the step, at most a poll apart, keep the
//!   deadlines the old clock wrote; after a step forward, the commit time tells.) Due
//!   times do not move forward: nothing in a row tells a retry rescheduled on the new clock
//!   before the relay saw the step from one the old clock wrote, so a retry waiting at a
//!   step forward comes due early, once. If that write fails (the app holds the write lock past the busy
//!   timeout, as a migration at boot does), it is tried again at every look, and no event
//!   expires until it is written. On a system without a clock that counts sleep (the BSDs
//!   among others) a step forward cannot be told from a suspend whose hours really passed:
//!   there only steps back move deadlines, and a deadline that passed in a step forward
//!   expires its event. A step while no relay runs is not seen: deadlines are wall-clock
//!   times.
//!
//! `tests/clocks.rs` covers these with an injected clock; `cli/tests/clocks_cli.rs` runs the
//! `outbox relay` CLI under `faketime` 10 minutes behind, 10 minutes ahead and a day ahead.
//!
//! # About threads
//!
//! [`Outbox`](crate::Outbox) is `Send + Sync` and cheap to clone. A relay runs one writer thread
//! (`outbox-relay`, the only one that writes rows), one checkpointer (`outbox-ckpt`, which
//! only copies the WAL back into the file, on a connection outside the pool), one accountant
//! (`outbox-account`, which tells destinations their streams' state) and, per destination, a
//! configurable number of delivery threads (`outbox-w<i>-<n>`: the destination's place in
//! the configuration, then the worker; every name fits the 15 bytes Linux keeps) that only
//! do HTTP; all are joined by [`RelayHandle::shutdown`](crate::RelayHandle::shutdown) or on drop, within a bounded
//! time (`tests/threads.rs`). An MQTT destination adds its connection thread
//! (`outbox-mqtt-<destination>`); an `outbox_cli::ingest::IngestServer` runs two I/O threads
//! (`outbox-ingest-io`) and its database threads (`outbox-ingest-db-<n>`), joined by its
//! `shutdown`. An open [`Outbox`](crate::Outbox)'s connection pool (r2d2) keeps one
//! maintenance thread (`outbox-pool`, which opens a connection when none is idle), ended as
//! the last clone of the `Outbox` is dropped. Every blocking call has a
//! timeout: HTTP (connect and whole request), SQLite (the busy timeout), joins (the shutdown
//! timeout).
