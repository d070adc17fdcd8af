//! `small`: 4 KiB PUTs, direct to the backend vs through the fenced proxy,
//! with the same SDK client configuration, interleaved rounds.

use crate::backend::{BUCKET, Backend, ProxyProc, token};
use crate::fenced;
use crate::util::{Cpu, CpuPerOp, Series, SeriesSummary, ratio, timed_round};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct SmallOpts {
    pub concurrency: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
    pub warmup: Duration,
    pub object_bytes: usize,
    /// Keys each worker cycles through (overwrites, so the proxy's ETag
    /// cache is warm after the warm-up).
    pub keys_per_worker: usize,
}

#[derive(Debug, Serialize)]
pub struct SmallLevel {
    pub concurrency: usize,
    pub direct: SeriesSummary,
    pub proxy: SeriesSummary,
    /// Median proxy ops/s over median direct ops/s.
    pub ratio_ops: f64,
    /// Per round pair (same position in the interleaving): proxy / direct.
    pub ratio_ops_per_round: Vec<f64>,
    pub p50_overhead_ms: f64,
    pub p99_overhead_ms: f64,
    /// CPU microseconds per PUT: proxy process, client, backend.
    pub cpu_us_per_put_direct: CpuPerOp,
    pub cpu_us_per_put_proxy: CpuPerOp,
}

#[derive(Debug, Serialize)]
pub struct SmallReport {
    pub object_bytes: usize,
    pub rounds: usize,
    pub round_secs: f64,
    pub warmup_secs: f64,
    pub keys_per_worker: usize,
    pub levels: Vec<SmallLevel>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Direct,
    Proxy,
}

async fn round(
    client: &aws_sdk_s3::Client,
    variant: Variant,
    concurrency: usize,
    dur: Duration,
    body: &Bytes,
    tok: &http::HeaderValue,
    keys_per_worker: usize,
) -> crate::util::RoundResult {
    let client = client.clone();
    let body = body.clone();
    let tok = tok.clone();
    let prefix = match variant {
        Variant::Direct => "small-direct",
        Variant::Proxy => "small-proxy",
    };
    timed_round(concurrency, dur, move |w, i| {
        let client = client.clone();
        let body = body.clone();
        let tok = tok.clone();
        async move {
            let key = format!(
                "{prefix}/c{concurrency}/w{w}/k{}",
                i as usize % keys_per_worker
            );
            // The same request both ways, Fencing-Token included (the
            // backend ignores the header).
            fenced!(
                client
                    .put_object()
                    .bucket(BUCKET)
                    .key(key)
                    .body(ByteStream::from(body)),
                tok
            )
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{:?}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
            Ok(())
        }
    })
    .await
}

pub async fn run(ctx: &crate::Ctx, opts: &SmallOpts) -> anyhow::Result<SmallReport> {
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let proxy = ProxyProc::start(&ctx.fencegate, &backend, &ctx.tmp).await?;
    let direct = backend.direct();
    let through = proxy.client();
    let tok = token(1)?;
    let mut payload = vec![0u8; opts.object_bytes];
    crate::util::Rng::new(42).fill(&mut payload);
    let body = Bytes::from(payload);

    let mut levels = Vec::new();
    for &c in &opts.concurrency {
        eprintln!("small: concurrency {c}");
        // Warm-up: connections, the proxy's fence raise, key creation (the
        // first write of each key costs the proxy a HEAD).
        for v in [Variant::Direct, Variant::Proxy] {
            let client = if v == Variant::Direct {
                &direct
            } else {
                &through
            };
            let r = round(client, v, c, opts.warmup, &body, &tok, opts.keys_per_worker).await;
            if r.errors > 0 {
                anyhow::bail!(
                    "small warm-up {v:?} c={c}: {} errors, first: {}",
                    r.errors,
                    r.first_error.unwrap_or_default()
                );
            }
        }
        let (mut d, mut p) = (Series::default(), Series::default());
        let (mut cpu_d, mut cpu_p) = (Cpu::default(), Cpu::default());
        let pid = Some(proxy.proc.pid());
        for r in 0..opts.rounds {
            let order = if r % 2 == 0 {
                [Variant::Direct, Variant::Proxy]
            } else {
                [Variant::Proxy, Variant::Direct]
            };
            for v in order {
                let (client, series) = match v {
                    Variant::Direct => (&direct, &mut d),
                    Variant::Proxy => (&through, &mut p),
                };
                let before = Cpu::read(pid);
                let res = round(client, v, c, opts.round, &body, &tok, opts.keys_per_worker).await;
                let after = Cpu::read(pid);
                series.add(res);
                match v {
                    Variant::Direct => cpu_d.add_delta(before, after),
                    Variant::Proxy => cpu_p.add_delta(before, after),
                }
            }
        }
        let per_round: Vec<f64> = p
            .rounds_ops_per_sec
            .iter()
            .zip(&d.rounds_ops_per_sec)
            .map(|(p, d)| ratio(*p, *d))
            .collect();
        let (d, p) = (d.summary(), p.summary());
        levels.push(SmallLevel {
            concurrency: c,
            ratio_ops: ratio(p.median_ops_per_sec, d.median_ops_per_sec),
            ratio_ops_per_round: per_round,
            p50_overhead_ms: p.latency.p50_ms - d.latency.p50_ms,
            p99_overhead_ms: p.latency.p99_ms - d.latency.p99_ms,
            cpu_us_per_put_direct: cpu_d.per_op_us(d.latency.samples as f64),
            cpu_us_per_put_proxy: cpu_p.per_op_us(p.latency.samples as f64),
            direct: d,
            proxy: p,
        });
    }
    Ok(SmallReport {
        object_bytes: opts.object_bytes,
        rounds: opts.rounds,
        round_secs: opts.round.as_secs_f64(),
        warmup_secs: opts.warmup.as_secs_f64(),
        keys_per_worker: opts.keys_per_worker,
        levels,
    })
}

pub fn print(r: &SmallReport) {
    println!(
        "\n== small: {} B PUTs, {} interleaved rounds of {:.1}s per variant ==",
        r.object_bytes, r.rounds, r.round_secs
    );
    println!(
        "CPU us/PUT: proxy process; client and backend (this process) for direct (d) and proxied (p) PUTs"
    );
    println!(
        "{:>5} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>7} {:>9} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>5}",
        "conc",
        "direct/s",
        "p50 ms",
        "p99 ms",
        "proxy/s",
        "p50 ms",
        "p99 ms",
        "ratio",
        "p50 +ms",
        "proxy",
        "client d",
        "client p",
        "backnd d",
        "backnd p",
        "errs"
    );
    for l in &r.levels {
        println!(
            "{:>5} | {:>10.1} {:>8.3} {:>8.3} | {:>10.1} {:>8.3} {:>8.3} | {:>7.3} {:>9.3} | {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} | {:>5}",
            l.concurrency,
            l.direct.median_ops_per_sec,
            l.direct.latency.p50_ms,
            l.direct.latency.p99_ms,
            l.proxy.median_ops_per_sec,
            l.proxy.latency.p50_ms,
            l.proxy.latency.p99_ms,
            l.ratio_ops,
            l.p50_overhead_ms,
            l.cpu_us_per_put_proxy.proxy,
            l.cpu_us_per_put_direct.client,
            l.cpu_us_per_put_proxy.client,
            l.cpu_us_per_put_direct.backend,
            l.cpu_us_per_put_proxy.backend,
            l.direct.errors + l.proxy.errors
        );
    }
}
