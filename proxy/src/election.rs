//! Locks whose holder an election decides: an election the cluster
//! already runs (`[[elections]]`) issues the lock's tokens, not the lease
//! service: in etcd, Patroni's leader key or etcd's election and lock
//! recipes ([`fencegate_etcd::election`]); in ZooKeeper, the lock recipes
//! of Curator and kazoo or a leader znode ([`fencegate_zookeeper`]). The
//! token is the revision (or zxid) the holder's term began at, so the fence
//! rule of `core` applies unchanged.
//!
//! The proxy verifies, never trusts: a token at or above its lock's max is
//! admitted only if a linearizable read of the election shows it as the
//! holder's, then and there. No answer is remembered, so a holder that lost
//! the election is refused as soon as its key is gone, before its successor
//! writes. The questions are asked by [`crate::issuer::Issuer`], one per
//! lock at a time.
//!
//! **Who may speak for the holder.** The election's number is public
//! (etcd shows it to anyone who may read the key), so a plain token proves
//! only that the sender read it. With `signing_keys`, the lock takes only
//! tokens and credentials signed with them (what `fencegate election run`
//! and `fencegate election token` mint where the key is): the signature
//! says a node of the cluster sent it, and the election, read
//! then and there, says it is the holder's. Neither is enough alone: a
//! deposed leader still has the key.

use fencegate_core::LockName;
pub use fencegate_elections::{Seat, Shows};
use std::collections::HashMap;

/// One lock's election, and the keys its tokens are signed with.
#[derive(Debug)]
pub struct Election {
    election: fencegate_elections::Election,
    keys: Option<fencegate_core::TokenKeys>,
}

impl Election {
    /// The election one `[[elections]]` table names (whose problems were
    /// checked).
    pub fn from_config(c: &ElectionConfig) -> anyhow::Result<Election> {
        let seat = c
            .seat()
            .ok_or_else(|| anyhow::anyhow!("lock {} names no single election", c.lock))?;
        Ok(Election {
            election: fencegate_elections::Election::new(seat, &c.connection())?,
            keys: c.keys(),
        })
    }

    /// The keys its tokens and credentials must be signed with, if it
    /// has `signing_keys`; without, it takes plain numbers.
    pub fn keys(&self) -> Option<&fencegate_core::TokenKeys> {
        self.keys.as_ref()
    }

    /// Where it keeps its holder, for messages.
    pub fn seat(&self) -> &Seat {
        self.election.seat()
    }

    /// Who holds it now, read linearizably.
    pub async fn shows(&self) -> Result<Shows, String> {
        self.election.shows().await
    }

    /// Who holds it now, and where to watch from.
    pub async fn read(&self) -> Result<(Shows, i64), String> {
        self.election.read().await
    }

    /// Waits until the election may have changed since `seen`, or until
    /// `patience` passes.
    pub async fn changed(&self, seen: i64, patience: std::time::Duration) -> Result<(), String> {
        self.election.changed(seen, patience).await
    }
}

/// The elections of the configured locks.
#[derive(Debug, Default)]
pub struct Elections {
    by_lock: HashMap<LockName, Election>,
}

impl Elections {
    pub fn new(by_lock: HashMap<LockName, Election>) -> Elections {
        Elections { by_lock }
    }

    /// The election that issues `lock`'s tokens, if one does.
    pub fn of(&self, lock: &LockName) -> Option<&Election> {
        self.by_lock.get(lock)
    }

    /// The locks that follow an election.
    pub fn locks(&self) -> impl Iterator<Item = &LockName> {
        self.by_lock.keys()
    }

    /// Each lock's signing keys, for the credentials bound to it.
    pub fn credential_keys(&self) -> HashMap<LockName, Option<fencegate_core::TokenKeys>> {
        self.by_lock
            .iter()
            .map(|(lock, e)| (lock.clone(), e.keys.clone()))
            .collect()
    }
}

