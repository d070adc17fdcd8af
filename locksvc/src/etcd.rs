//! The lease service on etcd: any number of stateless replicas serve the
//! same locks from one etcd cluster, and any replica answers any request.
//!
//! etcd is the engine (Raft, linearizable reads and transactions, fsync'd
//! before it answers): nothing here is consensus. What this module owns is
//! the mapping of the lease rules onto etcd keys, all under the configured
//! prefix `P`:
//!
//! | key                       | value                                        | etcd lease               |
//! |---------------------------|----------------------------------------------|--------------------------|
//! | `P/meta/epoch`            | the highest epoch any replica ran with       | none                     |
//! | `P/meta/floor`            | the last token SQLite issued (migrate)       | none                     |
//! | `P/locks/<L>/owner`       | [`Record`]: owner, key digest, epoch         | none                     |
//! | `P/expiry/<L>`            | the lease's expiry, Unix ms, 19 digits       | none                     |
//! | `P/locks/<L>/wait/<id>`   | [`PlaceValue`]: the waiting owner, its party | the waiter's, kept alive |
//!
//! **Tokens.** A grant is one transaction that creates `owner`; its token is
//! `epoch << 47 | revision` of that transaction. etcd's revision is one
//! counter for the whole store and every committed write raises it, so
//! every grant's token is above every token returned before, for every
//! lock, across replica crashes and etcd leader changes: the same promise as
//! the SQLite counter. The epoch covers what revisions cannot: a migration
//! from SQLite (whose tokens the new revisions know nothing of) and a
//! restore of etcd from a backup (its revisions restart lower). Every grant
//! transaction compares `P/meta/epoch` with the replica's own epoch, so a
//! replica still configured with an older epoch cannot grant once any
//! replica has started with a newer one.
//!
//! **Expiry** is the `P/expiry/<L>` key, read against the replica's wall
//! clock, exact to the millisecond as on SQLite. It is a key of its own, as
//! fixed-width digits, so that a transaction can compare it with "now"
//! (etcd compares values as bytes): a renewal is one transaction, `if the
//! owner key is this token's grant and the expiry is after now then write
//! the new expiry`, and so is a release. No etcd lease holds a record: etcd
//! leases are not what a lease's life depends on (etcd 3.4.23 can revoke
//! leases early after a leader pause, etcd-io/etcd#15247). Records of leases
//! that expired unreleased are deleted by whoever next acquires the lock,
//! and by each replica's sweep of `P/expiry/` (every `sweep_interval`).
//!
//! **Waiting in line.** A waiter puts its key under `wait/` first; the
//! line's order is the keys' create revisions. A newcomer's grant compares
//! "no waiter key exists", and a waiter's grant compares "no waiter key is
//! older than mine and mine still exists", so nobody jumps the line, on any
//! replica. A waiter's key lives on a short etcd lease its replica keeps
//! alive; a replica that dies takes its waiters' places with it within
//! [`WAITER_TTL_S`]. Whether a waiter may stay is decided as on SQLite
//! (`fencegate_core::line::admit`), on the keys created before its own:
//! the line's bound and its party's share.
//!
//! Every etcd call is bounded by `request_timeout`: without a quorum,
//! requests fail with `StorageUnavailable` instead of hanging, and work
//! again by themselves when the quorum is back.

use crate::clock;
use crate::config::EtcdConfig;
use crate::engine::{EngineError, LockStatus};
use crate::metrics::Metrics;
use crate::proof::HeldToken;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use fencegate_core::line::{self, Party};
use fencegate_core::{KeyDigest, Lease, LockName, Timestamp};
use fencegate_etcd::{CallError, Etcd, Retried};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bits of a token that hold the etcd revision; the epoch is above them.
pub const REVISION_BITS: u32 = 47;
const REVISION_MASK: u64 = (1 << REVISION_BITS) - 1;
/// TTL of a waiter's key (whole seconds, as etcd leases are): how long the
/// place in line of a waiter whose replica died blocks the line. At least
/// this; more when `request_timeout` is long (see [`EtcdLeases::waiter_ttl_s`]).
pub const WAITER_TTL_S: i64 = 3;
/// How often a waiter's etcd lease is kept alive.
const WAITER_KEEPALIVE: Duration = Duration::from_millis(500);
/// How many expiry keys a sweep reads per request to etcd.
const SWEEP_PAGE: i64 = 1000;
/// How often the first waiter looks whether the lock became free; the
/// others look less often (they cannot take it before the first).
const FIRST_WAITER_POLL: Duration = Duration::from_millis(20);
const OTHER_WAITER_POLL: Duration = Duration::from_millis(200);
/// How long a newcomer that may not wait gives the first waiter of a free
/// lock to take it, before it is refused.
const LINE_HANDOVER: Duration = Duration::from_millis(300);
/// Conflicting transactions retried before answering `StorageUnavailable`.
const MAX_CONFLICTS: usize = 32;

/// The first token of `epoch`: every token it issues is above it.
/// Keys the status page's list reads at most (owner, expiry and waiter
/// keys of every lock, in key order).
const LIST_KEYS_READ: i64 = 20_000;

pub fn epoch_base(epoch: u16) -> u64 {
    u64::from(epoch) << REVISION_BITS
}

/// What `P/locks/<L>/owner` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    owner: String,
    /// Hex SHA-256 of the acquire's idempotency key, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    idempotency_sha256: Option<String>,
    /// The epoch of the replica that granted it: with the key's create
    /// revision, the token.
    epoch: u16,
    /// Set only on leases migrated from SQLite: their token is the one
    /// SQLite issued, not derived from a revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    /// Names the grant transaction, so that a grant retried on another
    /// member recognises its own earlier attempt.
    #[serde(default)]
    grant: u64,
}

