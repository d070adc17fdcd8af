//! A small HTTP client for the lease service, shared by `lease` and `run`.
//! Requests, answers and errors are the API's wire types
//! (`fencegate_lease_api`), so client and server cannot drift apart.

use crate::failure::Failure;
use clap::Args;
use fencegate_core::FencingToken;
use fencegate_lease_api::{
    AcquireRequest, ClientError, ErrorCode, ErrorResponse, LeaseResponse, LockStatusResponse,
    ReleaseRequest, ReleaseResponse, RenewRequest, Urls,
};
use fencegate_net::tls::ClientTls;
use std::path::PathBuf;
use std::time::Duration;

/// Who takes a lease, for how long, and how long to wait in line for it.
#[derive(Debug, Clone, Args)]
pub struct LeaseTerms {
    /// Who takes the lease (default: <hostname>-<pid>).
    #[arg(long)]
    pub owner: Option<String>,
    /// How long the lease lasts unless renewed.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// Wait in line up to this long if the lock is held (default: fail at
    /// once).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
}

/// Where the lease service is and how to authenticate to it.
#[derive(Debug, Clone, Args)]
pub struct LocksvcConn {
    /// URL of the lease service (https:// when it serves TLS), or the URLs
    /// of its replicas separated by commas, tried in turn: all https:// or
    /// all http://, never both (a failover would send the token in clear).
    #[arg(
        long,
        env = "FENCEGATE_LOCKSVC",
        default_value = "http://127.0.0.1:7070",
        value_parser = Urls::parse
    )]
    pub locksvc: Urls,
    /// API key for the lease service, if it requires one.
    #[arg(long, env = "FENCEGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS towards an `https://` service.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// PEM file of the CA certificate(s) to trust for https:// (instead of
    /// the system's roots).
    #[arg(long, env = "FENCEGATE_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a lease service that requires one.
    #[arg(long, env = "FENCEGATE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "FENCEGATE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    pub fn client_tls(&self) -> ClientTls {
        ClientTls {
            ca_file: self.ca_file.clone(),
            cert_file: self.client_cert.clone(),
            key_file: self.client_key.clone(),
        }
    }
}

/// A granted or renewed lease, as the lease service returns it.
pub type LeaseInfo = LeaseResponse;

#[derive(Debug, Clone)]
pub struct Client {
    api: fencegate_lease_api::Client,
}

impl Client {
    pub fn new(conn: LocksvcConn) -> anyhow::Result<Client> {
        // `Urls`: one scheme for every replica (a failover from https:// to
        // http:// would send the signed token in clear), checked by clap.
        let urls = conn.locksvc;
        let tls = conn.tls.client_tls();
        // The signed token and the lease-bound credentials in every answer
        // are bearer secrets: TLS settings next to a plain URL are a
        // mistake worth stopping for, not a silent downgrade.
        anyhow::ensure!(
            tls == ClientTls::default() || urls.is_https(),
            "--ca-file / --client-cert (FENCEGATE_CA_FILE / FENCEGATE_CLIENT_CERT) are set, but the lease service URL {urls} is not https://"
        );
        let http = tls
            .http_client()?
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Client {
            api: fencegate_lease_api::Client::with_urls(http, urls, conn.api_key),
        })
    }

    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Acquires `lock`. `idempotency_key`: a secret sent again by a retry of
    /// the same acquire, so that the retry gets the lease back.
    pub async fn acquire(
        &self,
        lock: &str,
        owner: &str,
        idempotency_key: Option<&str>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LeaseInfo, Failure> {
        let req = AcquireRequest {
            owner: owner.to_owned(),
            ttl_ms: Some(Self::millis(ttl)),
            wait_ms: Some(Self::millis(wait)),
            idempotency_key: idempotency_key.map(str::to_owned),
        };
        Ok(self
            .api
            .acquire(lock, &req, Some(wait + Duration::from_secs(30)))
            .await?)
    }

    /// Renews the lease `token` (the signed `fencing_token`) proves.
    pub async fn renew(
        &self,
        lock: &str,
        token: &FencingToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<LeaseInfo, Failure> {
        let req = RenewRequest {
            token: token.clone(),
            ttl_ms: Some(Self::millis(ttl)),
        };
        Ok(self.api.renew(lock, &req, Some(timeout)).await?)
    }

    /// Releases the lease `token` (the signed `fencing_token`) proves.
    pub async fn release(
        &self,
        lock: &str,
        token: &FencingToken,
    ) -> Result<ReleaseResponse, Failure> {
        let req = ReleaseRequest {
            token: token.clone(),
        };
        Ok(self
            .api
            .release(lock, &req, Some(Duration::from_secs(10)))
            .await?)
    }

    pub async fn status(&self, lock: &str) -> Result<LockStatusResponse, Failure> {
        Ok(self.api.status(lock, Some(Duration::from_secs(10))).await?)
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let ClientError::Refused { status, error } = e else {
            return Failure::Other(anyhow::anyhow!("{e}"));
        };
        let message = format!("{}: {}", error.code.as_str(), error.message);
        let body = serde_json::to_string(&ErrorResponse {
            error: error.clone(),
        })
        .unwrap_or_default();
        let detail = format!("{message}\n{body}");
        match error.code {
            // The service's hint names its JSON field; a CLI user has a flag.
            ErrorCode::LockHeld => Failure::Held(format!(
                "{}\n{body}",
                message.replace("pass wait_ms", "pass --wait <duration> to wait in line")
            )),
            ErrorCode::LeaseLost => Failure::LeaseLost(detail),
            _ => Failure::Other(anyhow::anyhow!(
                "lease service refused the request ({status}): {detail}"
            )),
        }
    }
}

/// A default owner id: `<hostname>-<pid>`.
pub fn default_owner() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    format!("{host}-{}", std::process::id())
}
