//! `replicas`: proxy replicas sharing their fences through a 3-member etcd
//! cluster (issue 13), in one run:
//!
//! - **steady state**: 4 KiB PUTs of one token, in rotated rounds, through
//!   a single proxy (SQLite) and through replica 1 of a 2-replica cluster,
//!   in front of the same store; the ratio of their ops/s per round. A
//!   steady-state write costs no etcd round trip, so the goal is >= 0.97;
//! - **raise latency**: PUTs that each raise the lock's max (token t+1),
//!   through the replicas in turn, with 2 and with 3 replicas registered;
//!   p50 and p99 of the whole PUT, beside a same-token PUT's.

use crate::backend::{Backend, ProxyProc, token};
use crate::fenced;
use crate::util::{Latency, Series, SeriesSummary, ratio, timed_round};
use aws_sdk_s3::primitives::ByteStream;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ReplicaOpts {
    pub concurrency: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
    pub raises: usize,
    pub etcd_bin: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct SteadyLevel {
    pub concurrency: usize,
    pub single: SeriesSummary,
    pub replica: SeriesSummary,
    /// Median over rounds of replica ops/s ÷ single ops/s in the same
    /// rotation.
    pub ratio: f64,
    pub ratio_per_round: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RaiseLevel {
    pub replicas: usize,
    pub raise: Latency,
    /// A same-token PUT through the same replicas, for scale.
    pub same_token: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplicaReport {
    pub etcd_version: String,
    pub registration_ttl_s: u64,
    pub steady: Vec<SteadyLevel>,
    pub raises: Vec<RaiseLevel>,
}

fn cluster_toml(endpoints: &[String], id: &str) -> String {
    let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
    format!(
        "\n[cluster]\nendpoints = [{}]\nprefix = \"/fg-bench/\"\nreplica_id = \"{id}\"\n",
        list.join(", ")
    )
}

async fn put(
    client: &aws_sdk_s3::Client,
    key: String,
    tok: &http::HeaderValue,
    body: &bytes::Bytes,
) -> anyhow::Result<()> {
    fenced!(
        client
            .put_object()
            .bucket(crate::backend::BUCKET)
            .key(key)
            .body(ByteStream::from(body.clone())),
        tok
    )
    .send()
    .await
    .map_err(|e| anyhow::anyhow!("{:?}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
    Ok(())
}

async fn steady_round(
    client: &aws_sdk_s3::Client,
    label: &'static str,
    concurrency: usize,
    dur: Duration,
    tok: &http::HeaderValue,
    body: &bytes::Bytes,
) -> crate::util::RoundResult {
    let (client, tok, body) = (client.clone(), tok.clone(), body.clone());
    timed_round(concurrency, dur, move |w, i| {
        let (client, tok, body) = (client.clone(), tok.clone(), body.clone());
        async move {
            put(
                &client,
                format!("replicas-{label}/c{concurrency}/w{w}/k{}", i % 64),
                &tok,
                &body,
            )
            .await
        }
    })
    .await
}

pub async fn run(ctx: &crate::Ctx, opts: &ReplicaOpts) -> anyhow::Result<ReplicaReport> {
    let etcd = crate::ha::Cluster::start(&opts.etcd_bin, &ctx.tmp).await?;
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let start = |extra: String| ProxyProc::start_with(&ctx.fencegate, &backend, &ctx.tmp, extra);
    let single = start(String::new()).await?;
    let r1 = start(cluster_toml(&etcd.endpoints, "r1")).await?;
    let r2 = start(cluster_toml(&etcd.endpoints, "r2")).await?;
    let body = bytes::Bytes::from(vec![b'x'; 4096]);
    let mut t = 1u64;
    let tok = token(t)?;
    // Warm up: the first write of each raises (the cluster's once).
    for p in [&single, &r1, &r2] {
        put(&p.client(), "replicas-warm".into(), &tok, &body).await?;
    }

    let mut steady = Vec::new();
    for &c in &opts.concurrency {
        let (mut s, mut r) = (Series::default(), Series::default());
        let mut per_round = Vec::new();
        for round in 0..opts.rounds {
            let order: [(&ProxyProc, bool); 2] = if round % 2 == 0 {
                [(&single, false), (&r1, true)]
            } else {
                [(&r1, true), (&single, false)]
            };
            let (mut so, mut ro) = (0.0, 0.0);
            for (p, replica) in order {
                let label = if replica { "replica" } else { "single" };
                let res = steady_round(&p.client(), label, c, opts.round, &tok, &body).await;
                if replica {
                    ro = res.ops_per_sec();
                    r.add(res);
                } else {
                    so = res.ops_per_sec();
                    s.add(res);
                }
            }
            per_round.push(ratio(ro, so));
        }
        let mut sorted = per_round.clone();
        sorted.sort_by(f64::total_cmp);
        steady.push(SteadyLevel {
            concurrency: c,
            single: s.summary(),
            replica: r.summary(),
            ratio: crate::util::median(&sorted),
            ratio_per_round: per_round,
        });
    }

    let mut raises = Vec::new();
    let mut replicas = vec![r1, r2];
    for n in [2usize, 3] {
        if replicas.len() < n {
            replicas.push(start(cluster_toml(&etcd.endpoints, &format!("r{n}"))).await?);
            // Its first write confirms the current max.
            put(
                &replicas[n - 1].client(),
                "replicas-warm".into(),
                &token(t)?,
                &body,
            )
            .await?;
        }
        let clients: Vec<_> = replicas.iter().map(ProxyProc::client).collect();
        let (mut raise, mut same) = (Vec::new(), Vec::new());
        for i in 0..opts.raises {
            let c = &clients[i % n];
            t += 1;
            let tok = token(t)?;
            let started = Instant::now();
            put(c, format!("replicas-raise/{n}/{i}"), &tok, &body).await?;
            raise.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
            // The other replicas' first write of t confirms it there.
            for other in clients.iter().filter(|o| !std::ptr::eq(*o, c)) {
                put(other, format!("replicas-confirm/{n}/{i}"), &tok, &body).await?;
            }
            let started = Instant::now();
            put(c, format!("replicas-same/{n}/{i}"), &tok, &body).await?;
            same.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        raises.push(RaiseLevel {
            replicas: n,
            raise: Latency::of(raise),
            same_token: Latency::of(same),
        });
    }
    Ok(ReplicaReport {
        etcd_version: etcd.version.clone(),
        registration_ttl_s: 10,
        steady,
        raises,
    })
}

pub fn print(r: &ReplicaReport) {
    println!("\n== replicas (etcd {}) ==", r.etcd_version);
    println!("steady state, 4 KiB PUTs of one token: replica 1 of 2 vs a single proxy");
    println!(
        "{:>5} {:>12} {:>12} {:>8}",
        "conc", "single op/s", "replica op/s", "ratio"
    );
    for l in &r.steady {
        println!(
            "{:>5} {:>12.1} {:>12.1} {:>8.4}",
            l.concurrency, l.single.median_ops_per_sec, l.replica.median_ops_per_sec, l.ratio
        );
    }
    println!("raise latency (a PUT raising the max), beside a same-token PUT:");
    for l in &r.raises {
        println!(
            "  {} replicas: raise p50 {:.2} ms p99 {:.2} ms; same token p50 {:.2} ms p99 {:.2} ms",
            l.replicas, l.raise.p50_ms, l.raise.p99_ms, l.same_token.p50_ms, l.same_token.p99_ms
        );
    }
}
