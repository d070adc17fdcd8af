//! Proxy replicas sharing one fence through etcd (`[cluster]`): the I/O
//! of the replica protocol.
//!
//! Every decision is `fencegate_core::replicas::Replica`'s, the state
//! machine the simulation runs; this module moves bytes between it, etcd and
//! the request path. Keys under the prefix `P`:
//!
//! - `P/members/<id>`: one per incarnation (`<replica>.<salt><n>`), with
//!   the settings it waits by, written before it admits anything, never on a
//!   lease; removed only by a raiser that waited out its lock delay;
//! - `P/roster/<id>`: the same record again, written and removed with it:
//!   one key deleted by hand never makes raisers forget a member;
//! - `P/proxies/<id>`: its registration, on its etcd lease (TTL
//!   `registration_ttl`), kept alive every third of it; each renewal reads
//!   back its record and registration, and a member missing either stops
//!   admitting and joins again;
//! - `P/fences/<lock>`: the lock's max token, 20 digits (compared as bytes);
//! - `P/acks/<lock>/<id>`: the max of the lock this incarnation applied
//!   (refuses below, and drained below), on its lease;
//! - `P/draining/<lock>/<id>`: "still draining writes below this token", on
//!   its lease: a raiser waits for a slow member instead of evicting it;
//! - `P/uploads/<upload id>`: multipart upload bindings, so that an upload
//!   created through one replica continues through another.
//!
//! Steady state costs no etcd round trip: an admission takes the machine's
//! lock once to admit and once to let go. One driver task runs the
//! machine's timers; each request runs on a task of its own and hands its
//! answer back, a lost one as `Answer::Unknown`. One watch covers `acks/`,
//! `draining/` and `fences/` (adjacent key ranges): maxes are inputs, acks
//! and draining reports only hints that a waiting raise may read again.

pub mod config;

pub use config::ClusterConfig;

use crate::state_error::StateError;
use crate::tokens::upload::UploadBinding;
use dashmap::DashMap;
use fencegate_core::replicas::{
    Admit, Answer, Event, MemberView, Ms, Published, RaiseRead, Replica, ReqId, Request, Timing,
    WriteId,
};
use fencegate_etcd::etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions,
};
use fencegate_etcd::{CallError, Etcd};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest the driver sleeps without looking at the machine's timers (its
/// clock counts suspend, tokio's does not).
const DRIVER_NAP: Duration = Duration::from_secs(1);
/// Shortest: the machine's clock counts milliseconds.
const DRIVER_TICK: Duration = Duration::from_millis(1);
/// Most upload bindings a replica keeps copies of; then it starts over
/// (etcd has them all).
const UPLOAD_COPIES: usize = 100_000;
/// How long the cluster view in the status is reused: a status request
/// costs etcd at most one read per this.
const STATUS_REUSE: Duration = Duration::from_secs(1);
/// Longest a status waits for etcd's view of the members.
const STATUS_READ: Duration = Duration::from_millis(500);

/// Why this replica cannot admit a write now. Nothing was written; the
/// client may retry (here or at another replica).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// This replica has no standing in the cluster (it has not joined, its
    /// standing ran out, or it is draining): the state machine's reason.
    #[error("{0}")]
    NoStanding(String),
    /// The raise of the lock's max did not complete in the cluster within
    /// the patience of a write: `held` says which phase and who held it up.
    #[error(
        "the raise of lock {lock} to token {token} did not complete in the cluster within {patience:?}: {held}"
    )]
    RaiseIncomplete {
        lock: String,
        token: u64,
        patience: Duration,
        held: String,
    },
}

/// What a write asked of the cluster came to.
#[derive(Debug)]
pub enum Admitted {
    /// In: hold the [`ClusterWrite`] until the store answered or can no
    /// longer commit; `cancel` fires when the body must be cut.
    Yes {
        write: ClusterWrite,
        cancel: CancellationToken,
        raised: bool,
    },
    /// Below the lock's max.
    Stale { max: u64 },
    /// No standing, or the raise did not complete in time.
    Unavailable(Unavailable),
}

/// One try at admitting a write.
enum Step {
    In(WriteId, CancellationToken),
    Out(Admitted),
    Wait,
}

/// An admitted write; dropping it tells the machine it is over.
#[derive(Debug)]
pub struct ClusterWrite {
    cluster: Cluster,
    id: Option<WriteId>,
}

impl Drop for ClusterWrite {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.cluster.input(false, |m, now| m.write_done(&id, now));
        }
    }
}

/// What a member record says.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MemberRecord {
    replica: String,
    lease: i64,
    started_unix_ms: u64,
    /// The settings it waits by (absent in records of older versions).
    #[serde(default)]
    settings: Option<Settings>,
}

/// [`Published`] as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Settings {
    ttl_ms: u64,
    drift: f64,
    store_decision_ms: u64,
    lock_delay_ms: u64,
}

