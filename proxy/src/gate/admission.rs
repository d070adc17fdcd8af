//! Stages three and four: the scope's epoch admits the [`Tokened`]
//! request, the key is locked and its stored state known; the result is
//! an [`Admitted`] write, which only the write stage (`write`) sends.

use super::refusal::{Refusal, Refuser};
use super::store::Store;
use super::token::Tokened;
use crate::dialect::Dialect;
use crate::errors;
use crate::fences::{Admission, FenceError, Fences};
use crate::keys::{KeyGuard, Keys, Known};
use crate::metrics::{LockLabels, Metrics, Outcome};
use crate::probe::ProbeReport;
use crate::scope::Scope;
use parking_lot::Mutex;
use s3s::S3Result;
use std::sync::Arc;
use std::time::Instant;

/// The object writes, each sent only by the write stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOp {
    Put,
    Copy,
    Delete,
    DeleteMany,
    Complete,
}

impl WriteOp {
    /// The S3 operation.
    pub fn op(self) -> crate::op::Op {
        use crate::op::Op;
        match self {
            WriteOp::Put => Op::PutObject,
            WriteOp::Copy => Op::CopyObject,
            WriteOp::Delete => Op::DeleteObject,
            WriteOp::DeleteMany => Op::DeleteObjects,
            WriteOp::Complete => Op::CompleteMultipartUpload,
        }
    }

    /// The S3 operation name (metrics, logs).
    pub fn name(self) -> &'static str {
        self.op().name()
    }

    /// Whether a cached state of the key may stand in for reading it, on
    /// a store with probe report `store` (None: not probed).
    ///
    /// The cache holds what the store answered to this proxy's own writes.
    /// Where the store enforces the condition derived from it, a stale
    /// cache (another replica wrote since) fails at the store, and the
    /// write is re-decided. Where it does not, the cache is not trusted and
    /// the key is read afresh: that catches every write another replica
    /// finished before this one was decided, though not one racing it (only
    /// the store's CAS can close that window; README "Several proxies").
    /// A delete of a key cached absent is always read afresh: a DELETE
    /// cannot be made conditional on absence, so it would go out with no
    /// condition at all.
    fn trusts_cached(self, cached: &Known, store: Option<&ProbeReport>) -> bool {
        let new_key = matches!(cached, Known::Absent);
        if new_key && matches!(self, WriteOp::Delete | WriteOp::DeleteMany) {
            return false;
        }
        store.is_some_and(|r| self.enforced_by(r, new_key))
    }

    /// Whether a store with probe report `r` enforces the condition this
    /// operation sends (`If-None-Match: *` for a new key, `If-Match`
    /// otherwise).
    pub fn enforced_by(self, r: &ProbeReport, new_key: bool) -> bool {
        match (self, new_key) {
            (WriteOp::Put, true) => r.put_if_none_match.enforced(),
            (WriteOp::Put, false) => r.put_if_match.enforced(),
            (WriteOp::Complete, true) => r.complete_if_none_match.enforced(),
            (WriteOp::Complete, false) => r.complete_if_match.enforced(),
            (WriteOp::Copy, true) => r.copy_if_none_match.enforced(),
            (WriteOp::Copy, false) => r.copy_if_match.enforced(),
            // A delete of a key verified absent sends nothing.
            (WriteOp::Delete | WriteOp::DeleteMany, true) => true,
            (WriteOp::Delete | WriteOp::DeleteMany, false) => r.delete_if_match.enforced(),
        }
    }
}

/// Counts a write in `inflight_writes` for as long as it lives.
#[derive(Debug)]
pub(super) struct Inflight(Arc<Metrics>);

impl Inflight {
    fn new(metrics: &Arc<Metrics>) -> Inflight {
        metrics.inflight_writes.inc();
        Inflight(metrics.clone())
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.inflight_writes.dec();
    }
}

/// A write that passed every check and holds its key: what the write
/// stage takes, and the only thing it sends an object write for. Made only
/// here; its one field is private.
#[derive(Debug)]
pub struct Admitted(Parts);

impl Admitted {
    /// Taken apart by the write stage, which sends it.
    pub(super) fn parts(self) -> Parts {
        self.0
    }
}

/// What an [`Admitted`] write holds.
#[derive(Debug)]
pub(super) struct Parts {
    /// First, so it is dropped first: a write counted in flight still
    /// holds its admission (a raise admitted elsewhere finds it at 0).
    pub inflight: Inflight,
    pub op: WriteOp,
    pub scope: Scope,
    pub token: u64,
    pub admission: Admission,
    pub key: KeyGuard,
    pub known: Known,
    /// `known` is `Absent` by presumption, not by a read (see
    /// [`Admitter::begin_put`]).
    pub presumed: bool,
    /// How the bucket's store reads conditions.
    pub dialect: Dialect,
    pub started: Instant,
}

