//! The gate: a fenced write's stages, in the order a write goes through
//! them, each a type that owns only the state it needs and hands the next
//! stage a value:
//!
//! ```text
//!  Scoping ──► TokenCheck ──► Admitter (probe ok? epoch, key, known state) ──► Writer
//!  → Scoped     → Tokened      → Admitted                                     → the store
//!    │             │              │         │          │          │
//!   403      428/400/403         503    409 stale   409 if cut  409 if the object's
//!  unscoped                    unsafe                           token is higher
//! ```
//!
//! (The token is checked before the probe so that a request without a
//! valid token never makes the proxy probe a bucket.)
//!
//! One file per stage: [`scope`] ([`Scoping`]: the key's fence scope, a
//! [`scope::Scoped`]), [`token`] ([`TokenCheck`]: the request's
//! `VerifiedToken`, a [`token::Tokened`]), [`admission`] ([`Admitter`]:
//! the store's probe ([`store`]), the epoch, the key's lock and its known
//! state, an [`admission::Admitted`]), [`write`] ([`Writer`]: the only
//! sender of object writes, its timeout policy and its end: answered,
//! re-decided, or lingering while the store may still commit). Beside
//! them: [`refusal`] ([`Refuser`]: every refusal of the fence, counted and
//! recorded, shared by the stages), [`store`] ([`Store`]: the backend, what
//! each bucket's store enforces, the calls that are not object writes),
//! [`call`] (the answer timeout of those calls), [`uploads`] (multipart
//! bindings) and [`status`]. A stage imports the stages before it and the
//! leaves beside it, never one after it, and none imports this file: the
//! [`Gate`] here only builds the stages and composes them (the acquisition
//! fence, the status, the end of a run).

pub mod admission;
mod call;
pub mod refusal;
pub mod scope;
mod status;
pub mod store;
pub mod token;
pub mod uploads;
pub mod write;

pub use admission::{Admitter, WriteOp};
pub use refusal::{Refuser, UNKNOWN_LOCK};
pub use scope::Scoping;
pub use store::Store;
pub use token::{RequestToken, TokenCheck};
pub use uploads::Uploads;
pub use write::Writer;

use crate::backend::Backend;
use crate::config::ProxyConfig;
use crate::errors;
use crate::events::FenceEvents;
use crate::fences::Fences;
use crate::issuer::Issuer;
use crate::keys::Keys;
use crate::metrics::{LockLabels, Metrics, Outcome};
use crate::op::Op;
use crate::scope::ScopeMap;
use crate::state::db::Db;
use crate::tokens::TokenPolicy;
use fencegate_core::TokenKeys;
use http::HeaderMap;
use s3s::S3Result;
use std::sync::Arc;
use std::time::Duration;

/// Keys being written that `/_fencegate/status` lists at most.
const BUSY_KEYS_SHOWN: usize = 50;

/// The proxy's stages, built once from its configuration. Each is used
/// through its field; what is left here composes them.
#[derive(Debug)]
pub struct Gate {
    /// Stage one: the key's fence scope.
    pub scoping: Scoping,
    /// Stage two: the request's verified token.
    pub tokens: TokenCheck,
    /// The store: its probe, and the calls that are not object writes.
    pub store: Arc<Store>,
    /// Stages three and four: the epoch, the key, its known state.
    pub admitter: Admitter,
    /// The last stage: the only sender of object writes.
    pub writer: Writer,
    /// The bindings of open multipart uploads.
    pub uploads: Uploads,
    /// Refusals of the fence and the counts of writes, for every stage.
    pub refuser: Refuser,
    fences: Fences,
    keys: Keys,
    db: Db,
    metrics: Arc<Metrics>,
    /// The header families writes may carry.
    write_headers: crate::write_headers::WriteHeaders,
    /// Bytes of whole-read request bodies held at once (see `early`).
    body_budget: crate::early::BodyBudget,
}