/// One `[[elections]]` table of the proxy config: a lock whose tokens an
/// etcd election issues.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElectionConfig {
    /// The lock a scope names (by default, a bucket's lock is the bucket's
    /// name).
    pub lock: String,
    /// A leader key: whoever it names holds the lock (Patroni:
    /// `/<namespace>/<scope>/leader`, by default `/service/<scope>/leader`).
    #[serde(default)]
    pub etcd_key: Option<String>,
    /// An election or lock prefix (etcd's recipes: `etcdctl elect NAME`
    /// puts keys under `NAME/`): the key under it with the lowest
    /// `create_revision` holds.
    #[serde(default)]
    pub etcd_prefix: Option<String>,
    /// A ZooKeeper lock's path (the lock recipes of Curator and kazoo):
    /// the child with the lowest sequence number holds, its data names the
    /// holder, its `czxid` is the token.
    #[serde(default)]
    pub zookeeper_lock: Option<String>,
    /// A ZooKeeper leader znode: whoever its data names holds; its `mzxid`
    /// is the token.
    #[serde(default)]
    pub zookeeper_node: Option<String>,
    /// The election's servers: etcd client URLs (`http://host:2379`), or
    /// ZooKeeper `host:port`.
    pub endpoints: Vec<String>,
    /// etcd user, if etcd auth is on.
    #[serde(default)]
    pub username: Option<String>,
    /// Its password (never printed).
    #[serde(default)]
    pub password: Option<fencegate_etcd::Secret>,
    /// PEM CA certificate(s) for `https://` endpoints.
    #[serde(default, deserialize_with = "fencegate_net::tls::optional_path")]
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate for etcd's mutual TLS (with `key_file`).
    #[serde(default, deserialize_with = "fencegate_net::tls::optional_path")]
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default, deserialize_with = "fencegate_net::tls::optional_path")]
    pub key_file: Option<std::path::PathBuf>,
    /// Keys shared with the cluster's nodes (`fencegate election run
    /// --signing-key-file`), at least 16 bytes each. When set, the lock
    /// takes only tokens and credentials signed with one of them, never a
    /// plain number; the first signs. Keep them apart from the lease
    /// service's `signing_keys`.
    #[serde(default)]
    pub signing_keys: Vec<fencegate_etcd::Secret>,
    /// Longest one read of the election may take; then the write gets 503.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: std::time::Duration,
}

fn default_request_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(2)
}

impl ElectionConfig {
    /// Where the election keeps its holder, if exactly one seat is named.
    pub fn seat(&self) -> Option<Seat> {
        Seat::one_of(fencegate_elections::Named {
            etcd_key: self.etcd_key.as_deref(),
            etcd_prefix: self.etcd_prefix.as_deref(),
            zookeeper_lock: self.zookeeper_lock.as_deref(),
            zookeeper_node: self.zookeeper_node.as_deref(),
        })
    }

    /// Its signing keys, if it has any (and they are valid: see
    /// [`ElectionConfig::problems`]).
    pub fn keys(&self) -> Option<fencegate_core::TokenKeys> {
        if self.signing_keys.is_empty() {
            return None;
        }
        fencegate_core::TokenKeys::new(
            self.signing_keys
                .iter()
                .map(|k| k.as_ref().as_bytes().to_vec())
                .collect(),
        )
    }

    /// How to reach its etcd.
    pub fn connection(&self) -> fencegate_etcd::Connection {
        fencegate_etcd::Connection {
            endpoints: self.endpoints.clone(),
            credentials: fencegate_etcd::nonempty(&self.username)
                .zip(fencegate_etcd::nonempty(&self.password))
                .map(|(u, p)| (u.to_owned(), p.to_owned())),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            request_timeout: self.request_timeout,
            connect_timeout: self.request_timeout.min(std::time::Duration::from_secs(1)),
        }
    }