/// A random number naming one grant: replicas (all PID 1 in their
/// containers, perhaps started in the same millisecond) cannot derive the
/// same one. Compared together with the owner and the idempotency digest.
fn grant_id() -> Result<u64, EngineError> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b)
        .map_err(|e| EngineError::Storage(format!("no randomness for a grant id: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

impl Record {
    fn token(&self, kv: &KeyValue) -> u64 {
        self.token.unwrap_or_else(|| {
            epoch_base(self.epoch) | (u64::try_from(kv.create_revision()).unwrap_or(0))
        })
    }

    fn lease(&self, lock: &LockName, token: u64, expires_at: Timestamp) -> Lease {
        let idempotency = self
            .idempotency_sha256
            .as_deref()
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(KeyDigest::from_bytes);
        Lease {
            lock: lock.clone(),
            owner: self.owner.clone(),
            token,
            expires_at,
            idempotency,
        }
    }
}

/// What `P/locks/<L>/wait/<id>` holds: who waits, and its party (for its
/// share of the line). A waiter key of an older replica holds the owner's
/// name alone; it counts as a party of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlaceValue {
    owner: String,
    party: String,
}

/// A key of this acquire's own (see `EtcdLeases::acquire`).
fn own_key() -> KeyDigest {
    let mut bytes = [0u8; 32];
    // Without randomness, the time: unique enough for one call's rounds.
    if getrandom::getrandom(&mut bytes).is_err() {
        let t = std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_nanos());
        bytes[..16].copy_from_slice(&t.to_le_bytes());
    }
    KeyDigest::of(&bytes)
}

/// The party of a waiter key, if it names one.
fn party_of(kv: &KeyValue) -> Option<String> {
    serde_json::from_slice::<PlaceValue>(kv.value())
        .ok()
        .map(|v| v.party)
}

fn record_of(kv: &KeyValue) -> Result<Record, EngineError> {
    serde_json::from_slice(kv.value()).map_err(|e| {
        EngineError::Storage(format!(
            "etcd key {} does not hold a fencegate lease record ({e}); is another program writing under this prefix?",
            String::from_utf8_lossy(kv.key())
        ))
    })
}

/// An expiry as the `P/expiry/<L>` value: 19 digits, so that etcd's byte
/// comparison of two values is the comparison of the numbers.
fn expiry_value(t: Timestamp) -> String {
    format!("{:019}", t.as_millis())
}

fn expiry_of(kv: &KeyValue) -> Timestamp {
    Timestamp(
        std::str::from_utf8(kv.value())
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    )
}

/// A lease as read: its owner record and its expiry key. A record whose
/// expiry key is missing counts as expired.
#[derive(Debug, Clone)]
struct Held {
    kv: KeyValue,
    record: Record,
    expiry: Option<KeyValue>,
}

impl Held {
    fn lease(&self, lock: &LockName) -> Lease {
        let expires = self.expiry.as_ref().map_or(Timestamp(0), expiry_of);
        self.record
            .lease(lock, self.record.token(&self.kv), expires)
    }

    /// Both keys unchanged since this read.
    fn unchanged(&self, owner_key: String, expiry_key: String) -> Vec<Compare> {
        vec![
            Compare::mod_revision(owner_key, CompareOp::Equal, self.kv.mod_revision()),
            Compare::mod_revision(
                expiry_key,
                CompareOp::Equal,
                self.expiry.as_ref().map_or(0, KeyValue::mod_revision),
            ),
        ]
    }
}

/// What a read (or a failed transaction's else branch) saw of one lock.
#[derive(Debug)]
struct Seen {
    owner: Option<Held>,
    /// Waiter keys in line.
    waiters: usize,
    /// Create revision of the oldest waiter key.
    first_waiter: Option<i64>,
    /// Whether the caller's own waiter key is still there.
    mine_present: bool,
    /// `P/meta/epoch` as seen.
    epoch: Option<u16>,
}

/// The etcd backend. Cheap to clone.
#[derive(Clone)]
pub struct EtcdLeases {
    inner: Arc<Inner>,
}

struct Inner {
    /// One client per member, failed over call by call.
    etcd: Etcd,
    prefix: String,
    epoch: u16,
    request_timeout: Duration,
    max_waiters: usize,
    metrics: Arc<Metrics>,
    /// The highest store revision any answer carried: etcd's revision
    /// never goes back, unless the cluster was restored from a backup.
    highest_revision: std::sync::atomic::AtomicI64,
    /// Set once a revision went back: this replica then grants nothing.
    rewound: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for EtcdLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLeases")
            .field("prefix", &self.inner.prefix)
            .field("epoch", &self.inner.epoch)
            .finish_non_exhaustive()
    }
}

fn storage(e: etcd_client::Error) -> EngineError {
    EngineError::Storage(format!("etcd: {e}"))
}

impl From<CallError> for EngineError {
    fn from(e: CallError) -> EngineError {
        match e {
            CallError::Unavailable(why) => EngineError::Storage(why),
            CallError::Refused(e) => storage(e),
        }
    }
}

