//! What the API asks of a lease backend, once: the [`LeaseStore`] trait both
//! the SQLite engine and the etcd backend implement, with the answers and
//! refusals they share. `backend::Leases` picks one of them at start.

use crate::proof::HeldToken;
use fencegate_core::line::{LineFull, Party};
use fencegate_core::{KeyDigest, Lease, LockName};
use std::future::Future;
use std::time::Duration;

/// Why the engine refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("lock is held by {} until {}", holder.owner, holder.expires_at.as_millis())]
    Held { holder: Lease },
    #[error("the lease with this token is not live")]
    NotHolder { current: Option<Lease> },
    /// The lock's line is full, or the caller's party holds its share of
    /// it (`fencegate_core::line::admit`).
    #[error("too many clients are already waiting for this lock")]
    TooManyWaiters(LineFull),
    /// The lock is free but others wait in line for it, and the acquire
    /// could not wait (or its wait ended first). Only the etcd backend
    /// answers this: there the first waiter takes a freed lock in its own
    /// transaction, a moment later; on SQLite it takes it in the same batch.
    #[error("the lock is free, but {waiting} acquires wait in line for it")]
    InLine { waiting: usize },
    /// The backend could not answer from durable state (503: retry).
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the lease service is shutting down")]
    Stopped,
}

/// Why a backend could not answer from its durable state. Every one is a
/// 503 `StorageUnavailable` to the client (retry); they differ in what the
/// service does about them and what the operator is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// SQLite could not commit the batch (every answer of the batch carries
    /// it).
    #[error("the lease database could not commit: {0}")]
    Commit(String),
    /// The engine did not answer within `storage_timeout`; the request may
    /// still be applied when the disk answers.
    #[error(
        "the lease database did not answer within storage_timeout ({0:?}): is its disk stalled? The request may still be applied when the disk answers: retry (an acquire with the same idempotency key gets the same lease)"
    )]
    Stalled(Duration),
    /// The grant committed, but only after the lease's own expiry: the
    /// client would be told of a lease already over.
    #[error(
        "the lease on {lock} (token {token}) ran out while the database committed it (the disk stalled); retry"
    )]
    CommittedTooLate { lock: LockName, token: u64 },
    /// No etcd member answered within `request_timeout`, or etcd refused
    /// the request.
    #[error("etcd: {0}")]
    Etcd(String),
    /// etcd no longer has the etcd lease a request named: the one that
    /// keeps a waiter's place in line (not the client's lock lease).
    #[error("etcd no longer has the etcd lease that kept this acquire's place in line; retry")]
    EtcdLeaseGone,
    /// Another change won each compare-and-set, or a key this request had
    /// written was gone at the next step: nothing was decided.
    #[error("{0}; retry")]
    Contended(&'static str),
    /// What etcd holds is not what this replica can grant from: another
    /// epoch, a revision that went back or past the epoch bits, a record
    /// another program wrote. The message says what the operator must do.
    #[error("{0}")]
    Untrusted(String),
    /// A record could not be encoded for etcd.
    #[error("cannot encode a record for etcd: {0}")]
    Encode(String),
    /// The operating system gave no randomness for a grant id.
    #[error("no randomness for a grant id: {0}")]
    NoRandomness(String),
}

/// An acquire, as the API hands it to a backend.
#[derive(Debug)]
pub struct Acquire {
    pub lock: LockName,
    pub owner: String,
    /// Digest of the client's idempotency key, if it sent one.
    pub key: Option<KeyDigest>,
    pub ttl: Duration,
    /// How long it may wait in line (zero: not at all).
    pub wait: Duration,
    /// Who asked, for its share of the line if it waits.
    pub party: Party,
}

/// A lease backend: the five requests of the lease API, answered by the
/// same rules and with the same errors on SQLite and on etcd.
pub trait LeaseStore {
    fn acquire(&self, a: Acquire) -> impl Future<Output = Result<Lease, EngineError>> + Send;
    fn renew(
        &self,
        held: HeldToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease, EngineError>> + Send;
    fn release(&self, held: HeldToken) -> impl Future<Output = Result<(), EngineError>> + Send;
    fn status(
        &self,
        lock: LockName,
    ) -> impl Future<Output = Result<LockStatus, EngineError>> + Send;
    /// The locks held or waited for that `allow` admits, in name order, at
    /// most `limit`.
    fn list(
        &self,
        limit: usize,
        allow: LockFilter,
    ) -> impl Future<Output = Result<Vec<(LockName, LockStatus)>, EngineError>> + Send;
}

/// Which locks a list may name (the caller's API key's).
pub struct LockFilter(pub Box<dyn Fn(&LockName) -> bool + Send>);

impl std::fmt::Debug for LockFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockFilter")
    }
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
