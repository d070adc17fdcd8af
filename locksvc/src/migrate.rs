//! `fencegate locksvc migrate`: moves the locks and the token counter from
//! a SQLite database to etcd, so that no token etcd issues afterwards is
//! at or below one SQLite issued.
//!
//! Stop the SQLite lease service first: a token it issued after the
//! migration read its counter would not be covered.
//!
//! 1. Read the counter `c` and the live leases from SQLite.
//! 2. Refuse unless the configured epoch clears `c` (`epoch << 47 > c`).
//! 3. Register the epoch, as a replica does at start: replicas still
//!    running with a lower epoch can no longer grant.
//! 4. Record `c` as `P/meta/floor` (raising it, never lowering it): every
//!    replica refuses to start with an epoch that does not clear the floor.
//! 5. Copy each live lease with its token, so its holder keeps renewing
//!    and releasing it on etcd; a lock that already has a lease in etcd
//!    keeps it.

use crate::config::EtcdConfig;
use crate::etcd::{EtcdLeases, REVISION_BITS, epoch_base};
use crate::metrics::Metrics;
use crate::store::Store;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// SQLite's last issued token: the floor etcd's tokens are above.
    pub last_token: u64,
    /// The epoch the cluster now runs.
    pub epoch: u16,
    /// Live leases copied, and those skipped because the lock already had
    /// a lease in etcd.
    pub copied: usize,
    pub skipped: usize,
}

/// The smallest epoch whose tokens are all above `last_token`.
pub fn epoch_needed(last_token: u64) -> u64 {
    (last_token >> REVISION_BITS) + 1
}

pub async fn migrate(db: &Path, config: &EtcdConfig) -> anyhow::Result<Migrated> {
    anyhow::ensure!(db.exists(), "no SQLite lease database at {}", db.display());
    let (last_token, leases) = Store::open(db, fencegate_durable::Opening::Existing, 0)?.load()?;
    let needed = epoch_needed(last_token);
    anyhow::ensure!(
        epoch_base(config.epoch) > last_token,
        "the SQLite database issued tokens up to {last_token}; etcd.epoch {} would issue tokens below them. Set etcd.epoch (or FENCEGATE_ETCD_EPOCH) to at least {needed}, for the migration and for every replica",
        config.epoch
    );
    let target =
        EtcdLeases::start(config, Arc::new(Metrics::new()), 1, Duration::from_secs(10)).await?;
    target.record_floor(last_token).await?;
    let now = crate::clock::now();
    let (mut copied, mut skipped) = (0, 0);
    for lease in leases.iter().filter(|l| l.is_live(now)) {
        if target.import(lease).await? {
            copied += 1;
        } else {
            skipped += 1;
        }
    }
    Ok(Migrated {
        last_token,
        epoch: config.epoch,
        copied,
        skipped,
    })
}
