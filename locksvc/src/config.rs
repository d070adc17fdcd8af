//! Configuration of the lease service: one serde struct, every field
//! documented, loaded from TOML, secrets overridable from the environment,
//! validated at start with every problem listed at once.

pub use crate::auth::ApiKey;
use crate::auth::LockPattern;
use fencegate_etcd::nonempty;
use fencegate_net::tls::TlsConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `fencegate locksvc --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocksvcConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// SQLite file holding the token counter and the leases. Losing it
    /// would let tokens go backwards: back it up, never delete it.
    pub db: PathBuf,
    /// Create `db` if it is missing (`--create-db`; `fencegate dev`). Not
    /// a config key: a missing database on a normal start is a lost one,
    /// and the service refuses to start.
    #[serde(skip)]
    pub create_db: bool,
    /// The counter of a new database starts here (`--token-floor`; an
    /// existing one's is raised to it): above every token ever issued,
    /// after a loss.
    #[serde(skip)]
    pub token_floor: u64,
    /// HMAC keys (at least 16 bytes each) that sign fencing tokens; the first
    /// signs, all verify. Shared with the proxy. Override with the
    /// environment variable `FENCEGATE_SIGNING_KEYS` (comma separated) so
    /// keys need not live in a file.
    pub signing_keys: Vec<String>,
    /// Bearer API keys accepted from clients, each with the locks it may
    /// use. Empty: no authentication. An entry is either a plain string (the
    /// key may use every lock, as before scopes existed) or a table
    /// `{ key = "...", locks = ["db-a", "backup-*"] }` (only locks matching
    /// one of the patterns; `*` matches any run of characters). Override
    /// with `FENCEGATE_LOCKSVC_API_KEYS` (comma separated, every lock) and
    /// `FENCEGATE_LOCKSVC_SCOPED_API_KEYS` (`KEY:PATTERN|PATTERN,...`); if
    /// either is set, the two together replace this list.
    pub api_keys: Vec<ApiKey>,
    /// TTL used when an acquire does not name one.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// Shortest TTL a client may ask for. Short leases are legitimate (tests,
    /// fast failover); expiry is exact to the millisecond, not scanned.
    #[serde(with = "humantime_serde")]
    pub min_ttl: Duration,
    /// Longest TTL a client may ask for.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// Longest an acquire may wait in line for a held lock.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Most clients waiting in line for one lock: with 2, two acquires
    /// wait and a third is refused (429 `TooManyWaiters`), on SQLite and on
    /// etcd alike. One caller may hold at most a quarter of a lock's places
    /// (rounded up, at least one; 256 of the default 1024), so a client
    /// that is not the holder cannot fill the line and shut the rightful
    /// next holder out. A caller is its API key, or without `api_keys` its
    /// address (an IPv6 /64); clients behind one reverse proxy or NAT are
    /// one caller, so give them API keys of their own.
    pub max_waiters_per_lock: usize,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long the lease-bound S3 credentials returned with a lease stay
    /// valid (they also stop working for writes as soon as a newer token is
    /// admitted in the scope).
    #[serde(with = "humantime_serde")]
    pub credential_ttl: Duration,
    /// Longest a client may take to send a request's headers, counted from
    /// their first byte (for a new connection: from the accept, TLS
    /// handshake included); the connection is then closed. A head fits in
    /// one round trip on any working network, so 10s only cuts clients
    /// that stall or trickle.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Longest a request waits for the SQLite database (its commit, or
    /// the commits queued before it) beyond its own `wait_ms`: then 503
    /// StorageUnavailable, as etcd calls are bounded by its
    /// `request_timeout`. A stalled disk (a frozen filesystem, a dying
    /// device) then costs clients an answer, not a hung connection; an
    /// acquire that gave up before it was applied is not applied.
    #[serde(with = "humantime_serde")]
    pub storage_timeout: Duration,
    /// A keep-alive connection with no request in flight and nothing
    /// received for this long is closed. 60s: above `fencegate run`'s
    /// renewal interval for TTLs up to 3 minutes (a third of the TTL), so
    /// renewals reuse their connection. A request in flight (an acquire
    /// waiting in line) is never cut.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most client connections served at once. One more gets `503`
    /// `TooManyConnections` (JSON, `Connection: close`) and is closed;
    /// service resumes as connections close. Every acquire waiting in line
    /// holds its connection, so this also bounds waiters across all locks:
    /// 1024, like `max_waiters_per_lock`. The open-file limit must exceed it
    /// (checked at start).
    pub max_connections: usize,
    /// Most of those from one client address (IPv6: one /64); more get
    /// the same 503. Connections are taken before a request can prove
    /// anything, so they are shared out per address: no address can take
    /// the others' part. Default: a quarter of `max_connections`. Clients
    /// behind one address (a NAT, one host) share its part.
    pub max_connections_per_address: Option<usize>,
    /// Serve HTTPS, and optionally require client certificates
    /// (`client_ca_file`). Tokens, lease-bound credentials and API keys are
    /// bearer secrets: serve TLS whenever clients are not on the same host.
    pub tls: TlsConfig,
    /// Host names the service answers to, besides the ones it always does:
    /// IP addresses, `localhost` and `*.localhost`. A request whose `Host`
    /// names anything else is refused (421 `HostNotAllowed`), whatever its
    /// credentials: that is what a web page the operator opens sends when
    /// it reaches the service by DNS rebinding. List the names clients use
    /// in their URLs (`"locks.internal"`, the TLS certificate's name, a
    /// container's service name such as `"locksvc"`); `"*.example.com"`
    /// is every subdomain of `example.com`; `"*"` turns the check off.
    /// Case and a trailing dot do not matter; ports are not compared.
    /// `/health` answers any host. Override with
    /// `FENCEGATE_LOCKSVC_ALLOWED_HOSTS` (comma separated).
    pub allowed_hosts: Vec<String>,
    /// Serve the locks from an etcd cluster instead of the SQLite file
    /// `db`: several replicas with the same `[etcd]` table serve the same
    /// locks, and any of them can answer any request. Absent: SQLite. Set
    /// or override with `FENCEGATE_ETCD_ENDPOINTS` (comma separated) and the
    /// other `FENCEGATE_ETCD_*` variables.
    pub etcd: Option<EtcdConfig>,
}

/// The `[etcd]` table: where the locks live when they are not in SQLite.
/// Its `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:2379`, or
    /// `https://` with `ca_file`). Every member may be listed: requests go
    /// to whichever answers. Override with `FENCEGATE_ETCD_ENDPOINTS`.
    pub endpoints: Vec<String>,
    /// Key prefix of everything this service stores; it must start and end
    /// with `/`. Replicas serving the same locks share it. Override with
    /// `FENCEGATE_ETCD_PREFIX`.
    pub prefix: String,
    /// Tokens are `epoch << 47 | revision` of the grant's etcd transaction.
    /// Raise it (never lower it) when migrating from SQLite (`fencegate
    /// locksvc migrate` says to which value) or after restoring etcd from a
    /// backup, whose revisions restart below tokens already issued. 0 to
    /// 65535. Replicas refuse to start, and to grant, with an epoch below the
    /// highest one the cluster has seen. Override with
    /// `FENCEGATE_ETCD_EPOCH`.
    pub epoch: u16,
    /// etcd user (etcd auth). Override with `FENCEGATE_ETCD_USERNAME`.
    pub username: Option<String>,
    /// Its password. Override with `FENCEGATE_ETCD_PASSWORD`, so it need
    /// not live in a file.
    pub password: Option<fencegate_etcd::Secret>,
    /// PEM CA certificate(s) to trust for `https://` endpoints instead of
    /// the system roots.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd's mutual TLS (with `key_file`).
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub key_file: Option<PathBuf>,
    /// Longest one etcd request may take; then the client gets `503
    /// StorageUnavailable`. It bounds how long requests hang when the
    /// cluster has lost its quorum or its leader is paused.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest a connection to one member may take to open.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How often each replica deletes the records of leases that expired
    /// without a release (an acquire of the same lock also does).
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Environment overrides that could not be applied.
    #[serde(skip)]
    env_problems: Vec<String>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            prefix: "/fencegate/v1/".into(),
            epoch: 0,
            username: None,
            password: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(30),
            env_problems: Vec::new(),
        }
    }
}

