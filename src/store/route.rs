//! Routing: which destinations an event goes to, by its type, and what a destination's name
//! may be. Kept with the settings (routes are settings kept in the file); the relay's
//! `Destination` takes its name rules from here.

use crate::error::{Error, Result};

/// The destination of events when no route is configured.
pub(crate) const DEFAULT_DESTINATION: &str = "default";

/// The longest destination name, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// Checks a destination name: 1 to 64 bytes of letters, digits, `-`, `_` and `.`.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "destination name {name:?} must be 1 to {} letters, digits, '-', '_' or '.'",
            MAX_NAME_LEN
        )))
    }
}

/// A routing rule: events whose type matches `pattern` go to `destination`.
///
/// Patterns: an exact type (`order.created`), a prefix ending in `*` (`order.*` matches
/// `order.created` and `order.item.added`), or `*` for every event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pattern: String,
    destination: String,
}

impl Route {
    pub fn new(pattern: String, destination: String) -> Route {
        Route {
            pattern,
            destination,
        }
    }

    /// The type pattern: an exact type, a prefix ending in `*`, or `*`.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The destination events matching this route go to.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Whether `event_type` matches this route's pattern.
    pub fn matches(&self, event_type: &str) -> bool {
        super::type_pattern::type_matches(&self.pattern, event_type)
    }
}

/// The destinations an event of `event_type` goes to, in route order without repeats.
/// With no routes at all, everything goes to the default destination.
pub(crate) fn destinations_for<'a>(routes: &'a [Route], event_type: &str) -> Vec<&'a str> {
    if routes.is_empty() {
        return vec![DEFAULT_DESTINATION];
    }
    let mut out: Vec<&str> = Vec::new();
    for r in routes.iter().filter(|r| r.matches(event_type)) {
        if !out.contains(&r.destination.as_str()) {
            out.push(&r.destination);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(p: &str, d: &str) -> Route {
        Route::new(p.into(), d.into())
    }

    #[test]
    fn patterns_match_exact_prefix_and_all() {
        assert!(route("order.created", "d").matches("order.created"));
        assert!(!route("order.created", "d").matches("order.created.v2"));
        assert!(route("order.*", "d").matches("order.item.added"));
        assert!(!route("order.*", "d").matches("orders.x"));
        assert!(route("*", "d").matches("anything"));
    }

    #[test]
    fn destinations_are_unique_and_default_without_routes() {
        assert_eq!(destinations_for(&[], "x"), vec!["default"]);
        let routes = [
            route("order.*", "billing"),
            route("*", "audit"),
            route("order.created", "billing"),
        ];
        assert_eq!(
            destinations_for(&routes, "order.created"),
            vec!["billing", "audit"]
        );
        assert_eq!(destinations_for(&routes, "user.signup"), vec!["audit"]);
        assert!(destinations_for(&routes[..1], "user.signup").is_empty());
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("billing-v2.eu_1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name(&"x".repeat(65)).is_err());
    }
}
