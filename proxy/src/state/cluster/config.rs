//! `[cluster]`: how a proxy replica shares its fences with the others
//! through etcd. Without the table the proxy is one replica on SQLite.

use fencegate_core::replicas::Timing;
use fencegate_etcd::nonempty;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Replica id override.
pub const ENV_REPLICA_ID: &str = "FENCEGATE_REPLICA_ID";
/// Endpoints override (comma separated); setting it creates the table.
pub const ENV_CLUSTER_ENDPOINTS: &str = "FENCEGATE_CLUSTER_ENDPOINTS";
pub const ENV_CLUSTER_PREFIX: &str = "FENCEGATE_CLUSTER_PREFIX";
pub const ENV_CLUSTER_USERNAME: &str = "FENCEGATE_CLUSTER_USERNAME";
pub const ENV_CLUSTER_PASSWORD: &str = "FENCEGATE_CLUSTER_PASSWORD";

/// `[cluster]` in the proxy config.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Client URLs of the etcd members (every member may be listed).
    /// Override with `FENCEGATE_CLUSTER_ENDPOINTS`.
    pub endpoints: Vec<String>,
    /// Key prefix of the replicas' shared state; replicas in front of the
    /// same buckets share it. It must start and end with `/`. Override with
    /// `FENCEGATE_CLUSTER_PREFIX`.
    pub prefix: String,
    /// This replica's name, unique among the replicas (letters, digits,
    /// `-`, `_`, `.`). Override with `FENCEGATE_REPLICA_ID`.
    pub replica_id: String,
    /// TTL of the replica's registration. A replica that cannot renew it
    /// within about 90 % of this stops admitting writes (503), and a raise
    /// elsewhere waits `lock_delay` for a replica it cannot reach.
    #[serde(with = "humantime_serde")]
    pub registration_ttl: Duration,
    /// How long a raise waits for a registered replica to confirm it cut
    /// and drained its older writes; then that replica is evicted (its
    /// registration revoked) and the raise waits `lock_delay` instead.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// How long a raise waits after it saw a replica without registration
    /// (dead, evicted, partitioned). Default and minimum:
    /// `registration_ttl·(1+drift)/(1-drift) + backend.store_decision_secs`.
    #[serde(with = "humantime_serde", default)]
    pub lock_delay: Option<Duration>,
    /// Bound on how far any replica's clock rate may be off (0.01: 1 %).
    /// NTP keeps rates within 0.05 %; only rates matter, not the time.
    pub clock_drift: f64,
    /// etcd user, if etcd auth is on. Override with
    /// `FENCEGATE_CLUSTER_USERNAME`.
    pub username: Option<String>,
    /// Its password. Override with `FENCEGATE_CLUSTER_PASSWORD`.
    pub password: Option<fencegate_etcd::Secret>,
    /// PEM CA certificate(s) for `https://` endpoints.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd's mutual TLS (with `key_file`).
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(deserialize_with = "fencegate_net::tls::optional_path")]
    pub key_file: Option<PathBuf>,
    /// Longest one etcd request may take (a raise or an upload binding then
    /// gets 503).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest a connection to one member may take to open.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            endpoints: Vec::new(),
            prefix: "/fencegate/proxy/v1/".into(),
            replica_id: String::new(),
            registration_ttl: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(5),
            lock_delay: None,
            clock_drift: 0.01,
            username: None,
            password: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

impl ClusterConfig {
    /// Applies the `FENCEGATE_CLUSTER_*` and `FENCEGATE_REPLICA_ID`
    /// overrides; setting endpoints creates the table.
    pub fn apply_env(cluster: &mut Option<ClusterConfig>, var: &impl Fn(&str) -> Option<String>) {
        if let Some(v) = var(ENV_CLUSTER_ENDPOINTS).filter(|v| !v.trim().is_empty()) {
            cluster.get_or_insert_with(ClusterConfig::default).endpoints = v
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect();
        }
        let Some(c) = cluster.as_mut() else { return };
        if let Some(v) = var(ENV_CLUSTER_PREFIX) {
            c.prefix = v;
        }
        if let Some(v) = var(ENV_REPLICA_ID) {
            c.replica_id = v;
        }
        if let Some(v) = var(ENV_CLUSTER_USERNAME) {
            c.username = Some(v);
        }
        if let Some(v) = var(ENV_CLUSTER_PASSWORD) {
            c.password = Some(v.into());
        }
    }

