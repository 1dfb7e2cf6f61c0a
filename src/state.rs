//! Where a delivery stands: the states of a row that `queue` moves it between (the state
//! machine is drawn in its `mod.rs`), as listings, notices and the CLI name them.

use serde::Serialize;

use crate::error::{Error, Result};

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum State {
    /// Waiting for delivery (including in flight and waiting for a retry).
    Pending,
    /// Accepted by the receiver.
    Delivered,
    /// Given up on; kept with its last error until retried or purged.
    Dead,
    /// Not delivered by its deadline ([`Event::expires_in`](crate::Event::expires_in)).
    Expired,
    /// Written to an offline bundle ([`Outbox::export`](crate::Outbox::export)), to be delivered from there.
    Exported,
}

impl std::str::FromStr for State {
    type Err = Error;
    fn from_str(s: &str) -> Result<State> {
        match s {
            "pending" => Ok(State::Pending),
            "delivered" => Ok(State::Delivered),
            "dead" => Ok(State::Dead),
            "expired" => Ok(State::Expired),
            "exported" => Ok(State::Exported),
            other => Err(Error::InvalidConfig(format!(
                "unknown state {other:?}: use pending, delivered, dead, expired or exported"
            ))),
        }
    }
}
