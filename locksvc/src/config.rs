//! Configuration of the lease service: one serde struct, every field
//! documented, loaded from TOML, secrets overridable from the environment,
//! validated at start with every problem listed at once.

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
    /// HMAC keys (at least 16 bytes each) that sign fencing tokens; the first
    /// signs, all verify. Shared with the proxy. Override with the
    /// environment variable `FENCEGATE_SIGNING_KEYS` (comma separated) so
    /// keys need not live in a file.
    pub signing_keys: Vec<String>,
    /// Bearer API keys accepted from clients. Empty: no authentication.
    /// Override with `FENCEGATE_LOCKSVC_API_KEYS` (comma separated).
    pub api_keys: Vec<String>,
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
    /// Most clients waiting in line for one lock; more are refused (429).
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
    /// Serve HTTPS, and optionally require client certificates
    /// (`client_ca_file`). Tokens, lease-bound credentials and API keys are
    /// bearer secrets: serve TLS whenever clients are not on the same host.
    pub tls: TlsConfig,
}

impl Default for LocksvcConfig {
    fn default() -> Self {
        LocksvcConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            db: PathBuf::from("fencegate-locksvc.db"),
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
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            tls: TlsConfig::default(),
        }
    }
}

/// Environment variable overriding `signing_keys`.
pub const ENV_SIGNING_KEYS: &str = "FENCEGATE_SIGNING_KEYS";
/// Environment variable overriding `api_keys`.
pub const ENV_API_KEYS: &str = "FENCEGATE_LOCKSVC_API_KEYS";

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
        if let Some(v) = var(ENV_API_KEYS) {
            self.api_keys = split_list(&v);
        }
        self.tls.apply_env(&var);
    }

    /// The connection settings of the lease service's listener (`tls`
    /// loaded).
    pub fn server_options(&self) -> anyhow::Result<fencegate_net::ServerOptions> {
        Ok(fencegate_net::ServerOptions {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            tls: self.tls.server_config()?,
            refusal: fencegate_net::Refusal::new(
                "application/json",
                r#"{"error":{"code":"TooManyConnections","message":"the lease service is serving as many connections as it may (max_connections); retry shortly"}}"#,
            ),
            drain_timeout: Duration::from_secs(30),
        })
    }

    /// Every problem with this configuration, in one list.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
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
        if self.api_keys.iter().any(|k| k.len() < 8) {
            p.push("api_keys must each be at least 8 characters".into());
        }
        if self.header_read_timeout < Duration::from_millis(100) {
            p.push("header_read_timeout must be at least 100ms".into());
        }
        if self.idle_timeout < Duration::from_millis(100) {
            p.push("idle_timeout must be at least 100ms".into());
        }
        if self.max_connections == 0 {
            p.push("max_connections must be at least 1".into());
        }
        p.extend(self.tls.problems());
        p
    }

    /// Fails with every problem listed, or returns the config unchanged.
    pub fn validated(self) -> anyhow::Result<LocksvcConfig> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(self)
        } else {
            anyhow::bail!(
                "invalid locksvc configuration:\n  - {}",
                problems.join("\n  - ")
            )
        }
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
    fn unknown_fields_are_refused() {
        let err =
            toml::from_str::<LocksvcConfig>("listne = \"127.0.0.1:1\"").expect_err("typo refused");
        assert!(err.to_string().contains("unknown field"), "{err}");
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
