//! `scale`: one proxy as what it remembers grows, end to end (a real
//! `fencegate proxy` process in front of the in-process s3s-fs).
//!
//! - **Keys**: a million distinct keys written through the proxy, in
//!   windows; after each, the proxy's RSS and the window's PUTs/s, with a
//!   smaller window written straight to the store for comparison (the
//!   store slows as its directories fill; the proxy should not). At the
//!   end, rewrites of keys that fell out of the ETag cache and of keys in
//!   it, counted at the store.
//! - **Scopes**: a proxy configured with many locks of many scopes each;
//!   the locks written in windows, each window's PUT latency, the proxy's
//!   RSS, and how long the status page takes.

use crate::backend::{BUCKET, Backend, ProxyProc};
use crate::fenced;
use crate::util::{Latency, cpu_ns};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ScaleOpts {
    pub keys: usize,
    pub key_windows: usize,
    /// Straight to the store, per window: this share of the window's keys.
    pub direct_share: f64,
    pub concurrency: usize,
    /// Keys rewritten at the end, from the start and from the end.
    pub rewrites: usize,
    pub locks: usize,
    pub scopes_per_lock: usize,
    pub lock_windows: usize,
    /// Status page loads timed after each lock window.
    pub page_loads: usize,
}

#[derive(Debug, Serialize)]
pub struct KeyWindow {
    /// Distinct keys written through the proxy by the window's end.
    pub keys: usize,
    pub proxy_puts_per_sec: f64,
    pub proxy_latency: Latency,
    pub proxy_cpu_us_per_put: f64,
    pub direct_puts_per_sec: f64,
    /// Proxy over direct, this window.
    pub ratio_to_direct: f64,
    pub proxy_rss_kib: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Rewrites {
    /// Which keys were rewritten.
    pub what: String,
    pub keys: usize,
    /// Store requests per PUT, by operation.
    pub store_requests_per_put: f64,
    pub store_ops: std::collections::BTreeMap<String, u64>,
    pub latency: Latency,
}

#[derive(Debug, Serialize)]
pub struct KeysReport {
    pub keys: usize,
    pub concurrency: usize,
    pub object_bytes: usize,
    pub etag_cache_entries: usize,
    pub proxy_rss_at_start_kib: u64,
    pub windows: Vec<KeyWindow>,
    /// Last window's PUTs/s over the first's, through the proxy and direct.
    pub end_over_start_proxy: f64,
    pub end_over_start_direct: f64,
    /// The same for the ratio to direct (the store's own slowing removed).
    pub end_over_start_ratio: f64,
    pub max_proxy_rss_kib: u64,
    /// Rewrites at the end, of the first keys written, of keys from the
    /// middle, and of the last.
    pub rewrites: Vec<Rewrites>,
}

#[derive(Debug, Serialize)]
pub struct LockWindow {
    /// Locks written to by the window's end.
    pub locks: usize,
    /// The first write of each scope of the window's locks (a raise for
    /// the lock's first).
    pub first_writes_latency: Latency,
    /// A second write to each of them (admitted against the kept max).
    pub rewrites_latency: Latency,
    pub rewrites_per_sec: f64,
    pub proxy_cpu_us_per_rewrite: f64,
    pub proxy_rss_kib: u64,
    /// `GET /_fencegate/` (the HTML status page), as a viewer.
    pub page_ms: Latency,
    pub page_bytes: usize,
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ScopesReport {
    pub locks: usize,
    pub scopes_per_lock: usize,
    /// The proxy's `etag_cache_entries`: kept small, so that what grows
    /// with the locks is told apart from the keys' cache (the keys
    /// section's question).
    pub etag_cache_entries: usize,
    pub config_bytes: usize,
    /// From the process's start to its first answer.
    pub start_ms: f64,
    pub proxy_rss_at_start_kib: u64,
    pub windows: Vec<LockWindow>,
}

#[derive(Debug, Serialize)]
pub struct ScaleReport {
    /// None with `--keys 0`: only the locks and scopes were run.
    pub keys: Option<KeysReport>,
    pub scopes: ScopesReport,
}

/// Writes what `key(i)` names for i in `range`, `concurrency` at a time,
/// through `client` with the token of `token(i)`; latencies, errors, the
/// first error, the wall time.
async fn write_all<K, T>(
    client: &aws_sdk_s3::Client,
    range: std::ops::Range<usize>,
    concurrency: usize,
    body: &Bytes,
    key: K,
    token: T,
) -> (Vec<u64>, u64, Option<String>, Duration)
where
    K: Fn(usize) -> String + Send + Sync + 'static,
    T: Fn(usize) -> Option<http::HeaderValue> + Send + Sync + 'static,
{
    let next = Arc::new(AtomicUsize::new(range.start));
    let (key, token) = (Arc::new(key), Arc::new(token));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, body, next, key, token) = (
            client.clone(),
            body.clone(),
            next.clone(),
            key.clone(),
            token.clone(),
        );
        let end = range.end;
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut first) = (Vec::new(), 0u64, None);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                let put = client
                    .put_object()
                    .bucket(BUCKET)
                    .key(key(i))
                    .body(ByteStream::from(body.clone()));
                let t = Instant::now();
                let sent = match token(i) {
                    Some(tok) => fenced!(put, tok).send().await,
                    None => put.send().await,
                };
                match sent {
                    Ok(_) => lat.push(t.elapsed().as_nanos() as u64),
                    Err(e) => {
                        errors += 1;
                        first.get_or_insert_with(|| {
                            format!("{:?}", aws_sdk_s3::error::DisplayErrorContext(e))
                        });
                    }
                }
            }
            (lat, errors, first)
        }));
    }
    let (mut lat, mut errors, mut first) = (Vec::new(), 0, None);
    for t in tasks {
        let (l, e, f) = t
            .await
            .unwrap_or_else(|e| (Vec::new(), 1, Some(e.to_string())));
        lat.extend(l);
        errors += e;
        if first.is_none() {
            first = f;
        }
    }
    (lat, errors, first, started.elapsed())
}

