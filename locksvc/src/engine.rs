//! The engine: one thread that owns the lock table and the database.
//!
//! Every request becomes a [`Command`] on a channel. The engine thread takes
//! whatever has queued up (a batch), applies it to the in-memory
//! [`LockTable`] in arrival order, writes the changed rows in one SQLite
//! transaction, and only then answers. Concurrent grants therefore share one
//! fsync (group commit) instead of queuing one fsync each, and no answer ever
//! reveals state that is not yet on disk.
//!
//! The engine also keeps, per lock, the line of acquires that asked to wait
//! (`fencegate_core::line`, which owns the order and the deadlines).
//! When a lease is released or expires, the first live waiter in line gets
//! the lock in the same batch, so waiters are served in arrival order and a
//! newcomer cannot jump the line. A waiter's grant is answered on that
//! waiter's own reply channel only: no other request ever sees it.
//!
//! The engine acts on token numbers. Renew and release reach it only with a
//! [`HeldToken`], which `proof` hands out after checking the signed token
//! for the request's lock: the engine cannot be asked to act on a bare
//! number (design rule 7).

use crate::clock;
use crate::leases::{Acquire, EngineError, LeaseStore, LockFilter, LockStatus, StorageError};
use crate::metrics::Metrics;
use crate::proof::HeldToken;
use crate::store::{Durability, LeaseRow, Store};
use fencegate_core::line::{LineFull, Lines, Served, Waiter};
use fencegate_core::{AcquireStep, Grant, Held, Lease, LockName, LockTable, Timestamp};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How often expired leases are purged even when nothing else happens.
const PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// Most commands applied in one group commit.
const MAX_BATCH: usize = 4096;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// A request to the engine.
#[derive(Debug)]
pub enum Command {
    Acquire {
        acquire: Acquire,
        reply: Reply<Lease>,
    },
    Renew {
        held: HeldToken,
        ttl: Duration,
        reply: Reply<Lease>,
    },
    Release {
        held: HeldToken,
        reply: Reply<()>,
    },
    Status {
        lock: LockName,
        reply: Reply<LockStatus>,
    },
    /// The locks held or waited for that `allow` admits, by name, at most
    /// `limit`.
    List {
        limit: usize,
        allow: LockFilter,
        reply: Reply<Vec<(LockName, LockStatus)>>,
    },
    Stop,
}

/// The refusal metric's reason for a waiter that could not join a line.
pub fn refusal_reason(full: LineFull) -> &'static str {
    match full {
        LineFull::Line { .. } => "too_many_waiters",
        LineFull::Share { .. } => "waiter_share_used",
    }
}

/// An answer held back until its batch is committed.
enum Pending {
    Lease(Reply<Lease>, Result<Lease, EngineError>),
    Unit(Reply<()>, Result<(), EngineError>),
    Status(Reply<LockStatus>, LockStatus),
    List(
        Reply<Vec<(LockName, LockStatus)>>,
        Vec<(LockName, LockStatus)>,
    ),
}

impl Pending {
    /// Sends the answer; if the commit failed, every answer becomes a
    /// storage error. Refusals too: they were decided on the batch's state,
    /// which the failed commit rolled back, so "held by X with token N" may
    /// name a grant that never happened, and "lease lost" may follow a
    /// release that never happened.
    ///
    /// A lease whose time ran out while its commit was on its way to disk
    /// (a stalled disk) is not answered as granted: its holder would start
    /// work under a lease already over. It is a storage error (retry).
    fn send(self, commit: &Result<(), String>, committed_at: Timestamp) {
        let fail = |e: &String| EngineError::from(StorageError::Commit(e.clone()));
        match self {
            Pending::Lease(tx, r) => {
                let _ = tx.send(match (commit, r) {
                    (Ok(()), Ok(lease)) if lease.expires_at <= committed_at => {
                        Err(EngineError::from(StorageError::CommittedTooLate {
                            lock: lease.lock,
                            token: lease.token,
                        }))
                    }
                    (Ok(()), r) => r,
                    (Err(e), _) => Err(fail(e)),
                });
            }
            Pending::Unit(tx, r) => {
                let _ = tx.send(match commit {
                    Ok(()) => r,
                    Err(e) => Err(fail(e)),
                });
            }
            Pending::Status(tx, s) => {
                let _ = tx.send(match commit {
                    Ok(()) => Ok(s),
                    Err(e) => Err(fail(e)),
                });
            }
            Pending::List(tx, l) => {
                let _ = tx.send(match commit {
                    Ok(()) => Ok(l),
                    Err(e) => Err(fail(e)),
                });
            }
        }
    }
}

