//! The client of the lease API: typed requests in, typed answers or a typed
//! refusal out. TLS, timeouts and connection settings are the caller's: it
//! passes the `reqwest::Client` to use.
//!
//! It also owns the rule for a list of the lease service's URLs ([`Urls`]):
//! every replica has the same scheme, so a failover never sends in clear
//! what the first replica received over TLS.

use crate::wire::{
    AcquireRequest, ErrorBody, ErrorResponse, LeaseResponse, LockStatusResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, path,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
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
    /// The client was built ([`Client::new`]) from a list of URLs that
    /// [`Urls::parse`] refuses; nothing was sent.
    #[error("{0}; nothing was sent")]
    Urls(UrlsError),
}

/// Why a list of the lease service's URLs cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlsError {
    #[error(
        "the list of lease service URLs is empty: give the lease service's URL, or its replicas' URLs separated by commas"
    )]
    Empty,
    #[error("the lease service URL {0:?} must start with http:// or https://")]
    NotHttp(String),
    /// Some replicas are plain HTTP (`plain`, in list order), others
    /// HTTPS (`https`: the first of them).
    #[error(
        "the lease service URLs mix http:// and https://: {} while {https} is HTTPS; a failover would send the signed token and the API key in clear. Use https:// for every replica",
        PlainHttp(plain)
    )]
    MixedSchemes { plain: Vec<String>, https: String },
}

/// "a is plain HTTP", "a and b are plain HTTP", "a, b and c are ...".
struct PlainHttp<'a>(&'a [String]);

impl fmt::Display for PlainHttp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("no URL is plain HTTP"),
            [one] => write!(f, "{one} is plain HTTP"),
            [init @ .., last] => write!(f, "{} and {last} are plain HTTP", init.join(", ")),
        }
    }
}

/// The URLs of one lease service (its replicas, tried in turn), checked:
/// at least one, each `http://` or `https://`, and all with the same
/// scheme. A [`Client`] built from a list with both would send the signed
/// token, the lease-bound credentials and the API key in clear as soon as
/// it fails over from an `https://` replica to an `http://` one, whatever
/// TLS settings its caller checked against the first URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Urls {
    list: Arc<[String]>,
    https: bool,
}

impl Urls {
    /// `list`: one URL, or several separated by commas (split as
    /// [`urls`] does).
    pub fn parse(list: &str) -> Result<Urls, UrlsError> {
        let list = urls(list);
        let mut plain = Vec::new();
        let mut https = None;
        for url in &list {
            match Scheme::of(url) {
                Some(Scheme::Http) => plain.push(url.clone()),
                Some(Scheme::Https) => {
                    https.get_or_insert_with(|| url.clone());
                }
                None => return Err(UrlsError::NotHttp(url.clone())),
            }
        }
        if list.is_empty() {
            return Err(UrlsError::Empty);
        }
        match https {
            Some(https) if !plain.is_empty() => Err(UrlsError::MixedSchemes { plain, https }),
            https => Ok(Urls {
                list: list.into(),
                https: https.is_some(),
            }),
        }
    }

    /// Whether every URL is `https://` (otherwise every one is `http://`).
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The URLs, in the order given.
    pub fn as_slice(&self) -> &[String] {
        &self.list
    }
}

impl std::str::FromStr for Urls {
    type Err = UrlsError;

    fn from_str(list: &str) -> Result<Urls, UrlsError> {
        Urls::parse(list)
    }
}

/// The URLs, separated by ", ".
impl fmt::Display for Urls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.list.join(", "))
    }
}

enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// The scheme `url` starts with, in any case (as URLs allow).
    fn of(url: &str) -> Option<Scheme> {
        let starts = |prefix: &str| {
            url.get(..prefix.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
        };
        if starts("https://") {
            Some(Scheme::Https)
        } else if starts("http://") {
            Some(Scheme::Http)
        } else {
            None
        }
    }
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
///
/// Its URLs are [`Urls`]: one scheme for every replica.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The URLs, or the list given to [`Client::new`] and why it cannot be
    /// used (then no call sends anything).
    bases: Result<Urls, (String, UrlsError)>,
    api_key: Option<String>,
    /// Index into the URLs of the replica that answered last.
    preferred: Arc<AtomicUsize>,
}

