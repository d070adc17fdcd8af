//! A small HTTP client for the lease service, shared by `lease` and `run`.
//! Requests, answers and errors are the API's wire types
//! (`fencegate_lease_api`), so client and server cannot drift apart.

use crate::Failure;
use anyhow::Context as _;
use clap::Args;
use fencegate_core::FencingToken;
use fencegate_lease_api::{
    AcquireRequest, ErrorCode, ErrorResponse, LeaseResponse, LockStatusResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, path,
};
use fencegate_net::tls::ClientTls;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Where the lease service is and how to authenticate to it.
#[derive(Debug, Clone, Args)]
pub struct LocksvcConn {
    /// URL of the lease service (https:// when it serves TLS).
    #[arg(
        long,
        env = "FENCEGATE_LOCKSVC",
        default_value = "http://127.0.0.1:7070"
    )]
    pub locksvc: String,
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
    http: reqwest::Client,
    conn: LocksvcConn,
}

impl Client {
    pub fn new(conn: LocksvcConn) -> anyhow::Result<Client> {
        let tls = conn.tls.client_tls();
        // The signed token and the lease-bound credentials in every answer
        // are bearer secrets: TLS settings next to a plain URL are a
        // mistake worth stopping for, not a silent downgrade.
        anyhow::ensure!(
            tls == ClientTls::default() || conn.locksvc.starts_with("https://"),
            "--ca-file / --client-cert (FENCEGATE_CA_FILE / FENCEGATE_CLIENT_CERT) are set, but the lease service URL {} is not https://",
            conn.locksvc
        );
        let http = tls
            .http_client()?
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Client { http, conn })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        // `body` is a serialized wire type; only GET passes none.
        let url = format!("{}{path}", self.conn.locksvc.trim_end_matches('/'));
        let mut req = self.http.request(method, &url).timeout(timeout);
        if let Some(key) = &self.conn.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the lease service at {url}"))?;
        let status = resp.status();
        let body: Value = resp.json().await.with_context(|| {
            format!("the lease service at {url} answered {status} with a body that is not JSON")
        })?;
        if status.is_success() {
            return Ok(body);
        }
        let refusal: ErrorResponse = serde_json::from_value(body.clone()).with_context(|| {
            format!("the lease service at {url} answered {status} with an unexpected body: {body}")
        })?;
        let error = refusal.error;
        let message = format!("{}: {}", error.code.as_str(), error.message);
        let detail = format!("{message}\n{body}");
        Err(match error.code {
            // The service's hint names its JSON field; a CLI user has a flag.
            ErrorCode::LockHeld => Failure::Held(format!(
                "{}\n{body}",
                message.replace("pass wait_ms", "pass --wait <duration> to wait in line")
            )),
            ErrorCode::LeaseLost => Failure::LeaseLost(detail),
            _ => Failure::Other(anyhow::anyhow!(
                "lease service refused the request ({status}): {detail}"
            )),
        })
    }

    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    fn body(req: &impl serde::Serialize) -> Result<Value, Failure> {
        Ok(serde_json::to_value(req).context("cannot encode the request")?)
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
        let body = Self::body(&AcquireRequest {
            owner: owner.to_owned(),
            ttl_ms: Some(Self::millis(ttl)),
            wait_ms: Some(Self::millis(wait)),
            idempotency_key: idempotency_key.map(str::to_owned),
        })?;
        let v = self
            .call(
                reqwest::Method::POST,
                &path::acquire(lock),
                Some(body),
                wait + Duration::from_secs(30),
            )
            .await?;
        Ok(serde_json::from_value(v).context("unexpected acquire answer")?)
    }

    /// Renews the lease `token` (the signed `fencing_token`) proves.
    pub async fn renew(
        &self,
        lock: &str,
        token: &FencingToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<LeaseInfo, Failure> {
        let body = Self::body(&RenewRequest {
            token: token.clone(),
            ttl_ms: Some(Self::millis(ttl)),
        })?;
        let v = self
            .call(
                reqwest::Method::POST,
                &path::renew(lock),
                Some(body),
                timeout,
            )
            .await?;
        Ok(serde_json::from_value(v).context("unexpected renew answer")?)
    }

    /// Releases the lease `token` (the signed `fencing_token`) proves.
    pub async fn release(
        &self,
        lock: &str,
        token: &FencingToken,
    ) -> Result<ReleaseResponse, Failure> {
        let body = Self::body(&ReleaseRequest {
            token: token.clone(),
        })?;
        let v = self
            .call(
                reqwest::Method::POST,
                &path::release(lock),
                Some(body),
                Duration::from_secs(10),
            )
            .await?;
        Ok(serde_json::from_value(v).context("unexpected release answer")?)
    }

    pub async fn status(&self, lock: &str) -> Result<LockStatusResponse, Failure> {
        let v = self
            .call(
                reqwest::Method::GET,
                &path::status(lock),
                None,
                Duration::from_secs(10),
            )
            .await?;
        Ok(serde_json::from_value(v).context("unexpected status answer")?)
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
