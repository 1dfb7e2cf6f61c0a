//! One MQTT connection at a time, driven by a thread the transport owns, and how a publish
//! learns that the broker acknowledged *it*.
//!
//! rumqttc's `publish` returns no packet id. Its event loop assigns one when it takes the
//! request from its channel and reports it as `Outgoing::Publish(pkid)`, in channel order;
//! the broker's `PubAck(pkid)` comes later. So every publish is handed to the client under one
//! lock together with a push onto a FIFO of waiting senders: the connection thread pops the
//! FIFO on each `Outgoing::Publish` and files the sender under its pkid, and the PUBACK
//! answers it.
//!
//! The outbox, not the broker, keeps what is not acknowledged: the session is clean, and on
//! any connection error every waiting publish is answered "unreachable" (no attempt spent,
//! the destination backs off, the events stay pending) and the client is replaced by a fresh
//! one, so nothing rumqttc kept is ever replayed behind the relay's back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rumqttc::{Client, ConnectionError, Event, MqttOptions, Outgoing, Packet, QoS};

use crate::transport::Attempt;

/// First pause after a failed connection; doubles up to [`RECONNECT_PAUSE_CAP`].
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
const RECONNECT_PAUSE_CAP: Duration = Duration::from_secs(5);

/// What the connection thread and the publishers share.
#[derive(Default)]
pub(crate) struct Link {
    /// The client of the current connection, until it fails.
    client: Option<Client>,
    /// Publishes handed to the client that have no packet id yet, oldest first.
    unnumbered: VecDeque<Sender<Attempt>>,
    /// Publishes sent and waiting for their PUBACK, by packet id.
    in_flight: HashMap<u16, Sender<Attempt>>,
    /// The last connection error, for "unreachable" answers while reconnecting.
    last_error: Option<String>,
}

pub(crate) type SharedLink = Arc<Mutex<Link>>;

pub(crate) fn lock(link: &Mutex<Link>) -> MutexGuard<'_, Link> {
    lock_ok(link)
}

/// Locks `mutex`, also after a panic elsewhere poisoned it (the data stays consistent:
/// every change under these locks is a single push, pop or take).
pub(crate) fn lock_ok<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Hands one QoS 1 publish to the current connection; the answer comes on the returned
/// channel (delivered on PUBACK, unreachable on a connection error).
pub(crate) fn publish(
    link: &Mutex<Link>,
    topic: String,
    payload: Vec<u8>,
) -> std::result::Result<Receiver<Attempt>, Attempt> {
    let mut link = lock(link);
    let Some(client) = link.client.as_ref() else {
        let reason = link
            .last_error
            .clone()
            .unwrap_or_else(|| "not connected to the broker".into());
        return Err(Attempt::Unreachable { reason });
    };
    let (tx, rx) = crossbeam_channel::bounded(1);
    // `try_publish`: never block while holding the lock the connection thread needs.
    if let Err(e) = client.try_publish(topic, QoS::AtLeastOnce, false, payload) {
        return Err(Attempt::Unreachable {
            reason: format!("the MQTT client refused the publish: {e}"),
        });
    }
    link.unnumbered.push_back(tx);
    Ok(rx)
}

/// The connection thread's body: connects, reads events, answers publishes, and reconnects
/// with a growing pause after an error, until `stop` disconnects.
pub(crate) fn run(options: MqttOptions, link: SharedLink, stop: Receiver<()>, broker: String) {
    let mut pause = RECONNECT_PAUSE;
    loop {
        let (client, mut connection) = Client::new(options.clone(), 64);
        lock(&link).client = Some(client);
        let error = loop {
            if !matches!(stop.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                disconnect(&link);
                return;
            }
            match connection.recv() {
                Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                    pause = RECONNECT_PAUSE;
                    lock(&link).last_error = None;
                    log::info!("connected to MQTT broker {broker}");
                }
                Ok(Ok(Event::Outgoing(Outgoing::Publish(pkid)))) if pkid != 0 => {
                    let mut link = lock(&link);
                    if let Some(waiting) = link.unnumbered.pop_front() {
                        link.in_flight.insert(pkid, waiting);
                    }
                }
                Ok(Ok(Event::Incoming(Packet::PubAck(ack)))) => {
                    if let Some(waiting) = lock(&link).in_flight.remove(&ack.pkid) {
                        let _ = waiting.send(Attempt::Answered {
                            status: 200,
                            retry_after: None,
                            detail: "PUBACK".into(),
                        });
                    }
                }
                Ok(Ok(Event::Outgoing(Outgoing::Disconnect))) => return,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => break e,
                // The event loop is gone: nothing more will come.
                Err(_) => return,
            }
        };
        let reason = describe(&error, &broker);
        log::warn!("{reason}; reconnecting in {pause:?}");
        fail_all(&link, &reason);
        match stop.recv_timeout(pause) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        pause = (pause * 2).min(RECONNECT_PAUSE_CAP);
    }
}

/// Drops the client and answers every waiting publish "unreachable": the outbox keeps them.
fn fail_all(link: &Mutex<Link>, reason: &str) {
    let mut link = lock(link);
    link.client = None;
    link.last_error = Some(reason.to_string());
    let link = &mut *link;
    let waiting: Vec<Sender<Attempt>> = link
        .unnumbered
        .drain(..)
        .chain(link.in_flight.drain().map(|(_, w)| w))
        .collect();
    for w in waiting {
        let _ = w.send(Attempt::Unreachable {
            reason: reason.to_string(),
        });
    }
}

/// Asks the current connection, if any, to disconnect: its event loop then reports the
/// disconnect and the connection thread ends.
pub(crate) fn request_disconnect(link: &Mutex<Link>) {
    if let Some(client) = lock(link).client.take() {
        let _ = client.try_disconnect();
    }
}

fn disconnect(link: &Mutex<Link>) {
    if let Some(client) = lock(link).client.take() {
        let _ = client.try_disconnect();
    }
    fail_all(link, "the relay is stopping");
}

fn describe(error: &ConnectionError, broker: &str) -> String {
    match error {
        ConnectionError::ConnectionRefused(code) => {
            format!("MQTT broker {broker} refused the connection: {code:?}")
        }
        other => format!("MQTT broker {broker}: {other}"),
    }
}
