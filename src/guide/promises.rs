//! What the outbox promises, and when a receiver sees a duplicate.
//!
//! 1. A committed event is delivered at least once, whatever happens after the commit: the
//!    process is killed, the receiver answers 500 or 429, the network is gone for a week.
//! 2. An event whose transaction rolled back is never delivered, including a transaction a
//!    power loss rolled back: an event is sent only once its commit is on disk.
//! 3. Events that share a partition key arrive in commit order: only the oldest undelivered
//!    event of a key can be claimed. A dead-lettered event stops blocking its key, so one
//!    poison event parks only itself. An event that replaces another by coalescing takes
//!    its own place in the order (the newest), not the replaced event's.
//! 4. An event leaves the pending set only by being delivered, dead-lettered with its last
//!    error kept, replaced by a newer event with the same coalescing key, dropped by a
//!    storage limit when its type is one the user marked `DropOldest`, expired past its
//!    deadline (`expires_in`), or exported to an offline bundle; all but delivery are
//!    counted in [`admin::Stats`](crate::admin::Stats), and none touches an event a relay is
//!    delivering.
//! 5. A receiver sees an event more than once when a relay's lease expires while its
//!    delivery was in flight (it crashed, was paused, or shut down with a request still
//!    hanging); when the answer to a delivered request was lost (a timeout, a reset: the
//!    event is tried again); when a power loss undid the ack of a delivered event; and when
//!    an operator or the app sends it again on purpose (`redeliver`, `retry` of an event the
//!    receiver had in fact stored, a bundle imported twice). Every copy carries the same
//!    event id and source: receivers de-duplicate on them.
