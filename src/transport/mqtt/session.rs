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

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::protocol::{AckVerdict, Client, ConnectOptions, Happening, Publication};
use crate::transport::sending::Outcomes;
use crate::transport::Attempt;

/// First pause after a failed connection; doubles up to [`RECONNECT_PAUSE_CAP`].
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
const RECONNECT_PAUSE_CAP: Duration = Duration::from_secs(5);

fn delivered() -> Attempt {
    Attempt::Answered {
        status: 200,
        retry_after: None,
        detail: "PUBACK".into(),
    }
}

/// What the connection thread and the publishers share.
#[derive(Default)]
pub(crate) struct Link {
    /// The client of the current connection, until it fails.
    client: Option<Client>,
    /// Publishes handed to the client that have no packet id yet, oldest first: the request's
    /// outcomes and the publish's slot in them.
    unnumbered: VecDeque<(Arc<Outcomes>, usize)>,
    /// Publishes sent and waiting for their PUBACK, by packet id.
    in_flight: HashMap<u16, (Arc<Outcomes>, usize)>,
    /// The last connection error, for "unreachable" answers while reconnecting.
    last_error: Option<String>,
    /// The largest packet the broker said it takes (MQTT 5 CONNACK), for this connection.
    broker_max_packet: Option<u32>,
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

/// The largest packet the connected broker takes, if it said (MQTT 5).
pub(crate) fn broker_max_packet(link: &Mutex<Link>) -> Option<u32> {
    lock(link).broker_max_packet
}

/// Hands QoS 1 publishes to the current connection, under one lock (the connection thread
/// takes the same lock for every packet id and PUBACK). Each `(index, publication)` is
/// settled in slot `index` of `outcomes` by its PUBACK, or by the connection's failure, or at
/// once if there is no connection.
pub(crate) fn publish_all(
    link: &Mutex<Link>,
    publications: Vec<(usize, Publication)>,
    outcomes: &Arc<Outcomes>,
) {
    let mut link = lock(link);
    for (index, publication) in publications {
        let Some(client) = link.client.as_ref() else {
            let reason = link
                .last_error
                .clone()
                .unwrap_or_else(|| "not connected to the broker".into());
            outcomes.settle(index, Attempt::Unreachable { reason });
            continue;
        };
        // `try_publish`: never block while holding the lock the connection thread needs.
        match client.try_publish(publication) {
            Ok(()) => link.unnumbered.push_back((Arc::clone(outcomes), index)),
            Err(e) => outcomes.settle(
                index,
                Attempt::Unreachable {
                    reason: format!("the MQTT client refused the publish: {e:#}"),
                },
            ),
        }
    }
}

/// The connection thread's body: connects, reads events, answers publishes, and reconnects
/// with a growing pause after an error, until `stop` disconnects.
pub(crate) fn run(options: ConnectOptions, link: SharedLink, stop: Receiver<()>, broker: String) {
    let mut pause = RECONNECT_PAUSE;
    loop {
        // The request channel holds every publish the window allows and what the workers
        // queue behind them, so `try_publish` only fails when the connection is gone.
        let (client, mut connection) = options.connect();
        lock(&link).client = Some(client);
        let reason = loop {
            if !matches!(stop.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                disconnect(&link);
                return;
            }
            match connection.next(&broker) {
                Happening::Connected { broker_max_packet } => {
                    pause = RECONNECT_PAUSE;
                    let mut link = lock(&link);
                    link.last_error = None;
                    link.broker_max_packet = broker_max_packet;
                    log::info!("connected to MQTT broker {broker}");
                }
                Happening::Numbered(pkid) => {
                    let mut link = lock(&link);
                    if let Some(waiting) = link.unnumbered.pop_front() {
                        link.in_flight.insert(pkid, waiting);
                    }
                }
                Happening::Acked { pkid, verdict } => {
                    let acked = lock(&link).in_flight.remove(&pkid);
                    if let Some((outcomes, index)) = acked {
                        outcomes.settle(index, outcome(verdict));
                    }
                }
                Happening::Disconnected | Happening::Ended => return,
                Happening::Other => {}
                Happening::Failed(reason) => break reason,
            }
        };
        log::warn!("{reason}; reconnecting in {pause:?}");
        fail_all(&link, &reason);
        match stop.recv_timeout(pause) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        pause = (pause * 2).min(RECONNECT_PAUSE_CAP);
    }
}

/// The outcome of a publish whose PUBACK came: a refusal for good dead-letters the event, a
/// refusal for now spends an attempt and backs off.
fn outcome(verdict: AckVerdict) -> Attempt {
    match verdict {
        AckVerdict::Accepted => delivered(),
        AckVerdict::Refused(reason) => Attempt::Unsendable { reason },
        AckVerdict::Deferred(reason) => Attempt::Failed { reason },
    }
}

/// Drops the client and answers every waiting publish "unreachable": the outbox keeps them.
fn fail_all(link: &Mutex<Link>, reason: &str) {
    let mut link = lock(link);
    link.client = None;
    link.broker_max_packet = None;
    link.last_error = Some(reason.to_string());
    let link = &mut *link;
    let waiting: Vec<(Arc<Outcomes>, usize)> = link
        .unnumbered
        .drain(..)
        .chain(link.in_flight.drain().map(|(_, t)| t))
        .collect();
    for (outcomes, index) in waiting {
        outcomes.settle(
            index,
            Attempt::Unreachable {
                reason: reason.to_string(),
            },
        );
    }
}

/// Asks the current connection, if any, to disconnect: its event loop then reports the
/// disconnect and the connection thread ends.
pub(crate) fn request_disconnect(link: &Mutex<Link>) {
    if let Some(client) = lock(link).client.take() {
        client.try_disconnect();
    }
}

fn disconnect(link: &Mutex<Link>) {
    if let Some(client) = lock(link).client.take() {
        client.try_disconnect();
    }
    fail_all(link, "the relay is stopping");
}