/// Environment variables of the `[etcd]` table.
pub const ENV_ETCD_ENDPOINTS: &str = "FENCEGATE_ETCD_ENDPOINTS";
pub const ENV_ETCD_PREFIX: &str = "FENCEGATE_ETCD_PREFIX";
pub const ENV_ETCD_EPOCH: &str = "FENCEGATE_ETCD_EPOCH";
pub const ENV_ETCD_USERNAME: &str = "FENCEGATE_ETCD_USERNAME";
pub const ENV_ETCD_PASSWORD: &str = "FENCEGATE_ETCD_PASSWORD";

impl EtcdConfig {
    /// The user and password to authenticate with, if both are set.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        Some((nonempty(&self.username)?, nonempty(&self.password)?))
    }

    /// How to reach the cluster.
    pub fn connection(&self) -> fencegate_etcd::Connection {
        fencegate_etcd::Connection {
            endpoints: self.endpoints.clone(),
            credentials: self
                .credentials()
                .map(|(u, p)| (u.to_owned(), p.to_owned())),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
        }
    }

    /// Applies the `FENCEGATE_ETCD_*` overrides to `etcd`; setting
    /// endpoints creates the table.
    fn apply_env(etcd: &mut Option<EtcdConfig>, var: &impl Fn(&str) -> Option<String>) {
        if let Some(v) = var(ENV_ETCD_ENDPOINTS) {
            etcd.get_or_insert_with(EtcdConfig::default).endpoints = split_list(&v);
        }
        let Some(c) = etcd.as_mut() else { return };
        if let Some(v) = var(ENV_ETCD_PREFIX) {
            c.prefix = v;
        }
        if let Some(v) = var(ENV_ETCD_EPOCH) {
            match v.trim().parse() {
                Ok(epoch) => c.epoch = epoch,
                // Listed by `problems`, with the others.
                Err(_) => c.env_problems.push(format!(
                    "{ENV_ETCD_EPOCH}={v:?} is not an epoch: a whole number from 0 to 65535"
                )),
            }
        }
        if let Some(v) = var(ENV_ETCD_USERNAME) {
            c.username = Some(v);
        }
        if let Some(v) = var(ENV_ETCD_PASSWORD) {
            c.password = Some(v.into());
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut p = self.env_problems.clone();
        if self.endpoints.is_empty() {
            p.push(format!(
                "etcd.endpoints is empty: list the cluster's client URLs (or set {ENV_ETCD_ENDPOINTS})"
            ));
        }
        p.extend(self.connection().problems("etcd"));
        if !(self.prefix.starts_with('/') && self.prefix.ends_with('/') && self.prefix.len() > 1) {
            p.push(format!(
                "etcd.prefix {:?} must start and end with '/' (for example \"/fencegate/v1/\")",
                self.prefix
            ));
        }
        if self.credentials().is_none()
            && (nonempty(&self.username).is_some() || nonempty(&self.password).is_some())
        {
            p.push(format!(
                "etcd.username and etcd.password go together (password: {ENV_ETCD_PASSWORD})"
            ));
        }
        if self.request_timeout < Duration::from_millis(100) {
            p.push("etcd.request_timeout must be at least 100ms".into());
        }
        if self.connect_timeout < Duration::from_millis(100) {
            p.push("etcd.connect_timeout must be at least 100ms".into());
        }
        if self.sweep_interval < Duration::from_millis(100) {
            p.push("etcd.sweep_interval must be at least 100ms".into());
        }
        p
    }
}

