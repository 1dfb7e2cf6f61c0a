//! `Retry-After` parsing must never panic on what a receiver sends.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use sqlite_outbox::wire::parse_retry_after;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        if let Some(wait) = parse_retry_after(text, now) {
            // Digits only, or an HTTP date: never a negative wait.
            assert!(wait >= Duration::ZERO);
        }
    }
});
