//! TLS at both ends, always with rustls and its `ring` provider.
//!
//! - Server: [`TlsConfig`], the `[tls]` table of the lease service and the
//!   proxy (certificate and key PEM files; optionally a CA whose client
//!   certificates are required), checked at start with an error naming the
//!   file and what is wrong with it.
//! - Client: [`ClientTls`], the one place fencegate's HTTP clients (the CLI,
//!   the proxy's issuer check) get their TLS settings: the CA to trust
//!   instead of the system roots, and a client certificate.
//!
//! The signed token, the lease secret and lease-bound credentials are bearer
//! capabilities: whoever reads them off the wire can write as the holder.

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Overrides `tls.cert_file` of the lease service and the proxy.
pub const ENV_CERT_FILE: &str = "FENCEGATE_TLS_CERT_FILE";
/// Overrides `tls.key_file`.
pub const ENV_KEY_FILE: &str = "FENCEGATE_TLS_KEY_FILE";
/// Overrides `tls.client_ca_file`.
pub const ENV_CLIENT_CA_FILE: &str = "FENCEGATE_TLS_CLIENT_CA_FILE";

/// Serving HTTPS: the `[tls]` table of a service's configuration. An empty
/// path is the same as none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server's certificate, then any intermediate
    /// certificates. With `key_file`, the service serves HTTPS only.
    /// Override with `FENCEGATE_TLS_CERT_FILE`.
    #[serde(deserialize_with = "optional_path")]
    pub cert_file: Option<PathBuf>,
    /// PEM file with the certificate's private key (PKCS#8, PKCS#1 or
    /// SEC1). Override with `FENCEGATE_TLS_KEY_FILE`.
    #[serde(deserialize_with = "optional_path")]
    pub key_file: Option<PathBuf>,
    /// PEM file with the CA certificate(s) that sign client certificates.
    /// When set, every client must present a certificate signed by one of
    /// them (mutual TLS); the handshake of any other client fails. Override
    /// with `FENCEGATE_TLS_CLIENT_CA_FILE`.
    #[serde(deserialize_with = "optional_path")]
    pub client_ca_file: Option<PathBuf>,
}

/// Deserializes a path where `""` means none (so an example config can show
/// the default of a file option as `""`).
pub fn optional_path<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let path = Option::<PathBuf>::deserialize(d)?;
    Ok(path.filter(|p| !p.as_os_str().is_empty()))
}

/// What is wrong with a TLS file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {}: cannot read it: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error(
        "{what} {}: no PEM private key in it (expected -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
        path.display()
    )]
    NoKey { what: &'static str, path: PathBuf },
    #[error("{what} {}: not valid PEM: {detail}", path.display())]
    BadPem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{what} {}: {detail}", path.display())]
    Unusable {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "{key_what} {} does not match the certificate in {cert_what} {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        key_what: &'static str,
        key: PathBuf,
        cert_what: &'static str,
        cert: PathBuf,
    },
    #[error("{0}")]
    Incomplete(String),
}

impl TlsConfig {
    /// Applies the `FENCEGATE_TLS_*` overrides read through `var`.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        let path = |k| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(p) = path(ENV_CERT_FILE) {
            self.cert_file = Some(p);
        }
        if let Some(p) = path(ENV_KEY_FILE) {
            self.key_file = Some(p);
        }
        if let Some(p) = path(ENV_CLIENT_CA_FILE) {
            self.client_ca_file = Some(p);
        }
    }

    /// Whether the service serves HTTPS.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Every problem with the settings and the files they name.
    pub fn problems(&self) -> Vec<String> {
        match self.load() {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    /// The server configuration, or `None` for plain HTTP.
    pub fn server_config(&self) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
        self.load().map_err(|mut errors| errors.remove(0))
    }

    /// Loads every file, collecting every problem.
    fn load(&self) -> Result<Option<Arc<rustls::ServerConfig>>, Vec<TlsError>> {
        let (cert_path, key_path) = match (&self.cert_file, &self.key_file) {
            (None, None) if self.client_ca_file.is_some() => {
                return Err(vec![TlsError::Incomplete(
                    "tls.client_ca_file is set, but client certificates need TLS: set tls.cert_file and tls.key_file too".into(),
                )]);
            }
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(vec![TlsError::Incomplete(
                    "tls.cert_file is set but tls.key_file is not: set both to serve HTTPS".into(),
                )]);
            }
            (None, Some(_)) => {
                return Err(vec![TlsError::Incomplete(
                    "tls.key_file is set but tls.cert_file is not: set both to serve HTTPS".into(),
                )]);
            }
            (Some(c), Some(k)) => (c, k),
        };
        let certs = load_certs("tls.cert_file", cert_path);
        let key = load_key("tls.key_file", key_path);
        let client_roots = self
            .client_ca_file
            .as_deref()
            .map(|p| load_roots("tls.client_ca_file", p));
        let mut errors = Vec::new();
        let (certs, key) = match (certs, key) {
            (Ok(c), Ok(k)) => (Some(c), Some(k)),
            (c, k) => {
                errors.extend(c.err());
                errors.extend(k.err());
                (None, None)
            }
        };
        let client_roots = match client_roots {
            None => None,
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                errors.push(e);
                None
            }
        };
        let (Some(certs), Some(key), true) = (certs, key, errors.is_empty()) else {
            return Err(errors);
        };
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| vec![TlsError::Incomplete(format!("TLS setup failed: {e}"))])?;
        let builder = match (client_roots, &self.client_ca_file) {
            (Some(roots), Some(path)) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| {
                    vec![TlsError::Unusable {
                        what: "tls.client_ca_file",
                        path: path.clone(),
                        detail: e.to_string(),
                    }]
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            vec![pair_refused(
                e,
                ("tls.key_file", key_path),
                ("tls.cert_file", cert_path),
            )]
        })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }
}

