//! TLS to PostgreSQL with libpq's connection parameters, on rustls (with ring, the build's
//! one crypto provider).
//!
//! The `postgres` crate understands `sslmode=disable|prefer|require` only, and with its
//! `NoTls` connector never encrypts whatever the URL says (`prefer` then silently means
//! plaintext, `require` never connects). [`pg_connect_config`] reads the URL (or `key=value`
//! string) the way libpq does for the TLS parameters, takes them off, and returns the
//! config and a connector that does what they mean:
//!
//! | `sslmode` | encrypted | certificate checked | host name checked |
//! |---|---|---|---|
//! | `disable` | never | – | – |
//! | `prefer` (the default) | if the server offers it | only against `sslrootcert` if given | no |
//! | `require` | always, or no connection | only against `sslrootcert` if given | no |
//! | `verify-ca` | always | yes | no |
//! | `verify-full` | always | yes | yes (DNS name or IP address) |
//!
//! `sslrootcert=PATH` names a PEM file of the CA certificates to trust; `sslrootcert=system`,
//! or none given with `verify-ca`/`verify-full`, trusts Mozilla's root CAs built in (a
//! device or a container may have no system store). Any other `ssl*` parameter (client
//! certificates, CRLs) is refused with an error that names it, rather than ignored.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::error::{Error, Result};

/// The TLS connector for PostgreSQL connections made from a [`pg_connect_config`] config:
/// give it to `Config::connect` or `r2d2_postgres::PostgresConnectionManager::new`.
pub type PgTls = tokio_postgres_rustls::MakeRustlsConnect;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The PostgreSQL config of `url` (a `postgresql://` URL or a `host=… user=…` string) and
/// the TLS connector its `sslmode` and `sslrootcert` ask for (see the module's table).
///
/// ```no_run
/// # fn main() -> Result<(), sqlite_outbox::Error> {
/// let (config, tls) = sqlite_outbox::receive::pg_connect_config(
///     "postgresql://app@db.internal/events?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )?;
/// let mut client = config.connect(tls)?;
/// sqlite_outbox::receive::pg_migrate(&mut client)?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidConfig`] for an unknown `sslmode`, an unsupported `ssl*` parameter, an
/// unreadable or empty `sslrootcert`, or a URL the `postgres` crate refuses.
pub fn pg_connect_config(url: &str) -> Result<(postgres::Config, PgTls)> {
    let bad = |why: String| Error::InvalidConfig(format!("PostgreSQL URL: {why}"));
    let (rest, params) = take_tls_params(url)
        .map_err(|why| Error::InvalidConfig(format!("the PostgreSQL URL is not valid: {why}")))?;
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    for (name, value) in params {
        match name.as_str() {
            "sslmode" => {
                mode = match value.as_str() {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(bad(format!(
                            "sslmode={other} is not one of disable, prefer, require, verify-ca, \
                             verify-full"
                        )))
                    }
                }
            }
            "sslrootcert" => root_cert = Some(value),
            other => {
                return Err(bad(format!(
                    "{other} is not supported (TLS takes sslmode and sslrootcert)"
                )))
            }
        }
    }
    let mut config: postgres::Config = rest
        .parse()
        .map_err(|e| Error::InvalidConfig(format!("the PostgreSQL URL is not valid: {e:#}")))?;
    config.ssl_mode(match mode {
        SslMode::Disable => postgres::config::SslMode::Disable,
        SslMode::Prefer => postgres::config::SslMode::Prefer,
        _ => postgres::config::SslMode::Require,
    });
    let roots = match (root_cert.as_deref(), mode) {
        (Some("system"), _) | (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
            Some(mozilla_roots())
        }
        (Some(path), _) => Some(roots_from_file(path).map_err(bad)?),
        (None, _) => None,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        // libpq's prefer and require: encrypted, the certificate taken as it is.
        None => Arc::new(EncryptOnly(Arc::clone(&provider))),
        Some(roots) => {
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .map_err(|e| bad(format!("sslrootcert: {e:#}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e:#}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok((config, tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
}

/// Connects to `url` as [`pg_connect_config`] reads it.
///
/// # Errors
///
/// As [`pg_connect_config`], and [`Error::Postgres`] when the connection fails (a server
/// that refuses TLS under `require`, a certificate or host name that does not check out).
pub fn pg_connect(url: &str) -> Result<postgres::Client> {
    let (config, tls) = pg_connect_config(url)?;
    Ok(config.connect(tls)?)
}

/// Splits the `ssl*` parameters off `url`; the rest is for the `postgres` crate.
fn take_tls_params(url: &str) -> std::result::Result<(String, Vec<(String, String)>), String> {
    let is_tls = |name: &str| name.starts_with("ssl") && name != "sslnegotiation";
    let mut taken = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), taken));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if is_tls(name) {
                taken.push((name.to_string(), percent_decode(value)?));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, taken));
    }
    let mut kept = Vec::new();
    for (name, value) in key_values(url)? {
        if is_tls(&name) {
            taken.push((name, value));
        } else {
            kept.push(format!(
                "{name}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    Ok((kept.join(" "), taken))
}

/// The pairs of a libpq key/value connection string, read as libpq reads them: spaces may
/// surround `=`, a value may be single-quoted (and hold spaces), and `\` escapes the next
/// character. `sslmode = require` is `sslmode=require`: read naively, it once slipped past
/// and the connection fell back to `prefer`, plaintext if the server offered no TLS.
fn key_values(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_spaces(&mut chars);
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            name.push(c);
        }
        skip_spaces(&mut chars);
        if chars.next() != Some('=') {
            return Err(format!("{name:?} is not followed by = and a value"));
        }
        skip_spaces(&mut chars);
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("the value of {name} has no closing quote")),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((name, value));
    }
}

