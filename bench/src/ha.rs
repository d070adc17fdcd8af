//! The lease service on etcd against raw etcd on the same 3-member cluster,
//! and against the lease service on SQLite, in one run with rotated rounds:
//! what the lease rules cost on top of etcd.
//!
//! The same work on raw etcd, over gRPC (the `etcd-client` crate, as the
//! lease service uses it):
//! - acquire + release = `LeaseGrant` + `Txn(if create_revision(key) == 0
//!   then put key on the lease)` + `LeaseRevoke`: the least a fenced lock on
//!   etcd needs (a token is the key's create revision);
//! - renew = `Txn(if create_revision(key) == the grant's revision and
//!   value(expiry key) > now then put expiry key)`: a holder-checked write
//!   of a new expiry, what a renewal is;
//! - and, for reference, renew as one `LeaseKeepAlive` on a stream the worker
//!   keeps open (`raw_etcd_keepalive`). It does less than a renewal: it
//!   cannot set a new TTL, it proves nothing (anyone with the lease ID can
//!   keep it alive), and etcd's leader answers it without a Raft write.

use crate::leases::{LockClient, Locksvc, PAIR_TTL_MS, RENEW_TTL_MS, Workload, round};
use crate::util::{Series, SeriesSummary, ratio, timed_round};
use anyhow::Context as _;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Three etcd members on loopback (flags of ha-design.md).
#[derive(Debug)]
pub struct Cluster {
    members: Vec<Child>,
    pub endpoints: Vec<String>,
    pub version: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(bin: &Path, tmp: &Path) -> anyhow::Result<Cluster> {
        anyhow::ensure!(bin.exists(), "{} does not exist", bin.display());
        let version = crate::util::version_of(bin);
        let dir = tempfile::Builder::new().prefix("etcd3-").tempdir_in(tmp)?;
        let mut ports = Vec::new();
        for _ in 0..3 {
            ports.push((crate::util::free_port()?, crate::util::free_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let mut members = Vec::new();
        let mut endpoints = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let client = format!("http://127.0.0.1:{c}");
            let peer = format!("http://127.0.0.1:{p}");
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log")))?;
            members.push(
                Command::new(bin)
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(dir.path().join(format!("m{i}")))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &initial.join(",")])
                    .args(["--initial-cluster-token", "fencegate-bench"])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(log))
                    .spawn()
                    .with_context(|| format!("cannot start {}", bin.display()))?,
            );
            endpoints.push(client);
        }
        let cluster = Cluster {
            members,
            endpoints,
            version,
            _dir: dir,
        };
        for e in &cluster.endpoints {
            crate::util::wait_http_ok(&format!("{e}/health"), Duration::from_secs(30))
                .await
                .with_context(|| format!("etcd member {e} did not become healthy"))?;
        }
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

/// A raw etcd client per worker, with the stream its renewals use.
struct Raw {
    client: Client,
    keeper: Mutex<Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>>,
    held: Mutex<Option<i64>>,
    /// The renewed key and its create revision.
    renewed: Mutex<Option<(String, i64)>>,
}

impl Raw {
    async fn acquire_release(&self, key: String) -> anyhow::Result<()> {
        let mut c = self.client.clone();
        let lease = c
            .lease_grant(i64::try_from(PAIR_TTL_MS / 1000)?, None)
            .await?
            .id();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                "owner",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let granted = c.txn(txn).await?.succeeded();
        c.lease_revoke(lease).await?;
        anyhow::ensure!(granted, "{key} was held");
        Ok(())
    }

