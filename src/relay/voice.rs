//! What the relay says about a destination: one warning line each time its state changes
//! (delivering, unreachable, refusing the relay's credentials, failing, answering
//! nothing), naming the destination and the answer, and one when it delivers again.
//!
//! A relay that delivered nothing used to say nothing: a receiver answering 401 for ten
//! minutes left an empty stderr. The lines go through `log` at `warn`, the level the CLI
//! shows by default and most apps keep, and are said on a change only, so a destination
//! down for a week costs two lines, not one per retry. A destination flapping between two
//! states says each state at most once a minute.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::transport::Attempt;

/// The least time between two lines about the same state of one destination.
const SAME_STATE_QUIET: Duration = Duration::from_secs(60);

/// A destination's state as its answers show it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Delivering,
    /// Not reached: refused connection, DNS, a TLS handshake or a proxy's refusal.
    Unreachable,
    /// 401: the credentials (a signing secret, a token, a client certificate). A 403 can be
    /// about the event (`outbox ingest` answers it to an event of another source than the
    /// key's), so it is the event's, as the relay treats it.
    CredentialsRefused(u16),
    /// 407: the proxy wants credentials.
    ProxyRefused,
    /// 5xx, 429 or 408: the receiver's side is failing or busy.
    Failing(u16),
    /// The request went out and no valid answer came.
    NoAnswer,
}

impl Heard {
    /// What one attempt shows, if it says anything about the destination as a whole (a 400,
    /// 403 or 422 is about the event, which is dead-lettered and logged as such).
    fn of(attempt: &Attempt) -> Option<Heard> {
        match attempt {
            Attempt::Answered { status, .. } => match status {
                200..=299 => Some(Heard::Delivering),
                401 => Some(Heard::CredentialsRefused(*status)),
                407 => Some(Heard::ProxyRefused),
                408 | 429 | 500..=599 => Some(Heard::Failing(*status)),
                _ => None,
            },
            Attempt::Unreachable { .. } => Some(Heard::Unreachable),
            Attempt::Failed { .. } => Some(Heard::NoAnswer),
            Attempt::Unsendable { .. } => None,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Heard::Delivering => "delivering",
            Heard::Unreachable => "unreachable",
            Heard::CredentialsRefused(_) => {
                "refuses the relay's credentials (check its secret, token or client \
                 certificate)"
            }
            Heard::ProxyRefused => "refused by the proxy (407: check the proxy's credentials)",
            Heard::Failing(_) => "failing on its side",
            Heard::NoAnswer => "not answering",
        }
    }
}

/// The detail of an attempt for the line: the answer's status line and body start, or why
/// it was not reached.
fn detail(attempt: &Attempt) -> String {
    match attempt {
        Attempt::Answered { detail, status, .. } if detail.is_empty() => format!("HTTP {status}"),
        Attempt::Answered { detail, .. } => detail.clone(),
        Attempt::Unreachable { reason }
        | Attempt::Failed { reason }
        | Attempt::Unsendable { reason } => reason.clone(),
    }
}

struct State {
    heard: Heard,
    since: Instant,
    /// When each state was last said (at most a handful of entries).
    said: Vec<(Heard, Instant)>,
    /// Whether the last state that was not delivering was said (only then is "delivering
    /// again" worth a line).
    trouble_said: bool,
    /// The state and the answer while it is not delivering.
    trouble: Option<String>,
}

/// One destination's voice, shared by its workers.
pub(crate) struct Voice {
    destination: String,
    state: Mutex<State>,
}

impl Voice {
    /// A destination presumed delivering until its answers say otherwise.
    pub fn new(destination: &str) -> Voice {
        Voice {
            destination: destination.to_owned(),
            state: Mutex::new(State {
                heard: Heard::Delivering,
                since: Instant::now(),
                said: Vec::new(),
                trouble_said: false,
                trouble: None,
            }),
        }
    }

    /// Takes what a request's answers show; says the state if it changed.
    pub fn heard(&self, attempts: &[Attempt]) {
        // The first attempt that says something about the destination speaks for the
        // request (a batch is answered once).
        let Some((attempt, heard)) = attempts
            .iter()
            .find_map(|attempt| Heard::of(attempt).map(|heard| (attempt, heard)))
        else {
            return;
        };
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.heard == heard {
            return;
        }
        let now = Instant::now();
        let was = std::mem::replace(&mut state.heard, heard.clone());
        let lasted = now.duration_since(state.since);
        state.since = now;
        let recently_said = state
            .said
            .iter()
            .any(|(said, at)| *said == heard && now.duration_since(*at) < SAME_STATE_QUIET);
        if heard == Heard::Delivering {
            state.trouble = None;
            if state.trouble_said {
                state.trouble_said = false;
                log::warn!(
                    "destination {}: delivering again (it was {} for {:.0?})",
                    self.destination,
                    was.describe(),
                    round(lasted)
                );
            }
            return;
        }
        let trouble = format!(
            "destination {}: {}: {}",
            self.destination,
            heard.describe(),
            detail(attempt)
        );
        state.trouble = Some(trouble.clone());
        if recently_said {
            return;
        }
        state.said.retain(|(said, _)| *said != heard);
        state.said.push((heard.clone(), now));
        state.trouble_said = true;
        log::warn!("{trouble}; events wait and are tried again");
    }

    /// The state and the answer while the destination is not delivering.
    pub fn trouble(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .trouble
            .clone()
    }
}

/// A duration to the second, for a line a person reads.
fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16) -> Attempt {
        Attempt::Answered {
            status,
            retry_after: None,
            detail: String::new(),
        }
    }

    fn heard_of(voice: &Voice) -> Heard {
        voice.state.lock().unwrap().heard.clone()
    }

    #[test]
    fn a_change_is_heard_once_and_an_event_level_refusal_says_nothing_of_the_destination() {
        let voice = Voice::new("orders");
        voice.heard(&[answered(401)]);
        assert_eq!(heard_of(&voice), Heard::CredentialsRefused(401));
        assert!(voice.state.lock().unwrap().trouble_said);
        // A 400 is about one event: the destination's state stays.
        voice.heard(&[answered(400)]);
        assert_eq!(heard_of(&voice), Heard::CredentialsRefused(401));
        voice.heard(&[answered(204)]);
        assert_eq!(heard_of(&voice), Heard::Delivering);
        assert!(!voice.state.lock().unwrap().trouble_said);
        voice.heard(&[Attempt::Unreachable {
            reason: "connection refused".into(),
        }]);
        assert_eq!(heard_of(&voice), Heard::Unreachable);
    }

    #[test]
    fn a_flapping_destination_says_each_state_at_most_once_a_minute() {
        let voice = Voice::new("orders");
        voice.heard(&[answered(503)]);
        voice.heard(&[answered(200)]);
        // Back to failing within the minute: not said again, so "delivering again" is
        // not worth a line either.
        voice.heard(&[answered(503)]);
        assert!(!voice.state.lock().unwrap().trouble_said);
        assert_eq!(voice.state.lock().unwrap().said.len(), 1);
    }
}