/// Why rustls refused a certificate and its key: they are not a pair, or
/// the key is unusable. Each is named with what it is in the config.
fn pair_refused(
    e: rustls::Error,
    (key_what, key): (&'static str, &PathBuf),
    (cert_what, cert): (&'static str, &PathBuf),
) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            key_what,
            key: key.clone(),
            cert_what,
            cert: cert.clone(),
        },
        e => TlsError::Unusable {
            what: key_what,
            path: key.clone(),
            detail: e.to_string(),
        },
    }
}

/// How one of fencegate's HTTP clients does TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM file of the CA certificate(s) to trust, instead of the system's
    /// roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (and chain) to present, for a server that
    /// requires one; with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl ClientTls {
    /// The rustls client configuration: trusts `ca_file` (or the system's
    /// roots), presents the client certificate if one is set.
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let roots = match &self.ca_file {
            Some(path) => load_roots("CA file", path)?,
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                roots
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Incomplete(format!("TLS setup failed: {e}")))?
            .with_root_certificates(roots);
        match (&self.cert_file, &self.key_file) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let certs = load_certs("client certificate", cert)?;
                let der = load_key("client key", key)?;
                builder
                    .with_client_auth_cert(certs, der)
                    .map_err(|e| pair_refused(e, ("client key", key), ("client certificate", cert)))
            }
            _ => Err(TlsError::Incomplete(
                "a client certificate needs both its certificate and its key file".into(),
            )),
        }
    }

    /// Whether any TLS setting is given (a CA file or a client
    /// certificate): the peer is then meant to be reached over TLS.
    pub fn is_set(&self) -> bool {
        *self != ClientTls::default()
    }

    /// Refuses `url` (named `what` in the message, e.g. "--fence") when it
    /// is not `https://` although TLS settings are given: a bearer secret
    /// (a signed token, lease-bound credentials) would go in clear to it.
    pub fn require_https(&self, what: &str, url: &str) -> Result<(), TlsError> {
        if self.is_set()
            && !url
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("https://")
        {
            return Err(TlsError::Incomplete(format!(
                "{what} {url} is not https://, but TLS settings are given (--ca-file / --client-cert): \
                 what goes there (the signed fencing token, lease credentials) would travel in clear; use https://"
            )));
        }
        Ok(())
    }

    /// A reqwest client builder with this TLS configuration (for `https://`
    /// URLs; `http://` URLs are unaffected). It follows a redirect only to
    /// `https://` when the request was to `https://` or TLS settings are
    /// given (a 307 to `http://` would resend the request, its secrets
    /// included, in clear), and at most 5. TCP keepalive and user timeout
    /// as [`crate::liveness`] says.
    pub fn http_client(&self) -> Result<reqwest::ClientBuilder, TlsError> {
        let tls_set = self.is_set();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let from_https = attempt
                .previous()
                .first()
                .is_some_and(|u| u.scheme() == "https");
            if attempt.url().scheme() != "https" && (from_https || tls_set) {
                let why = format!(
                    "refused a redirect to {} (not https://): the request carries secrets",
                    attempt.url()
                );
                attempt.error(why)
            } else if attempt.previous().len() > 5 {
                attempt.error("more than 5 redirects")
            } else {
                attempt.follow()
            }
        });
        Ok(crate::liveness::client(reqwest::Client::builder())
            .use_preconfigured_tls(self.rustls_config()?)
            .redirect(policy))
    }
}

