//! The layout of the lease rules in etcd: the keys under the prefix and
//! what their values hold (see the table in the parent module).

use crate::leases::{EngineError, StorageError};
use etcd_client::{Compare, CompareOp, KeyValue, TxnOpResponse, TxnResponse};
use fencegate_core::{KeyDigest, Lease, LockName, Timestamp};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Bits of a token that hold the etcd revision; the epoch is above them.
pub const REVISION_BITS: u32 = 47;
pub(super) const REVISION_MASK: u64 = (1 << REVISION_BITS) - 1;
/// TTL of a waiter's key (whole seconds, as etcd leases are): how long the
/// place in line of a waiter whose replica died blocks the line. At least
/// this; more when `request_timeout` is long (see `EtcdLeases::waiter_ttl_s`).
pub const WAITER_TTL_S: i64 = 3;
/// How often a waiter's etcd lease is kept alive.
pub(super) const WAITER_KEEPALIVE: Duration = Duration::from_millis(500);
/// How many expiry keys a sweep reads per request to etcd.
pub(super) const SWEEP_PAGE: i64 = 1000;
/// How often the first waiter looks whether the lock became free; the
/// others look less often (they cannot take it before the first).
pub(super) const FIRST_WAITER_POLL: Duration = Duration::from_millis(20);
pub(super) const OTHER_WAITER_POLL: Duration = Duration::from_millis(200);
/// How long a newcomer that may not wait gives the first waiter of a free
/// lock to take it, before it is refused.
pub(super) const LINE_HANDOVER: Duration = Duration::from_millis(300);
/// Conflicting transactions retried before answering `StorageUnavailable`.
pub(super) const MAX_CONFLICTS: usize = 32;

/// The first token of `epoch`: every token it issues is above it.
/// Keys the status page's list reads at most (owner, expiry and waiter
/// keys of every lock, in key order).
pub(super) const LIST_KEYS_READ: i64 = 20_000;

pub fn epoch_base(epoch: u16) -> u64 {
    u64::from(epoch) << REVISION_BITS
}

/// What `P/locks/<L>/owner` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) owner: String,
    /// Hex SHA-256 of the acquire's idempotency key, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) idempotency_sha256: Option<String>,
    /// The epoch of the replica that granted it: with the key's create
    /// revision, the token.
    pub(super) epoch: u16,
    /// Set only on leases migrated from SQLite: their token is the one
    /// SQLite issued, not derived from a revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) token: Option<u64>,
    /// Names the grant transaction, so that a grant retried on another
    /// member recognises its own earlier attempt.
    #[serde(default)]
    pub(super) grant: u64,
}

/// A random number naming one grant: replicas (all PID 1 in their
/// containers, perhaps started in the same millisecond) cannot derive the
/// same one. Compared together with the owner and the idempotency digest.
pub(super) fn grant_id() -> Result<u64, EngineError> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| StorageError::NoRandomness(e.to_string()))?;
    Ok(u64::from_le_bytes(b))
}

impl Record {
    pub(super) fn token(&self, kv: &KeyValue) -> u64 {
        self.token.unwrap_or_else(|| {
            epoch_base(self.epoch) | (u64::try_from(kv.create_revision()).unwrap_or(0))
        })
    }

    pub(super) fn lease(&self, lock: &LockName, token: u64, expires_at: Timestamp) -> Lease {
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
pub(super) struct PlaceValue {
    pub(super) owner: String,
    pub(super) party: String,
}

/// A key of this acquire's own (see `EtcdLeases::acquire`).
pub(super) fn own_key() -> KeyDigest {
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
pub(super) fn party_of(kv: &KeyValue) -> Option<String> {
    serde_json::from_slice::<PlaceValue>(kv.value())
        .ok()
        .map(|v| v.party)
}

pub(super) fn record_of(kv: &KeyValue) -> Result<Record, EngineError> {
    serde_json::from_slice(kv.value()).map_err(|e| {
        EngineError::from(StorageError::Untrusted(format!(
            "etcd key {} does not hold a fencegate lease record ({e}); is another program writing under this prefix?",
            String::from_utf8_lossy(kv.key())
        )))
    })
}

/// An expiry as the `P/expiry/<L>` value: 19 digits, so that etcd's byte
/// comparison of two values is the comparison of the numbers.
pub(super) fn expiry_value(t: Timestamp) -> String {
    format!("{:019}", t.as_millis())
}

pub(super) fn expiry_of(kv: &KeyValue) -> Timestamp {
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
pub(super) struct Held {
    pub(super) kv: KeyValue,
    pub(super) record: Record,
    pub(super) expiry: Option<KeyValue>,
}

impl Held {
    pub(super) fn lease(&self, lock: &LockName) -> Lease {
        let expires = self.expiry.as_ref().map_or(Timestamp(0), expiry_of);
        self.record
            .lease(lock, self.record.token(&self.kv), expires)
    }

    /// Both keys unchanged since this read.
    pub(super) fn unchanged(&self, owner_key: String, expiry_key: String) -> Vec<Compare> {
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
pub(super) struct Seen {
    pub(super) owner: Option<Held>,
    /// Waiter keys in line.
    pub(super) waiters: usize,
    /// Create revision of the oldest waiter key.
    pub(super) first_waiter: Option<i64>,
    /// Whether the caller's own waiter key is still there.
    pub(super) mine_present: bool,
    /// `P/meta/epoch` as seen.
    pub(super) epoch: Option<u16>,
}

/// The ranges of every `get` in a transaction's answer, in order.
pub(super) fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            _ => Vec::new(),
        })
        .collect()
}
