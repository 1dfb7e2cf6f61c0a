//! An HTTPS receiver on 127.0.0.1 for the tests (rustls, certificates from a
//! [`TestCa`](crate::test_ca::TestCa)): answers every request 204 and counts them.
//!
//! Include with `#[path = "../../tests/common/https_receiver.rs"] mod https_receiver;` beside
//! `test_ca`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::test_ca::Issued;

/// An HTTPS receiver on 127.0.0.1 answering every request 204 and counting them; with
/// `client_ca`, it asks for a client certificate that CA issued and refuses the handshake
/// without one.
pub struct HttpsReceiver {
    pub addr: SocketAddr,
    received: Arc<AtomicUsize>,
}

impl HttpsReceiver {
    pub fn start(server: &Issued, client_ca: Option<&Path>) -> HttpsReceiver {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                    roots.add(cert.unwrap()).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&server.cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
        let config = Arc::new(builder.with_single_cert(certs, key).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&received);
        std::thread::Builder::new()
            .name("https-receiver".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let config = Arc::clone(&config);
                    let counted = Arc::clone(&counted);
                    std::thread::spawn(move || {
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                        let Ok(connection) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        let tls = rustls::StreamOwned::new(connection, stream);
                        let _ = serve(tls, &counted);
                    });
                }
            })
            .unwrap();
        HttpsReceiver { addr, received }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/events", self.addr.port())
    }

    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

/// Reads requests off one connection, answering each 204, until it ends.
fn serve(stream: impl Read + Write, counted: &AtomicUsize) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        // The relay's accounting of its streams (issue 58) is not an event.
        let text = String::from_utf8_lossy(&body);
        if !text.contains(sqlite_outbox::wire::ACCOUNTING_TYPE) {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        reader
            .get_mut()
            .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")?;
        reader.get_mut().flush()?;
    }
}
