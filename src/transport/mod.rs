//! The seam between the relay and the network: what is sent, and what came back.
//!
//! The relay hands each request's events to a [`Transport`] and decides what to do from the
//! [`Attempt`] it returns. [`HttpTransport`] is the built-in one; implement the trait for
//! another protocol, or to fake a receiver in a test:
//!
//! ```
//! use sqlite_outbox::transport::{Attempt, OutboundEvent, Transport};
//!
//! /// Accepts everything, and remembers nothing.
//! struct Sink;
//!
//! impl Transport for Sink {
//!     fn send(&self, events: &[OutboundEvent]) -> Attempt {
//!         Attempt::Answered { status: 204, retry_after: None, detail: format!("{} taken", events.len()) }
//!     }
//! }
//! let relay_config = sqlite_outbox::RelayConfig::transport(Sink);
//! # let _ = relay_config;
//! ```
//!
//! A closure `Fn(&[OutboundEvent]) -> Attempt` is a transport too.
//!
//! The layer: the network (HTTP through ureq, MQTT through rumqttc). It uses the wire (to
//! encode and sign), `observe` (send spans) and the foundation; never the file or the relay,
//! whose workers call it.

mod absolute_form;
mod clock_offset;
mod http;
#[cfg(feature = "mqtt")]
mod mqtt;
mod proxy;
mod resolver;
pub(crate) mod sending;
mod tcp;
mod wire_meter;

use std::time::Duration;

pub(crate) use http::agent_config;
pub use http::{HttpConfig, HttpTransport};
#[cfg(feature = "mqtt")]
#[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
pub use mqtt::{MqttConfig, MqttTransport, MqttVersion};
pub use sending::Sending;
pub(crate) use wire_meter::wire_bytes_here;

pub use crate::outbound::OutboundEvent;

/// What one delivery attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attempt {
    /// The receiver answered with an HTTP status (any status: the relay classifies it).
    Answered {
        /// The HTTP status code.
        status: u16,
        /// The `Retry-After` the receiver asked for, if any and if valid.
        retry_after: Option<Duration>,
        /// A short description for `last_error` (status line and the start of the body).
        detail: String,
    },
    /// The receiver could not be reached before the request was written: DNS failure,
    /// connection refused, connect timeout, TLS handshake failure. Backs off the whole
    /// destination; does not spend the event's attempts.
    Unreachable {
        /// What went wrong.
        reason: String,
    },
    /// The request was written but no valid answer came: a read timeout, a reset or close
    /// mid-response, a malformed answer. The event spends an attempt and backs off on its own
    /// (it may be what the receiver chokes on); the destination stays open for the others.
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// The event cannot be sent at all (its stored data is not valid JSON, say).
    /// Dead-letters it at once.
    Unsendable {
        /// Why.
        reason: String,
    },
}

/// Sends events to one destination and reports what happened.
///
/// `events` holds one event, or a batch when the destination batches; the outcome applies to
/// all of them. Implementations must not panic on network input and must bound every call in
/// time; the relay calls `send` from several worker threads at once.
pub trait Transport: Send + Sync + 'static {
    /// Delivers `events` once and reports the outcome.
    fn send(&self, events: &[OutboundEvent]) -> Attempt;

    /// Delivers `events` once and reports one outcome per event, in order. The default
    /// sends them as one request ([`send`](Self::send)) whose outcome is every event's;
    /// a transport that sends each event on its own (MQTT: one PUBLISH each) overrides it,
    /// so one event that fails costs the others nothing.
    fn send_each(&self, events: &[OutboundEvent]) -> Vec<Attempt> {
        let attempt = self.send(events);
        vec![attempt; events.len()]
    }

    /// Starts delivering `events` and returns their outcomes or a [`Sending`] to wait on.
    /// The default sends at once ([`send_each`](Self::send_each)). A transport whose
    /// requests can queue behind one another on one connection (MQTT) overrides it: the
    /// worker then hands it the next request before this one is answered, so the connection
    /// never idles between a worker's requests.
    fn start_each(&self, events: &[OutboundEvent]) -> Sending {
        Sending::done(self.send_each(events))
    }

    /// Whether the receiver said it takes streams' accounting (the
    /// [`ACCOUNTING_HEADER`](crate::wire::ACCOUNTING_HEADER) on a 2xx answer): a destination
    /// left to its default is told its streams' state only then. None said so by default.
    fn takes_accounting(&self) -> bool {
        false
    }

    /// How far the receiver's clock is from this machine's (receiver minus local, in
    /// milliseconds), if the transport can tell. Shown in
    /// [`RelayStats::clock_offset_ms`](crate::RelayStats::clock_offset_ms).
    fn clock_offset_ms(&self) -> Option<i64> {
        None
    }
}

impl<F> Transport for F
where
    F: Fn(&[OutboundEvent]) -> Attempt + Send + Sync + 'static,
{
    fn send(&self, events: &[OutboundEvent]) -> Attempt {
        self(events)
    }
}