fn percent_decode(text: &str) -> std::result::Result<String, String> {
    // The decoder passes a malformed escape through as it is: refused here first.
    let bytes = text.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(at, &byte)| {
        byte == b'%'
            && !(bytes.get(at + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(at + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(format!("{text:?} is not percent-encoded correctly"));
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| format!("{text:?} is not UTF-8"))
}

fn mozilla_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

fn roots_from_file(path: &str) -> std::result::Result<RootCertStore, String> {
    let pem = std::fs::read(path).map_err(|e| format!("sslrootcert {path}: {e:#}"))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("sslrootcert {path}: {e:#}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {path}: {e:#}"))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {path} holds no certificate"));
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not looked at.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// libpq's `prefer` and `require` without a root certificate: the connection is encrypted
/// (and the handshake's signatures checked), the certificate is not.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_off_urls_and_key_value_strings() {
        let (rest, taken) = take_tls_params(
            "postgresql://u@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgresql://u@h:5/db?application_name=x");
        assert_eq!(
            taken,
            vec![
                ("sslmode".into(), "verify-full".into()),
                ("sslrootcert".into(), "/ca.pem".into())
            ]
        );
        let (rest, taken) = take_tls_params("host=h user=u sslmode=require").unwrap();
        assert_eq!(rest, "host='h' user='u'");
        assert_eq!(taken, vec![("sslmode".into(), "require".into())]);
    }

    #[test]
    fn key_value_strings_are_read_as_libpq_reads_them() {
        // Issue 56: spaces around `=` left sslmode behind, and the connection preferred.
        for text in [
            "host=h user=u sslmode = require",
            "host=h user=u sslmode= require",
            "host = h  user =u sslmode ='require'",
        ] {
            let (rest, taken) = take_tls_params(text).unwrap();
            assert_eq!(taken, vec![("sslmode".into(), "require".into())], "{text}");
            assert_eq!(rest, "host='h' user='u'", "{text}");
        }
        let (rest, _) = take_tls_params(r"host=h password='it\'s a secret' user=a\ b").unwrap();
        assert_eq!(rest, r"host='h' password='it\'s a secret' user='a b'");
        let config: postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's a secret"[..]));
        assert_eq!(config.get_user(), Some("a b"));
        assert!(take_tls_params("host=h sslmode").is_err());
        assert!(take_tls_params("host='h").is_err());
        assert!(pg_connect_config("host=h user=u sslmode = maybe").is_err());
    }

    #[test]
    fn unknown_modes_and_parameters_are_refused_by_name() {
        for (url, named) in [
            ("postgresql://u@h/db?sslmode=maybe", "sslmode=maybe"),
            ("postgresql://u@h/db?sslcert=/c.pem", "sslcert"),
            (
                "host=h sslmode=verify-full sslrootcert=/nonexistent.pem",
                "/nonexistent.pem",
            ),
        ] {
            let Err(e) = pg_connect_config(url) else {
                panic!("{url} was accepted");
            };
            let e = e.to_string();
            assert!(e.contains(named), "{url}: {e:#}");
        }
        assert!(pg_connect_config("postgresql://u@h/db?sslmode=verify-full").is_ok());
        assert!(pg_connect_config("host=h user=u").is_ok());
    }
}
