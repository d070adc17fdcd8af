//! `locksvc` and `etcd`: acquire+release pairs and renewals per second at
//! several client concurrencies, against a real `fencegate locksvc`
//! process (SQLite on a real directory) and, in the same run with
//! interleaved rounds, etcd 3.4 through its JSON gRPC gateway.
//!
//! Equivalent work on etcd:
//! - acquire = `lease/grant` (TTL) + `kv/txn` (if `create_revision(key) == 0`
//!   then put key with the lease); release = `lease/revoke` (which deletes
//!   the key);
//! - renew = one `lease/keepalive` round trip.

use crate::util::{Proc, Series, SeriesSummary, ratio, timed_round};
use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fencegate_core::FencingToken;
use fencegate_lease_api::{AcquireRequest, ReleaseRequest, RenewRequest, path};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// TTL of the leases taken by pair workloads (ms); long enough never to
/// expire during a round.
pub(crate) const PAIR_TTL_MS: u64 = 30_000;
/// TTL of the leases being renewed.
pub(crate) const RENEW_TTL_MS: u64 = 600_000;

// ---------------------------------------------------------------- locksvc

/// A running `fencegate locksvc` with its database in a temp dir.
#[derive(Debug)]
pub struct Locksvc {
    pub proc: Proc,
    /// Removed when dropped.
    _dir: tempfile::TempDir,
}

impl Locksvc {
    pub async fn start(fencegate: &Path, tmp: &Path) -> anyhow::Result<Locksvc> {
        Locksvc::start_with(fencegate, tmp, &[]).await
    }

    /// With more environment (`FENCEGATE_ETCD_*` for the etcd backend).
    pub async fn start_with(
        fencegate: &Path,
        tmp: &Path,
        env: &[(&str, String)],
    ) -> anyhow::Result<Locksvc> {
        let dir = tempfile::Builder::new()
            .prefix("locksvc-")
            .tempdir_in(tmp)?;
        let mut cmd = Command::new(fencegate);
        cmd.args(["locksvc", "--create-db", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("locksvc.db"))
            .env("FENCEGATE_SIGNING_KEYS", crate::util::SIGNING_KEY)
            .env("FENCEGATE_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let log = dir.path().join("locksvc.log");
        let proc = tokio::task::spawn_blocking(move || Proc::start_fencegate(cmd, log)).await??;
        Ok(Locksvc { proc, _dir: dir })
    }
}

/// A JSON-over-HTTP endpoint (the lease service, or etcd's gateway), one
/// connection pool per client.
#[derive(Debug, Clone)]
struct JsonApi {
    http: reqwest::Client,
    base: String,
}

impl JsonApi {
    fn new(base: &str) -> anyhow::Result<JsonApi> {
        Ok(JsonApi {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            base: base.to_owned(),
        })
    }

    /// POSTs `body` to `path`; the answer's text, if it is a success.
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<String> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {text}");
        Ok(text)
    }
}

/// A lease service client (one per worker: its own connection): the API's
/// own client, plus a plain GET for /metrics.
#[derive(Debug, Clone)]
pub struct LockClient {
    api: fencegate_lease_api::Client,
    http: reqwest::Client,
    base: String,
}

impl LockClient {
    pub fn new(base: &str) -> anyhow::Result<LockClient> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        Ok(LockClient {
            api: fencegate_lease_api::Client::new(http.clone(), base, None),
            http,
            base: base.to_owned(),
        })
    }

    fn token(token: &str) -> anyhow::Result<FencingToken> {
        FencingToken::parse(token).map_err(|e| anyhow::anyhow!("token {token:?}: {e}"))
    }

    /// Acquires `lock`; returns the signed `fencing_token`, which is what
    /// renew and release need (a number proves nothing).
    pub async fn acquire(&self, lock: &str, owner: &str, ttl_ms: u64) -> anyhow::Result<String> {
        let req = AcquireRequest {
            owner: owner.to_owned(),
            ttl_ms: Some(ttl_ms),
            wait_ms: None,
            idempotency_key: None,
        };
        Ok(self.api.acquire(lock, &req, None).await?.fencing_token)
    }

    pub async fn release(&self, lock: &str, token: &str) -> anyhow::Result<()> {
        let req = ReleaseRequest {
            token: Self::token(token)?,
        };
        self.api.release(lock, &req, None).await?;
        Ok(())
    }

    pub async fn renew(&self, lock: &str, token: &str, ttl_ms: u64) -> anyhow::Result<()> {
        let req = RenewRequest {
            token: Self::token(token)?,
            ttl_ms: Some(ttl_ms),
        };
        self.api.renew(lock, &req, None).await?;
        Ok(())
    }