impl From<Published> for Settings {
    fn from(p: Published) -> Settings {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Settings {
            ttl_ms: ms(p.ttl),
            drift: p.drift,
            store_decision_ms: ms(p.store_decision),
            lock_delay_ms: ms(p.lock_delay),
        }
    }
}

impl From<Settings> for Published {
    fn from(s: Settings) -> Published {
        Published {
            ttl: Duration::from_millis(s.ttl_ms),
            drift: s.drift,
            store_decision: Duration::from_millis(s.store_decision_ms),
            lock_delay: Duration::from_millis(s.lock_delay_ms),
        }
    }
}

/// A draining report: stored as its padded token, a space and its JSON,
/// so that etcd compares reports by token (`Cluster::put_rising`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DrainingRecord {
    token: u64,
    writes: u64,
    oldest_ms: u64,
}

impl DrainingRecord {
    fn stored(&self) -> String {
        format!(
            "{} {}",
            pad(self.token),
            serde_json::to_string(self).unwrap_or_default()
        )
    }

    /// A stored report, or one a replica of an earlier version stored
    /// (its JSON alone).
    fn parse(v: &[u8]) -> Option<DrainingRecord> {
        let json = match v.iter().position(|b| *b == b' ') {
            Some(i) if v[..i].iter().all(u8::is_ascii_digit) => &v[i + 1..],
            _ => v,
        };
        serde_json::from_slice(json).ok()
    }
}

/// This replica's handle on the cluster. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

/// The machine and the cut signal of each lock's writes, under one lock:
/// a write gets its lock's signal in the same step that admits it, so a cut
/// that comes after reaches it.
#[derive(Debug)]
struct Driven {
    machine: Replica,
    cuts: HashMap<String, CancellationToken>,
}

