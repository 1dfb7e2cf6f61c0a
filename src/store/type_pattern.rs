//! Type patterns, as routes, storage policies, priorities and lifetimes name the events they
//! apply to: an exact type, a prefix ending in `*`, or `*`.

/// Whether `event_type` matches `pattern`: an exact type, a prefix ending in `*`, or `*`.
pub(crate) fn type_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// The value of the most specific pattern in `entries` that matches `event_type`: the exact
/// type, then the longest prefix, then `*`.
pub(crate) fn most_specific<'a, T>(entries: &'a [(String, T)], event_type: &str) -> Option<&'a T> {
    entries
        .iter()
        .filter(|(pattern, _)| type_matches(pattern, event_type))
        .max_by_key(|(pattern, _)| (!pattern.ends_with('*'), pattern.len()))
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_pattern_wins_whatever_the_order() {
        let entries = vec![
            ("*".to_string(), 1),
            ("order.created".to_string(), 3),
            ("order.*".to_string(), 2),
            ("order.item.*".to_string(), 4),
        ];
        assert_eq!(most_specific(&entries, "order.created"), Some(&3));
        assert_eq!(most_specific(&entries, "order.item.added"), Some(&4));
        assert_eq!(most_specific(&entries, "order.paid"), Some(&2));
        assert_eq!(most_specific(&entries, "telemetry"), Some(&1));
        assert_eq!(most_specific(&entries[1..], "telemetry"), None);
    }
}
