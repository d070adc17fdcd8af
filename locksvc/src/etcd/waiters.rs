//! Waiting in line: a waiter's key under `wait/` on a short etcd lease its
//! replica keeps alive, the wait for its turn, and its departure however
//! the acquire ends.

use super::*;

impl EtcdLeases {
    pub(super) async fn grant_etcd_lease(&self, ttl_s: i64) -> Result<i64, EngineError> {
        Ok(self
            .call(|mut c| async move { c.lease_grant(ttl_s, None).await })
            .await?
            .id())
    }

    /// TTL of a waiter's etcd lease: [`WAITER_TTL_S`], or more when
    /// `request_timeout` is long. Keep-alives go every [`WAITER_KEEPALIVE`]
    /// and each takes at most `request_timeout`, so successful ones are at
    /// most `2 × WAITER_KEEPALIVE + request_timeout` apart even when one in
    /// between failed outright; the TTL is above that.
    pub(super) fn waiter_ttl_s(&self) -> i64 {
        let worst = 2 * WAITER_KEEPALIVE + self.inner.request_timeout;
        let ttl = i64::try_from(worst.as_secs()).unwrap_or(i64::MAX / 4) + 1;
        WAITER_TTL_S.max(ttl)
    }

    /// One keep-alive of an etcd lease: false if etcd no longer has it.
    pub(super) async fn keep_alive(&self, id: i64) -> Result<bool, EngineError> {
        // The client sends the first keep-alive and reads its answer; a
        // lease etcd no longer has is this error.
        match self
            .call(|mut c| async move { c.lease_keep_alive(id).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(EngineError::Storage(StorageError::EtcdLeaseGone)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn wait_in_line(
        &self,
        lock: LockName,
        owner: String,
        key: Option<KeyDigest>,
        ttl: Duration,
        deadline: Instant,
        party: Party,
    ) -> Result<Lease, EngineError> {
        let ttl_s = self.waiter_ttl_s();
        let waiter_lease = self.grant_etcd_lease(ttl_s).await?;
        let mine = format!("{}{waiter_lease:016x}", self.wait_prefix(&lock));
        // Kept alive from now on, and removed however this acquire ends.
        let place = Place::new(self.clone(), mine.clone(), waiter_lease);
        let value = serde_json::to_string(&PlaceValue {
            owner: owner.clone(),
            party: party.as_str().to_owned(),
        })
        .map_err(|e| StorageError::Encode(e.to_string()))?;
        self.call(|mut c| {
            let (key, value) = (mine.clone(), value.clone());
            async move {
                c.put(key, value, Some(PutOptions::new().with_lease(waiter_lease)))
                    .await
            }
        })
        .await?;
        // The place is the key's create revision, read back: a put retried
        // on another member after the first was applied answers with a
        // later revision than the key's.
        let rev = self
            .call(|mut c| {
                let key = mine.clone();
                async move { c.get(key, None).await }
            })
            .await?
            .kvs()
            .first()
            .map(KeyValue::create_revision)
            .ok_or(StorageError::Contended(
                "this acquire's place in line vanished",
            ))?;
        if let Err(full) = self.admit(&lock, rev, &party).await? {
            self.inner
                .metrics
                .refused(crate::engine::refusal_reason(full));
            // Gone before the answer, so that the next waiter does not
            // count this one ahead of it.
            place.leave().await;
            return Err(EngineError::TooManyWaiters(full));
        }
        self.inner.metrics.waiting.inc();
        let result = self
            .serve_place(&lock, &owner, key, ttl, deadline, &mine, rev)
            .await;
        self.inner.metrics.waiting.dec();
        drop(place);
        result
    }

    /// The line rule (`line::admit`) for the waiter whose key was created
    /// at `rev`: counts the keys created before it, and those of `party`.
    ///
    /// The keys are read, not counted: etcd's count of a range ignores
    /// `max_create_revision` (it counts every key under the prefix, this
    /// waiter's own and those behind it), which made the bound one lower
    /// than on SQLite. At most `max_waiters` keys are read (the oldest):
    /// if that many are ahead, the line is full whatever the rest hold.
    pub(super) async fn admit(
        &self,
        lock: &LockName,
        rev: i64,
        party: &Party,
    ) -> Result<Result<(), line::LineFull>, EngineError> {
        let max = self.inner.max_waiters;
        let prefix = self.wait_prefix(lock);
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        let ahead = self
            .call(|mut c| {
                let prefix = prefix.clone();
                async move {
                    c.get(
                        prefix,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_max_create_revision(rev - 1)
                                .with_sort(SortTarget::Create, SortOrder::Ascend)
                                .with_limit(limit),
                        ),
                    )
                    .await
                }
            })
            .await?;
        // The filter is applied by etcd; kept here too, so that the count
        // cannot depend on it.
        let kvs: Vec<&KeyValue> = ahead
            .kvs()
            .iter()
            .filter(|kv| kv.create_revision() < rev)
            .collect();
        let of_party = kvs
            .iter()
            .filter(|kv| party_of(kv).as_deref() == Some(party.as_str()))
            .count();
        // More keys than were read: `max` of them are ahead at least.
        let total = if ahead.more() { max } else { kvs.len() };
        Ok(line::admit(total, of_party, max))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn serve_place(
        &self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        deadline: Instant,
        mine: &str,
        rev: i64,
    ) -> Result<Lease, EngineError> {
        loop {
            let seen = self.see(lock, Some(mine)).await?;
            if !seen.mine_present {
                return Err(StorageError::Contended(
                    "this acquire lost its place in line (its etcd lease was not kept alive)",
                )
                .into());
            }
            let now = clock::now();
            let first = seen.first_waiter == Some(rev);
            let holder = seen.owner.as_ref().map(|h| (h, h.lease(lock)));
            match &holder {
                Some((held, lease)) if !lease.is_live(now) => {
                    self.clear_expired(lock, held).await?;
                    continue;
                }
                None if first => {
                    if let Ok(lease) = self
                        .try_grant(lock, owner, key, ttl, Some((mine, rev)))
                        .await?
                    {
                        return Ok(lease);
                    }
                    continue;
                }
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.inner.metrics.refused("held_after_wait");
                return Err(match holder {
                    Some((_, lease)) => EngineError::Held { holder: lease },
                    None => EngineError::InLine {
                        waiting: seen.waiters,
                    },
                });
            }
            let mut pause = if first {
                FIRST_WAITER_POLL
            } else {
                OTHER_WAITER_POLL
            };
            if let Some((_, lease)) = &holder {
                pause = pause.min(now.until(lease.expires_at).max(Duration::from_millis(1)));
            }
            tokio::time::sleep(pause.min(left)).await;
        }
    }
}

/// A place in a lock's line: its key, kept alive while the acquire waits,
/// and removed when the acquire ends however it ends (granted, timed out,
/// or dropped because the client went away).
pub(super) struct Place {
    pub(super) leases: EtcdLeases,
    pub(super) key: String,
    pub(super) etcd_lease: i64,
    pub(super) keeper: tokio::task::JoinHandle<()>,
}

impl Place {
    pub(super) fn new(leases: EtcdLeases, key: String, etcd_lease: i64) -> Place {
        let l = leases.clone();
        let keeper = tokio::spawn(async move {
            // Each keep-alive is one call, failed over like any; a failed one
            // is followed by the next (see `waiter_ttl_s`); only etcd saying
            // the lease is gone ends the keeping.
            loop {
                tokio::time::sleep(WAITER_KEEPALIVE).await;
                if let Ok(false) = l.keep_alive(etcd_lease).await {
                    return;
                }
            }
        });
        Place {
            leases,
            key,
            etcd_lease,
            keeper,
        }
    }
}

impl Place {
    /// Removes the place now, before the caller answers (a drop removes it
    /// in the background).
    pub(super) async fn leave(mut self) {
        self.keeper.abort();
        let (l, key, id) = (self.leases.clone(), self.key.clone(), self.etcd_lease);
        remove_place(&l, key, id).await;
        // Removed: disarm the drop (which still removes the place if this
        // is cancelled before).
        self.key.clear();
    }
}

/// Deletes a waiter's key and revokes its etcd lease.
async fn remove_place(leases: &EtcdLeases, key: String, id: i64) {
    let _ = leases
        .call(|mut c| {
            let key = key.clone();
            async move { c.delete(key, None).await }
        })
        .await;
    let _ = leases
        .call(|mut c| async move { c.lease_revoke(id).await })
        .await;
}

impl Drop for Place {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.key.is_empty() {
            return;
        }
        let (l, key, id) = (self.leases.clone(), self.key.clone(), self.etcd_lease);
        tokio::spawn(async move { remove_place(&l, key, id).await });
    }
}
