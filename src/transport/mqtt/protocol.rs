//! MQTT 3.1.1 and MQTT 5 behind one face, so that the session's bookkeeping (which publish
//! got which packet id, which PUBACK answers it) is written once.
//!
//! rumqttc has a module per protocol version with look-alike but distinct types; this file
//! is the only place that names them. What differs and matters to the relay:
//! - an MQTT 5 PUBACK carries a reason code, so a broker can refuse one message (not
//!   authorized, quota exceeded) without dropping the connection; MQTT 3.1.1 has none;
//! - an MQTT 5 CONNACK tells the largest packet the broker takes, and its receive maximum,
//!   which rumqttc applies to its in-flight window;
//! - only MQTT 5 has properties (content type, user properties) on a PUBLISH.

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{PubAckReason, PublishProperties};
use rumqttc::{NetworkOptions, Outgoing, QoS, Transport};

/// The MQTT protocol version a destination speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MqttVersion {
    /// MQTT 3.1.1, the default: every broker speaks it.
    #[default]
    V311,
    /// MQTT 5: per-message reason codes in PUBACK, the broker's limits in CONNACK, and
    /// properties, which the binary content mode needs.
    V5,
}

/// What the session needs to build a connection, for either version.
#[derive(Clone)]
pub(crate) struct ConnectOptions {
    pub version: MqttVersion,
    pub client_id: String,
    pub host: String,
    pub port: u16,
    pub keep_alive: Duration,
    pub credentials: Option<(String, String)>,
    pub max_outgoing_packet: usize,
    pub in_flight: u16,
    /// Publishes the request channel holds (in flight or queued behind the window).
    pub queue: usize,
    pub transport: Transport,
}

/// One message to publish with QoS 1; `properties` is only sent under MQTT 5.
pub(crate) struct Publication {
    pub topic: String,
    pub payload: Vec<u8>,
    pub content_type: Option<&'static str>,
    pub user_properties: Vec<(String, String)>,
}

/// The sending half of one connection.
pub(crate) enum Client {
    V311(rumqttc::Client),
    V5(rumqttc::v5::Client),
}

/// The event loop of one connection; only the session thread touches it.
pub(crate) enum Connection {
    // Boxed: event loops are large (about 1 KiB), and there is one per session thread.
    V311(Box<rumqttc::Connection>),
    V5(Box<rumqttc::v5::Connection>),
}

/// What a PUBACK said about its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckVerdict {
    /// Stored by the broker (MQTT 5 codes 0x00 and 0x10, "no matching subscribers").
    Accepted,
    /// Refused for good: publishing it again cannot succeed (not authorized, topic name
    /// invalid, payload format invalid). The text names the code.
    Refused(String),
    /// Refused for now (quota exceeded, unspecified or implementation-specific error,
    /// packet id in use): worth another attempt after a backoff.
    Deferred(String),
}

/// One thing the connection reports, reduced to what the session acts on.
pub(crate) enum Happening {
    /// CONNACK: connected; the broker's largest packet, when it told (MQTT 5).
    Connected { broker_max_packet: Option<u32> },
    /// A publish taken from the request channel got packet id `pkid`.
    Numbered(u16),
    /// The PUBACK of packet id `pkid`.
    Acked { pkid: u16, verdict: AckVerdict },
    /// The disconnect the session asked for went out.
    Disconnected,
    /// The connection failed, with why.
    Failed(String),
    /// The event loop is gone.
    Ended,
    /// Anything else (pings, outgoing acks).
    Other,
}

