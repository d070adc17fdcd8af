//! `growth`: what one fenced write and one grant cost as the number of
//! fence scopes, keys and locks grows.
//!
//! In process (the proxy's and the core's own types, release build):
//! - `Fences::admit` with an equal token (the steady-state fenced write)
//!   over 1..100k scopes, and the cost of a raise (one fsync);
//! - `Keys::lock` + `known` + `remember` over 1..1M distinct keys with the
//!   bounded ETag cache (hit rate, cache size);
//! - `LockTable` acquire+release over 1..1M held locks, and the periodic
//!   purge scan the engine runs every second.
//!
//! Over HTTP: acquire+release pairs against a real `fencegate locksvc` as
//! the number of held locks grows.

use crate::leases::{LockClient, Locksvc};
use crate::util::{Latency, Rng, Series, SeriesSummary, self_memory, timed_round};
use fencegate_core::{LockName, LockTable, Timestamp};
use fencegate_proxy::fences::Fences;
use fencegate_proxy::keys::{Keys, Known};
use fencegate_proxy::state::db::Db;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct GrowthOpts {
    pub scope_levels: Vec<usize>,
    pub admits_per_level: usize,
    pub raises: usize,
    pub key_levels: Vec<usize>,
    pub cache_entries: usize,
    pub lock_levels: Vec<usize>,
    pub grants_per_level: usize,
    pub http_lock_levels: Vec<usize>,
    pub http_concurrency: usize,
    pub http_rounds: usize,
    pub http_round: Duration,
}

#[derive(Debug, Serialize)]
pub struct ScopeLevel {
    pub scopes: usize,
    /// Creating each scope = one raise, with the database on `populate_fs`.
    pub populate_ns_per_scope: f64,
    pub admit_equal_ns: f64,
}

#[derive(Debug, Serialize)]
pub struct RaiseCost {
    pub db_fs: String,
    /// `Fences::admit` with a higher token.
    pub latency: Latency,
    /// `Db::raise` alone (the SQLite commit), called synchronously.
    pub db_raise_only: Latency,
}

#[derive(Debug, Serialize)]
pub struct KeyLevel {
    pub keys: usize,
    pub cache_capacity: usize,
    /// The first write of each key (n operations; noisy for tiny n).
    pub first_write_ns: f64,
    pub rewrite_ns: f64,
    pub rewrite_hit_rate: f64,
    pub random_ns: f64,
    pub random_hit_rate: f64,
    pub cached_after: usize,
    pub locked_after: usize,
    /// This process's RSS growth over the passes (the key names are
    /// allocated before; freed memory of earlier levels may be reused, so
    /// this is a lower bound of what the cache and locks hold).
    pub bench_rss_growth_kib: i64,
}

#[derive(Debug, Serialize)]
pub struct LockLevel {
    pub locks: usize,
    pub grant_release_ns: f64,
    pub purge_scan_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct HttpLockLevel {
    pub held_locks: usize,
    /// Grants/s while populating up to this level (concurrency 32, no release).
    pub populate_grants_per_sec: Option<f64>,
    pub concurrency: usize,
    pub pairs: SeriesSummary,
    pub locksvc_rss_kib: u64,
}

#[derive(Debug, Serialize)]
pub struct GrowthReport {
    pub scopes: Vec<ScopeLevel>,
    pub populate_fs: String,
    pub raise: RaiseCost,
    pub keys: Vec<KeyLevel>,
    pub lock_table: Vec<LockLevel>,
    pub locksvc_http: Vec<HttpLockLevel>,
}

/// Fewest timed operations per measurement (small levels repeat).
const MIN_OPS: usize = 200_000;

fn ns_per(started: Instant, n: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / n.max(1) as f64
}

/// Where the scope population's database goes: tmpfs when there is one
/// (creating 100k scopes is 100k raises, one fsync each on a disk).
fn populate_dir(tmp: &Path) -> anyhow::Result<(tempfile::TempDir, String)> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new().prefix("bench-").tempdir_in(shm)
    {
        return Ok((d, "tmpfs (/dev/shm)".into()));
    }
    Ok((
        tempfile::Builder::new().prefix("fences-").tempdir_in(tmp)?,
        format!("{} (bench tmp dir)", tmp.display()),
    ))
}

