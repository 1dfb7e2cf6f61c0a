//! On batteries and metered links: an idle relay that sleeps, wake-ups from other processes, gzip and linger.
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
//! What each of these saves (wake-ups of an idle relay, commit → receipt from another
//! process, bytes on the wire, requests and CPU with linger) is measured by `cargo run
//! --release --all-features --example bench -- frugal`; docs/PERFORMANCE.md has the rows.