impl Gate {
    pub fn new(
        config: &ProxyConfig,
        db: Db,
        cluster: Option<crate::state::cluster::Cluster>,
    ) -> anyhow::Result<Gate> {
        // With replicas, no write's bytes leave once the standing ended.
        let last_check = cluster.clone().map(|c| {
            let check: crate::send_check::Check = std::sync::Arc::new(move || c.admits());
            check
        });
        let keys = if config.signing_keys.is_empty() {
            None
        } else {
            Some(
                TokenKeys::new(
                    config
                        .signing_keys
                        .iter()
                        .map(|k| k.as_bytes().to_vec())
                        .collect(),
                )
                .ok_or_else(|| anyhow::anyhow!("signing_keys are invalid"))?,
            )
        };
        // A run that did not end cleanly may have left writes in flight that
        // the store can still commit: raises wait them out. (Replicas wait
        // out their predecessors in the raise protocol instead.)
        let settle = if cluster.is_some() || db.begin_run()? {
            Duration::ZERO
        } else {
            let settle = Duration::from_secs(config.backend.store_decision_secs);
            tracing::warn!(
                "the proxy's last run did not end cleanly: raises wait {settle:?} (backend.store_decision_secs) for writes it may have left in flight"
            );
            settle
        };
        let fences = Fences::load(db.clone(), settle)?;
        let metrics = Arc::new(Metrics::default());
        let scopes = ScopeMap::new(config)?;
        // Fences were kept per scope before they were kept per lock: a
        // scope's old max carries over to its lock, so no token goes back.
        for s in scopes.configured() {
            let old = fences.max(&s.id);
            if s.id != s.fence() && fencegate_core::fence::raises(fences.max(s.fence()), old) {
                db.raise(s.fence(), old)?;
            }
        }
        let fences = match cluster {
            Some(c) => Fences::shared(c),
            None => Fences::load(db.clone(), settle)?,
        };
        for (lock, max) in fences.snapshot() {
            if lock.contains('/') {
                continue; // a scope's row from before fences were per lock
            }
            metrics
                .max_token
                .get_or_create(&LockLabels { lock })
                .set(i64::try_from(max).unwrap_or(i64::MAX));
        }
        // One client of the lease service: for plain-token checks and for
        // the owners of new tokens.
        let lease_service = config
            .locksvc_url
            .as_deref()
            .map(|url| -> anyhow::Result<_> {
                let http = config
                    .locksvc_tls()
                    .http_client()?
                    .timeout(Duration::from_secs(config.backend.timeout_secs))
                    .build()?;
                Ok(fencegate_lease_api::Client::new(
                    http,
                    url,
                    config.locksvc_api_key.clone(),
                ))
            })
            .transpose()?;
        let events = Arc::new(FenceEvents::new(config.fence_events_kept));
        let configured = scopes.configured().iter().map(|s| s.lock.clone()).collect();
        let refuser = Refuser::new(
            metrics.clone(),
            events,
            fences.clone(),
            configured,
            lease_service.clone(),
        );
        let store = Arc::new(Store::new(
            Backend::new(&config.backend, last_check, metrics.lean_resends.clone()),
            config.accept_weak_backend,
            Duration::from_secs(config.backend.timeout_secs),
            metrics.clone(),
        ));
        let keys_of_writes = Keys::new(config.etag_cache_entries);
        Ok(Gate {
            scoping: Scoping::new(scopes, refuser.clone()),
            // With locksvc_url, plain tokens are accepted only once the lease
            // service confirms them, so they are not trusted on sight.
            tokens: TokenCheck::new(
                TokenPolicy::new(
                    keys,
                    config.unsigned_tokens_accepted() && config.locksvc_url.is_none(),
                ),
                issuer(
                    lease_service.filter(|_| config.unsigned_tokens_accepted()),
                    &config.elections,
                )?,
                fences.clone(),
                refuser.clone(),
            ),
            admitter: Admitter::new(
                fences.clone(),
                keys_of_writes.clone(),
                store.clone(),
                refuser.clone(),
                metrics.clone(),
            ),
            writer: Writer::new(
                store.clone(),
                fences.clone(),
                refuser.clone(),
                metrics.clone(),
                Duration::from_secs(config.backend.store_decision_secs),
                Duration::from_secs(config.client_idle_timeout_secs),
            ),
            uploads: Uploads::new(fences.clone(), db.clone()),
            store,
            refuser,
            fences,
            keys: keys_of_writes,
            db,
            metrics,
            write_headers: crate::write_headers::WriteHeaders::new(&config.allow_write_headers),
            body_budget: crate::early::BodyBudget::new(
                config.max_buffered_body_bytes,
                config.max_xml_body_bytes,
            ),
        })
    }

    /// The budget of whole-read request bodies.
    pub fn body_budget(&self) -> &crate::early::BodyBudget {
        &self.body_budget
    }

    /// The header families writes may carry.
    pub fn write_headers(&self) -> &crate::write_headers::WriteHeaders {
        &self.write_headers
    }

    /// The proxy's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Records a clean end of this run if no write is left that the store
    /// may still commit (called once every request has drained); otherwise
    /// the next run waits such writes out before it raises a fence. A run
    /// that stops while it still waits out its predecessor's writes is not
    /// clean either: those writes may still land.
    pub fn end_run(&self) {
        if !self.fences.settled() {
            tracing::warn!(
                "stopping within backend.store_decision_secs of a start after an unclean stop: the next start's raises wait again"
            );
            return;
        }
        let lingering = self.metrics.lingering_writes.get();
        if lingering > 0 {
            tracing::warn!(
                lingering,
                "stopping with writes the store may still commit: the next start's raises wait backend.store_decision_secs"
            );
            return;
        }
        if let Err(e) = self.db.end_run_cleanly() {
            tracing::warn!(
                "cannot record the clean stop: {e}; the next start's raises wait backend.store_decision_secs"
            );
        }
    }

