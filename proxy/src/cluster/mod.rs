//! Proxy replicas sharing one fence through etcd (`[cluster]`).
//!
//! The rules are `fencegate_core::replicas` (standing, raise wait, lock
//! delay), checked by its simulation; this module is their I/O. Keys under
//! the prefix `P`:
//!
//! - `P/members/<id>`: one per incarnation (`<replica>.<start>`), written
//!   before it admits anything, never on a lease; removed only by a raiser
//!   that waited out its lock delay;
//! - `P/proxies/<id>`: its registration, on its etcd lease (TTL
//!   `registration_ttl`), kept alive every third of it;
//! - `P/fences/<lock>`: the lock's max token, 20 digits (compared as bytes);
//! - `P/acks/<lock>/<id>`: the max of the lock this incarnation applied
//!   (cut and drained below it), on its lease;
//! - `P/uploads/<upload id>`: multipart upload bindings, so that an upload
//!   created through one replica continues through another.
//!
//! Steady state costs no etcd round trip: an admission reads the replica's
//! own fence and its standing (an atomic). A raise is one transaction (the
//! max and the raiser's ack), then reads of the members until each has
//! acked or is out. Other replicas learn the raise from a watch, cut and
//! drain, and ack. A replica that cannot renew its registration stops
//! admitting (503) when its standing runs out, cuts every body in flight,
//! and joins again as a new incarnation.

pub mod config;

pub use config::ClusterConfig;

use crate::db::UploadBinding;
use crate::fences::Fences;
use dashmap::DashMap;
use fencegate_core::replicas::{Holdup, MemberView, Ms, RaiseWait, Standing, Timing};
use fencegate_etcd::etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions,
};
use fencegate_etcd::{CallError, Etcd};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a raise waits between two reads of the members: from the first
/// to the last, doubling (acks come within milliseconds when every replica
/// is up; a raise that waits for an eviction or a lock delay reads less).
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_LAST: Duration = Duration::from_millis(20);
/// How often the standing is checked against the clock (the body check
/// per chunk does not depend on it).
const STANDING_CHECK: Duration = Duration::from_millis(50);
/// Most upload bindings a replica keeps copies of; then it starts over
/// (etcd has them all).
const UPLOAD_COPIES: usize = 100_000;
/// How long the cluster view in the status is reused: a status request
/// costs etcd at most one read per this.
const STATUS_REUSE: Duration = Duration::from_secs(1);

/// Why the cluster could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0}")]
    Unavailable(String),
}

impl From<CallError> for ClusterError {
    fn from(e: CallError) -> ClusterError {
        ClusterError::Unavailable(e.to_string())
    }
}

/// What a raise found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// Every member acked or is out: the token may be admitted.
    Complete,
    /// The lock's max in etcd is higher.
    Higher(u64),
}

/// What a member record says.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MemberRecord {
    replica: String,
    lease: i64,
    started_unix_ms: u64,
}

/// One incarnation of this replica.
#[derive(Debug, Clone)]
struct Incarnation {
    id: String,
    lease: i64,
    number: u64,
}

/// A raise waiting for the others, as the status shows it.
#[derive(Debug, Clone, Serialize)]
struct RaiseStatus {
    token: u64,
    waited_ms: u64,
    holdups: BTreeMap<String, String>,
}

/// This replica's handle on the cluster. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    etcd: Etcd,
    prefix: String,
    replica: String,
    timing: Timing,
    /// `clock::boot_ms` at start: the protocol's times count from it.
    origin: u64,
    standing: Mutex<Standing>,
    /// `Standing::valid_until` + 1 (0: none), read on every admission.
    admits_until: AtomicU64,
    incarnation: Mutex<Option<Incarnation>>,
    /// The lease of the last incarnation, revoked at the next join: a
    /// registration it left behind would make raises wait `ack_timeout`
    /// for an ack that cannot come.
    last_lease: AtomicU64,
    incarnations: AtomicU64,
    /// Why the replica does not admit, for its 503s.
    why_not: Mutex<String>,
    rejoining: AtomicBool,
    raises: Mutex<BTreeMap<String, RaiseStatus>>,
    evictions: AtomicU64,
    /// Raises this replica took to etcd (steady-state writes take none).
    raises_in_etcd: AtomicU64,
    uploads: DashMap<String, UploadBinding>,
    metrics: std::sync::OnceLock<Arc<crate::metrics::Metrics>>,
    /// The members part of the last status, and when it was read.
    status_members: tokio::sync::Mutex<Option<(Instant, serde_json::Value)>>,
}

