//! Fence scopes: which lock fences a given bucket and key.

use crate::config::{ProxyConfig, UnscopedPolicy};
use fencegate_core::LockName;

/// A bucket, or a key prefix within one, fenced by one lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Stable identifier, the key of max_token in the database:
    /// `bucket` or `bucket/prefix`.
    pub id: String,
    pub bucket: String,
    pub prefix: String,
    pub lock: LockName,
}

/// Resolves keys to scopes.
#[derive(Debug, Clone)]
pub struct ScopeMap {
    /// Configured scopes, longest prefix first.
    scopes: Vec<Scope>,
    unscoped: UnscopedPolicy,
}

/// Why a write has no scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unscoped {
    pub bucket: String,
    pub key: String,
    pub configured: Vec<String>,
}

impl ScopeMap {
    /// Builds the map from a validated config.
    pub fn new(config: &ProxyConfig) -> anyhow::Result<ScopeMap> {
        let mut scopes = config
            .scopes
            .iter()
            .map(|s| {
                Ok(Scope {
                    id: scope_id(&s.bucket, &s.prefix),
                    bucket: s.bucket.clone(),
                    prefix: s.prefix.clone(),
                    lock: LockName::new(&s.lock)?,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        scopes.sort_by_key(|s| std::cmp::Reverse(s.prefix.len()));
        let unscoped = if scopes.is_empty() {
            UnscopedPolicy::BucketLock
        } else {
            config.unscoped_writes
        };
        Ok(ScopeMap { scopes, unscoped })
    }

    /// The scope fencing `key` in `bucket`.
    pub fn resolve(&self, bucket: &str, key: &str) -> Result<Scope, Unscoped> {
        if let Some(s) = self
            .scopes
            .iter()
            .find(|s| s.bucket == bucket && key.starts_with(&s.prefix))
        {
            return Ok(s.clone());
        }
        match (self.unscoped, LockName::new(bucket)) {
            (UnscopedPolicy::BucketLock, Ok(lock)) => Ok(Scope {
                id: bucket.to_owned(),
                bucket: bucket.to_owned(),
                prefix: String::new(),
                lock,
            }),
            _ => Err(Unscoped {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                configured: self.scopes.iter().map(|s| s.id.clone()).collect(),
            }),
        }
    }

    /// A scope fenced by `lock`: the first configured one, else, where
    /// each bucket is fenced by the lock of its name, the bucket `lock`.
    pub fn for_lock(&self, lock: &LockName) -> Option<Scope> {
        if let Some(s) = self.scopes.iter().find(|s| &s.lock == lock) {
            return Some(s.clone());
        }
        self.resolve(lock.as_str(), "")
            .ok()
            .filter(|s| &s.lock == lock)
    }

    /// A scope in `bucket` fenced by `lock`, if there is one.
    pub fn in_bucket(&self, bucket: &str, lock: &LockName) -> Option<Scope> {
        if let Some(s) = self
            .scopes
            .iter()
            .find(|s| s.bucket == bucket && &s.lock == lock)
        {
            return Some(s.clone());
        }
        self.resolve(bucket, "").ok().filter(|s| &s.lock == lock)
    }

    /// The configured scopes (empty in bucket-per-scope mode).
    pub fn configured(&self) -> &[Scope] {
        &self.scopes
    }
}

impl Scope {
    /// The fence this scope's writes pass: its lock's. max_token is kept
    /// per lock, not per scope, so a stale holder of a lock cannot write in
    /// one scope of that lock after a newer holder wrote in another.
    pub fn fence(&self) -> &str {
        self.lock.as_str()
    }
}

fn scope_id(bucket: &str, prefix: &str) -> String {
    if prefix.is_empty() {
        bucket.to_owned()
    } else {
        format!("{bucket}/{prefix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScopeConfig;

    fn map(scopes: &[(&str, &str, &str)], unscoped: UnscopedPolicy) -> ScopeMap {
        let config = ProxyConfig {
            scopes: scopes
                .iter()
                .map(|(b, p, l)| ScopeConfig {
                    bucket: (*b).into(),
                    prefix: (*p).into(),
                    lock: (*l).into(),
                })
                .collect(),
            unscoped_writes: unscoped,
            ..ProxyConfig::default()
        };
        ScopeMap::new(&config).expect("valid")
    }

    #[test]
    fn no_config_means_a_scope_per_bucket() {
        let m = map(&[], UnscopedPolicy::Deny);
        let s = m.resolve("backups", "a/b").expect("scoped");
        assert_eq!((s.id.as_str(), s.lock.as_str()), ("backups", "backups"));
    }

    #[test]
    fn longest_prefix_wins_and_the_rest_is_denied() {
        let m = map(
            &[
                ("b", "", "whole"),
                ("b", "db/", "db"),
                ("b", "db/pg/", "pg"),
            ],
            UnscopedPolicy::Deny,
        );
        assert_eq!(
            m.resolve("b", "db/pg/x").expect("scoped").lock.as_str(),
            "pg"
        );
        assert_eq!(
            m.resolve("b", "db/my/x").expect("scoped").lock.as_str(),
            "db"
        );
        assert_eq!(m.resolve("b", "x").expect("scoped").lock.as_str(), "whole");
        assert!(m.resolve("other", "x").is_err());
    }

    #[test]
    fn unscoped_writes_can_fall_back_to_the_bucket_lock() {
        let m = map(&[("b", "db/", "db")], UnscopedPolicy::BucketLock);
        assert_eq!(m.resolve("c", "x").expect("scoped").lock.as_str(), "c");
    }
}
