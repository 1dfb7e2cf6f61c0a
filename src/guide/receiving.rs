//! The receiving side: verifying, parsing and applying events once, and `outbox ingest`, the fleet's receiving end in PostgreSQL.
//!
//! # The receiving side
//!
//! [`receive`](crate::receive) verifies a request, parses its CloudEvents and records each event id in an
//! inbox table inside the receiver's own transaction, so every event takes effect once. Its
//! module docs show a complete handler; `examples/receiver.rs` is a complete receiver
//! (`cargo run --example receiver -- --db received.db --secret whsec_…`). With the
//! `postgres` feature, `receive::PgInbox` does the same in a PostgreSQL transaction, with
//! its own versioned migrations (`receive::pg_migrate`).
//!
//! # The fleet's receiving end: `outbox ingest` into PostgreSQL
//!
//! ```text
//! devices ──▶ load balancer ──▶ outbox ingest × N ──▶ PostgreSQL ──▶ your consumers
//!  (each: app + outbox file        (stateless,           (outbox_ingested)   (SQL, replicas,
//!   + outbox relay)                 any number)                               Debezium → Kafka)
//! ```
//!
//! `outbox ingest --listen 0.0.0.0:8080 --postgres-file pg-url --keys fleet-keys`
//! (library: `outbox_cli::ingest::IngestServer`, in the crate `outbox-cli`) verifies each
//! request's signature against the keys of the device it names, parses its CloudEvents,
//! and stores them in **one** PostgreSQL transaction in `outbox_ingested` (`source, id,
//! type, subject, partitionkey, sequence bigint, time timestamptz, data jsonb,
//! received_at`; primary key `(source, id)`), answering 204 only after the commit. It
//! creates or migrates its tables at start, before `/healthz` can answer 200.
//!
//! **One identity per device.** Each device signs with its own Ed25519 key (Standard
//! Webhooks `v1a`); the ingest holds only public keys, in a key registry that says which
//! sources each key may sign for. A device taken off its pole signs for itself and nobody
//! else, and a leaked registry signs for nobody.
//!
//! 1. *Provision.* On the device: `outbox keygen --out /etc/outbox/device.key` writes the
//!    private key (`whsk_…`, mode 0600) and prints its public key (`whpk_…`); the relay
//!    signs with `outbox relay --signing-key /etc/outbox/device.key …` (library:
//!    [`Destination::signing_key`](crate::Destination::signing_key)). At the ingest, one line in the `--keys` file,
//!    `KEY_ID SOURCE_PATTERN KEY` (`pump-42 /devices/pump-42 whpk_…`; a pattern is a source
//!    or a prefix ending in `*`; `#` starts a comment), then `kill -HUP` the ingest (the
//!    file is re-read, no connection dropped; a file with a malformed line changes nothing
//!    and is logged). Or, with `--keys-table`, one row: `INSERT INTO outbox_device_keys
//!    (key_id, source_pattern, key) VALUES ('pump-42', '/devices/pump-42', 'whpk_…')`,
//!    taken within a second by every ingest process.
//! 2. *Rotate.* Add the new key beside the old one (two lines or rows for one source: both
//!    verify), move the device to its new key, then remove the old line or row.
//! 3. *Revoke.* Remove the line and send SIGHUP, or `UPDATE outbox_device_keys SET
//!    revoked_at = now() WHERE key_id = 'pump-42'` (a future `revoked_at` takes effect
//!    then, within 30 s).
//!
//! `--secret` (a shared `whsec_` secret that signs for **any** source) stays for a
//! single-tenant fleet, and for relays older than the `outbox-source` header: without the
//! header, only such secrets can verify a request. Each check that needs no body comes
//! before it is read: an `outbox-source` over 1,024 bytes: 400; missing webhook headers or
//! a timestamp outside ±5 minutes: 401; a source no key is for, or no `outbox-source` and
//! no `--secret`: 401, in the very words of a bad signature (`invalid_signature: no valid
//! v1 or v1a signature`), so the answer does not tell which sources are registered (what
//! remains: a source no key is for is answered before its body is read, a registered one
//! after, so a client that times the answer to a large body can still tell them apart; the
//! keys themselves are never exposed); then the source's rate. After the body: a signature
//! by none of the source's keys: 401 (one Ed25519 check per key of the source at most,
//! against the first well-formed `v1a` entry); an event whose `source` differs from the
//! header's: 403, nothing of the request stored. The ingest verifies with the library's
//! [`receive::KeyRegistry`](crate::receive::KeyRegistry) and
//! [`receive::verify_request_for`](crate::receive::verify_request_for), which an app that
//! receives in its own server uses the same way. Keys of small order (the identity point,
//! with which one signature verifies anything) and non-canonical encodings are refused
//! when the file or row is read. Refusals are counted by reason (`GET /metrics`, and
//! `refusals` in `outbox_sources` for registered sources only: anyone can name any
//! source) and logged at most once a minute per registered source; refusals of sources no
//! key is for share one budget of ten lines a minute, and nothing is kept per such name.
//! Every value from a request is escaped and cut to 200 characters in the log, never with
//! a key.
//!
//! **While the keys cannot be read.** With `--keys-table`, an ingest reads the table at
//! start, on a connection of its own (not the database threads' queue, so a revocation
//! under load takes effect within a second or so). Until it has read it once (started
//! during a PostgreSQL outage, say), a source no loaded key covers may be a provisioned
//! device: it gets 503 with `Retry-After: 5`, not 401, and `/healthz` is 503 until the
//! table is read. A reload that fails (a malformed `--keys` line at SIGHUP, the table
//! unreadable) keeps the keys as they were and counts in
//! `outbox_ingest_key_reload_failures_total`; `outbox_ingest_key_reload_last_success_timestamp_seconds`
//! says when the keys were last read in full (alert when it is old). `outbox ingest
//! --check-keys FILE` reads a keys file as SIGHUP would and exits 0, or 2 naming the first
//! bad line: run it before the SIGHUP.
//!
//! **A device answered 401** (its key not provisioned yet, revoked, or a receiver that
//! cannot check keys) spends no attempt: the answer is about who sends, not what is sent,
//! and dead-lettering a backlog for it would turn a provisioning mistake into lost work.
//! (A 403 stays a client error: the ingest answers it to an event of another source than
//! the key's, which no retry will change.) The relay backs off the destination as when it cannot be reached (single
//! probes, a growing pause) and keeps every event until the key is accepted; the events'
//! `last_error` says the destination refuses the relay's credentials.
//!
//! **TLS on both sides.** Devices reach the ingest over HTTPS through your load balancer
//! (the relay verifies the server with Mozilla's roots). The ingest reaches PostgreSQL with
//! libpq's parameters in its URL: `sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`
//! checks the certificate and host name, `require` encrypts and never falls back to
//! plaintext, `prefer` (the default) encrypts when the server offers it; a key/value
//! string is read as libpq reads it (`sslmode = require`, quoted values, `\` escapes). Its
//! connections carry TCP keepalives (10 s idle, 5 s apart, 3 probes) and a 20 s TCP user
//! timeout, so after a failover that drops packets a database thread learns within seconds
//! that its connection is dead, not after the system's 15 minutes; and a 20 s
//! `statement_timeout` (a URL's own `options=-c statement_timeout=…` wins), below the 30 s a
//! request waits, so PostgreSQL cancels a store nobody waits for any more;
//! `receive::pg_connect` does the same for `receive::PgInbox` users.
//!
//! **The fleet at a glance.** `outbox_sources` holds a row per source stored: `first_seen`,
//! `last_seen`, `events_stored`, `newest_event_time` and `refusals`; `SELECT source,
//! last_seen FROM outbox_sources WHERE last_seen < now() - interval '1 day'` lists the
//! devices gone silent. `--metrics-listen 127.0.0.1:9090` serves `GET /metrics`
//! (Prometheus text: requests by status, refusals by reason, events stored, request
//! latency, bytes in flight, database queue depth) on its own address, not with the events.
//!
//! - **Exactly once.** A device sends an event until it gets a 2xx; a 2xx comes only after
//!   the commit; the commit skips every `(source, id)` already stored (`ON CONFLICT DO
//!   NOTHING`, which also waits out a concurrent transaction storing the same pair). So a
//!   retry after a lost answer, a killed process or a replay stores nothing new, whichever
//!   process it reaches: each committed event is stored once. `cli/tests/ingest_fleet.rs` kills
//!   ingest processes with SIGKILL under four devices and counts: 0 lost, 0 stored twice.
//! - **Order.** A device sends a key's events one at a time in commit order, each after the
//!   previous one's 2xx, so within `(source, partitionkey)` rows commit in `sequence` order
//!   even when they go through different processes. Read a key's events with
//!   `SELECT * FROM outbox_key_events($source, $key)` (ordered by `sequence`); never order
//!   by `received_at`, each process's own clock.
//! - **Answers.** Bad or missing signature, stale timestamp: 401 with the reason (missing
//!   webhook headers and a timestamp outside the tolerance are refused before a byte of
//!   the body is read, with [`receive::Verifier::verify_headers`](crate::receive::Verifier::verify_headers)); not
//!   CloudEvents, or a `sequence` that is not a decimal integer: 400; an event PostgreSQL
//!   cannot hold (a NUL character, `\u0000`, in its data or a text attribute): 422 with a
//!   JSON body naming each such event and why (`{"refused": [{"id", "reason"}]}`), nothing
//!   of the request stored, and the device's relay splits the batch so that only that event
//!   is dead-lettered, with the reason; over `--max-body`
//!   (1 MiB): 413; PostgreSQL unreachable or failing: 503 with `Retry-After: 5`; every
//!   database thread busy: 503 with `Retry-After: 1`. A device's relay backs off on 503s
//!   and keeps its events meanwhile. `/healthz` answers from a state a probe of
//!   PostgreSQL refreshes every second on a connection of its own, never through the
//!   database queue (a flood of health checks takes nothing from the devices' posts, and a
//!   full queue under one heavy sender is not "unhealthy"), and a store that fails makes
//!   it 503 at once until a probe succeeds again. It answers `GET` and `HEAD` only; any other
//!   method there is 405 with `Allow: GET, HEAD` (a relay given that path by mistake
//!   dead-letters its events with the reason, to retry at the right one, instead of having
//!   them counted delivered and never stored).
//! - **Limits.** `--threads` database threads (and connections), `--max-connections` open
//!   connections (past it, new ones wait to be accepted), `--read-timeout` for a request's
//!   head and for its body (a slow or idle client is cut off at it: slowloris cannot hold
//!   anything: a request holds no budget for bytes it has not sent), `--write-timeout` (10 s) for each write of an answer (a client that
//!   pipelines requests and reads none of the answers loses its connection then, so it
//!   cannot hold a slot of `--max-connections`), `--max-requests-per-connection` (1,000:
//!   the answer to the last says `connection: close` and the connection ends),
//!   `--max-inflight-bytes` (64 MiB: body bytes held across all connections, counted as
//!   they arrive and not as declared, so a connection that declares a megabyte and sends
//!   nothing holds nothing; bytes past it get 503 with `Retry-After: 1`),
//!   `--max-inflight-bytes-per-peer` (a quarter of that: one address's share, decoded gzip
//!   bytes included), `--max-connections-per-peer` (a quarter of `--max-connections`: the
//!   next connection from that address is answered 503 with `Retry-After: 1` and closed;
//!   behind a load balancer that hides devices' addresses, or a NAT with many devices,
//!   raise both), `--min-body-rate` (1,024 bytes a second after a body's first 2 s: slower
//!   gets 408, so a dribbling client is cut off in seconds, not at the read timeout),
//!   a request head of 64 KiB at most (431 past it), gzip decoding and signature checks on
//!   two verification threads of their own (a full queue is 503 with `Retry-After: 1`; the
//!   I/O threads and `/healthz` stay quick under a flood of compressed garbage),
//!   `--max-rate-per-source` (off by default: verified requests a second per
//!   source; past it 429 with `Retry-After`, and requests forged in a device's name spend
//!   none of its rate), `--events-path` (`/events`; any other path but `/healthz` is 404).
//!   The docs of `outbox_cli::ingest` list what happens at each.
//! - **Into Kafka.** The table is an ordinary one: Debezium's PostgreSQL connector
//!   (`plugin.name=pgoutput`, `table.include.list=public.outbox_ingested`) streams each
//!   committed row as a change event; key the topic by `source,partitionkey` so a key stays
//!   in one partition, in commit order. Prune old rows with a `DELETE … WHERE received_at <
//!   …` in pages, or partition the table by `received_at`.
