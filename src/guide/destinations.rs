//! Destinations: several at once, MQTT brokers, and exactly what goes on the wire.
//!
//! # Several destinations
//!
//! ```no_run
//! use sqlite_outbox::{Destination, Outbox, RelayConfig};
//! # fn main() -> Result<(), sqlite_outbox::Error> {
//! let outbox = Outbox::builder()
//!     .route("order.*", "billing")       // prefix
//!     .route("user.signup", "crm")       // exact
//!     .route("*", "audit")               // everything
//!     .open("app.db")?;
//! let relay = outbox
//!     .relay(
//!         RelayConfig::new()
//!             .destination(
//!                 Destination::http("billing", "https://billing.example.com/hooks")
//!                     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
//!             )
//!             .destination(Destination::http("crm", "https://crm.example.com/in"))
//!             .destination(
//!                 Destination::http("audit", "https://audit.example.com/bulk").batch(100, 1 << 20),
//!             ),
//!     )
//!     .start()?;
//! # drop(relay);
//! # Ok(()) }
//! ```
//!
//! Each (event, destination) pair is its own row with its own attempts and backoff, and each
//! destination has its own workers and in-flight limit: one that is down or slow never holds
//! back another, and a retry to one never re-sends to the others. With routes configured,
//! an event that matches none is refused with [`Error::NoRoute`](crate::Error::NoRoute) rather than kept where
//! nobody delivers it.
//!
//! # Through an HTTP proxy
//!
//! Desktop apps in companies, schools and hospitals reach the internet through a proxy.
//! [`HttpConfig::proxy`](crate::transport::HttpConfig::proxy)`("http://user:password@proxy:3128")`
//! (`outbox relay --proxy URL`) sends every request through it: HTTPS tunnelled with
//! `CONNECT`, plain HTTP to the proxy itself in absolute form (`POST http://host/path`, as
//! a proxy that allows `CONNECT` to port 443 only still expects), the credentials as
//! `Proxy-Authorization: Basic` and never logged; [`HttpConfig::proxy_from_env`](crate::transport::HttpConfig::proxy_from_env)
//! (`--proxy-from-env`) takes the environment's the way curl does (`https_proxy` or
//! `HTTPS_PROXY` for https, `http_proxy` for http, then `all_proxy`; `no_proxy` exempts
//! hosts and their subdomains, addresses, and address ranges such as `127.0.0.0/8` or
//! `fd00::/8`, matched against a destination's address as curl 7.86 and later do, never
//! against a name's). Without either, the environment is ignored: a variable an
//! app did not expect never reroutes its events. A proxy that answers `407`, refuses the
//! tunnel, or answers `502`/`504` for a receiver it cannot reach is the network being down
//! for that destination: no attempt is spent, the destination waits as when unreachable,
//! and one log line a spell names the proxy (without its password).
//!
//! # HTTPS behind a private CA, and client certificates
//!
//! An HTTPS receiver trusted by Mozilla's roots (built in) needs nothing. One whose
//! certificate a private CA issued (a factory floor's, an on-premises gateway's) is reached
//! with [`HttpConfig::ca_pem`](crate::transport::HttpConfig::ca_pem) (those roots instead of
//! the built-in ones; `outbox relay --ca-file FILE`), and one that asks for a client
//! certificate (mutual TLS, a device's identity on many IoT platforms) with
//! [`HttpConfig::client_identity_pem`](crate::transport::HttpConfig::client_identity_pem)
//! (`--client-cert FILE --client-key FILE`); both are checked at start. With the
//! `platform-verifier` feature,
//! [`HttpConfig::platform_roots`](crate::transport::HttpConfig::platform_roots) trusts the
//! operating system's store instead (the roots a company installs on its machines). A TLS failure (a
//! certificate that does not verify, an expired one, a handshake the receiver refuses)
//! comes before the request reaches the receiver: it spends no attempt, and the
//! destination backs off as when it cannot be reached, each event's `last_error` naming
//! the certificate problem. So an expired certificate on the receiving side delays the
//! backlog, and dead-letters none of it.
//!
//! ```no_run
//! use sqlite_outbox::transport::HttpConfig;
//! use sqlite_outbox::{Destination, RelayConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let http = HttpConfig::new()
//!     .ca_pem(std::fs::read("/etc/outbox/site-ca.pem")?)
//!     .client_identity_pem(
//!         std::fs::read("/etc/outbox/device.pem")?,
//!         std::fs::read("/etc/outbox/device.key")?,
//!     );
//! let config = RelayConfig::new()
//!     .destination(Destination::http("gateway", "https://gateway.site.local/in").http_config(http));
//! # drop(config);
//! # Ok(()) }
//! ```
//!
//! # MQTT brokers
//!
//! With the `mqtt` feature (on in the CLI build), a destination can be an MQTT broker:
//!
//! ```no_run
//! # #[cfg(feature = "mqtt")] {
//! use sqlite_outbox::transport::MqttConfig;
//! use sqlite_outbox::{Destination, RelayConfig};
//! let config = RelayConfig::new().destination(
//!     Destination::mqtt("broker", "mqtt://127.0.0.1:1883").mqtt_config(
//!         MqttConfig::new()
//!             .topic("devices/{source}/{type}")
//!             .client_id("device-0042")
//!             .credentials("device-0042", "secret from a file"),
//!     ),
//! );
//! # let _ = config; }
//! ```
//!
//! - Each event is one PUBLISH at QoS 1; the event is delivered when the broker's PUBACK for
//!   *that* publish arrives, and only then. The payload follows the CloudEvents MQTT binding:
//!   by default its structured mode, the same JSON envelope an HTTP receiver gets (under
//!   MQTT 5 with the content type property `application/cloudevents+json; charset=utf-8`);
//!   with `MqttConfig::binary_mode` (MQTT 5 only) the
//!   binary mode: the event's data as the payload, content type `application/json`, and every
//!   other attribute (`id`, `source`, `type`, `subject`, `time`, `partitionkey`, `sequence`) a
//!   user property of that name.
//! - MQTT 3.1.1 by default; `MqttConfig::version`
//!   `(MqttVersion::V5)` for MQTT 5, where a PUBACK carries a reason code: 0x87 (not
//!   authorized), 0x90 (topic name invalid) and 0x99 (payload format invalid) dead-letter the
//!   event with the reason; other codes of 0x80 or more (quota exceeded, unspecified error)
//!   are a failed attempt, retried after a backoff. The broker's receive maximum bounds the
//!   in-flight window, and the maximum packet size in its CONNACK is a limit like
//!   `max_packet_bytes`. With MQTT 3.1.1 a broker that drops a message by ACL or size still
//!   sends a plain PUBACK (Mosquitto does): prefer MQTT 5 where the broker has it.
//! - The topic comes from a template with `{type}`, `{key}`, `{source}`, `{subject}` and
//!   `{destination}`, `outbox/{type}` by default; a template with a wildcard, an empty level
//!   or an unknown placeholder is refused by [`Relay::start`](crate::Relay::start), and an event missing a value
//!   its topic needs is dead-lettered with that reason, unless the placeholder opts in to an
//!   empty level with `?` (`outbox/{type}/{subject?}`). Values lose their outer `/`.
//! - TLS: an `mqtts://` URL (port 8883 by default) checks the broker's certificate against
//!   Mozilla's roots (built in) or `MqttConfig::ca_pem`;
//!   `client_identity_pem` adds a client
//!   certificate for mutual TLS. Certificates and keys are checked at start; a broker whose
//!   certificate does not check out, or that refuses the client's, is offline like an
//!   unreachable one.
//! - The outbox, not the broker, keeps what is not acknowledged: the session is clean, and a
//!   broker that cannot be reached, refuses the connection (wrong credentials) or drops it
//!   is the same destination-wide offline backoff as for HTTP: no attempt spent, every
//!   unacknowledged publish pending again and published again after the reconnect.
//! - Per-key order holds as for HTTP (one event of a key in flight). Each delivery worker
//!   publishes one event, or with [`Destination::batch`](crate::Destination::batch)`(n, …)` `n` back to back, and the
//!   connection keeps at most `workers × n` publishes unacknowledged (the in-flight window,
//!   narrowed further by the broker's receive maximum). A worker does not wait for
//!   PUBACKs: it hands the connection up to sixteen requests, which wait in the client, in
//!   order, until a PUBACK makes room, so the window never idles while a worker wakes up;
//!   the connection thread that takes a request's last PUBACK reports its outcome to the
//!   relay, and a publish unanswered within the ack timeout counts as a failed attempt.
//!   Each event keeps its own outcome (an oversize one is dead-lettered alone). Mosquitto sends its
//!   PUBACKs with Nagle's algorithm on unless `set_tcp_nodelay true` is in its config; a
//!   publisher that awaits a batch's PUBACKs then stalls on TCP's delayed ACK (about 40 ms
//!   per batch, measured), so set it.
//! - An event whose PUBLISH would exceed `MqttConfig::max_packet_bytes` (256 KiB by
//!   default) or the broker's announced maximum is dead-lettered with its size.
//!
//! For AWS IoT Core: `mqtts://<prefix>-ats.iot.<region>.amazonaws.com:8883`, the CA
//! `AmazonRootCA1.pem`, the thing's certificate and key, a client id the policy allows (the
//! thing name), MQTT 5 or 3.1.1, a payload under 128 KB, and at most 100 messages in flight
//! (`workers × batch`). On port 443 add `.alpn("x-amzn-mqtt-ca")`. For EMQX or HiveMQ: user
//! name and password, or a client certificate, and MQTT 5 so that an ACL refusal is seen.
//!
//! `cli/tests/mqtt.rs`, `cli/tests/mqtt5.rs` and `cli/tests/mqtt_tls.rs` run each of these against a
//! real Mosquitto broker started by the test (the TLS ones with certificates made at test
//! time). A structured message as a subscriber receives it, on topic
//! `devices/sqlite-outbox/reading.taken`:
//!
//! ```text
//! {"data":{"i":0},"datacontenttype":"application/json",
//!  "id":"01a22d25-ad71-74ae-a341-a4bb8d30e424","partitionkey":"k0",
//!  "sequence":"00000000000000000001","source":"/sqlite-outbox","specversion":"1.0",
//!  "time":"2026-11-30T15:49:33.681Z","type":"reading.taken"}
//! ```
//!
//! The same kind of event in binary mode under MQTT 5 (topic template `binary/{key}`):
//!
//! ```text
//! topic          binary/room-1
//! content type   application/json
//! user props     specversion=1.0, id=01a22d6a-05bc-778c-95fc-eb756351b343,
//!                source=/sqlite-outbox, type=reading.taken, subject=sensor-7,
//!                time=2026-11-30T17:04:12.732Z, partitionkey=room-1,
//!                sequence=00000000000000000002
//! payload        {"celsius":21.5}
//! ```
//!
//! # What goes on the wire
//!
//! One CloudEvents 1.0 request per event (structured mode), or per batch when a destination
//! opts in (batched mode), signed per [Standard Webhooks](https://www.standardwebhooks.com/):
//!
//! ```text
//! POST /events HTTP/1.1
//! content-type: application/cloudevents+json
//! idempotency-key: "01a22a8a-741d-7166-b7d9-db961a986ef3"
//! user-agent: sqlite-outbox/0.2.0
//! webhook-id: 01a22a8a-741d-7166-b7d9-db961a986ef3
//! webhook-signature: v1,h++f0qd4XlLeL4Ao60IgJYfJVYeiACjARsoLKb2HOBA=
//! webhook-timestamp: 1796010046
//!
//! {"specversion":"1.0","id":"01a22a8a-741d-7166-b7d9-db961a986ef3","source":"/shop/eu-1","type":"order.created","subject":"orders/42","time":"2026-11-30T03:40:46.493Z","datacontenttype":"application/json","partitionkey":"customer-7","sequence":"00000000000000000001","data":{"order_id":42,"total_cents":1999}}
//! ```
//!
//! - `id` is the event id; `partitionkey` and `sequence` (commit order, zero-padded so it
//!   sorts as a string) appear on events with a partition key. `sequence` strictly
//!   increases for the life of the file, whatever is pruned, purged or replaced; `source` is
//!   fixed when the event is enqueued, so every relay sends one id under one source.
//! - `webhook-timestamp` is the time of *this* attempt: a retry days later is signed afresh.
//!   `webhook-signature` carries one `v1,` entry per secret, so secrets rotate without a
//!   gap, and a `v1a,` entry (Ed25519, Standard Webhooks' asymmetric scheme) when the
//!   destination has a device key ([`Destination::signing_key`](crate::Destination::signing_key)). Secrets and private keys
//!   never appear in logs, `Debug` output or errors.
//! - `outbox-source` names the events' `source` (percent-encoded where it is not visible
//!   ASCII): a request never mixes sources, so a receiver picks the keys that may sign for
//!   that source before it reads the body.
//! - A batch (`application/cloudevents-batch+json`, a JSON array of at most N events and M
//!   bytes) is delivered or retried as a whole. Its `webhook-id` (`batch_…`) is derived from
//!   the events it holds: the same batch sent again carries the same id, but a batch formed
//!   anew (after a lease expired, say) may group the events differently and gets another
//!   one. Receivers de-duplicate batched events by each event's own `id`.
//! - Events written with trace context carry the CloudEvents Distributed Tracing attributes
//!   `traceparent` and `tracestate`, and `dataschema` when set; the request then has a W3C
//!   `traceparent` header of the same trace (see [Tracing](crate::guide::tracing)).
//! - Binary content mode ([`HttpConfig::binary_mode`](crate::transport::HttpConfig::binary_mode)):
//!   the data is the body and every attribute a `ce-` header (`ce-id`, `ce-traceparent`, …,
//!   percent-encoded as the HTTP binding asks), one event per request. The signature covers
//!   the body only, so `outbox ingest` takes structured and batched mode.
//! - Every event carries its stream number: `outboxstream` (the destination's name on the
//!   device) and `outboxseq` (an integer, gapless from 1 per destination and source, given
//!   when its transaction committed; MQTT messages and bundles carry them too). See
//!   [Nothing silently missing](crate::guide::fleet).
//! - Now and then the relay sends a stream's accounting: a CloudEvent of type
//!   `dev.sqlite-outbox.accounting` ([`wire::ACCOUNTING_TYPE`](crate::wire::ACCOUNTING_TYPE),
//!   data [`wire::StreamAccount`](crate::wire::StreamAccount)), signed like any event, to an
//!   HTTP destination whose receiver said it takes them (an `outbox-accounting: 1` header
//!   on a 2xx answer, [`wire::ACCOUNTING_HEADER`](crate::wire::ACCOUNTING_HEADER), which
//!   `outbox ingest` sends): a generic receiver gets only the app's events.
//!   [`Destination::accounting`](crate::Destination::accounting)`(true)` (`relay
//!   --accounting`) tells it from the start, `(false)` (`relay --no-accounting`) never.
//! - With [`Destination::receipt_key`](crate::Destination::receipt_key) a 2xx counts only
//!   with an `outbox-receipt` header signed by the receiver ([`wire::Receipt`](crate::wire::Receipt)).
//! - The official CloudEvents Rust SDK parses every request the relay sends (a test checks
//!   it). [`wire`](crate::wire) builds the same bodies for other code.