    /// Group-commit figures from /metrics.
    pub async fn engine_stats(&self) -> anyhow::Result<EngineStats> {
        let text = self
            .http
            .get(format!("{}{}", self.base, path::METRICS))
            .send()
            .await?
            .text()
            .await?;
        let get = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == name).then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0.0)
        };
        Ok(EngineStats {
            fsyncs: get("fencegate_locksvc_fsync_seconds_count"),
            fsync_seconds: get("fencegate_locksvc_fsync_seconds_sum"),
            batches: get("fencegate_locksvc_batch_size_count"),
            batched_requests: get("fencegate_locksvc_batch_size_sum"),
        })
    }
}

/// The lease engine's group commit, from its metrics.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EngineStats {
    pub fsyncs: f64,
    pub fsync_seconds: f64,
    pub batches: f64,
    pub batched_requests: f64,
}

impl EngineStats {
    fn since(self, e: EngineStats) -> EngineDelta {
        let fsyncs = self.fsyncs - e.fsyncs;
        let batches = self.batches - e.batches;
        EngineDelta {
            fsyncs,
            mean_fsync_ms: if fsyncs > 0.0 {
                (self.fsync_seconds - e.fsync_seconds) / fsyncs * 1e3
            } else {
                0.0
            },
            batches,
            mean_batch: if batches > 0.0 {
                (self.batched_requests - e.batched_requests) / batches
            } else {
                0.0
            },
        }
    }
}

/// Group-commit activity over one series.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EngineDelta {
    pub fsyncs: f64,
    pub mean_fsync_ms: f64,
    pub batches: f64,
    pub mean_batch: f64,
}

// ---------------------------------------------------------------- etcd

/// A single-node etcd on loopback with a temp data dir.
#[derive(Debug)]
pub struct Etcd {
    pub proc: Proc,
    /// Removed when dropped.
    _dir: tempfile::TempDir,
    pub version: String,
}

impl Etcd {
    pub async fn start(bin: &Path, tmp: &Path) -> anyhow::Result<Etcd> {
        anyhow::ensure!(bin.exists(), "{} does not exist", bin.display());
        let version = crate::util::version_of(bin);
        let dir = tempfile::Builder::new().prefix("etcd-").tempdir_in(tmp)?;
        let (p, q) = (crate::util::free_port()?, crate::util::free_port()?);
        let client = format!("http://127.0.0.1:{p}");
        let peer = format!("http://127.0.0.1:{q}");
        let log = dir.path().join("etcd.log");
        let child = Command::new(bin)
            .arg("--name")
            .arg("bench")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?))
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let proc = Proc {
            child,
            url: client.clone(),
            log,
        };
        crate::util::wait_http_ok(&format!("{client}/health"), Duration::from_secs(30))
            .await
            .with_context(|| {
                format!(
                    "etcd did not become healthy; log:\n{}",
                    std::fs::read_to_string(&proc.log).unwrap_or_default()
                )
            })?;
        Ok(Etcd {
            proc,
            _dir: dir,
            version,
        })
    }
}

#[derive(Debug, Clone)]
pub struct EtcdClient {
    api: JsonApi,
}

impl EtcdClient {
    pub fn new(base: &str) -> anyhow::Result<EtcdClient> {
        Ok(EtcdClient {
            api: JsonApi::new(base)?,
        })
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let text = self.api.post(path, body).await?;
        // keepalive answers a stream of JSON objects; take the first.
        let mut de = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
        de.next()
            .with_context(|| format!("{path}: empty answer"))?
            .with_context(|| format!("{path}: not JSON: {text}"))
    }