/// The key of the i-th distinct write (spread over 1000 directories of the
/// store: s3s-fs keeps a file per object).
fn scale_key(prefix: &'static str) -> impl Fn(usize) -> String + Send + Sync + 'static {
    move |i| format!("{prefix}/{:03}/{i:07}", i % 1000)
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

pub async fn run(ctx: &crate::Ctx, opts: &ScaleOpts) -> anyhow::Result<ScaleReport> {
    let keys = match opts.keys {
        0 => None,
        _ => Some(keys(ctx, opts).await?),
    };
    let scopes = scopes(ctx, opts).await?;
    Ok(ScaleReport { keys, scopes })
}

const OBJECT_BYTES: usize = 64;

async fn keys(ctx: &crate::Ctx, opts: &ScaleOpts) -> anyhow::Result<KeysReport> {
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let proxy = ProxyProc::start(&ctx.fencegate, &backend, &ctx.tmp).await?;
    let pid = proxy.proc.pid();
    let (through, direct) = (proxy.client(), backend.direct());
    let body = Bytes::from(vec![b'k'; OBJECT_BYTES]);
    let tok = crate::backend::token(1)?;
    let token = move |_| Some(tok.clone());
    let rss_at_start = proxy.proc.memory()?.rss_kib;
    let per_window = opts.keys.div_ceil(opts.key_windows);
    let direct_per_window = ((per_window as f64 * opts.direct_share) as usize).max(1);
    let mut windows = Vec::new();
    let mut direct_done = 0;
    for w in 0..opts.key_windows {
        let range = w * per_window..((w + 1) * per_window).min(opts.keys);
        let n = range.len();
        let cpu = cpu_ns(pid);
        let (lat, errors, first_error, took) = write_all(
            &through,
            range.clone(),
            opts.concurrency,
            &body,
            scale_key("scale-keys"),
            token.clone(),
        )
        .await;
        let cpu = cpu_ns(pid).saturating_sub(cpu);
        let drange = direct_done..direct_done + direct_per_window;
        direct_done += direct_per_window;
        let (_, derrors, dfirst, dtook) = write_all(
            &direct,
            drange,
            opts.concurrency,
            &body,
            scale_key("scale-direct"),
            |_| None,
        )
        .await;
        let (proxy_rate, direct_rate) =
            (per_sec(lat.len(), took), per_sec(direct_per_window, dtook));
        let window = KeyWindow {
            keys: range.end,
            proxy_puts_per_sec: proxy_rate,
            proxy_latency: Latency::of(lat),
            proxy_cpu_us_per_put: cpu as f64 / 1000.0 / n as f64,
            direct_puts_per_sec: direct_rate,
            ratio_to_direct: proxy_rate / direct_rate,
            proxy_rss_kib: proxy.proc.memory()?.rss_kib,
            errors: errors + derrors,
            first_error: first_error.or(dfirst),
        };
        eprintln!(
            "scale keys: {:>8} keys  proxy {:>7.0}/s  direct {:>7.0}/s  ratio {:.3}  RSS {:>6} KiB  errors {}",
            window.keys,
            window.proxy_puts_per_sec,
            window.direct_puts_per_sec,
            window.ratio_to_direct,
            window.proxy_rss_kib,
            window.errors
        );
        windows.push(window);
    }
    let rewrite = |what: &str, range: std::ops::Range<usize>| {
        let what = what.to_owned();
        let (through, body, backend_counters, token) = (
            through.clone(),
            body.clone(),
            backend.counters.clone(),
            token.clone(),
        );
        async move {
            let before = backend_counters.snapshot();
            let n = range.len();
            let (lat, _, _, _) =
                write_all(&through, range, 1, &body, scale_key("scale-keys"), token).await;
            let counts = backend_counters.snapshot().since(&before);
            Rewrites {
                what,
                keys: n,
                store_requests_per_put: counts.http as f64 / n as f64,
                store_ops: counts.ops,
                latency: Latency::of(lat),
            }
        }
    };
    // The cache's main part keeps the first keys it took; keys written
    // once it was full went through its window and out, but for the last.
    let n = opts.rewrites;
    let middle = opts.keys / 2;
    let rewrites = vec![
        rewrite("the first keys written (kept by the cache)", 0..n).await,
        rewrite(
            "keys from the middle (out of the cache)",
            middle..middle + n,
        )
        .await,
        rewrite("the last keys written", opts.keys - n..opts.keys).await,
    ];
    let (first, last) = (&windows[0], &windows[windows.len() - 1]);
    Ok(KeysReport {
        keys: opts.keys,
        concurrency: opts.concurrency,
        object_bytes: OBJECT_BYTES,
        etag_cache_entries: 100_000,
        proxy_rss_at_start_kib: rss_at_start,
        end_over_start_proxy: last.proxy_puts_per_sec / first.proxy_puts_per_sec,
        end_over_start_direct: last.direct_puts_per_sec / first.direct_puts_per_sec,
        end_over_start_ratio: last.ratio_to_direct / first.ratio_to_direct,
        max_proxy_rss_kib: windows.iter().map(|w| w.proxy_rss_kib).max().unwrap_or(0),
        windows,
        rewrites,
    })
}

/// The lock of scope `j` of lock `i`, and its prefix.
fn lock_name(i: usize) -> String {
    format!("lock-{i:05}")
}

fn scope_prefix(i: usize, j: usize) -> String {
    format!("l{i:05}/s{j}/")
}

const VIEWER: (&str, &str) = ("bench", "bench-viewer-password");

/// The ETag cache of the scopes section's proxy. Its writes are to
/// distinct keys (one per scope: 100,000 for 10,000 locks), which a cache
/// of the default size would keep, at about 380 bytes each: that growth is
/// the keys section's, bounded by the cache, and would hide what grows
/// with the locks.
const SCOPES_ETAG_CACHE: usize = 1_000;

async fn scopes(ctx: &crate::Ctx, opts: &ScaleOpts) -> anyhow::Result<ScopesReport> {
    use std::fmt::Write;
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let mut extra = String::new();
    let _ = writeln!(
        extra,
        "[[viewers]]\nname = \"{}\"\npassword = \"{}\"",
        VIEWER.0, VIEWER.1
    );
    for i in 0..opts.locks {
        for j in 0..opts.scopes_per_lock {
            let _ = writeln!(
                extra,
                "[[scopes]]\nbucket = \"{BUCKET}\"\nprefix = \"{}\"\nlock = \"{}\"",
                scope_prefix(i, j),
                lock_name(i)
            );
        }
    }
    // The rest of the bucket (the probe's writes) is fenced by the lock of
    // its name.
    let _ = writeln!(
        extra,
        "[[scopes]]\nbucket = \"{BUCKET}\"\nprefix = \"\"\nlock = \"{BUCKET}\""
    );
    let config_bytes = extra.len();
    let started = Instant::now();
    let proxy = ProxyProc::start_configured(
        &ctx.fencegate,
        &backend,
        &ctx.tmp,
        &format!("etag_cache_entries = {SCOPES_ETAG_CACHE}"),
        extra,
    )
    .await?;
    let start_ms = started.elapsed().as_secs_f64() * 1000.0;
    let pid = proxy.proc.pid();
    let client = proxy.client();
    let body = Bytes::from(vec![b's'; OBJECT_BYTES]);
    // One signed token per lock, made once.
    let tokens: Arc<Vec<http::HeaderValue>> = Arc::new(
        (0..opts.locks)
            .map(|i| crate::backend::signed_token(&lock_name(i), 1))
            .collect::<anyhow::Result<_>>()?,
    );
    let per = opts.scopes_per_lock;
    let key = move |i: usize| format!("{}obj", scope_prefix(i / per, i % per));
    let token = {
        let tokens = tokens.clone();
        move |i: usize| Some(tokens[i / per].clone())
    };
    let http = reqwest::Client::new();
    let page = format!("{}/_fencegate/", proxy.proc.url);
    let rss_at_start = proxy.proc.memory()?.rss_kib;
    let locks_per_window = opts.locks.div_ceil(opts.lock_windows);
    let mut windows = Vec::new();
    for w in 0..opts.lock_windows {
        let locks = w * locks_per_window..((w + 1) * locks_per_window).min(opts.locks);
        let writes = locks.start * per..locks.end * per;
        // Each scope of the window's locks written once, then again.
        let pass = || {
            write_all(
                &client,
                writes.clone(),
                opts.concurrency,
                &body,
                key,
                token.clone(),
            )
        };
        let (first, e1, f1, _) = pass().await;
        let cpu = cpu_ns(pid);
        let (again, e2, f2, took) = pass().await;
        let cpu = cpu_ns(pid).saturating_sub(cpu);
        let mut page_ns = Vec::new();
        let mut page_bytes = 0;
        for _ in 0..opts.page_loads {
            let t = Instant::now();
            let r = http
                .get(&page)
                .basic_auth(VIEWER.0, Some(VIEWER.1))
                .send()
                .await?;
            anyhow::ensure!(
                r.status().is_success(),
                "the status page answered {}",
                r.status()
            );
            page_bytes = r.bytes().await?.len();
            page_ns.push(t.elapsed().as_nanos() as u64);
        }
        let rate = per_sec(again.len(), took);
        let window = LockWindow {
            locks: locks.end,
            first_writes_latency: Latency::of(first),
            rewrites_latency: Latency::of(again),
            rewrites_per_sec: rate,
            proxy_cpu_us_per_rewrite: cpu as f64 / 1000.0 / writes.len() as f64,
            proxy_rss_kib: proxy.proc.memory()?.rss_kib,
            page_ms: Latency::of(page_ns),
            page_bytes,
            errors: e1 + e2,
            first_error: f1.or(f2),
        };
        eprintln!(
            "scale scopes: {:>6} locks  rewrite p50 {:.3} ms  {:>6.0}/s  CPU {:.0} µs  RSS {:>6} KiB  page p50 {:.1} ms ({} B)  errors {}",
            window.locks,
            window.rewrites_latency.p50_ms,
            window.rewrites_per_sec,
            window.proxy_cpu_us_per_rewrite,
            window.proxy_rss_kib,
            window.page_ms.p50_ms,
            window.page_bytes,
            window.errors
        );
        windows.push(window);
    }
    Ok(ScopesReport {
        locks: opts.locks,
        scopes_per_lock: opts.scopes_per_lock,
        etag_cache_entries: SCOPES_ETAG_CACHE,
        config_bytes,
        start_ms,
        proxy_rss_at_start_kib: rss_at_start,
        windows,
    })
}

pub fn print(r: &ScaleReport) {
    if let Some(k) = &r.keys {
        print_keys(k);
    }
    print_scopes(&r.scopes);
}

fn print_keys(k: &KeysReport) {
    println!(
        "\n## scale: {} distinct keys through one proxy (c={}, {} B objects, ETag cache {})",
        k.keys, k.concurrency, k.object_bytes, k.etag_cache_entries
    );
    println!(
        "{:>9} {:>10} {:>10} {:>7} {:>9} {:>9} {:>8}",
        "keys", "proxy/s", "direct/s", "ratio", "p50 ms", "CPU µs", "RSS MiB"
    );
    for w in &k.windows {
        println!(
            "{:>9} {:>10.0} {:>10.0} {:>7.3} {:>9.3} {:>9.0} {:>8.1}",
            w.keys,
            w.proxy_puts_per_sec,
            w.direct_puts_per_sec,
            w.ratio_to_direct,
            w.proxy_latency.p50_ms,
            w.proxy_cpu_us_per_put,
            w.proxy_rss_kib as f64 / 1024.0
        );
    }
    println!(
        "end/start: proxy {:.3}, direct {:.3}, ratio to direct {:.3}; RSS at most {:.1} MiB (start {:.1})",
        k.end_over_start_proxy,
        k.end_over_start_direct,
        k.end_over_start_ratio,
        k.max_proxy_rss_kib as f64 / 1024.0,
        k.proxy_rss_at_start_kib as f64 / 1024.0
    );
    for rw in &k.rewrites {
        println!(
            "rewrite of {} keys, {} (c=1): {:.2} store requests per PUT {:?}, p50 {:.3} ms",
            rw.keys, rw.what, rw.store_requests_per_put, rw.store_ops, rw.latency.p50_ms
        );
    }
}

fn print_scopes(s: &ScopesReport) {
    println!(
        "\n## scale: {} locks × {} scopes in one proxy (config {} KiB, started in {:.0} ms, RSS {:.1} MiB at start; ETag cache {} keys)",
        s.locks,
        s.scopes_per_lock,
        s.config_bytes / 1024,
        s.start_ms,
        s.proxy_rss_at_start_kib as f64 / 1024.0,
        s.etag_cache_entries
    );
    println!(
        "{:>7} {:>12} {:>12} {:>10} {:>9} {:>8} {:>12}",
        "locks", "first p50", "rewrite p50", "rewrite/s", "CPU µs", "RSS MiB", "page p50 ms"
    );
    for w in &s.windows {
        println!(
            "{:>7} {:>12.3} {:>12.3} {:>10.0} {:>9.0} {:>8.1} {:>12.1}",
            w.locks,
            w.first_writes_latency.p50_ms,
            w.rewrites_latency.p50_ms,
            w.rewrites_per_sec,
            w.proxy_cpu_us_per_rewrite,
            w.proxy_rss_kib as f64 / 1024.0,
            w.page_ms.p50_ms
        );
    }
}

/// The targets for scale, judged on `r`.
pub(crate) fn targets(r: &ScaleReport, t: &mut Vec<crate::Target>) {
    if let Some(k) = &r.keys {
        key_targets(k, t);
    }
    scope_targets(&r.scopes, t);
}

fn key_targets(k: &KeysReport, t: &mut Vec<crate::Target>) {
    t.push(crate::Target {
        target: format!("scale: proxy RSS <= 64 MiB over {} distinct keys", k.keys),
        measured: format!(
            "{:.1} MiB at most ({:.1} at start)",
            k.max_proxy_rss_kib as f64 / 1024.0,
            k.proxy_rss_at_start_kib as f64 / 1024.0
        ),
        met: Some(k.max_proxy_rss_kib <= 64 * 1024),
    });
    t.push(crate::Target {
        target: format!(
            "scale: PUTs/s through the proxy at {} keys within 5 % of the start",
            k.keys
        ),
        measured: format!(
            "{:.3} (direct to the store: {:.3}; proxy ÷ direct: {:.3})",
            k.end_over_start_proxy, k.end_over_start_direct, k.end_over_start_ratio
        ),
        met: Some(k.end_over_start_proxy >= 0.95),
    });
}

fn scope_targets(s: &ScopesReport, t: &mut Vec<crate::Target>) {
    if let (Some(first), Some(last)) = (s.windows.first(), s.windows.last()) {
        let page_worst = s
            .windows
            .iter()
            .map(|w| w.page_ms.p50_ms)
            .fold(0.0, f64::max);
        t.push(crate::Target {
            target: format!(
                "scale: the status page answers within 50 ms with {} locks × {} scopes",
                s.locks, s.scopes_per_lock
            ),
            measured: format!("p50 {page_worst:.1} ms at worst over the windows"),
            met: Some(page_worst <= 50.0),
        });
        t.push(crate::Target {
            target: format!(
                "scale: admission stays flat from {} to {} locks (proxy CPU per PUT, within 10 %)",
                first.locks, last.locks
            ),
            measured: format!(
                "{:.0} -> {:.0} µs; p50 {:.3} -> {:.3} ms; RSS {:.1} -> {:.1} MiB",
                first.proxy_cpu_us_per_rewrite,
                last.proxy_cpu_us_per_rewrite,
                first.rewrites_latency.p50_ms,
                last.rewrites_latency.p50_ms,
                first.proxy_rss_kib as f64 / 1024.0,
                last.proxy_rss_kib as f64 / 1024.0
            ),
            met: Some(last.proxy_cpu_us_per_rewrite <= 1.1 * first.proxy_cpu_us_per_rewrite),
        });
        t.push(crate::Target {
            target: format!(
                "scale: RSS stays flat from {} to {} locks (within 10 %)",
                first.locks, last.locks
            ),
            measured: format!(
                "{:.1} -> {:.1} MiB",
                first.proxy_rss_kib as f64 / 1024.0,
                last.proxy_rss_kib as f64 / 1024.0
            ),
            met: Some(last.proxy_rss_kib as f64 <= 1.1 * first.proxy_rss_kib as f64),
        });
    }
}
