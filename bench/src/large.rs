//! `large`: single PUTs of 256 MiB and 1 GiB, generated while they are
//! sent (a 1 MiB pattern repeated; never the whole object in memory),
//! direct vs through a fresh proxy process whose RSS is read from /proc,
//! and through nginx (the same plain reverse proxy as in `small`): what
//! any proxy in the path costs on this machine. With `--baseline`, a
//! second fencegate binary (an older commit's) takes its turn in the same
//! rotation, so before and after share the disk's minutes.

use crate::backend::{BACKEND_KEY, BUCKET, Backend, ProxyProc, sdk_client, token};
use crate::fenced;
use crate::util::{Cpu, CpuPerOp, Memory, median, ratio};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use serde::Serialize;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1024 * 1024;

/// A request body of `remaining` bytes made of a repeated pattern.
#[derive(Debug)]
struct Generated {
    pattern: Bytes,
    remaining: u64,
}

impl Body for Generated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.pattern.len() as u64);
        self.remaining -= n;
        // A refcounted slice of the pattern: no copy, no allocation.
        let chunk = self.pattern.slice(..n as usize);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[derive(Debug, Clone)]
pub struct LargeOpts {
    /// (size in bytes, repetitions per variant)
    pub sizes: Vec<(u64, usize)>,
    /// The nginx binary; None: no nginx variant.
    pub nginx: Option<std::path::PathBuf>,
    /// A second fencegate binary and its label (`--baseline`).
    pub baseline: Option<(std::path::PathBuf, String)>,
}

#[derive(Debug, Serialize)]
pub struct LargeSize {
    pub bytes: u64,
    pub direct_mb_per_sec: Vec<f64>,
    pub proxy_mb_per_sec: Vec<f64>,
    pub direct_median_mb_per_sec: f64,
    pub proxy_median_mb_per_sec: f64,
    pub ratio: f64,
    /// Highest proxy VmRSS sampled every 10 ms during this size's proxy
    /// uploads, and VmHWM right after them.
    pub proxy_rss_sampled_peak_kib: u64,
    pub proxy_hwm_after_kib: u64,
    /// CPU seconds per GB (10^9 bytes) streamed: proxy process, client,
    /// backend.
    pub cpu_s_per_gb_direct: CpuPerOp,
    pub cpu_s_per_gb_proxy: CpuPerOp,
    /// proxy MB/s over direct MB/s of the same repetition.
    pub ratio_per_rep: Vec<f64>,
    /// Through nginx (empty when it did not run), its median over direct's,
    /// and its CPU per GB (`proxy` is nginx's master and workers).
    pub nginx_mb_per_sec: Vec<f64>,
    pub nginx_ratio: Option<f64>,
    pub cpu_s_per_gb_nginx: Option<CpuPerOp>,
    /// Through the `--baseline` proxy (empty when it did not run), and its
    /// median over direct's.
    pub baseline_mb_per_sec: Vec<f64>,
    pub baseline_ratio: Option<f64>,
    pub cpu_s_per_gb_baseline: Option<CpuPerOp>,
}

#[derive(Debug, Serialize)]
pub struct LargeReport {
    /// MB = 10^6 bytes.
    pub unit: &'static str,
    pub proxy_memory_at_start: Memory,
    pub proxy_memory_at_end: Memory,
    pub sizes: Vec<LargeSize>,
    /// Why nginx is not among the variants, if it is not.
    pub nginx_unavailable: Option<String>,
    /// The `--baseline` proxy's label, if it ran.
    pub baseline: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Direct,
    Proxy,
    Nginx,
    Baseline,
}