async fn scopes(opts: &GrowthOpts, tmp: &Path) -> anyhow::Result<(Vec<ScopeLevel>, String)> {
    let mut out = Vec::new();
    let mut fs = String::new();
    for &n in &opts.scope_levels {
        eprintln!("growth: {n} fence scopes");
        let (dir, f) = populate_dir(tmp)?;
        fs = f;
        let fences = Fences::load(
            Db::open(
                &dir.path().join("proxy.db"),
                fencegate_durable::Opening::CreateIfMissing,
                0,
            )?,
            std::time::Duration::ZERO,
        )?;
        let ids: Vec<String> = (0..n).map(|i| format!("bucket-{i}")).collect();
        let t = Instant::now();
        for id in &ids {
            drop(fences.admit(id, 1).await?);
        }
        let populate = ns_per(t, n);
        let mut rng = Rng::new(n as u64 + 1);
        for _ in 0..10_000 {
            drop(fences.admit(&ids[rng.below(n)], 1).await?);
        }
        let picks: Vec<usize> = (0..opts.admits_per_level).map(|_| rng.below(n)).collect();
        let t = Instant::now();
        for &i in &picks {
            drop(fences.admit(&ids[i], 1).await?);
        }
        out.push(ScopeLevel {
            scopes: n,
            populate_ns_per_scope: populate,
            admit_equal_ns: ns_per(t, picks.len()),
        });
    }
    Ok((out, fs))
}

async fn raise_cost(opts: &GrowthOpts, tmp: &Path) -> anyhow::Result<RaiseCost> {
    let dir = tempfile::Builder::new().prefix("raise-").tempdir_in(tmp)?;
    let db = Db::open(
        &dir.path().join("proxy.db"),
        fencegate_durable::Opening::CreateIfMissing,
        0,
    )?;
    let fences = Fences::load(db.clone(), std::time::Duration::ZERO)?;
    // Alternate: a raise through the fence (epoch barrier + spawn_blocking
    // + SQLite), and the same SQLite statement called directly.
    let (mut lat, mut db_lat) = (Vec::new(), Vec::new());
    for i in 0..opts.raises as u64 {
        let t = Instant::now();
        drop(fences.admit("scope", 2 * i + 1).await?);
        lat.push(t.elapsed().as_nanos() as u64);
        let t = Instant::now();
        db.raise("direct", 2 * i + 2)?;
        db_lat.push(t.elapsed().as_nanos() as u64);
    }
    Ok(RaiseCost {
        db_fs: format!("{} (bench tmp dir)", tmp.display()),
        latency: Latency::of(lat),
        db_raise_only: Latency::of(db_lat),
    })
}

async fn keys(opts: &GrowthOpts) -> anyhow::Result<Vec<KeyLevel>> {
    let mut out = Vec::new();
    let etag = "0123456789abcdef0123456789abcdef".to_owned();
    for &n in &opts.key_levels {
        eprintln!("growth: {n} keys, cache {}", opts.cache_entries);
        let names: Vec<String> = (0..n).map(|i| format!("data/{i:08}")).collect();
        let rss0 = self_memory()?.rss_kib;
        let keys = Keys::new(opts.cache_entries);
        let remember = || Known::Present {
            etag: etag.clone(),
            token: 1,
        };
        let t = Instant::now();
        for k in &names {
            let g = keys.lock("bench", k).await;
            let _ = g.known();
            g.remember(remember());
        }
        let first = ns_per(t, n);
        // Rewrites in the same order, cycling until at least MIN_OPS.
        let ops = n.max(MIN_OPS);
        let mut hits = 0usize;
        let t = Instant::now();
        for j in 0..ops {
            let g = keys.lock("bench", &names[j % n]).await;
            hits += usize::from(g.known().is_some());
            g.remember(remember());
        }
        let rewrite = ns_per(t, ops);
        let rewrite_hits = hits as f64 / ops as f64;
        let mut rng = Rng::new(99);
        let picks: Vec<usize> = (0..ops.min(1_000_000)).map(|_| rng.below(n)).collect();
        let mut hits = 0usize;
        let t = Instant::now();
        for &i in &picks {
            let g = keys.lock("bench", &names[i]).await;
            hits += usize::from(g.known().is_some());
            g.remember(remember());
        }
        let random = ns_per(t, picks.len());
        let rss1 = self_memory()?.rss_kib;
        out.push(KeyLevel {
            keys: n,
            cache_capacity: opts.cache_entries,
            first_write_ns: first,
            rewrite_ns: rewrite,
            rewrite_hit_rate: rewrite_hits,
            random_ns: random,
            random_hit_rate: hits as f64 / picks.len().max(1) as f64,
            cached_after: keys.cached(),
            locked_after: keys.locked(),
            bench_rss_growth_kib: rss1 as i64 - rss0 as i64,
        });
    }
    Ok(out)
}