impl EtcdLeases {
    /// Connects, and registers this replica's epoch with the cluster:
    /// refuses to start when the cluster has seen a higher epoch, or when
    /// a migration recorded tokens the epoch does not clear. Retries for
    /// `startup` while etcd cannot be reached (replicas may start first).
    pub async fn start(
        config: &EtcdConfig,
        metrics: Arc<Metrics>,
        max_waiters: usize,
        startup: Duration,
    ) -> anyhow::Result<EtcdLeases> {
        let etcd = Etcd::new(&config.connection())?;
        let leases = EtcdLeases {
            inner: Arc::new(Inner {
                etcd,
                prefix: config.prefix.clone(),
                epoch: config.epoch,
                request_timeout: config.request_timeout,
                max_waiters,
                metrics,
                highest_revision: std::sync::atomic::AtomicI64::new(0),
                rewound: std::sync::Mutex::new(None),
            }),
        };
        let deadline = Instant::now() + startup;
        loop {
            match leases.register_epoch().await {
                Ok(()) => break,
                Err(Startup::Refused(e)) => return Err(e),
                Err(Startup::Unavailable(e)) if Instant::now() >= deadline => {
                    anyhow::bail!("etcd {:?} did not answer: {e}", config.endpoints)
                }
                Err(Startup::Unavailable(e)) => {
                    tracing::warn!(error = %e, "etcd not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        tracing::info!(
            endpoints = ?config.endpoints,
            prefix = %config.prefix,
            epoch = config.epoch,
            "serving locks from etcd"
        );
        leases.spawn_sweeper(config.sweep_interval);
        Ok(leases)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.inner.prefix)
    }

    fn owner_key(&self, lock: &LockName) -> String {
        self.key(&format!("locks/{lock}/owner"))
    }

    fn expiry_key(&self, lock: &LockName) -> String {
        self.key(&format!("expiry/{lock}"))
    }

    fn wait_prefix(&self, lock: &LockName) -> String {
        self.key(&format!("locks/{lock}/wait/"))
    }

    fn epoch_key(&self) -> String {
        self.key("meta/epoch")
    }

    fn floor_key(&self) -> String {
        self.key("meta/floor")
    }

    /// Runs one etcd call, within `request_timeout` in all: on the member
    /// that answered last, then, if it fails or is silent for its share of
    /// the time, on the next. A paused or dead member costs a request
    /// some latency, not an error; without a quorum no member answers and
    /// the call fails when the time is up.
    ///
    /// A write retried on another member may also have been applied by
    /// the first (it was sent, the answer was lost): every write here is a
    /// compare-and-set, so the retry finds its own effect and answers from
    /// it (for a grant: the lock held by this owner).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, EngineError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        Ok(self.call_tracked(f).await?.0)
    }

    /// [`Self::call`], also saying whether the answer came from a retry
    /// after an attempt that may have been applied (it timed out or
    /// failed after being sent): a compare-and-set retried then may find
    /// its own effect and must recognise it.
    async fn call_tracked<T, F, Fut>(&self, f: F) -> Result<(T, Retried), EngineError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        Ok(self.call_raw(f).await?)
    }

    async fn call_raw<T, F, Fut>(&self, f: F) -> Result<(T, Retried), CallError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.inner.etcd.call(f).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, EngineError> {
        Ok(self.txn_tracked(txn).await?.0)
    }

    async fn txn_tracked(&self, txn: Txn) -> Result<(TxnResponse, Retried), EngineError> {
        self.refuse_if_rewound()?;
        // Only an answer seen before this request was sent bounds it:
        // overlapping requests may come back in either order.
        let floor = self
            .inner
            .highest_revision
            .load(std::sync::atomic::Ordering::Acquire);
        let (resp, retried) = self
            .call_tracked(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.saw_revision(resp.header().map_or(0, |h| h.revision()), floor)?;
        Ok((resp, retried))
    }

    /// Refuses everything once etcd's revision went back (see
    /// [`Self::saw_revision`]).
    fn refuse_if_rewound(&self) -> Result<(), EngineError> {
        match &*self.inner.rewound.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(EngineError::Storage(why.clone())),
            None => Ok(()),
        }
    }

    /// Every transaction's answer is linearizable, so its revision is at
    /// least that of any answer received before it was sent (`floor`),
    /// unless etcd was restored from an older backup: then revisions, and
    /// the tokens made of them, would repeat ones already issued. The
    /// replica stops granting for good and says which epoch clears them.
    fn saw_revision(&self, revision: i64, floor: i64) -> Result<(), EngineError> {
        let highest = self
            .inner
            .highest_revision
            .fetch_max(revision, std::sync::atomic::Ordering::AcqRel);
        if revision >= floor || revision == 0 {
            return Ok(());
        }
        let why = format!(
            "etcd's revision went back from {} to {revision}: the cluster was restored from an older backup, and its tokens would repeat ones already issued. This replica grants nothing more. Stop every lease-service replica, set etcd.epoch (or FENCEGATE_ETCD_EPOCH) to {} and start them again",
            highest.max(floor),
            u32::from(self.inner.epoch) + 1
        );
        tracing::error!("{why}");
        *self.inner.rewound.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
        Err(EngineError::Storage(why))
    }

    /// A transaction for start-up, which tells "etcd refused" (stop) from
    /// "etcd did not answer" (retry).
    async fn txn_at_start(&self, txn: Txn) -> Result<TxnResponse, Startup> {
        match self
            .call_raw(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok((resp, _)) => Ok(resp),
            Err(CallError::Unavailable(why)) => Err(Startup::Unavailable(why)),
            Err(CallError::Refused(e)) => Err(Startup::Refused(anyhow::anyhow!(
                "etcd refused this replica: {e} (check etcd.username / FENCEGATE_ETCD_PASSWORD and the user's permissions on the prefix)"
            ))),
        }
    }

    /// Refuses an epoch below the cluster's, or one that does not clear
    /// the floor `migrate` recorded; then raises the cluster's epoch to
    /// this replica's.
    async fn register_epoch(&self) -> Result<(), Startup> {
        let mine = self.inner.epoch;
        let (_, floor) = self.read_number(self.floor_key()).await?;
        if floor >= epoch_base(mine) && floor > 0 {
            return Err(Startup::Refused(anyhow::anyhow!(
                "tokens up to {floor} were issued before these locks moved to etcd (fencegate locksvc migrate); epoch {mine} would issue tokens below them. Set etcd.epoch to at least {}",
                (floor >> REVISION_BITS) + 1
            )));
        }
        let before = self.raise(self.epoch_key(), u64::from(mine)).await?;
        if before > u64::from(mine) {
            return Err(Startup::Refused(anyhow::anyhow!(
                "the etcd cluster has served epoch {before}, and this replica is configured with epoch {mine}: its tokens would be below ones already issued. Set etcd.epoch (or FENCEGATE_ETCD_EPOCH) to at least {before}"
            )));
        }
        Ok(())
    }

    /// Records SQLite's last token as the floor no epoch may issue below
    /// (`migrate`).
    pub async fn record_floor(&self, last_token: u64) -> anyhow::Result<()> {
        match self.raise(self.floor_key(), last_token).await {
            Ok(_) => Ok(()),
            Err(Startup::Refused(e)) => Err(e),
            Err(Startup::Unavailable(why)) => anyhow::bail!("cannot record the floor: {why}"),
        }
    }

