//! Refusals of the fence: stale, cut, forged or unverifiable tokens,
//! missing tokens, other clients' uploads, unscoped keys. Each is one [`Refusal`], from which come the S3 error the
//! client gets (`errors`), the metric it is counted under
//! (`metrics::Outcome`) and the fence event it is recorded as
//! (`events::Kind`), so no site can pick them apart. [`Refuser`] is the
//! state refusing takes, shared by every stage: the metrics, the fence
//! events, the fences (a cut's answer asks them), and the owners the lease
//! service names for the tokens the proxy admitted.

use crate::errors;
use crate::events::{FenceEvents, Kind, Refused};
use crate::fences::{Admission, Fences};
use crate::keys::Known;
use crate::metrics::{Metrics, Outcome};
use crate::op::Op;
use crate::scope::Scope;
use crate::tokens::Rejection;
use fencegate_core::LockName;
use s3s::{S3Error, S3Result};
use std::collections::HashSet;
use std::sync::Arc;

/// The metric label of writes refused before their lock was known.
pub const UNKNOWN_LOCK: &str = "(none)";

/// A refusal of the fence, as its site knows it.
#[derive(Debug)]
pub enum Refusal<'a> {
    /// A token below the lock's max, or below the key's stored token;
    /// `detail` says where ("for lock L", "on s3://b/k ...").
    Stale {
        token: u64,
        max: u64,
        detail: String,
    },
    /// Admitted, then cut in flight by the newer token `by`.
    Cut { token: u64, by: u64, lock: &'a str },
    /// A token the proxy does not accept (`presented`: its number, if it
    /// could be read).
    Token {
        presented: Option<u64>,
        why: &'a Rejection,
    },
    /// A token that contradicts the one its upload was created with.
    UploadToken {
        upload_id: &'a str,
        bound: u64,
        sent: u64,
    },
    /// A fenced write without a token, in `scope`.
    Missing { scope: &'a Scope },
    /// A request for an upload another client created (`by_token`: one
    /// created without credentials, which answers only to its token).
    NotOwner { upload_id: &'a str, by_token: bool },
    /// A write to a key in no fence scope (so under no lock), where writes
    /// outside the scopes are denied.
    Unscoped(&'a crate::scope::Unscoped),
}

impl Refusal<'_> {
    /// `token` below `max`, the max of `scope`'s lock.
    pub fn below_max(token: u64, max: u64, scope: &Scope) -> Refusal<'static> {
        Refusal::Stale {
            token,
            max,
            detail: format!(" for lock {}", scope.lock),
        }
    }

    /// What it is counted as.
    fn outcome(&self) -> Outcome {
        match self {
            Refusal::Stale { .. } | Refusal::Cut { .. } => Outcome::Stale,
            Refusal::Token { .. } | Refusal::UploadToken { .. } => Outcome::InvalidToken,
            Refusal::Missing { .. } => Outcome::Missing,
            Refusal::NotOwner { .. } => Outcome::NotOwner,
            Refusal::Unscoped(_) => Outcome::Unscoped,
        }
    }

    /// The fence event it is recorded as, with the token and the max it
    /// names (a missing token, or another client's upload, is no event:
    /// no token was refused).
    fn event(&self) -> Option<(Kind, Option<u64>, Option<u64>)> {
        match *self {
            Refusal::Stale { token, max, .. } => Some((Kind::Stale, Some(token), Some(max))),
            Refusal::Cut { token, by, .. } => Some((Kind::Cut, Some(token), Some(by))),
            Refusal::Token { presented, .. } => Some((Kind::Forged, presented, None)),
            Refusal::UploadToken { sent, .. } => Some((Kind::Forged, Some(sent), None)),
            Refusal::Unscoped(_) => Some((Kind::Unscoped, None, None)),
            Refusal::Missing { .. } | Refusal::NotOwner { .. } => None,
        }
    }

    /// The S3 error the client gets for `op`.
    fn error(&self, op: Op) -> S3Error {
        match self {
            Refusal::Stale { token, max, detail } => errors::stale(*token, *max, detail),
            Refusal::Cut { token, by, lock } => errors::stale(
                *token,
                *by,
                &format!(" for lock {lock} while this request was in flight"),
            ),
            Refusal::Token { why, .. } => errors::rejected(why),
            Refusal::UploadToken {
                upload_id,
                bound,
                sent,
            } => errors::upload_token_mismatch(upload_id, *bound, *sent),
            Refusal::Missing { scope } => {
                errors::missing(op.name(), &scope.id, scope.lock.as_str())
            }
            Refusal::NotOwner {
                upload_id,
                by_token,
            } => errors::upload_not_yours(upload_id, *by_token),
            Refusal::Unscoped(u) => errors::unscoped(&u.bucket, &u.key, &u.configured, u.more),
        }
    }
}

/// What refusing, and counting, take: shared by every stage (a clone is
/// a few reference counts).
#[derive(Debug, Clone)]
pub struct Refuser {
    metrics: Arc<Metrics>,
    events: Arc<FenceEvents>,
    fences: Fences,
    /// The locks of the configured scopes: with the fences, the locks a
    /// count may name (see [`Refuser::count`]).
    configured: Arc<HashSet<LockName>>,
    owners: Owners,
}

/// Who asks the lease service for the owners of new tokens.
#[derive(Debug, Clone)]
struct Owners {
    /// The lease service (`locksvc_url`), asked after each raise who the
    /// new token's owner is, for fence events.
    lease_service: Option<fencegate_lease_api::Client>,
    /// Questions about owners in flight at once, at most (a burst of raises
    /// asks about a few, not all).
    questions: Arc<tokio::sync::Semaphore>,
    /// When the last failed question was logged (Unix ms; one a minute).
    warned_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Refuser {
    pub fn new(
        metrics: Arc<Metrics>,
        events: Arc<FenceEvents>,
        fences: Fences,
        configured: HashSet<LockName>,
        lease_service: Option<fencegate_lease_api::Client>,
    ) -> Refuser {
        Refuser {
            metrics,
            events,
            fences,
            configured: Arc::new(configured),
            owners: Owners {
                lease_service,
                questions: Arc::new(tokio::sync::Semaphore::new(4)),
                warned_ms: Arc::default(),
            },
        }
    }

    /// Counts a write's outcome under its lock; a lock that is neither
    /// configured nor has a fence counts as [`UNKNOWN_LOCK`], so refused
    /// requests naming made-up buckets add no metric series.
    pub fn count(&self, op: Op, scope: &Scope, outcome: Outcome) {
        let known = self.fences.known(scope.fence()) || self.configured.contains(&scope.lock);
        let lock = if known { scope.fence() } else { UNKNOWN_LOCK };
        self.metrics.write(op, lock, outcome);
    }

    /// Refuses with `r` in `scope`: counts it, records its fence event,
    /// and answers its error.
    pub fn refuse(&self, op: Op, scope: &Scope, r: Refusal<'_>) -> S3Error {
        self.refused(op, Some(scope), r)
    }

    /// Every refusal of the fence goes through here: `scope` is `None` only
    /// for a key in no scope, counted under [`UNKNOWN_LOCK`] since there is
    /// no lock to name.
    pub fn refused(&self, op: Op, scope: Option<&Scope>, r: Refusal<'_>) -> S3Error {
        match scope {
            Some(scope) => self.count(op, scope, r.outcome()),
            None => self.metrics.write(op, UNKNOWN_LOCK, r.outcome()),
        }
        let e = r.error(op);
        if let Some((kind, token, max)) = r.event() {
            self.record(kind, op, scope, token, max, &e);
        }
        e
    }

    /// The answer for a write cut by a newer epoch: let go of the epoch (the
    /// raise is waiting for it), then ask the fence again, which waits for
    /// the raise to finish and reports the exact new max.
    ///
    /// A cut write always learns it lost with the non-retryable 409
    /// `FencingTokenStale`, whatever the write and however far it got: a
    /// higher token exists for its lock, so no retry with its token can
    /// succeed. The max reported is the token that cut it.
    pub async fn cut(&self, op: Op, scope: &Scope, token: u64, admission: Admission) -> S3Error {
        drop(admission);
        // The answer is the raise's outcome, not its attempt: a raise the
        // database refused admitted nobody, and this writer may still hold
        // the lease.
        if let Some(max) = self.fences.after_raise(scope.fence()).await
            && !fencegate_core::fence::is_stale(max, token)
        {
            self.count(op, scope, Outcome::Unavailable);
            return errors::storage(
                "a newer token's raise of the fence could not be made durable (the proxy database failed); this request was cut in flight and nothing of it was committed: retry".to_owned(),
            );
        }
        if let Some(c) = self.fences.cluster()
            && !c.admits()
            && !fencegate_core::fence::is_stale(self.fences.cut_by(scope.fence()), token)
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

    /// The object's rule, decided here only: a key whose stored token is
    /// above `token` was written by a newer holder (through another
    /// replica, or another proxy of the store), so the write is stale.
    pub(crate) fn refuse_if_overwritten(
        &self,
        op: Op,
        scope: &Scope,
        token: u64,
        bucket: &str,
        key: &str,
        stored: &Known,
    ) -> S3Result<()> {
        if fencegate_core::fence::is_stale(stored.token(), token) {
            return Err(self.refuse(
                op,
                scope,
                Refusal::Stale {
                    token,
                    max: stored.token(),
                    detail: format!(" on s3://{bucket}/{key} (by another writer of this store)"),
                },
            ));
        }
        Ok(())
    }

    /// Records a refusal answered with `e` as a fence event.
    fn record(
        &self,
        kind: Kind,
        op: Op,
        scope: Option<&Scope>,
        token: Option<u64>,
        max: Option<u64>,
        e: &S3Error,
    ) {
        self.events.refused(Refused {
            kind,
            op,
            scope,
            token,
            max,
            reason: e.message().unwrap_or_default().to_owned(),
        });
    }

    /// The recent fence events.
    pub fn events(&self) -> &FenceEvents {
        &self.events
    }

    /// Asks the lease service, off the write path, whose lease `token` of
    /// `lock` is, so fence events can name the zombie and the holder.
    pub fn learn_owner(&self, lock: &str, token: u64) {
        let (Some(api), Ok(rt)) = (
            self.owners.lease_service.clone(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let Ok(permit) = self.owners.questions.clone().try_acquire_owned() else {
            return; // enough questions in flight; this owner stays unknown
        };
        let (events, lock, warned) = (
            self.events.clone(),
            lock.to_owned(),
            self.owners.warned_ms.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::Code;

    #[test]
    fn each_refusal_is_counted_recorded_and_answered_as_one() {
        let scope = Scope::new(crate::scope::ScopeDef {
            id: "b".into(),
            bucket: "b".into(),
            prefix: String::new(),
            lock: fencegate_core::LockName::new("l").expect("lock"),
        });
        let unsigned = Rejection::Unsigned;
        let unscoped = crate::scope::Unscoped {
            bucket: "other".into(),
            key: "k".into(),
            configured: vec!["b".into()],
            more: 0,
        };
        let cases = [
            (
                Refusal::Stale {
                    token: 3,
                    max: 4,
                    detail: String::new(),
                },
                Outcome::Stale,
                Some((Kind::Stale, Some(3), Some(4))),
                Some(Code::TokenStale),
            ),
            (
                Refusal::Cut {
                    token: 3,
                    by: 5,
                    lock: "l",
                },
                Outcome::Stale,
                Some((Kind::Cut, Some(3), Some(5))),
                Some(Code::TokenStale),
            ),
            (
                Refusal::Token {
                    presented: Some(9),
                    why: &unsigned,
                },
                Outcome::InvalidToken,
                Some((Kind::Forged, Some(9), None)),
                Some(Code::TokenUnsigned),
            ),
            (
                Refusal::UploadToken {
                    upload_id: "u",
                    bound: 3,
                    sent: 4,
                },
                Outcome::InvalidToken,
                Some((Kind::Forged, Some(4), None)),
                Some(Code::InvalidToken),
            ),
            (
                Refusal::Missing { scope: &scope },
                Outcome::Missing,
                None,
                Some(Code::TokenRequired),
            ),
            (
                Refusal::NotOwner {
                    upload_id: "u",
                    by_token: false,
                },
                Outcome::NotOwner,
                None,
                None,
            ),
            (
                Refusal::Unscoped(&unscoped),
                Outcome::Unscoped,
                Some((Kind::Unscoped, None, None)),
                Some(Code::ScopeUndefined),
            ),
        ];
        for (r, outcome, event, code) in cases {
            assert_eq!(r.outcome(), outcome, "{r:?}");
            assert_eq!(r.event(), event, "{r:?}");
            let e = r.error(Op::PutObject);
            assert_eq!(Code::of(&e), code, "{r:?}");
            if let Some(c) = code {
                assert_eq!(e.status_code(), Some(c.status()), "{r:?}");
            }
        }
    }
}
