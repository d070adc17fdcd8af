//! Certificates for tests, generated on the fly with rcgen: a CA, server
//! certificates for `localhost` and `127.0.0.1`, client certificates, all
//! written as PEM files. (Feature `test-pki`; never in the binary.)

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A test certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate and its key, written to `dir`.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

impl TestCa {
    /// A new self-signed CA called `cn`.
    pub fn new(cn: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name = name(cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).expect("CA certificate").pem();
        TestCa {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Writes the CA certificate to `dir/<file>`.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("write CA");
        path
    }

    fn issue(
        &self,
        cn: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
        dir: &Path,
        stem: &str,
    ) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name = name(cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        let files = CertFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }

    /// A server certificate for `localhost` and `127.0.0.1`, written as
    /// `dir/<stem>.crt` and `dir/<stem>.key`.
    pub fn server(&self, dir: &Path, stem: &str) -> CertFiles {
        self.issue(
            "fencegate test server",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            dir,
            stem,
        )
    }

    /// A client certificate for `cn`.
    pub fn client(&self, dir: &Path, stem: &str, cn: &str) -> CertFiles {
        self.issue(cn, &[], ExtendedKeyUsagePurpose::ClientAuth, dir, stem)
    }
}