impl ConnectOptions {
    /// A fresh client and event loop: a new request channel and new state, so nothing of an
    /// earlier connection is replayed.
    pub fn connect(&self) -> (Client, Connection) {
        let capacity = self.queue;
        // Publishes are small and their PUBACK is awaited: Nagle's algorithm would hold them
        // back behind delayed ACKs.
        let mut network = NetworkOptions::new();
        network.set_tcp_nodelay(true);
        match self.version {
            MqttVersion::V311 => {
                let mut options = rumqttc::MqttOptions::new(&self.client_id, &self.host, self.port);
                options
                    .set_keep_alive(self.keep_alive)
                    .set_clean_session(true)
                    .set_inflight(self.in_flight)
                    .set_max_packet_size(64 * 1024, self.max_outgoing_packet)
                    .set_transport(self.transport.clone());
                if let Some((user, password)) = &self.credentials {
                    options.set_credentials(user, password);
                }
                let (client, mut connection) = rumqttc::Client::new(options, capacity);
                connection.eventloop.set_network_options(network);
                (Client::V311(client), Connection::V311(Box::new(connection)))
            }
            MqttVersion::V5 => {
                let mut options =
                    rumqttc::v5::MqttOptions::new(&self.client_id, &self.host, self.port);
                options
                    .set_keep_alive(self.keep_alive)
                    .set_clean_start(true)
                    // The window is the smaller of this and the broker's receive maximum.
                    .set_outgoing_inflight_upper_limit(self.in_flight)
                    .set_max_packet_size(Some(64 * 1024))
                    .set_network_options(network)
                    .set_transport(self.transport.clone());
                if let Some((user, password)) = &self.credentials {
                    options.set_credentials(user, password);
                }
                let (client, connection) = rumqttc::v5::Client::new(options, capacity);
                (Client::V5(client), Connection::V5(Box::new(connection)))
            }
        }
    }
}

