//! The lease state machine (design rules 1 and 2).
//!
//! A [`LockTable`] holds one global token counter and, per lock, the current
//! lease. The counter is global rather than per lock so that "every token
//! ever returned" is one number: after a restart the service only needs the
//! counter to promise that every new token is higher than all earlier ones.
//!
//! Transitions, for a lock `L` at time `now`:
//!
//! | state of `L`                              | acquire by `o` with key `k`          | renew with token `t`            |
//! |-------------------------------------------|--------------------------------------|---------------------------------|
//! | free, released, or expired                | counter += 1, grant to `o` (keeps `k`) | refused: lease lost           |
//! | live, granted to `o` with the same `k`    | same token, expires `now + ttl`      | same token if `t` matches       |
//! | live, anything else                       | refused with holder and expiry       | refused unless `t` matches      |
//!
//! A lease is live while `now < expires_at`. A renewal (and an idempotent
//! re-acquire) sets the expiry to exactly `now + ttl`, shorter or longer
//! than before, so the expiry the caller is told is the one in force.
//!
//! An acquire is idempotent (same token; it answers a client that retried
//! after losing the first answer) only when it presents the secret
//! idempotency key of the acquire that created the lease. Owner names are
//! public (status and refusals show them), so a name alone would hand the
//! lease and its proofs to anyone who read it (design rule 7): an acquire
//! naming the live holder without its key is refused like any other.

use crate::name::LockName;
use crate::time::Timestamp;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use subtle::ConstantTimeEq as _;

/// The SHA-256 digest of the secret idempotency key a client sent with the
/// acquire that created a lease.
///
/// Only the digest is kept (in memory and in the database), so reading the
/// database does not give anyone the key; a key is a client-chosen secret of
/// at least 16 bytes, so the digest cannot be searched back either.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    /// The digest of `key`.
    pub fn of(key: &[u8]) -> KeyDigest {
        KeyDigest(Sha256::digest(key).into())
    }

    /// A digest as stored.
    pub fn from_bytes(bytes: [u8; 32]) -> KeyDigest {
        KeyDigest(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Constant-time comparison: the decision never depends on how many
    /// leading bytes agree.
    pub fn matches(&self, other: &KeyDigest) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A digest of a secret is not secret, but nothing needs to see it.
        f.write_str("KeyDigest(..)")
    }
}

/// A lease: `owner` holds `lock` with fencing `token` until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lock: LockName,
    pub owner: String,
    pub token: u64,
    pub expires_at: Timestamp,
    /// The digest of the idempotency key sent with the acquire that created
    /// the lease, if one was sent: the only thing that makes a later acquire
    /// "the same client".
    pub idempotency: Option<KeyDigest>,
}

impl Lease {
    /// True while the lease has not expired.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }

    /// True if an acquire by `owner` presenting `key` comes from the client
    /// this lease was granted to: same owner, and the same idempotency key.
    /// Without a key on both sides nothing proves it, so the answer is no.
    pub fn granted_to(&self, owner: &str, key: Option<&KeyDigest>) -> bool {
        match (&self.idempotency, key) {
            (Some(mine), Some(theirs)) => mine.matches(theirs) && self.owner == owner,
            _ => false,
        }
    }
}

/// What an acquire does about a lock's current lease: the one rule both
/// backends apply (the SQLite engine through [`LockTable::acquire`], the
/// etcd backend in its grant loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireStep {
    /// No lease: grant a new token.
    Grant,
    /// Only an expired lease: its record goes, then a new token is granted
    /// (an expired lease is never extended, even for its own holder).
    ClearExpired,
    /// The caller's own live lease (same owner, same idempotency key): a
    /// retried acquire, which extends it with the same token.
    Extend,
    /// Another client's live lease: wait in line, or be refused.
    Held,
}

impl AcquireStep {
    /// The step for an acquire by `owner` with idempotency `key` at `now`,
    /// finding `current` at the lock.
    pub fn of(
        current: Option<&Lease>,
        owner: &str,
        key: Option<&KeyDigest>,
        now: Timestamp,
    ) -> AcquireStep {
        match current {
            None => AcquireStep::Grant,
            Some(l) if !l.is_live(now) => AcquireStep::ClearExpired,
            Some(l) if l.granted_to(owner, key) => AcquireStep::Extend,
            Some(_) => AcquireStep::Held,
        }
    }
}

