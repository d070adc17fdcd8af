//! Reading an election the cluster runs in etcd: who holds it, and the
//! holder's fencing token, a revision of its key.
//!
//! - **A leader key** (Patroni's `/<namespace>/<scope>/leader`, bound to
//!   the leader's etcd lease): whoever the key names holds, and the token
//!   is the key's `mod_revision`, the revision of its last write. Not its
//!   `create_revision`: a leader key can change hands without being
//!   created again. Patroni 3.0.2 (Debian bookworm's) does it: a leader
//!   frozen past its TTL wakes up and puts its name into the key its
//!   successor created (observed in `tests/patroni/failover.sh`'s
//!   development), so two holders would share one `create_revision`.
//!   Every write of the key gets a new, higher `mod_revision`; the holder
//!   writes it only when it takes the key or renews it after a lapse, each
//!   a new term.
//! - **A prefix** (etcd's election and lock recipes: `etcdctl elect`,
//!   `etcdctl lock`, Go's `concurrency` package): each candidate puts a
//!   key under the prefix, and only its own; the key with the lowest
//!   `create_revision` holds, and that is the token, as the recipes define
//!   it (a holder's `Proclaim` rewrites its value, not its term).
//!
//! etcd revisions only grow, so each new holder has a higher token than
//! every holder before it.

use crate::{CallError, Etcd};
use etcd_client::{GetOptions, SortOrder, SortTarget, WatchOptions};
use std::time::Duration;

/// Where an election keeps its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seat {
    /// One key: whoever it names holds (Patroni's leader key).
    Key(String),
    /// A prefix: the key under it with the lowest `create_revision` holds.
    Prefix(String),
}

impl std::fmt::Display for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seat::Key(k) => write!(f, "the etcd leader key {k}"),
            Seat::Prefix(p) => write!(f, "the etcd election under {p}"),
        }
    }
}

pub use fencegate_core::election::Shows;

/// Who holds the election at `seat` now, read linearizably (etcd's
/// default read, answered by the leader with a quorum), and the store's
/// revision the read saw (to watch from).
pub async fn read(etcd: &Etcd, seat: &Seat) -> Result<(Shows, i64), String> {
    let (key, options) = match seat {
        Seat::Key(k) => (k.clone(), None),
        Seat::Prefix(p) => (
            p.clone(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        ),
    };
    let answer = etcd
        .call(|mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.get(key, options).await }
        })
        .await;
    let (got, _) = answer.map_err(|e| match e {
        CallError::Unavailable(why) => why,
        CallError::Refused(e) => format!("etcd refused the read: {e}"),
    })?;
    let seen = got.header().map_or(0, |h| h.revision());
    let Some(kv) = got.kvs().first() else {
        return Ok((Shows::Vacant, seen));
    };
    let term = match seat {
        Seat::Key(_) => kv.mod_revision(),
        Seat::Prefix(_) => kv.create_revision(),
    };
    let shows = Shows::Held {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        holder: String::from_utf8_lossy(kv.value()).into_owned(),
        revision: u64::try_from(term).unwrap_or(0),
    };
    Ok((shows, seen))
}

/// Waits until a key of `seat` is written or deleted after revision
/// `seen` (a watch, not a poll), or until the watch ends for any reason (a
/// compaction past `seen`, a cancel, a member gone), or `patience` passes
/// with no word: a quiet stream may be a half-open connection. Either
/// way the caller reads the election again; this only says when.
pub async fn changed(
    etcd: &Etcd,
    seat: &Seat,
    seen: i64,
    patience: Duration,
) -> Result<(), String> {
    let (key, options) = match seat {
        Seat::Key(k) => (k.clone(), WatchOptions::new()),
        Seat::Prefix(p) => (p.clone(), WatchOptions::new().with_prefix()),
    };
    let options = options.with_start_revision(seen + 1);
    let watched = async {
        let mut client = etcd.client().await.map_err(|e| e.to_string())?;
        let mut stream = client
            .watch(key, Some(options))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match stream.message().await.map_err(|e| e.to_string())? {
                Some(r) if r.compact_revision() > 0 || r.canceled() => return Ok(()),
                Some(r) if !r.events().is_empty() => return Ok(()),
                Some(_) => {}
                None => return Ok(()),
            }
        }
    };
    match tokio::time::timeout(patience, watched).await {
        Ok(r) => r.inspect_err(|_| etcd.prefer_next()),
        Err(_) => Ok(()),
    }
}
