//! The gate: the state every fenced operation shares, and the steps they
//! share, in the order a write goes through them:
//!
//! ```text
//!  scope ──► token ──────► probe ok? ──► admit (epoch) ──► lock key ──► known state
//!    │          │              │             │                 │             │
//!   403    428/400/403        503        409 stale        409 if cut    409 if the object's
//!  unscoped                  unsafe                                     token is higher
//! ```
//!
//! (The token is checked before the probe so that a request without a
//! valid token never makes the proxy probe a bucket.)
//!
//! After these, the [`Write`] forwards a conditional request built from the
//! known state, and on the store's condition failure re-reads the key and
//! answers stale or retry. A write the store does not answer in time is
//! answered 503 but keeps its admission and key until it can no longer
//! commit (`write::linger`).
//!
//! One file per step, in the order above, each taking the one before's
//! output: [`scope`] (the key's fence scope: [`scope::Scoped`]), [`token`]
//! (the request's [`VerifiedToken`]: [`token::Tokened`]), [`store`] (the
//! probe: what the store enforces), [`admission`] (the epoch, the key, the
//! known state: a [`Write`]), [`write`] (the only sender of writes, its
//! timeout policy and its end); beside them [`refusal`] (every refusal of
//! the fence: stale, cut, forged and missing tokens, other clients'
//! uploads, unscoped keys), [`uploads`] (multipart bindings) and
//! [`status`]. This file holds the state they share and the answer timeout
//! of the calls that change no object. It imports none of them: a stage
//! imports the stages before it and this file, never one after it.

mod admission;
pub mod refusal;
pub mod scope;
mod status;
mod store;
pub mod token;
mod uploads;
pub mod write;

use crate::backend::Backend;
use crate::body::{BodyWatch, Cancellable};
use crate::config::ProxyConfig;
use crate::dialect::Dialect;
use crate::errors;
use crate::events::{FenceEvents, Kind, Refused};
use crate::fences::{Admission, FenceError, Fences};
use crate::issuer::{Answer, Issuer};
use crate::keys::{KeyGuard, Keys, Known};
use crate::metrics::{LockLabels, Metrics, Outcome, ProbeLabels};
use crate::op::Op;
use crate::probe::{ProbeError, ProbeReport, probe};
use crate::scope::{Scope, ScopeMap};
use crate::state::db::Db;
use crate::tokens::upload::UploadBinding;
use crate::tokens::{Presented, Rejection, TokenPolicy, VerifiedToken};
use fencegate_core::TokenKeys;
use http::HeaderMap;
use s3s::{S3Error, S3Result};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Keys being written that `/_fencegate/status` lists at most.
const BUSY_KEYS_SHOWN: usize = 50;

/// The metric label of writes refused before their lock was known.
pub const UNKNOWN_LOCK: &str = "(none)";

/// Shared state of the proxy.
#[derive(Debug)]
pub struct Gate {
    backend: Backend,
    scopes: ScopeMap,
    fences: Fences,
    keys: Keys,
    db: Db,
    tokens: TokenPolicy,
    /// The header families writes may carry.
    write_headers: crate::write_headers::WriteHeaders,
    /// Failed raises, logged at most once a second.
    storage_failures: std::sync::Mutex<fencegate_durable::Throttle>,
    /// Checks plain tokens with the lease service, when configured.
    issuer: Option<Issuer>,
    /// The lease service (`locksvc_url`), asked after each raise who the
    /// new token's owner is, for fence events.
    lease_service: Option<fencegate_lease_api::Client>,
    /// Questions about owners in flight at once, at most (a burst of raises
    /// asks about a few, not all).
    owner_questions: Arc<tokio::sync::Semaphore>,
    /// When the last failed question was logged (Unix ms; one a minute).
    owner_warned_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Recent refusals (see `events`).
    events: Arc<FenceEvents>,
    metrics: Arc<Metrics>,
    accept_weak_backend: bool,
    /// How long the backend has to answer once a request is fully sent.
    backend_timeout: Duration,
    /// How long the store may still commit a write after its connection
    /// closed (`backend.store_decision_secs`).
    store_decision: Duration,
    /// How long a client may send nothing in the middle of a body.
    client_idle: Duration,
    probes: Mutex<HashMap<String, Arc<ProbeReport>>>,
    probing: tokio::sync::Mutex<()>,
    /// Bytes of whole-read request bodies held at once (see `early`).
    body_budget: crate::early::BodyBudget,
    /// Large uploads read ahead of the store at once (see `read_ahead`).
    read_aheads: crate::read_ahead::ReadAheads,
}

/// Where a request's token can come from: its headers, and the access key
/// it was signed with (lease-bound credentials).
#[derive(Debug, Clone, Copy)]
pub struct RequestToken<'a> {
    pub headers: &'a HeaderMap,
    pub access_key: Option<&'a str>,
}

