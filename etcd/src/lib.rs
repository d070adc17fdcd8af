//! fencegate's etcd client, shared by the lease service (`locksvc::etcd`),
//! the proxy's replicas (`proxy::cluster`) and the elections locks may
//! follow ([`election`]): one client per member,
//! connected when first needed (with etcd auth, connecting is a request,
//! which a member that is down at start would fail), and every call bounded
//! by `request_timeout` in all, failing over from a silent member to the
//! next. A paused or dead member costs a call some latency, not an error;
//! without a quorum no member answers and the call fails when its time is
//! up.

pub use etcd_client;

pub mod election;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A secret from a config file or the environment (an etcd password, an
/// election's signing key): never printed (`Debug` shows `<redacted>`), so
/// a config that is logged or shown in an error does not leak it.
#[derive(Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl AsRef<str> for Secret {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `Some` non-empty text (a config may show an unset option as `""`).
pub fn nonempty<S: AsRef<str>>(s: &Option<S>) -> Option<&str> {
    s.as_ref().map(AsRef::as_ref).filter(|s| !s.is_empty())
}

/// How to reach a cluster.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// Client URLs of the members.
    pub endpoints: Vec<String>,
    /// etcd user and password, if etcd auth is on.
    pub credentials: Option<(String, String)>,
    /// PEM CA certificate(s) to trust for `https://` endpoints.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Longest one call may take, over every member tried.
    pub request_timeout: Duration,
    /// Longest a connection to one member may take to open.
    pub connect_timeout: Duration,
}

/// Whether an answer came from a retry on another member after an attempt
/// that may have been applied (it timed out or failed after being sent): a
/// compare-and-set retried then may find its own effect and must recognise
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retried(pub bool);

