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
//! | `P/granted/<L>`           | the last grant's id (kept for good)          | none                     |
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
//! **A grant lands once.** A call that a member left unanswered is retried
//! on the next (`fencegate_etcd::Etcd::call`), and the first attempt may
//! still reach its member later, after the retry was answered and the
//! lease released. A newcomer's grant compares "no owner, nobody in line",
//! which holds again after every release, so it also compares
//! `P/granted/<L>`, which every grant writes, with the newest revision its
//! replica had seen when it sent the transaction: a late attempt finds the
//! retry's grant newer and changes nothing. The key is never deleted (a
//! deleted one would let a late attempt through): one small key per lock
//! name ever granted.
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
use crate::leases::{EngineError, LockStatus, StorageError};
use crate::metrics::Metrics;
use crate::proof::HeldToken;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use fencegate_core::line::{self, Party};
use fencegate_core::{AcquireStep, KeyDigest, Lease, LockName, Timestamp};
use fencegate_etcd::{CallError, Etcd, Retried};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod grant;
mod keys;
mod start;
mod waiters;

use keys::*;
pub use keys::{REVISION_BITS, WAITER_TTL_S, epoch_base};

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
    rewound: parking_lot::Mutex<Option<String>>,
}

impl std::fmt::Debug for EtcdLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLeases")
            .field("prefix", &self.inner.prefix)
            .field("epoch", &self.inner.epoch)
            .finish_non_exhaustive()
    }
}

impl From<CallError> for EngineError {
    fn from(e: CallError) -> EngineError {
        EngineError::Storage(match e {
            e if e.lease_gone() => StorageError::EtcdLeaseGone,
            CallError::Unavailable(why) => StorageError::Etcd(why),
            CallError::Refused(e) => StorageError::Etcd(format!("refused: {e}")),
        })
    }
}

impl EtcdLeases {
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
    pub(super) async fn call<T, F, Fut>(&self, f: F) -> Result<T, EngineError>
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
    pub(super) async fn call_tracked<T, F, Fut>(&self, f: F) -> Result<(T, Retried), EngineError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        Ok(self.call_raw(f).await?)
    }

    pub(super) async fn call_raw<T, F, Fut>(&self, f: F) -> Result<(T, Retried), CallError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.inner.etcd.call(f).await
    }

    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse, EngineError> {
        Ok(self.txn_tracked(txn).await?.0)
    }

    pub(super) async fn txn_tracked(
        &self,
        txn: Txn,
    ) -> Result<(TxnResponse, Retried), EngineError> {
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
    pub(super) fn refuse_if_rewound(&self) -> Result<(), EngineError> {
        match &*self.inner.rewound.lock() {
            Some(why) => Err(StorageError::Untrusted(why.clone()).into()),
            None => Ok(()),
        }
    }

    /// Every transaction's answer is linearizable, so its revision is at
    /// least that of any answer received before it was sent (`before`),
    /// unless etcd was restored from an older backup: then revisions, and
    /// the tokens made of them, would repeat ones already issued. The
    /// replica stops granting for good and says which epoch clears them.
    pub(super) fn saw_revision(&self, revision: i64, before: i64) -> Result<(), EngineError> {
        let highest = self
            .inner
            .highest_revision
            .fetch_max(revision, std::sync::atomic::Ordering::AcqRel);
        if revision >= before || revision == 0 {
            return Ok(());
        }
        let why = format!(
            "etcd's revision went back from {} to {revision}: the cluster was restored from an older backup, and its tokens would repeat ones already issued. This replica grants nothing more. Stop every lease-service replica, set etcd.epoch (or FENCEGATE_ETCD_EPOCH) to {} and start them again",
            highest.max(before),
            u32::from(self.inner.epoch) + 1
        );
        tracing::error!("{why}");
        *self.inner.rewound.lock() = Some(why.clone());
        Err(StorageError::Untrusted(why).into())
    }
}

/// The keys, under the prefix (the layout is in the module docs).
impl EtcdLeases {
    pub(super) fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.inner.prefix)
    }

    pub(super) fn owner_key(&self, lock: &LockName) -> String {
        self.key(&format!("locks/{lock}/owner"))
    }

    pub(super) fn expiry_key(&self, lock: &LockName) -> String {
        self.key(&format!("expiry/{lock}"))
    }

    pub(super) fn granted_key(&self, lock: &LockName) -> String {
        self.key(&format!("granted/{lock}"))
    }

    pub(super) fn wait_prefix(&self, lock: &LockName) -> String {
        self.key(&format!("locks/{lock}/wait/"))
    }

    pub(super) fn epoch_key(&self) -> String {
        self.key("meta/epoch")
    }

    pub(super) fn floor_key(&self) -> String {
        self.key("meta/floor")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_keep_their_kind() {
        // What etcd-client reports for a keep-alive of a lease etcd no
        // longer has: the keeper of a place in line stops on it.
        let gone = etcd_client::Error::LeaseKeepAliveError("lease not found".into());
        assert_eq!(
            EngineError::from(CallError::Refused(gone)),
            EngineError::Storage(StorageError::EtcdLeaseGone)
        );
        // Any other failure is one the keeper retries.
        let silent = CallError::Unavailable("no etcd member answered within 2s".into());
        assert!(matches!(
            EngineError::from(silent),
            EngineError::Storage(StorageError::Etcd(why)) if why.contains("no etcd member")
        ));
        let refused = etcd_client::Error::InvalidArgs("bad".into());
        assert!(matches!(
            EngineError::from(CallError::Refused(refused)),
            EngineError::Storage(StorageError::Etcd(why)) if why.starts_with("refused: ")
        ));
    }
}
