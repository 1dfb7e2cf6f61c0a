//! Delivery to an MQTT broker (feature `mqtt`): QoS 1, and an event is delivered when the
//! broker's PUBACK for it arrives, and only then.
//!
//! Each event is one PUBLISH, to a topic rendered from a template (`outbox/{type}` by
//! default), in one of the two modes of the CloudEvents MQTT binding:
//! - structured (the default, and the only one MQTT 3.1.1 has): the payload is the event's
//!   CloudEvents JSON envelope, the same body an HTTP receiver gets; under MQTT 5 the content
//!   type property says `application/cloudevents+json; charset=utf-8`;
//! - binary (MQTT 5 only): the payload is the event's data as stored, the content type
//!   property `application/json`, and every other attribute a user property of its own name
//!   (`id`, `source`, `type`, `time`, `partitionkey`, `sequence`, …).
//!
//! The broker being unreachable, refusing the connection or dropping it backs off the whole
//! destination and spends no attempt, as for HTTP; the events stay pending in the outbox,
//! which is why the session is clean. See [`session`] for how a publish learns of its own
//! PUBACK, and [`protocol`] for what an MQTT 5 PUBACK's reason code does.

mod protocol;
mod session;
mod tls;
mod topic;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::error::{Error, Result};
use crate::transport::sending::Outcomes;
use crate::transport::sending::SETTLING_PER_WORKER;
use crate::transport::{Attempt, OutboundEvent, Sending, Transport};
use crate::wire;
pub use protocol::MqttVersion;
use protocol::{ConnectOptions, Publication};
use session::SharedLink;
use tls::TlsFiles;
pub(crate) use topic::TopicTemplate;

/// The content type property of a structured-mode message under MQTT 5.
const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";

/// The content type property of a binary-mode message: the data is stored as JSON.
const BINARY_CONTENT_TYPE: &str = "application/json";

/// Unacknowledged publishes one connection allows at most (rumqttc's packet id window). A
/// relay narrows it to its workers × batch size.
pub(crate) const IN_FLIGHT_LIMIT: u16 = 1024;

/// Settings of an MQTT destination. Setters never fail; [`Relay::start`](crate::Relay::start)
/// checks them.
#[derive(Clone)]
#[must_use = "an MqttConfig does nothing until it is given to a Destination"]
pub struct MqttConfig {
    pub(crate) topic: String,
    pub(crate) client_id: Option<String>,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) keep_alive: Duration,
    pub(crate) ack_timeout: Duration,
    pub(crate) max_packet_bytes: usize,
    pub(crate) version: MqttVersion,
    pub(crate) binary: bool,
    pub(crate) tls: TlsFiles,
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
            .field("version", &self.version)
            .field("binary", &self.binary)
            .field("ca_pem", &self.tls.ca_pem.is_some())
            .field("client_identity", &self.tls.client_identity_pem.is_some())
            .field("alpn", &self.tls.alpn)
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
            version: MqttVersion::V311,
            binary: false,
            tls: TlsFiles::default(),
        }
    }
}

impl MqttConfig {
    /// The default settings: MQTT 3.1.1, structured mode, topic `outbox/{type}`, a client id
    /// of `outbox-` and a random suffix per start, no credentials, 30 s keep-alive, 15 s to
    /// wait for a PUBACK, packets up to 256 KiB; for `mqtts://`, Mozilla's root CAs and no
    /// client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// The topic template: text with `{type}`, `{key}`, `{source}`, `{subject}` and
    /// `{destination}` placeholders. A template with a wildcard, an empty level or an
    /// unknown placeholder is refused at start; an event missing a value its topic needs
    /// (no key, no subject) is dead-lettered with that reason, unless the placeholder ends
    /// with `?` (`{subject?}`), which lets a missing value make an empty level. A value's leading and trailing
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