    /// The protocol's time constants, with `store_decision` from
    /// `backend.store_decision_secs`.
    pub fn timing(&self, store_decision: Duration) -> Timing {
        Timing {
            ttl: self.registration_ttl,
            drift: self.clock_drift,
            store_decision,
            ack_timeout: self.ack_timeout,
            lock_delay: self.lock_delay.unwrap_or_else(|| {
                Timing::min_lock_delay(self.registration_ttl, self.clock_drift, store_decision)
            }),
        }
    }

    pub fn connection(&self) -> fencegate_etcd::Connection {
        fencegate_etcd::Connection {
            endpoints: self.endpoints.clone(),
            credentials: nonempty(&self.username)
                .zip(nonempty(&self.password))
                .map(|(u, p)| (u.to_owned(), p.to_owned())),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
        }
    }

    /// Every problem, each prefixed `cluster.`.
    pub fn problems(&self, store_decision: Duration) -> Vec<String> {
        let mut p = Vec::new();
        if self.endpoints.is_empty() {
            p.push(format!(
                "cluster.endpoints is empty: list the etcd members (or {ENV_CLUSTER_ENDPOINTS})"
            ));
        }
        p.extend(self.connection().problems("cluster"));
        if !(self.prefix.starts_with('/') && self.prefix.ends_with('/') && self.prefix.len() > 1) {
            p.push(format!(
                "cluster.prefix {:?} must start and end with '/' (like \"/fencegate/proxy/v1/\")",
                self.prefix
            ));
        }
        let id_ok = !self.replica_id.is_empty()
            && self.replica_id.len() <= 64
            && self
                .replica_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !id_ok {
            p.push(format!(
                "cluster.replica_id {:?} must name this replica, unique among them: 1-64 letters, digits, '-', '_' or '.' (or {ENV_REPLICA_ID})",
                self.replica_id
            ));
        }
        if let Err(e) = self.timing(store_decision).checked() {
            p.push(format!("cluster: {e}"));
        }
        if self.ack_timeout.is_zero() {
            p.push("cluster.ack_timeout must be above 0".into());
        }
        if self.request_timeout.is_zero() || self.request_timeout * 3 > self.registration_ttl {
            p.push(format!(
                "cluster.request_timeout {:?} must be above 0 and at most a third of registration_ttl {:?}, so a renewal can fail and be retried before the registration runs out",
                self.request_timeout, self.registration_ttl
            ));
        }
        if self.username.is_some() != self.password.is_some() {
            p.push(format!(
                "cluster.username and cluster.password go together (or {ENV_CLUSTER_PASSWORD})"
            ));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lock_delay_is_the_safe_minimum_and_a_shorter_one_is_refused() {
        let c = ClusterConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            replica_id: "a".into(),
            ..ClusterConfig::default()
        };
        let store = Duration::from_secs(10);
        assert!(c.problems(store).is_empty(), "{:?}", c.problems(store));
        assert!(c.timing(store).lock_delay > Duration::from_secs(20));
        let short = ClusterConfig {
            lock_delay: Some(Duration::from_secs(5)),
            replica_id: "a/b".into(),
            request_timeout: Duration::from_secs(4),
            ..c
        };
        let p = short.problems(store);
        fencegate_testkit::assert_mentions(
            &p.join("\n"),
            &["lock_delay", "replica_id", "request_timeout"],
        );
    }

    #[test]
    fn the_password_is_never_printed() {
        let mut cluster = None;
        ClusterConfig::apply_env(&mut cluster, &|k: &str| match k {
            ENV_CLUSTER_ENDPOINTS => Some("http://e:2379".into()),
            ENV_CLUSTER_PASSWORD => Some("hunter2-secret".into()),
            _ => None,
        });
        let c = cluster.expect("the endpoints create the table");
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        let conn = c.connection();
        assert_eq!(conn.credentials, None, "no user: no credentials");
    }

    #[test]
    fn env_endpoints_create_the_table() {
        let mut c = None;
        let env = |k: &str| match k {
            ENV_CLUSTER_ENDPOINTS => Some("http://a:1, http://b:2".to_owned()),
            ENV_REPLICA_ID => Some("r2".to_owned()),
            _ => None,
        };
        ClusterConfig::apply_env(&mut c, &env);
        let c = c.expect("created");
        assert_eq!(c.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(c.replica_id, "r2");
    }
}