impl Client {
    /// Queues a QoS 1 publish without blocking; an error means the connection is gone.
    pub fn try_publish(&self, publication: Publication) -> Result<(), String> {
        let Publication {
            topic,
            payload,
            content_type,
            user_properties,
        } = publication;
        match self {
            Client::V311(client) => client
                .try_publish(topic, QoS::AtLeastOnce, false, payload)
                .map_err(|e| e.to_string()),
            Client::V5(client) => {
                let properties = PublishProperties {
                    content_type: content_type.map(str::to_string),
                    user_properties,
                    ..PublishProperties::default()
                };
                client
                    .try_publish_with_properties(
                        topic,
                        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                        false,
                        payload,
                        properties,
                    )
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Queues a DISCONNECT without blocking.
    pub fn try_disconnect(&self) {
        let _ = match self {
            Client::V311(client) => client.try_disconnect().map_err(|e| e.to_string()),
            Client::V5(client) => client.try_disconnect().map_err(|e| e.to_string()),
        };
    }
}

impl Connection {
    /// Waits for the next thing the connection reports. Blocks in rumqttc's `recv`, which
    /// returns at least once per keep-alive interval (a ping), or on an error.
    pub fn next(&mut self, broker: &str) -> Happening {
        match self {
            Connection::V311(connection) => {
                use rumqttc::{ConnectionError, Event, Packet};
                match connection.recv() {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => Happening::Connected {
                        broker_max_packet: None,
                    },
                    Ok(Ok(Event::Outgoing(outgoing))) => outgoing_happening(outgoing),
                    Ok(Ok(Event::Incoming(Packet::PubAck(ack)))) => Happening::Acked {
                        pkid: ack.pkid,
                        verdict: AckVerdict::Accepted,
                    },
                    Ok(Ok(_)) => Happening::Other,
                    Ok(Err(ConnectionError::ConnectionRefused(code))) => Happening::Failed(
                        format!("MQTT broker {broker} refused the connection: {code:?}"),
                    ),
                    Ok(Err(e)) => Happening::Failed(format!("MQTT broker {broker}: {e:#}")),
                    Err(_) => Happening::Ended,
                }
            }
            Connection::V5(connection) => {
                use rumqttc::v5::mqttbytes::v5::Packet;
                use rumqttc::v5::{ConnectionError, Event};
                match connection.recv() {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => Happening::Connected {
                        broker_max_packet: ack.properties.and_then(|p| p.max_packet_size),
                    },
                    Ok(Ok(Event::Outgoing(outgoing))) => outgoing_happening(outgoing),
                    Ok(Ok(Event::Incoming(Packet::PubAck(ack)))) => {
                        let said = ack.properties.and_then(|p| p.reason_string);
                        Happening::Acked {
                            pkid: ack.pkid,
                            verdict: verdict(ack.reason, said.as_deref()),
                        }
                    }
                    // The broker closing with a reason (server busy, shutting down, …).
                    Ok(Ok(Event::Incoming(Packet::Disconnect(d)))) => Happening::Failed(format!(
                        "MQTT broker {broker} disconnected: {:?}",
                        d.reason_code
                    )),
                    Ok(Ok(_)) => Happening::Other,
                    Ok(Err(ConnectionError::ConnectionRefused(code))) => Happening::Failed(
                        format!("MQTT broker {broker} refused the connection: {code:?}"),
                    ),
                    Ok(Err(e)) => Happening::Failed(format!("MQTT broker {broker}: {e:#}")),
                    Err(_) => Happening::Ended,
                }
            }
        }
    }
}

fn outgoing_happening(outgoing: Outgoing) -> Happening {
    match outgoing {
        // Packet id 0 is QoS 0, which the relay never sends.
        Outgoing::Publish(pkid) if pkid != 0 => Happening::Numbered(pkid),
        Outgoing::Disconnect => Happening::Disconnected,
        _ => Happening::Other,
    }
}

/// What an MQTT 5 PUBACK reason code means for the message (spec §3.4.2.1).
pub(crate) fn verdict(reason: PubAckReason, said: Option<&str>) -> AckVerdict {
    let (code, name) = match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => return AckVerdict::Accepted,
        PubAckReason::UnspecifiedError => (0x80, "unspecified error"),
        PubAckReason::ImplementationSpecificError => (0x83, "implementation-specific error"),
        PubAckReason::NotAuthorized => (0x87, "not authorized"),
        PubAckReason::TopicNameInvalid => (0x90, "topic name invalid"),
        PubAckReason::PacketIdentifierInUse => (0x91, "packet identifier in use"),
        PubAckReason::QuotaExceeded => (0x97, "quota exceeded"),
        PubAckReason::PayloadFormatInvalid => (0x99, "payload format invalid"),
    };
    let mut text = format!("the broker refused the message: {name} (PUBACK reason 0x{code:02X})");
    if let Some(said) = said {
        text.push_str(&format!(": {said}"));
    }
    match reason {
        PubAckReason::NotAuthorized
        | PubAckReason::TopicNameInvalid
        | PubAckReason::PayloadFormatInvalid => AckVerdict::Refused(text),
        _ => AckVerdict::Deferred(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puback_reasons_split_into_accepted_refused_for_good_and_deferred() {
        assert_eq!(verdict(PubAckReason::Success, None), AckVerdict::Accepted);
        assert_eq!(
            verdict(PubAckReason::NoMatchingSubscribers, None),
            AckVerdict::Accepted
        );
        for reason in [
            PubAckReason::NotAuthorized,
            PubAckReason::TopicNameInvalid,
            PubAckReason::PayloadFormatInvalid,
        ] {
            assert!(matches!(verdict(reason, None), AckVerdict::Refused(_)));
        }
        for reason in [
            PubAckReason::QuotaExceeded,
            PubAckReason::UnspecifiedError,
            PubAckReason::ImplementationSpecificError,
            PubAckReason::PacketIdentifierInUse,
        ] {
            assert!(matches!(verdict(reason, None), AckVerdict::Deferred(_)));
        }
        let AckVerdict::Refused(text) = verdict(PubAckReason::NotAuthorized, Some("acl")) else {
            panic!("not authorized is refused for good");
        };
        assert!(
            text.contains("not authorized (PUBACK reason 0x87): acl"),
            "{text}"
        );
    }
}
