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
//! After these, the operation forwards a conditional request built from the
//! known state, and on the store's condition failure calls
//! [`Gate::redecide`], which re-reads the key and answers stale or retry.
//! A write the store does not answer in time is answered 503 but keeps its
//! admission and key until it can no longer commit ([`linger`]).

mod write;
pub use write::CopySpec;

use crate::backend::Backend;
use crate::body::{BodyWatch, Cancellable};
use crate::config::ProxyConfig;
use crate::db::Db;
use crate::dialect::Dialect;
use crate::errors;
use crate::events::{FenceEvents, Kind, Refusal};
use crate::fences::{Admission, FenceError, Fences};
use crate::issuer::{Answer, Issuer};
use crate::keys::{KeyGuard, Keys, Known};
use crate::metrics::{LockLabels, Metrics, ProbeLabels};
use crate::probe::{ProbeError, ProbeReport, probe};
use crate::scope::{Scope, ScopeMap};
use crate::tokens::upload::UploadBinding;
use crate::tokens::{Presented, Rejection, TokenPolicy, VerifiedToken};
use fencegate_core::TokenKeys;
use http::HeaderMap;
use s3s::dto::StreamingBlob;
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
    probes: Mutex<HashMap<String, ProbeReport>>,
    probing: tokio::sync::Mutex<()>,
    /// Bytes of whole-read request bodies held at once (see `early`).
    body_budget: crate::early::BodyBudget,
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

/// A write's backend call, which can outlive the request.
type Pending<T> = Call<'static, T>;

/// What a write's backend call came to within the answer timeout.
enum Sent<T> {
    Answered(S3Result<T>),
    /// No answer in time: the request is still out, and the store may
    /// still commit it.
    Unanswered(Pending<T>),
}

/// Keeps a write that timed out from letting go of its admission and key
/// while the store may still commit it; runs on its own task, after the
/// client got its 503.
///
/// It lets go when the store answers, or else once the request's backend
/// connection is closed (dropping the call closes it) and `decision` has
/// passed: a store that has not committed a request by then, with its
/// client gone, is assumed never to. The connection is closed as soon as a
/// raise wants in (the epoch is cut), or after waiting `decision` for an
/// answer, so a raise waits at most about `decision` for a write that
/// timed out, and about twice that in all.
async fn linger<T>(
    mut pending: Pending<T>,
    hold: (Admission, KeyGuard, Inflight),
    decision: Duration,
    metrics: Arc<Metrics>,
) {
    // Counted by the caller before this task was spawned, and not on
    // drop: a linger cut short (the runtime stopping) leaves the count up,
    // and the stop unclean.
    let cut = hold.0.cancel.clone();
    let answered = tokio::select! {
        _ = &mut pending => true,
        () = cut.cancelled() => false,
        () = tokio::time::sleep(decision) => false,
    };
    if !answered {
        drop(pending);
        tokio::time::sleep(decision).await;
    }
    drop(hold);
    metrics.lingering_writes.dec();
}