/// What one batch changes and answers.
#[derive(Default)]
struct Batch {
    rows: Vec<LeaseRow>,
    replies: Vec<Pending>,
    durability: Option<Durability>,
}

impl Batch {
    fn needs(&mut self, d: Durability) {
        self.durability = match (self.durability, d) {
            (Some(Durability::Fsync), _) | (_, Durability::Fsync) => Some(Durability::Fsync),
            _ => Some(Durability::Written),
        };
    }
}

/// Whether the last commit succeeded: the service's readiness (what a
/// load balancer should watch; `/health` stays liveness).
#[derive(Debug, Default)]
pub struct Readiness {
    problem: parking_lot::Mutex<Option<String>>,
}

impl Readiness {
    /// Why the service is not ready, if it is not.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().clone()
    }

    fn set(&self, problem: Option<String>) {
        *self.problem.lock() = problem;
    }
}

/// The running engine thread.
#[derive(Debug)]
pub struct Engine {
    handle: EngineHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A cheap, cloneable way to send the engine requests.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    readiness: Arc<Readiness>,
    /// Longest a call waits for the engine beyond its own wait.
    storage_timeout: Duration,
}

impl Engine {
    /// Loads the durable state from `store` and starts the engine thread.
    /// `max_waiters` bounds the line of waiting acquires per lock.
    pub fn start(
        store: Store,
        metrics: Arc<Metrics>,
        max_waiters: usize,
        storage_timeout: Duration,
    ) -> anyhow::Result<Engine> {
        let (counter, leases) = store.load()?;
        if store.created() {
            tracing::warn!(
                last_token = counter,
                "created a new lease database (--create-db): tokens start above {counter}"
            );
        }
        anyhow::ensure!(
            counter < fencegate_core::lease::MAX_TOKEN,
            "the lease database says {counter} tokens were issued, the most there can be; refusing to start (is the database damaged?)"
        );
        let now = clock::now();
        let live = leases.iter().filter(|l| l.is_live(now)).count();
        tracing::info!(
            last_token = counter,
            live_leases = live,
            "lease state loaded; live leases keep their remaining time"
        );
        let table = LockTable::restore(counter, leases);
        metrics
            .last_token
            .set(i64::try_from(table.counter()).unwrap_or(i64::MAX));
        let (tx, rx) = mpsc::channel();
        let readiness = Arc::new(Readiness::default());
        let state = EngineState {
            table,
            store,
            lines: Lines::new(max_waiters),
            metrics,
            last_purge: now,
            readiness: readiness.clone(),
            failures: fencegate_durable::Throttle::default(),
        };
        let thread = std::thread::Builder::new()
            .name("locksvc-engine".into())
            .spawn(move || state.run(rx))?;
        Ok(Engine {
            handle: EngineHandle {
                tx,
                readiness,
                storage_timeout,
            },
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stops the engine after the commands already queued.
    pub fn stop(mut self) {
        let _ = self.handle.tx.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EngineHandle {
    /// Whether the last commit succeeded.
    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.readiness
    }

    /// Sends a command and waits for its answer, at most `wait` plus the
    /// storage timeout: a stalled disk answers 503, and a command the
    /// engine had not applied when its caller gave up is dropped.
    async fn call<T>(
        &self,
        wait: Duration,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| EngineError::Stopped)?;
        match tokio::time::timeout(wait + self.storage_timeout, rx).await {
            Ok(answer) => answer.map_err(|_| EngineError::Stopped)?,
            Err(_) => Err(StorageError::Stalled(self.storage_timeout).into()),
        }
    }
}

impl LeaseStore for EngineHandle {
    async fn acquire(&self, acquire: Acquire) -> Result<Lease, EngineError> {
        self.call(acquire.wait, |reply| Command::Acquire { acquire, reply })
            .await
    }

    async fn renew(&self, held: HeldToken, ttl: Duration) -> Result<Lease, EngineError> {
        self.call(Duration::ZERO, |reply| Command::Renew { held, ttl, reply })
            .await
    }

    async fn release(&self, held: HeldToken) -> Result<(), EngineError> {
        self.call(Duration::ZERO, |reply| Command::Release { held, reply })
            .await
    }

    async fn status(&self, lock: LockName) -> Result<LockStatus, EngineError> {
        self.call(Duration::ZERO, |reply| Command::Status { lock, reply })
            .await
    }

    async fn list(
        &self,
        limit: usize,
        allow: LockFilter,
    ) -> Result<Vec<(LockName, LockStatus)>, EngineError> {
        self.call(Duration::ZERO, |reply| Command::List {
            limit,
            allow,
            reply,
        })
        .await
    }
}

struct EngineState {
    table: LockTable,
    store: Store,
    lines: Lines<Reply<Lease>>,
    metrics: Arc<Metrics>,
    last_purge: Timestamp,
    readiness: Arc<Readiness>,
    /// Failed commits logged at most once a second.
    failures: fencegate_durable::Throttle,
}

impl EngineState {
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let mut batch_cmds = Vec::new();
        loop {
            let now = clock::now();
            let timeout = now.until(self.next_wake(now));
            match rx.recv_timeout(timeout) {
                Ok(cmd) => batch_cmds.push(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while batch_cmds.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch_cmds.push(cmd),
                    Err(_) => break,
                }
            }
            let stop = batch_cmds.iter().any(|c| matches!(c, Command::Stop));
            self.step(batch_cmds.drain(..), clock::now());
            if stop {
                return;
            }
        }
    }

    /// One group commit at `now`: serves the lines of leases that ended,
    /// applies `cmds` in arrival order, commits, then answers.
    fn step(&mut self, cmds: impl ExactSizeIterator<Item = Command>, now: Timestamp) {
        let mut batch = Batch::default();
        self.expire(now, &mut batch);
        let n = cmds.len();
        for cmd in cmds {
            self.apply(cmd, now, &mut batch);
        }
        if n > 0 {
            self.metrics.batch_size.observe(n as f64);
        }
        // Not ready: commit something (the counter) at least once a wake,
        // so that readiness comes back with the disk even when no client
        // asks (a load balancer sends none to a service it took out).
        if batch.durability.is_none() && self.readiness.problem().is_some() {
            batch.needs(Durability::Written);
        }
        self.commit(batch, now);
    }

    /// When the engine must wake even if no request arrives: the next purge,
    /// the expiry of a lease somebody waits for, or a waiter's deadline.
    fn next_wake(&self, now: Timestamp) -> Timestamp {
        let purge = self.last_purge.saturating_add(PURGE_INTERVAL).max(now);
        self.lines
            .next_wake(&self.table, now)
            .map_or(purge, |w| w.min(purge))
    }

    /// Serves waiters on locks whose lease ended, times out waiters, and
    /// periodically forgets expired leases.
    fn expire(&mut self, now: Timestamp, batch: &mut Batch) {
        for lock in self.lines.locks() {
            self.serve_waiters(&lock, now, batch);
        }
        if now >= self.last_purge.saturating_add(PURGE_INTERVAL) {
            self.last_purge = now;
            let expired = self.table.purge_expired(now);
            if !expired.is_empty() {
                self.metrics.expiries.inc_by(expired.len() as u64);
                batch.needs(Durability::Written);
                batch.rows.extend(expired.into_iter().map(LeaseRow::Delete));
            }
        }
    }

    /// Serves `lock`'s line (see `fencegate_core::line`): a grant to the
    /// first waiter if the lock is free, answers to waiters whose deadline
    /// passed; waiters whose client went away leave without one.
    fn serve_waiters(&mut self, lock: &LockName, now: Timestamp, batch: &mut Batch) {
        let served = self
            .lines
            .serve(lock, &mut self.table, now, |reply| reply.is_closed());
        for s in served {
            match s {
                Served::Granted(reply, grant) => {
                    let lease = self.record(grant, batch);
                    batch.replies.push(Pending::Lease(reply, Ok(lease)));
                }
                Served::TimedOut { reply, holder } => {
                    self.metrics.refused("held_after_wait");
                    batch
                        .replies
                        .push(Pending::Lease(reply, Err(EngineError::Held { holder })));
                }
            }
        }
        self.metrics.waiting.set(self.lines.waiting() as i64);
    }

    /// Counts a grant and puts its row in the batch, durable as it needs.
    fn record(&mut self, grant: Grant, batch: &mut Batch) -> Lease {
        if grant.new_token {
            self.metrics.grants.inc();
            batch.needs(Durability::Fsync);
        } else {
            self.metrics.renewals.inc();
            batch.needs(Durability::Written);
        }
        batch.rows.push(LeaseRow::Put(grant.lease.clone()));
        grant.lease
    }

    /// What the table's answer to an acquire becomes: a grant recorded in
    /// `batch`, or the holder's refusal.
    fn granted(
        &mut self,
        answer: Result<Grant, Held>,
        batch: &mut Batch,
    ) -> Result<Lease, EngineError> {
        match answer {
            Ok(grant) => Ok(self.record(grant, batch)),
            Err(held) => Err(EngineError::Held {
                holder: held.holder,
            }),
        }
    }

    fn apply(&mut self, cmd: Command, now: Timestamp, batch: &mut Batch) {
        // Its caller gave up (storage_timeout) before it was applied: a
        // grant nobody will be told of would hold the lock for nothing.
        if let Command::Acquire { reply, .. } = &cmd
            && reply.is_closed()
        {
            return;
        }
        match cmd {
            Command::Acquire {
                acquire:
                    Acquire {
                        lock,
                        owner,
                        key,
                        ttl,
                        wait,
                        party,
                    },
                reply,
            } => {
                // Someone already in line goes first: a newcomer must queue
                // behind them (or be refused). Serving the line first means
                // a lock with a line is never free when a newcomer is
                // decided: its first waiter holds it. So "free" below means
                // "free and nobody waiting", and every refusal names the
                // lease that is really live. Only the live holder itself,
                // proven by its idempotency key, is not a newcomer.
                self.serve_waiters(&lock, now, batch);
                let live = self.table.live(&lock, now);
                match (
                    AcquireStep::of(live.as_ref(), &owner, key.as_ref(), now),
                    live,
                ) {
                    (AcquireStep::Held, Some(holder)) => {
                        if wait.is_zero() {
                            self.metrics.refused("held");
                            batch
                                .replies
                                .push(Pending::Lease(reply, Err(EngineError::Held { holder })));
                            return;
                        }
                    }
                    // Free (so the line is empty), or the holder's own retry.
                    _ => {
                        let answer = self.table.acquire(&lock, &owner, key, ttl, now);
                        let result = self.granted(answer, batch);
                        batch.replies.push(Pending::Lease(reply, result));
                        return;
                    }
                }
                let waiter = Waiter {
                    owner,
                    party,
                    key,
                    ttl,
                    deadline: now.saturating_add(wait),
                    reply,
                };
                match self.lines.join(lock, waiter) {
                    Ok(()) => {
                        self.metrics.waiting.set(self.lines.waiting() as i64);
                    }
                    Err((full, waiter)) => {
                        self.metrics.refused(refusal_reason(full));
                        batch.replies.push(Pending::Lease(
                            waiter.reply,
                            Err(EngineError::TooManyWaiters(full)),
                        ));
                    }
                };
            }
            Command::Renew { held, ttl, reply } => {
                let (lock, token) = (held.lock(), held.token());
                let result = match self.table.renew(lock, token, ttl, now) {
                    Ok(lease) => {
                        self.metrics.renewals.inc();
                        batch.needs(Durability::Written);
                        batch.rows.push(LeaseRow::Put(lease.clone()));
                        Ok(lease)
                    }
                    Err(e) => {
                        self.metrics.refused("lease_lost");
                        Err(EngineError::NotHolder { current: e.current })
                    }
                };
                batch.replies.push(Pending::Lease(reply, result));
            }
            Command::Release { held, reply } => {
                let (lock, token) = (held.lock(), held.token());
                let result = match self.table.release(lock, token, now) {
                    Ok(()) => {
                        self.metrics.releases.inc();
                        batch.needs(Durability::Written);
                        batch.rows.push(LeaseRow::Delete(lock.clone()));
                        self.serve_waiters(lock, now, batch);
                        Ok(())
                    }
                    Err(e) => {
                        self.metrics.refused("not_holder");
                        Err(EngineError::NotHolder { current: e.current })
                    }
                };
                batch.replies.push(Pending::Unit(reply, result));
            }
            Command::Status { lock, reply } => {
                let status = LockStatus {
                    lease: self.table.live(&lock, now),
                    last_token: self.table.counter(),
                    waiting: self.lines.len(&lock),
                };
                batch.replies.push(Pending::Status(reply, status));
            }
            Command::List {
                limit,
                allow,
                reply,
            } => {
                let mut locks: Vec<LockName> = self
                    .table
                    .live_locks(now)
                    .filter(|l| (allow.0)(l))
                    .cloned()
                    .collect();
                locks.extend(self.lines.locks().into_iter().filter(|l| (allow.0)(l)));
                locks.sort();
                locks.dedup();
                locks.truncate(limit);
                let listed = locks
                    .into_iter()
                    .map(|lock| {
                        let status = LockStatus {
                            lease: self.table.live(&lock, now),
                            last_token: self.table.counter(),
                            waiting: self.lines.len(&lock),
                        };
                        (lock, status)
                    })
                    .collect();
                batch.replies.push(Pending::List(reply, listed));
            }
            Command::Stop => {}
        }
    }

    /// Writes the batch, then sends its answers. On a failed commit every
    /// answer in the batch is a storage error and the
    /// in-memory state is reloaded from disk, so memory never runs ahead of
    /// what a restart would see.
    fn commit(&mut self, batch: Batch, now: Timestamp) {
        // The batch's time, moved on by how long the commit took (the
        // same clock the batch was decided on: manual in tests).
        let began = Instant::now();
        let result = match batch.durability {
            None => Ok(()),
            Some(durability) => {
                let started = Instant::now();
                let r = self
                    .store
                    .commit(self.table.counter(), &batch.rows, durability)
                    .map_err(|e| e.to_string());
                if durability == Durability::Fsync {
                    self.metrics
                        .fsync_seconds
                        .observe(started.elapsed().as_secs_f64());
                }
                r
            }
        };
        match &result {
            Ok(()) => {
                self.metrics
                    .last_token
                    .set(i64::try_from(self.table.counter()).unwrap_or(i64::MAX));
                if batch.durability.is_some() {
                    self.readiness.set(None);
                    self.failures.reset();
                }
            }
            Err(e) => {
                self.readiness
                    .set(Some(format!("the last commit failed: {e}")));
                if let Some(held_back) = self.failures.ready() {
                    tracing::error!(error = %e, not_logged = held_back, "lease database commit failed; answering 503 (logged at most once a second)");
                }
                // A lost file is not read back: what has the name now is
                // not this service's state.
                if self.store.lost().is_none() {
                    match self.store.load() {
                        Ok((counter, leases)) => self.table = LockTable::restore(counter, leases),
                        Err(e) => tracing::error!(error = %e, "reload after failed commit failed"),
                    }
                }
            }
        }
        let took = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let committed_at = Timestamp(now.0.saturating_add(took));
        for reply in batch.replies {
            reply.send(&result, committed_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencegate_core::line::Party;

    type LeaseReply = oneshot::Receiver<Result<Lease, EngineError>>;

    const T0: Timestamp = Timestamp(1_000_000);

    fn engine(dir: &std::path::Path) -> EngineState {
        engine_with(dir, 16)
    }

    /// An engine whose lines hold `max_waiters` each.
    fn engine_with(dir: &std::path::Path, max_waiters: usize) -> EngineState {
        EngineState {
            table: LockTable::new(),
            store: Store::open(
                &dir.join("locksvc.db"),
                fencegate_durable::Opening::CreateIfMissing,
                0,
            )
            .expect("store"),
            lines: Lines::new(max_waiters),
            metrics: Arc::new(Metrics::new()),
            last_purge: T0,
            readiness: Arc::default(),
            failures: fencegate_durable::Throttle::default(),
        }
    }

    fn acquire(owner: &str, ttl_ms: u64, wait_ms: u64) -> (Command, LeaseReply) {
        acquire_as(owner, owner, ttl_ms, wait_ms)
    }

    /// An acquire by `owner` on behalf of `party`.
    fn acquire_as(party: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> (Command, LeaseReply) {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Acquire {
            acquire: Acquire {
                lock: LockName::new("l").expect("lock name"),
                owner: owner.to_owned(),
                key: None,
                ttl: Duration::from_millis(ttl_ms),
                wait: Duration::from_millis(wait_ms),
                party: Party::new(party),
            },
            reply,
        };
        (cmd, rx)
    }

    fn answer(rx: &mut LeaseReply) -> Result<Lease, EngineError> {
        rx.try_recv().expect("answered")
    }

    #[test]
    fn a_newcomer_is_decided_after_the_line_of_an_ended_lease_is_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut st = engine(dir.path());
        let (a, mut a_rx) = acquire("A", 1000, 0);
        st.step([a].into_iter(), T0);
        let a = answer(&mut a_rx).expect("A granted");
        let (b, mut b_rx) = acquire("B", 1000, 60_000);
        st.step([b].into_iter(), T0);
        assert!(b_rx.try_recv().is_err(), "B waits in line");

        // A's lease has ended and B is still in line when C arrives (the
        // engine had not woken for the expiry yet): B goes first, and C is
        // refused naming B, the lease that is really live.
        let later = T0.saturating_add(Duration::from_millis(1500));
        let (c, mut c_rx) = acquire("C", 1000, 0);
        let mut batch = Batch::default();
        st.apply(c, later, &mut batch);
        st.commit(batch, later);
        let b = answer(&mut b_rx).expect("B granted");
        assert!(b.token > a.token);
        match answer(&mut c_rx) {
            Err(EngineError::Held { holder }) => assert_eq!(holder, b),
            other => panic!("C must be refused naming B: {other:?}"),
        }
        assert!(
            st.metrics
                .encode()
                .lines()
                .any(|l| l == "fencegate_locksvc_refusals_total{reason=\"held\"} 1"),
            "{}",
            st.metrics.encode()
        );
    }

    #[test]
    fn max_waiters_wait_the_next_is_refused_and_one_party_holds_only_its_share() {
        let dir = tempfile::tempdir().expect("tempdir");
        // max 2: two acquires wait, whoever they are, and a third is
        // refused (as on etcd: `line::admit` decides on both).
        let mut st = engine_with(dir.path(), 2);
        let (a, mut a_rx) = acquire("A", 60_000, 0);
        st.step([a].into_iter(), T0);
        answer(&mut a_rx).expect("A holds the lock");
        let (b, mut b_rx) = acquire("B", 1000, 60_000);
        let (c, mut c_rx) = acquire("C", 1000, 60_000);
        let (d, mut d_rx) = acquire("D", 1000, 60_000);
        st.step([b, c, d].into_iter(), T0);
        assert!(b_rx.try_recv().is_err(), "B waits");
        assert!(c_rx.try_recv().is_err(), "C waits");
        assert_eq!(
            answer(&mut d_rx),
            Err(EngineError::TooManyWaiters(LineFull::Line { max: 2 }))
        );

        // max 8: one party holds at most 2 places (a quarter); the
        // rightful next holder, another party, still gets in line.
        let dir = tempfile::tempdir().expect("tempdir");
        let mut st = engine_with(dir.path(), 8);
        let (a, mut a_rx) = acquire("A", 60_000, 0);
        st.step([a].into_iter(), T0);
        answer(&mut a_rx).expect("A holds the lock");
        let fillers: Vec<_> = (0..3)
            .map(|i| acquire_as("filler", &format!("f{i}"), 1000, 60_000))
            .collect();
        let (next, mut next_rx) = acquire_as("next", "N", 1000, 60_000);
        let (mut cmds, mut rxs): (Vec<_>, Vec<_>) = fillers.into_iter().unzip();
        cmds.push(next);
        st.step(cmds.into_iter(), T0);
        assert!(rxs[0].try_recv().is_err() && rxs[1].try_recv().is_err());
        assert_eq!(
            answer(&mut rxs[2]),
            Err(EngineError::TooManyWaiters(LineFull::Share { share: 2 }))
        );
        assert!(next_rx.try_recv().is_err(), "the next holder waits in line");
        assert_eq!(st.lines.len(&LockName::new("l").expect("lock")), 3);
        let m = st.metrics.encode();
        assert!(
            m.lines()
                .any(|l| l == "fencegate_locksvc_refusals_total{reason=\"waiter_share_used\"} 1"),
            "{m}"
        );
    }

    #[test]
    fn a_failed_commit_names_none_of_its_rolled_back_grants() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut st = engine(dir.path());
        // A real SQLite failure: every commit writes the counter.
        let other = rusqlite::Connection::open(dir.path().join("locksvc.db")).expect("open");
        other
            .execute_batch(
                "CREATE TRIGGER fail_commit BEFORE UPDATE ON counter
                 BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
            )
            .expect("trigger");

        let (b, mut b_rx) = acquire("B", 1000, 0);
        let (c, mut c_rx) = acquire("C", 1000, 0);
        st.step([b, c].into_iter(), T0);
        assert!(
            matches!(
                answer(&mut b_rx),
                Err(EngineError::Storage(StorageError::Commit(_)))
            ),
            "B's grant was rolled back"
        );
        // C was refused in the same batch because of B's grant: that
        // refusal must not go out naming a lease that never existed.
        let c = answer(&mut c_rx);
        assert!(
            matches!(c, Err(EngineError::Storage(StorageError::Commit(_)))),
            "C must get a storage error, not {c:?}"
        );

        // Indeed token 1 was never granted: once commits work, it goes to C.
        other
            .execute_batch("DROP TRIGGER fail_commit")
            .expect("drop trigger");
        let (c, mut c_rx) = acquire("C", 1000, 0);
        st.step([c].into_iter(), T0);
        let c = answer(&mut c_rx).expect("C granted");
        assert_eq!((c.owner.as_str(), c.token), ("C", 1));
    }
}
