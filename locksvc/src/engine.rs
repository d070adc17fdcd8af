//! The engine: one thread that owns the lock table and the database.
//!
//! Every request becomes a [`Command`] on a channel. The engine thread takes
//! whatever has queued up (a batch), applies it to the in-memory
//! [`LockTable`] in arrival order, writes the changed rows in one SQLite
//! transaction, and only then answers. Concurrent grants therefore share one
//! fsync (group commit) instead of queuing one fsync each, and no answer ever
//! reveals state that is not yet on disk.
//!
//! The engine also keeps, per lock, the line of acquires that asked to wait.
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
use crate::metrics::Metrics;
use crate::proof::HeldToken;
use crate::store::{Durability, LeaseRow, Store};
use fencegate_core::{KeyDigest, Lease, LockName, LockTable, Timestamp};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How often expired leases are purged even when nothing else happens.
const PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// Most commands applied in one group commit.
const MAX_BATCH: usize = 4096;

/// Why the engine refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("lock is held by {} until {}", holder.owner, holder.expires_at.as_millis())]
    Held { holder: Lease },
    #[error("the lease with this token is not live")]
    NotHolder { current: Option<Lease> },
    #[error("too many clients are already waiting for this lock")]
    TooManyWaiters,
    #[error("the lease database could not commit: {0}")]
    Storage(String),
    #[error("the lease service is shutting down")]
    Stopped,
}

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// A request to the engine.
#[derive(Debug)]
pub enum Command {
    Acquire {
        lock: LockName,
        owner: String,
        /// Digest of the client's idempotency key, if it sent one.
        key: Option<KeyDigest>,
        ttl: Duration,
        wait: Duration,
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
    Stop,
}

/// What a status request returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The live lease, if any.
    pub lease: Option<Lease>,
    /// The last token issued by this service (for any lock).
    pub last_token: u64,
    /// Acquires waiting in line for this lock.
    pub waiting: usize,
}

#[derive(Debug)]
struct Waiter {
    owner: String,
    key: Option<KeyDigest>,
    ttl: Duration,
    deadline: Timestamp,
    reply: Reply<Lease>,
}

/// An answer held back until its batch is committed.
enum Pending {
    Lease(Reply<Lease>, Result<Lease, EngineError>),
    Unit(Reply<()>, Result<(), EngineError>),
    Status(Reply<LockStatus>, LockStatus),
}

