//! A certificate authority made at test time (rcgen), for TLS tests: a CA, and server and
//! client certificates it signs, written as PEM files in a temp folder.

#![allow(dead_code)]

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA whose files live as long as it does.
pub struct TestCa {
    pub dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, with its certificate in `ca.pem`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), issuer.pem()).unwrap();
        TestCa { dir, issuer }
    }

    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A server certificate for `localhost` and 127.0.0.1 (webpki checks the IP SAN).
    pub fn server(&self) -> Issued {
        self.issue(
            "server",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server certificate for the names (or IP addresses) in `sans` only.
    pub fn server_for(&self, file: &str, sans: &[&str]) -> Issued {
        self.issue(file, sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }
}