    /// A lease with `ttl_s`; returns its ID (a decimal string, as the
    /// gateway encodes int64).
    pub async fn grant(&self, ttl_s: u64) -> anyhow::Result<String> {
        let v = self
            .post("/v3/lease/grant", json!({ "TTL": ttl_s }))
            .await?;
        v["ID"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no lease ID in {v}"))
    }

    /// The lock: put `key` with `lease` if nobody created it.
    pub async fn try_lock(&self, key: &str, owner: &str, lease: &str) -> anyhow::Result<bool> {
        let k = B64.encode(key);
        let v = self
            .post(
                "/v3/kv/txn",
                json!({
                    "compare": [{"target": "CREATE", "key": k, "createRevision": "0"}],
                    "success": [{"requestPut": {"key": k, "value": B64.encode(owner), "lease": lease}}],
                    "failure": [{"requestRange": {"key": k}}],
                }),
            )
            .await?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    pub async fn acquire(&self, key: &str, owner: &str, ttl_s: u64) -> anyhow::Result<String> {
        let lease = self.grant(ttl_s).await?;
        if self.try_lock(key, owner, &lease).await? {
            Ok(lease)
        } else {
            let _ = self.revoke(&lease).await;
            anyhow::bail!("{key} is held")
        }
    }

    pub async fn revoke(&self, lease: &str) -> anyhow::Result<()> {
        self.post("/v3/lease/revoke", json!({ "ID": lease }))
            .await
            .map(drop)
    }

    pub async fn keepalive(&self, lease: &str) -> anyhow::Result<()> {
        let v = self
            .post("/v3/lease/keepalive", json!({ "ID": lease }))
            .await?;
        let ttl = v["result"]["TTL"]
            .as_str()
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0);
        anyhow::ensure!(ttl > 0, "keepalive of {lease} failed: {v}");
        Ok(())
    }
}

// ---------------------------------------------------------------- bench

#[derive(Debug, Clone)]
pub struct LeaseOpts {
    pub concurrency: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
    pub with_etcd: bool,
    pub etcd_bin: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// acquire then release, repeated, one lock per worker.
    AcquireRelease,
    /// renew a held lease, repeated, one lease per worker.
    Renew,
}

#[derive(Debug, Serialize)]
pub struct LeaseLevel {
    pub workload: Workload,
    pub concurrency: usize,
    /// ops = pairs (acquire+release) or renewals.
    pub locksvc: SeriesSummary,
    pub locksvc_engine: EngineDelta,
    pub etcd: Option<SeriesSummary>,
    /// locksvc median ops/s over etcd median ops/s.
    pub ratio_locksvc_over_etcd: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct LeaseReport {
    pub rounds: usize,
    pub round_secs: f64,
    pub etcd_version: Option<String>,
    /// Why etcd was not measured, if it was not.
    pub etcd_unavailable: Option<String>,
    pub levels: Vec<LeaseLevel>,
}

/// One worker's client in a lease round, on either system: it takes and
/// gives back a lease, or renews the lease it holds.
pub(crate) trait Contender: Send + Sync + 'static {
    /// What a worker holds for the renew workload.
    type Held: Send + Sync + 'static;
    /// Takes a lease of a lock of its own (`c` workers, this one `w`) and
    /// gives it back.
    fn pair(&self, c: usize, w: usize) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Renews `held`.
    fn renew(&self, held: &Self::Held) -> impl Future<Output = anyhow::Result<()>> + Send;
}

impl Contender for LockClient {
    type Held = (String, String);

    async fn pair(&self, c: usize, w: usize) -> anyhow::Result<()> {
        let lock = format!("pair-c{c}-w{w}");
        let t = self.acquire(&lock, &format!("w{w}"), PAIR_TTL_MS).await?;
        self.release(&lock, &t).await
    }

    async fn renew(&self, (lock, t): &(String, String)) -> anyhow::Result<()> {
        LockClient::renew(self, lock, t, RENEW_TTL_MS).await
    }
}

impl Contender for EtcdClient {
    type Held = String;

    async fn pair(&self, c: usize, w: usize) -> anyhow::Result<()> {
        let key = format!("/bench/pair-c{c}-w{w}");
        let lease = self
            .acquire(&key, &format!("w{w}"), PAIR_TTL_MS / 1000)
            .await?;
        self.revoke(&lease).await
    }

