//! Stages three to five: the scope's epoch admits the [`Tokened`]
//! request, the key is locked and its stored state known, and a [`Write`]
//! is handed out (its sending and its end are `write`'s). Also the
//! acquisition fence, which is an admission without a write.

use super::refusal::Refusal;
use super::token::Tokened;
use super::*;
use crate::op::Op;

impl Gate {
    /// Raises the fence of the lock a new holder's signed token names to
    /// that token, before the holder writes anything (acquisition
    /// fencing, `POST /_fencegate/fence`): exactly what its first write
    /// would do, so older writes in flight are cut or drained and every
    /// lower token is refused from then on, on every replica. Only the
    /// signed token proves holding (a number is public); a lower token is
    /// stale (409). Answers the lock, the token and the max now.
    pub async fn fence(&self, headers: &HeaderMap) -> S3Result<(String, u64, u64)> {
        const OP: Op = Op::Fence;
        // Without keys a token in the signed form cannot be verified, and
        // a fence raised on anyone's say-so would lock the holder out.
        if self.token_keys().is_none() {
            return Err(errors::fence_unverifiable());
        }
        let value = headers
            .get(crate::tokens::FENCING_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                s3s::s3_error!(
                    InvalidRequest,
                    "send the lease's signed fencing_token in the Fencing-Token header"
                )
            })?;
        let lock = match fencegate_core::FencingToken::parse(value.trim()) {
            Ok(fencegate_core::FencingToken::Signed(s)) => s.lock,
            Ok(fencegate_core::FencingToken::Plain(_)) => {
                return Err(errors::rejected(&crate::tokens::Rejection::Unsigned));
            }
            Err(e) => {
                return Err(s3s::s3_error!(
                    InvalidRequest,
                    "the Fencing-Token header is not a fencing token ({e}): send the lease's signed fencing_token"
                ));
            }
        };
        let scoped = self
            .scope_of_lock(OP, &lock)
            .ok_or_else(|| errors::unknown_lock(lock.as_str()))?;
        let tokened = self
            .required_token(
                scoped,
                RequestToken {
                    headers,
                    access_key: None,
                },
            )
            .await?;
        // A bucket-per-scope lock whose bucket the store does not have is
        // not fenced here.
        let admission = self.admit(&tokened).await.map_err(|e| {
            if e.code() == &s3s::S3ErrorCode::NoSuchBucket {
                errors::unknown_lock(lock.as_str())
            } else {
                e
            }
        })?;
        drop(admission);
        let scope = tokened.scope();
        self.count(OP, scope, Outcome::Accepted);
        Ok((
            scope.lock.to_string(),
            tokened.token().number(),
            self.fences.max(scope.fence()),
        ))
    }

    /// Stage three: admits the token into its scope's epoch (see
    /// [`Fences::admit`]), once the bucket's store is known to enforce the
    /// conditions the writes need.
    pub async fn admit(&self, tokened: &Tokened) -> S3Result<Admission> {
        let (op, scope) = (tokened.op(), tokened.scope());
        let token = tokened.token().number();
        self.require_safe(tokened.scoped().bucket()).await?;
        match self.fences.admit(scope.fence(), token).await {
            Ok(a) => {
                if a.raised() {
                    tracing::info!(lock = %scope.lock, scope = %scope.id, token, waited_ms = a.waited().as_millis(), "fence raised");
                    self.learn_owner(scope.lock.as_str(), token);
                    self.metrics
                        .raise_wait_seconds
                        .get_or_create(&LockLabels {
                            lock: scope.fence().to_owned(),
                        })
                        .observe(a.waited().as_secs_f64());
                    self.metrics
                        .max_token
                        .get_or_create(&LockLabels {
                            lock: scope.fence().to_owned(),
                        })
                        .set(i64::try_from(token).unwrap_or(i64::MAX));
                }
                Ok(a)
            }
            Err(FenceError::Stale { token, max }) => {
                Err(self.refuse(op, scope, Refusal::below_max(token, max, scope)))
            }
            Err(FenceError::Storage(e)) => {
                self.count(op, scope, Outcome::Unavailable);
                let held_back = self
                    .storage_failures
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .ready();
                if let Some(held_back) = held_back {
                    tracing::error!(lock = %scope.lock, token, error = %e, not_logged = held_back, "cannot persist a raise of the fence in the proxy database; answering 503 (logged at most once a second)");
                }
                Err(errors::storage(format!(
                    "cannot persist the new max token: {e}; nothing was written"
                )))
            }
            Err(FenceError::Unavailable(e)) => {
                self.count(op, scope, Outcome::Unavailable);
                Err(errors::storage(format!("{e}; nothing was written")))
            }
        }
    }

    /// Stages three to five for an object write: admission, the key's
    /// lock, its verified state; then the [`Write`] that alone can send it.
    pub async fn begin(&self, write: WriteOp, tokened: Tokened) -> S3Result<Write> {
        self.begin_with(write, tokened, false).await
    }

    /// [`Gate::begin`] for a PutObject whose body the `Write` can send
    /// twice (`resendable`): a key the proxy knows nothing of is then
    /// presumed absent instead of read, where the store enforces
    /// `If-None-Match: *`, so a new key costs one backend round trip; if
    /// the key exists after all, the store refuses and [`Write::put`] reads
    /// it and sends again.
    pub async fn begin_put(&self, tokened: Tokened, resendable: bool) -> S3Result<Write> {
        let presume = resendable && self.backend.lean().is_some();
        self.begin_with(WriteOp::Put, tokened, presume).await
    }

    pub(super) async fn begin_with(
        &self,
        write: WriteOp,
        tokened: Tokened,
        presume_absent: bool,
    ) -> S3Result<Write> {
        let op = write.op();
        let token = tokened.token().number();
        // A many-key request (DeleteObjects) resolves every scope first,
        // then begins each key: its refusals must name the key begun.
        crate::events::note_target(tokened.scoped().bucket(), tokened.scoped().key());
        let admission = self.admit(&tokened).await?;
        let (bucket, key, scope) = tokened.into_scoped().into_parts();
        let (bucket, key) = (bucket.as_str(), key.as_str());
        let cut = admission.cancel().clone();
        let guard = tokio::select! {
            g = self.keys.lock(bucket, key) => g,
            () = cut.cancelled() => return Err(self.cut(op, &scope, token, admission).await),
        };
        let trusted = |k: &Known| {
            let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
            write.trusts_cached(k, probes.get(bucket).map(|r| &**r))
        };
        let presumable = || {
            let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
            presume_absent
                && probes
                    .get(bucket)
                    .is_some_and(|r| r.put_if_none_match.enforced())
        };
        let mut presumed = false;
        let known = match guard.known() {
            Some(k) if trusted(&k) => k,
            None if presumable() => {
                presumed = true;
                Known::Absent
            }
            _ => {
                let k = self
                    .call(Box::pin(self.backend.head(bucket, key)), None)
                    .await?;
                guard.remember(k.clone());
                k
            }
        };
        self.refuse_if_overwritten(op, &scope, token, bucket, key, &known)?;
        let dialect = self.dialect_of(bucket);
        Ok(Write {
            op: write,
            scope,
            token,
            admission,
            key: guard,
            known,
            presumed,
            dialect,
            client: self.backend.writes(dialect),
            started: Instant::now(),
            inflight: Inflight::new(&self.metrics),
        })
    }
}
