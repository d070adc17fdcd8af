//! Fences with an epoch barrier, one per lock (the gate keys them by the
//! scope's lock, so scopes sharing a lock share a fence; the code below
//! calls the key a "scope").
//!
//! Each fence has a max_token and an *epoch*: the set of writes admitted
//! under the current max. A write carrying token `t`:
//!
//! - `t < max`: refused as stale, with the max;
//! - `t == max`: joins the current epoch (a shared hold on the scope);
//! - `t > max`: opens a new epoch. The current epoch is cancelled (every
//!   in-flight write with the old token has its request body cut, so the
//!   store never commits it), the new epoch waits until all of them have let
//!   go (drained), the new max is fsync'd, and only then is `t` admitted.
//!
//! So once a higher token is admitted, no write with a lower token is still
//! running in that scope, and none can start: this is what stops a client
//! that paused in the middle of a large upload from landing its object after
//! the new holder.
//!
//! Writes of an earlier run of the process are in no epoch: a write the
//! store held when the proxy died may still commit after it is back (its
//! connection closed with the process; the store decides within
//! `store_decision_secs`). So after a run that did not end cleanly (see
//! `db`), no raise completes before `settled`, `store_decision_secs` after
//! the fences were loaded: a raise in the first seconds after such a start
//! waits out what the last run may have left in flight.
//!
//! The shared/exclusive hold is a fair `tokio::sync::RwLock`: a raise
//! waiting for the exclusive hold blocks new shared holds, which then see the
//! new max and are refused.
//!
//! The fences themselves live in a sharded concurrent map (`dashmap`):
//! finding the fence of a scope takes a shared hold on one shard's lock and
//! allocates nothing, so there is no process-wide lock on the admit path.
//! A scope's fence is inserted once, on its first admit, and never removed.
//! (`papaya`, lock-free, was tried first: in the growth bench its lookups
//! cost 2-2.5 times the old global mutex's at 10 000 to 100 000 scopes,
//! its entries being allocated apart from its table.)
//!
//! **With replicas** (`cluster`), the fences are the cluster's: the
//! replica protocol's state machine (`fencegate_core::replicas::Replica`)
//! keeps each lock's max, its writes in flight and its raises, and this
//! module only hands a write to it.

use crate::state::cluster::{Admitted, Cluster, ClusterWrite};
use crate::state::db::Db;
use crate::state_error::StateError;
use dashmap::DashMap;
use fencegate_core::fence::{Verdict, decide, reached};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{Mutex as AsyncMutex, OwnedRwLockReadGuard, RwLock};
use tokio_util::sync::CancellationToken;

/// The fence state of one scope.
#[derive(Debug)]
struct ScopeFence {
    max: AtomicU64,
    epoch: Arc<RwLock<()>>,
    /// Cancelled when a higher token arrives; replaced after the raise.
    cancel: Mutex<CancellationToken>,
    /// Serializes raises so two higher tokens do not interleave.
    raising: AsyncMutex<()>,
    /// The highest token that has started a raise (cut the epoch), even
    /// if it is not admitted yet: what a cut write is told it lost to.
    pending: AtomicU64,
}

impl ScopeFence {
    fn new(max: u64) -> ScopeFence {
        ScopeFence {
            max: AtomicU64::new(max),
            epoch: Arc::new(RwLock::new(())),
            cancel: Mutex::new(CancellationToken::new()),
            raising: AsyncMutex::new(()),
            pending: AtomicU64::new(max),
        }
    }

    fn current_cancel(&self) -> CancellationToken {
        self.cancel.lock().clone()
    }
}

