//! Configuration of the proxy: one serde struct, every field documented,
//! loaded from TOML, secrets overridable from the environment, validated at
//! start with every problem listed at once.

use fencegate_core::LockName;
use fencegate_net::tls::{ClientTls, TlsConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Longest a graceful shutdown waits for in-flight requests.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Fence events kept per ring by default (`fence_events_kept`).
pub const DEFAULT_FENCE_EVENTS_KEPT: usize = 1000;

/// What a connection over `max_connections` gets: S3's retryable 503.
pub fn refusal() -> fencegate_net::Refusal {
    fencegate_net::Refusal::new(
        "application/xml",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>ServiceUnavailable</Code>\
         <Message>the proxy is serving as many connections as it may (max_connections); retry shortly</Message></Error>",
    )
}

/// `fencegate proxy --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Address the S3 endpoint listens on.
    pub listen: SocketAddr,
    /// SQLite file holding max_token per fence scope and the token bound to
    /// each multipart upload. Losing it lets a stale token through once:
    /// back it up with the lease database.
    pub db: PathBuf,
    /// The S3 server the proxy forwards to.
    pub backend: BackendConfig,
    /// S3 access keys clients sign requests with (SigV4).
    pub clients: Vec<ClientKey>,
    /// Accept unsigned (anonymous) requests. Writes still need a fencing
    /// token; reads are open to anyone who can reach the port.
    pub allow_anonymous: bool,
    /// Keys shared with the lease service to verify signed tokens and
    /// lease-bound credentials, every key in any order (during a rotation
    /// the lease service may sign with any of them). Override with
    /// `FENCEGATE_SIGNING_KEYS` (comma separated).
    pub signing_keys: Vec<String>,
    /// Accept plain decimal tokens (`Fencing-Token: 7`) from clients you
    /// trust. Default false: a token's number is public (every refusal
    /// sends `Fencing-Max-Token`), so a plain number proves nothing; it
    /// protects against honest stale writers only, never against a client
    /// that echoes `Fencing-Max-Token` or makes a number up (which locks
    /// every real holder out). Without `signing_keys` it must be set to
    /// true explicitly.
    pub accept_unsigned_tokens: Option<bool>,
    /// The lease service. Asked, after each raise of a lock's max, whose
    /// lease the new token is, so fence events name the zombie's lease
    /// owner and the holder (off the write path; nothing waits for it).
    /// With `accept_unsigned_tokens = true` also asked whether a plain
    /// token is the lock's current token (once per new number at or above
    /// the max), so made-up numbers are refused; still no protection
    /// against a client that echoes the current number.
    ///
    /// A lease service on etcd with several replicas: their URLs separated
    /// by commas, tried in turn (a question moves on when a replica cannot
    /// be reached, times out or answers 503), all `https://` or all
    /// `http://`. Override with `FENCEGATE_LOCKSVC_URL`.
    pub locksvc_url: Option<String>,
    /// API key for `locksvc_url`, if the lease service requires one.
    /// Override with `FENCEGATE_API_KEY`.
    pub locksvc_api_key: Option<String>,
    /// PEM file of the CA certificate(s) to trust for an `https://`
    /// `locksvc_url`, instead of the system's roots. Override with
    /// `FENCEGATE_CA_FILE`.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub locksvc_ca_file: Option<PathBuf>,
    /// PEM client certificate the proxy presents to a lease service that
    /// requires one (its `tls.client_ca_file`); with
    /// `locksvc_client_key_file`. Override with `FENCEGATE_CLIENT_CERT`.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub locksvc_client_cert_file: Option<PathBuf>,
    /// PEM private key of `locksvc_client_cert_file`. Override with
    /// `FENCEGATE_CLIENT_KEY`.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub locksvc_client_key_file: Option<PathBuf>,
    /// Fence scopes: a bucket, or a key prefix in a bucket, bound to a lock.
    /// Empty: every bucket is its own scope, fenced by the lock named like
    /// the bucket.
    pub scopes: Vec<ScopeConfig>,
    /// Locks whose tokens an election the cluster already runs issues
    /// (Patroni's leader key, etcd's election and lock recipes), instead
    /// of the lease service: the token is the revision the holder's term
    /// began at, checked with the election on every write.
    pub elections: Vec<crate::election::ElectionConfig>,
    /// What happens to writes outside every configured scope.
    pub unscoped_writes: UnscopedPolicy,
    /// Bucket for the start-up probe of conditional writes. Default: the
    /// first scope's bucket. Without either, each bucket is probed before
    /// its first fenced write.
    pub probe_bucket: Option<String>,
    /// Serve fenced traffic even if the backend ignores If-Match /
    /// If-None-Match on PutObject. Then only the proxy enforces the fence:
    /// one proxy replica, and nothing else may write to the bucket.
    pub accept_weak_backend: bool,
    /// Header families a write may carry that change what a refused
    /// operation would (`acl`, `object_lock`, `tagging`,
    /// `website_redirect`, `encryption`, `request_payer`,
    /// `expected_bucket_owner`; see `write_headers`). Default: none, so
    /// `x-amz-acl: public-read` on a PutObject is refused as PutObjectAcl
    /// is. Customer-key encryption (SSE-C) is refused whatever is allowed.
    pub allow_write_headers: Vec<crate::write_headers::Family>,
    /// Most keys whose ETag and token the proxy remembers (a bounded cache,
    /// about 380 bytes a key; a miss costs one HEAD, or, for a small
    /// PutObject of a key that exists, a refused PUT, the HEAD and the PUT
    /// again).
    pub etag_cache_entries: usize,
    /// Fence events (refused writes) kept in memory for
    /// `/_fencegate/events` and the status page: the newest this many of
    /// each kind (stale, cut, forged, unscoped).
    pub fence_events_kept: usize,
    /// Who may read the status page (`/_fencegate/`) and the fence events
    /// (`/_fencegate/events`), by HTTP Basic: a name and a password of
    /// their own, never an S3 secret (a browser sends Basic credentials with
    /// every reload). Without any, the page is open if `allow_anonymous`,
    /// and closed otherwise. Override with `FENCEGATE_VIEWERS`
    /// (`name:password,...`).
    pub viewers: Vec<Viewer>,
    /// Largest XML request body (CompleteMultipartUpload, DeleteObjects,
    /// CreateBucket). These bodies are read whole before they are parsed.
    pub max_xml_body_bytes: usize,
    /// Most bytes of XML request bodies held at once, over all requests:
    /// a request that would go over waits for none of it and gets a
    /// retryable 503 SlowDown, so concurrent large bodies cannot exhaust
    /// memory. At least `max_xml_body_bytes`.
    pub max_buffered_body_bytes: usize,
    /// A client that sends nothing for this long in the middle of a
    /// request body gets 400 RequestTimeout and its write is dropped, so a
    /// vanished client cannot hold its key. Seconds, at least 1.
    pub client_idle_timeout_secs: u64,
    /// Domains under which clients may use virtual-hosted-style addressing
    /// (`<bucket>.<domain>`); the domain itself and every other host (IP
    /// addresses included) are path style.
    pub virtual_host_domains: Vec<String>,
    /// Host names the proxy answers to on its pages (`/_fencegate/...`,
    /// but `health`) and to anonymous requests, besides IP addresses,
    /// `localhost`, `*.localhost` and the `virtual_host_domains` (and
    /// their subdomains): exact names or `*.domain`; `"*"` for any. A web
    /// page that reaches the proxy through DNS rebinding sends its own
    /// name, and gets 421. Signed S3 requests are not checked (no page can
    /// sign them).
    pub allowed_hosts: Vec<String>,
    /// Create the database if it is missing (`--create-db`; `fencegate
    /// dev`). Not a config key: a missing database on a normal start is
    /// a lost one, and the proxy refuses to start.
    #[serde(skip)]
    pub create_db: bool,
    /// With `create_db`, the least max of every lock in the new database
    /// (`--token-floor`): above every token ever issued, after a loss.
    #[serde(skip)]
    pub token_floor: u64,
    /// Longest a client may take to send a request's headers, counted from
    /// their first byte (for a new connection: from the accept, TLS
    /// handshake included); the connection is then closed. A head fits in
    /// one round trip on any working network, so 10 s only cuts clients
    /// that stall or trickle. Seconds, at least 1.
    pub header_read_timeout_secs: u64,
    /// A keep-alive connection with no request in flight and nothing
    /// received for this long is closed. 60 s, like common load balancers:
    /// long enough for a client's next request, short enough that idle
    /// connections do not pile up. Seconds, at least 1.
    pub idle_timeout_secs: u64,
    /// Most client connections served at once. One more gets `503
    /// ServiceUnavailable` (`Connection: close`) and is closed; service
    /// resumes as connections close. A backup job opens a few connections
    /// (rclone: 4 transfers + 8 checkers), so 1024 serves ~100 jobs at
    /// once; each connection may also hold one to the backend, so the
    /// open-file limit must exceed twice this (checked at start).
    pub max_connections: usize,
    /// Most of those from one client address (IPv6: one /64); more get
    /// the same 503. Connections are taken before a request can prove
    /// anything, so they are shared out per address: no address can take
    /// the others' part. Default: a quarter of `max_connections`. Clients
    /// behind one address (a NAT, one host) share its part.
    pub max_connections_per_address: Option<usize>,
    /// Threads that serve client connections, each with an event loop of
    /// its own: a connection, its requests and their backend connections
    /// stay on one thread, as in nginx's workers (less CPU per request
    /// than sharing the work between threads). 0: one per core.
    pub serving_threads: usize,
    /// Serve HTTPS (S3 clients then need the CA of the certificate).
    pub tls: TlsConfig,
    /// Run as one of several replicas sharing their fences and upload
    /// bindings through etcd (ARCHITECTURE.md, "Replicas"). Without it the
    /// proxy is the only replica and keeps them in `db`.
    pub cluster: Option<crate::state::cluster::ClusterConfig>,
}