#[derive(Debug)]
struct Inner {
    etcd: Etcd,
    prefix: String,
    replica: String,
    timing: Timing,
    /// `clock::boot_ms` at start: the protocol's times count from it.
    origin: u64,
    driven: Mutex<Driven>,
    /// `Replica::admits_until` + 1 (0: none), read per body chunk.
    admits_until: AtomicU64,
    /// Wakes the driver (a request was answered, a timer may have moved).
    wake: tokio::sync::Notify,
    /// Bumped whenever the machine may have changed: writes waiting for a
    /// raise look again.
    changed: tokio::sync::watch::Sender<u64>,
    /// Why etcd refused this replica outright (bad credentials), if it did.
    refused: Mutex<Option<String>>,
    uploads: DashMap<String, UploadBinding>,
    metrics: std::sync::OnceLock<Arc<crate::metrics::Metrics>>,
    /// The members part of the last status, and when it was read.
    status_members: tokio::sync::Mutex<Option<(Instant, serde_json::Value)>>,
    /// The floor this replica was started with, put at its first load
    /// (the machine keeps the cluster's floor, read at every load).
    start_floor: u64,
    /// The newest etcd revision any answer carried.
    seen_rev: std::sync::atomic::AtomicI64,
    /// Why etcd's state is older than this replica saw it, if it is.
    went_back: Mutex<Option<String>>,
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

/// A failed call as the machine sees it: etcd saying the lease is gone is
/// an answer; anything else may or may not have been applied.
fn failed(e: &CallError) -> Answer {
    match e {
        e if e.lease_gone() => Answer::LeaseGone,
        other => Answer::Unknown(other.to_string()),
    }
}

impl Cluster {
    /// A handle on the cluster of `config`, not joined yet.
    pub fn new(
        config: &ClusterConfig,
        store_decision: Duration,
        floor: u64,
    ) -> anyhow::Result<Cluster> {
        let timing = config.timing(store_decision).checked()?;
        let mut salt = [0u8; 4];
        getrandom::getrandom(&mut salt)
            .map_err(|e| anyhow::anyhow!("no randomness for an incarnation id: {e}"))?;
        // Random and time-based: two processes misconfigured with one
        // replica_id must still be two members (one's ack must never count
        // for the other's).
        let salt = (crate::clock::unix_ms() << 32) | u64::from(u32::from_be_bytes(salt));
        Ok(Cluster {
            inner: Arc::new(Inner {
                etcd: Etcd::new(&config.connection())?,
                prefix: config.prefix.clone(),
                replica: config.replica_id.clone(),
                timing,
                origin: crate::clock::boot_ms(),
                driven: Mutex::new(Driven {
                    machine: Replica::new(&config.replica_id, salt, timing, 0),
                    cuts: HashMap::new(),
                }),
                admits_until: AtomicU64::new(0),
                wake: tokio::sync::Notify::new(),
                changed: tokio::sync::watch::channel(0).0,
                refused: Mutex::new(None),
                uploads: DashMap::new(),
                metrics: std::sync::OnceLock::new(),
                status_members: tokio::sync::Mutex::new(None),
                start_floor: floor,
                seen_rev: std::sync::atomic::AtomicI64::new(0),
                went_back: Mutex::new(None),
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

    fn driven(&self) -> parking_lot::MutexGuard<'_, Driven> {
        self.inner.driven.lock()
    }

    /// Feeds one input to the machine and carries out what it asks: cuts
    /// (under the same lock), requests (each on its own task), notices.
    /// `notify`: wake the writes waiting for a raise.
    fn input<R>(&self, notify: bool, f: impl FnOnce(&mut Replica, Ms) -> R) -> R {
        self.input_with(notify, |d, now| f(&mut d.machine, now))
    }

    /// [`Cluster::input`] with the cut signals in reach too.
    fn input_with<R>(&self, notify: bool, f: impl FnOnce(&mut Driven, Ms) -> R) -> R {
        let now = self.now();
        let mut requests = Vec::new();
        let mut notices = Vec::new();
        let r = {
            let mut d = self.driven();
            let r = f(&mut d, now);
            let Driven { machine, cuts } = &mut *d;
            while let Some(q) = machine.poll_request() {
                requests.push(q);
            }
            while let Some(e) = machine.poll_event() {
                match e {
                    Event::Cut(lock) => {
                        if let Some(c) = cuts.get_mut(&*lock) {
                            c.cancel();
                            *c = CancellationToken::new();
                        }
                    }
                    Event::CutAll => {
                        for c in cuts.values_mut() {
                            c.cancel();
                            *c = CancellationToken::new();
                        }
                    }
                    other => notices.push(other),
                }
            }
            self.inner.admits_until.store(
                machine.admits_until().map_or(0, |u| u.saturating_add(1)),
                Ordering::Release,
            );
            r
        };
        let busy = !requests.is_empty() || !notices.is_empty();
        for (id, req) in requests {
            let me = self.clone();
            tokio::spawn(async move { me.perform(id, req).await });
        }
        for n in notices {
            self.notice(n);
        }
        if notify || busy {
            self.inner.wake.notify_one();
            self.inner.changed.send_modify(|g| *g = g.wrapping_add(1));
        }
        r
    }

    fn notice(&self, n: Event) {
        let metrics = self.inner.metrics.get();
        match n {
            Event::Joined { id, rev } => {
                tracing::info!(incarnation = %id, revision = rev, "joined the proxy cluster");
                if let Some(m) = metrics {
                    m.cluster_admitting.set(1);
                }
            }
            Event::Lost { why } => {
                tracing::warn!(
                    reason = why,
                    "refusing fenced writes until the replica rejoins the cluster"
                );
                if let Some(m) = metrics {
                    m.cluster_admitting.set(0);
                }
            }
            Event::Evicting {
                member,
                lock,
                token,
            } => {
                tracing::warn!(%member, lock = &*lock, token, "evicting a replica that did not acknowledge a raise in time");
                if let Some(m) = metrics {
                    m.cluster_evictions.inc();
                }
            }
            Event::Retiring { member } => {
                tracing::info!(%member, "retiring a replica whose lock delay has passed");
            }
            Event::Cut(_) | Event::CutAll => {}
        }
    }

    /// Whether this replica may admit a write now: joined, watching, and
    /// its registration renewed recently enough. One atomic load and a
    /// clock read.
    pub fn admits(&self) -> bool {
        let until = self.inner.admits_until.load(Ordering::Acquire);
        until != 0 && self.now() < until - 1
    }

    /// Why it does not (for the 503).
    pub fn why_not(&self) -> String {
        self.driven().machine.why_not().to_owned()
    }

    /// Admits a write of `token` to `lock`, raising the lock's max in the
    /// cluster first if it must.
    pub async fn admit(&self, lock: &str, token: u64) -> Admitted {
        let mut changed = self.inner.changed.subscribe();
        let calls = self.inner.etcd.request_timeout();
        let (since, since_ms) = (tokio::time::Instant::now(), self.now());
        let mut raised = false;
        let started = Instant::now();
        loop {
            // Again each time: the members read meanwhile may have
            // published a longer lock delay.
            let patience = self.driven().machine.raise_patience(calls);
            changed.borrow_and_update();
            // The write's cut signal is taken in the step that admits it:
            // a cut that comes after reaches it.
            let step = self.input_with(false, |d, now| {
                match d.machine.begin_write(lock, token, now) {
                    Admit::Admitted(id) => {
                        let cancel = match d.cuts.get(lock) {
                            Some(c) => c.clone(),
                            None => d.cuts.entry(lock.to_owned()).or_default().clone(),
                        };
                        Step::In(id, cancel)
                    }
                    Admit::Stale { max } => Step::Out(Admitted::Stale { max }),
                    Admit::Unavailable(why) => {
                        Step::Out(Admitted::Unavailable(Unavailable::NoStanding(why)))
                    }
                    Admit::Wait => Step::Wait,
                }
            });
            match step {
                Step::In(id, cancel) => {
                    let write = ClusterWrite {
                        cluster: self.clone(),
                        id: Some(id),
                    };
                    if raised && let Some(m) = self.inner.metrics.get() {
                        m.cluster_raise_seconds
                            .observe(started.elapsed().as_secs_f64());
                    }
                    return Admitted::Yes {
                        write,
                        cancel,
                        raised,
                    };
                }
                Step::Out(answer) => return answer,
                Step::Wait => {
                    raised = true;
                    // The machine decides when a wait is over; this only
                    // wakes it on a change or when its patience may be.
                    let wake = since + patience + Duration::from_millis(1);
                    let _ = tokio::time::timeout_at(wake, changed.changed()).await;
                    let gave_up = self
                        .driven()
                        .machine
                        .gives_up(lock, since_ms, self.now(), calls);
                    if let Some(held) = gave_up {
                        return Admitted::Unavailable(Unavailable::RaiseIncomplete {
                            lock: lock.to_owned(),
                            token,
                            patience,
                            held,
                        });
                    }
                }
            }
        }
    }

    /// The max of `lock` here (at least the cluster's floor).
    pub fn max(&self, lock: &str) -> u64 {
        self.driven().machine.max(lock)
    }

    /// Why etcd's state went back, if this replica saw it do so.
    pub fn went_back(&self) -> Option<String> {
        self.inner.went_back.lock().clone()
    }

    /// Notes the revision of an answer: one below a revision seen before
    /// means etcd's data went back (restored from an older snapshot, or
    /// a member that lost its disk answering alone). This replica's own
    /// maxes never go back with it, but a replica that starts on it, or
    /// one that rejoins, reads the older maxes: the operator must set a
    /// floor (`--token-floor` on one replica's start).
    fn saw_revision(&self, rev: i64) {
        let seen = self.inner.seen_rev.fetch_max(rev, Ordering::AcqRel);
        if rev >= seen || rev <= 0 {
            return;
        }
        let mut went = self.inner.went_back.lock();
        if went.is_none() {
            let why = format!(
                "etcd's revision went back from {seen} to {rev}: its data was restored from an older snapshot (or a member lost its disk). \
                 Maxes in it may be below tokens already admitted: restart one replica with --token-floor N, \
                 N at least the highest token ever admitted (README, \"A lost database\")"
            );
            tracing::error!(target: "fencegate::cluster", "{why}");
            *went = Some(why);
        }
    }

    /// Whether `lock` has a fence here.
    pub fn known(&self, lock: &str) -> bool {
        self.driven().machine.known(lock)
    }

    /// Every lock and its max.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.driven().machine.snapshot()
    }

    /// Joins (waiting up to `patience` for etcd, the load of the fences and
    /// the watch), and starts the driver. Writes are admitted from its
    /// return.
    pub async fn start(
        &self,
        patience: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<()> {
        let _ = self.inner.metrics.set(metrics);
        let me = self.clone();
        tokio::spawn(async move { me.drive().await });
        let deadline = tokio::time::Instant::now() + patience;
        let mut changed = self.inner.changed.subscribe();
        loop {
            if self.admits() {
                return Ok(());
            }
            if let Some(e) = self.inner.refused.lock().clone() {
                anyhow::bail!(
                    "etcd refused this replica: {e} (check cluster.username / {} and the user's permissions on the prefix)",
                    config::ENV_CLUSTER_PASSWORD
                );
            }
            let wait = tokio::time::timeout_at(deadline, changed.changed()).await;
            if wait.is_err() {
                anyhow::bail!("the cluster's etcd did not answer: {}", self.why_not());
            }
        }
    }

    /// The driver: runs the machine's timers.
    async fn drive(self) {
        loop {
            let notified = self.inner.wake.notified();
            let due = self.driven().machine.poll_timeout();
            let now = self.now();
            // At least a millisecond: a timer the machine reports due but
            // does not act on must not spin a core.
            let nap = due.map_or(DRIVER_NAP, |t| {
                Duration::from_millis(t.saturating_sub(now)).clamp(DRIVER_TICK, DRIVER_NAP)
            });
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(nap) => {}
            }
            self.input(false, |m, now| m.handle_timeout(now));
        }
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
        if let Some(h) = resp.header() {
            self.saw_revision(h.revision());
        }
        Ok(resp)
    }

    /// Carries out one request and hands its answer to the machine.
    async fn perform(self, id: ReqId, req: Request) {
        let answer = match req {
            Request::Watch {
                incarnation,
                from_rev,
            } => {
                self.watch(incarnation, from_rev).await;
                return;
            }
            Request::Revoke { lease } => {
                let _ = self
                    .inner
                    .etcd
                    .call(|mut c| async move { c.lease_revoke(lease).await })
                    .await;
                return;
            }
            Request::Retire { member } => {
                let txn = Txn::new().and_then([
                    TxnOp::delete(self.key(&format!("members/{member}")), None),
                    TxnOp::delete(self.key(&format!("roster/{member}")), None),
                ]);
                let _ = self.txn(&txn).await;
                return;
            }
            Request::Grant { ttl_secs } => self
                .inner
                .etcd
                .call(|mut c| async move { c.lease_grant(ttl_secs, None).await })
                .await
                .map(|(l, _)| Answer::Granted { lease: l.id() }),
            Request::Register {
                id: member,
                lease,
                published,
            } => self.register(&member, lease, published).await,
            Request::KeepAlive { lease, member } => self.keep_alive(lease, &member).await,
            Request::Load => self.load().await,
            Request::Raise {
                lock,
                token,
                member,
                lease,
            } => self.raise(&lock, token, &member, lease).await,
            Request::Ack {
                lock,
                token,
                member,
                lease,
            } => {
                let key = self.key(&format!("acks/{lock}/{member}"));
                self.put_rising(key, pad(token), pad(token), lease).await
            }
            Request::Draining {
                lock,
                token,
                member,
                lease,
                writes,
                oldest_ms,
            } => {
                let key = self.key(&format!("draining/{lock}/{member}"));
                let value = DrainingRecord {
                    token,
                    writes,
                    oldest_ms,
                }
                .stored();
                tracing::info!(
                    lock = &*lock,
                    token,
                    writes,
                    oldest_ms,
                    "draining writes below a raise before acknowledging it"
                );
                // A report for the same token may be sent again.
                let bound = pad(token.saturating_add(1));
                self.put_rising(key, value, bound, lease).await
            }
            Request::Members { lock } => self.members(&lock).await,
        };
        let answer = answer.unwrap_or_else(|e| {
            if let CallError::Refused(err) = &e
                && !e.lease_gone()
            {
                *self.inner.refused.lock() = Some(err.to_string());
            }
            failed(&e)
        });
        self.input(true, |m, now| m.handle_answer(id, answer, now));
    }

    /// Puts `value` on `key`, under `lease`, if the key holds less than
    /// `bound` (values start with a padded token, so bytes compare as
    /// tokens) or nothing. A put retried on another member may still
    /// reach the first later, after later puts: it then changes nothing,
    /// so an ack or a draining report never goes back. The key goes only
    /// with its lease, after which no put of it applies.
    async fn put_rising(
        &self,
        key: String,
        value: String,
        bound: String,
        lease: i64,
    ) -> Result<Answer, CallError> {
        let put = TxnOp::put(
            key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Less, bound)])
            .and_then([put.clone()])
            // A value compare on a missing key fails: the first put.
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then([put]),
            )]);
        self.txn(&txn).await.map(|_| Answer::Done)
    }

    /// Renews this incarnation's lease, then reads back its member record
    /// and registration: a renewal counts only if both are still there.
    /// Either deleted by hand (or a registry restored from an older etcd
    /// snapshot) would leave a live lease under a member the raisers no
    /// longer wait for; then the lease is revoked and the machine hears
    /// `LeaseGone`: it stops admitting and joins again as a new member.
    /// The read follows the renewal, so the standing the renewal's send
    /// grants ends before a raiser that saw either key gone can admit.
    async fn keep_alive(&self, lease: i64, me: &str) -> Result<Answer, CallError> {
        self.inner
            .etcd
            .call(|mut c| async move { c.lease_keep_alive(lease).await })
            .await?;
        let (member, registration) = (
            self.key(&format!("members/{me}")),
            self.key(&format!("proxies/{me}")),
        );
        let txn = Txn::new().and_then([
            TxnOp::get(member.clone(), Some(GetOptions::new().with_keys_only())),
            TxnOp::get(registration.clone(), None),
        ]);
        let resp = self.txn(&txn).await?;
        let ops = resp.op_responses();
        let member_there = ops.first().is_some_and(|r| !gets(r).is_empty());
        let registration = ops
            .get(1)
            .and_then(|r| gets(r).iter().find(|kv| kv.lease() == lease));
        if member_there && registration.is_some() {
            return Ok(Answer::Done);
        }
        tracing::error!(
            member = %me,
            member_record = member_there,
            registration = registration.is_some(),
            "this replica's member record or registration is gone from etcd while it runs (deleted by hand, or etcd restored): it stops admitting and joins again"
        );
        let _ = self
            .inner
            .etcd
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await;
        Ok(Answer::LeaseGone)
    }

    /// The member record and the registration, in one transaction.
    async fn register(
        &self,
        member: &str,
        lease: i64,
        published: Published,
    ) -> Result<Answer, CallError> {
        let record = serde_json::to_string(&MemberRecord {
            replica: self.inner.replica.clone(),
            lease,
            started_unix_ms: crate::clock::unix_ms(),
            settings: Some(published.into()),
        })
        .unwrap_or_default();
        let key = self.key(&format!("members/{member}"));
        let txn = Txn::new().and_then([
            TxnOp::put(key.clone(), record.clone(), None),
            TxnOp::put(self.key(&format!("roster/{member}")), record.clone(), None),
            TxnOp::put(
                self.key(&format!("proxies/{member}")),
                record,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(key, None),
        ]);
        let resp = self.txn(&txn).await?;
        // The record's create revision, which raisers compare with theirs:
        // after a retry on another member, the answer's own revision may be
        // a later one than the first attempt's, which was applied.
        let ops = resp.op_responses();
        let rev = ops.iter().flat_map(gets).next().map_or_else(
            || resp.header().map_or(0, |h| h.revision()),
            |kv| kv.create_revision(),
        );
        Ok(Answer::Registered { rev })
    }

    /// Every lock's max, with the revision read; and the cluster's floor,
    /// raised first to the one this replica was started with.
    async fn load(&self) -> Result<Answer, CallError> {
        let floor_key = self.key("floor");
        if self.inner.start_floor > 0 {
            let floor = pad(self.inner.start_floor);
            let put = TxnOp::put(floor_key.clone(), floor.clone(), None);
            let txn = Txn::new()
                .when([Compare::value(floor_key.clone(), CompareOp::Less, floor)])
                .and_then([put.clone()])
                .or_else([TxnOp::txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            floor_key.clone(),
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then([put]),
                )]);
            self.txn(&txn).await?;
        }
        let prefix = self.key("fences/");
        let txn = Txn::new().and_then([
            TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(floor_key, None),
        ]);
        let resp = self.txn(&txn).await?;
        let ops = resp.op_responses();
        let floor = ops
            .get(1)
            .map(gets)
            .and_then(|kvs| kvs.first())
            .map_or(0, |kv| parse_token(kv.value()));
        let rev = resp.header().map_or(0, |h| h.revision());
        let fences = ops
            .first()
            .map(gets)
            .unwrap_or_default()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                    parse_token(kv.value()),
                    kv.mod_revision(),
                )
            })
            .collect();
        Ok(Answer::Loaded { rev, fences, floor })
    }

    /// The raise transaction: the max to `token` if it is lower (or
    /// missing), and this member's ack whenever the max is then `token`.
    /// Sent again after a lost answer, it finds its own effect and acks
    /// again: it is idempotent.
    async fn raise(
        &self,
        lock: &str,
        token: u64,
        member: &str,
        lease: i64,
    ) -> Result<Answer, CallError> {
        let fence = self.key(&format!("fences/{lock}"));
        let put_ack = TxnOp::put(
            self.key(&format!("acks/{lock}/{member}")),
            pad(token),
            Some(PutOptions::new().with_lease(lease)),
        );
        let write = [
            TxnOp::put(fence.clone(), pad(token), None),
            put_ack.clone(),
            TxnOp::get(fence.clone(), None),
        ];
        let read = [TxnOp::get(fence.clone(), None)];
        let tries = [
            // Higher than the max.
            Txn::new()
                .when([Compare::value(fence.clone(), CompareOp::Less, pad(token))])
                .and_then(write.clone())
                .or_else(read.clone()),
            // The lock's first max (a value compare on a missing key fails).
            Txn::new()
                .when([Compare::create_revision(fence.clone(), CompareOp::Equal, 0)])
                .and_then(write)
                .or_else(read.clone()),
            // Equal: this replica's own raise whose answer was lost, or
            // another's to the same token; ack it and wait like its raiser.
            Txn::new()
                .when([Compare::value(fence.clone(), CompareOp::Equal, pad(token))])
                .and_then([put_ack, TxnOp::get(fence.clone(), None)])
                .or_else(read),
        ];
        for _ in 0..4 {
            let mut higher = None;
            for txn in &tries {
                let resp = self.txn(txn).await?;
                let ops = resp.op_responses();
                let Some(kv) = ops.iter().flat_map(gets).next() else {
                    continue;
                };
                let found = parse_token(kv.value());
                match RaiseRead::of(token, found, resp.succeeded(), kv.mod_revision()) {
                    RaiseRead::Raised { rev } => return Ok(Answer::Raised { rev }),
                    RaiseRead::Higher { max } => {
                        higher = Some(max);
                        break;
                    }
                    RaiseRead::Raced => {}
                }
            }
            if let Some(max) = higher {
                return Ok(Answer::Higher { max });
            }
            // Raced with a lower raise between two compares: again.
        }
        Err(CallError::Unavailable(format!(
            "the max of lock {lock} kept changing below token {token}"
        )))
    }

    /// Every member, with its registration, its ack and draining report for
    /// `lock`, in one read.
    async fn members(&self, lock: &str) -> Result<Answer, CallError> {
        let (members, proxies, acks, draining, roster) = (
            self.key("members/"),
            self.key("proxies/"),
            self.key(&format!("acks/{lock}/")),
            self.key(&format!("draining/{lock}/")),
            self.key("roster/"),
        );
        let txn = Txn::new().and_then([
            TxnOp::get(members.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(proxies.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(acks.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(draining.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(roster.clone(), Some(GetOptions::new().with_prefix())),
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
        let drains: BTreeMap<String, u64> = ops
            .get(3)
            .map(gets)
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| {
                let r = DrainingRecord::parse(kv.value())?;
                Some((name(kv, &draining), r.token))
            })
            .collect();
        let view_of = |id: String, kv: &fencegate_etcd::etcd_client::KeyValue| {
            let record = serde_json::from_slice::<MemberRecord>(kv.value()).ok();
            MemberView {
                registered: registered.contains(&id),
                acked: acked.get(&id).copied().unwrap_or(0),
                draining: drains.get(&id).copied().unwrap_or(0),
                joined_rev: kv.create_revision(),
                lease: record.as_ref().map_or(0, |r| r.lease),
                published: record.and_then(|r| r.settings).map(Published::from),
                id,
            }
        };
        let mut view: Vec<MemberView> = ops
            .first()
            .map(gets)
            .unwrap_or_default()
            .iter()
            .map(|kv| view_of(name(kv, &members), kv))
            .collect();
        // A member whose record was deleted by hand is still one: by its
        // roster copy (written with the record, in the same transaction,
        // and removed with it), or by its registration alone. It is waited
        // for as any member (its ack, or its eviction and lock delay),
        // never skipped.
        let mut seen: std::collections::BTreeSet<String> =
            view.iter().map(|m| m.id.clone()).collect();
        for (kvs, prefix) in [(ops.get(4), &roster), (ops.get(1), &proxies)] {
            for kv in kvs.map(gets).unwrap_or_default() {
                let id = name(kv, prefix);
                if seen.insert(id.clone()) {
                    view.push(view_of(id, kv));
                }
            }
        }
        Ok(Answer::Members(view))
    }

    fn incarnation_is(&self, number: u64) -> bool {
        self.driven().machine.incarnation_number() == Some(number)
    }

    /// The watch of the maxes for incarnation `number`, from `rev`: reports
    /// it running, each max, and its end (the machine reloads and asks for
    /// a new one).
    async fn watch(&self, number: u64, rev: i64) {
        let prefix = self.key("fences/");
        let (acks, draining) = (self.key("acks/"), self.key("draining/"));
        // One range: acks/, draining/ and fences/ sort next to each other,
        // and nothing else lies between `acks/` and `fences0` ('0' follows
        // '/'). Acks and draining reports are only hints to a waiting raise.
        let (from, to) = (acks.clone(), self.key("fences0"));
        let opened = match self.inner.etcd.client().await {
            Ok(mut c) => {
                let opts = WatchOptions::new()
                    .with_range(to)
                    .with_start_revision(rev)
                    .with_progress_notify();
                tokio::time::timeout(self.inner.etcd.request_timeout(), c.watch(from, Some(opts)))
                    .await
                    .map_err(|_| "watch not opened in time".to_owned())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the cluster's fences; reloading");
                self.inner.etcd.prefer_next();
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.input(true, |m, now| m.watch_broken(number, now));
                return;
            }
        };
        // A stream that went quiet is asked for progress; one that does not
        // answer is opened again elsewhere, soon enough that this replica
        // still acks a raise within `ack_timeout` (a watch on a paused
        // member would otherwise get it evicted).
        let quiet = (self.inner.timing.ttl / 3).min(self.inner.timing.ack_timeout / 4);
        let mut asked = false;
        loop {
            let msg = tokio::time::timeout(quiet, stream.message()).await;
            if !self.incarnation_is(number) {
                return;
            }
            match msg {
                Ok(Ok(Some(resp))) => {
                    if resp.compact_revision() > 0 || resp.canceled() {
                        break;
                    }
                    asked = false;
                    if resp.created() {
                        self.input(true, |m, now| m.watch_opened(number, now));
                    }
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        if ev.event_type() != EventType::Put {
                            continue;
                        }
                        let key = kv.key();
                        if let Some(lock) = key.strip_prefix(prefix.as_bytes()) {
                            let lock = String::from_utf8_lossy(lock).into_owned();
                            let token = parse_token(kv.value());
                            self.input(true, |m, now| m.watch_event(number, &lock, token, now));
                            continue;
                        }
                        // acks/<lock>/<member> or draining/<lock>/<member>
                        let rest = key
                            .strip_prefix(acks.as_bytes())
                            .or_else(|| key.strip_prefix(draining.as_bytes()));
                        if let Some(lock) =
                            rest.and_then(|r| r.iter().rposition(|b| *b == b'/').map(|i| &r[..i]))
                        {
                            let lock = String::from_utf8_lossy(lock).into_owned();
                            self.input(false, |m, now| m.acks_moved(number, &lock, now));
                        }
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => break,
                Err(_) if asked => break,
                Err(_) => {
                    // Quiet for a while: ask for progress; a member that
                    // went silent gets no second chance.
                    if stream.request_progress().await.is_err() {
                        break;
                    }
                    asked = true;
                }
            }
        }
        tracing::warn!("the watch of the cluster's fences ended; reloading");
        self.inner.etcd.prefer_next();
        self.input(true, |m, now| m.watch_broken(number, now));
    }

    fn keep_copy(&self, b: &UploadBinding) {
        if self.inner.uploads.len() >= UPLOAD_COPIES {
            self.inner.uploads.clear();
        }
        self.inner
            .uploads
            .insert(b.upload_id().to_owned(), b.clone());
    }

    /// Every member with its registration and acks per lock, read at most
    /// once per [`STATUS_REUSE`] (a status request is not authenticated:
    /// it must not cost etcd a read each).
    async fn members_view(&self, me: Option<&str>) -> serde_json::Value {
        let mut cached = self.inner.status_members.lock().await;
        if let Some((at, v)) = &*cached
            && at.elapsed() < STATUS_REUSE
        {
            return v.clone();
        }
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
        // A status must answer while etcd does not: it reports that instead.
        let read = async {
            tokio::time::timeout(STATUS_READ, read)
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::Unavailable(format!(
                        "etcd did not answer within {STATUS_READ:?}"
                    )))
                })
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
                            "this_replica": me == Some(id.as_str()),
                            "settings": record.as_ref().and_then(|r| r.settings),
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
    pub async fn bind_upload(&self, b: &UploadBinding) -> Result<(), StateError> {
        let key = self.key(&format!("uploads/{}", b.upload_id()));
        let value = serde_json::to_string(&b.record())
            .map_err(|e| StateError::Encode(format!("upload binding {}: {e}", b.upload_id())))?;
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
    pub async fn upload(&self, upload_id: &str) -> Result<Option<UploadBinding>, StateError> {
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
        let b = UploadBinding::read_kv(kv)?;
        self.keep_copy(&b);
        Ok(Some(b))
    }

    pub async fn forget_upload(&self, upload_id: &str) -> Result<(), StateError> {
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
    /// under way here.
    pub async fn status(&self) -> serde_json::Value {
        let now = self.now();
        let until = self.inner.admits_until.load(Ordering::Acquire);
        let (incarnation, raises, evictions, raises_sent, why_not, floor) = {
            let d = self.driven();
            let m = &d.machine;
            let raises: BTreeMap<String, serde_json::Value> = m
                .raises(now)
                .into_iter()
                .map(|r| {
                    (
                        r.lock.clone(),
                        serde_json::json!({
                            "token": r.token,
                            "phase": r.phase,
                            "holdups": r.holdups.into_iter().collect::<BTreeMap<_, _>>(),
                        }),
                    )
                })
                .collect();
            (
                m.incarnation().map(str::to_owned),
                raises,
                m.evictions(),
                m.raises_sent(),
                m.why_not().to_owned(),
                m.floor().max(self.inner.start_floor),
            )
        };
        let admitting = self.admits();
        let mut out = serde_json::json!({
            "replica": self.inner.replica,
            "incarnation": incarnation,
            "admitting": admitting,
            "standing_ms_left": (until > 0).then(|| (until - 1).saturating_sub(now)),
            "why_not": (!admitting).then_some(why_not),
            "registration_ttl_ms": self.inner.timing.ttl.as_millis() as u64,
            "ack_timeout_ms": self.inner.timing.ack_timeout.as_millis() as u64,
            "lock_delay_ms": self.inner.timing.lock_delay.as_millis() as u64,
            "store_decision_ms": self.inner.timing.store_decision.as_millis() as u64,
            "clock_drift": self.inner.timing.drift,
            "evictions": evictions,
            "raises_in_etcd": raises_sent,
            "raises_waiting": raises,
            "floor": floor,
            "etcd_went_back": self.went_back(),
        });
        let members = self.members_view(incarnation.as_deref()).await;
        if let (Some(o), serde_json::Value::Object(m)) = (out.as_object_mut(), members) {
            o.extend(m);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(token: u64) -> String {
        DrainingRecord {
            token,
            writes: 3,
            oldest_ms: 12,
        }
        .stored()
    }

    /// etcd compares values as bytes: a stored report is below the bound
    /// of a later token's report and of its own token's repeat, and not
    /// below an earlier token's.
    #[test]
    fn stored_draining_reports_compare_as_their_tokens() {
        assert!(report(9) < pad(10) && report(9) < pad(9 + 1));
        assert!(report(10) >= pad(10) && report(10) < pad(11));
        assert!(report(100) >= pad(10));
        assert!(report(u64::MAX - 1) < pad(u64::MAX));
    }

    #[test]
    fn draining_reports_read_back_in_both_forms() {
        let r = DrainingRecord::parse(report(42).as_bytes()).expect("parses");
        assert_eq!((r.token, r.writes, r.oldest_ms), (42, 3, 12));
        // As a replica of an earlier version stored it.
        let old = br#"{"token":7,"writes":1,"oldest_ms":5}"#;
        assert_eq!(DrainingRecord::parse(old).map(|r| r.token), Some(7));
        assert!(DrainingRecord::parse(b"0007 not json").is_none());
    }
}
