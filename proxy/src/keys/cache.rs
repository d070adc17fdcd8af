//! The ETag cache's replacement policy: bounded, and scan-resistant.
//!
//! The workload it serves is a backup tool rewriting its keys run after
//! run: a cyclic scan, often over more keys than the cache holds. An LRU
//! (and FIFO, CLOCK, SIEVE: every policy that evicts the oldest unreferenced
//! entry) thrashes on such a scan: each key is evicted just before it comes
//! back, so the hit rate is 0. Here, once the cache is full, the entries
//! already in it keep their place unless a newcomer proves it is reused,
//! so a cyclic scan over `n > capacity` keys keeps hitting: about
//! `0.9 · capacity / n` of the time once `n` is a few times the capacity
//! (the ghost, below, never sees those keys again), down to about
//! `0.65 · capacity / n` for `n` of 1.5 to 2 times the capacity (there the
//! ghost lets some scanned keys into main, which costs others their place).
//! A working set that fits is cached whole.
//!
//! Three parts, as in S3-FIFO (Yang et al., SOSP 2023), with one change
//! that matters for scans:
//!
//! - **main** (90 % of the capacity): a CLOCK. A hit sets the entry's
//!   reference bit; to make room, the hand clears set bits and evicts the
//!   first entry whose bit is clear. While main has room, new keys go
//!   straight into it (S3-FIFO would send them through the window, and
//!   on a scan main would stay empty);
//! - **window** (10 %): a FIFO for new keys once main is full. A hit in the
//!   window promotes the entry to main; an entry that reaches the end of
//!   the window without a hit is dropped and its hash recorded in the ghost;
//! - **ghost** (hashes of the last `capacity` keys dropped from the window,
//!   no values): a key that comes back while its hash is there is reused on
//!   a distance the window was too short to see, and goes straight to main.
//!   A scan longer than the ghost never hits it, so it leaves main alone.
//!
//! Every operation is O(1) amortized; memory is bounded by the capacity
//! (entries) plus the ghost (two `u64` per remembered hash).

use hashbrown::HashTable;
use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};

/// Where an entry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Main,
    Window,
}

#[derive(Debug)]
struct Entry<K, V> {
    key: K,
    hash: u64,
    value: V,
    segment: Segment,
    /// Set on a hit in main; cleared by the CLOCK hand.
    referenced: bool,
    /// Distinguishes this entry from earlier users of its slot, so a queue
    /// position left behind (promotion, removal) is recognised as stale.
    generation: u64,
}

/// A position in `main` or `window`: valid while the slot still holds the
/// entry of that generation in that segment.
type Position = (usize, u64);

/// A bounded map with the policy described in the module documentation.
#[derive(Debug)]
pub(crate) struct ScanResistantCache<K, V> {
    hasher: RandomState,
    /// Slot indices, found by the key's hash.
    index: HashTable<usize>,
    slots: Vec<Option<Entry<K, V>>>,
    free: Vec<usize>,
    next_generation: u64,
    /// CLOCK order; the front is the hand.
    main: VecDeque<Position>,
    main_len: usize,
    main_cap: usize,
    /// Oldest at the front.
    window: VecDeque<Position>,
    window_len: usize,
    window_cap: usize,
    /// Hashes dropped from the window, oldest first, with a sequence number
    /// so that a hash re-recorded later is not forgotten with its older copy.
    ghost: VecDeque<(u64, u64)>,
    ghost_seq: HashMap<u64, u64>,
    ghost_cap: usize,
    next_seq: u64,
}

