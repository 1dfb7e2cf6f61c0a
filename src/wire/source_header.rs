//! The `outbox-source` header: the CloudEvents `source` of every event in a request, so a
//! receiver can choose the keys that may sign for that source before it reads the body.
//!
//! A source is any text; a header value is visible ASCII. Bytes outside `!`..=`~`, `%`
//! itself and `"` are sent as `%XX` (RFC 3986 percent-encoding, as the CloudEvents HTTP
//! binding encodes its `ce-` headers), so a source of visible ASCII, as most are
//! (`/devices/42`), is sent as it is.

/// The header's name.
pub const SOURCE_HEADER: &str = "outbox-source";

/// `source` as the header's value.
pub fn encode_source_header(source: &str) -> String {
    percent_encode_header(source)
}

/// What a header value cannot hold as it is: controls, space, `"` and `%` (bytes outside
/// ASCII are always encoded).
const NOT_IN_HEADER: &percent_encoding::AsciiSet =
    &percent_encoding::CONTROLS.add(b' ').add(b'"').add(b'%');

/// Any text as a header value: what the CloudEvents HTTP binding asks of a `ce-` header
/// (space, `"`, `%` and anything outside printable ASCII as `%XX` of its UTF-8 bytes).
pub(crate) fn percent_encode_header(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, NOT_IN_HEADER).to_string()
}

/// The source a header value names, or `None` if it is not a well-formed encoding of UTF-8
/// text.
pub fn decode_source_header(value: &[u8]) -> Option<String> {
    if !is_well_formed(value) {
        return None;
    }
    percent_encoding::percent_decode(value)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// Whether `value` holds only visible ASCII and every `%` starts an `%XX` escape: the
/// decoder passes a malformed escape through as it is, where a header must be refused.
fn is_well_formed(value: &[u8]) -> bool {
    value.iter().enumerate().all(|(at, &byte)| {
        byte.is_ascii_graphic()
            && (byte != b'%'
                || (value.get(at + 1).is_some_and(u8::is_ascii_hexdigit)
                    && value.get(at + 2).is_some_and(u8::is_ascii_hexdigit)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_ascii_goes_as_it_is_and_anything_else_round_trips() {
        assert_eq!(encode_source_header("/devices/42"), "/devices/42");
        for source in ["/geräte/7", "a b", "100%", "line\nbreak", ""] {
            let header = encode_source_header(source);
            assert!(header.bytes().all(|b| b.is_ascii_graphic()), "{header}");
            assert_eq!(
                decode_source_header(header.as_bytes()).as_deref(),
                Some(source)
            );
        }
        for bad in [&b"%"[..], b"%4", b"%zz", b"a b", b"%ff"] {
            assert_eq!(decode_source_header(bad), None, "{bad:?}");
        }
    }
}