/// What keeps a write in its epoch.
#[derive(Debug)]
enum Hold {
    /// One replica: a shared hold on the scope's epoch.
    Local(#[allow(dead_code, reason = "held for its drop")] OwnedRwLockReadGuard<()>),
    /// Replicas: the cluster machine's record of the write.
    Cluster(#[allow(dead_code, reason = "held for its drop")] ClusterWrite),
}

/// A write admitted into a scope's epoch. Hold it until the backend has
/// answered; dropping it lets a waiting raise proceed.
#[derive(Debug)]
pub struct Admission {
    _hold: Hold,
    cancel: CancellationToken,
    token: u64,
    raised: bool,
    waited: std::time::Duration,
}

impl Admission {
    /// Fires when a higher token wants in: abort the write.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The token admitted.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// True when this admission raised the scope's max.
    pub fn raised(&self) -> bool {
        self.raised
    }

    /// For a raise: how long it waited for the older epoch to let go.
    pub fn waited(&self) -> std::time::Duration {
        self.waited
    }
}

/// Why a write was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error("token {token} is below the scope's max {max}")]
    Stale { token: u64, max: u64 },
    #[error("cannot persist the new max token: {0}")]
    Storage(#[from] StateError),
    /// This replica cannot admit now (its cluster standing ran out, or the
    /// raise could not complete in the cluster).
    #[error(transparent)]
    Unavailable(#[from] crate::state::cluster::Unavailable),
}

/// Where maxes are kept.
#[derive(Debug, Clone)]
enum Durable {
    /// One replica: SQLite.
    Db(Db),
    /// Replicas: etcd, through the cluster protocol.
    Cluster(Cluster),
}

/// All scopes' fences.
#[derive(Debug, Clone)]
pub struct Fences {
    /// Read under a shard's shared lock; written once per scope (its
    /// first admit).
    scopes: Arc<DashMap<String, Arc<ScopeFence>>>,
    durable: Durable,
    /// Until when a write of the process's last run may still commit.
    settled: tokio::time::Instant,
    /// The least max of every scope (`--token-floor` of a database
    /// re-created after a loss): a scope it never saw starts there.
    floor: u64,
}

impl Fences {
    /// Loads every persisted max from `db`. A write the process's last run
    /// left in flight may commit for up to `store_decision` from now: no
    /// raise completes before then.
    pub fn load(db: Db, store_decision: std::time::Duration) -> anyhow::Result<Fences> {
        let scopes = DashMap::new();
        let floor = db.floor()?;
        for (scope, max) in db.load_fences()? {
            scopes.insert(scope, Arc::new(ScopeFence::new(max.max(floor))));
        }
        Ok(Fences {
            scopes: Arc::new(scopes),
            durable: Durable::Db(db),
            settled: tokio::time::Instant::now() + store_decision,
            floor,
        })
    }

    /// Fences kept in the cluster: empty until `Cluster::start` loads them.
    /// (A replica's predecessors are waited out by the raise protocol, per
    /// member, so there is no settling time here.)
    pub fn shared(cluster: Cluster) -> Fences {
        Fences {
            scopes: Arc::new(DashMap::new()),
            durable: Durable::Cluster(cluster),
            settled: tokio::time::Instant::now(),
            floor: 0,
        }
    }

    /// The cluster, if the fences are shared.
    pub fn cluster(&self) -> Option<&Cluster> {
        match &self.durable {
            Durable::Cluster(c) => Some(c),
            Durable::Db(_) => None,
        }
    }

    /// A check for each body chunk: `None` with one replica.
    pub fn standing_check(&self) -> Option<Cluster> {
        self.cluster().cloned()
    }

    /// Whether every write the process's last run may have left in flight
    /// can no longer land.
    pub fn settled(&self) -> bool {
        tokio::time::Instant::now() >= self.settled
    }

    /// The fence of `id`, created (max 0) on first use. Only a scope that
    /// is not there yet costs an allocation (its name).
    fn scope(&self, id: &str) -> Arc<ScopeFence> {
        if let Some(f) = self.scopes.get(id) {
            return f.value().clone();
        }
        // Two first admits may race here: one insert wins and both get it.
        self.scopes
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(ScopeFence::new(self.floor)))
            .value()
            .clone()
    }

    /// The current max of `scope` (0 if it never admitted a write). Asking
    /// allocates nothing: refused requests naming made-up scopes leave no
    /// trace.
    pub fn max(&self, scope: &str) -> u64 {
        if let Durable::Cluster(c) = &self.durable {
            return c.max(scope);
        }
        self.scopes
            .get(scope)
            .map_or(self.floor, |f| f.max.load(Ordering::Acquire))
    }

    /// Whether `scope` has a fence (it admitted a write, now or before a
    /// restart).
    pub fn known(&self, scope: &str) -> bool {
        if let Durable::Cluster(c) = &self.durable {
            return c.known(scope);
        }
        self.scopes.contains_key(scope)
    }

    /// The token a write cut in `scope` lost to: the highest token that
    /// started a raise there (at least the max).
    pub fn cut_by(&self, scope: &str) -> u64 {
        if let Durable::Cluster(c) = &self.durable {
            // A raise sets the max before it is sent.
            return c.max(scope);
        }
        self.scopes.get(scope).map_or(0, |f| {
            f.pending
                .load(Ordering::Acquire)
                .max(f.max.load(Ordering::Acquire))
        })
    }

    /// With one proxy: waits for a raise in progress in `scope` to end,
    /// then the max (raised, or left as it was if the raise failed). With
    /// replicas, `None`: the cluster's raise is decided by its protocol.
    pub async fn after_raise(&self, scope: &str) -> Option<u64> {
        if self.cluster().is_some() {
            return None;
        }
        let fence = self.scopes.get(scope).map(|f| f.value().clone())?;
        // A raiser holds `raising` from before it cuts the epoch until its
        // outcome is stored: whoever it cut waits for that here.
        let _settled = fence.raising.lock().await;
        Some(fence.max.load(Ordering::Acquire))
    }

    /// Number of scopes with a fence.
    pub fn len(&self) -> usize {
        if let Durable::Cluster(c) = &self.durable {
            return c.snapshot().len();
        }
        self.scopes.len()
    }

    /// True when no scope has a fence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every scope and its max, sorted by scope.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        if let Durable::Cluster(c) = &self.durable {
            return c.snapshot();
        }
        let mut v: Vec<_> = self
            .scopes
            .iter()
            .map(|e| (e.key().clone(), e.value().max.load(Ordering::Acquire)))
            .collect();
        v.sort();
        v
    }

