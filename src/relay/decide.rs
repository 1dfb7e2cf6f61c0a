//! What an attempt means: one pure function from what came of a request to what happens to
//! the event's row and to its destination's gate.
//!
//! Every row of the "How the relay behaves" table in the crate docs is decided here, and
//! each has its own test below. The function reads no clock and draws no random number: the
//! time and the jittered backoff come in as arguments, so a test can pin both.

use std::time::Duration;

use crate::relay::backoff::Backoff;
use crate::relay::config::RelayConfig;
use crate::store::queue::WriteBack;
use crate::transport::{Attempt, OutboundEvent};

/// What became of one request, as far as the decision cares.
#[derive(Debug)]
pub(crate) enum Tried<'a> {
    /// The transport made the attempt and reported this.
    Attempted(&'a Attempt),
    /// It was not sent: the gate was closed, too much of the lease had passed, or the relay
    /// is stopping.
    Skipped,
    /// The transport panicked with this message.
    Panicked(&'a str),
}

/// The relay settings a decision depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    retry: Backoff,
    max_attempts: i64,
    retry_after_cap: Duration,
    dead_letter_client_errors: bool,
}

impl Policy {
    pub fn new(config: &RelayConfig) -> Policy {
        Policy {
            retry: config.retry,
            max_attempts: i64::from(config.max_attempts),
            retry_after_cap: config.retry_after_cap,
            dead_letter_client_errors: config.dead_letter_client_errors,
        }
    }

    /// Draws the backoff of one request (full jitter over the ceiling of its most-tried
    /// event), once for all its events, so the events of a failed batch come back together.
    pub fn draw_backoff(&self, events: &[OutboundEvent]) -> Duration {
        let attempt = events.iter().map(|e| e.attempts).max().unwrap_or(0) + 1;
        self.retry
            .full_jitter(u32::try_from(attempt).unwrap_or(u32::MAX))
    }
}

/// How the destination's gate changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GateChange {
    /// Nothing learned about the destination.
    Unchanged,
    /// The receiver answered: it is reachable; any offline backoff ends.
    Answered,
    /// No answer: back off the whole destination.
    Unreachable,
    /// The receiver answered 429: send it nothing for this long (measured on `Instant`).
    Pause { pause: Duration },
    /// The receiver answered 410: disable the destination (persisted) for this reason.
    Disable { reason: String },
    /// The receiver answered that its own backend is down (see [`is_sick`]) before the
    /// destination was judged down: the gate counts it towards that judgement, and waits
    /// out a `Retry-After` destination-wide only if this answer judged it down. Before
    /// that the `Retry-After` is the event's alone (its retry waits it out): one poison
    /// event answered 503 must not hold back every other.
    Sick { retry_after: Option<Duration> },
    /// Such an answer while the destination is judged down: back off the whole destination
    /// as when it cannot be reached, for at least the `Retry-After`.
    Down { retry_after: Option<Duration> },
}

/// Whether an answer says the receiver's own backend is down rather than anything about
/// the event: 502, 503 or 504 (a gateway with no healthy upstream, a store restarting), or
/// 429 with `Retry-After`. Three in a row for three different events judge the destination
/// down (see [`Gate`](crate::relay::gate::Gate)); from then on they spend no attempt.
pub(crate) fn is_sick(attempt: &Attempt) -> bool {
    matches!(
        attempt,
        Attempt::Answered {
            status: 502..=504,
            ..
        } | Attempt::Answered {
            status: 429,
            retry_after: Some(_),
            ..
        }
    )
}

/// Statuses by which a receiver refuses who sends, not what is sent: 401.
fn refuses_credentials(status: u16) -> bool {
    status == 401
}

/// What to do about one event after one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// What to record in the event's row.
    pub write_back: WriteBack,
    /// What the answer tells about the destination (the same for every event of a request).
    pub gate: GateChange,
    /// Whether the event goes out again at once in a smaller request (its batch was refused
    /// as a whole, perhaps for another event's sake), nothing recorded. If it cannot,
    /// `write_back` hands it back without spending an attempt.
    pub split: bool,
}

