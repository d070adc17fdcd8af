//! What the gate tells operators: readiness, the status documents, and
//! joining the replicas' cluster at start.

use super::{BUSY_KEYS_SHOWN, Gate};
use crate::fences::FenceError;
use std::collections::BTreeMap;
use std::time::Duration;

/// How often a replica writes the maxes it learned from the cluster into
/// its own database.
const REMEMBER_EVERY: Duration = Duration::from_secs(2);

impl Gate {
    /// With replicas: joins the cluster (waiting up to `patience` for
    /// etcd), then raises the cluster's maxes to at least what this
    /// proxy's SQLite database kept from running alone, so that turning
    /// replicas on never lets a token go back.
    pub async fn join_cluster(&self, patience: Duration) -> anyhow::Result<()> {
        let Some(c) = self.fences.cluster() else {
            return Ok(());
        };
        c.start(patience, self.metrics.clone()).await?;
        let mut carried = BTreeMap::new();
        for (lock, max) in self.db.load_fences()? {
            if lock.contains('/') {
                continue;
            }
            let cluster_max = self.fences.max(&lock);
            carried.insert(lock.clone(), max.max(cluster_max));
            if fencegate_core::fence::reached(cluster_max, max) {
                continue;
            }
            match self.fences.admit(&lock, max).await {
                Ok(_) | Err(FenceError::Stale { .. }) => {}
                Err(e) => {
                    anyhow::bail!("cannot carry lock {lock}'s max {max} into the cluster: {e}")
                }
            }
            tracing::warn!(
                lock,
                max,
                cluster_max,
                "the cluster's max of a lock was below this proxy's record of it (etcd lost data, or this proxy ran alone before): carried it back into the cluster"
            );
        }
        self.remember_cluster_maxes(c.clone(), carried);
        Ok(())
    }

    /// With replicas: keeps the maxes this replica learns from the cluster
    /// in its own database as well (a few seconds behind), so that a
    /// replica restarted on an etcd that lost them (restored from an older
    /// snapshot, a key deleted) carries them back at its start instead of
    /// admitting tokens below them.
    fn remember_cluster_maxes(
        &self,
        cluster: crate::state::cluster::Cluster,
        mut kept: BTreeMap<String, u64>,
    ) {
        let db = self.db.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REMEMBER_EVERY).await;
                let risen: Vec<(String, u64)> = cluster
                    .snapshot()
                    .into_iter()
                    .filter(|(lock, max)| {
                        !lock.contains('/')
                            && kept
                                .get(lock)
                                .is_none_or(|k| fencegate_core::fence::raises(*k, *max))
                    })
                    .collect();
                if risen.is_empty() {
                    continue;
                }
                let db = db.clone();
                let to_keep = risen.clone();
                let kept_now = tokio::task::spawn_blocking(move || {
                    to_keep
                        .iter()
                        .all(|(lock, max)| db.raise(lock, *max).is_ok())
                })
                .await
                .unwrap_or(false);
                if kept_now {
                    kept.extend(risen);
                }
            }
        });
    }

    /// What `/_fencegate/status` shows.
    pub async fn status(&self) -> serde_json::Value {
        self.status_as(false).await
    }

    /// What the status page shows (behind its sign-in): `status`, and the
    /// lease owner holding each lock's max and the keys being written,
    /// which the open `/_fencegate/status` leaves out.
    pub async fn status_for_viewers(&self) -> serde_json::Value {
        self.status_as(true).await
    }

    pub(super) async fn status_as(&self, viewer: bool) -> serde_json::Value {
        let cluster = match self.fences.cluster() {
            Some(c) => c.status().await,
            None => serde_json::Value::Null,
        };
        let scope_json =
            |s: &crate::scope::Scope| serde_json::json!({"scope": s.id, "lock": s.lock.as_str()});
        let configured = self.scoping.configured();
        let mut locks: Vec<(String, u64)> = self
            .fences
            .snapshot()
            .into_iter()
            .filter(|(id, _)| !id.contains('/'))
            .collect();
        // The page shows the first locks by name, each with its scopes, and
        // names the first few configured scopes: a hundred thousand of
        // them would cost it more than the rest of the page.
        if viewer {
            locks.sort_unstable();
        }
        let mut status = serde_json::json!({
            "cluster": cluster,
            "locks": locks.into_iter().enumerate().map(|(i, (lock, max))| {
                let mut l = serde_json::json!({"lock": lock, "max_token": max});
                if viewer {
                    l["holder"] = self.refuser.events().owner_of(&lock, max).into();
                    if i < crate::page::LOCKS_SHOWN
                        && let Ok(name) = fencegate_core::LockName::new(&lock)
                    {
                        let mine = self.scoping.of_lock(&name);
                        l["scopes"] = mine.iter().take(crate::page::SCOPES_SHOWN_PER_LOCK).map(|s| s.id.as_str()).collect::<Vec<_>>().into();
                        l["scopes_total"] = mine.len().into();
                    }
                }
                l
            }).collect::<Vec<_>>(),
            "inflight_writes": self.metrics.inflight_writes.get(),
            "lingering_writes": self.metrics.lingering_writes.get(),
            "configured_scopes": configured.iter().take(if viewer { crate::page::SCOPES_SHOWN } else { usize::MAX }).map(scope_json).collect::<Vec<_>>(),
            "configured_scopes_total": configured.len(),
            "probe": self.store.probe_reports().into_iter().map(|r| serde_json::json!({
                "report": r,
                "safe": r.safe(),
                "summary": r.summary(),
                "checks": r.checks().iter().map(crate::probe::CheckLine::to_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "accept_weak_backend": self.store.accepts_weak(),
            "etag_cache_entries": self.keys.cached(),
        });
        if viewer {
            let (keys, total) = self.keys.busy(BUSY_KEYS_SHOWN);
            status["busy_keys"] = serde_json::json!({
                "total": total,
                "shown": keys.into_iter().map(|(b, k)| format!("s3://{b}/{k}")).collect::<Vec<_>>(),
            });
        }
        status
    }

    /// Why the proxy cannot admit a new token now, if it cannot (its
    /// database; with replicas, its standing): readiness.
    pub fn not_ready(&self) -> Option<String> {
        // With replicas, raises go to etcd: the local disk's room is not
        // theirs to report.
        let cluster = self.fences.cluster();
        if let Some(c) = cluster
            && !c.admits()
        {
            return Some(c.why_not());
        }
        self.db.problem(cluster.is_none())
    }
}
