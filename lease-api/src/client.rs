//! The client of the lease API: typed requests in, typed answers or a typed
//! refusal out. TLS, timeouts and connection settings are the caller's: it
//! passes the `reqwest::Client` to use.

use crate::{
    AcquireRequest, ErrorBody, ErrorResponse, LeaseResponse, LockStatusResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, path,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// What a call can end in besides its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The service answered with a refusal.
    #[error("the lease service refused ({status}): {}: {}", error.code.as_str(), error.message)]
    Refused { status: u16, error: ErrorBody },
    /// The service could not be reached, or did not answer in time.
    #[error("cannot reach the lease service at {url}: {why}")]
    Unreachable { url: String, why: String },
    /// The answer was not what the API says it is.
    #[error("the lease service at {url} answered {status} with an unexpected body: {why}")]
    Unexpected {
        url: String,
        status: u16,
        why: String,
    },
}

/// A lease service at `base` (`http://host:port`, no trailing path).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl Client {
    /// `http` carries the TLS settings and default timeouts; `api_key` is
    /// sent as `Authorization: Bearer` when set (and not empty).
    pub fn new(http: reqwest::Client, base: &str, api_key: Option<String>) -> Client {
        Client {
            http,
            base: base.trim_end_matches('/').to_owned(),
            api_key: api_key.filter(|k| !k.is_empty()),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Option<Duration>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| ClientError::Unreachable {
            url: url.clone(),
            why: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ClientError::Unreachable {
            url: url.clone(),
            why: e.to_string(),
        })?;
        let unexpected = |why: String| ClientError::Unexpected {
            url: url.clone(),
            status,
            why,
        };
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| unexpected(format!("{e}: {text}")));
        }
        let refusal: ErrorResponse =
            serde_json::from_str(&text).map_err(|e| unexpected(format!("{e}: {text}")))?;
        Err(ClientError::Refused {
            status,
            error: refusal.error,
        })
    }

    /// `timeout` bounds this call (an acquire that waits in line needs its
    /// wait and more); `None`: the `reqwest::Client`'s own.
    pub async fn acquire(
        &self,
        lock: &str,
        req: &AcquireRequest,
        timeout: Option<Duration>,
    ) -> Result<LeaseResponse, ClientError> {
        self.call(
            reqwest::Method::POST,
            &path::acquire(lock),
            Some(req),
            timeout,
        )
        .await
    }

    pub async fn renew(
        &self,
        lock: &str,
        req: &RenewRequest,
        timeout: Option<Duration>,
    ) -> Result<LeaseResponse, ClientError> {
        self.call(
            reqwest::Method::POST,
            &path::renew(lock),
            Some(req),
            timeout,
        )
        .await
    }

    pub async fn release(
        &self,
        lock: &str,
        req: &ReleaseRequest,
        timeout: Option<Duration>,
    ) -> Result<ReleaseResponse, ClientError> {
        self.call(
            reqwest::Method::POST,
            &path::release(lock),
            Some(req),
            timeout,
        )
        .await
    }

    pub async fn status(
        &self,
        lock: &str,
        timeout: Option<Duration>,
    ) -> Result<LockStatusResponse, ClientError> {
        self.call(
            reqwest::Method::GET,
            &path::status(lock),
            None::<&()>,
            timeout,
        )
        .await
    }
}