/// The S3 server behind the proxy.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendConfig {
    /// Endpoint URL, e.g. `http://minio:9000` or `https://s3.eu-west-1.amazonaws.com`.
    pub endpoint: String,
    /// Region to sign for.
    pub region: String,
    /// Backend access key. Override with `FENCEGATE_BACKEND_ACCESS_KEY`.
    pub access_key: String,
    /// Backend secret key. Override with `FENCEGATE_BACKEND_SECRET_KEY`.
    pub secret_key: String,
    /// Path-style addressing (MinIO and most S3-compatible servers need it).
    pub path_style: bool,
    /// How long the backend has to answer a request once it is fully sent
    /// (for an upload: from its last byte), in seconds. A write not
    /// answered in time gets the client a retryable 503, but it may still
    /// land, so it keeps holding back newer tokens of its lock (see
    /// `store_decision_secs`).
    pub timeout_secs: u64,
    /// How long the store may still commit a request after the proxy closed
    /// its connection, in seconds. A write that timed out holds back a raise
    /// of its lock until the store answers, or until its connection is
    /// closed (at once when a raise wants in) and this much time has passed.
    pub store_decision_secs: u64,
}

/// A client credential pair for SigV4.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientKey {
    pub access_key: String,
    pub secret_key: String,
}

