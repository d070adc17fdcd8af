//! `small`: 4 KiB PUTs to the same backend, in interleaved rounds, by up to
//! five ways: direct to the store, direct with the request the proxy makes
//! of it (conditional and tagged: what the fence costs the store), through
//! nginx (a plain reverse proxy, the cost anchor), through the fencegate
//! proxy under test, and optionally through a second fencegate binary (the
//! baseline, e.g. an older commit), so before and after are measured in
//! the same minutes.
//!
//! Every variant uses the same SDK client configuration; direct and nginx
//! sign with the backend's key (nginx passes the request on untouched), the
//! proxies with a client key of theirs.

use crate::backend::{BACKEND_KEY, BUCKET, Backend, ProxyProc, sdk_client, token};
use crate::fenced;
use crate::nginx::NginxProc;
use crate::util::{Cpu, Series, SeriesSummary, ratio, timed_round};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct SmallOpts {
    pub concurrency: Vec<usize>,
    /// Rounds per variant; None: the smallest multiple of the number of
    /// variants that is at least 6 (with `quick`: one full rotation).
    pub rounds: Option<usize>,
    pub quick: bool,
    pub round: Duration,
    pub warmup: Duration,
    pub object_bytes: usize,
    /// Keys each worker cycles through (overwrites, so the proxy's ETag
    /// cache is warm after the warm-up).
    pub keys_per_worker: usize,
    /// The nginx binary; None: no nginx variant.
    pub nginx: Option<PathBuf>,
    /// A second fencegate binary and its label (e.g. the commit).
    pub baseline: Option<(PathBuf, String)>,
    /// Also run the bare hyper forwarder ([`crate::floor`]).
    pub floor: bool,
}

/// The token number every variant's PUTs carry (and `DirectFenced` tags
/// its objects with, as the proxy does).
const TOKEN: u64 = 1;

/// The ways a PUT can reach the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Straight to the store.
    Direct,
    /// Straight to the store, as the proxy writes: `If-Match` with the
    /// key's last ETag (`If-None-Match: *` for its first write) and the
    /// token in `x-amz-meta-fencing-token`. What this costs over `Direct`
    /// is the store's work for the fence, not any proxy's.
    DirectFenced,
    /// Through nginx, a plain reverse proxy.
    Nginx,
    /// Through the fencegate proxy under test (`--fencegate`).
    Fencegate,
    /// Through the second fencegate binary (`--baseline`).
    Baseline,
    /// Through the bare hyper forwarder (`--floor`, [`crate::floor`]).
    Floor,
}

impl Kind {
    fn key_prefix(self) -> &'static str {
        match self {
            Kind::Direct => "small-direct",
            Kind::DirectFenced => "small-direct-fenced",
            Kind::Nginx => "small-nginx",
            Kind::Fencegate => "small-proxy",
            Kind::Baseline => "small-baseline",
            Kind::Floor => "small-floor",
        }
    }
}

/// What ran as one variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantInfo {
    pub kind: Kind,
    /// Name in tables and the chart.
    pub label: String,
    /// The binary (nginx, fencegate) and its version where known.
    pub binary: Option<String>,
    /// What `server_cpu_us_per_put` is the CPU of.
    pub server_cpu_of: String,
}

/// One variant at one concurrency.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantLevel {
    pub kind: Kind,
    pub label: String,
    pub series: SeriesSummary,
    /// Median ops/s over direct's median (1 for direct).
    pub ratio_ops: f64,
    /// Per round (the same round of the rotation): this / direct.
    pub ratio_ops_per_round: Vec<f64>,
    /// p50 and p99 minus direct's (0 for direct).
    pub p50_overhead_ms: f64,
    pub p99_overhead_ms: f64,
    /// CPU microseconds per PUT of this variant's own server side, during
    /// its rounds: for direct the store (the backend's threads); for nginx
    /// its master and workers; for fencegate and the baseline the proxy
    /// process. The store behind a proxy is NOT included here.
    pub server_cpu_us_per_put: f64,
    /// The store's CPU per PUT during this variant's rounds (for direct the
    /// same as `server_cpu_us_per_put`).
    pub store_cpu_us_per_put: f64,
    /// The bench client's CPU per PUT (this process, less the store).
    pub client_cpu_us_per_put: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmallLevel {
    pub concurrency: usize,
    /// In the order of [`SmallReport::variants`]; direct first.
    pub variants: Vec<VariantLevel>,
}

