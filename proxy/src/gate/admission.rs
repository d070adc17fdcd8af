//! Stages three to five: the scope's epoch admits the token, the key is
//! locked and its stored state known, and a [`Write`] is handed out; then
//! the write's end (answered, cut, re-decided, or lingering while the
//! store may still commit it).

use super::refusal::Refusal;
use super::*;

impl Gate {
    /// Raises the fence of the lock a new holder's signed token names to
    /// that token, before the holder writes anything (acquisition
    /// fencing, `POST /_fencegate/fence`): exactly what its first write
    /// would do, so older writes in flight are cut or drained and every
    /// lower token is refused from then on, on every replica. Only the
    /// signed token proves holding (a number is public); a lower token is
    /// stale (409). Answers the lock, the token and the max now.
    pub async fn fence(&self, headers: &HeaderMap) -> S3Result<(String, u64, u64)> {
        const OP: &str = "Fence";
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
                if a.raised {
                    tracing::info!(lock = %scope.lock, scope = %scope.id, token, waited_ms = a.waited.as_millis(), "fence raised");
                    self.learn_owner(scope.lock.as_str(), token);
                    self.metrics
                        .raise_wait_seconds
                        .get_or_create(&LockLabels {
                            lock: scope.fence().to_owned(),
                        })
                        .observe(a.waited.as_secs_f64());
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
        let presume = resendable && self.backend.lean.is_some();
        self.begin_with(WriteOp::Put, tokened, presume).await
    }

    pub(super) async fn begin_with(
        &self,
        write: WriteOp,
        tokened: Tokened,
        presume_absent: bool,
    ) -> S3Result<Write> {
        let op = write.name();
        let token = tokened.token().number();
        let (bucket, key) = (tokened.scoped().bucket(), tokened.scoped().key());
        // A many-key request (DeleteObjects) resolves every scope first,
        // then begins each key: its refusals must name the key begun.
        crate::events::note_target(bucket, key);
        let admission = self.admit(&tokened).await?;
        let scope = tokened.scope().clone();
        let cut = admission.cancel.clone();
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

    /// The answer for a write cut by a newer epoch: let go of the epoch (the
    /// raise is waiting for it), then ask the fence again, which waits for
    /// the raise to finish and reports the exact new max.
    ///
    /// A cut write always learns it lost with the non-retryable 409
    /// `FencingTokenStale`, whatever the write and however far it got: a
    /// higher token exists for its lock, so no retry with its token can
    /// succeed. The max reported is the token that cut it.
    pub async fn cut(
        &self,
        op: &'static str,
        scope: &Scope,
        token: u64,
        admission: Admission,
    ) -> S3Error {
        drop(admission);
        // The answer is the raise's outcome, not its attempt: a raise the
        // database refused admitted nobody, and this writer may still hold
        // the lease.
        if let Some(max) = self.fences.after_raise(scope.fence()).await
            && max <= token
        {
            self.count(op, scope, Outcome::Unavailable);
            return errors::storage(
                "a newer token's raise of the fence could not be made durable (the proxy database failed); this request was cut in flight and nothing of it was committed: retry".to_owned(),
            );
        }
        if let Some(c) = self.fences.cluster()
            && !c.admits()
            && self.fences.cut_by(scope.fence()) <= token
        {
            // Cut because this replica lost its standing, not by a newer
            // token: the writer may still hold the lease.
            self.count(op, scope, Outcome::Unavailable);
            return errors::storage(format!(
                "{}; this request was cut in flight and nothing of it was committed",
                c.why_not()
            ));
        }
        let by = self
            .fences
            .cut_by(scope.fence())
            .max(token.saturating_add(1));
        self.refuse(
            op,
            scope,
            Refusal::Cut {
                token,
                by,
                lock: scope.lock.as_str(),
            },
        )
    }

    /// Ends a write: records the outcome and what the store now holds.
    ///
    /// A write the store did not answer in time is not over: it may still
    /// commit. It keeps its admission (so no raise is admitted over it) and
    /// its key (so no write of this proxy decides on a state it may still
    /// change) in [`linger`], and the client gets a retryable 503.
    pub(super) async fn finish<T: 'static>(
        &self,
        w: Write,
        sent: Sent<T>,
        now_holds: impl FnOnce(&T) -> Option<Known>,
    ) -> S3Result<T> {
        self.metrics
            .backend_seconds
            .get_or_create(&crate::metrics::OpLabels { op: w.op.name() })
            .observe(w.started.elapsed().as_secs_f64());
        let result = match sent {
            Sent::Answered(r) => r,
            Sent::Unanswered(pending) => {
                w.key.forget();
                self.count(w.op.name(), &w.scope, Outcome::Timeout);
                tracing::warn!(
                    op = w.op.name(),
                    bucket = w.key.bucket(),
                    key = w.key.key(),
                    token = w.token,
                    "the backend did not answer a write in time; holding its key and epoch until it can no longer commit"
                );
                let hold = (w.admission, w.key, w.inflight);
                // Before the 503 goes out: a stop must see it (`end_run`).
                self.metrics.lingering_writes.inc();
                tokio::spawn(linger(
                    pending,
                    hold,
                    self.store_decision,
                    self.metrics.clone(),
                ));
                return Err(errors::backend_timeout(self.backend_timeout, true));
            }
        };
        match result {
            Ok(out) => {
                match now_holds(&out) {
                    Some(k) => w.key.remember(k),
                    None => w.key.forget(),
                }
                self.count(w.op.name(), &w.scope, Outcome::Accepted);
                Ok(out)
            }
            Err(e) => {
                // Whatever happened, the proxy no longer knows the key.
                w.key.forget();
                if w.admission.cancel.is_cancelled()
                    || self.fences.cluster().is_some_and(|c| !c.admits())
                {
                    let Write {
                        op,
                        scope,
                        token,
                        admission,
                        key,
                        ..
                    } = w;
                    drop(key);
                    return Err(self.cut(op.name(), &scope, token, admission).await);
                }
                if errors::is_condition_failure(&e) {
                    self.count(w.op.name(), &w.scope, Outcome::Conflict);
                    let (bucket, key) = (w.key.bucket().to_owned(), w.key.key().to_owned());
                    return Err(self
                        .redecide(w.op.name(), &bucket, &key, &w.scope, w.token)
                        .await);
                }
                self.count(w.op.name(), &w.scope, Outcome::BackendError);
                Err(errors::from_backend(e))
            }
        }
    }

    /// Re-reads a key after the store refused a condition and decides
    /// again: stale if a higher token is stored now, retry otherwise.
    pub(super) async fn redecide(
        &self,
        op: &'static str,
        bucket: &str,
        key: &str,
        scope: &Scope,
        token: u64,
    ) -> S3Error {
        match self
            .call(Box::pin(self.backend.head(bucket, key)), None)
            .await
        {
            Ok(k) => match self.refuse_if_overwritten(op, scope, token, bucket, key, &k) {
                Err(stale) => stale,
                Ok(()) => errors::retry(format!(
                    "s3://{bucket}/{key} changed in the store while this write was decided; retry"
                )),
            },
            Err(e) => e,
        }
    }
}
