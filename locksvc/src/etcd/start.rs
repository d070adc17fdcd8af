//! Start-up: connecting, registering the replica's epoch, the floor a
//! migration recorded.

use super::*;

impl EtcdLeases {
    /// Connects, and registers this replica's epoch with the cluster:
    /// refuses to start when the cluster has seen a higher epoch, or when
    /// a migration recorded tokens the epoch does not clear. Retries for
    /// `startup` while etcd cannot be reached (replicas may start first).
    pub async fn start(
        config: &EtcdConfig,
        metrics: Arc<Metrics>,
        max_waiters: usize,
        startup: Duration,
    ) -> anyhow::Result<EtcdLeases> {
        let etcd = Etcd::new(&config.connection())?;
        let leases = EtcdLeases {
            inner: Arc::new(Inner {
                etcd,
                prefix: config.prefix.clone(),
                epoch: config.epoch,
                request_timeout: config.request_timeout,
                max_waiters,
                metrics,
                highest_revision: std::sync::atomic::AtomicI64::new(0),
                rewound: parking_lot::Mutex::new(None),
            }),
        };
        let deadline = Instant::now() + startup;
        loop {
            match leases.register_epoch().await {
                Ok(()) => break,
                Err(Startup::Refused(e)) => return Err(e),
                Err(Startup::Unavailable(e)) if Instant::now() >= deadline => {
                    anyhow::bail!("etcd {:?} did not answer: {e}", config.endpoints)
                }
                Err(Startup::Unavailable(e)) => {
                    tracing::warn!(error = %e, "etcd not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        tracing::info!(
            endpoints = ?config.endpoints,
            prefix = %config.prefix,
            epoch = config.epoch,
            "serving locks from etcd"
        );
        leases.spawn_sweeper(config.sweep_interval);
        Ok(leases)
    }

    /// A transaction for start-up, which tells "etcd refused" (stop) from
    /// "etcd did not answer" (retry).
    pub(super) async fn txn_at_start(&self, txn: Txn) -> Result<TxnResponse, Startup> {
        match self
            .call_raw(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok((resp, _)) => {
                // The newest revision seen bounds a newcomer's grant and
                // an import ("A grant lands once"): from the start, not
                // from the first answer after it, or an import into a
                // prefix where the lock was once granted would be refused.
                let revision = resp.header().map_or(0, |h| h.revision());
                self.inner
                    .highest_revision
                    .fetch_max(revision, std::sync::atomic::Ordering::AcqRel);
                Ok(resp)
            }
            Err(CallError::Unavailable(why)) => Err(Startup::Unavailable(why)),
            Err(CallError::Refused(e)) => Err(Startup::Refused(anyhow::anyhow!(
                "etcd refused this replica: {e} (check etcd.username / FENCEGATE_ETCD_PASSWORD and the user's permissions on the prefix)"
            ))),
        }
    }

    /// Refuses an epoch below the cluster's, or one that does not clear
    /// the floor `migrate` recorded; then raises the cluster's epoch to
    /// this replica's.
    pub(super) async fn register_epoch(&self) -> Result<(), Startup> {
        let mine = self.inner.epoch;
        let (_, floor) = self.read_number(self.floor_key()).await?;
        if floor > 0 && fencegate_core::fence::reached(floor, epoch_base(mine)) {
            return Err(Startup::Refused(anyhow::anyhow!(
                "tokens up to {floor} were issued before these locks moved to etcd (fencegate locksvc migrate); epoch {mine} would issue tokens below them. Set etcd.epoch to at least {}",
                (floor >> REVISION_BITS) + 1
            )));
        }
        let before = self.raise(self.epoch_key(), u64::from(mine)).await?;
        if before > u64::from(mine) {
            return Err(Startup::Refused(anyhow::anyhow!(
                "the etcd cluster has served epoch {before}, and this replica is configured with epoch {mine}: its tokens would be below ones already issued. Set etcd.epoch (or FENCEGATE_ETCD_EPOCH) to at least {before}"
            )));
        }
        Ok(())
    }

    /// Records SQLite's last token as the floor no epoch may issue below
    /// (`migrate`).
    pub async fn record_floor(&self, last_token: u64) -> anyhow::Result<()> {
        match self.raise(self.floor_key(), last_token).await {
            Ok(_) => Ok(()),
            Err(Startup::Refused(e)) => Err(e),
            Err(Startup::Unavailable(why)) => anyhow::bail!("cannot record the floor: {why}"),
        }
    }

    /// Whether `key` exists, and the number it holds (0 if none).
    pub(super) async fn read_number(
        &self,
        key: String,
    ) -> Result<(Option<KeyValue>, u64), Startup> {
        let resp = self
            .txn_at_start(Txn::new().and_then([TxnOp::get(key, None)]))
            .await?;
        let kv = gets(&resp)
            .into_iter()
            .next()
            .and_then(|kvs| kvs.into_iter().next());
        let n = kv
            .as_ref()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
            .unwrap_or(0);
        Ok((kv, n))
    }

    /// Raises the number under `key` to `value`, by compare-and-set; never
    /// lowers it, and writes it when the key is missing. Returns what was
    /// there before (0 if nothing).
    pub(super) async fn raise(&self, key: String, value: u64) -> Result<u64, Startup> {
        loop {
            let (kv, before) = self.read_number(key.clone()).await?;
            if kv.is_some() && before >= value {
                return Ok(before);
            }
            let seen = kv.as_ref().map_or(0, KeyValue::mod_revision);
            let put = self
                .txn_at_start(
                    Txn::new()
                        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, seen)])
                        .and_then([TxnOp::put(key.clone(), value.to_string(), None)]),
                )
                .await?;
            if put.succeeded() {
                return Ok(before);
            }
        }
    }
}

/// Why a replica could not register its epoch.
pub(super) enum Startup {
    /// etcd answered no: the configuration must change.
    Refused(anyhow::Error),
    /// etcd did not answer.
    Unavailable(String),
}