impl SmallLevel {
    pub fn get(&self, kind: Kind) -> Option<&VariantLevel> {
        self.variants.iter().find(|v| v.kind == kind)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmallReport {
    pub object_bytes: usize,
    pub rounds: usize,
    pub round_secs: f64,
    pub warmup_secs: f64,
    pub keys_per_worker: usize,
    /// Round r runs the variants in this order rotated by r.
    pub variants: Vec<VariantInfo>,
    /// Why nginx is not among the variants, if it is not.
    pub nginx_unavailable: Option<String>,
    pub levels: Vec<SmallLevel>,
}

/// One variant while it runs: its client and what serves it.
#[derive(Debug)]
struct Running {
    info: VariantInfo,
    client: aws_sdk_s3::Client,
    server: Server,
    /// Each key's last ETag, for a variant that writes conditionally.
    etags: Option<Etags>,
}

/// The last ETag the store gave each key (`DirectFenced`).
type Etags = Arc<Mutex<HashMap<String, String>>>;

#[derive(Debug)]
enum Server {
    Store,
    Nginx(NginxProc),
    Proxy(ProxyProc),
    Floor(crate::util::Proc),
}

impl Running {
    /// The processes whose CPU is this variant's own (none for direct: the
    /// store runs in this process and is measured by thread name).
    fn pids(&self) -> Vec<u32> {
        match &self.server {
            Server::Store => Vec::new(),
            Server::Nginx(n) => n.pids(),
            Server::Proxy(p) => vec![p.proc.pid()],
            Server::Floor(p) => vec![p.pid()],
        }
    }
}

async fn round(
    v: &Running,
    concurrency: usize,
    dur: Duration,
    body: &Bytes,
    tok: &http::HeaderValue,
    keys_per_worker: usize,
) -> crate::util::RoundResult {
    let client = v.client.clone();
    let etags = v.etags.clone();
    let body = body.clone();
    let tok = tok.clone();
    let prefix = v.info.kind.key_prefix();
    timed_round(concurrency, dur, move |w, i| {
        let client = client.clone();
        let etags = etags.clone();
        let body = body.clone();
        let tok = tok.clone();
        async move {
            let key = format!(
                "{prefix}/c{concurrency}/w{w}/k{}",
                i as usize % keys_per_worker
            );
            let mut put = client
                .put_object()
                .bucket(BUCKET)
                .key(&key)
                .body(ByteStream::from(body));
            if let Some(etags) = &etags {
                let last = etags.lock().get(&key).cloned();
                put = match last {
                    Some(etag) => put.if_match(etag),
                    None => put.if_none_match("*"),
                }
                .metadata("fencing-token", TOKEN.to_string());
            }
            // The same request every way, Fencing-Token included (the
            // backend ignores the header, nginx passes it on).
            let out = fenced!(put, tok)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{:?}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
            if let Some(etags) = &etags {
                let etag = out
                    .e_tag()
                    .ok_or_else(|| anyhow::anyhow!("the store gave {key} no ETag"))?;
                etags.lock().insert(key, etag.to_owned());
            }
            Ok(())
        }
    })
    .await
}

pub async fn run(ctx: &crate::Ctx, opts: &SmallOpts) -> anyhow::Result<SmallReport> {
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let mut variants = vec![Running {
        info: VariantInfo {
            kind: Kind::Direct,
            label: "direct".into(),
            binary: None,
            server_cpu_of: "the store (s3s-fs, the backend's threads in the bench process)".into(),
        },
        client: backend.direct(),
        server: Server::Store,
        etags: None,
    }];
    variants.push(Running {
        info: VariantInfo {
            kind: Kind::DirectFenced,
            label: "direct+fence".into(),
            binary: None,
            server_cpu_of: "the store, as for direct".into(),
        },
        client: backend.direct(),
        server: Server::Store,
        etags: Some(Etags::default()),
    });
    let nginx_unavailable =
        match crate::nginx::anchor("small", opts.nginx.as_deref(), &backend.endpoint, &ctx.tmp)
            .await?
        {
            Ok(n) => {
                variants.push(Running {
                    info: VariantInfo {
                        kind: Kind::Nginx,
                        label: "nginx".into(),
                        binary: Some(format!(
                            "{} ({}, {} workers)",
                            opts.nginx
                                .as_ref()
                                .map_or(String::new(), |p| p.display().to_string()),
                            n.version,
                            n.workers().len()
                        )),
                        server_cpu_of: "nginx master and workers (the store not included)".into(),
                    },
                    client: sdk_client(&n.url, BACKEND_KEY),
                    server: Server::Nginx(n),
                    etags: None,
                });
                None
            }
            Err(why) => Some(why),
        };
    let proxy = ProxyProc::start(&ctx.fencegate, &backend, &ctx.tmp).await?;
    variants.push(Running {
        info: VariantInfo {
            kind: Kind::Fencegate,
            label: "fencegate".into(),
            binary: Some(ctx.fencegate.display().to_string()),
            server_cpu_of: "the fencegate proxy process (the store not included)".into(),
        },
        client: proxy.client(),
        server: Server::Proxy(proxy),
        etags: None,
    });
    if let Some((bin, label)) = &opts.baseline {
        let proxy = ProxyProc::start(bin, &backend, &ctx.tmp).await?;
        variants.push(Running {
            info: VariantInfo {
                kind: Kind::Baseline,
                label: label.clone(),
                binary: Some(bin.display().to_string()),
                server_cpu_of: "the baseline fencegate proxy process (the store not included)"
                    .into(),
            },
            client: proxy.client(),
            server: Server::Proxy(proxy),
            etags: None,
        });
    }
    if opts.floor {
        let floor = floor_proc(&backend.endpoint, &ctx.tmp)?;
        variants.push(Running {
            info: VariantInfo {
                kind: Kind::Floor,
                label: "hyper-floor".into(),
                binary: Some(
                    "fencegate-bench floor (hyper server and client, nothing between)".into(),
                ),
                server_cpu_of: "the floor forwarder process (the store not included)".into(),
            },
            client: sdk_client(&floor.url, BACKEND_KEY),
            server: Server::Floor(floor),
            etags: None,
        });
    }

    let k = variants.len();
    let rounds = opts.rounds.unwrap_or(if opts.quick {
        k
    } else {
        6usize.div_ceil(k) * k
    });
    let tok = token(TOKEN)?;
    let mut payload = vec![0u8; opts.object_bytes];
    crate::util::Rng::new(42).fill(&mut payload);
    let body = Bytes::from(payload);

    let mut levels = Vec::new();
    for &c in &opts.concurrency {
        eprintln!("small: concurrency {c}");
        // Warm-up: connections, the proxies' fence raise, key creation (the
        // first write of each key costs a proxy a HEAD).
        for v in &variants {
            let r = round(v, c, opts.warmup, &body, &tok, opts.keys_per_worker).await;
            if r.errors > 0 {
                anyhow::bail!(
                    "small warm-up {} c={c}: {} errors, first: {}",
                    v.info.label,
                    r.errors,
                    r.first_error.unwrap_or_default()
                );
            }
        }
        let mut series: Vec<Series> = (0..k).map(|_| Series::default()).collect();
        let mut cpu: Vec<Cpu> = vec![Cpu::default(); k];
        for r in 0..rounds {
            // Rotate the order each round (A B C, B C A, C A B, ...): each
            // variant runs in each position equally often, so drift and the
            // machine's other load fall on all of them.
            for j in 0..k {
                let i = (r + j) % k;
                let v = &variants[i];
                let pids = v.pids();
                let before = Cpu::read_pids(&pids);
                let res = round(v, c, opts.round, &body, &tok, opts.keys_per_worker).await;
                let after = Cpu::read_pids(&pids);
                series[i].add(res);
                cpu[i].add_delta(before, after);
            }
        }
        let direct_rounds = series[0].rounds_ops_per_sec.clone();
        let summaries: Vec<SeriesSummary> = series.into_iter().map(Series::summary).collect();
        let d = summaries[0].clone();
        let mut out = Vec::with_capacity(k);
        for ((v, s), cpu) in variants.iter().zip(summaries).zip(cpu) {
            let per = cpu.per_op_us(s.latency.samples as f64);
            out.push(VariantLevel {
                kind: v.info.kind,
                label: v.info.label.clone(),
                ratio_ops: ratio(s.median_ops_per_sec, d.median_ops_per_sec),
                ratio_ops_per_round: s
                    .rounds_ops_per_sec
                    .iter()
                    .zip(&direct_rounds)
                    .map(|(a, b)| ratio(*a, *b))
                    .collect(),
                p50_overhead_ms: s.latency.p50_ms - d.latency.p50_ms,
                p99_overhead_ms: s.latency.p99_ms - d.latency.p99_ms,
                server_cpu_us_per_put: if matches!(v.info.kind, Kind::Direct | Kind::DirectFenced) {
                    per.backend
                } else {
                    per.proxy
                },
                store_cpu_us_per_put: per.backend,
                client_cpu_us_per_put: per.client,
                series: s,
            });
        }
        levels.push(SmallLevel {
            concurrency: c,
            variants: out,
        });
    }
    Ok(SmallReport {
        object_bytes: opts.object_bytes,
        rounds,
        round_secs: opts.round.as_secs_f64(),
        warmup_secs: opts.warmup.as_secs_f64(),
        keys_per_worker: opts.keys_per_worker,
        variants: variants.iter().map(|v| v.info.clone()).collect(),
        nginx_unavailable,
        levels,
    })
}

/// Starts this binary's bare hyper forwarder ([`crate::floor`]) in front of
/// `backend_endpoint` (`http://host:port`).
fn floor_proc(backend_endpoint: &str, tmp: &std::path::Path) -> anyhow::Result<crate::util::Proc> {
    let upstream = backend_endpoint
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("backend endpoint {backend_endpoint} is not http://"))?
        .trim_end_matches('/');
    let exe = std::env::current_exe()?;
    // `FENCEGATE_BENCH_FLOOR_UNDER="valgrind --tool=callgrind ..."` runs it
    // under a tool (how bench/results/HISTORY.md counted its instructions
    // per PUT, issue 38's fourth stop).
    let under = std::env::var("FENCEGATE_BENCH_FLOOR_UNDER").unwrap_or_default();
    let mut words = under.split_whitespace();
    let mut cmd = match words.next() {
        Some(tool) => {
            let mut c = std::process::Command::new(tool);
            c.args(words).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    cmd.args(["floor", "--upstream", upstream]);
    crate::util::Proc::start_fencegate(cmd, tmp.join("floor.log"))
}

pub fn print(r: &SmallReport) {
    println!(
        "\n== small: {} B PUTs, {} rotated rounds of {:.1}s per variant ==",
        r.object_bytes, r.rounds, r.round_secs
    );
    for v in &r.variants {
        println!(
            "  {:<12} {}; own CPU = {}",
            v.label,
            v.binary.as_deref().unwrap_or("-"),
            v.server_cpu_of
        );
    }
    if let Some(why) = &r.nginx_unavailable {
        println!("  nginx: NOT MEASURED: {why}");
    }
    println!(
        "CPU us/PUT: 'own' = the variant's server side (direct: the store; a proxy: its own process(es), store excluded); 'store' and 'client' during that variant's rounds"
    );
    println!(
        "{:>5} {:<12} | {:>9} {:>7} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>5}",
        "conc",
        "variant",
        "ops/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "p50 +ms",
        "own",
        "store",
        "client",
        "errs"
    );
    for l in &r.levels {
        for v in &l.variants {
            println!(
                "{:>5} {:<12} | {:>9.1} {:>7.4} | {:>8.3} {:>8.3} {:>8.3} | {:>8.1} {:>8.1} {:>8.1} | {:>5}",
                l.concurrency,
                v.label,
                v.series.median_ops_per_sec,
                v.ratio_ops,
                v.series.latency.p50_ms,
                v.series.latency.p99_ms,
                v.p50_overhead_ms,
                v.server_cpu_us_per_put,
                v.store_cpu_us_per_put,
                v.client_cpu_us_per_put,
                v.series.errors
            );
        }
    }
    println!("per-round ratios to direct:");
    for l in &r.levels {
        for v in l.variants.iter().filter(|v| v.kind != Kind::Direct) {
            let rs: Vec<String> = v
                .ratio_ops_per_round
                .iter()
                .map(|x| format!("{x:.3}"))
                .collect();
            println!("  c={:<3} {:<12} {}", l.concurrency, v.label, rs.join(" "));
        }
    }
}