    /// The protocol version: MQTT 3.1.1 (the default) or MQTT 5. Under MQTT 5 a PUBACK's
    /// reason code decides: 0x87 (not authorized), 0x90 (topic name invalid) and 0x99
    /// (payload format invalid) dead-letter the event with the reason; any other code of
    /// 0x80 or more (quota exceeded, …) is a failed attempt, retried after a backoff. The
    /// broker's receive maximum bounds the in-flight window, and its maximum packet size
    /// joins [`max_packet_bytes`](Self::max_packet_bytes) as a limit.
    pub fn version(mut self, version: MqttVersion) -> Self {
        self.version = version;
        self
    }

    /// Binary content mode (MQTT 5 only): the payload is the event's data, and its
    /// attributes are user properties. Off: structured mode, the whole JSON envelope as the
    /// payload.
    pub fn binary_mode(mut self, binary: bool) -> Self {
        self.binary = binary;
        self
    }

    /// For `mqtts://`: the CA certificates (PEM) that may sign the broker's certificate,
    /// instead of Mozilla's roots. For AWS IoT Core, `AmazonRootCA1.pem`.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// For `mqtts://`: the device's certificate chain and private key (PEM; PKCS#8, PKCS#1
    /// or SEC1), for mutual TLS.
    pub fn client_identity_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        private_key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_identity_pem = Some((certificate.into(), private_key.into()));
        self
    }

    /// For `mqtts://`: an ALPN protocol to offer; AWS IoT Core on port 443 wants
    /// `x-amzn-mqtt-ca`.
    pub fn alpn(mut self, protocol: impl Into<String>) -> Self {
        self.tls.alpn.push(protocol.into());
        self
    }

    fn check(&self, destination: &str) -> Result<TopicTemplate> {
        let bad = |why: String| Error::InvalidConfig(format!("destination {destination}: {why}"));
        // rumqttc panics below these keep-alives: 1 s for MQTT 3.1.1, 5 s for MQTT 5.
        let shortest = match self.version {
            MqttVersion::V5 => Duration::from_secs(5),
            _ => Duration::from_secs(1),
        };
        if !(shortest..=Duration::from_secs(65_535)).contains(&self.keep_alive) {
            return Err(bad(format!(
                "MQTT keep-alive of {:?} is out of range ({shortest:?} to 65,535 s for {:?})",
                self.keep_alive, self.version
            )));
        }
        if self.binary && self.version != MqttVersion::V5 {
            return Err(bad(
                "binary content mode needs MQTT 5 (MQTT 3.1.1 has no properties to carry the \
                 attributes)"
                    .into(),
            ));
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

/// Where an `mqtt://host:port` or `mqtts://host:port` URL points.
#[derive(Debug, PartialEq, Eq)]
struct BrokerAddress {
    tls: bool,
    host: String,
    port: u16,
}

/// Parses a broker URL; the port defaults to 1883, or 8883 with TLS.
fn parse_url(url: &str) -> Result<BrokerAddress> {
    let bad = |why: &str| Error::InvalidConfig(format!("MQTT URL {url:?}: {why}"));
    let (tls, rest) = match url.split_once("://") {
        Some(("mqtt", rest)) => (false, rest),
        Some(("mqtts", rest)) => (true, rest),
        _ => return Err(bad("must start with mqtt:// or mqtts://")),
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
        None => (rest, if tls { 8883 } else { 1883 }),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err(bad("needs a host and a port from 1 to 65535"));
    }
    Ok(BrokerAddress {
        tls,
        host: host.to_string(),
        port,
    })
}

/// Publishes events to an MQTT broker over one connection, kept by a thread of its own
/// (`outbox-mqtt-<destination>`) that stops and is joined when the transport is dropped.
pub struct MqttTransport {
    topic: TopicTemplate,
    ack_timeout: Duration,
    max_packet_bytes: usize,
    version: MqttVersion,
    binary: bool,
    /// Whether the connection is TLS (each packet then costs a record's framing too).
    tls: bool,
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
    /// (`mqtt://host:port`, or `mqtts://host:port` for TLS).
    pub fn new(destination: &str, url: &str, config: &MqttConfig) -> Result<MqttTransport> {
        Self::with_window(destination, url, config, usize::from(IN_FLIGHT_LIMIT))
    }

    /// As [`new`](Self::new), with at most `window` publishes unacknowledged on the
    /// connection (the relay passes its workers × batch size). Publishes beyond it wait in
    /// the client, in order, until a PUBACK makes room.
    pub(crate) fn with_window(
        destination: &str,
        url: &str,
        config: &MqttConfig,
        window: usize,
    ) -> Result<MqttTransport> {
        // The request channel holds what the relay's workers run ahead of the window (each
        // up to `SETTLING_PER_WORKER` requests), so handing over a publish never fails
        // while the connection is up.
        let queue = window
            .saturating_mul(SETTLING_PER_WORKER)
            .max(2 * usize::from(IN_FLIGHT_LIMIT));
        let window = window.clamp(1, usize::from(IN_FLIGHT_LIMIT));
        let topic = config.check(destination)?;
        let address = parse_url(url)?;
        let bad = |why: String| Error::InvalidConfig(format!("destination {destination}: {why}"));
        let tls = address.tls;
        let transport = if address.tls {
            let tls = config.tls.client_config().map_err(bad)?;
            rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(tls)))
        } else if config.tls.any() {
            return Err(bad(format!(
                "TLS settings (CA, client certificate, ALPN) are given but {url} is not TLS: \
                 use mqtts://"
            )));
        } else {
            rumqttc::Transport::tcp()
        };
        let client_id = config
            .client_id
            .clone()
            .unwrap_or_else(|| format!("outbox-{:016x}", fastrand::u64(..)));
        let broker = format!("{}:{}", address.host, address.port);
        let options = ConnectOptions {
            version: config.version,
            client_id,
            host: address.host,
            port: address.port,
            keep_alive: config.keep_alive,
            credentials: config.credentials.clone(),
            max_outgoing_packet: config.max_packet_bytes,
            in_flight: u16::try_from(window).unwrap_or(IN_FLIGHT_LIMIT),
            queue,
            transport,
        };
        let link = SharedLink::default();
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
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
            version: config.version,
            binary: config.binary,
            tls,
            link,
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The message for `event`, or why it cannot be published. `broker_limit` is the
    /// largest packet the connected broker takes, if it said.
    fn prepare(
        &self,
        event: &OutboundEvent,
        broker_limit: Option<usize>,
    ) -> std::result::Result<Publication, Attempt> {
        let topic = self
            .topic
            .render(event)
            .map_err(|reason| Attempt::Unsendable { reason })?;
        let publication = self.publication(event, topic)?;
        // The broker's own limit (MQTT 5 tells it) binds as well as ours: rumqttc fails the
        // whole connection on a packet over it.
        let limit = broker_limit.map_or(self.max_packet_bytes, |b| b.min(self.max_packet_bytes));
        let packet = packet_size(&publication);
        if packet > limit {
            let whose = if broker_limit == Some(limit) {
                format!("the broker allows {limit} (its CONNACK's maximum packet size)")
            } else {
                format!("the destination allows {limit} (MqttConfig::max_packet_bytes)")
            };
            return Err(Attempt::Unsendable {
                reason: format!("the PUBLISH would be {packet} bytes; {whose}"),
            });
        }
        Ok(publication)
    }

    /// The bytes one message puts on the network, as a data budget counts them: its
    /// PUBLISH (a bound: the fixed header's length counted as its largest), its PUBACK,
    /// and over TLS a record's framing for each. Not counted: the connection's CONNECT,
    /// CONNACK, keep-alive PINGs and TLS handshake (see `guide::metered_links`).
    fn on_the_wire(&self, publication: &Publication) -> usize {
        let puback = match self.version {
            // Fixed header (2) and packet id (2).
            MqttVersion::V311 => 4,
            // And a reason code and an empty property length.
            MqttVersion::V5 => 6,
        };
        let framing = if self.tls { 2 * TLS_RECORD_FRAMING } else { 0 };
        packet_size(publication) + puback + framing
    }

    /// The message for `event` in this destination's content mode.
    fn publication(
        &self,
        event: &OutboundEvent,
        topic: String,
    ) -> std::result::Result<Publication, Attempt> {
        let unsendable = |e: serde_json::Error| Attempt::Unsendable {
            reason: format!("the stored data is not valid JSON: {e:#}"),
        };
        if self.binary {
            serde_json::from_str::<&serde_json::value::RawValue>(&event.payload)
                .map_err(unsendable)?;
            return Ok(Publication {
                topic,
                payload: event.payload.as_bytes().to_vec(),
                content_type: Some(BINARY_CONTENT_TYPE),
                user_properties: wire::attributes(event)
                    .into_iter()
                    .map(|(name, value)| (name.to_string(), value))
                    .collect(),
            });
        }
        Ok(Publication {
            topic,
            payload: wire::structured_body(event).map_err(unsendable)?,
            content_type: (self.version == MqttVersion::V5).then_some(STRUCTURED_CONTENT_TYPE),
            user_properties: Vec::new(),
        })
    }
}

/// What a TLS record adds to what it carries: its header (5), and for AES-GCM the tag (16)
/// and, in TLS 1.2, the explicit nonce (8).
const TLS_RECORD_FRAMING: usize = 29;

/// An upper bound on the PUBLISH packet's size: fixed header (at most 5 bytes), topic
/// length (2), topic, packet id (2), properties (MQTT 5) and payload.
fn packet_size(publication: &Publication) -> usize {
    let properties = if publication.content_type.is_none() && publication.user_properties.is_empty()
    {
        0
    } else {
        // Property length (at most 4), then each property: identifier (1) and strings each
        // with a two-byte length.
        4 + publication.content_type.map_or(0, |t| 1 + 2 + t.len())
            + publication
                .user_properties
                .iter()
                .map(|(k, v)| 1 + 2 + k.len() + 2 + v.len())
                .sum::<usize>()
    };
    5 + 2 + publication.topic.len() + 2 + properties + publication.payload.len()
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
        self.start_each(events).wait()
    }

    /// Publishes every event and returns at once: the PUBACKs are awaited in
    /// [`Sending::wait`], bounded by the ack timeout.
    fn start_each(&self, events: &[OutboundEvent]) -> Sending {
        let outcomes = Outcomes::new(
            events.len(),
            format!("no PUBACK within {:?}", self.ack_timeout),
        );
        let broker_limit = session::broker_max_packet(&self.link).map(|b| b as usize);
        let mut ready = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match self.prepare(event, broker_limit) {
                Ok(publication) => {
                    // The connection's thread writes it; its bytes are known here, for a
                    // data budget (see `on_the_wire`).
                    super::wire_meter::count_wire_bytes(self.on_the_wire(&publication));
                    ready.push((index, publication));
                }
                Err(attempt) => outcomes.settle(index, attempt),
            }
        }
        session::publish_all(&self.link, ready, &outcomes);
        Sending::settling(outcomes, self.ack_timeout)
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
        let address = |tls, host: &str, port| BrokerAddress {
            tls,
            host: host.into(),
            port,
        };
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").unwrap(),
            address(false, "127.0.0.1", 1884)
        );
        assert_eq!(
            parse_url("mqtt://broker").unwrap(),
            address(false, "broker", 1883)
        );
        assert_eq!(
            parse_url("mqtts://broker").unwrap(),
            address(true, "broker", 8883)
        );
        for (url, why) in [
            ("http://x:1", "must start with mqtt:// or mqtts://"),
            ("mqtt://x:port", "not a number"),
            ("mqtt://x:0", "port from 1"),
            ("mqtt://x:1/path", "no path"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e:#}");
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
        assert!(check(MqttConfig::new().binary_mode(true)).contains("needs MQTT 5"));
        let v5_short_keep_alive = MqttConfig::new()
            .version(MqttVersion::V5)
            .keep_alive(Duration::from_secs(2));
        assert!(check(v5_short_keep_alive).contains("keep-alive"));
    }
}
