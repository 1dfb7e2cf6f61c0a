//! PostgreSQL on the receiving side (feature `postgres`): the tables of the inbox and of
//! `outbox ingest`, created and upgraded by versioned migrations, and the inbox itself.

mod inbox;
mod schema;

pub use inbox::PgInbox;
pub use schema::{migrate, schema_version};
