//! Fence scopes: which lock fences a given bucket and key.

use crate::config::{ProxyConfig, UnscopedPolicy};
use crate::recent::Recent;
use fencegate_core::LockName;
use std::cell::RefCell;
use std::collections::HashMap;
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

/// Resolves keys to scopes, in time that does not grow with the number of
/// scopes configured (a lookup per distinct prefix length in the bucket).
#[derive(Debug, Clone)]
pub struct ScopeMap {
    /// Configured scopes, longest prefix first.
    scopes: Vec<Scope>,
    /// The same, by bucket.
    buckets: HashMap<String, BucketScopes>,
    /// Each lock's configured scopes, in order.
    by_lock: HashMap<LockName, Vec<Scope>>,
    unscoped: UnscopedPolicy,
}

/// A bucket's configured scopes.
#[derive(Debug, Clone, Default)]
struct BucketScopes {
    /// The lengths of their prefixes, longest first, each once.
    lengths: Vec<usize>,
    by_prefix: HashMap<String, Scope>,
    /// The first configured scope of each lock in the bucket.
    by_lock: HashMap<LockName, Scope>,
}

impl BucketScopes {
    /// The scope with the longest prefix of `key`.
    fn longest_prefix_of(&self, key: &str) -> Option<&Scope> {
        self.lengths
            .iter()
            .find_map(|&n| self.by_prefix.get(key.get(..n)?))
    }
}

/// Why a write has no scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unscoped {
    pub bucket: String,
    pub key: String,
    /// The first [`Unscoped::NAMED`] configured scopes, and how many more
    /// there are (the error names a few, not a hundred thousand).
    pub configured: Vec<String>,
    pub more: usize,
}

impl Unscoped {
    pub const NAMED: usize = 20;
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
        let mut buckets: HashMap<String, BucketScopes> = HashMap::new();
        let mut by_lock: HashMap<LockName, Vec<Scope>> = HashMap::new();
        for s in &scopes {
            by_lock.entry(s.lock.clone()).or_default().push(s.clone());
            let b = buckets.entry(s.bucket.clone()).or_default();
            if b.lengths.last() != Some(&s.prefix.len()) {
                b.lengths.push(s.prefix.len());
            }
            // (Validation refuses two scopes of one bucket and prefix.)
            b.by_prefix
                .entry(s.prefix.clone())
                .or_insert_with(|| s.clone());
            b.by_lock.entry(s.lock.clone()).or_insert_with(|| s.clone());
        }
        let unscoped = if scopes.is_empty() {
            UnscopedPolicy::BucketLock
        } else {
            config.unscoped_writes
        };
        Ok(ScopeMap {
            scopes,
            buckets,
            by_lock,
            unscoped,
        })
    }

    /// The scope fencing `key` in `bucket`.
    pub fn resolve(&self, bucket: &str, key: &str) -> Result<Scope, Unscoped> {
        if let Some(s) = self
            .buckets
            .get(bucket)
            .and_then(|b| b.longest_prefix_of(key))
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
                configured: self
                    .scopes
                    .iter()
                    .take(Unscoped::NAMED)
                    .map(|s| s.id.clone())
                    .collect(),
                more: self.scopes.len().saturating_sub(Unscoped::NAMED),
            }),
        }
    }

    /// A scope fenced by `lock`: the first configured one, else, where
    /// each bucket is fenced by the lock of its name, the bucket `lock`.
    pub fn for_lock(&self, lock: &LockName) -> Option<Scope> {
        if let Some(s) = self.by_lock.get(lock).and_then(|s| s.first()) {
            return Some(s.clone());
        }
        self.resolve(lock.as_str(), "")
            .ok()
            .filter(|s| &s.lock == lock)
    }

    /// A scope in `bucket` fenced by `lock`, if there is one.
    pub fn in_bucket(&self, bucket: &str, lock: &LockName) -> Option<Scope> {
        if let Some(s) = self.buckets.get(bucket).and_then(|b| b.by_lock.get(lock)) {
            return Some(s.clone());
        }
        self.resolve(bucket, "").ok().filter(|s| &s.lock == lock)
    }

    /// The configured scopes (empty in bucket-per-scope mode).
    pub fn configured(&self) -> &[Scope] {
        &self.scopes
    }

    /// The configured scopes `lock` fences (none in bucket-per-scope mode).
    pub fn of_lock(&self, lock: &LockName) -> &[Scope] {
        self.by_lock.get(lock).map_or(&[], Vec::as_slice)
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

    #[test]
    fn a_key_is_matched_at_every_prefix_length_and_never_inside_a_character() {
        let m = map(
            &[("b", "é", "accent"), ("b", "a", "a"), ("b", "ab/", "ab")],
            UnscopedPolicy::Deny,
        );
        assert_eq!(
            m.resolve("b", "éa").expect("scoped").lock.as_str(),
            "accent"
        );
        assert_eq!(m.resolve("b", "ab/c").expect("scoped").lock.as_str(), "ab");
        assert_eq!(m.resolve("b", "abc").expect("scoped").lock.as_str(), "a");
        // "é" is two bytes: a one-byte prefix length falls inside it.
        assert!(m.resolve("b", "è").is_err());
        assert!(m.resolve("b", "").is_err());
    }

    #[test]
    fn a_hundred_thousand_scopes_resolve_as_the_linear_scan_did() {
        let owned: Vec<(String, String, String)> = (0..10_000)
            .flat_map(|i| {
                (0..10).map(move |j| {
                    (
                        "b".to_owned(),
                        format!("l{i:05}/s{j}/"),
                        format!("lock-{i:05}"),
                    )
                })
            })
            .chain([("b".to_owned(), "l00042/".to_owned(), "outer".to_owned())])
            .collect();
        let scopes: Vec<(&str, &str, &str)> = owned
            .iter()
            .map(|(b, p, l)| (b.as_str(), p.as_str(), l.as_str()))
            .collect();
        let m = map(&scopes, UnscopedPolicy::Deny);
        let linear = |key: &str| {
            m.configured()
                .iter()
                .find(|s| s.bucket == "b" && key.starts_with(&s.prefix))
                .map(|s| s.lock.as_str().to_owned())
        };
        for key in ["l00042/s3/x", "l00042/s99/x", "l09999/s9/", "l1/s1/x", "x"] {
            assert_eq!(
                m.resolve("b", key).ok().map(|s| s.lock.as_str().to_owned()),
                linear(key),
                "{key}"
            );
        }
        let e = m.resolve("b", "x").expect_err("unscoped");
        assert_eq!(e.configured.len(), Unscoped::NAMED);
        assert_eq!(e.more, scopes.len() - Unscoped::NAMED);
        let lock = LockName::new("lock-00007").expect("lock");
        assert_eq!(
            m.for_lock(&lock).map(|s| s.id.clone()).as_deref(),
            Some("b/l00007/s0/")
        );
        assert_eq!(
            m.in_bucket("b", &lock).map(|s| s.id.clone()).as_deref(),
            Some("b/l00007/s0/")
        );
    }
}
