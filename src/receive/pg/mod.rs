//! PostgreSQL on the receiving side (feature `postgres`): the tables of the inbox and of
//! `outbox ingest`, created and upgraded by versioned migrations, the inbox itself, and TLS
//! connections as libpq's `sslmode` and `sslrootcert` ask.

mod inbox;
mod schema;
mod tls;

pub use inbox::PgInbox;
pub use schema::{migrate, schema_version};
pub use tls::{pg_connect, pg_connect_config, PgTls};