fn lock_table(opts: &GrowthOpts) -> anyhow::Result<Vec<LockLevel>> {
    let mut out = Vec::new();
    let ttl = Duration::from_secs(3600);
    let now = Timestamp(1_000_000);
    let probes: Vec<LockName> = (0..1024)
        .map(|i| LockName::new(&format!("probe-{i}")))
        .collect::<Result<_, _>>()?;
    for &n in &opts.lock_levels {
        eprintln!("growth: LockTable with {n} held locks");
        let mut table = LockTable::new();
        for i in 0..n {
            let name = LockName::new(&format!("held-{i}"))?;
            table
                .acquire(&name, "holder", None, ttl, now)
                .map_err(|h| anyhow::anyhow!("held: {h:?}"))?;
        }
        let k = opts.grants_per_level;
        let t = Instant::now();
        for j in 0..k {
            let lock = &probes[j % probes.len()];
            let g = table
                .acquire(lock, "o", None, ttl, now)
                .map_err(|h| anyhow::anyhow!("held: {h:?}"))?;
            table
                .release(lock, g.lease.token, now)
                .map_err(|e| anyhow::anyhow!("release: {e:?}"))?;
        }
        let per = ns_per(t, k);
        let scans = 10;
        let t = Instant::now();
        for _ in 0..scans {
            let expired = table.purge_expired(now);
            anyhow::ensure!(expired.is_empty(), "nothing should expire");
        }
        out.push(LockLevel {
            locks: n,
            grant_release_ns: per,
            purge_scan_ms: t.elapsed().as_secs_f64() * 1e3 / f64::from(scans),
        });
    }
    Ok(out)
}

async fn locksvc_http(
    opts: &GrowthOpts,
    fencegate: &Path,
    tmp: &Path,
) -> anyhow::Result<Vec<HttpLockLevel>> {
    let svc = Locksvc::start(fencegate, tmp).await?;
    let mut held = 0usize;
    let mut out = Vec::new();
    let c = opts.http_concurrency;
    let clients = Arc::new(
        (0..c)
            .map(|_| LockClient::new(&svc.proc.url))
            .collect::<anyhow::Result<Vec<_>>>()?,
    );
    for &level in &opts.http_lock_levels {
        let mut populate_rate = None;
        if level > held {
            eprintln!("growth: locksvc, taking locks {held}..{level}");
            let fill = 32usize;
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(held));
            let t = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..fill {
                let next = next.clone();
                let cl = LockClient::new(&svc.proc.url)?;
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= level {
                            return anyhow::Ok(());
                        }
                        cl.acquire(&format!("held-{i}"), "holder", 3_600_000)
                            .await?;
                    }
                }));
            }
            for task in tasks {
                task.await??;
            }
            populate_rate = Some((level - held) as f64 / t.elapsed().as_secs_f64());
            held = level;
        }
        eprintln!("growth: locksvc pairs with {held} held locks");
        let mut series = Series::default();
        // A fresh database is slower for its first few thousand commits
        // (the WAL and the file grow): warm up longer before the first level.
        let warm_for = if out.is_empty() {
            opts.http_round * 2
        } else {
            opts.http_round / 4
        };
        let warm = {
            let clients = clients.clone();
            timed_round(c, warm_for, move |w, _| {
                let clients = clients.clone();
                async move {
                    let lock = format!("grow-w{w}");
                    let t = clients[w].acquire(&lock, "o", 30_000).await?;
                    clients[w].release(&lock, &t).await
                }
            })
            .await
        };
        drop(warm);
        for _ in 0..opts.http_rounds {
            let clients = clients.clone();
            series.add(
                timed_round(c, opts.http_round, move |w, _| {
                    let clients = clients.clone();
                    async move {
                        let lock = format!("grow-w{w}");
                        let t = clients[w].acquire(&lock, "o", 30_000).await?;
                        clients[w].release(&lock, &t).await
                    }
                })
                .await,
            );
        }
        out.push(HttpLockLevel {
            held_locks: held,
            populate_grants_per_sec: populate_rate,
            concurrency: c,
            pairs: series.summary(),
            locksvc_rss_kib: svc.proc.memory()?.rss_kib,
        });
    }
    Ok(out)
}