impl<K: Hash + Eq, V> ScanResistantCache<K, V> {
    /// A cache of at most `capacity` entries (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        // 10 % window, at least one entry; a cache of one entry has only a
        // main part (and the ghost to let a reused key replace it).
        let window_cap = if capacity == 1 {
            0
        } else {
            (capacity / 10).max(1)
        };
        ScanResistantCache {
            hasher: RandomState::new(),
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            next_generation: 0,
            main: VecDeque::new(),
            main_len: 0,
            main_cap: capacity - window_cap,
            window: VecDeque::new(),
            window_len: 0,
            window_cap,
            ghost: VecDeque::new(),
            ghost_seq: HashMap::new(),
            ghost_cap: capacity,
            next_seq: 0,
        }
    }

    /// Number of entries held.
    pub(crate) fn len(&self) -> usize {
        self.main_len + self.window_len
    }

    fn find<Q: Eq + ?Sized>(&self, key: &Q, hash: u64) -> Option<usize>
    where
        K: Borrow<Q>,
    {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| {
                slots[i].as_ref().is_some_and(|e| e.key.borrow() == key)
            })
            .copied()
    }

    /// The key held equal to `key`, if any (not counted as an access): a
    /// caller that shares keys takes the cache's copy.
    pub(crate) fn key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&K>
    where
        K: Borrow<Q>,
    {
        let slot = self.find(key, self.hasher.hash_one(key))?;
        Some(&self.entry(slot).key)
    }

    fn entry(&self, slot: usize) -> &Entry<K, V> {
        match &self.slots[slot] {
            Some(e) => e,
            None => unreachable!("the index only names occupied slots"),
        }
    }

    fn entry_mut(&mut self, slot: usize) -> &mut Entry<K, V> {
        match &mut self.slots[slot] {
            Some(e) => e,
            None => unreachable!("the index only names occupied slots"),
        }
    }

    /// The value of `key`, counting the access (a hit).
    pub(crate) fn get<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        let hash = self.hasher.hash_one(key);
        let slot = self.find(key, hash)?;
        self.touch(slot);
        Some(&self.entry(slot).value)
    }

    /// Records an access to the entry in `slot`.
    fn touch(&mut self, slot: usize) {
        let entry = self.entry_mut(slot);
        match entry.segment {
            Segment::Main => entry.referenced = true,
            Segment::Window => {
                // Reused within the window: it earned a place in main. Its
                // window position goes stale (the segment no longer matches).
                entry.segment = Segment::Main;
                entry.referenced = false;
                let pos = (slot, entry.generation);
                self.window_len -= 1;
                self.main.push_back(pos);
                self.main_len += 1;
                // The total is unchanged: main may run over its share
                // until the next newcomer needs the room (`make_room`),
                // so a working set of exactly the capacity stays whole.
            }
        }
    }

    /// Sets `key` to `value`. An existing key counts as accessed.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        let hash = self.hasher.hash_one(&key);
        if let Some(slot) = self.find(&key, hash) {
            self.touch(slot);
            self.entry_mut(slot).value = value;
            return;
        }
        let to_main = self.main_len < self.main_cap || self.ghost_take(hash);
        let segment = if to_main {
            Segment::Main
        } else {
            Segment::Window
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let entry = Entry {
            key,
            hash,
            value,
            segment,
            referenced: false,
            generation,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(entry);
                i
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, slot, |&i| slots[i].as_ref().map_or(0, |e| e.hash));
        if to_main {
            self.main.push_back((slot, generation));
            self.main_len += 1;
        } else {
            self.window.push_back((slot, generation));
            self.window_len += 1;
        }
        self.make_room(slot);
    }

    /// Evicts until the cache fits its capacity: from main while main is
    /// over its share (the CLOCK hand), else from the window (oldest
    /// first). Never evicts `keep`, the entry just added, unless it is the
    /// only candidate.
    fn make_room(&mut self, keep: usize) {
        while self.len() > self.main_cap + self.window_cap {
            if self.main_len > self.main_cap {
                self.evict_main_one(keep);
            } else {
                self.evict_window_one();
            }
        }
    }

    /// Removes `key`.
    pub(crate) fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
    {
        let hash = self.hasher.hash_one(key);
        if let Some(slot) = self.find(key, hash) {
            // Its queue position goes stale with the slot's generation.
            self.drop_slot(slot);
            self.compact();
        }
    }

    /// Frees `slot`: out of the index and its segment's count.
    fn drop_slot(&mut self, slot: usize) -> Option<Entry<K, V>> {
        let entry = self.slots[slot].take()?;
        if let Ok(found) = self.index.find_entry(entry.hash, |&i| i == slot) {
            found.remove();
        }
        match entry.segment {
            Segment::Main => self.main_len -= 1,
            Segment::Window => self.window_len -= 1,
        }
        self.free.push(slot);
        Some(entry)
    }

    fn valid(&self, (slot, generation): Position, segment: Segment) -> bool {
        self.slots[slot]
            .as_ref()
            .is_some_and(|e| e.generation == generation && e.segment == segment)
    }

    /// Runs the CLOCK hand until it evicts one entry of main.
    fn evict_main_one(&mut self, keep: usize) {
        while let Some(pos) = self.main.pop_front() {
            if !self.valid(pos, Segment::Main) {
                continue;
            }
            let (slot, _) = pos;
            let only = self.main_len == 1;
            let entry = self.entry_mut(slot);
            if (entry.referenced || slot == keep) && !only {
                entry.referenced = false;
                self.main.push_back(pos);
            } else {
                self.drop_slot(slot);
                return;
            }
        }
    }

    /// Drops the oldest window entry, remembering its hash in the ghost.
    fn evict_window_one(&mut self) {
        while let Some(pos) = self.window.pop_front() {
            if !self.valid(pos, Segment::Window) {
                continue;
            }
            if let Some(entry) = self.drop_slot(pos.0) {
                self.ghost_put(entry.hash);
            }
            return;
        }
    }

    fn ghost_put(&mut self, hash: u64) {
        if self.ghost_cap == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ghost_seq.insert(hash, seq);
        self.ghost.push_back((hash, seq));
        while self.ghost.len() > self.ghost_cap {
            if let Some((h, s)) = self.ghost.pop_front()
                && self.ghost_seq.get(&h) == Some(&s)
            {
                self.ghost_seq.remove(&h);
            }
        }
    }

    /// True (and forgets it) if `hash` was dropped from the window lately.
    fn ghost_take(&mut self, hash: u64) -> bool {
        self.ghost_seq.remove(&hash).is_some()
    }

    /// Drops stale positions once they outnumber live ones, so removals
    /// without evictions cannot grow the queues without bound.
    fn compact(&mut self) {
        if self.main.len() > 2 * self.main_len + 64 {
            self.main = self.live_of(&self.main, Segment::Main);
        }
        if self.window.len() > 2 * self.window_len + 64 {
            self.window = self.live_of(&self.window, Segment::Window);
        }
    }

    /// The positions of `queue` still valid in `segment`, in order.
    fn live_of(&self, queue: &VecDeque<Position>, segment: Segment) -> VecDeque<Position> {
        queue
            .iter()
            .copied()
            .filter(|&p| self.valid(p, segment))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hit rate of `get`-then-`insert` per access, as the proxy uses it.
    fn hit_rate(c: &mut ScanResistantCache<u64, u64>, keys: impl Iterator<Item = u64>) -> f64 {
        let (mut hits, mut n) = (0usize, 0usize);
        for k in keys {
            hits += usize::from(c.get(&k).is_some());
            c.insert(k, k);
            n += 1;
        }
        hits as f64 / n as f64
    }

    #[test]
    fn a_cyclic_scan_larger_than_the_cache_keeps_hitting() {
        let cap = 1_000u64;
        for n in [1_500u64, 2_000, 4_000, 10_000] {
            let mut c = ScanResistantCache::new(cap as usize);
            hit_rate(&mut c, 0..n);
            let rate = hit_rate(&mut c, (0..5 * n).map(|i| i % n));
            let ideal = cap as f64 / n as f64;
            assert!(
                rate >= 0.6 * ideal && rate <= ideal,
                "n = {n}: hit rate {rate}, capacity/n = {ideal}"
            );
            assert!(c.len() <= cap as usize);
        }
    }

    #[test]
    fn a_working_set_that_fits_is_cached_whole() {
        for n in [900, 1_000] {
            let mut c = ScanResistantCache::new(1_000);
            hit_rate(&mut c, 0..n);
            assert_eq!(hit_rate(&mut c, (0..9 * n).map(|i| i % n)), 1.0, "n = {n}");
        }
    }

    #[test]
    fn a_new_working_set_replaces_an_old_one() {
        // Main is full of keys nobody asks for any more; a new set of 500
        // keys, each reused only after the window has moved on, must still
        // get in (through the ghost) and then hit.
        let mut c = ScanResistantCache::new(1_000);
        hit_rate(&mut c, 0..1_000);
        hit_rate(&mut c, (0..1_500).map(|i| 10_000 + i % 500));
        let rate = hit_rate(&mut c, (0..5_000).map(|i| 10_000 + i % 500));
        assert!(rate > 0.95, "hit rate {rate}");
    }

    #[test]
    fn random_access_hits_about_capacity_over_n() {
        let mut c = ScanResistantCache::new(1_000);
        let mut x = 88172645463325252u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 10_000
        };
        hit_rate(&mut c, (0..20_000).map(|_| next()));
        let rate = hit_rate(&mut c, (0..100_000).map(|_| next()));
        assert!((0.07..=0.12).contains(&rate), "hit rate {rate}");
    }

    #[test]
    fn bounded_through_removals_and_tiny_capacities() {
        for cap in [1usize, 2, 3, 10] {
            let mut c = ScanResistantCache::new(cap);
            for i in 0..10_000u64 {
                c.insert(i % 37, i);
                if i % 3 == 0 {
                    c.remove(&(i % 5));
                }
                assert!(c.len() <= cap, "cap {cap}");
            }
            assert!(c.main.len() + c.window.len() <= 4 * cap + 200);
            assert!(c.ghost.len() <= cap);
        }
        // The value is the last one set, and a removed key is gone.
        let mut c = ScanResistantCache::new(4);
        c.insert(1, 10);
        c.insert(1, 11);
        assert_eq!(c.get(&1), Some(&11));
        c.remove(&1);
        assert_eq!(c.get(&1), None);
        assert_eq!(c.len(), 0);
    }
}
