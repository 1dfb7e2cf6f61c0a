//! Delivery to an MQTT broker (feature `mqtt`): QoS 1, and an event is delivered when the
//! broker's PUBACK for it arrives, and only then.
//!
//! Each event is one PUBLISH of its CloudEvents JSON envelope (the structured mode of the
//! CloudEvents MQTT binding, the only one MQTT 3.1.1 has: the same body an HTTP receiver
//! gets), to a topic rendered from a template (`outbox/{type}` by default). The broker being
//! unreachable, refusing the connection or dropping it backs off the whole destination and
//! spends no attempt, as for HTTP; the events stay pending in the outbox, which is why the
//! session is clean. See [`session`] for how a publish learns of its own PUBACK.

mod session;
mod topic;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use rumqttc::MqttOptions;

use crate::error::{Error, Result};
use crate::transport::{Attempt, OutboundEvent, Transport};
use crate::wire;
use session::SharedLink;
pub(crate) use topic::TopicTemplate;

/// Unacknowledged publishes one connection allows (rumqttc's packet id window; its request
/// channel is as deep). Above the relay's own in-flight limit per destination (400).
pub(crate) const IN_FLIGHT_LIMIT: u16 = 1024;

/// Settings of an MQTT destination. Setters never fail; [`Relay::start`](crate::Relay::start)
/// checks them.
#[derive(Clone)]
pub struct MqttConfig {
    pub(crate) topic: String,
    pub(crate) client_id: Option<String>,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) keep_alive: Duration,
    pub(crate) ack_timeout: Duration,
    pub(crate) max_packet_bytes: usize,
}

impl fmt::Debug for MqttConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttConfig")
            .field("topic", &self.topic)
            .field("client_id", &self.client_id)
            .field("username", &self.credentials.as_ref().map(|(u, _)| u))
            .field("keep_alive", &self.keep_alive)
            .field("ack_timeout", &self.ack_timeout)
            .field("max_packet_bytes", &self.max_packet_bytes)
            .finish()
    }
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            topic: "outbox/{type}".into(),
            client_id: None,
            credentials: None,
            keep_alive: Duration::from_secs(30),
            ack_timeout: Duration::from_secs(15),
            max_packet_bytes: 256 * 1024,
        }
    }
}

impl MqttConfig {
    /// The default settings: topic `outbox/{type}`, a client id of `outbox-` and a random
    /// suffix per start, no credentials, 30 s keep-alive, 15 s to wait for a PUBACK, packets
    /// up to 256 KiB.
    pub fn new() -> Self {
        Self::default()
    }

    /// The topic template: text with `{type}`, `{key}`, `{source}`, `{subject}` and
    /// `{destination}` placeholders. A template with a wildcard, an empty level or an
    /// unknown placeholder is refused at start; an event missing a value its topic needs
    /// (no key, no subject) is dead-lettered with that reason. A value's leading and trailing
    /// `/` are dropped, so the source `/sqlite-outbox` fills `{source}` as `sqlite-outbox`.
    pub fn topic(mut self, template: impl Into<String>) -> Self {
        self.topic = template.into();
        self
    }

    /// A fixed client id, for brokers whose policies name it (AWS IoT Core). A broker drops
    /// an older connection with the same id, so give each device its own.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = Some(id.into());
        self
    }

    /// User name and password for the CONNECT packet.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((username.into(), password.into()));
        self
    }

    /// The keep-alive interval (1 s to 18 h; AWS IoT Core allows up to 1,200 s).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// How long a publish waits for its PUBACK before it counts as a failed attempt.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// The largest PUBLISH packet sent (topic, header and payload); a larger event is
    /// dead-lettered with its size. Keep it at or below the broker's own limit.
    pub fn max_packet_bytes(mut self, bytes: usize) -> Self {
        self.max_packet_bytes = bytes;
        self
    }

    fn check(&self, destination: &str) -> Result<TopicTemplate> {
        let bad = |why: String| Error::InvalidConfig(format!("destination {destination}: {why}"));
        if !(Duration::from_secs(1)..=Duration::from_secs(65_535)).contains(&self.keep_alive) {
            return Err(bad(format!(
                "MQTT keep-alive of {:?} is out of range (1 s to 65,535 s)",
                self.keep_alive
            )));
        }
        if self.ack_timeout.is_zero() || self.ack_timeout > Duration::from_secs(3600) {
            return Err(bad(format!(
                "MQTT ack timeout of {:?} is out of range (up to 1 h)",
                self.ack_timeout
            )));
        }
        if !(1024..=268_435_455).contains(&self.max_packet_bytes) {
            return Err(bad(format!(
                "MQTT max packet size of {} bytes is out of range (1 KiB to 256 MiB)",
                self.max_packet_bytes
            )));
        }
        if let Some(id) = &self.client_id {
            if id.is_empty() || id.len() > 128 {
                return Err(bad("MQTT client id must be 1 to 128 bytes".into()));
            }
        }
        TopicTemplate::parse(&self.topic).map_err(|e| bad(e.to_string()))
    }
}

/// Where an `mqtt://host:port` URL points.
fn parse_url(url: &str) -> Result<(String, u16)> {
    let bad = |why: &str| Error::InvalidConfig(format!("MQTT URL {url:?}: {why}"));
    let rest = match url.split_once("://") {
        Some(("mqtt", rest)) => rest,
        Some(("mqtts", _)) => return Err(bad("TLS (mqtts://) is not supported yet")),
        _ => return Err(bad("must start with mqtt://")),
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains(['/', '?', '#', '@']) {
        return Err(bad("must be mqtt://host:port, with no path or user"));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| bad("the port is not a number from 1 to 65535"))?,
        ),
        None => (rest, 1883),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err(bad("needs a host and a port from 1 to 65535"));
    }
    Ok((host.to_string(), port))
}

