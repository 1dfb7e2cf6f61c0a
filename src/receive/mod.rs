//! The receiving side: verify a signed request, read its CloudEvents, and apply each event
//! exactly once with an inbox kept in the receiver's own transaction.
//!
//! ```
//! use sqlite_outbox::receive::{verify_request, Inbox, Receipt, Secret, Verifier};
//! use sqlite_outbox::rusqlite::Connection;
//!
//! fn handle(headers: &[(String, String)], body: &[u8], now: i64, conn: &mut Connection)
//!     -> Result<u16, Box<dyn std::error::Error>> {
//!     let verifier = Verifier::new([Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?]);
//!     let events = match verify_request(&verifier, headers, body, now) {
//!         Ok(events) => events,  // signature, timestamp (±5 min) and CloudEvents checked
//!         Err(_) => return Ok(400),
//!     };
//!     let tx = conn.transaction()?;
//!     for event in &events {
//!         if Inbox::receive(&tx, &event.source, &event.id)? == Receipt::New {
//!             // apply the event's effect here, in the same transaction
//!         }
//!     }
//!     tx.commit()?;  // the effect and the inbox row commit together
//!     Ok(204)
//! }
//! # let mut conn = Connection::open_in_memory().unwrap();
//! # sqlite_outbox::receive::migrate(&mut conn).unwrap();
//! # assert_eq!(handle(&[], b"{}", 0, &mut conn).unwrap(), 400);
//! ```
//!
//! **One key per device.** A receiver that gives each device its own key (a `whpk_`
//! public key from `outbox keygen`) keeps them in a [`KeyRegistry`], each bound to the
//! sources it may sign for, and verifies with [`verify_request_for`]: only the keys of the
//! source the request names in `outbox-source` are tried, and an event of any other source
//! refuses the request ([`ReceiveError::ForgedSource`]). `outbox ingest` verifies this way.
//! A [`Verifier`] holding every device's key would take any device's signature for any
//! source.
//!
//! [`migrate`] brings the receiver's own SQLite database to the outbox's schema (the inbox
//! table `outbox_inbox` with the rest of the outbox's tables, so a receiver can relay on
//! too); [`Inbox::prune`]
//! deletes old rows in small pages. Verification errors have their own kinds
//! ([`VerifyError`]); signatures are compared in constant time.
//!
//! **Conformance.** `tests/vectors/` holds the 76 Standard Webhooks cases and 142
//! CloudEvents HTTP cases from the reference libraries' and SDKs' own test suites; every case
//! gives the expected outcome. Where the references disagree, this crate chooses:
//!
//! - secrets are decoded leniently (padding optional), like the Python reference, but a key
//!   under [`MIN_SECRET_BYTES`] (24, the specification's minimum) is refused;
//! - a timestamp before 1970 is refused when the window is enforced; exactly ±tolerance is in;
//! - the content type must say CloudEvents (a bare `application/json` is not guessed at);
//! - attribute names are `a-z0-9` only (names with `_` are refused), extension values are
//!   strings, booleans or 32-bit integers, and `data` with `data_base64`, or object data
//!   under a non-JSON `datacontenttype`, is refused.

// The layer: the receiving side uses the wire (signatures, CloudEvents, trace context) and
// the store (the inbox's table migrates with the outbox's schema); never the relay.

pub(crate) mod inbox;
pub(crate) mod key_registry;
#[cfg(feature = "postgres")]
pub(crate) mod pg;

pub use crate::receive::inbox::{verify_request, Inbox, Receipt, ReceiveError};
pub use crate::receive::key_registry::{request_source, verify_request_for, KeyRegistry};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::receive::pg::{
    migrate as pg_migrate, pg_connect, pg_connect_config, schema_version as pg_schema_version,
    PgInbox, PgTls,
};
pub use crate::store::database::migrate_connection as migrate;
pub use crate::wire::cloudevents::{
    parse_batch, parse_request, parse_structured, CloudEvent, Data, ParseError,
};
pub use crate::wire::content_encoding::{
    check_encoding, decode_body, DecodeError, MAX_DECODE_RATIO,
};
pub use crate::wire::signature::{
    Secret, Verifier, VerifyError, VerifyingKey, MIN_SECRET_BYTES, SECRET_PREFIX,
};
pub use crate::wire::signing_key::{PublicKey, SigningKey, PUBLIC_KEY_PREFIX, SIGNING_KEY_PREFIX};
pub use crate::wire::trace_context::{TraceContextError, TraceParent};
