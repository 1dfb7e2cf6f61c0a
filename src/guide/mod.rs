//! The guide: what the crate does, and why, a page per subject. Each page's examples run as
//! tests. Figures measured by the bench are in docs/PERFORMANCE.md.
//!
//! Start with [`promises`], then the page for what you are building.

pub mod async_apps;
pub mod destinations;
pub mod durability;
pub mod enqueueing;
pub mod fleet;
pub mod metered_links;
pub mod offline;
pub mod operating;
pub mod platforms;
pub mod promises;
pub mod receiving;
pub mod relay;
pub mod sql_contract;
pub mod tracing;
