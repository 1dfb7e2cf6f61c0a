//! How a command fails: a message for stderr and an exit code (2 for bad input, 1 otherwise).

use std::process::ExitCode;

use sqlite_outbox::Error;

/// A failure and its exit code.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::PayloadTooLarge { .. }
            | Error::InvalidPriority { .. }
            | Error::InvalidSetting { .. }
            | Error::InvalidExpiry { .. }
            | Error::InvalidBundle { .. }
            | Error::InvalidEventType { .. }
            | Error::FieldTooLong { .. }
            | Error::InvalidEvent { .. }
            | Error::InvalidData(_)
            | Error::InvalidConfig(_)
            | Error::NoRoute { .. }
            | Error::NotADatabase { .. }
            | Error::NotFound { .. }
            | Error::NotAnOutbox { .. }
            | Error::SchemaTooNew { .. } => 2,
            _ => 1,
        };
        Failure {
            code,
            message: format!("{e:#}"),
        }
    }
}

/// Bad input from the user: exit code 2.
pub fn bad_input(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

/// Any other failure: exit code 1.
pub fn failed(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

/// What a command returns.
pub type Outcome = Result<ExitCode, Failure>;
