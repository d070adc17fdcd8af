//! Per-key serialization and the ETag cache.
//!
//! Writes to one key go one at a time through the proxy: several S3
//! servers check `If-Match` / `If-None-Match` without a lock, so the store's
//! compare-and-set is the second wall, not the only one.
//!
//! For each key the proxy remembers what it last knew of the stored object:
//! absent, or its ETag and fencing token. That is what makes the
//! steady state cost one backend round trip per write: a write to a known
//! key goes straight out with `If-Match: <etag>` (or `If-None-Match: *`),
//! with no HEAD first. The cache is bounded; a miss costs one HEAD, except
//! for a small PutObject, which is sent as for a new key and reads the key
//! only if the store refuses (`Admitter::begin_put`). Its policy (`cache`) is
//! scan-resistant: a client rewriting more keys than the cache holds, in
//! the same order every run, still finds about `capacity / keys` of them
//! cached, where an LRU would find none.

mod cache;
mod known;

use cache::ScanResistantCache;
use known::Kept;
pub use known::Known;
use parking_lot::Mutex;
use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A key's identity, `bucket/key` in one shared string (a bucket's name
/// has no `/`): the lock map and the cache share one copy, and a write to
/// a key the cache knows takes that copy instead of making its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct KeyId(Arc<str>);

impl Borrow<str> for KeyId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl KeyId {
    fn split(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or((&self.0, ""))
    }
}

/// Per-key locks plus the bounded cache of [`Known`] states.
#[derive(Debug, Clone)]
pub struct Keys {
    locks: Arc<Mutex<HashMap<KeyId, Arc<AsyncMutex<()>>>>>,
    cache: Arc<Mutex<ScanResistantCache<KeyId, Kept>>>,
}

/// Exclusive hold on one key; released (and its lock entry dropped if no
/// one else waits) on drop.
#[derive(Debug)]
pub struct KeyGuard {
    id: KeyId,
    keys: Keys,
    lock: Arc<AsyncMutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Keys {
    pub fn new(capacity: usize) -> Keys {
        Keys {
            locks: Arc::new(Mutex::new(HashMap::new())),
            cache: Arc::new(Mutex::new(ScanResistantCache::new(capacity))),
        }
    }

    /// Waits for exclusive use of `bucket/key`.
    pub async fn lock(&self, bucket: &str, key: &str) -> KeyGuard {
        thread_local! {
            static JOINED: RefCell<String> = const { RefCell::new(String::new()) };
        }
        // A bucket's name has no `/` (s3s and the edge check it), so the
        // joined text names one key.
        debug_assert!(!bucket.contains('/'), "bucket {bucket:?} has a slash");
        let (id, lock) = JOINED.with_borrow_mut(|joined| {
            joined.clear();
            joined.extend([bucket, "/", key]);
            let mut locks = self.locks.lock();
            if let Some((id, lock)) = locks.get_key_value(joined.as_str()) {
                return (id.clone(), lock.clone());
            }
            let id = self
                .cache
                .lock()
                .key(joined.as_str())
                .cloned()
                .unwrap_or_else(|| KeyId(Arc::from(joined.as_str())));
            let lock = Arc::<AsyncMutex<()>>::default();
            locks.insert(id.clone(), lock.clone());
            (id, lock)
        });
        let guard = lock.clone().lock_owned().await;
        KeyGuard {
            id,
            keys: self.clone(),
            lock,
            guard: Some(guard),
        }
    }

    /// Number of keys currently locked or waited for.
    pub fn locked(&self) -> usize {
        self.locks.lock().len()
    }

    /// Number of keys in the cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().len()
    }

    /// The keys a write holds or waits for now, as `(bucket, key)`, at
    /// most `limit` of them in name order, and how many there are.
    pub fn busy(&self, limit: usize) -> (Vec<(String, String)>, usize) {
        let locks = self.locks.lock();
        let mut keys: Vec<(String, String)> = locks
            .keys()
            .map(|id| {
                let (bucket, key) = id.split();
                (bucket.to_owned(), key.to_owned())
            })
            .collect();
        drop(locks);
        let total = keys.len();
        keys.sort();
        keys.truncate(limit);
        (keys, total)
    }
}

impl KeyGuard {
    pub fn bucket(&self) -> &str {
        self.id.split().0
    }

    pub fn key(&self) -> &str {
        self.id.split().1
    }

    /// What the proxy last knew of this key, if it remembers.
    pub fn known(&self) -> Option<Known> {
        let mut cache = self.keys.cache.lock();
        cache.get(&self.id).map(Known::from)
    }

    /// Records what the store now holds.
    pub fn remember(&self, known: Known) {
        let kept = Kept::from(known);
        let mut cache = self.keys.cache.lock();
        cache.insert(self.id.clone(), kept);
    }

    /// Forgets the key (after an unexpected answer from the store).
    pub fn forget(&self) {
        let mut cache = self.keys.cache.lock();
        cache.remove(&self.id);
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        let mut locks = self.keys.locks.lock();
        self.guard = None;
        // The map and `self.lock` are the only holders: nobody waits.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_writer_per_key_and_entries_are_dropped() {
        let keys = Keys::new(10);
        let g = keys.lock("b", "k").await;
        let k2 = keys.clone();
        let waiter = tokio::spawn(async move { k2.lock("b", "k").await.key().to_owned() });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished());
        let other = keys.lock("b", "other").await;
        drop(other);
        drop(g);
        assert_eq!(waiter.await.expect("joined"), "k");
        assert_eq!(keys.locked(), 0);
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let keys = Keys::new(2);
        for k in ["a", "b", "c"] {
            keys.lock("b", k).await.remember(Known::Absent);
        }
        assert_eq!(keys.cached(), 2);
        // The first key keeps its place; the newest is in the window, and
        // the one it pushed out is forgotten.
        assert_eq!(keys.lock("b", "a").await.known(), Some(Known::Absent));
        assert_eq!(keys.lock("b", "b").await.known(), None);
        assert_eq!(keys.lock("b", "c").await.known(), Some(Known::Absent));
    }

    #[tokio::test]
    async fn rewrites_of_more_keys_than_the_cache_holds_still_hit() {
        // What BENCHMARKS.md's growth section measures: 10 times the
        // capacity, rewritten in the same order. An LRU hits 0 here.
        let (cap, n) = (100, 1_000);
        let keys = Keys::new(cap);
        let present = |i: usize| Known::Present {
            etag: format!("e{i}"),
            token: 1,
        };
        let mut hits = 0;
        for round in 0..3 {
            for i in 0..n {
                let g = keys.lock("b", &format!("k{i}")).await;
                if let Some(k) = g.known() {
                    assert_eq!(k, present(i), "a hit is the key's own state");
                    hits += usize::from(round > 0);
                }
                g.remember(present(i));
            }
        }
        let rate = hits as f64 / (2 * n) as f64;
        assert!((0.08..=0.1).contains(&rate), "hit rate {rate}");
        assert!(keys.cached() <= cap);
        assert_eq!(keys.locked(), 0);
        // forget still forgets.
        let g = keys.lock("b", "k0").await;
        g.remember(present(0));
        g.forget();
        assert_eq!(g.known(), None);
    }
}