    /// Admits a write with `token` into `scope`, raising the max (after
    /// draining the older epoch) when `token` is higher.
    pub async fn admit(&self, scope: &str, token: u64) -> Result<Admission, FenceError> {
        let db = match &self.durable {
            Durable::Db(db) => db,
            Durable::Cluster(c) => {
                let started = std::time::Instant::now();
                return match c.admit(scope, token).await {
                    Admitted::Yes {
                        write,
                        cancel,
                        raised,
                    } => Ok(Admission {
                        _hold: Hold::Cluster(write),
                        cancel,
                        token,
                        raised,
                        waited: if raised {
                            started.elapsed()
                        } else {
                            std::time::Duration::ZERO
                        },
                    }),
                    Admitted::Stale { max } => Err(FenceError::Stale { token, max }),
                    Admitted::Unavailable(why) => Err(why.into()),
                };
            }
        };
        let fence = self.scope(scope);
        let mut raised = false;
        let mut waited = std::time::Duration::ZERO;
        loop {
            match decide(fence.max.load(Ordering::Acquire), token) {
                Verdict::Stale { max } => return Err(FenceError::Stale { token, max }),
                Verdict::Admit { raises: false } => {
                    let hold = fence.epoch.clone().read_owned().await;
                    // A raise may have completed while we waited in line:
                    // decided again on the max that holds now.
                    match decide(fence.max.load(Ordering::Acquire), token) {
                        Verdict::Stale { max } => return Err(FenceError::Stale { token, max }),
                        Verdict::Admit { raises: true } => {
                            drop(hold);
                            continue;
                        }
                        Verdict::Admit { raises: false } => {}
                    }
                    return Ok(Admission {
                        _hold: Hold::Local(hold),
                        cancel: fence.current_cancel(),
                        token,
                        raised,
                        waited,
                    });
                }
                Verdict::Admit { raises: true } => {
                    // Higher than the max.
                    let _raising = fence.raising.lock().await;
                    // Every write of the last run first (see the module
                    // doc), before this epoch is cut: its writes go on
                    // meanwhile.
                    tokio::time::sleep_until(self.settled).await;
                    if reached(fence.max.load(Ordering::Acquire), token) {
                        continue;
                    }
                    // Cut every write of the old epoch, wait for them to let
                    // go, then make the new max durable before anyone sees it.
                    fence.pending.fetch_max(token, Ordering::AcqRel);
                    fence.current_cancel().cancel();
                    let cut_at = std::time::Instant::now();
                    let exclusive = fence.epoch.write().await;
                    waited = cut_at.elapsed();
                    let persisted = {
                        let (db, id) = (db.clone(), scope.to_owned());
                        crate::state_error::blocking(move || Ok(db.raise(&id, token)?)).await
                    };
                    if persisted.is_ok() {
                        fence.max.store(token, Ordering::Release);
                    } else {
                        // Not admitted: a later cut must not name it.
                        fence
                            .pending
                            .store(fence.max.load(Ordering::Acquire), Ordering::Release);
                    }
                    // Either way the old epoch is over: writes admitted from
                    // now on get a fresh cancellation.
                    *fence.cancel.lock() = CancellationToken::new();
                    drop(exclusive);
                    persisted?;
                    raised = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fences() -> (tempfile::TempDir, Fences) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(
            &dir.path().join("f.db"),
            fencegate_durable::Opening::CreateIfMissing,
            0,
        )
        .expect("db");
        (dir, Fences::load(db, Duration::ZERO).expect("load"))
    }

    #[tokio::test]
    async fn equal_admits_lower_is_stale_higher_raises() {
        let (_d, f) = fences();
        let a = f.admit("s", 3).await.expect("first");
        assert!(a.raised);
        drop(a);
        for _ in 0..3 {
            assert!(!f.admit("s", 3).await.expect("equal").raised);
        }
        assert!(matches!(
            f.admit("s", 2).await,
            Err(FenceError::Stale { token: 2, max: 3 })
        ));
        assert!(f.admit("s", 4).await.expect("higher").raised);
        assert_eq!(f.max("s"), 4);
        assert_eq!(f.max("other"), 0);
    }

    #[tokio::test]
    async fn a_raise_cancels_and_drains_the_old_epoch_first() {
        let (_d, f) = fences();
        let old = f.admit("s", 1).await.expect("admitted");
        let cancel = old.cancel.clone();
        let f2 = f.clone();
        let raise = tokio::spawn(async move { f2.admit("s", 2).await.map(|a| a.token()) });
        // The raise cancels the old write and then waits for it.
        tokio::time::timeout(Duration::from_secs(5), cancel.cancelled())
            .await
            .expect("old epoch cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !raise.is_finished(),
            "the raise waits for the old write to drain"
        );
        assert_eq!(f.max("s"), 1, "the new max is not visible before the drain");
        drop(old);
        assert_eq!(raise.await.expect("joined").expect("admitted"), 2);
        assert!(matches!(
            f.admit("s", 1).await,
            Err(FenceError::Stale { max: 2, .. })
        ));
    }

    #[tokio::test]
    async fn after_an_unclean_run_raises_wait_until_settled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f.db");
        let settle = Duration::from_millis(400);
        let f = Fences::load(
            Db::open(&path, fencegate_durable::Opening::CreateIfMissing, 0).expect("db"),
            settle,
        )
        .expect("load");
        let start = tokio::time::Instant::now();
        let a = f.admit("s", 1).await.expect("raised");
        assert!(a.raised);
        assert!(
            start.elapsed() >= settle,
            "the raise completed after {:?}",
            start.elapsed()
        );
        drop(a);
        // Settled: neither joining the epoch nor the next raise waits.
        let later = tokio::time::Instant::now();
        drop(f.admit("s", 1).await.expect("joined"));
        drop(f.admit("s", 2).await.expect("raised"));
        assert!(later.elapsed() < settle, "{:?}", later.elapsed());
    }

    #[tokio::test]
    async fn max_survives_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f.db");
        {
            let f = Fences::load(
                Db::open(&path, fencegate_durable::Opening::CreateIfMissing, 0).expect("db"),
                Duration::ZERO,
            )
            .expect("load");
            drop(f.admit("s", 9).await.expect("admitted"));
        }
        let f = Fences::load(
            Db::open(&path, fencegate_durable::Opening::CreateIfMissing, 0).expect("db"),
            Duration::ZERO,
        )
        .expect("load");
        assert_eq!(f.max("s"), 9);
    }

    #[tokio::test]
    async fn asking_about_unknown_scopes_creates_nothing() {
        let (_d, f) = fences();
        assert_eq!(f.max("made-up"), 0);
        assert!(!f.known("made-up"));
        assert_eq!(f.cut_by("made-up"), 0);
        assert!(f.is_empty(), "max, known and cut_by insert nothing");
        assert!(f.snapshot().is_empty());
        drop(f.admit("real", 1).await.expect("admitted"));
        assert!(f.known("real"));
        assert_eq!(f.snapshot(), vec![("real".to_owned(), 1)]);
        assert!(matches!(
            f.admit("made-up", 0).await,
            Ok(Admission { raised: false, .. })
        ));
        assert_eq!(f.len(), 2, "an admit does create its scope's fence");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_first_admits_share_one_fence() {
        let (_d, f) = fences();
        for round in 1..=20u64 {
            let scope = format!("s{round}");
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let (f, scope) = (f.clone(), scope.clone());
                    tokio::spawn(async move { f.admit(&scope, 5).await.map(|a| a.raised) })
                })
                .collect();
            let mut raised = 0;
            for t in tasks {
                raised += usize::from(t.await.expect("joined").expect("admitted"));
            }
            assert_eq!(raised, 1, "exactly one admit raised {scope}");
            assert_eq!(f.max(&scope), 5);
        }
        assert_eq!(f.len(), 20);
    }

    #[tokio::test]
    async fn a_raise_waiting_in_one_scope_does_not_hold_up_another() {
        let (_d, f) = fences();
        let old = f.admit("a", 1).await.expect("admitted");
        let f2 = f.clone();
        let raise = tokio::spawn(async move { f2.admit("a", 2).await.map(|a| a.token()) });
        tokio::time::timeout(Duration::from_secs(5), old.cancel.cancelled())
            .await
            .expect("old epoch cancelled");
        // "a" is mid-raise, waiting for `old`; "b" is admitted and raised.
        for t in [1, 1, 2] {
            tokio::time::timeout(Duration::from_secs(5), f.admit("b", t))
                .await
                .expect("not held up by a's raise")
                .expect("admitted");
        }
        assert!(!raise.is_finished());
        drop(old);
        assert_eq!(raise.await.expect("joined").expect("admitted"), 2);
        assert_eq!(f.snapshot(), vec![("a".to_owned(), 2), ("b".to_owned(), 2)]);
    }
}