/// What a renew of `token` does about the lock's recorded lease: the rule
/// both backends apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewStep {
    /// The live lease holding `token`: its expiry moves (the token never
    /// changes on renewal).
    Extend,
    /// No live lease holds `token` (it expired, was released, or another
    /// holder has the lock): the holder must acquire again, and gets a new
    /// token.
    NotHolder,
}

impl RenewStep {
    /// The step for a renew of `token` at `now`, finding `current`.
    pub fn of(current: Option<&Lease>, token: u64, now: Timestamp) -> RenewStep {
        match current {
            Some(l) if l.token == token && l.is_live(now) => RenewStep::Extend,
            _ => RenewStep::NotHolder,
        }
    }
}

/// What a release of `token` does about the lock's recorded lease: the
/// rule both backends apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseStep {
    /// The lease holding `token`, live or expired: it goes, and the lock
    /// is free at once.
    Remove,
    /// Another lease is live, or one newer than `token` was granted:
    /// refused.
    NotHolder,
    /// Nothing newer than `token` holds the lock: its lease already ended
    /// (released, perhaps by an earlier attempt of this very call, or
    /// expired and purged). Releasing it again changes nothing, and is not
    /// an error (a client may retry).
    AlreadyEnded,
}

impl ReleaseStep {
    /// The step for a release of `token` at `now`, finding `current`;
    /// `issued` says whether the service issued `token` at all (a token
    /// above every one issued ended nothing).
    pub fn of(current: Option<&Lease>, token: u64, now: Timestamp, issued: bool) -> ReleaseStep {
        match current {
            Some(l) if l.token == token => ReleaseStep::Remove,
            Some(l) if crate::fence::is_stale(l.token, token) || l.is_live(now) => {
                ReleaseStep::NotHolder
            }
            _ if issued => ReleaseStep::AlreadyEnded,
            _ => ReleaseStep::NotHolder,
        }
    }
}

/// A successful acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub lease: Lease,
    /// True when this grant issued a new token (the counter moved and must be
    /// made durable before the grant is answered); false when the live holder
    /// re-acquired and kept its token.
    pub new_token: bool,
}

/// An acquire refused because someone else holds a live lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub holder: Lease,
}

/// A renew or release refused: the caller's token is not the live lease's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotHolder {
    /// The lease that is live now, if any.
    pub current: Option<Lease>,
}

/// The highest token the service will issue (see [`crate::token::MAX_TOKEN`]).
pub use crate::token::MAX_TOKEN;

/// All locks and the token counter.
#[derive(Debug, Clone, Default)]
pub struct LockTable {
    /// The last token issued; the next grant issues `counter + 1`.
    counter: u64,
    /// The latest lease per lock; it may have expired (then the lock is free).
    leases: HashMap<LockName, Lease>,
    /// Every lease in `leases`, ordered by expiry: what makes the periodic
    /// purge cost O(expired · log n) instead of a scan of every lease.
    /// Keyed by `(expires_at, token)`: a token names one grant (the counter
    /// issues each once), so the key is unique per lease and is found again
    /// from the lease alone. Kept exactly in step with `leases`: every
    /// change of a lease's expiry removes its old key and inserts the new.
    deadlines: BTreeMap<(Timestamp, u64), LockName>,
}

impl LockTable {
    /// An empty table whose next token is 1.
    pub fn new() -> LockTable {
        LockTable::default()
    }

    /// Rebuilds a table from persisted state: the last issued token and the
    /// leases that were recorded. Leases are kept with their recorded expiry,
    /// so a lease that was live at a crash stays held for its remaining time.
    pub fn restore(counter: u64, leases: impl IntoIterator<Item = Lease>) -> LockTable {
        let leases: HashMap<_, _> = leases.into_iter().map(|l| (l.lock.clone(), l)).collect();
        // A recorded lease can never carry a token above the counter, but if a
        // damaged store said so, trusting the larger number keeps tokens
        // monotonic.
        let counter = leases.values().map(|l| l.token).fold(counter, u64::max);
        // A store written by this service never holds two leases with one
        // token; if a damaged one did (with the same expiry too), the index
        // would know only one of them, and the other would not be purged
        // until its lock is taken again: a cost in memory, never in safety,
        // since `live` reads the lease's own expiry, not the index.
        let deadlines = leases
            .values()
            .map(|l| ((l.expires_at, l.token), l.lock.clone()))
            .collect();
        LockTable {
            counter,
            leases,
            deadlines,
        }
    }

