//! Granting, renewing and releasing, each one compare-and-set transaction
//! on the lock's owner and expiry keys; status, list, import and the sweep
//! of expired records.

use super::*;
use crate::leases::{Acquire, LeaseStore, LockFilter, StorageError};
use fencegate_core::lease::{ReleaseStep, RenewStep};

impl EtcdLeases {
    /// Reads what `acquire` decides on, in one consistent snapshot.
    pub(super) async fn see(
        &self,
        lock: &LockName,
        mine: Option<&str>,
    ) -> Result<Seen, EngineError> {
        let resp = self
            .txn(Txn::new().and_then(self.seeing(lock, mine)))
            .await?;
        self.seen(&resp, mine.is_some())
    }

    /// The reads behind [`Seen`], for a read or a grant's else branch.
    pub(super) fn seeing(&self, lock: &LockName, mine: Option<&str>) -> Vec<TxnOp> {
        let prefix = self.wait_prefix(lock);
        let mut ops = vec![
            TxnOp::get(self.owner_key(lock), None),
            TxnOp::get(self.expiry_key(lock), None),
            TxnOp::get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
            TxnOp::get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
            TxnOp::get(self.epoch_key(), None),
        ];
        if let Some(k) = mine {
            ops.push(TxnOp::get(k, Some(GetOptions::new().with_keys_only())));
        }
        ops
    }