async fn upload(
    client: &aws_sdk_s3::Client,
    key: &str,
    bytes: u64,
    pattern: &Bytes,
    tok: &http::HeaderValue,
) -> anyhow::Result<Duration> {
    let body = ByteStream::from_body_1_x(Generated {
        pattern: pattern.clone(),
        remaining: bytes,
    });
    let started = Instant::now();
    fenced!(
        client
            .put_object()
            .bucket(BUCKET)
            .key(key)
            .content_length(i64::try_from(bytes)?)
            .body(body),
        tok
    )
    .send()
    .await
    .map_err(|e| anyhow::anyhow!("PUT {key}: {:?}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
    Ok(started.elapsed())
}

/// Samples `pid`'s VmRSS every 10 ms until told to stop; returns the peak.
fn sampler(pid: u32, stop: Arc<AtomicBool>, peak: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(m) = crate::util::memory_of(pid) {
                peak.fetch_max(m.rss_kib, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

pub async fn run(ctx: &crate::Ctx, opts: &LargeOpts) -> anyhow::Result<LargeReport> {
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    // A fresh proxy: VmHWM cannot be reset, so it must not have served
    // anything before.
    let proxy = ProxyProc::start(&ctx.fencegate, &backend, &ctx.tmp).await?;
    let pid = proxy.proc.pid();
    let direct = backend.direct();
    let through = proxy.client();
    let tok = token(1)?;
    let mut pattern = vec![0u8; MIB as usize];
    crate::util::Rng::new(7).fill(&mut pattern);
    let pattern = Bytes::from(pattern);
    let at_start = proxy.proc.memory()?;
    let (nginx, nginx_unavailable) =
        match crate::nginx::anchor("large", opts.nginx.as_deref(), &backend.endpoint, &ctx.tmp)
            .await?
        {
            Ok(n) => (Some(n), None),
            Err(why) => (None, Some(why)),
        };
    let via_nginx = nginx.as_ref().map(|n| sdk_client(&n.url, BACKEND_KEY));
    let mut variants = vec![Variant::Direct, Variant::Proxy];
    if nginx.is_some() {
        variants.push(Variant::Nginx);
    }
    let baseline = match &opts.baseline {
        Some((bin, _)) => Some(ProxyProc::start(bin, &backend, &ctx.tmp).await?),
        None => None,
    };
    let via_baseline = baseline.as_ref().map(ProxyProc::client);
    if baseline.is_some() {
        variants.push(Variant::Baseline);
    }

    let mut sizes = Vec::new();
    for &(bytes, reps) in &opts.sizes {
        eprintln!("large: {} MiB x {reps} per variant", bytes / MIB);
        let (mut d, mut p, mut ng, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let peak = Arc::new(AtomicU64::new(0));
        let (mut cpu_d, mut cpu_p, mut cpu_n, mut cpu_b) = (
            Cpu::default(),
            Cpu::default(),
            Cpu::default(),
            Cpu::default(),
        );
        for r in 0..reps {
            // Each repetition starts with the next variant.
            let mut order = variants.clone();
            order.rotate_left(r % variants.len());
            for v in order {
                let key = format!("large/{v:?}/{bytes}/r{r}");
                let (client, out, pids) = match (v, &via_nginx, &nginx) {
                    (Variant::Nginx, Some(c), Some(proc)) => (c, &mut ng, proc.pids()),
                    (Variant::Proxy, ..) => (&through, &mut p, vec![pid]),
                    (Variant::Baseline, ..) => match (&via_baseline, &baseline) {
                        (Some(c), Some(proc)) => (c, &mut b, vec![proc.proc.pid()]),
                        _ => anyhow::bail!("the baseline variant without its proxy"),
                    },
                    _ => (&direct, &mut d, vec![pid]),
                };
                let stop = Arc::new(AtomicBool::new(false));
                let sampling =
                    (v == Variant::Proxy).then(|| sampler(pid, stop.clone(), peak.clone()));
                let before = Cpu::read_pids(&pids);
                let took = upload(client, &key, bytes, &pattern, &tok).await;
                let after = Cpu::read_pids(&pids);
                match v {
                    Variant::Direct => cpu_d.add_delta(before, after),
                    Variant::Proxy => cpu_p.add_delta(before, after),
                    Variant::Nginx => cpu_n.add_delta(before, after),
                    Variant::Baseline => cpu_b.add_delta(before, after),
                }
                stop.store(true, Ordering::Relaxed);
                if let Some(s) = sampling {
                    let _ = s.join();
                }
                let took = took?;
                // It landed, whole.
                let head = direct
                    .head_object()
                    .bucket(BUCKET)
                    .key(&key)
                    .send()
                    .await
                    .map_err(|e| anyhow::anyhow!("HEAD {key}: {e:?}"))?;
                anyhow::ensure!(
                    head.content_length() == Some(i64::try_from(bytes)?),
                    "{key} has {:?} bytes, expected {bytes}",
                    head.content_length()
                );
                out.push(bytes as f64 / took.as_secs_f64() / 1e6);
                // Free the disk (directly: the proxy must not see this key
                // again, and each repetition uses a new key).
                direct
                    .delete_object()
                    .bucket(BUCKET)
                    .key(&key)
                    .send()
                    .await
                    .map_err(|e| anyhow::anyhow!("DELETE {key}: {e:?}"))?;
            }
        }
        let after = proxy.proc.memory()?;
        let gb = bytes as f64 * reps as f64 / 1e9;
        let per_gb = |c: Cpu| {
            let f = |ns: u64| ns as f64 / 1e9 / gb;
            CpuPerOp {
                proxy: f(c.proxy),
                client: f(c.client),
                backend: f(c.backend),
            }
        };
        let ratio_per_rep = p.iter().zip(&d).map(|(p, d)| ratio(*p, *d)).collect();
        let (dm, pm) = (median(&d), median(&p));
        let nginx_ratio = (!ng.is_empty()).then(|| ratio(median(&ng), dm));
        let cpu_s_per_gb_nginx = (!ng.is_empty()).then(|| per_gb(cpu_n));
        let baseline_ratio = (!b.is_empty()).then(|| ratio(median(&b), dm));
        let cpu_s_per_gb_baseline = (!b.is_empty()).then(|| per_gb(cpu_b));
        sizes.push(LargeSize {
            bytes,
            direct_mb_per_sec: d,
            proxy_mb_per_sec: p,
            direct_median_mb_per_sec: dm,
            proxy_median_mb_per_sec: pm,
            ratio: ratio(pm, dm),
            proxy_rss_sampled_peak_kib: peak.load(Ordering::Relaxed),
            proxy_hwm_after_kib: after.hwm_kib,
            cpu_s_per_gb_direct: per_gb(cpu_d),
            cpu_s_per_gb_proxy: per_gb(cpu_p),
            ratio_per_rep,
            nginx_mb_per_sec: ng,
            nginx_ratio,
            cpu_s_per_gb_nginx,
            baseline_mb_per_sec: b,
            baseline_ratio,
            cpu_s_per_gb_baseline,
        });
    }
    Ok(LargeReport {
        unit: "MB/s, MB = 10^6 bytes",
        proxy_memory_at_start: at_start,
        proxy_memory_at_end: proxy.proc.memory()?,
        sizes,
        nginx_unavailable,
        baseline: opts.baseline.as_ref().map(|(_, label)| label.clone()),
    })
}

pub fn print(r: &LargeReport) {
    println!("\n== large: one streamed PUT per repetition (MB = 10^6 B) ==");
    println!(
        "CPU s/GB: proxy process; client and backend (this process) for direct (d) and proxied (p) PUTs"
    );
    println!(
        "proxy memory at start: VmRSS {} KiB, VmHWM {} KiB; at end: VmRSS {} KiB, VmHWM {} KiB",
        r.proxy_memory_at_start.rss_kib,
        r.proxy_memory_at_start.hwm_kib,
        r.proxy_memory_at_end.rss_kib,
        r.proxy_memory_at_end.hwm_kib
    );
    println!(
        "{:>9} | {:>12} | {:>12} | {:>7} | {:>16} | {:>14} | {:>6} {:>8} {:>8} {:>8} {:>8}",
        "size",
        "direct MB/s",
        "proxy MB/s",
        "ratio",
        "proxy RSS peak",
        "VmHWM after",
        "proxy",
        "client d",
        "client p",
        "backnd d",
        "backnd p"
    );
    for s in &r.sizes {
        println!(
            "{:>5} MiB | {:>12.1} | {:>12.1} | {:>7.3} | {:>12} KiB | {:>10} KiB | {:>6.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            s.bytes / MIB,
            s.direct_median_mb_per_sec,
            s.proxy_median_mb_per_sec,
            s.ratio,
            s.proxy_rss_sampled_peak_kib,
            s.proxy_hwm_after_kib,
            s.cpu_s_per_gb_proxy.proxy,
            s.cpu_s_per_gb_direct.client,
            s.cpu_s_per_gb_proxy.client,
            s.cpu_s_per_gb_direct.backend,
            s.cpu_s_per_gb_proxy.backend
        );
    }
    match &r.nginx_unavailable {
        Some(why) => println!("  nginx: NOT MEASURED: {why}"),
        None => {
            println!("the anchor: the same PUTs through nginx (a plain reverse proxy)");
            println!(
                "{:>9} | {:>12} | {:>12} | {:>11} | {:>12} | {:>14}",
                "size", "nginx MB/s", "nginx ratio", "proxy ratio", "nginx CPU/GB", "backend (n)"
            );
            for s in &r.sizes {
                let (Some(nr), Some(c)) = (s.nginx_ratio, &s.cpu_s_per_gb_nginx) else {
                    continue;
                };
                println!(
                    "{:>5} MiB | {:>12.1} | {:>12.3} | {:>11.3} | {:>12.3} | {:>14.3}",
                    s.bytes / MIB,
                    median(&s.nginx_mb_per_sec),
                    nr,
                    s.ratio,
                    c.proxy,
                    c.backend
                );
            }
        }
    }
    if let Some(label) = &r.baseline {
        println!("the baseline: the same PUTs through fencegate {label}, in the same rotation");
        for s in &r.sizes {
            if let (Some(br), Some(c)) = (s.baseline_ratio, &s.cpu_s_per_gb_baseline) {
                println!(
                    "{:>5} MiB | {label} ratio {br:.3} (CPU {:.3} s/GB) | proxy ratio {:.3} (CPU {:.3} s/GB)",
                    s.bytes / MIB,
                    c.proxy,
                    s.ratio,
                    s.cpu_s_per_gb_proxy.proxy
                );
            }
        }
    }
}
