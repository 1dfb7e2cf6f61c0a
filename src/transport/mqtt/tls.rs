//! TLS for `mqtts://` destinations: the broker's certificate checked against a CA (a PEM file
//! of the user's, or Mozilla's roots built in), and a client certificate for mutual TLS
//! (which AWS IoT Core requires).
//!
//! The rustls configuration is built here, at start, rather than by rumqttc at each connect:
//! a bad PEM is then a configuration error the user sees at once, not a connection that
//! fails forever as "unreachable"; and the crypto provider (ring, the one ureq uses) is named
//! explicitly, so two providers in one build cannot make rustls panic.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The certificates of an `mqtts://` connection, as PEM bytes.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    /// CA certificates that may sign the broker's certificate; `None`: Mozilla's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// The client's certificate chain and private key, for mutual TLS.
    pub client_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// ALPN protocol names (AWS IoT Core on port 443 wants `x-amzn-mqtt-ca`).
    pub alpn: Vec<String>,
}

impl TlsFiles {
    /// Whether any TLS setting was given (they make no sense on `mqtt://`).
    pub fn any(&self) -> bool {
        self.ca_pem.is_some() || self.client_identity_pem.is_some() || !self.alpn.is_empty()
    }

    /// The rustls client configuration, or what is wrong with the certificates.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        let mut roots = RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                let certs = certificates(pem, "CA")?;
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| format!("the CA certificate is not usable: {e:#}"))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e:#}"))?
            .with_root_certificates(roots);
        let mut config = match &self.client_identity_pem {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let chain = certificates(cert_pem, "client")?;
                let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
                    format!(
                        "the client key holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e:#}"
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate and key do not fit: {e:#}"))?
            }
        };
        config.alpn_protocols = self.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Ok(config)
    }
}

/// Every certificate in `pem`, at least one.
fn certificates(pem: &[u8], which: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {which} certificate file is not valid PEM: {e:#}"))?;
    if certs.is_empty() {
        return Err(format!(
            "the {which} certificate file holds no PEM certificate (BEGIN CERTIFICATE)"
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_refused_with_what_was_wrong() {
        let files = TlsFiles {
            ca_pem: Some(b"not a certificate".to_vec()),
            ..TlsFiles::default()
        };
        let e = files.client_config().unwrap_err();
        assert!(
            e.contains("CA certificate file holds no PEM certificate"),
            "{e:#}"
        );
        // Without a CA file the built-in roots serve.
        assert!(TlsFiles::default().client_config().is_ok());
    }
}
