//! The proxy's own watch of each election a lock follows: at every new
//! term, the lock's fence is raised to the new holder's token, so the old
//! holder's writes in flight are cut or drained and its later writes are
//! stale, before the new holder writes anything and with no sidecar or
//! callback (the acquisition fence of `POST /_fencegate/fence`, done by
//! the election itself).
//!
//! One task per lock: read the election (linearizably), raise if it shows
//! a term above the lock's max ([`crate::gate::Gate::follow_election`],
//! which checks the term again as a write would), then wait on a watch of
//! the election's keys, at most [`PATIENCE`], and read again. Nothing here
//! admits a write: every write is still checked with the election when it
//! arrives. A watch that cannot be read only delays the raise to the new
//! holder's first write, as without it.

use crate::election::Shows;
use crate::gate::Gate;
use fencegate_core::LockName;
use std::sync::Arc;
use std::time::Duration;

/// Longest a quiet watch is trusted before the election is read again (a
/// half-open connection, a ZooKeeper change just before its watch was set).
pub const PATIENCE: Duration = Duration::from_secs(2);

/// Pause after a failed read or watch.
const RETRY: Duration = Duration::from_millis(500);

/// Follows every election of `gate`'s locks, for as long as the runtime
/// runs.
pub fn spawn_all(gate: &Arc<Gate>) {
    let Some(elections) = gate.tokens.elections() else {
        return;
    };
    for lock in elections.locks() {
        tokio::spawn(follow(gate.clone(), lock.clone()));
    }
}

async fn follow(gate: Arc<Gate>, lock: LockName) {
    let Some(election) = gate.tokens.elections().and_then(|e| e.of(&lock)) else {
        return;
    };
    loop {
        let seen = match election.read().await {
            Ok((
                Shows::Held {
                    revision, holder, ..
                },
                seen,
            )) => {
                match gate.follow_election(&lock, revision).await {
                    Ok(Some(max)) if max == revision => tracing::info!(
                        lock = %lock, token = revision, holder = %holder, seat = %election.seat(),
                        "a new term of the election: the fence is raised to its token"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(lock = %lock, token = revision, error = %e, "cannot raise the fence to the election's new term; its first write will")
                    }
                }
                seen
            }
            Ok((Shows::Vacant, seen)) => seen,
            Err(e) => {
                tracing::debug!(lock = %lock, error = %e, "cannot read the election to follow it; trying again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        if let Err(e) = election.changed(seen, PATIENCE).await {
            tracing::debug!(lock = %lock, error = %e, "the watch of the election ended");
            tokio::time::sleep(RETRY).await;
        }
    }
}