/// A reader of the status page: a name and a password (at least 12
/// characters).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Viewer {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for Viewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Viewer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientKey")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// A bucket or prefix fenced by one lock.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeConfig {
    pub bucket: String,
    /// Key prefix; empty or absent means the whole bucket.
    #[serde(default)]
    pub prefix: String,
    /// Lock whose tokens fence this scope.
    pub lock: String,
}

impl ScopeConfig {
    /// The scope `prefix` of `bucket` (`""`: the whole bucket), fenced by
    /// `lock`.
    pub fn new(bucket: &str, prefix: &str, lock: &str) -> ScopeConfig {
        ScopeConfig {
            bucket: bucket.into(),
            prefix: prefix.into(),
            lock: lock.into(),
        }
    }
}

/// Policy for writes that fall in no configured scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum UnscopedPolicy {
    /// Refuse them (403 with a message naming the configured scopes).
    #[default]
    Deny,
    /// Fence them by the lock named like their bucket, as if unconfigured.
    BucketLock,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            db: PathBuf::from("fencegate-proxy.db"),
            backend: BackendConfig::default(),
            clients: Vec::new(),
            allow_anonymous: false,
            signing_keys: Vec::new(),
            accept_unsigned_tokens: None,
            elections: Vec::new(),
            locksvc_url: None,
            locksvc_api_key: None,
            locksvc_ca_file: None,
            locksvc_client_cert_file: None,
            locksvc_client_key_file: None,
            scopes: Vec::new(),
            unscoped_writes: UnscopedPolicy::Deny,
            probe_bucket: None,
            accept_weak_backend: false,
            allow_write_headers: Vec::new(),
            etag_cache_entries: 100_000,
            fence_events_kept: DEFAULT_FENCE_EVENTS_KEPT,
            viewers: Vec::new(),
            max_xml_body_bytes: 8 * 1024 * 1024,
            max_buffered_body_bytes: 16 * 1024 * 1024,
            client_idle_timeout_secs: 60,
            virtual_host_domains: vec!["localhost".into()],
            allowed_hosts: Vec::new(),
            create_db: false,
            token_floor: 0,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_connections: 1024,
            max_connections_per_address: None,
            serving_threads: 0,
            tls: TlsConfig::default(),
            cluster: None,
        }
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            endpoint: String::new(),
            region: "us-east-1".into(),
            access_key: String::new(),
            secret_key: String::new(),
            path_style: true,
            timeout_secs: 60,
            store_decision_secs: 10,
        }
    }
}