impl Pending {
    /// Sends the answer; if the commit failed, a success becomes a storage
    /// error (refusals stay as they are: they did not depend on the commit).
    fn send(self, commit: &Result<(), String>) {
        let fail = |e: &String| EngineError::Storage(e.clone());
        match self {
            Pending::Lease(tx, r) => {
                let _ = tx.send(match (r, commit) {
                    (Ok(_), Err(e)) => Err(fail(e)),
                    (r, _) => r,
                });
            }
            Pending::Unit(tx, r) => {
                let _ = tx.send(match (r, commit) {
                    (Ok(_), Err(e)) => Err(fail(e)),
                    (r, _) => r,
                });
            }
            Pending::Status(tx, s) => {
                let _ = tx.send(match commit {
                    Ok(()) => Ok(s),
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
}

impl Engine {
    /// Loads the durable state from `store` and starts the engine thread.
    /// `max_waiters` bounds the line of waiting acquires per lock.
    pub fn start(
        store: Store,
        metrics: Arc<Metrics>,
        max_waiters: usize,
    ) -> anyhow::Result<Engine> {
        let (counter, leases) = store.load()?;
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
        let state = EngineState {
            table,
            store,
            waiters: HashMap::new(),
            metrics,
            last_purge: now,
            max_waiters,
        };
        let thread = std::thread::Builder::new()
            .name("locksvc-engine".into())
            .spawn(move || state.run(rx))?;
        Ok(Engine {
            handle: EngineHandle { tx },
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
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    pub async fn acquire(
        &self,
        lock: LockName,
        owner: String,
        key: Option<KeyDigest>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, EngineError> {
        self.call(|reply| Command::Acquire {
            lock,
            owner,
            key,
            ttl,
            wait,
            reply,
        })
        .await
    }

    pub async fn renew(&self, held: HeldToken, ttl: Duration) -> Result<Lease, EngineError> {
        self.call(|reply| Command::Renew { held, ttl, reply }).await
    }

    pub async fn release(&self, held: HeldToken) -> Result<(), EngineError> {
        self.call(|reply| Command::Release { held, reply }).await
    }

    pub async fn status(&self, lock: LockName) -> Result<LockStatus, EngineError> {
        self.call(|reply| Command::Status { lock, reply }).await
    }
}

struct EngineState {
    table: LockTable,
    store: Store,
    waiters: HashMap<LockName, VecDeque<Waiter>>,
    metrics: Arc<Metrics>,
    last_purge: Timestamp,
    max_waiters: usize,
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
            let now = clock::now();
            let mut batch = Batch::default();
            self.expire(now, &mut batch);
            let n = batch_cmds.len();
            for cmd in batch_cmds.drain(..) {
                self.apply(cmd, now, &mut batch);
            }
            if n > 0 {
                self.metrics.batch_size.observe(n as f64);
            }
            self.commit(batch);
            if stop {
                return;
            }
        }
    }

    /// When the engine must wake even if no request arrives: the next purge,
    /// the expiry of a lease somebody waits for, or a waiter's deadline.
    fn next_wake(&self, now: Timestamp) -> Timestamp {
        let mut wake = self.last_purge.saturating_add(PURGE_INTERVAL).max(now);
        for (lock, line) in &self.waiters {
            if let Some(lease) = self.table.live(lock, now) {
                wake = wake.min(lease.expires_at);
            }
            if let Some(d) = line.iter().map(|w| w.deadline).min() {
                wake = wake.min(d);
            }
        }
        wake
    }

    /// Serves waiters on locks whose lease ended, times out waiters, and
    /// periodically forgets expired leases.
    fn expire(&mut self, now: Timestamp, batch: &mut Batch) {
        let locks: Vec<LockName> = self.waiters.keys().cloned().collect();
        for lock in locks {
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

    /// Grants `lock` to the first waiter still waiting if the lock is free;
    /// answers waiters whose deadline passed.
    fn serve_waiters(&mut self, lock: &LockName, now: Timestamp, batch: &mut Batch) {
        let Some(mut line) = self.waiters.remove(lock) else {
            return;
        };
        let mut kept = VecDeque::with_capacity(line.len());
        while let Some(w) = line.pop_front() {
            if w.reply.is_closed() {
                continue;
            }
            if self.table.live(lock, now).is_none() {
                let result = self.grant(lock, &w.owner, w.key, w.ttl, now, batch);
                batch.replies.push(Pending::Lease(w.reply, result));
            } else if now >= w.deadline {
                let holder = self.table.live(lock, now);
                self.metrics.refused("held_after_wait");
                let err = match holder {
                    Some(holder) => EngineError::Held { holder },
                    None => EngineError::Stopped,
                };
                batch.replies.push(Pending::Lease(w.reply, Err(err)));
            } else {
                kept.push_back(w);
            }
        }
        self.metrics.waiting.set(self.waiting_total(&kept) as i64);
        if !kept.is_empty() {
            self.waiters.insert(lock.clone(), kept);
        }
    }

    fn waiting_total(&self, extra: &VecDeque<Waiter>) -> usize {
        self.waiters.values().map(VecDeque::len).sum::<usize>() + extra.len()
    }

    fn grant(
        &mut self,
        lock: &LockName,
        owner: &str,
        key: Option<KeyDigest>,
        ttl: Duration,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Lease, EngineError> {
        match self.table.acquire(lock, owner, key, ttl, now) {
            Ok(grant) => {
                if grant.new_token {
                    self.metrics.grants.inc();
                    batch.needs(Durability::Fsync);
                } else {
                    self.metrics.renewals.inc();
                    batch.needs(Durability::Written);
                }
                batch.rows.push(LeaseRow::Put(grant.lease.clone()));
                Ok(grant.lease)
            }
            Err(held) => Err(EngineError::Held {
                holder: held.holder,
            }),
        }
    }

    fn apply(&mut self, cmd: Command, now: Timestamp, batch: &mut Batch) {
        match cmd {
            Command::Acquire {
                lock,
                owner,
                key,
                ttl,
                wait,
                reply,
            } => {
                // Someone already in line goes first: a newcomer must queue
                // behind them (or be refused) even if the lock looks free.
                // Only the live holder itself, proven by its idempotency key,
                // is not a newcomer.
                let line_len = self.waiters.get(&lock).map_or(0, VecDeque::len);
                let own_live = self
                    .table
                    .live(&lock, now)
                    .is_some_and(|l| l.granted_to(&owner, key.as_ref()));
                if line_len == 0 || own_live {
                    match self.grant(&lock, &owner, key, ttl, now, batch) {
                        Ok(lease) => {
                            batch.replies.push(Pending::Lease(reply, Ok(lease)));
                            return;
                        }
                        Err(e) if wait.is_zero() => {
                            self.metrics.refused("held");
                            batch.replies.push(Pending::Lease(reply, Err(e)));
                            return;
                        }
                        Err(_) => {}
                    }
                } else if wait.is_zero() {
                    self.metrics.refused("held");
                    let err = match self.table.live(&lock, now) {
                        Some(holder) => EngineError::Held { holder },
                        None => EngineError::TooManyWaiters,
                    };
                    batch.replies.push(Pending::Lease(reply, Err(err)));
                    return;
                }
                if line_len >= self.max_waiters {
                    self.metrics.refused("too_many_waiters");
                    batch
                        .replies
                        .push(Pending::Lease(reply, Err(EngineError::TooManyWaiters)));
                    return;
                }
                self.waiters.entry(lock).or_default().push_back(Waiter {
                    owner,
                    key,
                    ttl,
                    deadline: now.saturating_add(wait),
                    reply,
                });
                self.metrics.waiting.inc();
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
                    waiting: self.waiters.get(&lock).map_or(0, VecDeque::len),
                };
                batch.replies.push(Pending::Status(reply, status));
            }
            Command::Stop => {}
        }
    }

    /// Writes the batch, then sends its answers. On a failed commit every
    /// success in the batch is answered with a storage error and the
    /// in-memory state is reloaded from disk, so memory never runs ahead of
    /// what a restart would see.
    fn commit(&mut self, batch: Batch) {
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
            }
            Err(e) => {
                tracing::error!(error = %e, "lease database commit failed; answering 503 and reloading");
                match self.store.load() {
                    Ok((counter, leases)) => self.table = LockTable::restore(counter, leases),
                    Err(e) => tracing::error!(error = %e, "reload after failed commit failed"),
                }
            }
        }
        for reply in batch.replies {
            reply.send(&result);
        }
    }
}