    pub(super) fn seen(&self, resp: &TxnResponse, mine: bool) -> Result<Seen, EngineError> {
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => Some(g),
            _ => None,
        };
        let owner = held_of(
            get(0).and_then(|g| g.kvs().first()),
            get(1).and_then(|g| g.kvs().first()),
        )?;
        let waiters = get(2).map_or(0, |g| usize::try_from(g.count()).unwrap_or(usize::MAX));
        let first_waiter = get(3)
            .and_then(|g| g.kvs().first())
            .map(KeyValue::create_revision);
        let epoch = get(4)
            .and_then(|g| g.kvs().first())
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok());
        let mine_present = mine && get(5).is_some_and(|g| !g.kvs().is_empty());
        Ok(Seen {
            owner,
            waiters,
            first_waiter,
            mine_present,
            epoch,
        })
    }

    /// One grant transaction: creates the owner record if the lock has no
    /// record, the line allows it (`line`: none for a newcomer, which needs
    /// an empty line; or the caller's waiter key and its create revision,
    /// which must be the oldest), and the cluster's epoch is this
    /// replica's. `Ok(Err(seen))` when a condition did not hold.
    pub(super) async fn try_grant(
        &self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        line: Option<(&str, i64)>,
    ) -> Result<Result<Lease, Seen>, EngineError> {
        let expires = clock::now().saturating_add(ttl);
        let record = Record {
            owner: owner.to_owned(),
            idempotency_sha256: key.map(|k| hex::encode(k.as_bytes())),
            epoch: self.inner.epoch,
            token: None,
            grant: grant_id()?,
        };
        let value = serde_json::to_vec(&record).map_err(|e| StorageError::Encode(e.to_string()))?;
        let prefix = self.wait_prefix(lock);
        let mut when = vec![
            Compare::create_revision(self.owner_key(lock), CompareOp::Equal, 0),
            Compare::value(
                self.epoch_key(),
                CompareOp::Equal,
                self.inner.epoch.to_string(),
            ),
        ];
        let mut then = vec![
            TxnOp::put(self.owner_key(lock), value, None),
            TxnOp::put(self.expiry_key(lock), expiry_value(expires), None),
            TxnOp::put(self.granted_key(lock), record.grant.to_string(), None),
        ];
        match line {
            None => {
                when.push(Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix());
                // "No owner and nobody in line" holds again after every
                // release. An attempt of this transaction that reaches a
                // member late (after its retry elsewhere was answered and
                // the lease released) must not grant again: it holds only
                // if the lock was granted no later than the newest store
                // revision this replica has seen, and a retry that granted
                // it is later than that. (A waiter's grant needs no such
                // bound: its own key, which the grant deletes, is in it.)
                when.push(self.granted_at_most_seen(lock));
            }
            Some((mine, rev)) => {
                // Every waiter key is at least as new as mine, and mine is
                // still there: I am first in line.
                when.push(
                    Compare::create_revision(prefix, CompareOp::Greater, rev - 1).with_prefix(),
                );
                when.push(Compare::create_revision(mine, CompareOp::Equal, rev));
                then.push(TxnOp::delete(mine, None));
            }
        }
        let txn = Txn::new()
            .when(when)
            .and_then(then)
            .or_else(self.seeing(lock, line.map(|(k, _)| k)));
        let started = Instant::now();
        let (resp, retried) = self.txn_tracked(txn).await?;
        if !resp.succeeded() {
            let seen = self.seen(&resp, line.is_some())?;
            if let Some(h) = seen.owner.as_ref().filter(|h| {
                retried.0
                    && h.record.grant == record.grant
                    && h.record.owner == record.owner
                    && h.record.idempotency_sha256 == record.idempotency_sha256
            }) {
                // An earlier attempt of this very grant was applied.
                self.inner.metrics.grants.inc();
                return Ok(Ok(h.lease(lock)));
            }
            if let Some(e) = seen.epoch.filter(|e| *e != self.inner.epoch) {
                return Err(EngineError::from(StorageError::Untrusted(format!(
                    "the etcd cluster now runs epoch {e} and this replica epoch {}: restart it with etcd.epoch = {e}",
                    self.inner.epoch
                ))));
            }
            return Ok(Err(seen));
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let revision = u64::try_from(revision).unwrap_or(0);
        if revision == 0 || revision > REVISION_MASK {
            return Err(EngineError::from(StorageError::Untrusted(format!(
                "etcd revision {revision} does not fit below the epoch bits; raise etcd.epoch"
            ))));
        }
        let token = epoch_base(self.inner.epoch) | revision;
        self.inner
            .metrics
            .fsync_seconds
            .observe(started.elapsed().as_secs_f64());
        self.inner.metrics.grants.inc();
        self.inner
            .metrics
            .last_token
            .set(i64::try_from(token).unwrap_or(i64::MAX));
        Ok(Ok(record.lease(lock, token, expires)))
    }

    /// Deletes an expired record (if it is still the one seen).
    pub(super) async fn clear_expired(
        &self,
        lock: &LockName,
        held: &Held,
    ) -> Result<(), EngineError> {
        let resp = self
            .txn(
                Txn::new()
                    .when(held.unchanged(self.owner_key(lock), self.expiry_key(lock)))
                    .and_then([
                        TxnOp::delete(self.owner_key(lock), None),
                        TxnOp::delete(self.expiry_key(lock), None),
                    ]),
            )
            .await?;
        if resp.succeeded() {
            self.inner.metrics.expiries.inc();
        }
        Ok(())
    }

    /// Sets a live lease's expiry to `now + ttl`, keeping its token, if
    /// neither key changed since `held` was read; `Ok(None)` if one did.
    pub(super) async fn extend(
        &self,
        lock: &LockName,
        held: &Held,
        ttl: Duration,
    ) -> Result<Option<Lease>, EngineError> {
        let now = clock::now();
        let expires = now.saturating_add(ttl);
        let mut when = held.unchanged(self.owner_key(lock), self.expiry_key(lock));
        // Still live when etcd applies it, as the fast path checks.
        when.push(self.live_at(lock, now));
        let resp = self
            .txn(Txn::new().when(when).and_then([TxnOp::put(
                self.expiry_key(lock),
                expiry_value(expires),
                None,
            )]))
            .await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        self.inner.metrics.renewals.inc();
        Ok(Some(held.record.lease(
            lock,
            held.record.token(&held.kv),
            expires,
        )))
    }

    /// The condition, inside one transaction, that the owner key of `lock`
    /// is the one `token`'s grant created: its create revision, under the
    /// epoch the token was issued in (revisions never repeat within an
    /// epoch). A migrated lease's token is not a revision: it takes the
    /// slow path (read, then compare-and-set).
    pub(super) fn granted(&self, lock: &LockName, token: u64) -> [Compare; 2] {
        [
            Compare::create_revision(
                self.owner_key(lock),
                CompareOp::Equal,
                i64::try_from(token & REVISION_MASK).unwrap_or(0),
            ),
            Compare::value(
                self.epoch_key(),
                CompareOp::Equal,
                (token >> REVISION_BITS).to_string(),
            ),
        ]
    }

    /// The condition that `lock` was last granted no later than the newest
    /// store revision this replica has seen (see the module docs, "A grant
    /// lands once").
    pub(super) fn granted_at_most_seen(&self, lock: &LockName) -> Compare {
        let seen = self
            .inner
            .highest_revision
            .load(std::sync::atomic::Ordering::Acquire);
        Compare::mod_revision(
            self.granted_key(lock),
            CompareOp::Less,
            seen.saturating_add(1),
        )
    }

    /// The condition that `lock`'s lease has not expired at `now`.
    pub(super) fn live_at(&self, lock: &LockName, now: Timestamp) -> Compare {
        Compare::value(self.expiry_key(lock), CompareOp::Greater, expiry_value(now))
    }

    /// Writes a lease migrated from SQLite, keeping its token; `false` if
    /// the lock already has a record in etcd.
    pub async fn import(&self, lease: &Lease) -> Result<bool, EngineError> {
        let record = Record {
            owner: lease.owner.clone(),
            idempotency_sha256: lease.idempotency.map(|k| hex::encode(k.as_bytes())),
            epoch: self.inner.epoch,
            token: Some(lease.token),
            grant: grant_id()?,
        };
        let value = serde_json::to_vec(&record).map_err(|e| StorageError::Encode(e.to_string()))?;
        // Absence holds again after a release: bounded as a newcomer's
        // grant is (`try_grant`), so that a late attempt imports nothing.
        let resp = self
            .txn(
                Txn::new()
                    .when([
                        Compare::create_revision(self.owner_key(&lease.lock), CompareOp::Equal, 0),
                        self.granted_at_most_seen(&lease.lock),
                    ])
                    .and_then([
                        TxnOp::put(self.owner_key(&lease.lock), value, None),
                        TxnOp::put(
                            self.expiry_key(&lease.lock),
                            expiry_value(lease.expires_at),
                            None,
                        ),
                        TxnOp::put(
                            self.granted_key(&lease.lock),
                            record.grant.to_string(),
                            None,
                        ),
                    ]),
            )
            .await?;
        Ok(resp.succeeded())
    }

    /// Deletes the records of leases that expired unreleased, a page of
    /// expiry keys per etcd request; each deletion is a compare-and-delete,
    /// so replicas sweeping at once, or an acquire taking the lock, are
    /// safe. Returns how many it deleted.
    pub async fn sweep(&self) -> Result<usize, EngineError> {
        let prefix = self.key("expiry/");
        let end = self.key("expiry0"); // '/' + 1
        let mut from = prefix.clone();
        let mut deleted = 0;
        loop {
            let page = self
                .call(|mut c| {
                    let (from, end) = (from.clone(), end.clone());
                    async move {
                        c.get(
                            from,
                            Some(GetOptions::new().with_range(end).with_limit(SWEEP_PAGE)),
                        )
                        .await
                    }
                })
                .await?;
            let now = clock::now();
            for kv in page.kvs() {
                if expiry_of(kv) >= now {
                    continue;
                }
                let Some(lock) = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(prefix.as_str()))
                    .and_then(|l| LockName::new(l).ok())
                else {
                    continue;
                };
                let resp = self
                    .txn(
                        Txn::new()
                            .when([Compare::mod_revision(
                                self.expiry_key(&lock),
                                CompareOp::Equal,
                                kv.mod_revision(),
                            )])
                            .and_then([
                                TxnOp::delete(self.owner_key(&lock), None),
                                TxnOp::delete(self.expiry_key(&lock), None),
                            ]),
                    )
                    .await?;
                if resp.succeeded() {
                    deleted += 1;
                    self.inner.metrics.expiries.inc();
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    let mut next = last.key().to_vec();
                    next.push(0);
                    from = String::from_utf8(next).unwrap_or_default();
                }
                _ => return Ok(deleted),
            }
        }
    }

    /// Runs [`Self::sweep`] every `every` until the process ends.
    pub(super) fn spawn_sweeper(&self, every: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = this.sweep().await {
                    tracing::warn!(error = %e, "sweeping expired leases failed; next try in {every:?}");
                }
            }
        });
    }
}