pub const ENV_SIGNING_KEYS: &str = "FENCEGATE_SIGNING_KEYS";
pub const ENV_BACKEND_ACCESS_KEY: &str = "FENCEGATE_BACKEND_ACCESS_KEY";
pub const ENV_BACKEND_SECRET_KEY: &str = "FENCEGATE_BACKEND_SECRET_KEY";
/// `ACCESS:SECRET[,ACCESS:SECRET...]`, replacing `clients`.
pub const ENV_CLIENT_KEYS: &str = "FENCEGATE_CLIENT_KEYS";
/// `A:B,C:D` as pairs (an item without `:` is left out).
fn colon_pairs(v: &str) -> impl Iterator<Item = (String, String)> {
    split_list(v).into_iter().filter_map(|pair| {
        let (a, b) = pair.split_once(':')?;
        Some((a.to_owned(), b.to_owned()))
    })
}

/// The status page's readers (`viewers`), as `name:password,...`.
pub const ENV_VIEWERS: &str = "FENCEGATE_VIEWERS";
/// The lease service's URL, or its replicas' URLs separated by commas
/// (`locksvc_url`; empty: none).
pub const ENV_LOCKSVC_URL: &str = "FENCEGATE_LOCKSVC_URL";
/// The lease service API key (`locksvc_api_key`); the CLI reads it too.
pub const ENV_LOCKSVC_API_KEY: &str = "FENCEGATE_API_KEY";
/// The CA of an `https://` lease service (`locksvc_ca_file`); the CLI reads
/// it too.
pub const ENV_LOCKSVC_CA_FILE: &str = "FENCEGATE_CA_FILE";
/// The client certificate for the lease service
/// (`locksvc_client_cert_file`); the CLI reads it too.
pub const ENV_LOCKSVC_CLIENT_CERT: &str = "FENCEGATE_CLIENT_CERT";
/// Its key (`locksvc_client_key_file`); the CLI reads it too.
pub const ENV_LOCKSVC_CLIENT_KEY: &str = "FENCEGATE_CLIENT_KEY";

impl ProxyConfig {
    /// Reads TOML text and applies environment overrides.
    pub fn from_toml(text: &str) -> anyhow::Result<ProxyConfig> {
        let mut c: ProxyConfig = toml::from_str(text)?;
        c.apply_env(|k| std::env::var(k).ok());
        Ok(c)
    }