/// The URLs in `list`: separated by commas, blanks and trailing slashes
/// trimmed, empty entries dropped. Not checked: see [`Urls::parse`].
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
    /// `http` carries the TLS settings and default timeouts; `api_key` is
    /// sent as `Authorization: Bearer` when set (and not empty).
    pub fn with_urls(http: reqwest::Client, urls: Urls, api_key: Option<String>) -> Client {
        Client {
            http,
            bases: Ok(urls),
            api_key: api_key.filter(|k| !k.is_empty()),
            preferred: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// [`Client::with_urls`] from one URL or several separated by commas,
    /// or why that list cannot be used ([`Urls::parse`]).
    pub fn try_new(
        http: reqwest::Client,
        urls: &str,
        api_key: Option<String>,
    ) -> Result<Client, UrlsError> {
        Ok(Client::with_urls(http, Urls::parse(urls)?, api_key))
    }

    /// [`Client::try_new`] for a list its caller has already checked with
    /// [`Urls::parse`] (a service's configuration check, say). A list that
    /// fails the check still gives no client that sends in clear: every
    /// call of this one fails with [`ClientError::Urls`] before sending
    /// anything.
    pub fn new(http: reqwest::Client, urls: &str, api_key: Option<String>) -> Client {
        match Client::try_new(http.clone(), urls, api_key) {
            Ok(client) => client,
            Err(why) => Client {
                http,
                bases: Err((urls.trim().to_owned(), why)),
                api_key: None,
                preferred: Arc::new(AtomicUsize::new(0)),
            },
        }
    }

    /// The lease service's URLs, as given, separated by ", ".
    pub fn base(&self) -> String {
        match &self.bases {
            Ok(urls) => urls.to_string(),
            Err((list, _)) => list.clone(),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Option<Duration>,
        repeatable: bool,
    ) -> Result<T, ClientError> {
        let bases = match &self.bases {
            Ok(urls) => urls.as_slice(),
            Err((_, why)) => return Err(ClientError::Urls(why.clone())),
        };
        let first = self.preferred.load(Ordering::Relaxed) % bases.len();
        let mut result = None;
        for i in (0..bases.len()).map(|k| (first + k) % bases.len()) {
            let (answer, failure) = self
                .call_one(&bases[i], method.clone(), path, body, timeout)
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
    fn urls_share_one_scheme() {
        let urls = Urls::parse("https://a:1, HTTPS://b:2/").expect("all https");
        assert!(urls.is_https());
        assert_eq!(urls.as_slice(), ["https://a:1", "HTTPS://b:2"]);
        assert_eq!(urls.to_string(), "https://a:1, HTTPS://b:2");
        let urls = Urls::parse("http://a:1,http://b:2").expect("all http");
        assert!(!urls.is_https());
        assert_eq!(Urls::parse(" , "), Err(UrlsError::Empty));
        assert_eq!(
            Urls::parse("http://a:1,b:2"),
            Err(UrlsError::NotHttp("b:2".into()))
        );
    }

    #[test]
    fn mixed_schemes_are_refused_naming_the_plain_urls() {
        let e = Urls::parse("https://a,http://b").expect_err("mixed");
        assert_eq!(
            e.to_string(),
            "the lease service URLs mix http:// and https://: http://b is plain HTTP while https://a is HTTPS; \
             a failover would send the signed token and the API key in clear. Use https:// for every replica"
        );
        // Whichever comes first, every plain one is named.
        let e = Urls::parse("http://a, https://b, Http://c, http://d").expect_err("mixed");
        assert_eq!(
            e,
            UrlsError::MixedSchemes {
                plain: vec!["http://a".into(), "Http://c".into(), "http://d".into()],
                https: "https://b".into(),
            }
        );
        assert!(
            e.to_string().contains(
                "http://a, Http://c and http://d are plain HTTP while https://b is HTTPS"
            ),
            "{e}"
        );
        assert!(
            Urls::parse("http://a,https://b")
                .expect_err("mixed")
                .to_string()
                .contains("http://a is plain HTTP while https://b is HTTPS")
        );
    }

    /// A client built from a mixed list sends nothing: its calls fail on
    /// their first poll, before any connection (there is no runtime here
    /// to make one).
    #[test]
    fn a_client_of_mixed_urls_sends_nothing() {
        let mixed = "https://127.0.0.1:1,http://127.0.0.1:2";
        let http = reqwest::Client::new();
        assert!(matches!(
            Client::try_new(http.clone(), mixed, None),
            Err(UrlsError::MixedSchemes { .. })
        ));
        let client = Client::new(http, mixed, Some("key".into()));
        assert_eq!(client.base(), mixed);
        let call = client.status("backups", None);
        let mut call = std::pin::pin!(call);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(ClientError::Urls(UrlsError::MixedSchemes {
                plain,
                ..
            }))) => assert_eq!(plain, ["http://127.0.0.1:2"]),
            other => panic!("expected the URLs refused, got {other:?}"),
        }
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
