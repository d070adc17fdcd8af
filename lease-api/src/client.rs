//! The client of the lease API: typed requests in, typed answers or a typed
//! refusal out. TLS, timeouts and connection settings are the caller's: it
//! passes the `reqwest::Client` to use.

use crate::{
    AcquireRequest, ErrorBody, ErrorResponse, LeaseResponse, LockStatusResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, path,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// A lease service: one URL (`http://host:port`, no trailing path), or the
/// replicas of one on etcd, tried in turn.
///
/// A call moves on to the next replica when the one it tried could not have
/// acted on it: the connection was refused or could not be made. Calls
/// that can be repeated without changing what they did (status, renew and
/// release, and an acquire that carries an idempotency key) also move on
/// when a replica timed out, dropped the connection or answered 503: the
/// replicas share one store, and an acquire sent again with its key gets
/// back the lease the first one may have been granted. An acquire without
/// a key that may have reached a replica is not sent again elsewhere: a
/// grant it does not see would make it wait behind itself. The replica
/// that last answered is tried first next time.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    bases: Arc<[String]>,
    api_key: Option<String>,
    /// Index into `bases` of the replica that answered last.
    preferred: Arc<AtomicUsize>,
}

/// The URLs in `list`: separated by commas, blanks and trailing slashes
/// trimmed, empty entries dropped.
pub fn urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(|u| u.trim().trim_end_matches('/'))
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether a call that failed this way may be sent to the next replica.
fn moves_on(failure: &Failure, repeatable: bool) -> bool {
    match failure {
        Failure::NotConnected => true,
        Failure::Lost | Failure::Unavailable => repeatable,
    }
}

/// How one replica failed a call, for [`moves_on`].
enum Failure {
    /// Nothing reached the replica.
    NotConnected,
    /// The request may have reached it; no answer came back.
    Lost,
    /// It answered 503.
    Unavailable,
}

impl Client {
    /// `http` carries the TLS settings and default timeouts; `urls` is
    /// one URL or several separated by commas ([`urls`]); `api_key` is
    /// sent as `Authorization: Bearer` when set (and not empty).
    pub fn new(http: reqwest::Client, urls: &str, api_key: Option<String>) -> Client {
        let mut bases = self::urls(urls);
        if bases.is_empty() {
            // Refused by the callers' configuration checks; kept so a
            // call says where it went instead of panicking.
            bases.push(urls.trim().to_owned());
        }
        Client {
            http,
            bases: bases.into(),
            api_key: api_key.filter(|k| !k.is_empty()),
            preferred: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The lease service's URLs, as given, separated by ", ".
    pub fn base(&self) -> String {
        self.bases.join(", ")
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Option<Duration>,
        repeatable: bool,
    ) -> Result<T, ClientError> {
        let first = self.preferred.load(Ordering::Relaxed) % self.bases.len();
        let mut result = None;
        for i in (0..self.bases.len()).map(|k| (first + k) % self.bases.len()) {
            let (answer, failure) = self
                .call_one(&self.bases[i], method.clone(), path, body, timeout)
                .await;
            match failure {
                Some(f) if moves_on(&f, repeatable) => result = Some(answer),
                _ => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return answer;
                }
            }
        }
        result.expect("at least one URL")
    }

    /// One replica's answer, and how it failed if the call may go on.
    async fn call_one<T: DeserializeOwned>(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Option<Duration>,
    ) -> (Result<T, ClientError>, Option<Failure>) {
        let url = format!("{base}{path}");
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
        let unreachable = |e: reqwest::Error| {
            let failure = if e.is_connect() {
                Failure::NotConnected
            } else {
                Failure::Lost
            };
            let error = ClientError::Unreachable {
                url: url.clone(),
                why: e.to_string(),
            };
            (Err(error), Some(failure))
        };
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(e) => return unreachable(e),
        };
        let status = resp.status().as_u16();
        let text = match resp.text().await {
            Ok(text) => text,
            Err(e) => return unreachable(e),
        };
        let unexpected = |why: String| ClientError::Unexpected {
            url: url.clone(),
            status,
            why,
        };
        if (200..300).contains(&status) {
            let answer =
                serde_json::from_str(&text).map_err(|e| unexpected(format!("{e}: {text}")));
            return (answer, None);
        }
        let answer = match serde_json::from_str::<ErrorResponse>(&text) {
            Ok(refusal) => Err(ClientError::Refused {
                status,
                error: refusal.error,
            }),
            Err(e) => Err(unexpected(format!("{e}: {text}"))),
        };
        (answer, (status == 503).then_some(Failure::Unavailable))
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
            req.idempotency_key.is_some(),
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
            true,
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
            true,
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
            true,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_on_commas_and_trim() {
        assert_eq!(urls("http://a:1"), ["http://a:1"]);
        assert_eq!(
            urls(" http://a:1/ ,, https://b:2"),
            ["http://a:1", "https://b:2"]
        );
        assert!(urls(" , ").is_empty());
    }

    #[test]
    fn only_repeatable_calls_move_on_after_they_may_have_arrived() {
        assert!(moves_on(&Failure::NotConnected, false));
        assert!(!moves_on(&Failure::Lost, false));
        assert!(!moves_on(&Failure::Unavailable, false));
        assert!(moves_on(&Failure::Lost, true));
        assert!(moves_on(&Failure::Unavailable, true));
    }
}