pub async fn run(opts: &GrowthOpts, fencegate: &Path, tmp: &Path) -> anyhow::Result<GrowthReport> {
    let (scopes, populate_fs) = scopes(opts, tmp).await?;
    let raise = raise_cost(opts, tmp).await?;
    let keys = keys(opts).await?;
    let lock_table = lock_table(opts)?;
    let locksvc_http = locksvc_http(opts, fencegate, tmp).await?;
    Ok(GrowthReport {
        scopes,
        populate_fs,
        raise,
        keys,
        lock_table,
        locksvc_http,
    })
}

pub fn print(r: &GrowthReport) {
    println!("\n== growth ==");
    println!(
        "Fences::admit, equal token (steady-state fenced write); scopes created on {}",
        r.populate_fs
    );
    println!(
        "{:>9} | {:>16} | {:>20}",
        "scopes", "admit ns/op", "create ns/scope"
    );
    for s in &r.scopes {
        println!(
            "{:>9} | {:>16.1} | {:>20.1}",
            s.scopes, s.admit_equal_ns, s.populate_ns_per_scope
        );
    }
    println!(
        "fence raise (max_token fsync'd) on {}: p50 {:.3} ms, p99 {:.3} ms over {} raises; the SQLite commit alone: p50 {:.3} ms, p99 {:.3} ms",
        r.raise.db_fs,
        r.raise.latency.p50_ms,
        r.raise.latency.p99_ms,
        r.raise.latency.samples,
        r.raise.db_raise_only.p50_ms,
        r.raise.db_raise_only.p99_ms
    );
    println!("\nKeys: lock + known + remember (ETag cache)");
    println!(
        "{:>9} | {:>8} | {:>9} | {:>9} {:>6} | {:>9} {:>6} | {:>8} | {:>6} | {:>10}",
        "keys",
        "cache",
        "1st ns",
        "again ns",
        "hit",
        "random ns",
        "hit",
        "cached",
        "locked",
        "RSS +KiB"
    );
    for k in &r.keys {
        println!(
            "{:>9} | {:>8} | {:>9.1} | {:>9.1} {:>6.3} | {:>9.1} {:>6.3} | {:>8} | {:>6} | {:>10}",
            k.keys,
            k.cache_capacity,
            k.first_write_ns,
            k.rewrite_ns,
            k.rewrite_hit_rate,
            k.random_ns,
            k.random_hit_rate,
            k.cached_after,
            k.locked_after,
            k.bench_rss_growth_kib
        );
    }
    println!("\nLockTable (core, in process)");
    println!(
        "{:>9} | {:>20} | {:>16}",
        "locks", "acquire+release ns", "purge scan ms"
    );
    for l in &r.lock_table {
        println!(
            "{:>9} | {:>20.1} | {:>16.3}",
            l.locks, l.grant_release_ns, l.purge_scan_ms
        );
    }
    println!("\nlocksvc over HTTP: acquire+release pairs with many held locks");
    println!(
        "{:>9} | {:>4} | {:>10} | {:>8} | {:>8} | {:>14} | {:>10}",
        "held", "conc", "pairs/s", "p50 ms", "p99 ms", "fill grants/s", "RSS KiB"
    );
    for l in &r.locksvc_http {
        println!(
            "{:>9} | {:>4} | {:>10.1} | {:>8.3} | {:>8.3} | {:>14} | {:>10}",
            l.held_locks,
            l.concurrency,
            l.pairs.median_ops_per_sec,
            l.pairs.latency.p50_ms,
            l.pairs.latency.p99_ms,
            l.populate_grants_per_sec
                .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            l.locksvc_rss_kib
        );
    }
}