/// Publishes events to an MQTT broker over one connection, kept by a thread of its own
/// (`outbox-mqtt-<destination>`) that stops and is joined when the transport is dropped.
pub struct MqttTransport {
    topic: TopicTemplate,
    ack_timeout: Duration,
    max_packet_bytes: usize,
    link: SharedLink,
    stop: Mutex<Option<Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for MqttTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttTransport")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl MqttTransport {
    /// Checks `config`, and starts the connection thread for the broker at `url`
    /// (`mqtt://host:port`).
    pub fn new(destination: &str, url: &str, config: &MqttConfig) -> Result<MqttTransport> {
        let topic = config.check(destination)?;
        let (host, port) = parse_url(url)?;
        let client_id = config
            .client_id
            .clone()
            .unwrap_or_else(|| format!("outbox-{:016x}", fastrand::u64(..)));
        let mut options = MqttOptions::new(client_id, host.clone(), port);
        options
            .set_keep_alive(config.keep_alive)
            .set_clean_session(true)
            .set_inflight(IN_FLIGHT_LIMIT)
            .set_max_packet_size(64 * 1024, config.max_packet_bytes);
        if let Some((user, password)) = &config.credentials {
            options.set_credentials(user.clone(), password.clone());
        }
        let link = SharedLink::default();
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let broker = format!("{host}:{port}");
        let thread = {
            let link = Arc::clone(&link);
            std::thread::Builder::new()
                .name(format!("outbox-mqtt-{destination}"))
                .spawn(move || session::run(options, link, stop_rx, broker))?
        };
        Ok(MqttTransport {
            topic,
            ack_timeout: config.ack_timeout,
            max_packet_bytes: config.max_packet_bytes,
            link,
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands event `index` of a request to the connection as that slot of `ticket`, or
    /// says why it cannot be published.
    fn start_publish(
        &self,
        event: &OutboundEvent,
        ticket: &Arc<session::Ticket>,
        index: usize,
    ) -> std::result::Result<(), Attempt> {
        let topic = self
            .topic
            .render(event)
            .map_err(|reason| Attempt::Unsendable { reason })?;
        let payload = wire::structured_body(event).map_err(|e| Attempt::Unsendable {
            reason: e.to_string(),
        })?;
        // Fixed header (at most 5 bytes), topic length (2), topic, packet id (2), payload.
        let packet = 5 + 2 + topic.len() + 2 + payload.len();
        if packet > self.max_packet_bytes {
            return Err(Attempt::Unsendable {
                reason: format!(
                    "the PUBLISH would be {packet} bytes; the destination allows {} \
                     (MqttConfig::max_packet_bytes)",
                    self.max_packet_bytes
                ),
            });
        }
        session::publish(&self.link, topic, payload, ticket, index)
    }
}

impl Transport for MqttTransport {
    /// The outcome of the first event that was not delivered, else a delivery.
    fn send(&self, events: &[OutboundEvent]) -> Attempt {
        let outcomes = self.send_each(events);
        let first_failure = outcomes
            .iter()
            .position(|a| !matches!(a, Attempt::Answered { status: 200, .. }));
        let index = first_failure.unwrap_or(0);
        outcomes
            .into_iter()
            .nth(index)
            .unwrap_or(Attempt::Unsendable {
                reason: "nothing to send".into(),
            })
    }

    /// Each event is its own PUBLISH, and has its own outcome. A batch (a destination with
    /// `batch(n, …)`) is published back to back, so up to `n` messages per worker are in
    /// flight, and then their PUBACKs are awaited together.
    fn send_each(&self, events: &[OutboundEvent]) -> Vec<Attempt> {
        let ticket = session::Ticket::new(events.len());
        for (index, event) in events.iter().enumerate() {
            if let Err(attempt) = self.start_publish(event, &ticket, index) {
                ticket.settle(index, attempt);
            }
        }
        ticket.wait(self.ack_timeout)
    }
}

impl Drop for MqttTransport {
    fn drop(&mut self) {
        // Ask the event loop to disconnect (it then ends the thread), and wake the thread if
        // it is waiting to reconnect.
        session::request_disconnect(&self.link);
        drop(session::lock_ok(&self.stop).take());
        if let Some(thread) = session::lock_ok(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_or_refused_by_reason() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").unwrap(),
            ("127.0.0.1".into(), 1884)
        );
        assert_eq!(parse_url("mqtt://broker").unwrap(), ("broker".into(), 1883));
        for (url, why) in [
            ("http://x:1", "must start with mqtt://"),
            ("mqtt://x:port", "not a number"),
            ("mqtt://x:0", "port from 1"),
            ("mqtt://x:1/path", "no path"),
            ("mqtts://x:8883", "not supported yet"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let check = |c: MqttConfig| c.check("d").unwrap_err().to_string();
        assert!(check(MqttConfig::new().keep_alive(Duration::ZERO)).contains("keep-alive"));
        assert!(check(MqttConfig::new().ack_timeout(Duration::ZERO)).contains("ack timeout"));
        assert!(check(MqttConfig::new().max_packet_bytes(10)).contains("max packet"));
        assert!(check(MqttConfig::new().client_id("")).contains("client id"));
        assert!(check(MqttConfig::new().topic("a/#")).contains("wildcards"));
    }
}