impl LeaseStore for EtcdLeases {
    async fn acquire(&self, a: Acquire) -> Result<Lease, EngineError> {
        let Acquire {
            lock,
            owner,
            key,
            ttl,
            wait,
            party,
        } = a;
        let started = Instant::now();
        let deadline = started + wait;
        // An acquire that sent no idempotency key gets one of its own for
        // this call. A transaction that timed out on one member may have
        // been applied there and is retried on the next: with the key, the
        // retry (or this call's next round) recognises its own grant
        // instead of waiting behind it and answering "held by" itself.
        // Nobody else knows the key, so nothing else changes.
        let key = Some(key.unwrap_or_else(own_key));
        for _ in 0..MAX_CONFLICTS {
            let seen = match self.try_grant(&lock, &owner, key, ttl, None).await? {
                Ok(lease) => return Ok(lease),
                Err(seen) => seen,
            };
            let now = clock::now();
            match &seen.owner {
                Some(held) => {
                    let holder = held.lease(&lock);
                    match AcquireStep::of(Some(&holder), &owner, key.as_ref(), now) {
                        AcquireStep::ClearExpired => {
                            self.clear_expired(&lock, held).await?;
                            continue;
                        }
                        AcquireStep::Extend => match self.extend(&lock, held, ttl).await? {
                            Some(lease) => return Ok(lease),
                            None => continue,
                        },
                        // (`Grant` is the step for a lock without a lease.)
                        AcquireStep::Held | AcquireStep::Grant => {
                            if wait.is_zero() {
                                self.inner.metrics.refused("held");
                                return Err(EngineError::Held { holder });
                            }
                        }
                    }
                }
                // Free, but others are in line: the first of them takes it.
                None if seen.waiters > 0 => {
                    if wait.is_zero() {
                        if started.elapsed() < LINE_HANDOVER {
                            tokio::time::sleep(FIRST_WAITER_POLL).await;
                            continue;
                        }
                        self.inner.metrics.refused("held");
                        return Err(EngineError::InLine {
                            waiting: seen.waiters,
                        });
                    }
                }
                // Taken and released between the two reads: try again.
                None => continue,
            }
            return self
                .wait_in_line(lock, owner, key, ttl, deadline, party)
                .await;
        }
        Err(StorageError::Contended("too many conflicting changes to this lock in etcd").into())
    }