    /// Applies environment overrides read through `var`.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(v) = var(ENV_SIGNING_KEYS) {
            self.signing_keys = split_list(&v);
        }
        if let Some(v) = var(ENV_LOCKSVC_URL) {
            self.locksvc_url = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = var(ENV_LOCKSVC_API_KEY) {
            self.locksvc_api_key = Some(v);
        }
        if let Some(v) = var(ENV_LOCKSVC_CA_FILE).filter(|v| !v.is_empty()) {
            self.locksvc_ca_file = Some(v.into());
        }
        if let Some(v) = var(ENV_LOCKSVC_CLIENT_CERT).filter(|v| !v.is_empty()) {
            self.locksvc_client_cert_file = Some(v.into());
        }
        if let Some(v) = var(ENV_LOCKSVC_CLIENT_KEY).filter(|v| !v.is_empty()) {
            self.locksvc_client_key_file = Some(v.into());
        }
        self.tls.apply_env(&var);
        crate::state::cluster::ClusterConfig::apply_env(&mut self.cluster, &var);
        if let Some(v) = var(ENV_BACKEND_ACCESS_KEY) {
            self.backend.access_key = v;
        }
        if let Some(v) = var(ENV_BACKEND_SECRET_KEY) {
            self.backend.secret_key = v;
        }
        if let Some(v) = var(ENV_CLIENT_KEYS) {
            self.clients = colon_pairs(&v)
                .map(|(access_key, secret_key)| ClientKey {
                    access_key,
                    secret_key,
                })
                .collect();
        }
        if let Some(v) = var(ENV_VIEWERS) {
            self.viewers = colon_pairs(&v)
                .map(|(name, password)| Viewer { name, password })
                .collect();
        }
    }

    /// How the issuer check reaches an `https://` lease service.
    pub fn locksvc_tls(&self) -> ClientTls {
        ClientTls {
            ca_file: self.locksvc_ca_file.clone(),
            cert_file: self.locksvc_client_cert_file.clone(),
            key_file: self.locksvc_client_key_file.clone(),
        }
    }

    /// The connection settings of the proxy's listener (`tls` loaded).
    pub fn server_options(&self) -> anyhow::Result<fencegate_net::ServerOptions> {
        Ok(fencegate_net::ServerOptions {
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_secs),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_secs),
            max_connections: self.max_connections,
            max_connections_per_address: self
                .max_connections_per_address
                .unwrap_or_else(|| fencegate_net::default_share(self.max_connections)),
            tls: self.tls.server_config()?,
            refusal: refusal(),
            drain_timeout: DRAIN_TIMEOUT,
            workers: Some(match self.serving_threads {
                0 => fencegate_net::Workers::per_core("proxy-serve")?,
                n => fencegate_net::Workers::start(n, "proxy-serve")?,
            }),
            // Set where the handlers are made to run to their end
            // (`server::serve_detached`).
            ..fencegate_net::ServerOptions::default()
        })
    }

    /// The names the proxy answers to (see `allowed_hosts`).
    pub fn answered_hosts(&self) -> anyhow::Result<fencegate_net::browser::AllowedHosts> {
        let mut entries = self.allowed_hosts.clone();
        for d in &self.virtual_host_domains {
            entries.push(d.clone());
            entries.push(format!("*.{d}"));
        }
        fencegate_net::browser::AllowedHosts::new(&entries).map_err(|e| anyhow::anyhow!(e))
    }

    /// Whether plain decimal tokens are accepted (see the field).
    pub fn unsigned_tokens_accepted(&self) -> bool {
        self.accept_unsigned_tokens.unwrap_or(false)
    }

    /// Every problem with this configuration, in one list.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.backend.endpoint.is_empty() {
            p.push("backend.endpoint is empty: set the URL of the S3 server to protect".into());
        } else if !(self.backend.endpoint.starts_with("http://")
            || self.backend.endpoint.starts_with("https://"))
        {
            p.push(format!(
                "backend.endpoint {:?} must start with http:// or https://",
                self.backend.endpoint
            ));
        }
        if self.backend.access_key.is_empty() || self.backend.secret_key.is_empty() {
            p.push(format!(
                "backend.access_key and backend.secret_key are required (or {ENV_BACKEND_ACCESS_KEY} / {ENV_BACKEND_SECRET_KEY})"
            ));
        }
        let elections_sign = self.elections.iter().any(|e| !e.signing_keys.is_empty());
        if self.clients.is_empty()
            && !self.allow_anonymous
            && self.signing_keys.is_empty()
            && !elections_sign
        {
            p.push(format!(
                "nobody could use the proxy: add [[clients]] (or {ENV_CLIENT_KEYS}), allow anonymous access, or set signing_keys (the lease service's, or an election's) so bound credentials work"
            ));
        }
        for (i, v) in self.viewers.iter().enumerate() {
            if v.name.is_empty() || v.name.contains(':') || v.password.len() < 12 {
                p.push(format!(
                    "viewers[{i}]: name must be set (without ':') and password be at least 12 characters"
                ));
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            if c.access_key.is_empty() || c.secret_key.len() < 8 {
                p.push(format!(
                    "clients[{i}]: access_key must be set and secret_key be at least 8 characters"
                ));
            }
        }
        for (i, k) in self.signing_keys.iter().enumerate() {
            if k.len() < fencegate_core::token::MIN_KEY_LEN {
                p.push(format!(
                    "signing_keys[{i}] is {} bytes; keys must be at least {} bytes",
                    k.len(),
                    fencegate_core::token::MIN_KEY_LEN
                ));
            }
        }
        let mut elected = std::collections::HashSet::new();
        for (i, e) in self.elections.iter().enumerate() {
            p.extend(e.problems(i));
            if !elected.insert(e.lock.as_str()) {
                p.push(format!(
                    "elections[{i}]: lock {} follows another election already; one election per lock",
                    e.lock
                ));
            }
        }
        if self.signing_keys.is_empty()
            && self.accept_unsigned_tokens != Some(true)
            && self.elections.is_empty()
        {
            p.push(format!(
                "signing_keys is empty: set the lease service's keys (or {ENV_SIGNING_KEYS}) so only tokens it signed are accepted, or accept_unsigned_tokens = true to accept plain numbers from clients you trust"
            ));
        }
        // The lease client's own rule (one scheme for every replica, so a
        // failover never sends the API key in clear), checked at start.
        let locksvc_urls = self
            .locksvc_url
            .as_deref()
            .map(fencegate_lease_api::Urls::parse);
        if let Some(Err(e)) = &locksvc_urls {
            p.push(format!("locksvc_url: {e}"));
        }
        for (i, c) in self.clients.iter().enumerate() {
            // Such a key would be read as lease-bound credentials: a token
            // with no lease behind it.
            if fencegate_core::credentials::is_lease_access_key(&c.access_key) {
                p.push(format!(
                    "clients[{i}].access_key starts with \"fgk<digits>.\" (like {:?}), which is reserved for lease-bound credentials",
                    fencegate_core::credentials::ACCESS_KEY_PREFIX
                ));
            }
        }
        if self.backend.timeout_secs == 0 {
            p.push("backend.timeout_secs must be at least 1".into());
        }
        if self.backend.store_decision_secs == 0 {
            p.push("backend.store_decision_secs must be at least 1: a store needs some time to commit a request it has received".into());
        }
        if self.client_idle_timeout_secs == 0 {
            p.push("client_idle_timeout_secs must be at least 1".into());
        }
        if self.header_read_timeout_secs == 0 {
            p.push("header_read_timeout_secs must be at least 1".into());
        }
        if self.idle_timeout_secs == 0 {
            p.push("idle_timeout_secs must be at least 1".into());
        }
        if self.serving_threads > 1024 {
            p.push("serving_threads must be at most 1024 (0: one per core)".into());
        }
        if self.max_connections == 0 {
            p.push("max_connections must be at least 1".into());
        }
        if self.max_connections_per_address == Some(0) {
            p.push("max_connections_per_address must be at least 1".into());
        }
        p.extend(self.tls.problems());
        let locksvc_tls = self.locksvc_tls();
        if locksvc_tls != ClientTls::default() {
            match &locksvc_urls {
                None => p.push(
                    "locksvc_ca_file / locksvc_client_cert_file / locksvc_client_key_file are set, but locksvc_url is not".into(),
                ),
                // Named above.
                Some(Err(_)) => {}
                Some(Ok(urls)) if !urls.is_https() => p.push(format!(
                    "locksvc_url \"{urls}\" is plain http, but TLS settings for the lease service are given: use https:// (tokens would otherwise travel in clear text)"
                )),
                Some(Ok(_)) => {
                    if let Err(e) = locksvc_tls.rustls_config() {
                        p.push(format!("lease service TLS: {e}"));
                    }
                }
            }
        }
        for h in &self.allowed_hosts {
            if let Some(why) = fencegate_net::browser::entry_problem(h) {
                p.push(format!("allowed_hosts: {h:?}: {why}"));
            }
        }
        for d in &self.virtual_host_domains {
            let valid = !d.is_empty()
                && d.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !valid {
                p.push(format!(
                    "virtual_host_domains: {d:?} is not a domain name (letters, digits, '-' and dots; no port)"
                ));
            }
        }
        // Where each (bucket, prefix) was first seen: one pass, for a
        // hundred thousand scopes as for three.
        let mut first = std::collections::HashMap::with_capacity(self.scopes.len());
        for (i, s) in self.scopes.iter().enumerate() {
            if let Some(j) = first.insert((s.bucket.as_str(), s.prefix.as_str()), i) {
                p.push(format!(
                    "scopes[{j}] and scopes[{i}] both cover bucket {:?} prefix {:?}",
                    s.bucket, s.prefix
                ));
            }
            if s.bucket.is_empty() || s.bucket.contains('/') {
                p.push(format!(
                    "scopes[{i}].bucket {:?} is not a bucket name (empty, or contains '/': put key prefixes in `prefix`)",
                    s.bucket
                ));
            }
            if let Err(e) = LockName::new(&s.lock) {
                p.push(format!("scopes[{i}].lock: {e}"));
            }
        }
        if !(1..=100_000).contains(&self.fence_events_kept) {
            p.push("fence_events_kept must be between 1 and 100000".into());
        }
        if self.etag_cache_entries == 0 {
            p.push("etag_cache_entries must be at least 1".into());
        }
        if self.max_xml_body_bytes < 64 * 1024 {
            p.push("max_xml_body_bytes must be at least 65536".into());
        }
        if self.max_buffered_body_bytes < self.max_xml_body_bytes {
            p.push("max_buffered_body_bytes must be at least max_xml_body_bytes".into());
        }
        if let Some(c) = &self.cluster {
            p.extend(c.problems(std::time::Duration::from_secs(
                self.backend.store_decision_secs,
            )));
        }
        p
    }

    /// Fails with every problem listed, or returns the config unchanged.
    pub fn validated(self) -> anyhow::Result<ProxyConfig> {
        fencegate_net::problems::none("proxy", self.problems())?;
        Ok(self)
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails unless `c`'s problems mention every one of `needles`.
    #[track_caller]
    fn assert_problems(c: &ProxyConfig, needles: &[&str]) {
        fencegate_testkit::assert_mentions(&c.problems().join("\n"), needles);
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let c: ProxyConfig = toml::from_str(
            r#"
            signing_keys = ["short"]
            virtual_host_domains = ["localhost:9000"]
            [[clients]]
            access_key = "fgk1.5.99.b"
            secret_key = "s"
            [[scopes]]
            bucket = "b"
            lock = "bad lock"
            [[scopes]]
            bucket = "b"
            lock = "ok"
            "#,
        )
        .expect("parses");
        assert_problems(
            &c,
            &[
                "backend.endpoint",
                "backend.access_key",
                "signing_keys[0]",
                "scopes[0].lock",
                "both cover",
                "virtual_host_domains",
                "clients[0].access_key",
            ],
        );
    }

    #[test]
    fn without_keys_tokens_are_trusted_or_checked_with_the_lease_service() {
        let base = r#"
            allow_anonymous = true
            [backend]
            endpoint = "http://127.0.0.1:9100"
            access_key = "a"
            secret_key = "b"
        "#;
        let problems = |extra: &str| {
            toml::from_str::<ProxyConfig>(&format!("{extra}\n{base}"))
                .expect("parses")
                .problems()
        };
        assert!(
            problems("")
                .iter()
                .any(|p| p.contains("signing_keys is empty"))
        );
        assert_eq!(
            problems("accept_unsigned_tokens = true"),
            Vec::<String>::new()
        );
        // With signed tokens only, the lease service names owners in
        // fence events.
        assert!(
            problems(&format!(
                "locksvc_url = \"http://127.0.0.1:7070\"\nsigning_keys = [\"{}\"]",
                "k".repeat(32)
            ))
            .is_empty()
        );
        assert_eq!(
            problems("locksvc_url = \"http://127.0.0.1:7070\"\naccept_unsigned_tokens = true"),
            Vec::<String>::new()
        );
        let bad_url = problems("locksvc_url = \"127.0.0.1:7070\"\naccept_unsigned_tokens = true");
        assert!(
            bad_url.iter().any(|p| p.contains("locksvc_url")),
            "{bad_url:?}"
        );
    }

    #[test]
    fn unsigned_tokens_need_an_explicit_yes() {
        let mut c = ProxyConfig::default();
        assert!(!c.unsigned_tokens_accepted());
        assert!(
            c.problems()
                .iter()
                .any(|p| p.contains("signing_keys is empty"))
        );
        c.accept_unsigned_tokens = Some(true);
        assert!(c.unsigned_tokens_accepted());
        assert!(
            !c.problems()
                .iter()
                .any(|p| p.contains("signing_keys is empty"))
        );
    }

    #[test]
    fn lease_service_tls_needs_an_https_url_and_connection_limits_are_checked() {
        let mut c = ProxyConfig {
            accept_unsigned_tokens: Some(true),
            locksvc_ca_file: Some("/nonexistent/ca.crt".into()),
            header_read_timeout_secs: 0,
            max_connections: 0,
            ..ProxyConfig::default()
        };
        assert_problems(
            &c,
            &[
                "but locksvc_url is not",
                "header_read_timeout_secs",
                "max_connections",
            ],
        );
        c.locksvc_url = Some("http://127.0.0.1:7070".into());
        assert_problems(&c, &["is plain http"]);
        c.locksvc_url = Some("https://127.0.0.1:7070".into());
        assert_problems(&c, &["ca.crt: cannot read it"]);
        // "" is unset, as the example configs show it.
        let c: ProxyConfig =
            toml::from_str("locksvc_ca_file = \"\"\n[tls]\ncert_file = \"\"").expect("parses");
        assert_eq!(c.locksvc_ca_file, None);
        assert!(!c.tls.enabled());
    }

    #[test]
    fn locksvc_url_may_list_replicas_each_checked() {
        let mut c = ProxyConfig::default();
        c.apply_env(|k| (k == ENV_LOCKSVC_URL).then(|| "http://a:7070, http://b:7070/".to_owned()));
        assert_eq!(
            c.locksvc_url.as_deref(),
            Some("http://a:7070, http://b:7070/")
        );
        assert!(!c.problems().iter().any(|p| p.contains("locksvc_url")));
        c.locksvc_url = Some("http://a:7070,b:7070".into());
        assert!(
            c.problems().iter().any(|p| p
                .contains("locksvc_url: the lease service URL \"b:7070\" must start with http://")),
            "{:?}",
            c.problems()
        );
        c.locksvc_url = Some(" , ".into());
        assert!(
            c.problems()
                .iter()
                .any(|p| p.contains("locksvc_url: the list of lease service URLs is empty"))
        );
        // With or without TLS settings, a failover must not go from
        // https:// to http://.
        c.locksvc_url = Some("https://a:7070,http://b:7070".into());
        let mixed = "locksvc_url: the lease service URLs mix http:// and https://: http://b:7070 is plain HTTP while https://a:7070 is HTTPS";
        let p = c.problems();
        assert!(p.iter().any(|p| p.starts_with(mixed)), "{p:?}");
        c.locksvc_ca_file = Some("/ca.pem".into());
        let p = c.problems();
        assert!(p.iter().any(|p| p.starts_with(mixed)), "{p:?}");
        assert!(!p.iter().any(|p| p.contains("is plain http")), "{p:?}");
        c.locksvc_url = Some("http://a:7070,http://b:7070".into());
        assert!(c.problems().iter().any(|p| p.contains("is plain http")));
        c.apply_env(|k| (k == ENV_LOCKSVC_URL).then(String::new));
        assert_eq!(c.locksvc_url, None, "an empty variable unsets it");
    }

    #[test]
    fn env_overrides_secrets() {
        let mut c = ProxyConfig::default();
        c.apply_env(|k| match k {
            ENV_CLIENT_KEYS => Some("AK1:secret-one,AK2:secret-two".into()),
            ENV_BACKEND_SECRET_KEY => Some("backend-secret".into()),
            _ => None,
        });
        assert_eq!(c.clients.len(), 2);
        assert_eq!(c.clients[1].access_key, "AK2");
        assert_eq!(c.backend.secret_key, "backend-secret");
    }
}
