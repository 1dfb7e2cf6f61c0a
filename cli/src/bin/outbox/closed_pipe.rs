//! A closed pipe ends the command quietly, as Unix tools do: `outbox stats | head` stops
//! when `head` has read enough, with exit 0 and nothing on stderr, where Rust's `println!`
//! panics ("failed printing to stdout: Broken pipe", exit 101).
//!
//! The panic is what `println!` does on any write error; rather than route every line of
//! output through a checked writer, a panic hook recognises that one panic and exits.

/// Installs the hook (once, first thing in `main`).
pub fn end_quietly_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_closed_pipe(info.payload()) {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether a panic's payload is `println!`'s failure on a closed stdout.
fn is_closed_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    message.starts_with("failed printing to stdout") && message.contains("Broken pipe")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_stdout_is_taken_for_a_closed_pipe() {
        let closed: Box<dyn std::any::Any + Send> = Box::new(String::from(
            "failed printing to stdout: Broken pipe (os error 32)",
        ));
        assert!(is_closed_pipe(&*closed));
        let other: Box<dyn std::any::Any + Send> = Box::new("index out of bounds");
        assert!(!is_closed_pipe(&*other));
        let full: Box<dyn std::any::Any + Send> = Box::new(String::from(
            "failed printing to stdout: No space left on device (os error 28)",
        ));
        assert!(!is_closed_pipe(&*full));
    }
}