    /// Whether `key` exists, and the number it holds (0 if none).
    async fn read_number(&self, key: String) -> Result<(Option<KeyValue>, u64), Startup> {
        let resp = self
            .txn_at_start(Txn::new().and_then([TxnOp::get(key, None)]))
            .await?;
        let kv = gets(&resp)
            .into_iter()
            .next()
            .and_then(|kvs| kvs.into_iter().next());
        let n = kv
            .as_ref()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
            .unwrap_or(0);
        Ok((kv, n))
    }

    /// Raises the number under `key` to `value`, by compare-and-set; never
    /// lowers it, and writes it when the key is missing. Returns what was
    /// there before (0 if nothing).
    async fn raise(&self, key: String, value: u64) -> Result<u64, Startup> {
        loop {
            let (kv, before) = self.read_number(key.clone()).await?;
            if kv.is_some() && before >= value {
                return Ok(before);
            }
            let seen = kv.as_ref().map_or(0, KeyValue::mod_revision);
            let put = self
                .txn_at_start(
                    Txn::new()
                        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, seen)])
                        .and_then([TxnOp::put(key.clone(), value.to_string(), None)]),
                )
                .await?;
            if put.succeeded() {
                return Ok(before);
            }
        }
    }

    /// Reads what `acquire` decides on, in one consistent snapshot.
    async fn see(&self, lock: &LockName, mine: Option<&str>) -> Result<Seen, EngineError> {
        let resp = self
            .txn(Txn::new().and_then(self.seeing(lock, mine)))
            .await?;
        self.seen(&resp, mine.is_some())
    }

    /// The reads behind [`Seen`], for a read or a grant's else branch.
    fn seeing(&self, lock: &LockName, mine: Option<&str>) -> Vec<TxnOp> {
        let prefix = self.wait_prefix(lock);
        let mut ops = vec![
            TxnOp::get(self.owner_key(lock), None),
            TxnOp::get(self.expiry_key(lock), None),
            TxnOp::get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
            TxnOp::get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
            TxnOp::get(self.epoch_key(), None),
        ];
        if let Some(k) = mine {
            ops.push(TxnOp::get(k, Some(GetOptions::new().with_keys_only())));
        }
        ops
    }

    fn seen(&self, resp: &TxnResponse, mine: bool) -> Result<Seen, EngineError> {
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => Some(g),
            _ => None,
        };
        let owner = held_of(
            get(0).and_then(|g| g.kvs().first()),
            get(1).and_then(|g| g.kvs().first()),
        )?;
        let waiters = get(2).map_or(0, |g| usize::try_from(g.count()).unwrap_or(usize::MAX));
        let first_waiter = get(3)
            .and_then(|g| g.kvs().first())
            .map(KeyValue::create_revision);
        let epoch = get(4)
            .and_then(|g| g.kvs().first())
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok());
        let mine_present = mine && get(5).is_some_and(|g| !g.kvs().is_empty());
        Ok(Seen {
            owner,
            waiters,
            first_waiter,
            mine_present,
            epoch,
        })
    }

    async fn grant_etcd_lease(&self, ttl_s: i64) -> Result<i64, EngineError> {
        Ok(self
            .call(|mut c| async move { c.lease_grant(ttl_s, None).await })
            .await?
            .id())
    }

    /// One grant transaction: creates the owner record if the lock has no
    /// record, the line allows it (`line`: none for a newcomer, which needs
    /// an empty line; or the caller's waiter key and its create revision,
    /// which must be the oldest), and the cluster's epoch is this
    /// replica's. `Ok(Err(seen))` when a condition did not hold.
    async fn try_grant(
        &self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        line: Option<(&str, i64)>,
    ) -> Result<Result<Lease, Seen>, EngineError> {
        let expires = clock::now().saturating_add(ttl);
        let record = Record {
            owner: owner.to_owned(),
            idempotency_sha256: key.map(|k| hex::encode(k.as_bytes())),
            epoch: self.inner.epoch,
            token: None,
            grant: grant_id()?,
        };
        let value = serde_json::to_vec(&record).map_err(|e| EngineError::Storage(e.to_string()))?;
        let prefix = self.wait_prefix(lock);
        let mut when = vec![
            Compare::create_revision(self.owner_key(lock), CompareOp::Equal, 0),
            Compare::value(
                self.epoch_key(),
                CompareOp::Equal,
                self.inner.epoch.to_string(),
            ),
        ];
        let mut then = vec![
            TxnOp::put(self.owner_key(lock), value, None),
            TxnOp::put(self.expiry_key(lock), expiry_value(expires), None),
        ];
        match line {
            None => {
                when.push(Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix());
            }
            Some((mine, rev)) => {
                // Every waiter key is at least as new as mine, and mine is
                // still there: I am first in line.
                when.push(
                    Compare::create_revision(prefix, CompareOp::Greater, rev - 1).with_prefix(),
                );
                when.push(Compare::create_revision(mine, CompareOp::Equal, rev));
                then.push(TxnOp::delete(mine, None));
            }
        }
        let txn = Txn::new()
            .when(when)
            .and_then(then)
            .or_else(self.seeing(lock, line.map(|(k, _)| k)));
        let started = Instant::now();
        let (resp, retried) = self.txn_tracked(txn).await?;
        if !resp.succeeded() {
            let seen = self.seen(&resp, line.is_some())?;
            if let Some(h) = seen.owner.as_ref().filter(|h| {
                retried.0
                    && h.record.grant == record.grant
                    && h.record.owner == record.owner
                    && h.record.idempotency_sha256 == record.idempotency_sha256
            }) {
                // An earlier attempt of this very grant was applied.
                self.inner.metrics.grants.inc();
                return Ok(Ok(h.lease(lock)));
            }
            if let Some(e) = seen.epoch.filter(|e| *e != self.inner.epoch) {
                return Err(EngineError::Storage(format!(
                    "the etcd cluster now runs epoch {e} and this replica epoch {}: restart it with etcd.epoch = {e}",
                    self.inner.epoch
                )));
            }
            return Ok(Err(seen));
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let revision = u64::try_from(revision).unwrap_or(0);
        if revision == 0 || revision > REVISION_MASK {
            return Err(EngineError::Storage(format!(
                "etcd revision {revision} does not fit below the epoch bits; raise etcd.epoch"
            )));
        }
        let token = epoch_base(self.inner.epoch) | revision;
        self.inner
            .metrics
            .fsync_seconds
            .observe(started.elapsed().as_secs_f64());
        self.inner.metrics.grants.inc();
        self.inner
            .metrics
            .last_token
            .set(i64::try_from(token).unwrap_or(i64::MAX));
        Ok(Ok(record.lease(lock, token, expires)))
    }

    /// Deletes an expired record (if it is still the one seen).
    async fn clear_expired(&self, lock: &LockName, held: &Held) -> Result<(), EngineError> {
        let resp = self
            .txn(
                Txn::new()
                    .when(held.unchanged(self.owner_key(lock), self.expiry_key(lock)))
                    .and_then([
                        TxnOp::delete(self.owner_key(lock), None),
                        TxnOp::delete(self.expiry_key(lock), None),
                    ]),
            )
            .await?;
        if resp.succeeded() {
            self.inner.metrics.expiries.inc();
        }
        Ok(())
    }

    /// Sets a live lease's expiry to `now + ttl`, keeping its token, if
    /// neither key changed since `held` was read; `Ok(None)` if one did.
    async fn extend(
        &self,
        lock: &LockName,
        held: &Held,
        ttl: Duration,
    ) -> Result<Option<Lease>, EngineError> {
        let now = clock::now();
        let expires = now.saturating_add(ttl);
        let mut when = held.unchanged(self.owner_key(lock), self.expiry_key(lock));
        // Still live when etcd applies it, as the fast path checks.
        when.push(self.live_at(lock, now));
        let resp = self
            .txn(Txn::new().when(when).and_then([TxnOp::put(
                self.expiry_key(lock),
                expiry_value(expires),
                None,
            )]))
            .await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        self.inner.metrics.renewals.inc();
        Ok(Some(held.record.lease(
            lock,
            held.record.token(&held.kv),
            expires,
        )))
    }

    /// The condition, inside one transaction, that the owner key of `lock`
    /// is the one `token`'s grant created: its create revision, under the
    /// epoch the token was issued in (revisions never repeat within an
    /// epoch). A migrated lease's token is not a revision: it takes the
    /// slow path (read, then compare-and-set).
    fn granted(&self, lock: &LockName, token: u64) -> [Compare; 2] {
        [
            Compare::create_revision(
                self.owner_key(lock),
                CompareOp::Equal,
                i64::try_from(token & REVISION_MASK).unwrap_or(0),
            ),
            Compare::value(
                self.epoch_key(),
                CompareOp::Equal,
                (token >> REVISION_BITS).to_string(),
            ),
        ]
    }

    /// The condition that `lock`'s lease has not expired at `now`.
    fn live_at(&self, lock: &LockName, now: Timestamp) -> Compare {
        Compare::value(self.expiry_key(lock), CompareOp::Greater, expiry_value(now))
    }

    /// TTL of a waiter's etcd lease: [`WAITER_TTL_S`], or more when
    /// `request_timeout` is long. Keep-alives go every [`WAITER_KEEPALIVE`]
    /// and each takes at most `request_timeout`, so successful ones are at
    /// most `2 × WAITER_KEEPALIVE + request_timeout` apart even when one in
    /// between failed outright; the TTL is above that.
    fn waiter_ttl_s(&self) -> i64 {
        let worst = 2 * WAITER_KEEPALIVE + self.inner.request_timeout;
        let ttl = i64::try_from(worst.as_secs()).unwrap_or(i64::MAX / 4) + 1;
        WAITER_TTL_S.max(ttl)
    }

    /// One keep-alive of an etcd lease: false if etcd no longer has it.
    async fn keep_alive(&self, id: i64) -> Result<bool, EngineError> {
        // The client sends the first keep-alive and reads its answer; a
        // lease etcd no longer has is this error.
        match self
            .call(|mut c| async move { c.lease_keep_alive(id).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(EngineError::Storage(e)) if e.contains("lease not found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn acquire(
        &self,
        lock: LockName,
        owner: String,
        key: Option<KeyDigest>,
        ttl: Duration,
        wait: Duration,
        party: Party,
    ) -> Result<Lease, EngineError> {
        let started = Instant::now();
        let deadline = started + wait;
        // An acquire that sent no idempotency key gets one of its own for
        // this call. A transaction that timed out on one member may have
        // been applied there and is retried on the next: with the key, the
        // retry (or this call's next round) recognises its own grant
        // instead of waiting behind it and answering "held by" itself.
        // Nobody else knows the key, so nothing else changes.
        let key = Some(key.unwrap_or_else(own_key));
        for _ in 0..MAX_CONFLICTS {
            let seen = match self.try_grant(&lock, &owner, key, ttl, None).await? {
                Ok(lease) => return Ok(lease),
                Err(seen) => seen,
            };
            let now = clock::now();
            match &seen.owner {
                Some(held) if !held.lease(&lock).is_live(now) => {
                    self.clear_expired(&lock, held).await?;
                    continue;
                }
                Some(held) => {
                    let holder = held.lease(&lock);
                    if holder.granted_to(&owner, key.as_ref()) {
                        match self.extend(&lock, held, ttl).await? {
                            Some(lease) => return Ok(lease),
                            None => continue,
                        }
                    }
                    if wait.is_zero() {
                        self.inner.metrics.refused("held");
                        return Err(EngineError::Held { holder });
                    }
                }
                // Free, but others are in line: the first of them takes it.
                None if seen.waiters > 0 => {
                    if wait.is_zero() {
                        if started.elapsed() < LINE_HANDOVER {
                            tokio::time::sleep(FIRST_WAITER_POLL).await;
                            continue;
                        }
                        self.inner.metrics.refused("held");
                        return Err(EngineError::InLine {
                            waiting: seen.waiters,
                        });
                    }
                }
                // Taken and released between the two reads: try again.
                None => continue,
            }
            return self
                .wait_in_line(lock, owner, key, ttl, deadline, party)
                .await;
        }
        Err(EngineError::Storage(
            "too many conflicting changes to this lock in etcd; retry".into(),
        ))
    }

    async fn wait_in_line(
        &self,
        lock: LockName,
        owner: String,
        key: Option<KeyDigest>,
        ttl: Duration,
        deadline: Instant,
        party: Party,
    ) -> Result<Lease, EngineError> {
        let ttl_s = self.waiter_ttl_s();
        let waiter_lease = self.grant_etcd_lease(ttl_s).await?;
        let mine = format!("{}{waiter_lease:016x}", self.wait_prefix(&lock));
        // Kept alive from now on, and removed however this acquire ends.
        let place = Place::new(self.clone(), mine.clone(), waiter_lease);
        let value = serde_json::to_string(&PlaceValue {
            owner: owner.clone(),
            party: party.as_str().to_owned(),
        })
        .map_err(|e| EngineError::Storage(e.to_string()))?;
        self.call(|mut c| {
            let (key, value) = (mine.clone(), value.clone());
            async move {
                c.put(key, value, Some(PutOptions::new().with_lease(waiter_lease)))
                    .await
            }
        })
        .await?;
        // The place is the key's create revision, read back: a put retried
        // on another member after the first was applied answers with a
        // later revision than the key's.
        let rev = self
            .call(|mut c| {
                let key = mine.clone();
                async move { c.get(key, None).await }
            })
            .await?
            .kvs()
            .first()
            .map(KeyValue::create_revision)
            .ok_or_else(|| {
                EngineError::Storage("this acquire's place in line vanished; retry".into())
            })?;
        if let Err(full) = self.admit(&lock, rev, &party).await? {
            self.inner
                .metrics
                .refused(crate::engine::refusal_reason(full));
            // Gone before the answer, so that the next waiter does not
            // count this one ahead of it.
            place.leave().await;
            return Err(EngineError::TooManyWaiters(full));
        }
        self.inner.metrics.waiting.inc();
        let result = self
            .serve_place(&lock, &owner, key, ttl, deadline, &mine, rev)
            .await;
        self.inner.metrics.waiting.dec();
        drop(place);
        result
    }

    /// The line rule (`line::admit`) for the waiter whose key was created
    /// at `rev`: counts the keys created before it, and those of `party`.
    ///
    /// The keys are read, not counted: etcd's count of a range ignores
    /// `max_create_revision` (it counts every key under the prefix, this
    /// waiter's own and those behind it), which made the bound one lower
    /// than on SQLite. At most `max_waiters` keys are read (the oldest):
    /// if that many are ahead, the line is full whatever the rest hold.
    async fn admit(
        &self,
        lock: &LockName,
        rev: i64,
        party: &Party,
    ) -> Result<Result<(), line::LineFull>, EngineError> {
        let max = self.inner.max_waiters;
        let prefix = self.wait_prefix(lock);
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        let ahead = self
            .call(|mut c| {
                let prefix = prefix.clone();
                async move {
                    c.get(
                        prefix,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_max_create_revision(rev - 1)
                                .with_sort(SortTarget::Create, SortOrder::Ascend)
                                .with_limit(limit),
                        ),
                    )
                    .await
                }
            })
            .await?;
        // The filter is applied by etcd; kept here too, so that the count
        // cannot depend on it.
        let kvs: Vec<&KeyValue> = ahead
            .kvs()
            .iter()
            .filter(|kv| kv.create_revision() < rev)
            .collect();
        let of_party = kvs
            .iter()
            .filter(|kv| party_of(kv).as_deref() == Some(party.as_str()))
            .count();
        // More keys than were read: `max` of them are ahead at least.
        let total = if ahead.more() { max } else { kvs.len() };
        Ok(line::admit(total, of_party, max))
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve_place(
        &self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        deadline: Instant,
        mine: &str,
        rev: i64,
    ) -> Result<Lease, EngineError> {
        loop {
            let seen = self.see(lock, Some(mine)).await?;
            if !seen.mine_present {
                return Err(EngineError::Storage(
                    "this acquire lost its place in line (its etcd lease was not kept alive); retry"
                        .into(),
                ));
            }
            let now = clock::now();
            let first = seen.first_waiter == Some(rev);
            let holder = seen.owner.as_ref().map(|h| (h, h.lease(lock)));
            match &holder {
                Some((held, lease)) if !lease.is_live(now) => {
                    self.clear_expired(lock, held).await?;
                    continue;
                }
                None if first => {
                    if let Ok(lease) = self
                        .try_grant(lock, owner, key, ttl, Some((mine, rev)))
                        .await?
                    {
                        return Ok(lease);
                    }
                    continue;
                }
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.inner.metrics.refused("held_after_wait");
                return Err(match holder {
                    Some((_, lease)) => EngineError::Held { holder: lease },
                    None => EngineError::InLine {
                        waiting: seen.waiters,
                    },
                });
            }
            let mut pause = if first {
                FIRST_WAITER_POLL
            } else {
                OTHER_WAITER_POLL
            };
            if let Some((_, lease)) = &holder {
                pause = pause.min(now.until(lease.expires_at).max(Duration::from_millis(1)));
            }
            tokio::time::sleep(pause.min(left)).await;
        }
    }

    pub async fn renew(&self, held: HeldToken, ttl: Duration) -> Result<Lease, EngineError> {
        let (lock, token) = (held.lock(), held.token());
        let now = clock::now();
        let expires = now.saturating_add(ttl);
        // The usual case in one round trip.
        let (resp, retried) = self
            .txn_tracked(
                Txn::new()
                    .when(
                        [
                            self.granted(lock, token).as_slice(),
                            &[self.live_at(lock, now)],
                        ]
                        .concat(),
                    )
                    .and_then([
                        TxnOp::put(self.expiry_key(lock), expiry_value(expires), None),
                        TxnOp::get(self.owner_key(lock), None),
                    ])
                    .or_else([
                        TxnOp::get(self.owner_key(lock), None),
                        TxnOp::get(self.expiry_key(lock), None),
                    ]),
            )
            .await?;
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first(),
            _ => None,
        };
        if resp.succeeded() {
            let kv = get(1).ok_or_else(|| {
                EngineError::Storage("the renewed lease's record vanished".into())
            })?;
            self.inner.metrics.renewals.inc();
            return Ok(record_of(kv)?.lease(lock, token, expires));
        }
        let mut current = held_of(get(0), get(1))?;
        if let Some(h) = current.as_ref().filter(|h| {
            retried.0
                && h.lease(lock).token == token
                && h.expiry
                    .as_ref()
                    .is_some_and(|e| e.value() == expiry_value(expires).as_bytes())
        }) {
            // An earlier attempt of this very renewal was applied.
            self.inner.metrics.renewals.inc();
            return Ok(h.record.lease(lock, token, expires));
        }
        for _ in 0..MAX_CONFLICTS {
            let now = clock::now();
            match current.as_ref().map(|h| (h, h.lease(lock))) {
                // A migrated lease, or a lease granted under an older epoch.
                Some((h, lease)) if lease.token == token && lease.is_live(now) => {
                    if let Some(lease) = self.extend(lock, h, ttl).await? {
                        return Ok(lease);
                    }
                    current = self.see(lock, None).await?.owner;
                }
                other => {
                    self.inner.metrics.refused("lease_lost");
                    return Err(EngineError::NotHolder {
                        current: other.map(|(_, l)| l).filter(|l| l.is_live(now)),
                    });
                }
            }
        }
        Err(EngineError::Storage(
            "too many conflicting changes to this lock in etcd; retry".into(),
        ))
    }

    /// Ends the lease `held` names, live or expired, as on SQLite
    /// (`LockTable::release`): releasing a lease that already ended and
    /// that nobody took since is not an error (a client may retry);
    /// releasing while another lease is live, or after a newer grant, is.
    pub async fn release(&self, held: HeldToken) -> Result<(), EngineError> {
        let (lock, token) = (held.lock(), held.token());
        let delete = [
            TxnOp::delete(self.owner_key(lock), None),
            TxnOp::delete(self.expiry_key(lock), None),
        ];
        // The usual case in one round trip: the owner key is the one this
        // token's grant created, live or not.
        let when = self.granted(lock, token);
        let resp = self
            .txn(Txn::new().when(when).and_then(delete.clone()).or_else([
                TxnOp::get(self.owner_key(lock), None),
                TxnOp::get(self.expiry_key(lock), None),
            ]))
            .await?;
        if resp.succeeded() {
            self.inner.metrics.releases.inc();
            return Ok(());
        }
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first(),
            _ => None,
        };
        let now = clock::now();
        match held_of(get(0), get(1))? {
            // A migrated lease, or one granted under an older epoch.
            Some(h) if h.lease(lock).token == token => {
                let resp = self
                    .txn(
                        Txn::new()
                            .when(h.unchanged(self.owner_key(lock), self.expiry_key(lock)))
                            .and_then(delete),
                    )
                    .await?;
                if resp.succeeded() {
                    self.inner.metrics.releases.inc();
                    return Ok(());
                }
                Err(EngineError::Storage(
                    "the lease changed while it was being released; retry".into(),
                ))
            }
            // Another lease is live, or a newer one was granted.
            Some(h) if h.lease(lock).is_live(now) || h.lease(lock).token > token => {
                self.inner.metrics.refused("not_holder");
                Err(EngineError::NotHolder {
                    current: Some(h.lease(lock)).filter(|l| l.is_live(now)),
                })
            }
            // Nothing newer than the token holds the lock: its lease ended
            // (released, perhaps by an earlier attempt of this very call, or
            // expired and swept). The token is genuine (`HeldToken`), so it
            // was issued: releasing it again changes nothing.
            _ => Ok(()),
        }
    }

    pub async fn status(&self, lock: LockName) -> Result<LockStatus, EngineError> {
        let resp = self
            .txn(Txn::new().and_then(self.seeing(&lock, None)))
            .await?;
        let seen = self.seen(&resp, false)?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let now = clock::now();
        Ok(LockStatus {
            lease: seen
                .owner
                .map(|h| h.lease(&lock))
                .filter(|l| l.is_live(now)),
            // Every token issued so far is at most this (the store's
            // revision counts every write, not only grants).
            last_token: epoch_base(seen.epoch.unwrap_or(0).max(self.inner.epoch))
                | u64::try_from(revision).unwrap_or(0),
            waiting: seen.waiters,
        })
    }

    /// The locks `allow` admits that are held or waited for, in name
    /// order, at most `limit`, each with its status (for the status page:
    /// one range read of the keys, then one status read per lock shown).
    pub async fn list(
        &self,
        limit: usize,
        allow: &(dyn Fn(&LockName) -> bool + Send + Sync),
    ) -> Result<Vec<(LockName, LockStatus)>, EngineError> {
        let prefix = self.key("locks/");
        let resp = self
            .txn(Txn::new().and_then(vec![TxnOp::get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(LIST_KEYS_READ),
                ),
            )]))
            .await?;
        let mut locks = Vec::new();
        for op in resp.op_responses() {
            let TxnOpResponse::Get(g) = op else { continue };
            for kv in g.kvs() {
                let Ok(key) = std::str::from_utf8(kv.key()) else {
                    continue;
                };
                // `locks/<lock>/owner`, `.../expiry`, `.../wait/<id>`: a
                // lock name has no `/`, so the first segment is the lock.
                if let Some(name) = key
                    .strip_prefix(prefix.as_str())
                    .and_then(|rest| rest.split_once('/'))
                    .and_then(|(name, _)| LockName::new(name).ok())
                    .filter(|name| allow(name))
                {
                    locks.push(name);
                }
            }
        }
        locks.sort();
        locks.dedup();
        locks.truncate(limit);
        let mut listed = Vec::with_capacity(locks.len());
        for lock in locks {
            let status = self.status(lock.clone()).await?;
            if status.lease.is_some() || status.waiting > 0 {
                listed.push((lock, status));
            }
        }
        Ok(listed)
    }

    /// Writes a lease migrated from SQLite, keeping its token; `false` if
    /// the lock already has a record in etcd.
    pub async fn import(&self, lease: &Lease) -> Result<bool, EngineError> {
        let record = Record {
            owner: lease.owner.clone(),
            idempotency_sha256: lease.idempotency.map(|k| hex::encode(k.as_bytes())),
            epoch: self.inner.epoch,
            token: Some(lease.token),
            grant: grant_id()?,
        };
        let value = serde_json::to_vec(&record).map_err(|e| EngineError::Storage(e.to_string()))?;
        let resp = self
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        self.owner_key(&lease.lock),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([
                        TxnOp::put(self.owner_key(&lease.lock), value, None),
                        TxnOp::put(
                            self.expiry_key(&lease.lock),
                            expiry_value(lease.expires_at),
                            None,
                        ),
                    ]),
            )
            .await?;
        Ok(resp.succeeded())
    }

    /// Deletes the records of leases that expired unreleased, a page of
    /// expiry keys per etcd request; each deletion is a compare-and-delete,
    /// so replicas sweeping at once, or an acquire taking the lock, are
    /// safe. Returns how many it deleted.
    pub async fn sweep(&self) -> Result<usize, EngineError> {
        let prefix = self.key("expiry/");
        let end = self.key("expiry0"); // '/' + 1
        let mut from = prefix.clone();
        let mut deleted = 0;
        loop {
            let page = self
                .call(|mut c| {
                    let (from, end) = (from.clone(), end.clone());
                    async move {
                        c.get(
                            from,
                            Some(GetOptions::new().with_range(end).with_limit(SWEEP_PAGE)),
                        )
                        .await
                    }
                })
                .await?;
            let now = clock::now();
            for kv in page.kvs() {
                if expiry_of(kv) >= now {
                    continue;
                }
                let Some(lock) = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(prefix.as_str()))
                    .and_then(|l| LockName::new(l).ok())
                else {
                    continue;
                };
                let resp = self
                    .txn(
                        Txn::new()
                            .when([Compare::mod_revision(
                                self.expiry_key(&lock),
                                CompareOp::Equal,
                                kv.mod_revision(),
                            )])
                            .and_then([
                                TxnOp::delete(self.owner_key(&lock), None),
                                TxnOp::delete(self.expiry_key(&lock), None),
                            ]),
                    )
                    .await?;
                if resp.succeeded() {
                    deleted += 1;
                    self.inner.metrics.expiries.inc();
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    let mut next = last.key().to_vec();
                    next.push(0);
                    from = String::from_utf8(next).unwrap_or_default();
                }
                _ => return Ok(deleted),
            }
        }
    }

    /// Runs [`Self::sweep`] every `every` until the process ends.
    fn spawn_sweeper(&self, every: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = this.sweep().await {
                    tracing::warn!(error = %e, "sweeping expired leases failed; next try in {every:?}");
                }
            }
        });
    }
}