/// Stages three and four's state: the fences (the epochs), the keys'
/// locks and known states, the store (its probe, a key's read).
#[derive(Debug)]
pub struct Admitter {
    fences: Fences,
    keys: Keys,
    store: Arc<Store>,
    refuser: Refuser,
    metrics: Arc<Metrics>,
    /// Failed raises, logged at most once a second.
    storage_failures: Mutex<fencegate_durable::Throttle>,
}

impl Admitter {
    pub fn new(
        fences: Fences,
        keys: Keys,
        store: Arc<Store>,
        refuser: Refuser,
        metrics: Arc<Metrics>,
    ) -> Admitter {
        Admitter {
            fences,
            keys,
            store,
            refuser,
            metrics,
            storage_failures: Mutex::default(),
        }
    }

    /// Stage three: admits the token into its scope's epoch (see
    /// [`Fences::admit`]), once the bucket's store is known to enforce the
    /// conditions the writes need.
    pub async fn admit(&self, tokened: &Tokened) -> S3Result<Admission> {
        let (op, scope) = (tokened.op(), tokened.scope());
        let token = tokened.token().number();
        self.store.require_safe(tokened.scoped().bucket()).await?;
        match self.fences.admit(scope.fence(), token).await {
            Ok(a) => {
                if a.raised() {
                    tracing::info!(lock = %scope.lock, scope = %scope.id, token, waited_ms = a.waited().as_millis(), "fence raised");
                    self.refuser.learn_owner(scope.lock.as_str(), token);
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
                Err(self
                    .refuser
                    .refuse(op, scope, Refusal::below_max(token, max, scope)))
            }
            Err(FenceError::Storage(e)) => {
                self.refuser.count(op, scope, Outcome::Unavailable);
                let held_back = self.storage_failures.lock().ready();
                if let Some(held_back) = held_back {
                    tracing::error!(lock = %scope.lock, token, error = %e, not_logged = held_back, "cannot persist a raise of the fence in the proxy database; answering 503 (logged at most once a second)");
                }
                Err(errors::storage(format!(
                    "cannot persist the new max token: {e}; nothing was written"
                )))
            }
            Err(FenceError::Unavailable(e)) => {
                self.refuser.count(op, scope, Outcome::Unavailable);
                Err(errors::storage(format!("{e}; nothing was written")))
            }
        }
    }

    /// Stages three and four for an object write: admission, the key's
    /// lock, its verified state: the [`Admitted`] write the write stage
    /// alone can send.
    pub async fn begin(&self, write: WriteOp, tokened: Tokened) -> S3Result<Admitted> {
        self.begin_with(write, tokened, false).await
    }

    /// [`Admitter::begin`] for a PutObject whose body the write stage can
    /// send twice (`resendable`): a key the proxy knows nothing of is then
    /// presumed absent instead of read, where the store enforces
    /// `If-None-Match: *`, so a new key costs one backend round trip; if
    /// the key exists after all, the store refuses and the write stage
    /// reads it and sends again.
    pub async fn begin_put(&self, tokened: Tokened, resendable: bool) -> S3Result<Admitted> {
        let presume = resendable && self.store.has_lean_forwarder();
        self.begin_with(WriteOp::Put, tokened, presume).await
    }

    async fn begin_with(
        &self,
        write: WriteOp,
        tokened: Tokened,
        presume_absent: bool,
    ) -> S3Result<Admitted> {
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
            () = cut.cancelled() => return Err(self.refuser.cut(op, &scope, token, admission).await),
        };
        let probed = self.store.probed(bucket);
        let trusted = |k: &Known| write.trusts_cached(k, probed.as_deref());
        let presumable = || {
            presume_absent
                && probed
                    .as_ref()
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
                let k = self.store.head(bucket, key).await?;
                guard.remember(k.clone());
                k
            }
        };
        self.refuser
            .refuse_if_overwritten(op, &scope, token, bucket, key, &known)?;
        Ok(Admitted(Parts {
            op: write,
            scope,
            token,
            admission,
            key: guard,
            known,
            presumed,
            dialect: self.store.dialect_of(bucket),
            started: Instant::now(),
            inflight: Inflight::new(&self.metrics),
        }))
    }
}