    async fn renew(&self, held: HeldToken, ttl: Duration) -> Result<Lease, EngineError> {
        let (lock, token) = (held.lock(), held.token());
        let now = clock::now();
        let expires = now.saturating_add(ttl);
        // The usual case in one round trip. It never moves the expiry
        // back: an attempt of an earlier renewal that reaches a member late
        // (after its retry was answered, and after later renewals) must
        // not take back time the holder was told it has. The stored expiry
        // is at most the new one (below the next millisecond: etcd has no
        // "less or equal"), so renewals in the same millisecond stay on
        // this path. A renewal to an earlier expiry (a shorter ttl) takes
        // `extend`, which compares revisions.
        let (resp, retried) = self
            .txn_tracked(
                Txn::new()
                    .when(
                        [
                            self.granted(lock, token).as_slice(),
                            &[
                                self.live_at(lock, now),
                                Compare::value(
                                    self.expiry_key(lock),
                                    CompareOp::Less,
                                    expiry_value(expires.saturating_add(Duration::from_millis(1))),
                                ),
                            ],
                        ]
                        .concat(),
                    )
                    .and_then([
                        TxnOp::put(self.expiry_key(lock), expiry_value(expires), None),
                        TxnOp::get(self.owner_key(lock), None),
                    ])
                    .or_else([
                        TxnOp::get(self.owner_key(lock), None),
                        TxnOp::get(self.expiry_key(lock), None),
                    ]),
            )
            .await?;
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first(),
            _ => None,
        };
        if resp.succeeded() {
            let kv = get(1).ok_or(StorageError::Contended(
                "the renewed lease's record vanished",
            ))?;
            self.inner.metrics.renewals.inc();
            return Ok(record_of(kv)?.lease(lock, token, expires));
        }
        let mut current = held_of(get(0), get(1))?;
        if let Some(h) = current.as_ref().filter(|h| {
            retried.0
                && h.lease(lock).token == token
                && h.expiry
                    .as_ref()
                    .is_some_and(|e| e.value() == expiry_value(expires).as_bytes())
        }) {
            // An earlier attempt of this very renewal was applied.
            self.inner.metrics.renewals.inc();
            return Ok(h.record.lease(lock, token, expires));
        }
        for _ in 0..MAX_CONFLICTS {
            let now = clock::now();
            let found = current.as_ref().map(|h| (h, h.lease(lock)));
            let step = RenewStep::of(found.as_ref().map(|(_, l)| l), token, now);
            match found {
                // A migrated lease, or a lease granted under an older epoch.
                Some((h, _)) if step == RenewStep::Extend => {
                    if let Some(lease) = self.extend(lock, h, ttl).await? {
                        return Ok(lease);
                    }
                    current = self.see(lock, None).await?.owner;
                }
                other => {
                    self.inner.metrics.refused("lease_lost");
                    return Err(EngineError::NotHolder {
                        current: other.map(|(_, l)| l).filter(|l| l.is_live(now)),
                    });
                }
            }
        }
        Err(StorageError::Contended("too many conflicting changes to this lock in etcd").into())
    }

    /// Ends the lease `held` names, live or expired, as on SQLite
    /// (`LockTable::release`): releasing a lease that already ended and
    /// that nobody took since is not an error (a client may retry);
    /// releasing while another lease is live, or after a newer grant, is.
    async fn release(&self, held: HeldToken) -> Result<(), EngineError> {
        let (lock, token) = (held.lock(), held.token());
        let delete = [
            TxnOp::delete(self.owner_key(lock), None),
            TxnOp::delete(self.expiry_key(lock), None),
        ];
        // The usual case in one round trip: the owner key is the one this
        // token's grant created, live or not.
        let when = self.granted(lock, token);
        let resp = self
            .txn(Txn::new().when(when).and_then(delete.clone()).or_else([
                TxnOp::get(self.owner_key(lock), None),
                TxnOp::get(self.expiry_key(lock), None),
            ]))
            .await?;
        if resp.succeeded() {
            self.inner.metrics.releases.inc();
            return Ok(());
        }
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first(),
            _ => None,
        };
        let now = clock::now();
        let current = held_of(get(0), get(1))?;
        // The token is genuine (`HeldToken`), so it was issued.
        let step = ReleaseStep::of(
            current.as_ref().map(|h| h.lease(lock)).as_ref(),
            token,
            now,
            true,
        );
        match (step, current) {
            // A migrated lease, or one granted under an older epoch.
            (ReleaseStep::Remove, Some(h)) => {
                let resp = self
                    .txn(
                        Txn::new()
                            .when(h.unchanged(self.owner_key(lock), self.expiry_key(lock)))
                            .and_then(delete),
                    )
                    .await?;
                if resp.succeeded() {
                    self.inner.metrics.releases.inc();
                    return Ok(());
                }
                Err(StorageError::Contended("the lease changed while it was being released").into())
            }
            // Another lease is live, or a newer one was granted.
            (ReleaseStep::NotHolder, current) => {
                self.inner.metrics.refused("not_holder");
                Err(EngineError::NotHolder {
                    current: current.map(|h| h.lease(lock)).filter(|l| l.is_live(now)),
                })
            }
            // Nothing newer than the token holds the lock: its lease ended
            // (released, perhaps by an earlier attempt of this very call, or
            // expired and swept): releasing it again changes nothing.
            (ReleaseStep::AlreadyEnded | ReleaseStep::Remove, _) => Ok(()),
        }
    }

    async fn status(&self, lock: LockName) -> Result<LockStatus, EngineError> {
        let resp = self
            .txn(Txn::new().and_then(self.seeing(&lock, None)))
            .await?;
        let seen = self.seen(&resp, false)?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let now = clock::now();
        Ok(LockStatus {
            lease: seen
                .owner
                .map(|h| h.lease(&lock))
                .filter(|l| l.is_live(now)),
            // Every token issued so far is at most this (the store's
            // revision counts every write, not only grants).
            last_token: epoch_base(seen.epoch.unwrap_or(0).max(self.inner.epoch))
                | u64::try_from(revision).unwrap_or(0),
            waiting: seen.waiters,
        })
    }

    /// The locks `allow` admits that are held or waited for, in name
    /// order, at most `limit`, each with its status (for the status page:
    /// one range read of the keys, then one status read per lock shown).
    async fn list(
        &self,
        limit: usize,
        allow: LockFilter,
    ) -> Result<Vec<(LockName, LockStatus)>, EngineError> {
        let prefix = self.key("locks/");
        let resp = self
            .txn(Txn::new().and_then(vec![TxnOp::get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(LIST_KEYS_READ),
                ),
            )]))
            .await?;
        let mut locks = Vec::new();
        for op in resp.op_responses() {
            let TxnOpResponse::Get(g) = op else { continue };
            for kv in g.kvs() {
                let Ok(key) = std::str::from_utf8(kv.key()) else {
                    continue;
                };
                // `locks/<lock>/owner`, `.../expiry`, `.../wait/<id>`: a
                // lock name has no `/`, so the first segment is the lock.
                if let Some(name) = key
                    .strip_prefix(prefix.as_str())
                    .and_then(|rest| rest.split_once('/'))
                    .and_then(|(name, _)| LockName::new(name).ok())
                    .filter(|name| (allow.0)(name))
                {
                    locks.push(name);
                }
            }
        }
        locks.sort();
        locks.dedup();
        locks.truncate(limit);
        let mut listed = Vec::with_capacity(locks.len());
        for lock in locks {
            let status = self.status(lock.clone()).await?;
            if status.lease.is_some() || status.waiting > 0 {
                listed.push((lock, status));
            }
        }
        Ok(listed)
    }
}

/// The lease of an owner key and its expiry key, as read.
pub(super) fn held_of(
    owner: Option<&KeyValue>,
    expiry: Option<&KeyValue>,
) -> Result<Option<Held>, EngineError> {
    Ok(match owner {
        Some(kv) => Some(Held {
            record: record_of(kv)?,
            kv: kv.clone(),
            expiry: expiry.cloned(),
        }),
        None => None,
    })
}