/// The lease of an owner key and its expiry key, as read.
fn held_of(
    owner: Option<&KeyValue>,
    expiry: Option<&KeyValue>,
) -> Result<Option<Held>, EngineError> {
    Ok(match owner {
        Some(kv) => Some(Held {
            record: record_of(kv)?,
            kv: kv.clone(),
            expiry: expiry.cloned(),
        }),
        None => None,
    })
}

/// Why a replica could not register its epoch.
enum Startup {
    /// etcd answered no: the configuration must change.
    Refused(anyhow::Error),
    /// etcd did not answer.
    Unavailable(String),
}

/// The ranges of every `get` in a transaction's answer, in order.
fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            _ => Vec::new(),
        })
        .collect()
}

/// A place in a lock's line: its key, kept alive while the acquire waits,
/// and removed when the acquire ends however it ends (granted, timed out,
/// or dropped because the client went away).
struct Place {
    leases: EtcdLeases,
    key: String,
    etcd_lease: i64,
    keeper: tokio::task::JoinHandle<()>,
}

impl Place {
    fn new(leases: EtcdLeases, key: String, etcd_lease: i64) -> Place {
        let l = leases.clone();
        let keeper = tokio::spawn(async move {
            // Each keep-alive is one call, failed over like any; a failed one
            // is followed by the next (see `waiter_ttl_s`); only etcd saying
            // the lease is gone ends the keeping.
            loop {
                tokio::time::sleep(WAITER_KEEPALIVE).await;
                if let Ok(false) = l.keep_alive(etcd_lease).await {
                    return;
                }
            }
        });
        Place {
            leases,
            key,
            etcd_lease,
            keeper,
        }
    }
}

impl Place {
    /// Removes the place now, before the caller answers (a drop removes it
    /// in the background).
    async fn leave(mut self) {
        self.keeper.abort();
        let (l, key, id) = (self.leases.clone(), self.key.clone(), self.etcd_lease);
        remove_place(&l, key, id).await;
        // Removed: disarm the drop (which still removes the place if this
        // is cancelled before).
        self.key.clear();
    }
}

/// Deletes a waiter's key and revokes its etcd lease.
async fn remove_place(leases: &EtcdLeases, key: String, id: i64) {
    let _ = leases
        .call(|mut c| {
            let key = key.clone();
            async move { c.delete(key, None).await }
        })
        .await;
    let _ = leases
        .call(|mut c| async move { c.lease_revoke(id).await })
        .await;
}

impl Drop for Place {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.key.is_empty() {
            return;
        }
        let (l, key, id) = (self.leases.clone(), self.key.clone(), self.etcd_lease);
        tokio::spawn(async move { remove_place(&l, key, id).await });
    }
}
