//! Bytes on the wire, per thread: what a data budget counts (see `relay::spending`).
//!
//! The HTTP transport's own TCP connections count every byte they write and read (TLS
//! records and handshakes included: TLS runs over them, and a proxy's CONNECT too); ureq
//! does all of a request's I/O on the thread that sends it (the connection, its handshake,
//! the request and the answer), so the difference across one request is what the network
//! carried for it. A transport whose connection writes on a thread of its own (MQTT) counts
//! here, on the sending thread, what it hands that connection.

use std::cell::Cell;

thread_local! {
    static WIRE_BYTES_HERE: Cell<u64> = const { Cell::new(0) };
}

/// How many bytes the calling thread has put on the network (or handed to a connection
/// that will) so far.
pub(crate) fn wire_bytes_here() -> u64 {
    WIRE_BYTES_HERE.with(Cell::get)
}

/// Counts `n` bytes the calling thread put on the network.
pub(crate) fn count_wire_bytes(n: usize) {
    WIRE_BYTES_HERE.with(|c| c.set(c.get().wrapping_add(n as u64)));
}