    /// A renewal as the lease service does it: a holder-checked write of
    /// the new expiry.
    async fn renew_cas(&self) -> anyhow::Result<()> {
        let (key, rev) = self
            .renewed
            .lock()
            .await
            .clone()
            .context("nothing to renew")?;
        let expiry = format!("{key}/expiry");
        let now = format!("{:019}", crate::util::unix_ms());
        let later = format!("{:019}", crate::util::unix_ms() + RENEW_TTL_MS);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, rev),
                Compare::value(expiry.clone(), CompareOp::Greater, now),
            ])
            .and_then([TxnOp::put(expiry, later, None)]);
        let mut c = self.client.clone();
        anyhow::ensure!(c.txn(txn).await?.succeeded(), "lease lost");
        Ok(())
    }

    async fn renew_keepalive(&self) -> anyhow::Result<()> {
        let mut keeper = self.keeper.lock().await;
        if keeper.is_none() {
            let mut c = self.client.clone();
            let id = match *self.held.lock().await {
                Some(id) => id,
                None => anyhow::bail!("no lease to renew"),
            };
            *keeper = Some(c.lease_keep_alive(id).await?);
            return Ok(());
        }
        let (k, stream) = keeper.as_mut().context("keeper")?;
        k.keep_alive().await?;
        let resp = stream.message().await?.context("keep-alive stream ended")?;
        anyhow::ensure!(resp.ttl() > 0, "lease lost");
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct HaOpts {
    pub concurrency: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
    pub etcd_bin: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct HaLevel {
    pub workload: Workload,
    pub concurrency: usize,
    pub locksvc_etcd: SeriesSummary,
    pub raw_etcd: SeriesSummary,
    pub locksvc_sqlite: SeriesSummary,
    /// Renew only: raw etcd's keep-alive (less work than a renewal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_etcd_keepalive: Option<SeriesSummary>,
    /// locksvc on etcd over raw etcd, median ops/s.
    pub ratio_over_raw_etcd: f64,
    /// locksvc on etcd over locksvc on SQLite.
    pub ratio_over_sqlite: f64,
}

#[derive(Debug, Serialize)]
pub struct HaReport {
    pub rounds: usize,
    pub round_secs: f64,
    pub etcd_version: String,
    pub levels: Vec<HaLevel>,
}

async fn raw_round(
    raws: &Arc<Vec<Raw>>,
    workload: Workload,
    keepalive: bool,
    c: usize,
    dur: Duration,
) -> crate::util::RoundResult {
    let raws = raws.clone();
    timed_round(c, dur, move |w, _| {
        let raws = raws.clone();
        async move {
            match workload {
                Workload::AcquireRelease => {
                    raws[w]
                        .acquire_release(format!("/bench-raw/pair-c{c}-w{w}"))
                        .await
                }
                Workload::Renew if keepalive => raws[w].renew_keepalive().await,
                Workload::Renew => raws[w].renew_cas().await,
            }
        }
    })
    .await
}

pub async fn run(fencegate: &Path, tmp: &Path, opts: &HaOpts) -> anyhow::Result<HaReport> {
    let cluster = Cluster::start(&opts.etcd_bin, tmp).await?;
    let on_etcd = Locksvc::start_with(
        fencegate,
        tmp,
        &[
            ("FENCEGATE_ETCD_ENDPOINTS", cluster.endpoints.join(",")),
            ("FENCEGATE_ETCD_PREFIX", "/bench-locksvc/".into()),
        ],
    )
    .await?;
    let on_sqlite = Locksvc::start(fencegate, tmp).await?;
    let mut levels = Vec::new();
    for workload in [Workload::AcquireRelease, Workload::Renew] {
        for &c in &opts.concurrency {
            eprintln!("ha: {workload:?} concurrency {c}");
            let make = |url: &str| -> anyhow::Result<Arc<Vec<LockClient>>> {
                Ok(Arc::new(
                    (0..c)
                        .map(|_| LockClient::new(url))
                        .collect::<anyhow::Result<Vec<_>>>()?,
                ))
            };
            let (ec, sc) = (make(&on_etcd.proc.url)?, make(&on_sqlite.proc.url)?);
            let mut raws = Vec::new();
            for _ in 0..c {
                raws.push(Raw {
                    client: Client::connect(&cluster.endpoints, None).await?,
                    keeper: Mutex::new(None),
                    held: Mutex::new(None),
                    renewed: Mutex::new(None),
                });
            }
            let (mut eheld, mut sheld) = (Vec::new(), Vec::new());
            if workload == Workload::Renew {
                for w in 0..c {
                    let lock = format!("renew-c{c}-w{w}");
                    let owner = format!("w{w}");
                    eheld.push((
                        lock.clone(),
                        ec[w].acquire(&lock, &owner, RENEW_TTL_MS).await?,
                    ));
                    sheld.push((
                        lock.clone(),
                        sc[w].acquire(&lock, &owner, RENEW_TTL_MS).await?,
                    ));
                    let mut client = raws[w].client.clone();
                    let id = client
                        .lease_grant(i64::try_from(RENEW_TTL_MS / 1000)?, None)
                        .await?
                        .id();
                    client
                        .put(
                            format!("/bench-raw/keepalive-c{c}-w{w}"),
                            owner.clone(),
                            Some(PutOptions::new().with_lease(id)),
                        )
                        .await?;
                    *raws[w].held.lock().await = Some(id);
                    let key = format!("/bench-raw/renew-c{c}-w{w}");
                    let put = client.put(key.clone(), owner, None).await?;
                    let rev = put.header().map_or(0, |h| h.revision());
                    let later = format!("{:019}", crate::util::unix_ms() + RENEW_TTL_MS);
                    client.put(format!("{key}/expiry"), later, None).await?;
                    *raws[w].renewed.lock().await = Some((key, rev));
                }
            }
            let (eheld, sheld, raws) = (Arc::new(eheld), Arc::new(sheld), Arc::new(raws));
            let warm = opts.round / 4;
            let _ = round(&ec, &eheld, workload, c, warm).await;
            let _ = round(&sc, &sheld, workload, c, warm).await;
            let _ = raw_round(&raws, workload, false, c, warm).await;
            let renew = workload == Workload::Renew;
            if renew {
                let _ = raw_round(&raws, workload, true, c, warm).await;
            }
            let (mut es, mut rs, mut ss, mut ks) = (
                Series::default(),
                Series::default(),
                Series::default(),
                Series::default(),
            );
            let variants = if renew { 4 } else { 3 };
            for r in 0..opts.rounds {
                // Rotate which variant goes first.
                for k in 0..variants {
                    let d = opts.round;
                    match (r + k) % variants {
                        0 => es.add(round(&ec, &eheld, workload, c, d).await),
                        1 => rs.add(raw_round(&raws, workload, false, c, d).await),
                        2 => ss.add(round(&sc, &sheld, workload, c, d).await),
                        _ => ks.add(raw_round(&raws, workload, true, c, d).await),
                    }
                }
            }
            let (es, rs, ss) = (es.summary(), rs.summary(), ss.summary());
            let ks = renew.then(|| ks.summary());
            levels.push(HaLevel {
                workload,
                concurrency: c,
                ratio_over_raw_etcd: ratio(es.median_ops_per_sec, rs.median_ops_per_sec),
                ratio_over_sqlite: ratio(es.median_ops_per_sec, ss.median_ops_per_sec),
                locksvc_etcd: es,
                raw_etcd: rs,
                locksvc_sqlite: ss,
                raw_etcd_keepalive: ks,
            });
            for (w, (lock, t)) in eheld.iter().enumerate() {
                let _ = ec[w].release(lock, t).await;
            }
            for (w, (lock, t)) in sheld.iter().enumerate() {
                let _ = sc[w].release(lock, t).await;
            }
        }
    }
    Ok(HaReport {
        rounds: opts.rounds,
        round_secs: opts.round.as_secs_f64(),
        etcd_version: cluster.version.clone(),
        levels,
    })
}

pub fn print(r: &HaReport) {
    println!(
        "\n== lease service on etcd vs raw etcd (3 members) vs SQLite: {} rotated rounds of {:.1}s ==",
        r.rounds, r.round_secs
    );
    println!("etcd: {}", r.etcd_version);
    println!(
        "{:<15} {:>4} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>10} {:>8} | {:>7} {:>7} | errors",
        "workload",
        "conc",
        "on etcd/s",
        "p50 ms",
        "p99 ms",
        "raw etcd/s",
        "p50 ms",
        "p99 ms",
        "sqlite/s",
        "p50 ms",
        "/raw",
        "/sqlite"
    );
    for l in &r.levels {
        println!(
            "{:<15} {:>4} | {} | {} | {:>10.1} {:>8.3} | {:>7.3} {:>7.3} | {} {} {}",
            format!("{:?}", l.workload),
            l.concurrency,
            SeriesSummary::cells(Some(&l.locksvc_etcd)),
            SeriesSummary::cells(Some(&l.raw_etcd)),
            l.locksvc_sqlite.median_ops_per_sec,
            l.locksvc_sqlite.latency.p50_ms,
            l.ratio_over_raw_etcd,
            l.ratio_over_sqlite,
            l.locksvc_etcd.errors,
            l.raw_etcd.errors,
            l.locksvc_sqlite.errors,
        );
        if let Some(k) = &l.raw_etcd_keepalive {
            println!(
                "{:<15} {:>4} |   (raw etcd keep-alive, less work than a renewal: {:.1}/s, p50 {:.3} ms; on etcd / keep-alive {:.3})",
                "",
                "",
                k.median_ops_per_sec,
                k.latency.p50_ms,
                ratio(l.locksvc_etcd.median_ops_per_sec, k.median_ops_per_sec)
            );
        }
        for (what, s) in [
            ("on etcd", &l.locksvc_etcd),
            ("raw etcd", &l.raw_etcd),
            ("sqlite", &l.locksvc_sqlite),
        ] {
            if let Some(e) = &s.first_error {
                println!("    {what}: first error: {e}");
            }
        }
    }
}