/// rustls's `ring` provider, named explicitly: the build also links
/// aws-lc-rs (through the AWS SDK), and with two providers compiled in,
/// rustls cannot pick a process default by itself.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn bad_pem(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::BadPem {
        what,
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            what,
            path: path.to_owned(),
        },
        e => bad_pem(what, path, e),
    })
}

fn load_roots(what: &'static str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|e| TlsError::Unusable {
            what,
            path: path.to_owned(),
            detail: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a client speaking plain HTTP to a TLS port gets.
const PLAIN_HTTP_TO_TLS_PORT: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 45\r\nconnection: close\r\n\r\nthis port serves HTTPS: use an https:// URL\r\n";

/// Accepts a TLS connection. A client that speaks plain HTTP instead gets a
/// `400` in plain text saying to use `https://`, rather than a silent close.
pub(crate) async fn accept(
    tcp: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        if first[0].is_ascii_alphabetic() {
            crate::answer::answer_and_close(tcp, PLAIN_HTTP_TO_TLS_PORT).await;
        }
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not TLS (plain HTTP sent to the HTTPS port?)",
        ));
    }
    acceptor.accept(tcp).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_http_answer_has_the_right_length() {
        let text = std::str::from_utf8(PLAIN_HTTP_TO_TLS_PORT).expect("ascii");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.contains(&format!("content-length: {}", body.len())));
    }

    /// TLS settings: a test CA's file (kept in `dir`).
    fn with_ca(dir: &tempfile::TempDir) -> ClientTls {
        let ca = crate::test_pki::TestCa::new("ca");
        ClientTls {
            ca_file: Some(ca.write(dir.path(), "ca.pem")),
            ..ClientTls::default()
        }
    }

    #[test]
    fn with_tls_settings_only_https_urls_are_taken() {
        let dir = tempfile::tempdir().expect("dir");
        let tls = with_ca(&dir);
        let e = tls
            .require_https("--fence", "http://proxy:9000")
            .expect_err("clear text");
        assert!(e.to_string().contains("--fence http://proxy:9000"), "{e}");
        tls.require_https("--fence", "HTTPS://proxy:9000")
            .expect("https");
        ClientTls::default()
            .require_https("--fence", "http://proxy:9000")
            .expect("no TLS settings: plain http is the user's choice");
    }

    /// A server that answers `/start` with a 307 to its own `/next` over
    /// plain http, and `/next` with 200.
    async fn redirecting_server() -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = c.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]);
                    let answer = if head.starts_with("GET /start") {
                        format!(
                            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{addr}/next\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                    } else {
                        "HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nreached"
                            .to_owned()
                    };
                    let _ = c.write_all(answer.as_bytes()).await;
                });
            }
        });
        format!("http://{addr}/start")
    }

    #[tokio::test]
    async fn a_redirect_to_plain_http_is_not_followed_once_tls_is_set() {
        let url = redirecting_server().await;
        let dir = tempfile::tempdir().expect("dir");
        let tls = with_ca(&dir);
        let get = |tls: ClientTls| {
            let url = url.clone();
            async move {
                let client = tls.http_client().expect("client").build().expect("built");
                client.get(&url).send().await
            }
        };
        let e = get(tls).await.expect_err("not followed");
        assert!(format!("{e:?}").contains("refused a redirect"), "{e:?}");
        // Without TLS settings, a plain http redirect is followed.
        let body = get(ClientTls::default())
            .await
            .expect("followed")
            .text()
            .await
            .expect("body");
        assert_eq!(body, "reached");
    }

    #[test]
    fn half_a_configuration_is_a_problem() {
        let c = TlsConfig {
            cert_file: Some("/c.pem".into()),
            ..TlsConfig::default()
        };
        assert!(c.problems()[0].contains("tls.key_file is not"));
        let c = TlsConfig {
            client_ca_file: Some("/ca.pem".into()),
            ..TlsConfig::default()
        };
        assert!(c.problems()[0].contains("tls.client_ca_file"));
        assert!(TlsConfig::default().problems().is_empty());
    }
}