    async fn renew(&self, lease: &String) -> anyhow::Result<()> {
        self.keepalive(lease).await
    }
}

/// `c` workers running `workload` for `dur`, worker `w` on `clients[w]`
/// (and, renewing, `held[w]`).
pub(crate) async fn round<C: Contender>(
    clients: &Arc<Vec<C>>,
    held: &Arc<Vec<C::Held>>,
    workload: Workload,
    c: usize,
    dur: Duration,
) -> crate::util::RoundResult {
    let clients = clients.clone();
    let held = held.clone();
    timed_round(c, dur, move |w, _| {
        let clients = clients.clone();
        let held = held.clone();
        async move {
            match workload {
                Workload::AcquireRelease => clients[w].pair(c, w).await,
                Workload::Renew => clients[w].renew(&held[w]).await,
            }
        }
    })
    .await
}

pub async fn run(fencegate: &Path, tmp: &Path, opts: &LeaseOpts) -> anyhow::Result<LeaseReport> {
    let locksvc = Locksvc::start(fencegate, tmp).await?;
    let (etcd, etcd_unavailable) = if opts.with_etcd {
        match Etcd::start(&opts.etcd_bin, tmp).await {
            Ok(e) => (Some(e), None),
            Err(e) => {
                let why = format!("etcd could not be started: {e:#}");
                eprintln!("locksvc/etcd: {why}; measuring locksvc alone");
                (None, Some(why))
            }
        }
    } else {
        (None, Some("not requested (run `etcd` or `all`)".to_owned()))
    };
    let mut levels = Vec::new();
    for workload in [Workload::AcquireRelease, Workload::Renew] {
        for &c in &opts.concurrency {
            eprintln!("leases: {workload:?} concurrency {c}");
            let lclients = Arc::new(
                (0..c)
                    .map(|_| LockClient::new(&locksvc.proc.url))
                    .collect::<anyhow::Result<Vec<_>>>()?,
            );
            let eclients = match &etcd {
                Some(e) => Some(Arc::new(
                    (0..c)
                        .map(|_| EtcdClient::new(&e.proc.url))
                        .collect::<anyhow::Result<Vec<_>>>()?,
                )),
                None => None,
            };
            // Leases to renew, taken before timing.
            let mut lheld = Vec::new();
            let mut eheld = Vec::new();
            if workload == Workload::Renew {
                for w in 0..c {
                    let lock = format!("renew-c{c}-w{w}");
                    let t = lclients[w]
                        .acquire(&lock, &format!("w{w}"), RENEW_TTL_MS)
                        .await?;
                    lheld.push((lock, t));
                    if let Some(ec) = &eclients {
                        eheld.push(
                            ec[w]
                                .acquire(
                                    &format!("/bench/renew-c{c}-w{w}"),
                                    &format!("w{w}"),
                                    RENEW_TTL_MS / 1000,
                                )
                                .await?,
                        );
                    }
                }
            }
            let (lheld, eheld) = (Arc::new(lheld), Arc::new(eheld));
            // Warm-up: connections.
            let warm = opts.round / 4;
            let _ = round(&lclients, &lheld, workload, c, warm).await;
            if let Some(ec) = &eclients {
                let _ = round(ec, &eheld, workload, c, warm).await;
            }
            let engine_before = lclients[0].engine_stats().await?;
            let (mut ls, mut es) = (Series::default(), Series::default());
            for r in 0..opts.rounds {
                let locksvc_first = r % 2 == 0;
                if locksvc_first {
                    ls.add(round(&lclients, &lheld, workload, c, opts.round).await);
                }
                if let Some(ec) = &eclients {
                    es.add(round(ec, &eheld, workload, c, opts.round).await);
                }
                if !locksvc_first {
                    ls.add(round(&lclients, &lheld, workload, c, opts.round).await);
                }
            }
            let engine = lclients[0].engine_stats().await?.since(engine_before);
            let ls = ls.summary();
            let es = eclients.as_ref().map(|_| es.summary());
            levels.push(LeaseLevel {
                workload,
                concurrency: c,
                ratio_locksvc_over_etcd: es
                    .as_ref()
                    .map(|e| ratio(ls.median_ops_per_sec, e.median_ops_per_sec)),
                locksvc: ls,
                locksvc_engine: engine,
                etcd: es,
            });
            // Leave nothing held.
            for (w, (lock, t)) in lheld.iter().enumerate() {
                let _ = lclients[w].release(lock, t).await;
            }
            if let Some(ec) = &eclients {
                for (w, lease) in eheld.iter().enumerate() {
                    let _ = ec[w].revoke(lease).await;
                }
            }
        }
    }
    Ok(LeaseReport {
        rounds: opts.rounds,
        round_secs: opts.round.as_secs_f64(),
        etcd_version: etcd.as_ref().map(|e| e.version.clone()),
        etcd_unavailable,
        levels,
    })
}

pub fn print(r: &LeaseReport) {
    println!(
        "\n== lease service vs etcd: {} interleaved rounds of {:.1}s ==",
        r.rounds, r.round_secs
    );
    if let Some(v) = &r.etcd_version {
        println!("etcd: {v}");
    }
    if let Some(why) = &r.etcd_unavailable {
        println!("etcd: NOT MEASURED: {why}");
    }
    println!(
        "{:<15} {:>4} | {:>10} {:>8} {:>8} {:>7} {:>8} {:>6} | {:>10} {:>8} {:>8} | {:>7}",
        "workload",
        "conc",
        "locksvc/s",
        "p50 ms",
        "p99 ms",
        "fsyncs",
        "fsync ms",
        "batch",
        "etcd/s",
        "p50 ms",
        "p99 ms",
        "ratio"
    );
    for l in &r.levels {
        println!(
            "{:<15} {:>4} | {} {:>7.0} {:>8.3} {:>6.1} | {} | {:>7.3}",
            format!("{:?}", l.workload),
            l.concurrency,
            SeriesSummary::cells(Some(&l.locksvc)),
            l.locksvc_engine.fsyncs,
            l.locksvc_engine.mean_fsync_ms,
            l.locksvc_engine.mean_batch,
            SeriesSummary::cells(l.etcd.as_ref()),
            l.ratio_locksvc_over_etcd.unwrap_or(f64::NAN)
        );
        for (name, s) in [("locksvc", Some(&l.locksvc)), ("etcd", l.etcd.as_ref())] {
            if let Some(s) = s
                && s.errors > 0
            {
                println!(
                    "    {name}: {} errors, first: {}",
                    s.errors,
                    s.first_error.as_deref().unwrap_or("")
                );
            }
        }
    }
}