impl<'a> RequestToken<'a> {
    pub fn of<T>(req: &'a s3s::S3Request<T>) -> RequestToken<'a> {
        RequestToken {
            headers: &req.headers,
            access_key: req.credentials.as_ref().map(|c| c.access_key.as_str()),
        }
    }
}

/// The object writes, each sent only through a [`Write`].
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

/// A write that passed every check and holds its key: the only thing that
/// can send an object write (see [`write`]).
#[derive(Debug)]
pub struct Write {
    /// First, so it is dropped first: a write counted in flight still
    /// holds its admission (a raise admitted elsewhere finds it at 0).
    inflight: Inflight,
    op: WriteOp,
    scope: Scope,
    token: u64,
    admission: Admission,
    key: KeyGuard,
    known: Known,
    /// `known` is `Absent` by presumption, not by a read (see
    /// [`Gate::begin_put`]).
    presumed: bool,
    /// How the bucket's store reads conditions, and the client that
    /// writes them so.
    dialect: Dialect,
    client: aws_sdk_s3::Client,
    started: Instant,
}

/// Counts a write in `inflight_writes` for as long as it lives.
#[derive(Debug)]
struct Inflight(Arc<Metrics>);

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

/// A backend call, boxed by its caller: the SDK's futures are kilobytes,
/// and a call held inline would make every request's future (the hot
/// PutObject's too, which mostly never makes such a call) that big, copied
/// whole when the request starts.
type Call<'a, T> = std::pin::Pin<Box<dyn Future<Output = S3Result<T>> + Send + 'a>>;

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
        let metrics = Arc::new(Metrics::new());
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
        Ok(Gate {
            backend: Backend::new(&config.backend, last_check),
            scopes,
            fences,
            keys: Keys::new(config.etag_cache_entries),
            db,
            // With locksvc_url, plain tokens are accepted only once the lease
            // service confirms them, so they are not trusted on sight.
            tokens: TokenPolicy::new(
                keys,
                config.unsigned_tokens_accepted() && config.locksvc_url.is_none(),
            ),
            write_headers: crate::write_headers::WriteHeaders::new(&config.allow_write_headers),
            storage_failures: std::sync::Mutex::default(),
            issuer: lease_service
                .clone()
                .filter(|_| config.unsigned_tokens_accepted())
                .map(Issuer::new),
            lease_service,
            events: Arc::new(FenceEvents::new(config.fence_events_kept)),
            owner_questions: Arc::new(tokio::sync::Semaphore::new(4)),
            owner_warned_ms: Arc::default(),
            metrics,
            accept_weak_backend: config.accept_weak_backend,
            backend_timeout: Duration::from_secs(config.backend.timeout_secs),
            store_decision: Duration::from_secs(config.backend.store_decision_secs),
            client_idle: Duration::from_secs(config.client_idle_timeout_secs),
            probes: Mutex::new(HashMap::new()),
            probing: tokio::sync::Mutex::new(()),
            body_budget: crate::early::BodyBudget::new(
                config.max_buffered_body_bytes,
                config.max_xml_body_bytes,
            ),
            read_aheads: crate::read_ahead::ReadAheads::default(),
        })
    }

    /// Awaits a backend call that changes no object (a read, creating an
    /// upload, a part), giving the backend `backend_timeout` to answer once
    /// the request is sent (for a streamed body: once `body_sent` is
    /// notified). A backend that does not answer in time gets the client a
    /// retryable 503 and the request is dropped: whatever the store does
    /// with it later changes no object. Object writes use
    /// [`Gate::call_write`] instead, which does not let go of them.
    async fn call<T>(&self, fut: Call<'_, T>, body_sent: Option<Arc<Notify>>) -> S3Result<T> {
        let timeout = self.backend_timeout;
        let deadline = async {
            if let Some(sent) = body_sent {
                sent.notified().await;
            }
            tokio::time::sleep(timeout).await;
        };
        tokio::select! {
            r = fut => r,
            () = deadline => Err(errors::backend_timeout(timeout, false)),
        }
    }

    /// How long a client may take over a body the proxy waits for.
    pub fn client_idle(&self) -> Duration {
        self.client_idle
    }

    /// The budget of whole-read request bodies.
    pub fn body_budget(&self) -> &crate::early::BodyBudget {
        &self.body_budget
    }

    /// Whether the backend has a lean forwarder (`crate::lean`), which
    /// sends a PutObject as it came.
    pub fn has_lean_forwarder(&self) -> bool {
        self.backend.lean().is_some()
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

    /// The proxy's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Counts a write's outcome under its lock; a lock that is neither
    /// configured nor has a fence counts as [`UNKNOWN_LOCK`], so refused
    /// requests naming made-up buckets add no metric series.
    pub fn count(&self, op: Op, scope: &Scope, outcome: Outcome) {
        let known = self.fences.known(scope.fence())
            || self
                .scopes
                .configured()
                .iter()
                .any(|s| s.lock == scope.lock);
        let lock = if known { scope.fence() } else { UNKNOWN_LOCK };
        self.metrics.write(op, lock, outcome);
    }

    /// The keys tokens and lease-bound credentials are verified with.
    pub fn token_keys(&self) -> Option<&TokenKeys> {
        self.tokens.keys()
    }

    /// The backend's read operations, the only part of it ops may call
    /// directly.
    pub fn reads(&self) -> &crate::backend::Reads {
        self.backend.reads()
    }

    /// The header families writes may carry.
    pub fn write_headers(&self) -> &crate::write_headers::WriteHeaders {
        &self.write_headers
    }
}
