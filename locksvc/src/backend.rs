//! Where the locks live: the embedded SQLite engine (the default: one
//! process, nothing else to run) or an etcd cluster (several replicas, no
//! single point of failure). The API talks to [`Leases`] only, so both
//! backends answer the same requests with the same rules and errors.

use crate::engine::EngineHandle;
use crate::etcd::EtcdLeases;
use crate::leases::{Acquire, EngineError, LeaseStore, LockFilter, LockStatus};
use crate::proof::HeldToken;
use fencegate_core::{Lease, LockName};
use std::time::Duration;

/// The lease store the API serves from.
#[derive(Debug, Clone)]
pub enum Leases {
    /// The engine thread over the SQLite file.
    Sqlite(EngineHandle),
    /// etcd, shared with the other replicas.
    Etcd(EtcdLeases),
}

impl Leases {
    /// Which backend, as the status page names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Leases::Sqlite(_) => "SQLite",
            Leases::Etcd(_) => "etcd",
        }
    }

    pub async fn acquire(&self, a: Acquire) -> Result<Lease, EngineError> {
        match self {
            Leases::Sqlite(e) => e.acquire(a).await,
            Leases::Etcd(e) => e.acquire(a).await,
        }
    }

    /// Why the service cannot grant now, if it cannot (SQLite: the last
    /// commit failed; etcd answers each call for itself).
    pub fn readiness_problem(&self) -> Option<String> {
        match self {
            Leases::Sqlite(e) => e.readiness().problem(),
            Leases::Etcd(_) => None,
        }
    }

    pub async fn renew(&self, held: HeldToken, ttl: Duration) -> Result<Lease, EngineError> {
        match self {
            Leases::Sqlite(e) => e.renew(held, ttl).await,
            Leases::Etcd(e) => e.renew(held, ttl).await,
        }
    }

    pub async fn release(&self, held: HeldToken) -> Result<(), EngineError> {
        match self {
            Leases::Sqlite(e) => e.release(held).await,
            Leases::Etcd(e) => e.release(held).await,
        }
    }

    pub async fn status(&self, lock: LockName) -> Result<LockStatus, EngineError> {
        match self {
            Leases::Sqlite(e) => e.status(lock).await,
            Leases::Etcd(e) => e.status(lock).await,
        }
    }

    /// The locks held or waited for, in name order, at most `limit` (for
    /// the status page).
    /// Only locks `allow` admits are listed (the caller's API key's).
    pub async fn list(
        &self,
        limit: usize,
        allow: impl Fn(&LockName) -> bool + Send + Sync + 'static,
    ) -> Result<Vec<(LockName, LockStatus)>, EngineError> {
        let allow = LockFilter(Box::new(allow));
        match self {
            Leases::Sqlite(e) => e.list(limit, allow).await,
            Leases::Etcd(e) => e.list(limit, allow).await,
        }
    }
}