/// Why a call failed: every member was tried and none answered, or one
/// answered with a refusal that any member would give (bad credentials, a
/// request etcd rejects).
#[derive(Debug)]
pub enum CallError {
    Unavailable(String),
    Refused(etcd_client::Error),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unavailable(why) => f.write_str(why),
            CallError::Refused(e) => write!(f, "etcd refused: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// Whether etcd said that the etcd lease the call named is gone
    /// (expired or revoked): a keep-alive answered with no time left, which
    /// etcd-client reports as `LeaseKeepAliveError("lease not found")` (its
    /// other `LeaseKeepAliveError`, a failed send on a new stream, is not
    /// this), or a request naming the lease refused with etcd's
    /// `ErrGRPCLeaseNotFound`. That error is `NotFound` with the text
    /// `etcdserver: requested lease not found`; etcd's own clients tell it
    /// from the other `NotFound`s (users, roles) by that text, and so does
    /// this.
    pub fn lease_gone(&self) -> bool {
        match self {
            CallError::Refused(etcd_client::Error::LeaseKeepAliveError(m)) => {
                m.ends_with("lease not found")
            }
            CallError::Refused(etcd_client::Error::GRpcStatus(s)) => {
                s.code() == tonic::Code::NotFound && s.message().ends_with("lease not found")
            }
            _ => false,
        }
    }
}

struct Member {
    endpoint: String,
    options: ConnectOptions,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl Member {
    async fn client(&self) -> Result<Client, etcd_client::Error> {
        let mut slot = self.client.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let c = Client::connect([&self.endpoint], Some(self.options.clone())).await?;
        *slot = Some(c.clone());
        Ok(c)
    }
}

/// A cluster's members, each reached on its own client.
pub struct Etcd {
    members: Vec<Member>,
    /// The member that answered last: tried first.
    preferred: AtomicUsize,
    request_timeout: Duration,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field(
                "endpoints",
                &self.members.iter().map(|m| &m.endpoint).collect::<Vec<_>>(),
            )
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

fn connect_options(c: &Connection) -> anyhow::Result<ConnectOptions> {
    let mut opts = ConnectOptions::new()
        .with_timeout(c.request_timeout)
        .with_connect_timeout(c.connect_timeout)
        // HTTP/2 pings every 2 s, also on a connection without a stream
        // (a lease service between requests): a member gone silent is
        // noticed within 2 s + request_timeout, watches and keepalive
        // streams included, and the next request goes to another member
        // instead of into the dead connection. TCP keepalive under it, as
        // for every connection of fencegate (fencegate_net::liveness).
        .with_keep_alive(Duration::from_secs(2), c.request_timeout)
        .with_keep_alive_while_idle(true)
        .with_tcp_keepalive(fencegate_net::liveness::IDLE);
    if let Some((user, password)) = &c.credentials {
        opts = opts.with_user(user, password);
    }
    if c.ca_file.is_some() || c.cert_file.is_some() {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &c.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| anyhow::anyhow!("etcd ca_file {}: {e}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&c.cert_file, &c.key_file) {
            let cert_pem = std::fs::read(cert)
                .map_err(|e| anyhow::anyhow!("etcd cert_file {}: {e}", cert.display()))?;
            let key_pem = std::fs::read(key)
                .map_err(|e| anyhow::anyhow!("etcd key_file {}: {e}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
        }
        opts = opts.with_tls(tls);
    }
    Ok(opts)
}

impl Connection {
    /// What is wrong with this connection as configured in table `table`
    /// (`etcd` of the lease service, `cluster` of the proxy): the checks
    /// both services share, each message naming the table's option.
    pub fn problems(&self, table: &str) -> Vec<String> {
        let mut p = Vec::new();
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                p.push(format!(
                    "{table}.endpoints: {e:?} must start with http:// or https://"
                ));
            }
        }
        if let Err(e) = one_scheme(&self.endpoints) {
            p.push(format!("{table}.endpoints: {e}"));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            p.push(format!(
                "{table}.cert_file and {table}.key_file go together"
            ));
        }
        p
    }
}

/// Refuses endpoints that mix `https://` with plain ones (no scheme is
/// plain `http://` to etcd's client), naming the first plain one.
fn one_scheme(endpoints: &[String]) -> anyhow::Result<()> {
    let tls = |e: &String| e.trim().to_ascii_lowercase().starts_with("https://");
    if let (Some(secure), Some(plain)) = (
        endpoints.iter().find(|e| tls(e)),
        endpoints.iter().find(|e| !tls(e)),
    ) {
        anyhow::bail!(
            "the etcd endpoints mix https:// and plain http: {plain} is plain while {secure} is HTTPS; \
             a failover would send the etcd user's password and every request in clear. Use https:// for every member"
        );
    }
    Ok(())
}

/// Whether another member may answer what this one refused: everything
/// but the answers that would be the same anywhere.
pub fn retryable(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::LeaseKeepAliveError(_) => false,
        etcd_client::Error::GRpcStatus(s) => !matches!(
            s.code(),
            Code::NotFound
                | Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::Unauthenticated
        ),
        _ => true,
    }
}

impl Etcd {
    /// The members of `c`, not connected yet (reading its TLS files).
    /// A list that mixes `https://` with plain members is refused: a
    /// failover to a plain one would send the etcd password in clear.
    pub fn new(c: &Connection) -> anyhow::Result<Etcd> {
        one_scheme(&c.endpoints)?;
        let options = connect_options(c)?;
        Ok(Etcd {
            members: c
                .endpoints
                .iter()
                .map(|e| Member {
                    endpoint: e.clone(),
                    options: options.clone(),
                    client: tokio::sync::Mutex::new(None),
                })
                .collect(),
            preferred: AtomicUsize::new(0),
            request_timeout: c.request_timeout,
        })
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// A client of the member that answered last (for streams: watches,
    /// keep-alives, which are not failed over call by call).
    pub async fn client(&self) -> Result<Client, etcd_client::Error> {
        let n = self.members.len().max(1);
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..n {
            let m = (first + i) % n;
            match self.members[m].client().await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(etcd_client::Error::InvalidArgs("no etcd endpoints".into())))
    }

    /// Tries the next member first from now on (the preferred one went
    /// silent on a stream).
    pub fn prefer_next(&self) {
        let n = self.members.len().max(1);
        let p = self.preferred.load(Ordering::Relaxed);
        self.preferred.store((p + 1) % n, Ordering::Relaxed);
    }

    /// Runs one call, within `request_timeout` in all: on the member that
    /// answered last, then, if it fails or is silent for its share of the
    /// time, on the next.
    ///
    /// A write retried on another member may also have been applied by the
    /// first (it was sent, the answer was lost): the answer says so
    /// ([`Retried`]), and a compare-and-set must then recognise its own
    /// effect.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<(T, Retried), CallError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let members = &self.members;
        let n = members.len().max(1);
        let total = self.request_timeout;
        let deadline = Instant::now() + total;
        let share = (total / u32::try_from(n).unwrap_or(1)).max(Duration::from_millis(200));
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = String::from("no member tried");
        for i in 0..n {
            let m = (first + i) % n;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let limit = if i + 1 == n { left } else { share.min(left) };
            let attempt = async {
                let client = members[m].client().await?;
                f(client).await
            };
            match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(v)) => {
                    if i > 0 {
                        self.preferred.store(m, Ordering::Relaxed);
                    }
                    return Ok((v, Retried(i > 0)));
                }
                Ok(Err(e)) if !retryable(&e) => return Err(CallError::Refused(e)),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => {
                    last = format!(
                        "member {} silent for {}",
                        m + 1,
                        humantime::format_duration(limit)
                    )
                }
            }
        }
        Err(CallError::Unavailable(format!(
            "no etcd member answered within {} (request_timeout; last: {last}); is a quorum of members up?",
            humantime::format_duration(total)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_gone_lease_is_told_from_other_refusals() {
        let status = |code, msg: &str| {
            CallError::Refused(etcd_client::Error::GRpcStatus(tonic::Status::new(
                code, msg,
            )))
        };
        let keep_alive = etcd_client::Error::LeaseKeepAliveError("lease not found".into());
        assert!(CallError::Refused(keep_alive).lease_gone());
        assert!(
            status(
                tonic::Code::NotFound,
                "etcdserver: requested lease not found"
            )
            .lease_gone()
        );
        assert!(!status(tonic::Code::NotFound, "etcdserver: user name not found").lease_gone());
        assert!(
            !status(
                tonic::Code::PermissionDenied,
                "etcdserver: requested lease not found"
            )
            .lease_gone()
        );
        assert!(!CallError::Unavailable("lease not found".into()).lease_gone());
        let failed_send = etcd_client::Error::LeaseKeepAliveError("channel closed".into());
        assert!(!CallError::Refused(failed_send).lease_gone());
    }

    #[test]
    fn connection_problems_name_the_table() {
        let c = Connection {
            endpoints: list(&["https://a:2379", "http://b:2379", "c:2379"]),
            cert_file: Some("cert.pem".into()),
            ..Connection::default()
        };
        let p = c.problems("cluster");
        assert!(
            p.iter()
                .any(|s| s.starts_with("cluster.endpoints: \"c:2379\" must start")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|s| s.starts_with("cluster.endpoints: the etcd endpoints mix")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|s| s == "cluster.cert_file and cluster.key_file go together"),
            "{p:?}"
        );
        let fine = Connection {
            endpoints: list(&["https://a:2379", "https://b:2379"]),
            ..Connection::default()
        };
        assert!(fine.problems("etcd").is_empty());
    }

    #[test]
    fn endpoints_of_one_scheme_only() {
        assert!(one_scheme(&list(&["https://a:2379", "https://b:2379"])).is_ok());
        assert!(one_scheme(&list(&["http://a:2379", "b:2379"])).is_ok());
        let e = one_scheme(&list(&["https://a:2379", "http://b:2379"])).expect_err("mixed");
        assert!(e.to_string().contains("http://b:2379"), "{e}");
        assert!(
            one_scheme(&list(&["https://a:2379", "b:2379"])).is_err(),
            "no scheme is plain"
        );
    }
}