fn pad(token: u64) -> String {
    format!("{token:020}")
}

fn parse_token(v: &[u8]) -> u64 {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn gets(r: &TxnOpResponse) -> &[fencegate_etcd::etcd_client::KeyValue] {
    match r {
        TxnOpResponse::Get(g) => g.kvs(),
        _ => &[],
    }
}

impl Cluster {
    /// A handle on the cluster of `config`, not joined yet.
    pub fn new(config: &ClusterConfig, store_decision: Duration) -> anyhow::Result<Cluster> {
        Ok(Cluster {
            inner: Arc::new(Inner {
                etcd: Etcd::new(&config.connection())?,
                prefix: config.prefix.clone(),
                replica: config.replica_id.clone(),
                timing: config.timing(store_decision).checked()?,
                origin: crate::clock::boot_ms(),
                standing: Mutex::new(Standing::default()),
                admits_until: AtomicU64::new(0),
                incarnation: Mutex::new(None),
                last_lease: AtomicU64::new(0),
                incarnations: AtomicU64::new(0),
                why_not: Mutex::new("the replica has not joined the cluster yet".into()),
                rejoining: AtomicBool::new(false),
                raises: Mutex::new(BTreeMap::new()),
                evictions: AtomicU64::new(0),
                raises_in_etcd: AtomicU64::new(0),
                uploads: DashMap::new(),
                metrics: std::sync::OnceLock::new(),
                status_members: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// The protocol's clock (suspend included, see `clock::boot_ms`).
    fn now(&self) -> Ms {
        crate::clock::boot_ms().saturating_sub(self.inner.origin)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.inner.prefix)
    }

    /// One transaction, failed over like every call.
    async fn txn(&self, txn: &Txn) -> Result<TxnResponse, CallError> {
        let (resp, _) = self
            .inner
            .etcd
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(resp)
    }

    /// Whether this replica may admit a write now: its registration was
    /// renewed recently enough. One atomic load and a clock read.
    pub fn admits(&self) -> bool {
        let until = self.inner.admits_until.load(Ordering::Acquire);
        until != 0 && self.now() < until - 1
    }

    /// Why it does not (for the 503).
    pub fn why_not(&self) -> String {
        self.inner
            .why_not
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_standing(&self, f: impl FnOnce(&mut Standing)) {
        let mut s = self
            .inner
            .standing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f(&mut s);
        self.inner.admits_until.store(
            s.valid_until().map_or(0, |u| u.saturating_add(1)),
            Ordering::Release,
        );
        if let Some(m) = self.inner.metrics.get() {
            m.cluster_admitting
                .set(i64::from(s.valid_until().is_some()));
        }
    }

    fn keep_copy(&self, b: &UploadBinding) {
        if self.inner.uploads.len() >= UPLOAD_COPIES {
            self.inner.uploads.clear();
        }
        self.inner.uploads.insert(b.upload_id.clone(), b.clone());
    }

    fn me(&self) -> Option<Incarnation> {
        self.inner
            .incarnation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Joins (retrying while etcd cannot be reached, for `patience`),
    /// loads every lock's max into `fences`, and starts the renewal, the
    /// standing check and the watch. Writes are admitted from its return.
    pub async fn start(
        &self,
        fences: &Fences,
        patience: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<()> {
        let _ = self.inner.metrics.set(metrics);
        let deadline = Instant::now() + patience;
        loop {
            match self.join(fences).await {
                Ok(()) => break,
                Err(JoinError::Refused(e)) => anyhow::bail!(
                    "etcd refused this replica: {e} (check cluster.username / {} and the user's permissions on the prefix)",
                    config::ENV_CLUSTER_PASSWORD
                ),
                Err(JoinError::Unavailable(e)) if Instant::now() >= deadline => {
                    anyhow::bail!("the cluster's etcd did not answer: {e}")
                }
                Err(JoinError::Unavailable(e)) => {
                    tracing::warn!(error = %e, "etcd not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        let me = self.clone();
        tokio::spawn(async move { me.keep_registered().await });
        let me = self.clone();
        let f = fences.clone();
        tokio::spawn(async move { me.check_standing(f).await });
        Ok(())
    }

    /// One join: a new incarnation's lease, member record and registration,
    /// then every lock's max, then the watch from there.
    async fn join(&self, fences: &Fences) -> Result<(), JoinError> {
        let old = self.inner.last_lease.load(Ordering::Acquire) as i64;
        if old != 0 {
            let _ = self
                .inner
                .etcd
                .call(|mut c| async move { c.lease_revoke(old).await })
                .await;
        }
        let ttl = i64::try_from(self.inner.timing.ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = self.now();
        let (lease, _) = self
            .inner
            .etcd
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        let lease = lease.id();
        self.inner.last_lease.store(lease as u64, Ordering::Release);
        let number = self.inner.incarnations.fetch_add(1, Ordering::AcqRel) + 1;
        // Random too: two processes misconfigured with one replica_id must
        // still be two members (one's ack must never count for the other).
        let mut salt = [0u8; 4];
        getrandom::getrandom(&mut salt).map_err(|e| {
            JoinError::Unavailable(format!("no randomness for an incarnation id: {e}"))
        })?;
        let id = format!(
            "{}.{:x}{number:02x}{}",
            self.inner.replica,
            crate::clock::unix_ms(),
            hex::encode(salt)
        );
        let record = serde_json::to_string(&MemberRecord {
            replica: self.inner.replica.clone(),
            lease,
            started_unix_ms: crate::clock::unix_ms(),
        })
        .unwrap_or_default();
        let txn = Txn::new().and_then([
            TxnOp::put(self.key(&format!("members/{id}")), record.clone(), None),
            TxnOp::put(
                self.key(&format!("proxies/{id}")),
                record,
                Some(PutOptions::new().with_lease(lease)),
            ),
        ]);
        self.txn(&txn).await?;
        // The lease runs from its grant, after `sent`.
        let timing = self.inner.timing;
        self.set_standing(|s| s.renewed(sent, &timing));
        *self
            .inner
            .incarnation
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Incarnation {
            id: id.clone(),
            lease,
            number,
        });
        let rev = self.load(fences).await?;
        let me = self.clone();
        let f = fences.clone();
        tokio::spawn(async move { me.watch(f, number, rev).await });
        tracing::info!(incarnation = %id, lease, revision = rev, "joined the proxy cluster");
        Ok(())
    }

    /// Every lock's max from etcd applied to `fences`; the revision read.
    async fn load(&self, fences: &Fences) -> Result<i64, CallError> {
        let prefix = self.key("fences/");
        let (resp, _) = self
            .inner
            .etcd
            .call(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        for kv in resp.kvs() {
            let lock = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            let token = parse_token(kv.value());
            // A raise may be waiting for this replica (a reload after a
            // broken watch): ack what it applied.
            if fences.apply(&lock, token).await {
                self.ack(&lock, token).await;
            }
        }
        Ok(rev)
    }

    /// Renews the registration every third of its TTL. A renewal etcd
    /// answers with "no such lease" (expired, revoked early, evicted) ends
    /// the standing at once.
    async fn keep_registered(self) {
        let period = self.inner.timing.ttl / 3;
        loop {
            tokio::time::sleep(period.min(Duration::from_millis(if self.admits() {
                u64::MAX
            } else {
                200
            })))
            .await;
            let Some(me) = self.me() else { continue };
            if self.inner.rejoining.load(Ordering::Acquire) {
                continue;
            }
            let sent = self.now();
            let lease = me.lease;
            match self
                .inner
                .etcd
                .call(|mut c| async move { c.lease_keep_alive(lease).await })
                .await
            {
                Ok(_) => {
                    let timing = self.inner.timing;
                    self.set_standing(|s| s.renewed(sent, &timing));
                }
                Err(CallError::Refused(e)) => {
                    self.lose(&format!("the replica's registration is gone ({e})"));
                }
                Err(CallError::Unavailable(e)) => {
                    tracing::warn!(error = %e, "cannot renew the cluster registration");
                }
            }
        }
    }

    /// Watches the standing: when it runs out (no renewal in time) or was
    /// lost, every body in flight is cut and the replica joins again as a
    /// new incarnation.
    async fn check_standing(self, fences: Fences) {
        loop {
            tokio::time::sleep(STANDING_CHECK).await;
            if self.admits() {
                continue;
            }
            if self.me().is_some() {
                self.lose("the replica could not renew its cluster registration in time");
            }
            fences.cut_all();
            self.inner.rejoining.store(true, Ordering::Release);
            match self.join(&fences).await {
                Ok(()) => {
                    self.inner.rejoining.store(false, Ordering::Release);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rejoin the proxy cluster; still refusing writes");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Ends the standing: nothing is admitted until a new join.
    fn lose(&self, why: &str) {
        tracing::warn!(
            reason = why,
            "refusing fenced writes until the replica rejoins the cluster"
        );
        *self.inner.why_not.lock().unwrap_or_else(|p| p.into_inner()) = format!(
            "{why}; it refuses fenced writes until it has rejoined (retry, or send the request to another replica)"
        );
        self.set_standing(Standing::lost);
        *self
            .inner
            .incarnation
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Applies other replicas' raises from the watch, from `rev + 1`, for
    /// incarnation `number`. A broken stream is opened again (on another
    /// member, after reloading every max: events may have been missed).
    async fn watch(self, fences: Fences, number: u64, mut rev: i64) {
        let prefix = self.key("fences/");
        loop {
            if self.me().is_none_or(|m| m.number != number) {
                return;
            }
            let client = self.inner.etcd.client().await;
            let opened = match client {
                Ok(mut c) => {
                    let opts = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev + 1)
                        .with_progress_notify();
                    tokio::time::timeout(
                        self.inner.etcd.request_timeout(),
                        c.watch(prefix.clone(), Some(opts)),
                    )
                    .await
                    .map_err(|_| "watch not opened in time".to_owned())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                }
                Err(e) => Err(e.to_string()),
            };
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the cluster's fences; retrying");
                    self.inner.etcd.prefer_next();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // A stream that went quiet is asked for progress; one that does
            // not answer is opened again elsewhere, soon enough that this
            // replica still acks a raise within `ack_timeout` (a watch on a
            // paused member would otherwise get it evicted).
            let quiet = (self.inner.timing.ttl / 3).min(self.inner.timing.ack_timeout / 4);
            loop {
                let msg = tokio::time::timeout(quiet, stream.message()).await;
                if self.me().is_none_or(|m| m.number != number) {
                    return;
                }
                match msg {
                    Ok(Ok(Some(resp))) => {
                        if resp.compact_revision() > 0 || resp.canceled() {
                            break;
                        }
                        if let Some(h) = resp.header() {
                            rev = rev.max(h.revision());
                        }
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            rev = rev.max(kv.mod_revision());
                            if ev.event_type() != EventType::Put {
                                continue;
                            }
                            let lock =
                                String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                            let token = parse_token(kv.value());
                            let (me, f) = (self.clone(), fences.clone());
                            tokio::spawn(async move {
                                if f.apply(&lock, token).await {
                                    me.ack(&lock, token).await;
                                }
                            });
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                    Err(_) => {
                        // Quiet for a while: ask for progress; a member that
                        // went silent gets no second chance.
                        if stream.request_progress().await.is_err() {
                            break;
                        }
                        match tokio::time::timeout(quiet, stream.message()).await {
                            Ok(Ok(Some(resp))) if resp.events().is_empty() => {
                                if let Some(h) = resp.header() {
                                    rev = rev.max(h.revision());
                                }
                            }
                            Ok(Ok(Some(_))) => {
                                // Events: reload below rather than parse twice.
                                break;
                            }
                            _ => break,
                        }
                    }
                }
            }
            self.inner.etcd.prefer_next();
            match self.load(&fences).await {
                Ok(r) => rev = r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reload the cluster's fences; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Records that this replica applied `token` for `lock`.
    pub async fn ack(&self, lock: &str, token: u64) {
        let Some(me) = self.me() else { return };
        let key = self.key(&format!("acks/{lock}/{}", me.id));
        let lease = me.lease;
        let r = self
            .inner
            .etcd
            .call(|mut c| {
                let key = key.clone();
                async move {
                    c.put(key, pad(token), Some(PutOptions::new().with_lease(lease)))
                        .await
                }
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(lock, token, error = %e, "cannot acknowledge a raise; the raiser will evict this replica");
        }
    }

    /// Raises `lock` to `token` in etcd, this replica having cut and
    /// drained its own writes below it, and waits for the other members.
    pub async fn raise(&self, lock: &str, token: u64) -> Result<Raised, ClusterError> {
        let me = self
            .me()
            .ok_or_else(|| ClusterError::Unavailable(self.why_not()))?;
        self.inner.raises_in_etcd.fetch_add(1, Ordering::Relaxed);
        let fence = self.key(&format!("fences/{lock}"));
        let ack = self.key(&format!("acks/{lock}/{}", me.id));
        let put_ack = TxnOp::put(
            ack.clone(),
            pad(token),
            Some(PutOptions::new().with_lease(me.lease)),
        );
        let then = [
            TxnOp::put(fence.clone(), pad(token), None),
            put_ack.clone(),
            TxnOp::get(fence.clone(), None),
        ];
        let started = Instant::now();
        let (value, rev) = loop {
            // Higher than the max, or the first max of the lock (a value
            // compare on a missing key fails).
            let txn = Txn::new()
                .when([Compare::value(fence.clone(), CompareOp::Less, pad(token))])
                .and_then(then.clone())
                .or_else([TxnOp::get(fence.clone(), None)]);
            let created = Txn::new()
                .when([Compare::create_revision(fence.clone(), CompareOp::Equal, 0)])
                .and_then(then.clone())
                .or_else([TxnOp::get(fence.clone(), None)]);
            let mut found = None;
            for txn in [txn, created] {
                let resp = self.txn(&txn).await?;
                let wrote = resp.succeeded();
                if let Some(kv) = resp.op_responses().iter().flat_map(gets).next() {
                    found = Some((parse_token(kv.value()), kv.mod_revision(), wrote));
                    break;
                }
            }
            match found {
                Some((v, _, _)) if v > token => return Ok(Raised::Higher(v)),
                Some((v, rev, wrote)) if v == token => {
                    if !wrote {
                        // Another replica's raise to the same token: ack it
                        // (this replica drained below it) and wait for it
                        // like its raiser.
                        self.txn(&Txn::new().and_then([put_ack.clone()])).await?;
                    }
                    break (v, rev);
                }
                _ => continue, // raced with a lower raise; compare again
            }
        };
        debug_assert_eq!(value, token);
        let r = self.wait(lock, token, rev, &me).await;
        self.inner
            .raises
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lock);
        tracing::debug!(
            lock,
            token,
            ms = started.elapsed().as_millis(),
            "raise complete in the cluster"
        );
        r
    }

    /// Waits until every member that joined before `rev` acked `token` or
    /// is out (see `fencegate_core::replicas::RaiseWait`).
    async fn wait(
        &self,
        lock: &str,
        token: u64,
        rev: i64,
        me: &Incarnation,
    ) -> Result<Raised, ClusterError> {
        let t = self.inner.timing;
        let mut wait = RaiseWait::new(token, rev, &me.id, self.now(), t);
        // Past this, something is wrong beyond what the protocol waits for.
        let give_up =
            Instant::now() + t.ack_timeout + t.lock_delay + 4 * self.inner.etcd.request_timeout();
        let mut poll = POLL_FIRST;
        loop {
            let (view, leases) = self.members(lock).await?;
            let now = self.now();
            let next = wait.next(&view, now);
            for id in &next.evict {
                if let Some(&lease) = leases.get(id) {
                    self.inner.evictions.fetch_add(1, Ordering::Relaxed);
                    if let Some(m) = self.inner.metrics.get() {
                        m.cluster_evictions.inc();
                    }
                    tracing::warn!(member = %id, lock, token, "evicting a replica that did not acknowledge a raise in time");
                    let _ = self
                        .inner
                        .etcd
                        .call(|mut c| async move { c.lease_revoke(lease).await })
                        .await;
                }
            }
            for id in &next.retire {
                let key = self.key(&format!("members/{id}"));
                tracing::info!(member = %id, "retiring a replica whose lock delay has passed");
                let _ = self
                    .inner
                    .etcd
                    .call(|mut c| {
                        let key = key.clone();
                        async move { c.delete(key, None).await }
                    })
                    .await;
            }
            if next.admit {
                return Ok(Raised::Complete);
            }
            self.record_wait(lock, &wait, now);
            if Instant::now() >= give_up {
                return Err(ClusterError::Unavailable(format!(
                    "the raise of {lock} to {token} is still held up by {:?}",
                    wait.holdups().keys().collect::<Vec<_>>()
                )));
            }
            if !self.admits() {
                return Err(ClusterError::Unavailable(self.why_not()));
            }
            let due = next
                .wake_at
                .map_or(poll, |w| Duration::from_millis(w.saturating_sub(now)));
            tokio::time::sleep(due.min(poll)).await;
            poll = (poll * 2).min(POLL_LAST);
        }
    }

    fn record_wait(&self, lock: &str, wait: &RaiseWait, now: Ms) {
        let holdups = wait
            .holdups()
            .iter()
            .map(|(id, h)| {
                let why = match h {
                    Holdup::Ack { evict_at } => {
                        format!("no ack yet; evicted in {} ms", evict_at.saturating_sub(now))
                    }
                    Holdup::LockDelay { out_at, .. } => format!(
                        "registration gone; lock delay ends in {} ms",
                        out_at.saturating_sub(now)
                    ),
                };
                (id.clone(), why)
            })
            .collect();
        self.inner
            .raises
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                lock.to_owned(),
                RaiseStatus {
                    token: wait.token(),
                    waited_ms: now.saturating_sub(wait.started()),
                    holdups,
                },
            );
    }

    /// Every member, with its registration and its ack of `lock`, in one
    /// read; and each member's lease.
    async fn members(
        &self,
        lock: &str,
    ) -> Result<(Vec<MemberView>, BTreeMap<String, i64>), CallError> {
        let (members, proxies, acks) = (
            self.key("members/"),
            self.key("proxies/"),
            self.key(&format!("acks/{lock}/")),
        );
        let txn = Txn::new().and_then([
            TxnOp::get(members.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(
                proxies.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
            TxnOp::get(acks.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.txn(&txn).await?;
        let ops = resp.op_responses();
        let name = |kv: &fencegate_etcd::etcd_client::KeyValue, p: &str| {
            String::from_utf8_lossy(&kv.key()[p.len()..]).into_owned()
        };
        let registered: std::collections::BTreeSet<String> = ops
            .get(1)
            .map(gets)
            .unwrap_or_default()
            .iter()
            .map(|kv| name(kv, &proxies))
            .collect();
        let acked: BTreeMap<String, u64> = ops
            .get(2)
            .map(gets)
            .unwrap_or_default()
            .iter()
            .map(|kv| (name(kv, &acks), parse_token(kv.value())))
            .collect();
        let mut leases = BTreeMap::new();
        let view = ops
            .first()
            .map(gets)
            .unwrap_or_default()
            .iter()
            .map(|kv| {
                let id = name(kv, &members);
                if let Ok(r) = serde_json::from_slice::<MemberRecord>(kv.value()) {
                    leases.insert(id.clone(), r.lease);
                }
                MemberView {
                    registered: registered.contains(&id),
                    acked: acked.get(&id).copied().unwrap_or(0),
                    joined_rev: kv.create_revision(),
                    id,
                }
            })
            .collect();
        Ok((view, leases))
    }

    /// Every member with its registration and acks per lock, read at most
    /// once per [`STATUS_REUSE`] (a status request is not authenticated:
    /// it must not cost etcd a read each).
    async fn members_view(&self) -> serde_json::Value {
        let mut cached = self.inner.status_members.lock().await;
        if let Some((at, v)) = &*cached
            && at.elapsed() < STATUS_REUSE
        {
            return v.clone();
        }
        let me = self.me();
        let read = async {
            let (m, p, a) = (
                self.key("members/"),
                self.key("proxies/"),
                self.key("acks/"),
            );
            let txn = Txn::new().and_then([
                TxnOp::get(m.clone(), Some(GetOptions::new().with_prefix())),
                TxnOp::get(
                    p.clone(),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                ),
                TxnOp::get(
                    a.clone(),
                    Some(GetOptions::new().with_prefix().with_limit(1000)),
                ),
            ]);
            let resp = self.txn(&txn).await?;
            Ok::<_, CallError>((resp, m, p, a))
        };
        let view = match read.await {
            Ok((resp, m, p, a)) => {
                let ops = resp.op_responses();
                let registered: std::collections::BTreeSet<String> = ops
                    .get(1)
                    .map(gets)
                    .unwrap_or_default()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(&kv.key()[p.len()..]).into_owned())
                    .collect();
                let mut acks: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
                for kv in ops.get(2).map(gets).unwrap_or_default() {
                    let rest = String::from_utf8_lossy(&kv.key()[a.len()..]).into_owned();
                    if let Some((lock, id)) = rest.split_once('/') {
                        acks.entry(id.to_owned())
                            .or_default()
                            .insert(lock.to_owned(), parse_token(kv.value()));
                    }
                }
                let members: Vec<_> = ops
                    .first()
                    .map(gets)
                    .unwrap_or_default()
                    .iter()
                    .map(|kv| {
                        let id = String::from_utf8_lossy(&kv.key()[m.len()..]).into_owned();
                        let record = serde_json::from_slice::<MemberRecord>(kv.value()).ok();
                        serde_json::json!({
                            "id": id,
                            "replica": record.as_ref().map(|r| r.replica.clone()),
                            "started_unix_ms": record.as_ref().map(|r| r.started_unix_ms),
                            "registered": registered.contains(&id),
                            "joined_revision": kv.create_revision(),
                            "acks": acks.remove(&id).unwrap_or_default(),
                            "this_replica": me.as_ref().is_some_and(|m| m.id == id),
                        })
                    })
                    .collect();
                serde_json::json!({ "members": members })
            }
            Err(e) => serde_json::json!({ "members_error": e.to_string() }),
        };
        *cached = Some((Instant::now(), view.clone()));
        view
    }

    /// Records a new upload's binding in etcd (before its id is returned).
    pub async fn bind_upload(&self, b: &UploadBinding) -> Result<(), ClusterError> {
        let key = self.key(&format!("uploads/{}", b.upload_id));
        let value =
            serde_json::to_string(b).map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        self.inner
            .etcd
            .call(|mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(key, value, None).await }
            })
            .await?;
        self.keep_copy(b);
        Ok(())
    }

    /// An upload's binding: this replica's copy, or etcd's (a binding
    /// never changes, so a copy stays right).
    pub async fn upload(&self, upload_id: &str) -> Result<Option<UploadBinding>, ClusterError> {
        if let Some(b) = self.inner.uploads.get(upload_id) {
            return Ok(Some(b.clone()));
        }
        let key = self.key(&format!("uploads/{upload_id}"));
        let (resp, _) = self
            .inner
            .etcd
            .call(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let b: UploadBinding = serde_json::from_slice(kv.value())
            .map_err(|e| ClusterError::Unavailable(format!("unreadable upload binding: {e}")))?;
        self.keep_copy(&b);
        Ok(Some(b))
    }

    pub async fn forget_upload(&self, upload_id: &str) -> Result<(), ClusterError> {
        self.inner.uploads.remove(upload_id);
        let key = self.key(&format!("uploads/{upload_id}"));
        self.inner
            .etcd
            .call(|mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            })
            .await?;
        Ok(())
    }

    /// The cluster as `/_fencegate/status` shows it: this replica's
    /// standing, every member with its registration and acks, and raises
    /// waiting here.
    pub async fn status(&self) -> serde_json::Value {
        let me = self.me();
        let now = self.now();
        let until = self.inner.admits_until.load(Ordering::Acquire);
        let raises = self
            .inner
            .raises
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = serde_json::json!({
            "replica": self.inner.replica,
            "incarnation": me.as_ref().map(|m| m.id.clone()),
            "admitting": self.admits(),
            "standing_ms_left": (until > 0).then(|| (until - 1).saturating_sub(now)),
            "why_not": (!self.admits()).then(|| self.why_not()),
            "registration_ttl_ms": self.inner.timing.ttl.as_millis() as u64,
            "ack_timeout_ms": self.inner.timing.ack_timeout.as_millis() as u64,
            "lock_delay_ms": self.inner.timing.lock_delay.as_millis() as u64,
            "evictions": self.inner.evictions.load(Ordering::Relaxed),
            "raises_in_etcd": self.inner.raises_in_etcd.load(Ordering::Relaxed),
            "raises_waiting": raises,
        });
        let members = self.members_view().await;
        if let (Some(o), serde_json::Value::Object(m)) = (out.as_object_mut(), members) {
            o.extend(m);
        }
        out
    }
}

/// Why a join failed.
#[derive(Debug, thiserror::Error)]
enum JoinError {
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Refused(String),
}

impl From<CallError> for JoinError {
    fn from(e: CallError) -> JoinError {
        match e {
            CallError::Unavailable(why) => JoinError::Unavailable(why),
            CallError::Refused(e) => JoinError::Refused(e.to_string()),
        }
    }
}