    /// Raises the fence of the lock a new holder's signed token names to
    /// that token, before the holder writes anything (acquisition
    /// fencing, `POST /_fencegate/fence`): exactly what its first write
    /// would do, so older writes in flight are cut or drained and every
    /// lower token is refused from then on, on every replica. Only the
    /// signed token proves holding (a number is public); a lower token is
    /// stale (409). Answers the lock, the token and the max now.
    pub async fn fence(
        &self,
        headers: &HeaderMap,
        lock_param: Option<&str>,
    ) -> S3Result<(String, u64, u64)> {
        const OP: Op = Op::Fence;
        let value = headers
            .get(crate::tokens::FENCING_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                s3s::s3_error!(
                    InvalidRequest,
                    "send the lease's signed fencing_token in the Fencing-Token header"
                )
            })?;
        let parsed = fencegate_core::FencingToken::parse(value.trim());
        // A plain token names no lock: `?lock=` names one that follows an
        // election, whose holder's token the election vouches for. A
        // signed token of such a lock is the election's keys' to verify.
        let elected = match &parsed {
            Ok(fencegate_core::FencingToken::Plain(_)) => lock_param
                .and_then(|l| fencegate_core::LockName::new(l).ok())
                .filter(|l| self.tokens.follows_election(l)),
            Ok(fencegate_core::FencingToken::Signed(s)) => {
                Some(s.lock.clone()).filter(|l| self.tokens.follows_election(l))
            }
            Err(_) => None,
        };
        // Without keys a token in the signed form cannot be verified, and
        // a fence raised on anyone's say-so would lock the holder out.
        if elected.is_none() && self.tokens.keys().is_none() {
            return Err(errors::fence_unverifiable());
        }
        let lock = match (elected, parsed) {
            (Some(lock), _) => lock,
            (None, Ok(fencegate_core::FencingToken::Signed(s))) => s.lock,
            (None, Ok(fencegate_core::FencingToken::Plain(_))) => {
                return Err(errors::rejected(&crate::tokens::Rejection::Unsigned));
            }
            (None, Err(e)) => {
                return Err(s3s::s3_error!(
                    InvalidRequest,
                    "the Fencing-Token header is not a fencing token ({e}): send the lease's signed fencing_token"
                ));
            }
        };
        let scoped = self
            .scoping
            .scope_of_lock(OP, &lock)
            .ok_or_else(|| errors::unknown_lock(lock.as_str()))?;
        let tokened = self
            .tokens
            .required(
                scoped,
                RequestToken {
                    headers,
                    access_key: None,
                },
            )
            .await?;
        // A bucket-per-scope lock whose bucket the store does not have is
        // not fenced here.
        let admission = self.admitter.admit(&tokened).await.map_err(|e| {
            if e.code() == &s3s::S3ErrorCode::NoSuchBucket {
                errors::unknown_lock(lock.as_str())
            } else {
                e
            }
        })?;
        drop(admission);
        let scope = tokened.scope();
        self.refuser.count(OP, scope, Outcome::Accepted);
        Ok((
            scope.lock.to_string(),
            tokened.token().number(),
            self.fences.max(scope.fence()),
        ))
    }
}

impl Gate {
    /// Raises `lock`'s fence to `number`, the term its election shows now
    /// (checked again here, as for a write), exactly as the new holder's
    /// first write would: older writes in flight are cut or drained, and
    /// lower tokens refused from then on. The proxy's own watch of the
    /// election calls it at every change. `Ok(None)`: nothing to raise (no
    /// scope or bucket for the lock, a number below the max, or not the
    /// term the election shows any more); else the max now.
    pub async fn follow_election(
        &self,
        lock: &fencegate_core::LockName,
        number: u64,
    ) -> Result<Option<u64>, String> {
        let Some(scoped) = self.scoping.scope_of_lock(Op::Fence, lock) else {
            return Ok(None);
        };
        let Some(tokened) = self.tokens.elected_now(scoped, number).await? else {
            return Ok(None);
        };
        match self.admitter.admit(&tokened).await {
            Ok(admission) => drop(admission),
            Err(e) if e.code() == &s3s::S3ErrorCode::NoSuchBucket => return Ok(None),
            Err(e) => return Err(e.message().unwrap_or("refused").to_owned()),
        }
        let scope = tokened.scope();
        self.refuser.count(Op::Fence, scope, Outcome::Accepted);
        Ok(Some(self.fences.max(scope.fence())))
    }
}

/// Who checks plain tokens: the lease service (with `locksvc_url` and
/// `accept_unsigned_tokens`) and each `[[elections]]` lock's election;
/// `None` when neither is configured.
fn issuer(
    lease_service: Option<fencegate_lease_api::Client>,
    elections: &[crate::election::ElectionConfig],
) -> anyhow::Result<Option<Issuer>> {
    let mut by_lock = std::collections::HashMap::new();
    for (i, e) in elections.iter().enumerate() {
        let lock = fencegate_core::LockName::new(&e.lock)
            .map_err(|why| anyhow::anyhow!("elections[{i}].lock: {why}"))?;
        let election = crate::election::Election::from_config(e)
            .map_err(|why| anyhow::anyhow!("elections[{i}]: {why}"))?;
        by_lock.insert(lock, election);
    }
    if lease_service.is_none() && by_lock.is_empty() {
        return Ok(None);
    }
    Ok(Some(Issuer::new(
        lease_service,
        crate::election::Elections::new(by_lock),
    )))
}
