//! Refusals of the fence: stale, forged or unverifiable tokens, each
//! counted and recorded as a fence event; and the owners the lease service
//! names for the tokens the proxy admitted.

use super::*;

impl Gate {
    /// Refuses `token` if it is below the max of `scope` (a check before
    /// any key of a many-key request is touched; each key is then admitted
    /// on its own).
    pub fn refuse_if_stale(
        &self,
        op: &'static str,
        scope: &Scope,
        token: VerifiedToken,
    ) -> S3Result<()> {
        let token = token.number();
        let max = self.fences.max(scope.fence());
        if token < max {
            return Err(self.stale(op, scope, token, max, &format!(" for lock {}", scope.lock)));
        }
        Ok(())
    }

    /// Refuses a stale write: counts it, records its fence event, and
    /// answers the 409 that says so (every stale refusal goes through here).
    pub fn stale(
        &self,
        op: &'static str,
        scope: &Scope,
        token: u64,
        max: u64,
        detail: &str,
    ) -> S3Error {
        self.count(op, scope, Outcome::Stale);
        let e = errors::stale(token, max, detail);
        self.record(Kind::Stale, op, Some(scope), Some(token), Some(max), &e);
        e
    }

    /// The object's rule, decided here only: a key whose stored token is
    /// above `token` was written by a newer holder (through another
    /// replica, or another proxy of the store), so the write is stale.
    pub(crate) fn refuse_if_overwritten(
        &self,
        op: &'static str,
        scope: &Scope,
        token: u64,
        bucket: &str,
        key: &str,
        stored: &Known,
    ) -> S3Result<()> {
        if stored.token() > token {
            return Err(self.stale(
                op,
                scope,
                token,
                stored.token(),
                &format!(" on s3://{bucket}/{key} (by another writer of this store)"),
            ));
        }
        Ok(())
    }

    /// Records a refusal answered with `e` as a fence event.
    pub(super) fn record(
        &self,
        kind: Kind,
        op: &'static str,
        scope: Option<&Scope>,
        token: Option<u64>,
        max: Option<u64>,
        e: &S3Error,
    ) {
        self.events.refused(Refusal {
            kind,
            op,
            scope,
            token,
            max,
            reason: e.message().unwrap_or_default().to_owned(),
        });
    }

    /// Refuses a token the proxy cannot verify, as [`Gate::stale`] does a
    /// stale one; `token` is the number it presented, if readable.
    pub fn forged(
        &self,
        op: &'static str,
        scope: &Scope,
        token: Option<u64>,
        why: &Rejection,
    ) -> S3Error {
        self.count(op, scope, Outcome::InvalidToken);
        let e = errors::rejected(why);
        self.refused_token(op, scope, token, &e);
        e
    }

    /// Records a token refusal answered with `e` as a forged-token event.
    pub fn refused_token(&self, op: &'static str, scope: &Scope, token: Option<u64>, e: &S3Error) {
        self.record(Kind::Forged, op, Some(scope), token, None, e);
    }

    /// The recent fence events.
    pub fn events(&self) -> &FenceEvents {
        &self.events
    }

    /// Asks the lease service, off the write path, whose lease `token` of
    /// `lock` is, so fence events can name the zombie and the holder.
    pub(super) fn learn_owner(&self, lock: &str, token: u64) {
        let (Some(api), Ok(rt)) = (
            self.lease_service.clone(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let Ok(permit) = self.owner_questions.clone().try_acquire_owned() else {
            return; // enough questions in flight; this owner stays unknown
        };
        let (events, lock, warned) = (
            self.events.clone(),
            lock.to_owned(),
            self.owner_warned_ms.clone(),
        );
        rt.spawn(async move {
            let _permit = permit;
            match api.status(&lock, None).await {
                Ok(s) if s.token == Some(token) => {
                    if let Some(owner) = s.owner {
                        events.learn_owner(&lock, token, owner);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let now = crate::clock::unix_ms();
                    let last = warned.load(std::sync::atomic::Ordering::Relaxed);
                    if now.saturating_sub(last) >= 60_000 {
                        warned.store(now, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(%lock, token, error = %e, "cannot learn the owner of a new token from the lease service (locksvc_url): fence events will not name it (logged once a minute)");
                    }
                }
            }
        });
    }
}
