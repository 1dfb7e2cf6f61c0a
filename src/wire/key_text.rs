//! How key texts (`whsec_…`, `whsk_…`, `whpk_…`) are read: one base64 reading shared by
//! secrets and Ed25519 keys, and the shortest secret taken. A leaf module, below both
//! kinds of key and their errors.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;

/// Secrets are read leniently: padding optional, non-canonical trailing bits allowed, as the
/// Python reference library does. A secret a user pasted without its `=` still works.
pub(crate) const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// The shortest key a secret may have, in bytes: the Standard Webhooks specification asks
/// for 24 to 64. A shorter one (`whsec_AA` is a single zero byte) is guessed offline from
/// one signed request.
pub const MIN_SECRET_BYTES: usize = 24;
