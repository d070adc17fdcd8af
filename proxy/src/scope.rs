//! Fence scopes: which lock fences a given bucket and key.

use crate::config::{ProxyConfig, UnscopedPolicy};
use crate::recent::Recent;
use fencegate_core::LockName;
use std::cell::RefCell;
use std::sync::Arc;

/// A bucket, or a key prefix within one, fenced by one lock. Shared: each
/// request's copy is a reference, not four strings.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Scope(Arc<ScopeDef>);

/// What a [`Scope`] is.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ScopeDef {
    /// Stable identifier, the key of max_token in the database:
    /// `bucket` or `bucket/prefix`.
    pub id: String,
    pub bucket: String,
    pub prefix: String,
    pub lock: LockName,
}

impl Scope {
    pub fn new(def: ScopeDef) -> Scope {
        Scope(Arc::new(def))
    }

    /// The scope of the whole of `bucket`, fenced by the lock of its name
    /// (where one can be so named). Kept per thread for the buckets it
    /// last wrote to, so a write to one costs no memory.
    fn of_bucket(bucket: &str) -> Option<Scope> {
        thread_local! {
            static BUCKETS: RefCell<Recent<Scope>> = const { RefCell::new(Recent::new(16)) };
        }
        BUCKETS.with_borrow_mut(|kept| {
            kept.get_or_make(
                |s| s.bucket == bucket,
                || {
                    Some(Scope::new(ScopeDef {
                        id: bucket.to_owned(),
                        bucket: bucket.to_owned(),
                        prefix: String::new(),
                        lock: LockName::new(bucket).ok()?,
                    }))
                },
            )
        })
    }
}

impl std::ops::Deref for Scope {
    type Target = ScopeDef;
    fn deref(&self) -> &ScopeDef {
        &self.0
    }
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
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
                Ok(Scope::new(ScopeDef {
                    id: scope_id(&s.bucket, &s.prefix),
                    bucket: s.bucket.clone(),
                    prefix: s.prefix.clone(),
                    lock: LockName::new(&s.lock)?,
                }))
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
        let bucket_scope = match self.unscoped {
            UnscopedPolicy::BucketLock => Scope::of_bucket(bucket),
            _ => None,
        };
        match bucket_scope {
            Some(scope) => Ok(scope),
            None => Err(Unscoped {
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
                .map(|&(b, p, l)| ScopeConfig::new(b, p, l))
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