impl Gate {
    pub fn new(
        config: &ProxyConfig,
        db: Db,
        cluster: Option<crate::cluster::Cluster>,
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
            if s.id != s.fence() && old > fences.max(s.fence()) {
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

    /// Awaits an object write's backend call with the same answer timeout
    /// as [`Gate::call`], counted from the body's last byte (a body cut for
    /// a silent client answers 400 RequestTimeout). A call not answered in
    /// time is handed back [`Sent::Unanswered`], still running: the store
    /// may yet commit it, so [`Gate::finish`] keeps its admission and key
    /// until it can no longer commit (see [`linger`]).
    async fn call_write<T>(&self, mut fut: Pending<T>, watch: Option<BodyWatch>) -> Sent<T> {
        if let Some(c) = self.fences.cluster()
            && !c.admits()
        {
            // Checked again just before the request goes out (a held body
            // is sent in one piece, after its chunks were checked).
            return Sent::Answered(Err(errors::storage(format!(
                "{}; nothing was sent to the store",
                c.why_not()
            ))));
        }
        let timeout = self.backend_timeout;
        let sent = watch.as_ref().map(|w| w.sent.clone());
        let deadline = async {
            if let Some(sent) = sent {
                sent.notified().await;
            }
            tokio::time::sleep(timeout).await;
        };
        tokio::select! {
            r = &mut fut => Sent::Answered(
                r.map_err(|e| crate::body::unless_stalled(watch.as_ref(), e)),
            ),
            () = deadline => Sent::Unanswered(fut),
        }
    }

    /// Wraps a write's request body so that a newer epoch (`cancel`) or a
    /// silent client cuts it; `None` for a request without a body.
    fn watch_body(
        &self,
        body: &mut Option<StreamingBlob>,
        cancel: &CancellationToken,
    ) -> Option<BodyWatch> {
        let watch = BodyWatch::new(self.client_idle);
        *body = Some(Cancellable::wrap(
            body.take()?,
            cancel.clone(),
            self.fences.standing_check(),
            &watch,
        ));
        Some(watch)
    }

    /// [`Gate::call`] for a call whose body [`Gate::watch_body`] wrapped:
    /// the answer timeout counts from the body's last byte, and a body cut
    /// for a silent client answers 400 RequestTimeout.
    async fn call_watched<T>(&self, fut: Call<'_, T>, watch: Option<BodyWatch>) -> S3Result<T> {
        let sent = watch.as_ref().map(|w| w.sent.clone());
        self.call(fut, sent)
            .await
            .map_err(|e| crate::body::unless_stalled(watch.as_ref(), e))
    }

    /// How long a client may take over a body the proxy waits for.
    pub fn client_idle(&self) -> Duration {
        self.client_idle
    }

    /// The budget of whole-read request bodies.
    pub fn body_budget(&self) -> &crate::early::BodyBudget {
        &self.body_budget
    }

    /// Whether a PutObject with these headers would be sent by the lean
    /// forwarder (as it came), not through the SDK.
    pub fn lean_forwards(&self, headers: &http::HeaderMap) -> bool {
        self.backend.lean.is_some() && crate::lean::eligible_headers(headers)
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
    pub fn count(&self, op: &'static str, scope: &Scope, outcome: &'static str) {
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
        &self.backend.reads
    }

    /// HEAD of a copy source (a read), with the answer timeout.
    pub async fn head_source(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<aws_sdk_s3::operation::head_object::HeadObjectOutput> {
        let head = self
            .backend
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .set_version_id(version.map(str::to_owned));
        self.call(
            Box::pin(async { head.send().await.map_err(crate::backend::sdk_error) }),
            None,
        )
        .await
    }

    /// Whether `bucket` exists (false only when the backend says 404).
    pub async fn bucket_exists(&self, bucket: &str) -> bool {
        let head = self.backend.client.head_bucket().bucket(bucket);
        let answer = self
            .call(
                Box::pin(async {
                    Ok(head.send().await.map_err(|e| crate::backend::status_of(&e)))
                }),
                None,
            )
            .await;
        !matches!(answer, Ok(Err(Some(404))))
    }

    /// Creates a bucket: only the bucket and its location go to the store
    /// (see `ops::create_bucket` for what is refused before).
    pub async fn create_bucket(
        &self,
        req: s3s::S3Request<s3s::dto::CreateBucketInput>,
    ) -> S3Result<s3s::S3Response<s3s::dto::CreateBucketOutput>> {
        use s3s::S3 as _;
        let location = req
            .input
            .create_bucket_configuration
            .as_ref()
            .and_then(|c| c.location_constraint.clone());
        let plain = s3s::dto::CreateBucketInput {
            bucket: req.input.bucket.clone(),
            create_bucket_configuration: location.map(|l| s3s::dto::CreateBucketConfiguration {
                location_constraint: Some(l),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = req.map_input(|_| plain);
        self.call(Box::pin(self.backend.forward.create_bucket(req)), None)
            .await
            .map_err(errors::from_backend)
    }

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

    /// With replicas: joins the cluster (waiting up to `patience` for
    /// etcd), then raises the cluster's maxes to at least what this
    /// proxy's SQLite database kept from running alone, so that turning
    /// replicas on never lets a token go back.
    pub async fn join_cluster(&self, patience: Duration) -> anyhow::Result<()> {
        let Some(c) = self.fences.cluster() else {
            return Ok(());
        };
        c.start(patience, self.metrics.clone()).await?;
        for (lock, max) in self.db.load_fences()? {
            if lock.contains('/') || max <= self.fences.max(&lock) {
                continue;
            }
            match self.fences.admit(&lock, max).await {
                Ok(_) | Err(FenceError::Stale { .. }) => {}
                Err(e) => {
                    anyhow::bail!("cannot carry lock {lock}'s max {max} into the cluster: {e}")
                }
            }
            tracing::info!(
                lock,
                max,
                "carried a max from the SQLite database into the cluster"
            );
        }
        Ok(())
    }

    /// What `/_fencegate/status` shows.
    pub async fn status(&self) -> serde_json::Value {
        self.status_as(false).await
    }

    /// What the status page shows (behind its sign-in): `status`, and the
    /// lease owner holding each lock's max and the keys being written,
    /// which the open `/_fencegate/status` leaves out.
    pub async fn status_for_viewers(&self) -> serde_json::Value {
        self.status_as(true).await
    }

    async fn status_as(&self, viewer: bool) -> serde_json::Value {
        let cluster = match self.fences.cluster() {
            Some(c) => c.status().await,
            None => serde_json::Value::Null,
        };
        let mut status = serde_json::json!({
            "cluster": cluster,
            "locks": self.fences.snapshot().into_iter().filter(|(id, _)| !id.contains('/')).map(|(lock, max)| {
                let mut l = serde_json::json!({"lock": lock, "max_token": max});
                if viewer {
                    l["holder"] = self.events.owner_of(&lock, max).into();
                }
                l
            }).collect::<Vec<_>>(),
            "inflight_writes": self.metrics.inflight_writes.get(),
            "lingering_writes": self.metrics.lingering_writes.get(),
            "configured_scopes": self.scopes.configured().iter().map(|s| serde_json::json!({"scope": s.id, "lock": s.lock.as_str()})).collect::<Vec<_>>(),
            "probe": self.probe_reports().into_iter().map(|r| serde_json::json!({
                "report": r,
                "safe": r.safe(),
                "summary": r.summary(),
                "checks": r.checks().iter().map(crate::probe::CheckLine::to_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "accept_weak_backend": self.accept_weak_backend,
            "etag_cache_entries": self.keys.cached(),
        });
        if viewer {
            let (keys, total) = self.keys.busy(BUSY_KEYS_SHOWN);
            status["busy_keys"] = serde_json::json!({
                "total": total,
                "shown": keys.into_iter().map(|(b, k)| format!("s3://{b}/{k}")).collect::<Vec<_>>(),
            });
        }
        status
    }

    /// Probe reports so far, by bucket.
    pub fn probe_reports(&self) -> Vec<ProbeReport> {
        let mut v: Vec<_> = self
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        v
    }

    /// How `bucket`'s store reads conditions (AWS's way until probed).
    fn dialect_of(&self, bucket: &str) -> Dialect {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(bucket)
            .map_or(Dialect::AWS, ProbeReport::dialect)
    }

    /// The client that writes to `bucket` in its store's dialect.
    pub(crate) fn writes_to(&self, bucket: &str) -> aws_sdk_s3::Client {
        self.backend.writes(self.dialect_of(bucket))
    }

    /// Probes `bucket` now (or returns the earlier report).
    pub async fn probe_bucket(&self, bucket: &str) -> Result<ProbeReport, ProbeError> {
        if let Some(r) = self
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(bucket)
        {
            return Ok(r.clone());
        }
        // Boxed: the probe's SDK calls would otherwise sit inline in every
        // write's future (see `Call`).
        Box::pin(self.probe_now(bucket)).await
    }

    /// Probes `bucket`, one probe at a time, unless another probe reported
    /// on it meanwhile.
    async fn probe_now(&self, bucket: &str) -> Result<ProbeReport, ProbeError> {
        let _one_at_a_time = self.probing.lock().await;
        if let Some(r) = self
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(bucket)
        {
            return Ok(r.clone());
        }
        let report = probe(&self.backend.client, bucket, self.backend_timeout).await?;
        if report.safe() {
            tracing::info!(probe = %report.summary(), "backend probe");
        } else {
            tracing::warn!(probe = %report.summary(), "backend probe: conditional PUT is not enforced");
        }
        for line in report.checks() {
            self.metrics
                .probe_enforced
                .get_or_create(&ProbeLabels {
                    bucket: bucket.to_owned(),
                    check: line.name,
                })
                .set(i64::from(line.check.enforced()));
        }
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(bucket.to_owned(), report.clone());
        Ok(report)
    }

    /// Refuses writes to a bucket whose backend does not enforce
    /// conditional PUTs (unless the operator accepted that).
    async fn require_safe(&self, bucket: &str) -> S3Result<()> {
        match self.probe_bucket(bucket).await {
            Ok(r) if r.safe() || self.accept_weak_backend => Ok(()),
            Ok(r) => Err(errors::unsafe_backend(
                bucket,
                &format!(
                    "the backend ignores conditional writes ({}); set accept_weak_backend = true to run with the proxy as the only fence",
                    r.summary()
                ),
            )),
            Err(ProbeError::NoSuchBucket(_)) => Err(s3s::s3_error!(
                NoSuchBucket,
                "bucket {bucket} does not exist: create it first (on the backend, or with CreateBucket through the proxy)"
            )),
            Err(ProbeError::Store(e)) => Err(errors::retry(format!(
                "cannot check that bucket {bucket} enforces conditional writes: {e}"
            ))),
        }
    }

    /// Why the proxy cannot admit a new token now, if it cannot (its
    /// database; with replicas, its standing): readiness.
    pub fn not_ready(&self) -> Option<String> {
        if let Some(c) = self.fences.cluster()
            && !c.admits()
        {
            return Some(c.why_not());
        }
        self.db.problem()
    }

    /// The header families writes may carry.
    pub fn write_headers(&self) -> &crate::write_headers::WriteHeaders {
        &self.write_headers
    }

    /// The configured scopes in `bucket` (none in bucket-per-scope mode).
    pub fn scopes_in_bucket(&self, bucket: &str) -> Vec<Scope> {
        self.scopes
            .configured()
            .iter()
            .filter(|s| s.bucket == bucket)
            .cloned()
            .collect()
    }

    /// A scope in `bucket` fenced by `lock`, if there is one.
    pub fn scope_in_bucket(&self, bucket: &str, lock: &fencegate_core::LockName) -> Option<Scope> {
        self.scopes.in_bucket(bucket, lock)
    }

    /// The scope fencing `bucket/key`.
    pub fn scope(&self, op: &'static str, bucket: &str, key: &str) -> S3Result<Scope> {
        crate::events::note_target(bucket, key);
        self.scopes.resolve(bucket, key).map_err(|u| {
            self.metrics.write(op, UNKNOWN_LOCK, "unscoped");
            let e = errors::unscoped(&u.bucket, &u.key, &u.configured);
            self.record(Kind::Unscoped, op, None, None, None, &e);
            e
        })
    }

    /// The token a request carries for `scope`, or why it is refused. A
    /// plain token the proxy cannot vouch for is refused, unless the lease
    /// service (`locksvc_url`) confirms it issued it; below the scope's max
    /// it needs no confirmation, since admission answers it stale anyway.
    pub async fn token(
        &self,
        op: &'static str,
        req: RequestToken<'_>,
        scope: &Scope,
    ) -> S3Result<Option<VerifiedToken>> {
        let refuse = |r: Rejection| self.forged(op, scope, presented_number(&req), &r);
        let presented = self
            .tokens
            .from_request(req.headers, req.access_key, &scope.lock)
            .map_err(refuse)?;
        let unvouched = match presented {
            None => return Ok(None),
            Some(Presented::Vouched(token)) => {
                crate::events::note_verified();
                return Ok(Some(token));
            }
            Some(Presented::Unvouched(u)) => u,
        };
        let Some(issuer) = &self.issuer else {
            return Err(refuse(Rejection::Unsigned));
        };
        if let Some(below) = unvouched.below(self.fences.max(scope.fence())) {
            return Ok(Some(below));
        }
        let token = unvouched.number();
        // Boxed: an HTTP call, rare, and large (see `Call`).
        match Box::pin(issuer.check(scope.lock.as_str(), token)).await {
            Ok(Answer::Issued(proof)) => {
                let Some(verified) = unvouched.issued(proof) else {
                    return Err(errors::retry(format!(
                        "the lease service confirmed another token than {token}; retry"
                    )));
                };
                crate::events::note_verified();
                Ok(Some(verified))
            }
            // The lock's current token stays out of the answer: a client
            // that cannot present it should not learn it here.
            Ok(Answer::NotIssued) => Err(refuse(Rejection::NotIssued {
                token,
                lock: scope.lock.to_string(),
            })),
            Err(e) => Err(errors::retry(format!(
                "cannot check plain token {token} with the lease service ({e}); retry, or send the signed fencing_token"
            ))),
        }
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
        self.count(op, scope, "stale");
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
    fn record(
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
        self.count(op, scope, "invalid_token");
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
    fn learn_owner(&self, lock: &str, token: u64) {
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
        let scope = self
            .scopes
            .for_lock(&lock)
            .ok_or_else(|| errors::unknown_lock(lock.as_str()))?;
        let token = self
            .required_token(
                OP,
                RequestToken {
                    headers,
                    access_key: None,
                },
                &scope,
            )
            .await?;
        // A bucket-per-scope lock whose bucket the store does not have is
        // not fenced here.
        let admission = self
            .admit(OP, &scope.bucket.clone(), &scope, token)
            .await
            .map_err(|e| {
                if e.code() == &s3s::S3ErrorCode::NoSuchBucket {
                    errors::unknown_lock(lock.as_str())
                } else {
                    e
                }
            })?;
        drop(admission);
        self.count(OP, &scope, "accepted");
        Ok((
            scope.lock.to_string(),
            token.number(),
            self.fences.max(scope.fence()),
        ))
    }

    /// Like [`Gate::token`], but a missing token is an error (428).
    pub async fn required_token(
        &self,
        op: &'static str,
        req: RequestToken<'_>,
        scope: &Scope,
    ) -> S3Result<VerifiedToken> {
        match self.token(op, req, scope).await? {
            Some(t) => Ok(t),
            None => {
                self.count(op, scope, "missing");
                Err(errors::missing(op, &scope.id, scope.lock.as_str()))
            }
        }
    }

    /// Admits `token` into `scope`'s epoch (see [`Fences::admit`]).
    pub async fn admit(
        &self,
        op: &'static str,
        bucket: &str,
        scope: &Scope,
        token: VerifiedToken,
    ) -> S3Result<Admission> {
        let token = token.number();
        self.require_safe(bucket).await?;
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
                Err(self.stale(op, scope, token, max, &format!(" for lock {}", scope.lock)))
            }
            Err(FenceError::Storage(e)) => {
                self.count(op, scope, "unavailable");
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
                self.count(op, scope, "unavailable");
                Err(errors::storage(format!("{e}; nothing was written")))
            }
        }
    }

    /// Every step up to forwarding a write to `bucket/key` with `token`.
    pub async fn begin(
        &self,
        write: WriteOp,
        bucket: &str,
        key: &str,
        scope: Scope,
        token: VerifiedToken,
    ) -> S3Result<Write> {
        self.begin_with(write, bucket, key, scope, token, false)
            .await
    }

    /// [`Gate::begin`] for a PutObject whose body the `Write` can send
    /// twice (`resendable`): a key the proxy knows nothing of is then
    /// presumed absent instead of read, where the store enforces
    /// `If-None-Match: *`, so a new key costs one backend round trip; if
    /// the key exists after all, the store refuses and [`Write::put`] reads
    /// it and sends again.
    pub async fn begin_put(
        &self,
        bucket: &str,
        key: &str,
        scope: Scope,
        token: VerifiedToken,
        resendable: bool,
    ) -> S3Result<Write> {
        let presume = resendable && self.backend.lean.is_some();
        self.begin_with(WriteOp::Put, bucket, key, scope, token, presume)
            .await
    }

    async fn begin_with(
        &self,
        write: WriteOp,
        bucket: &str,
        key: &str,
        scope: Scope,
        verified: VerifiedToken,
        presume_absent: bool,
    ) -> S3Result<Write> {
        let op = write.name();
        let token = verified.number();
        // A many-key request (DeleteObjects) resolves every scope first,
        // then begins each key: its refusals must name the key begun.
        crate::events::note_target(bucket, key);
        let admission = self.admit(op, bucket, &scope, verified).await?;
        let cut = admission.cancel.clone();
        let guard = tokio::select! {
            g = self.keys.lock(bucket, key) => g,
            () = cut.cancelled() => return Err(self.cut(op, &scope, token, admission).await),
        };
        let trusted = |k: &Known| {
            let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
            write.trusts_cached(k, probes.get(bucket))
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
            self.count(op, scope, "unavailable");
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
            self.count(op, scope, "unavailable");
            return errors::storage(format!(
                "{}; this request was cut in flight and nothing of it was committed",
                c.why_not()
            ));
        }
        self.count(op, scope, "stale");
        let by = self
            .fences
            .cut_by(scope.fence())
            .max(token.saturating_add(1));
        let e = errors::stale(
            token,
            by,
            &format!(" for lock {} while this request was in flight", scope.lock),
        );
        self.record(Kind::Cut, op, Some(scope), Some(token), Some(by), &e);
        e
    }

    /// Ends a write: records the outcome and what the store now holds.
    ///
    /// A write the store did not answer in time is not over: it may still
    /// commit. It keeps its admission (so no raise is admitted over it) and
    /// its key (so no write of this proxy decides on a state it may still
    /// change) in [`linger`], and the client gets a retryable 503.
    async fn finish<T: 'static>(
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
                self.count(w.op.name(), &w.scope, "timeout");
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
                self.count(w.op.name(), &w.scope, "accepted");
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
                    self.count(w.op.name(), &w.scope, "conflict");
                    let (bucket, key) = (w.key.bucket().to_owned(), w.key.key().to_owned());
                    return Err(self
                        .redecide(w.op.name(), &bucket, &key, &w.scope, w.token)
                        .await);
                }
                self.count(w.op.name(), &w.scope, "backend_error");
                Err(errors::from_backend(e))
            }
        }
    }

    /// Re-reads a key after the store refused a condition and decides
    /// again: stale if a higher token is stored now, retry otherwise.
    async fn redecide(
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

    /// Records the token a new upload was created with, durably (in etcd
    /// with replicas, so that any replica can continue it).
    pub async fn bind_upload(&self, b: UploadBinding) -> S3Result<()> {
        if let Some(c) = self.fences.cluster() {
            return c.bind_upload(&b).await.map_err(|e| {
                errors::storage(format!(
                    "cannot record the upload's token in the cluster: {e}"
                ))
            });
        }
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.bind_upload(&b))
            .await
            .map_err(|e| errors::storage(e.to_string()))?
            .map_err(|e| errors::storage(format!("cannot record the upload's token: {e}")))
    }

    /// The token an upload was created with.
    pub async fn upload(&self, upload_id: &str) -> S3Result<UploadBinding> {
        let found = if let Some(c) = self.fences.cluster() {
            c.upload(upload_id).await.map_err(|e| {
                errors::storage(format!(
                    "cannot read the upload's token from the cluster: {e}"
                ))
            })?
        } else {
            let db = self.db.clone();
            let id = upload_id.to_owned();
            tokio::task::spawn_blocking(move || db.upload(&id))
                .await
                .map_err(|e| errors::storage(e.to_string()))?
                .map_err(|e| errors::storage(format!("cannot read the upload's token: {e}")))?
        };
        found.ok_or_else(|| errors::unknown_upload(upload_id))
    }

    pub async fn forget_upload(&self, upload_id: &str) {
        if let Some(c) = self.fences.cluster() {
            if let Err(e) = c.forget_upload(upload_id).await {
                tracing::warn!(upload_id, error = %e, "could not forget a finished upload's binding");
            }
            return;
        }
        let db = self.db.clone();
        let id = upload_id.to_owned();
        let r = tokio::task::spawn_blocking(move || db.forget_upload(&id)).await;
        if !matches!(r, Ok(Ok(()))) {
            tracing::warn!(upload_id, "could not forget a finished upload's binding");
        }
    }
}

/// The token number a request presents, if it can be read (for fence
/// events of refused tokens): its header's, or its lease-bound access key's.
fn presented_number(req: &RequestToken<'_>) -> Option<u64> {
    req.headers
        .get(crate::tokens::FENCING_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| fencegate_core::FencingToken::parse(v).ok())
        .map(|t| t.number())
        .or_else(|| {
            req.access_key
                .and_then(|k| fencegate_core::credentials::parse_access_key(k).ok())
                .map(|k| k.token)
        })
}