    /// The locks whose latest lease is live at `now`.
    pub fn live_locks(&self, now: Timestamp) -> impl Iterator<Item = &LockName> {
        self.leases
            .values()
            .filter(move |l| l.is_live(now))
            .map(|l| &l.lock)
    }

    /// The last token issued (0 if none).
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Grants `lock` to `owner` for `ttl`, or says who holds it.
    ///
    /// `key` is the digest of the client's idempotency key, if it sent one.
    /// A live lease is given back (same token) only to an acquire with the
    /// same owner and the same key; see the module documentation.
    pub fn acquire(
        &mut self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Grant, Held> {
        let expires_at = now.saturating_add(ttl);
        match AcquireStep::of(self.leases.get(lock), owner, key.as_ref(), now) {
            AcquireStep::Held => {
                if let Some(lease) = self.leases.get(lock) {
                    return Err(Held {
                        holder: lease.clone(),
                    });
                }
            }
            AcquireStep::Extend => {
                if let Some(lease) = self.leases.get_mut(lock) {
                    Self::reschedule(&mut self.deadlines, lease, expires_at);
                    return Ok(Grant {
                        lease: lease.clone(),
                        new_token: false,
                    });
                }
            }
            // The expired lease is replaced below.
            AcquireStep::Grant | AcquireStep::ClearExpired => {}
        }
        // `restore` refuses a counter at MAX_TOKEN, and reaching it from
        // there takes 2^63 grants; saturating keeps this total anyway.
        self.counter = self.counter.saturating_add(1);
        let lease = Lease {
            lock: lock.clone(),
            owner: owner.to_owned(),
            token: self.counter,
            expires_at,
            idempotency: key,
        };
        if let Some(old) = self.leases.insert(lock.clone(), lease.clone()) {
            Self::unindex(&mut self.deadlines, &old);
        }
        self.deadlines
            .insert((lease.expires_at, lease.token), lock.clone());
        Ok(Grant {
            lease,
            new_token: true,
        })
    }

    /// Sets the live lease holding `token` to expire `ttl` from now (a
    /// shorter TTL than before shortens it: the answer is then the truth,
    /// and ending a lease early is always safe). The token never changes on
    /// renewal; an expired lease cannot be renewed (the holder must acquire
    /// again and gets a new token).
    pub fn renew(
        &mut self,
        lock: &LockName,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, NotHolder> {
        match (
            RenewStep::of(self.leases.get(lock), token, now),
            self.leases.get_mut(lock),
        ) {
            (RenewStep::Extend, Some(lease)) => {
                Self::reschedule(&mut self.deadlines, lease, now.saturating_add(ttl));
                Ok(lease.clone())
            }
            _ => Err(NotHolder {
                current: self.live(lock, now),
            }),
        }
    }

    /// Ends the lease holding `token`, live or expired, so the lock is free
    /// at once. Releasing a lease that was already released is not an error
    /// (a client may retry); releasing someone else's lease is.
    pub fn release(
        &mut self,
        lock: &LockName,
        token: u64,
        now: Timestamp,
    ) -> Result<(), NotHolder> {
        let issued = !crate::fence::raises(self.counter, token);
        match ReleaseStep::of(self.leases.get(lock), token, now, issued) {
            ReleaseStep::Remove => {
                if let Some(lease) = self.leases.remove(lock) {
                    Self::unindex(&mut self.deadlines, &lease);
                }
                Ok(())
            }
            ReleaseStep::AlreadyEnded => Ok(()),
            ReleaseStep::NotHolder => Err(NotHolder {
                current: self.live(lock, now),
            }),
        }
    }

    /// The live lease on `lock`, if any.
    pub fn live(&self, lock: &LockName, now: Timestamp) -> Option<Lease> {
        self.leases.get(lock).filter(|l| l.is_live(now)).cloned()
    }

    /// The recorded lease on `lock`, live or expired.
    pub fn recorded(&self, lock: &LockName) -> Option<&Lease> {
        self.leases.get(lock)
    }

    /// Forgets leases that expired by `now` and returns their locks, in
    /// expiry order (earliest first; ties by token, i.e. grant order).
    /// Expired leases carry no meaning (the counter alone keeps tokens
    /// monotonic), so dropping them only bounds memory.
    ///
    /// Costs O(expired · log n): the deadline index is read from its
    /// earliest end and stops at the first live lease.
    pub fn purge_expired(&mut self, now: Timestamp) -> Vec<LockName> {
        let mut expired = Vec::new();
        while let Some(entry) = self.deadlines.first_entry() {
            let (expires_at, _) = *entry.key();
            // Live while `now < expires_at` (`Lease::is_live`).
            if now < expires_at {
                break;
            }
            let lock = entry.remove();
            self.leases.remove(&lock);
            expired.push(lock);
        }
        expired
    }

    /// The earliest expiry among recorded leases that are still live.
    /// O(log n).
    pub fn next_expiry(&self, now: Timestamp) -> Option<Timestamp> {
        let after = Timestamp(now.0.checked_add(1)?);
        self.deadlines
            .range((after, 0)..)
            .next()
            .map(|(&(expires_at, _), _)| expires_at)
    }

    /// Moves `lease` to expire at `expires_at`, keeping the index in step.
    fn reschedule(
        deadlines: &mut BTreeMap<(Timestamp, u64), LockName>,
        lease: &mut Lease,
        expires_at: Timestamp,
    ) {
        Self::unindex(deadlines, lease);
        lease.expires_at = expires_at;
        deadlines.insert((expires_at, lease.token), lease.lock.clone());
    }

    /// Removes `lease`'s index entry, if the entry is its own (see
    /// `restore` for the one way it might not be).
    fn unindex(deadlines: &mut BTreeMap<(Timestamp, u64), LockName>, lease: &Lease) {
        let key = (lease.expires_at, lease.token);
        if deadlines.get(&key) == Some(&lease.lock) {
            deadlines.remove(&key);
        }
    }

    /// The index agrees with the leases, entry for entry (for tests).
    #[cfg(test)]
    fn index_consistent(&self) -> bool {
        self.deadlines.len() == self.leases.len()
            && self.deadlines.iter().all(|(&(at, token), lock)| {
                self.leases
                    .get(lock)
                    .is_some_and(|l| l.expires_at == at && l.token == token)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new table and the lock `name`.
    fn table_and(name: &str) -> (LockTable, LockName) {
        (LockTable::new(), lock(name))
    }

    /// A table where `A` holds `x` from 0 for `TTL` under the idempotency
    /// key digest returned.
    fn held_with_key() -> (LockTable, LockName, KeyDigest) {
        let (mut t, l) = table_and("x");
        let k = KeyDigest::of(b"alice-secret-0123456789");
        t.acquire(&l, "A", Some(k), TTL, Timestamp(0))
            .expect("free");
        (t, l, k)
    }

    /// When the live lease of `l` expires, seen at `at`.
    fn expiry(t: &LockTable, l: &LockName, at: u64) -> Option<Timestamp> {
        t.live(l, Timestamp(at)).map(|x| x.expires_at)
    }

    fn lock(s: &str) -> LockName {
        LockName::new(s).expect("valid lock name")
    }
    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn the_renew_and_release_steps_both_backends_take() {
        let lease = Lease {
            lock: lock("l"),
            owner: "A".into(),
            token: 3,
            expires_at: Timestamp(100),
            idempotency: None,
        };
        let renew = |current, token, now| RenewStep::of(current, token, Timestamp(now));
        assert_eq!(renew(Some(&lease), 3, 99), RenewStep::Extend);
        assert_eq!(renew(Some(&lease), 3, 100), RenewStep::NotHolder, "expired");
        assert_eq!(
            renew(Some(&lease), 2, 99),
            RenewStep::NotHolder,
            "another's"
        );
        assert_eq!(renew(None, 3, 0), RenewStep::NotHolder, "released");

        for (current, token, now, issued, step, why) in [
            (
                Some(&lease),
                3,
                200,
                true,
                ReleaseStep::Remove,
                "expired too",
            ),
            (
                Some(&lease),
                2,
                200,
                true,
                ReleaseStep::NotHolder,
                "newer granted",
            ),
            (
                Some(&lease),
                4,
                99,
                true,
                ReleaseStep::NotHolder,
                "another is live",
            ),
            (
                Some(&lease),
                4,
                100,
                true,
                ReleaseStep::AlreadyEnded,
                "it ended",
            ),
            (None, 4, 0, true, ReleaseStep::AlreadyEnded, "a retry"),
            (None, 4, 0, false, ReleaseStep::NotHolder, "never issued"),
        ] {
            assert_eq!(
                ReleaseStep::of(current, token, Timestamp(now), issued),
                step,
                "{why}"
            );
        }
    }

    #[test]
    fn the_acquire_step_both_backends_take() {
        let k = KeyDigest::of(b"alice-secret-0123456789");
        let lease = Lease {
            lock: lock("l"),
            owner: "A".into(),
            token: 3,
            expires_at: Timestamp(100),
            idempotency: Some(k),
        };
        let step = |current, owner, key: Option<&KeyDigest>, now| {
            AcquireStep::of(current, owner, key, Timestamp(now))
        };
        assert_eq!(step(None, "A", Some(&k), 0), AcquireStep::Grant);
        assert_eq!(step(Some(&lease), "A", Some(&k), 99), AcquireStep::Extend);
        assert_eq!(
            step(Some(&lease), "A", None, 99),
            AcquireStep::Held,
            "no key, no proof"
        );
        assert_eq!(step(Some(&lease), "B", Some(&k), 99), AcquireStep::Held);
        assert_eq!(
            step(Some(&lease), "A", Some(&k), 100),
            AcquireStep::ClearExpired,
            "an expired lease is never extended"
        );
    }

    #[test]
    fn the_reference_scenario() {
        let mut t = LockTable::new();
        let l = lock("backup");
        let a = t
            .acquire(&l, "A", None, TTL, Timestamp(0))
            .expect("A gets the lock");
        assert_eq!((a.lease.token, a.new_token), (1, true));

        let held = t
            .acquire(&l, "B", None, TTL, Timestamp(5_000))
            .expect_err("A is live");
        assert_eq!(held.holder.owner, "A");
        assert_eq!(held.holder.expires_at, Timestamp(10_000));

        // A pauses past its expiry; B takes over with a higher token.
        let b = t
            .acquire(&l, "B", None, TTL, Timestamp(10_000))
            .expect("A expired");
        assert_eq!(b.lease.token, 2);

        // A wakes up and tries to renew: its lease is gone.
        let lost = t
            .renew(&l, 1, TTL, Timestamp(10_001))
            .expect_err("A lost it");
        assert_eq!(lost.current.map(|c| c.token), Some(2));
    }

    #[test]
    fn renewal_keeps_the_token_and_extends() {
        let (mut t, l) = table_and("x");
        t.acquire(&l, "A", None, TTL, Timestamp(0)).expect("free");
        let r = t.renew(&l, 1, TTL, Timestamp(9_000)).expect("live");
        assert_eq!((r.token, r.expires_at), (1, Timestamp(19_000)));
        assert_eq!(t.counter(), 1);
    }

    #[test]
    fn expired_lease_cannot_be_renewed_even_if_nobody_took_it() {
        let (mut t, l) = table_and("x");
        t.acquire(&l, "A", None, TTL, Timestamp(0)).expect("free");
        let lost = t.renew(&l, 1, TTL, Timestamp(10_000)).expect_err("expired");
        assert_eq!(lost.current, None);
    }

    #[test]
    fn same_owner_after_expiry_or_release_gets_a_new_token() {
        let (mut t, l) = table_and("x");
        t.acquire(&l, "A", None, TTL, Timestamp(0)).expect("free");
        let again = t
            .acquire(&l, "A", None, TTL, Timestamp(10_000))
            .expect("expired");
        assert_eq!((again.lease.token, again.new_token), (2, true));
        t.release(&l, 2, Timestamp(10_001))
            .expect("holder releases");
        let third = t
            .acquire(&l, "A", None, TTL, Timestamp(10_002))
            .expect("released");
        assert_eq!(third.lease.token, 3);
    }

    #[test]
    fn reacquire_with_the_same_key_is_idempotent_and_tells_the_truth() {
        let (mut t, l, k) = held_with_key();
        let again = t
            .acquire(&l, "A", Some(k), TTL, Timestamp(1_000))
            .expect("own lease");
        assert_eq!((again.lease.token, again.new_token), (1, false));
        assert_eq!(again.lease.expires_at, Timestamp(11_000));
        // A shorter TTL is applied, not ignored.
        let short = t
            .acquire(&l, "A", Some(k), Duration::from_secs(1), Timestamp(2_000))
            .expect("own lease");
        assert_eq!(short.lease.expires_at, Timestamp(3_000));
        assert_eq!(expiry(&t, &l, 2_500), Some(Timestamp(3_000)));
    }

    #[test]
    fn the_holders_name_without_its_key_is_refused() {
        let (mut t, l, k) = held_with_key();
        for (key, why) in [
            (None, "no key"),
            (Some(KeyDigest::of(b"guessed-0123456789")), "another key"),
        ] {
            let held = t
                .acquire(&l, "A", key, TTL, Timestamp(1_000))
                .expect_err(why);
            assert_eq!(
                (held.holder.token, held.holder.expires_at),
                (1, Timestamp(10_000)),
                "{why}"
            );
        }
        // The right key under another name is not the holder either.
        assert!(t.acquire(&l, "B", Some(k), TTL, Timestamp(1_000)).is_err());
        // A lease taken without a key cannot be re-acquired at all while live.
        let m = lock("y");
        t.acquire(&m, "A", None, TTL, Timestamp(0)).expect("free");
        assert!(t.acquire(&m, "A", None, TTL, Timestamp(1)).is_err());
        assert_eq!(expiry(&t, &m, 1), Some(Timestamp(10_000)));
    }

    #[test]
    fn a_shorter_renewal_shortens_the_lease() {
        let (mut t, l) = table_and("x");
        t.acquire(&l, "A", None, TTL, Timestamp(0)).expect("free");
        let r = t
            .renew(&l, 1, Duration::from_secs(1), Timestamp(2_000))
            .expect("live");
        assert_eq!(r.expires_at, Timestamp(3_000));
        assert!(
            t.live(&l, Timestamp(3_000)).is_none(),
            "expired at the new expiry"
        );
        t.acquire(&l, "B", None, TTL, Timestamp(3_000))
            .expect("free after the shortened lease");
    }

    #[test]
    fn release_by_a_stale_holder_is_refused() {
        let (mut t, l) = table_and("x");
        t.acquire(&l, "A", None, TTL, Timestamp(0)).expect("free");
        t.acquire(&l, "B", None, TTL, Timestamp(20_000))
            .expect("expired");
        let err = t.release(&l, 1, Timestamp(20_001)).expect_err("B holds it");
        assert_eq!(err.current.map(|c| c.owner), Some("B".to_owned()));
        // A token that was never issued cannot be released either.
        assert!(t.release(&l, 99, Timestamp(20_001)).is_err());
    }

    #[test]
    fn restore_never_lowers_the_counter() {
        let l = lock("x");
        let t = LockTable::restore(
            3,
            [Lease {
                lock: l.clone(),
                owner: "A".into(),
                token: 5,
                expires_at: Timestamp(100),
                idempotency: None,
            }],
        );
        assert_eq!(t.counter(), 5);
        assert_eq!(t.live(&l, Timestamp(50)).map(|x| x.token), Some(5));
    }

    #[test]
    fn locks_are_independent_but_share_the_counter() {
        let mut t = LockTable::new();
        let a = t
            .acquire(&lock("a"), "A", None, TTL, Timestamp(0))
            .expect("free");
        let b = t
            .acquire(&lock("b"), "B", None, TTL, Timestamp(0))
            .expect("free");
        assert_eq!((a.lease.token, b.lease.token), (1, 2));
    }

    #[test]
    fn purge_returns_exactly_the_expired_leases_in_expiry_order() {
        let mut t = LockTable::new();
        let ms = Duration::from_millis;
        // Granted in an order unlike their expiries.
        for (name, ttl) in [("c", 300), ("a", 100), ("d", 400), ("b", 200), ("e", 200)] {
            t.acquire(&lock(name), "o", None, ms(ttl), Timestamp(0))
                .expect("free");
        }
        // "d" is renewed to expire first, "c" is released: neither may
        // come back from the old expiry.
        t.renew(&lock("d"), 3, ms(50), Timestamp(0)).expect("live");
        t.release(&lock("c"), 1, Timestamp(0)).expect("holder");
        assert!(t.index_consistent());
        assert_eq!(t.next_expiry(Timestamp(0)), Some(Timestamp(50)));

        assert_eq!(t.purge_expired(Timestamp(49)), Vec::<LockName>::new());
        // Live while now < expires_at: a lease expires at its expiry.
        assert_eq!(t.purge_expired(Timestamp(100)), vec![lock("d"), lock("a")]);
        // Equal expiries come out in grant order (b was granted before e).
        assert_eq!(t.next_expiry(Timestamp(100)), Some(Timestamp(200)));
        assert_eq!(
            t.purge_expired(Timestamp(10_000)),
            vec![lock("b"), lock("e")]
        );
        assert!(t.index_consistent());
        assert_eq!(t.next_expiry(Timestamp(10_000)), None);
        assert_eq!(t.recorded(&lock("a")), None);
        assert_eq!(t.counter(), 5, "purging never touches the counter");
    }

    #[test]
    fn the_deadline_index_follows_every_change_of_expiry() {
        let mut t = LockTable::new();
        let k = KeyDigest::of(b"alice-secret-0123456789");
        let l = lock("x");
        t.acquire(&l, "A", Some(k), TTL, Timestamp(0))
            .expect("free");
        // Re-acquire shortens, renew lengthens, expiry then re-grant.
        t.acquire(&l, "A", Some(k), Duration::from_secs(1), Timestamp(500))
            .expect("own lease");
        assert!(t.index_consistent());
        t.renew(&l, 1, Duration::from_secs(2), Timestamp(1_000))
            .expect("live");
        assert!(t.index_consistent());
        assert_eq!(t.next_expiry(Timestamp(1_000)), Some(Timestamp(3_000)));
        assert!(t.purge_expired(Timestamp(2_999)).is_empty());
        t.acquire(&l, "B", None, TTL, Timestamp(3_000))
            .expect("expired, not yet purged");
        assert!(t.index_consistent());
        // The old lease's deadline left with it: nothing expires at 3 000.
        assert!(t.purge_expired(Timestamp(12_999)).is_empty());
        assert_eq!(t.purge_expired(Timestamp(13_000)), vec![l.clone()]);
        // A restored table is indexed too.
        let r = LockTable::restore(
            9,
            [Lease {
                lock: l.clone(),
                owner: "A".into(),
                token: 9,
                expires_at: Timestamp(100),
                idempotency: None,
            }],
        );
        assert!(r.index_consistent());
        assert_eq!(r.next_expiry(Timestamp(0)), Some(Timestamp(100)));
    }

    #[test]
    fn purging_many_leases_costs_only_the_expired_ones() {
        // Not a timing test: the purge must stop at the first live lease,
        // so a table of mostly live leases gives back only the expired.
        let mut t = LockTable::new();
        for i in 0..10_000u64 {
            let ttl = Duration::from_millis(if i % 1000 == 0 { 10 } else { 60_000 });
            t.acquire(&lock(&format!("l{i}")), "o", None, ttl, Timestamp(i))
                .expect("free");
        }
        let gone = t.purge_expired(Timestamp(20_000));
        let want: Vec<LockName> = (0..10).map(|i| lock(&format!("l{}", i * 1000))).collect();
        assert_eq!(gone, want);
        assert!(t.index_consistent());
    }
}