/// What a decision knows of the request beyond its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Context {
    /// The destination was judged down (its backend, by three sick answers in a row for
    /// different events) before this answer: a sick answer then spends no attempt, as no
    /// answer does not.
    pub down: bool,
    /// The request carried more than one event (a batch).
    pub batch: bool,
}

/// Statuses by which a receiver refuses a request for what it holds (a malformed or
/// oversized event, one its store cannot take): a batch refused so is split and sent again,
/// so that only the events refused alone are dead-lettered.
fn refuses_content(status: u16) -> bool {
    matches!(status, 400 | 413 | 422)
}

/// Decides what `tried` means for an event that had `attempts` answered attempts before it,
/// at `now` (unix ms), given `backoff` drawn for this request and the request's `context`.
pub(crate) fn decide(
    tried: &Tried<'_>,
    attempts: i64,
    backoff: Duration,
    policy: &Policy,
    now: i64,
    context: Context,
) -> Decision {
    let down = context.down;
    // An attempt that the receiver failed: spend it, and try again later unless it was the
    // last one allowed.
    let retry_or_dead = |error: String, retry_after: Option<Duration>| {
        let attempts = attempts.saturating_add(1);
        if attempts >= policy.max_attempts {
            return WriteBack::Dead {
                error: format!("{error:#} (gave up after {attempts} attempts)"),
            };
        }
        let asked = retry_after.map(|d| d.min(policy.retry_after_cap));
        let wait = asked.map_or(backoff, |a| a.max(backoff));
        WriteBack::Retry {
            available_at: now.saturating_add(millis(wait)),
            error,
        }
    };
    let (write_back, gate) = match tried {
        Tried::Skipped => (
            WriteBack::Release {
                error: None,
                available_at: None,
            },
            GateChange::Unchanged,
        ),
        Tried::Panicked(msg) => (
            retry_or_dead(format!("transport panicked: {msg}"), None),
            GateChange::Unchanged,
        ),
        // Moved behind the other due events (available_at = now), so the next probe of the
        // destination is another event: no single event is the probe forever.
        Tried::Attempted(Attempt::Unreachable { reason }) => (
            WriteBack::Release {
                error: Some(format!("unreachable: {reason}")),
                available_at: Some(now),
            },
            GateChange::Unreachable,
        ),
        // The receiver was reached, so the destination is up; the event may be what it
        // chokes on (a poison event), so it spends an attempt and backs off on its own.
        Tried::Attempted(Attempt::Failed { reason }) => (
            retry_or_dead(format!("no valid answer: {reason}"), None),
            GateChange::Answered,
        ),
        Tried::Attempted(Attempt::Unsendable { reason }) => (
            WriteBack::Dead {
                error: reason.clone(),
            },
            GateChange::Unchanged,
        ),
        // The receiver's backend is down and the destination judged so: the event waits
        // without spending an attempt, moved behind the other due events as for no answer.
        Tried::Attempted(
            attempt @ Attempt::Answered {
                retry_after,
                detail,
                ..
            },
        ) if down && is_sick(attempt) => (
            WriteBack::Release {
                error: Some(format!("{detail} (destination down: no attempt spent)")),
                available_at: Some(now),
            },
            GateChange::Down {
                retry_after: retry_after.map(|d| d.min(policy.retry_after_cap)),
            },
        ),
        Tried::Attempted(
            attempt @ Attempt::Answered {
                status,
                retry_after,
                detail,
            },
        ) if is_sick(attempt) => {
            let asked = retry_after.map(|d| d.min(policy.retry_after_cap));
            let gate = match (status, asked) {
                // A throttle is about the sender: the whole destination waits it out.
                (429, Some(pause)) => GateChange::Pause { pause },
                _ => GateChange::Sick { retry_after: asked },
            };
            (retry_or_dead(detail.clone(), *retry_after), gate)
        }
        // A 401 refuses the relay's credentials (a key not provisioned yet, revoked, a
        // signature out of the receiver's time window, or a receiver that cannot read its
        // key store), not the event: every event would get the same answer, and
        // dead-lettering them all would turn a provisioning mistake or the receiver's
        // outage into lost work. The destination waits as when it cannot be reached (a
        // growing backoff, probed by one event at a time) and no attempt is spent. A 403
        // says this request may not be done, which can be the event's own (`outbox
        // ingest` answers 403 to an event of another source than the key's): it stays a
        // client error.
        Tried::Attempted(Attempt::Answered { status, detail, .. })
            if refuses_credentials(*status) =>
        {
            (
                WriteBack::Release {
                    error: Some(format!(
                        "{detail}: the destination refuses the relay's credentials (no \
                         attempt spent; it is retried as when unreachable)"
                    )),
                    available_at: Some(now),
                },
                GateChange::Unreachable,
            )
        }
        // A batch refused for what it holds: split, nothing spent (see `refuses_content`).
        Tried::Attempted(Attempt::Answered { status, detail, .. })
            if context.batch && refuses_content(*status) =>
        {
            let decision = Decision {
                write_back: WriteBack::Release {
                    error: Some(format!("{detail} (to a batch: split and sent again)")),
                    available_at: None,
                },
                gate: GateChange::Answered,
                split: true,
            };
            return decision;
        }
        Tried::Attempted(Attempt::Answered {
            status,
            retry_after,
            detail,
        }) => {
            let write_back = match *status {
                200..=299 => WriteBack::Delivered,
                // The destination is disabled; its events wait without spending attempts.
                410 => WriteBack::Release {
                    error: Some(detail.clone()),
                    available_at: None,
                },
                408 | 429 | 500..=599 => retry_or_dead(detail.clone(), *retry_after),
                400..=499 if policy.dead_letter_client_errors => WriteBack::Dead {
                    error: detail.clone(),
                },
                _ => retry_or_dead(detail.clone(), *retry_after),
            };
            let gate = match *status {
                // Throttled: this destination waits; the others go on.
                429 => GateChange::Pause {
                    pause: retry_after.map_or(policy.retry.base, |d| d.min(policy.retry_after_cap)),
                },
                410 => GateChange::Disable {
                    reason: format!("disabled after {detail}"),
                },
                _ => GateChange::Answered,
            };
            (write_back, gate)
        }
    };
    // An event is dead-lettered only by an answer about it alone: a batch's failure may be
    // one poison event's doing (a 5xx, a timeout or a reset it causes, data that cannot
    // be encoded, a 4xx), so where a batch's answer would leave an event dead it is split
    // and sent again instead, spending nothing more; its last attempt is a request of its
    // own (or a half that is delivered).
    if context.batch {
        if let WriteBack::Dead { error } = &write_back {
            return Decision {
                write_back: WriteBack::Release {
                    error: Some(format!("{error:#} (to a batch: split and sent again)")),
                    available_at: None,
                },
                gate,
                split: true,
            };
        }
    }
    Decision {
        write_back,
        gate,
        split: false,
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;
    const BACKOFF: Duration = Duration::from_millis(700);
    /// The destination not judged down, one event a request.
    const UP: Context = Context {
        down: false,
        batch: false,
    };

    fn policy() -> Policy {
        Policy {
            retry: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(300),
            },
            max_attempts: 25,
            retry_after_cap: Duration::from_secs(3600),
            dead_letter_client_errors: true,
        }
    }

    fn answered(status: u16, retry_after: Option<Duration>) -> Attempt {
        Attempt::Answered {
            status,
            retry_after,
            detail: format!("HTTP {status}"),
        }
    }

    fn decide_answer(status: u16, retry_after: Option<Duration>, attempts: i64) -> Decision {
        let attempt = answered(status, retry_after);
        decide(
            &Tried::Attempted(&attempt),
            attempts,
            BACKOFF,
            &policy(),
            NOW,
            UP,
        )
    }

    fn retry_at(ms_from_now: i64, status: u16) -> WriteBack {
        WriteBack::Retry {
            available_at: NOW + ms_from_now,
            error: format!("HTTP {status}"),
        }
    }

    #[test]
    fn a_2xx_is_delivered_and_opens_the_gate() {
        for status in [200, 202, 204, 299] {
            let d = decide_answer(status, None, 3);
            assert_eq!(d.write_back, WriteBack::Delivered);
            assert_eq!(d.gate, GateChange::Answered);
        }
    }

    #[test]
    fn a_5xx_or_408_is_retried_after_the_drawn_backoff() {
        for status in [500, 502, 503, 599, 408] {
            let d = decide_answer(status, None, 0);
            assert_eq!(d.write_back, retry_at(700, status));
            let gate = if (502..=504).contains(&status) {
                GateChange::Sick { retry_after: None }
            } else {
                GateChange::Answered
            };
            assert_eq!(d.gate, gate, "{status}");
        }
    }

    fn decide_when_down(status: u16, retry_after: Option<Duration>, attempts: i64) -> Decision {
        let attempt = answered(status, retry_after);
        decide(
            &Tried::Attempted(&attempt),
            attempts,
            BACKOFF,
            &policy(),
            NOW,
            Context {
                down: true,
                batch: false,
            },
        )
    }

    #[test]
    fn a_sick_answer_before_the_destination_is_judged_down_spends_an_attempt() {
        // The answers that lead to the judgement count, as any failed attempt does: a
        // receiver that is down for one event only (a poison event answered 503) still
        // dead-letters that event at its last attempt.
        for status in [502, 503, 504] {
            let d = decide_answer(status, None, 24);
            assert!(matches!(d.write_back, WriteBack::Dead { .. }), "{status}");
            assert_eq!(d.gate, GateChange::Sick { retry_after: None });
        }
        let d = decide_answer(429, Some(Duration::from_secs(30)), 0);
        assert_eq!(d.write_back, retry_at(30_000, 429));
        assert_eq!(
            d.gate,
            GateChange::Pause {
                pause: Duration::from_secs(30)
            },
            "a throttle pauses the destination"
        );
        let d = decide_answer(503, Some(Duration::from_secs(30)), 0);
        assert_eq!(
            d.gate,
            GateChange::Sick {
                retry_after: Some(Duration::from_secs(30))
            },
            "the gate waits it out destination-wide only once the destination is judged down"
        );
    }

    #[test]
    fn a_sick_answer_once_the_destination_is_judged_down_spends_nothing() {
        for status in [502, 503, 504] {
            let d = decide_when_down(status, None, 24);
            assert_eq!(
                d.write_back,
                WriteBack::Release {
                    error: Some(format!(
                        "HTTP {status} (destination down: no attempt spent)"
                    )),
                    available_at: Some(NOW),
                },
                "even at the last attempt, nothing is dead-lettered"
            );
            assert_eq!(d.gate, GateChange::Down { retry_after: None });
        }
        // Retry-After is honoured destination-wide, capped.
        let d = decide_when_down(503, Some(Duration::from_secs(86_400)), 0);
        assert_eq!(
            d.gate,
            GateChange::Down {
                retry_after: Some(Duration::from_secs(3600))
            }
        );
        let d = decide_when_down(429, Some(Duration::from_secs(5)), 3);
        assert!(matches!(d.write_back, WriteBack::Release { .. }));
    }

    #[test]
    fn answers_about_the_event_spend_attempts_even_while_the_destination_is_down() {
        // A 500 or a 4xx is about the event; a 2xx is delivered; a 429 without Retry-After
        // is a pause.
        assert_eq!(
            decide_when_down(500, None, 0).write_back,
            retry_at(700, 500)
        );
        assert_eq!(
            decide_when_down(200, None, 0).write_back,
            WriteBack::Delivered
        );
        assert!(matches!(
            decide_when_down(422, None, 0).write_back,
            WriteBack::Dead { .. }
        ));
        assert_eq!(
            decide_when_down(429, None, 0).write_back,
            retry_at(700, 429)
        );
        assert!(!is_sick(&answered(500, Some(Duration::from_secs(1)))));
        assert!(!is_sick(&answered(429, None)));
        assert!(is_sick(&answered(503, None)));
    }

    #[test]
    fn a_later_retry_after_wins_over_the_backoff_and_is_capped() {
        let d = decide_answer(503, Some(Duration::from_secs(5)), 0);
        assert_eq!(d.write_back, retry_at(5_000, 503));
        let d = decide_answer(503, Some(Duration::from_millis(10)), 0);
        assert_eq!(d.write_back, retry_at(700, 503), "an earlier one does not");
        let d = decide_answer(503, Some(Duration::from_secs(86_400)), 0);
        assert_eq!(d.write_back, retry_at(3_600_000, 503), "capped at 1 h");
    }

    #[test]
    fn a_429_retries_the_event_and_pauses_only_its_destination() {
        // With Retry-After it is a sick answer (see below), counted towards judging the
        // destination down and waited out destination-wide.
        let d = decide_answer(429, None, 0);
        assert_eq!(
            d.gate,
            GateChange::Pause {
                pause: Duration::from_secs(1)
            },
            "without Retry-After, the retry base"
        );
    }

    #[test]
    fn the_last_allowed_attempt_dead_letters_with_the_count() {
        let d = decide_answer(500, None, 24);
        assert_eq!(
            d.write_back,
            WriteBack::Dead {
                error: "HTTP 500 (gave up after 25 attempts)".into()
            }
        );
    }

    #[test]
    fn a_401_spends_nothing_and_backs_off_the_destination() {
        for status in [401] {
            for (attempts, context) in [
                (0, UP),
                (24, UP),
                (
                    3,
                    Context {
                        down: false,
                        batch: true,
                    },
                ),
            ] {
                let attempt = answered(status, None);
                let d = decide(
                    &Tried::Attempted(&attempt),
                    attempts,
                    BACKOFF,
                    &policy(),
                    NOW,
                    context,
                );
                assert_eq!(d.gate, GateChange::Unreachable, "{status}");
                assert!(!d.split);
                match d.write_back {
                    WriteBack::Release {
                        error: Some(error),
                        available_at: Some(NOW),
                    } => {
                        assert!(error.contains("credentials"), "{error:#}")
                    }
                    other => panic!("{status}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn other_4xx_dead_letter_at_once_unless_configured_to_retry() {
        for status in [400, 403, 404, 422] {
            let d = decide_answer(status, None, 0);
            assert_eq!(
                d.write_back,
                WriteBack::Dead {
                    error: format!("HTTP {status}")
                }
            );
        }
        let lenient = Policy {
            dead_letter_client_errors: false,
            ..policy()
        };
        let attempt = answered(404, None);
        let d = decide(&Tried::Attempted(&attempt), 0, BACKOFF, &lenient, NOW, UP);
        assert_eq!(d.write_back, retry_at(700, 404));
    }

    #[test]
    fn a_batch_refused_for_its_content_is_split_with_nothing_spent() {
        for status in [400, 413, 422] {
            let attempt = answered(status, None);
            let batch = Context {
                down: false,
                batch: true,
            };
            let d = decide(
                &Tried::Attempted(&attempt),
                24,
                BACKOFF,
                &policy(),
                NOW,
                batch,
            );
            assert!(d.split, "{status}");
            assert!(
                matches!(d.write_back, WriteBack::Release { .. }),
                "no attempt spent: {:?}",
                d.write_back
            );
            // The same answer to one event alone dead-letters it, with the reason.
            let d = decide_answer(status, None, 0);
            assert!(!d.split);
            assert_eq!(
                d.write_back,
                WriteBack::Dead {
                    error: format!("HTTP {status}")
                }
            );
        }
    }

    #[test]
    fn no_answer_to_a_batch_dead_letters_its_events_it_splits_them_instead() {
        let batch = Context {
            down: false,
            batch: true,
        };
        let timeout = Attempt::Failed {
            reason: "timed out".into(),
        };
        let unencodable = Attempt::Unsendable {
            reason: "stored data is not valid JSON".into(),
        };
        let cases = [
            (answered(500, None), 24),
            (answered(404, None), 0),
            (answered(400, None), 3),
            (timeout.clone(), 24),
            (unencodable.clone(), 0),
        ];
        for (attempt, attempts) in &cases {
            let d = decide(
                &Tried::Attempted(attempt),
                *attempts,
                BACKOFF,
                &policy(),
                NOW,
                batch,
            );
            assert!(d.split, "{attempt:?} at {attempts}");
            assert!(
                matches!(d.write_back, WriteBack::Release { .. }),
                "{attempt:?}"
            );
            // Alone, the same answer is the event's verdict.
            let d = decide(
                &Tried::Attempted(attempt),
                *attempts,
                BACKOFF,
                &policy(),
                NOW,
                UP,
            );
            assert!(!d.split);
            assert!(
                matches!(d.write_back, WriteBack::Dead { .. }),
                "{attempt:?}"
            );
        }
        // Before the last attempt a batch's failure is spent by each event as usual.
        let d = decide(
            &Tried::Attempted(&timeout),
            3,
            BACKOFF,
            &policy(),
            NOW,
            batch,
        );
        assert!(!d.split);
        assert!(matches!(d.write_back, WriteBack::Retry { .. }));
    }

    #[test]
    fn a_410_disables_the_destination_and_spends_no_attempt() {
        let d = decide_answer(410, None, 2);
        assert_eq!(
            d.write_back,
            WriteBack::Release {
                error: Some("HTTP 410".into()),
                available_at: None,
            }
        );
        assert_eq!(
            d.gate,
            GateChange::Disable {
                reason: "disabled after HTTP 410".into()
            }
        );
    }

    #[test]
    fn other_statuses_are_retried() {
        for status in [100, 301, 304] {
            assert_eq!(
                decide_answer(status, None, 0).write_back,
                retry_at(700, status)
            );
        }
    }

    #[test]
    fn no_answer_backs_off_the_destination_and_spends_no_attempt() {
        let attempt = Attempt::Unreachable {
            reason: "connection refused".into(),
        };
        let d = decide(&Tried::Attempted(&attempt), 24, BACKOFF, &policy(), NOW, UP);
        assert_eq!(
            d.write_back,
            WriteBack::Release {
                error: Some("unreachable: connection refused".into()),
                available_at: Some(NOW),
            },
            "moved behind the other due events, so the next probe is another one"
        );
        assert_eq!(d.gate, GateChange::Unreachable);
    }

    #[test]
    fn no_valid_answer_after_sending_spends_an_attempt_of_that_event_only() {
        let attempt = Attempt::Failed {
            reason: "timeout: recv response".into(),
        };
        let d = decide(&Tried::Attempted(&attempt), 0, BACKOFF, &policy(), NOW, UP);
        assert_eq!(
            d.write_back,
            WriteBack::Retry {
                available_at: NOW + 700,
                error: "no valid answer: timeout: recv response".into()
            }
        );
        assert_eq!(d.gate, GateChange::Answered, "the destination stays open");
        let d = decide(&Tried::Attempted(&attempt), 24, BACKOFF, &policy(), NOW, UP);
        assert!(
            matches!(d.write_back, WriteBack::Dead { .. }),
            "a poison event is dead-lettered at max attempts"
        );
    }

    #[test]
    fn an_unsendable_event_is_dead_at_once() {
        let attempt = Attempt::Unsendable {
            reason: "stored data is not valid JSON".into(),
        };
        let d = decide(&Tried::Attempted(&attempt), 0, BACKOFF, &policy(), NOW, UP);
        assert_eq!(
            d.write_back,
            WriteBack::Dead {
                error: "stored data is not valid JSON".into()
            }
        );
        assert_eq!(d.gate, GateChange::Unchanged);
    }

    #[test]
    fn an_event_not_sent_is_handed_back_untouched() {
        let d = decide(&Tried::Skipped, 5, BACKOFF, &policy(), NOW, UP);
        assert_eq!(
            d.write_back,
            WriteBack::Release {
                error: None,
                available_at: None
            }
        );
        assert_eq!(d.gate, GateChange::Unchanged);
    }

    #[test]
    fn a_transport_panic_spends_an_attempt() {
        let d = decide(&Tried::Panicked("boom"), 0, BACKOFF, &policy(), NOW, UP);
        assert_eq!(
            d.write_back,
            WriteBack::Retry {
                available_at: NOW + 700,
                error: "transport panicked: boom".into()
            }
        );
    }

    #[test]
    fn one_backoff_is_drawn_per_request_from_its_most_tried_event() {
        let p = policy();
        let mut events = vec![crate::internal::sample_event(&serde_json::json!(1)); 2];
        events[1].attempts = 30;
        for _ in 0..50 {
            assert!(p.draw_backoff(&events) <= Duration::from_secs(300));
        }
        events[1].attempts = 0;
        for _ in 0..50 {
            assert!(p.draw_backoff(&events) <= Duration::from_secs(1));
        }
    }
}