impl Default for LocksvcConfig {
    fn default() -> Self {
        LocksvcConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            db: PathBuf::from("fencegate-locksvc.db"),
            create_db: false,
            token_floor: 0,
            signing_keys: Vec::new(),
            api_keys: Vec::new(),
            default_ttl: Duration::from_secs(30),
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(3600),
            max_wait: Duration::from_secs(300),
            max_waiters_per_lock: 1024,
            max_body_bytes: 16 * 1024,
            credential_ttl: Duration::from_secs(24 * 3600),
            header_read_timeout: Duration::from_secs(10),
            storage_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_address: None,
            tls: TlsConfig::default(),
            allowed_hosts: Vec::new(),
            etcd: None,
        }
    }
}

/// Environment variable overriding `allowed_hosts` (comma separated).
pub const ENV_ALLOWED_HOSTS: &str = "FENCEGATE_LOCKSVC_ALLOWED_HOSTS";
/// Environment variable overriding `signing_keys`.
pub const ENV_SIGNING_KEYS: &str = "FENCEGATE_SIGNING_KEYS";
/// Environment variable overriding `api_keys` with keys that may use every
/// lock.
pub const ENV_API_KEYS: &str = "FENCEGATE_LOCKSVC_API_KEYS";
/// Environment variable overriding `api_keys` with keys limited to lock
/// patterns: `KEY:PATTERN|PATTERN,KEY2:PATTERN`. Patterns cannot contain
/// `:` (lock names cannot), so the last `:` of an entry ends its key.
pub const ENV_SCOPED_API_KEYS: &str = "FENCEGATE_LOCKSVC_SCOPED_API_KEYS";