    /// Every problem, each prefixed `elections[i]`.
    pub fn problems(&self, i: usize) -> Vec<String> {
        let table = format!("elections[{i}]");
        let mut p = Vec::new();
        if let Err(e) = LockName::new(&self.lock) {
            p.push(format!("{table}.lock {:?}: {e}", self.lock));
        }
        let named = [
            &self.etcd_key,
            &self.etcd_prefix,
            &self.zookeeper_lock,
            &self.zookeeper_node,
        ];
        match named.iter().filter(|n| n.is_some()).count() {
            0 => p.push(format!(
                "{table}: name the election: etcd_key (a leader key, such as Patroni's /service/<scope>/leader), etcd_prefix (etcd's election and lock recipes), zookeeper_lock (a Curator or kazoo lock's path) or zookeeper_node (a leader znode)"
            )),
            1 => {
                if named.iter().any(|n| n.as_deref() == Some("")) {
                    p.push(format!("{table}: the election's key or path is empty"));
                }
            }
            _ => p.push(format!(
                "{table}: more than one of etcd_key, etcd_prefix, zookeeper_lock and zookeeper_node is set; name one"
            )),
        }
        for path in [&self.zookeeper_lock, &self.zookeeper_node]
            .into_iter()
            .flatten()
        {
            if !path.starts_with('/') || (path.len() > 1 && path.ends_with('/')) {
                p.push(format!(
                    "{table}: ZooKeeper path {path:?} must start with / and not end with /"
                ));
            }
        }
        if self.endpoints.is_empty() {
            p.push(format!(
                "{table}.endpoints is empty: list the election's etcd members or ZooKeeper servers"
            ));
        }
        if self.request_timeout.is_zero() {
            p.push(format!("{table}.request_timeout must be above 0"));
        }
        if self.username.is_some() != self.password.is_some() {
            p.push(format!("{table}.username and {table}.password go together"));
        }
        for (k, key) in self.signing_keys.iter().enumerate() {
            let len = key.as_ref().len();
            if len < fencegate_core::token::MIN_KEY_LEN {
                p.push(format!(
                    "{table}.signing_keys[{k}] is {len} bytes; keys must be at least {} bytes",
                    fencegate_core::token::MIN_KEY_LEN
                ));
            }
        }
        if !self.signing_keys.is_empty() && self.keys().is_none() && p.is_empty() {
            p.push(format!("{table}.signing_keys are invalid"));
        }
        if let Some(seat) = self.seat() {
            p.extend(seat.problems(&self.connection(), &table));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> crate::config::ProxyConfig {
        toml::from_str(text).expect("parses")
    }

    #[test]
    fn an_election_names_one_seat_and_its_members() {
        let c = parsed(
            "accept_unsigned_tokens = true\n[[elections]]\nlock = \"pg\"\netcd_key = \"/service/main/leader\"\nendpoints = [\"http://127.0.0.1:2379\"]\nusername = \"u\"\npassword = \"hunter2-secret\"\n",
        );
        assert!(
            !format!("{c:?}").contains("hunter2"),
            "the password is printed"
        );
        assert_eq!(
            c.elections[0].seat(),
            Some(Seat::Etcd(fencegate_etcd::election::Seat::Key(
                "/service/main/leader".into()
            )))
        );
        assert!(
            c.elections[0].problems(0).is_empty(),
            "{:?}",
            c.elections[0].problems(0)
        );

        let c = parsed(
            "accept_unsigned_tokens = true\n\
             [[elections]]\nlock = \"pg\"\netcd_key = \"/a\"\netcd_prefix = \"/b/\"\nendpoints = []\n\
             [[elections]]\nlock = \"pg\"\nendpoints = [\"127.0.0.1:2379\"]\n\
             [[elections]]\nlock = \"no such lock!\"\netcd_prefix = \"/c/\"\nendpoints = [\"http://e:2379\"]\nrequest_timeout = \"0s\"\n\
             [[elections]]\nlock = \"pg2\"\netcd_key = \"/d\"\nendpoints = [\"127.0.0.1:2379\"]\n",
        );
        fencegate_testkit::assert_mentions(
            &c.problems().join("\n"),
            &[
                "elections[0]: more than one of etcd_key, etcd_prefix",
                "elections[0].endpoints is empty",
                "elections[1]: name the election",
                "elections[3].endpoints: \"127.0.0.1:2379\" must start with http://",
                "elections[1]: lock pg follows another election already",
                "elections[2].lock \"no such lock!\"",
                "elections[2].request_timeout must be above 0",
            ],
        );
        // ZooKeeper: host:port servers, no auth or TLS yet.
        let c = parsed(
            "accept_unsigned_tokens = true\n[[elections]]\nlock = \"solr\"\nzookeeper_lock = \"/locks/solr/\"\nendpoints = [\"http://zk1:2181\"]\nusername = \"u\"\npassword = \"p\"\n",
        );
        fencegate_testkit::assert_mentions(
            &c.problems().join("\n"),
            &[
                "elections[0]: ZooKeeper path \"/locks/solr/\" must start with / and not end with /",
                "elections[0].endpoints: \"http://zk1:2181\" is not host:port",
                "elections[0].username: ZooKeeper elections are read without authentication",
            ],
        );
        // Unknown keys are refused, as everywhere in the config.
        assert!(
            toml::from_str::<crate::config::ProxyConfig>(
                "[[elections]]\nlock = \"pg\"\netcd_kye = \"/a\"\nendpoints = []\n"
            )
            .is_err()
        );
    }
}
