//! The file and what is kept in it: opening and migrating it, the connection settings, every
//! statement that moves a row (`queue/`), the settings every writer follows, routes, storage
//! limits, disabled destinations, and the in-process signals around commits (wake-ups, the
//! app's right of way).
//!
//! The layer: it uses the foundation (`error`, `clock`, `outbound`, `state`), the app's
//! `event` and `observe` (counters), and of the wire only the shape of a stream's
//! accounting; never the network, the relay or its threads.

pub(crate) mod budget_spend;
pub(crate) mod connection_manager;
pub(crate) mod database;
pub(crate) mod disabled;
pub(crate) mod disk_room;
pub(crate) mod limits;
pub(crate) mod oldest;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod right_of_way;
pub(crate) mod route;
pub mod settings;
pub(crate) mod stream_accounts;
pub(crate) mod type_pattern;
pub(crate) mod wake;