/// Parses one entry of [`ENV_SCOPED_API_KEYS`]. An entry without patterns
/// becomes a key with no locks, which `problems` reports.
fn scoped_key_from_env(entry: &str) -> ApiKey {
    match entry.rsplit_once(':') {
        Some((key, patterns)) => ApiKey {
            key: key.to_owned(),
            locks: patterns
                .split('|')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        },
        None => ApiKey {
            key: entry.to_owned(),
            locks: Vec::new(),
        },
    }
}

/// Splits a comma-separated list of secrets, dropping empty entries.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

impl LocksvcConfig {
    /// Reads TOML text and applies environment overrides.
    pub fn from_toml(text: &str) -> anyhow::Result<LocksvcConfig> {
        let mut config: LocksvcConfig = toml::from_str(text)?;
        config.apply_env(|k| std::env::var(k).ok());
        Ok(config)
    }

    /// Applies environment overrides read through `var`.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(v) = var(ENV_SIGNING_KEYS) {
            self.signing_keys = split_list(&v);
        }
        let plain = var(ENV_API_KEYS);
        let scoped = var(ENV_SCOPED_API_KEYS);
        if plain.is_some() || scoped.is_some() {
            let plain = plain.as_deref().map(split_list).unwrap_or_default();
            let scoped = scoped.as_deref().map(split_list).unwrap_or_default();
            self.api_keys = plain
                .into_iter()
                .map(ApiKey::every_lock)
                .chain(scoped.iter().map(|e| scoped_key_from_env(e)))
                .collect();
        }
        if let Some(v) = var(ENV_ALLOWED_HOSTS) {
            self.allowed_hosts = split_list(&v);
        }
        self.tls.apply_env(&var);
        EtcdConfig::apply_env(&mut self.etcd, &var);
    }

    /// The connection settings of the lease service's listener (`tls`
    /// loaded).
    pub fn server_options(&self) -> anyhow::Result<fencegate_net::ServerOptions> {
        Ok(fencegate_net::ServerOptions {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            max_connections_per_address: self
                .max_connections_per_address
                .unwrap_or_else(|| fencegate_net::default_share(self.max_connections)),
            tls: self.tls.server_config()?,
            refusal: fencegate_net::Refusal::new(
                "application/json",
                r#"{"error":{"code":"TooManyConnections","message":"the lease service is serving as many connections as it may (max_connections); retry shortly"}}"#,
            ),
            drain_timeout: Duration::from_secs(30),
            // Its work is one engine thread; the runtime only carries it.
            workers: None,
            // A client that ends its sending side has left: its acquire
            // waiting in line is dropped and stops waiting.
            half_close: false,
        })
    }

    /// Every problem with this configuration, in one list.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        // Flags of the SQLite backend, refused on etcd rather than ignored.
        if self.etcd.is_some() {
            if self.token_floor > 0 {
                p.push(
                    "--token-floor does not apply to the lease service on etcd (its tokens are the epoch and etcd's revision): after etcd lost data, raise etcd.epoch (FENCEGATE_ETCD_EPOCH) instead".to_owned(),
                );
            }
            if self.create_db {
                p.push(
                    "--create-db does not apply to the lease service on etcd (it keeps no database file): drop the flag".to_owned(),
                );
            }
        }
        if self.signing_keys.is_empty() {
            p.push(format!(
                "signing_keys is empty: set at least one key of 16+ bytes (or {ENV_SIGNING_KEYS})"
            ));
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
        if self.min_ttl.is_zero() {
            p.push("min_ttl must be above zero".into());
        }
        if self.min_ttl > self.max_ttl {
            p.push(format!(
                "min_ttl ({}) is above max_ttl ({})",
                humantime::format_duration(self.min_ttl),
                humantime::format_duration(self.max_ttl)
            ));
        }
        if self.default_ttl < self.min_ttl || self.default_ttl > self.max_ttl {
            p.push("default_ttl must lie between min_ttl and max_ttl".into());
        }
        if self.max_body_bytes < 256 {
            p.push("max_body_bytes must be at least 256".into());
        }
        if self.max_waiters_per_lock == 0 {
            p.push("max_waiters_per_lock must be at least 1".into());
        }
        if self.credential_ttl < Duration::from_secs(60) {
            p.push("credential_ttl must be at least 1m".into());
        }
        p.extend(self.api_key_problems());
        if self.header_read_timeout < Duration::from_millis(100) {
            p.push("header_read_timeout must be at least 100ms".into());
        }
        if self.idle_timeout < Duration::from_millis(100) {
            p.push("idle_timeout must be at least 100ms".into());
        }
        if self.max_connections == 0 {
            p.push("max_connections must be at least 1".into());
        }
        if self.max_connections_per_address == Some(0) {
            p.push("max_connections_per_address must be at least 1".into());
        }
        for (i, entry) in self.allowed_hosts.iter().enumerate() {
            if let Some(why) = crate::browser::entry_problem(entry) {
                p.push(format!("allowed_hosts[{i}] = {entry:?}: {why}"));
            }
        }
        p.extend(self.tls.problems());
        if let Some(etcd) = &self.etcd {
            p.extend(etcd.problems());
        }
        p
    }

    /// The problems of `api_keys`. Entries are named by their index (in the
    /// file, or in the environment: the every-lock keys first, then the
    /// scoped ones), never by the key.
    fn api_key_problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (i, k) in self.api_keys.iter().enumerate() {
            if k.key.chars().count() < 8 {
                p.push(format!(
                    "api_keys[{i}] is shorter than 8 characters; api_keys must each be at least 8 characters"
                ));
            }
            if k.key.trim() != k.key {
                p.push(format!(
                    "api_keys[{i}] starts or ends with whitespace, which no Authorization header can carry"
                ));
            }
            if let Some(j) = self.api_keys[..i].iter().position(|o| o.key == k.key) {
                p.push(format!(
                    "api_keys[{i}] is the same key as api_keys[{j}]; give each key one entry with all its locks"
                ));
            }
            if k.locks.is_empty() {
                p.push(format!(
                    "api_keys[{i}] names no locks: list the patterns it may use (locks = [\"db-a\", \"backup-*\"], or [\"*\"] for every lock; in {ENV_SCOPED_API_KEYS}: KEY:db-a|backup-*)"
                ));
            }
            for (j, pattern) in k.locks.iter().enumerate() {
                if let Err(e) = LockPattern::parse(pattern) {
                    p.push(format!("api_keys[{i}].locks[{j}] = {pattern:?}: {e}"));
                }
            }
        }
        p
    }

    /// Fails with every problem listed, or returns the config unchanged.
    pub fn validated(self) -> anyhow::Result<LocksvcConfig> {
        fencegate_net::problems::none("locksvc", self.problems())?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_listed_at_once() {
        let c: LocksvcConfig = toml::from_str(
            r#"
            signing_keys = ["short"]
            min_ttl = "10m"
            max_ttl = "1m"
            max_body_bytes = 10
            "#,
        )
        .expect("parses");
        let p = c.problems();
        assert!(p.iter().any(|s| s.contains("signing_keys[0]")), "{p:?}");
        assert!(
            p.iter()
                .any(|s| s.contains("min_ttl (10m) is above max_ttl")),
            "{p:?}"
        );
        assert!(p.iter().any(|s| s.contains("max_body_bytes")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("default_ttl")), "{p:?}");
    }

    #[test]
    fn flags_of_the_database_are_refused_on_etcd_not_ignored() {
        let mut c: LocksvcConfig = toml::from_str(
            r#"
            [etcd]
            endpoints = ["http://127.0.0.1:2379"]
            "#,
        )
        .expect("parses");
        assert!(
            !c.problems().iter().any(|s| s.contains("--token-floor")),
            "none given"
        );
        (c.token_floor, c.create_db) = (7, true);
        let p = c.problems();
        assert!(
            p.iter()
                .any(|s| s.contains("--token-floor") && s.contains("etcd.epoch")),
            "{p:?}"
        );
        assert!(p.iter().any(|s| s.contains("--create-db")), "{p:?}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err =
            toml::from_str::<LocksvcConfig>("listne = \"127.0.0.1:1\"").expect_err("typo refused");
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn api_keys_take_both_forms_and_every_scope_problem_is_listed() {
        let c: LocksvcConfig = toml::from_str(
            r#"
            signing_keys = ["0123456789abcdef"]
            api_keys = ["admin-key-123", { key = "db-a-key-123", locks = ["db-a", "backup-*"] }]
            "#,
        )
        .expect("parses");
        assert_eq!(c.api_keys[0], ApiKey::every_lock("admin-key-123"));
        assert_eq!(c.api_keys[1].locks, ["db-a", "backup-*"]);
        assert!(c.problems().is_empty(), "{:?}", c.problems());

        let c: LocksvcConfig = toml::from_str(
            r#"
            signing_keys = ["0123456789abcdef"]
            [[api_keys]]
            key = "short"
            locks = ["db a", "ok-*", "x:y", ""]
            [[api_keys]]
            key = "no-locks-12345"
            locks = []
            [[api_keys]]
            key = "no-locks-12345"
            locks = ["*"]
            "#,
        )
        .expect("parses");
        let p = c.problems();
        fencegate_testkit::assert_mentions(
            &p.join("\n"),
            &[
                "api_keys[0] is shorter than 8",
                "api_keys[0].locks[0] = \"db a\"",
                "api_keys[0].locks[2] = \"x:y\"",
                "api_keys[0].locks[3] = \"\"",
                "api_keys[1] names no locks",
                "api_keys[2] is the same key as api_keys[1]",
            ],
        );
        assert_eq!(p.len(), 6, "{p:?}");
        assert!(
            p.iter().all(|s| !s.contains("no-locks-12345")),
            "keys are never printed: {p:?}"
        );

        let err =
            toml::from_str::<LocksvcConfig>("[[api_keys]]\nkey = \"k-12345678\"\nlock = [\"a\"]")
                .expect_err("typo refused");
        assert!(err.to_string().contains("unknown field `lock`"), "{err}");
        let err = toml::from_str::<LocksvcConfig>("[[api_keys]]\nkey = \"k-12345678\"")
            .expect_err("locks required");
        assert!(err.to_string().contains("missing field `locks`"), "{err}");
    }

    #[test]
    fn env_api_keys_replace_the_file_list() {
        let mut c: LocksvcConfig =
            toml::from_str("signing_keys = [\"0123456789abcdef\"]\napi_keys = [\"file-key-123\"]")
                .expect("parses");
        c.apply_env(|k| match k {
            ENV_API_KEYS => Some("admin-key-123".into()),
            ENV_SCOPED_API_KEYS => Some("a:b:key-123:db-a|backup-* , other-key-123:x".into()),
            _ => None,
        });
        assert_eq!(
            c.api_keys,
            vec![
                ApiKey::every_lock("admin-key-123"),
                ApiKey {
                    key: "a:b:key-123".into(),
                    locks: vec!["db-a".into(), "backup-*".into()]
                },
                ApiKey {
                    key: "other-key-123".into(),
                    locks: vec!["x".into()]
                },
            ]
        );
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        c.apply_env(|k| (k == ENV_SCOPED_API_KEYS).then(|| "no-scope-key-123".into()));
        assert_eq!(c.api_keys.len(), 1);
        assert!(
            c.problems()
                .iter()
                .any(|p| p.contains("api_keys[0] names no locks")),
            "{:?}",
            c.problems()
        );
    }

    #[test]
    fn allowed_hosts_come_from_the_file_or_the_environment_and_bad_ones_are_listed() {
        let mut c: LocksvcConfig = toml::from_str(
            r#"
            signing_keys = ["0123456789abcdef"]
            allowed_hosts = ["locks.internal", "*.svc.cluster.local", "http://x", "x:7070"]
            "#,
        )
        .expect("parses");
        let p = c.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("allowed_hosts[2] = \"http://x\": a host name, not a URL"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("allowed_hosts[3] = \"x:7070\": ports are not compared"),
            "{p:?}"
        );
        c.apply_env(|k| (k == ENV_ALLOWED_HOSTS).then(|| "locksvc, locksvc1 ,".into()));
        assert_eq!(c.allowed_hosts, ["locksvc", "locksvc1"]);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert!(LocksvcConfig::default().allowed_hosts.is_empty());
    }

    #[test]
    fn env_overrides_secrets() {
        let mut c = LocksvcConfig::default();
        c.apply_env(|k| {
            (k == ENV_SIGNING_KEYS).then(|| "k1-0123456789abcdef, k2-0123456789abcdef".into())
        });
        assert_eq!(c.signing_keys.len(), 2);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }
}
