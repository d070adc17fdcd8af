//! fencegate-bench: measures the fencing proxy against direct backend
//! access, the lease service against etcd, and how both scale, side by
//! side in one run. Prints tables; writes everything to a JSON file.
//!
//! The proxy and the lease service under test are the release binary
//! (`target/release/fencegate`) run as separate processes; the S3 backend
//! (s3s-fs via `DevStore`, with request counting) runs in this process on
//! its own runtime. See BENCHMARKS.md for results and method.

mod backend;
mod chart;
mod floor;
mod growth;
mod ha;
mod large;
mod leases;
mod nginx;
mod replicas;
mod report;
mod roundtrips;
mod scale;
mod small;
mod util;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    name = "fencegate-bench",
    about = "Benchmarks of fencegate: proxy vs direct, lease service vs etcd, growth"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: Global,
}

#[derive(Debug, Args)]
struct Global {
    /// Where to write the JSON results.
    #[arg(long, global = true, default_value = "bench-results.json")]
    out: PathBuf,
    /// Smaller counts and shorter rounds, no 1 GiB object: a smoke test.
    #[arg(long, global = true)]
    quick: bool,
    /// The fencegate binary under test (build it with
    /// `cargo build --release -p fencegate --bin fencegate`).
    #[arg(long, global = true)]
    fencegate: Option<PathBuf>,
    /// The etcd binary (Debian: `apt-get install etcd-server`).
    #[arg(long, global = true, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// Directory for databases, the backend's objects and logs (use a real
    /// disk: fsync cost is part of what is measured).
    #[arg(long, global = true)]
    tmp_dir: Option<PathBuf>,
    /// Where the in-process S3 backend stores objects (default: the tmp
    /// dir). s3s-fs creates a file per PUT, so the filesystem matters.
    #[arg(long, global = true)]
    backend_dir: Option<PathBuf>,
    /// Runtime worker threads of the in-process S3 backend.
    #[arg(long, global = true, default_value_t = 2)]
    backend_threads: usize,
    /// Interleaved rounds per variant (small, locksvc/etcd); default 6 for
    /// small and 4 for leases, 2 with --quick.
    #[arg(long, global = true)]
    rounds: Option<usize>,
    /// Seconds per round (default 2, 0.5 with --quick).
    #[arg(long, global = true)]
    round_secs: Option<f64>,
    /// Client concurrency levels for small and locksvc/etcd.
    #[arg(long, global = true, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// small and large: the nginx binary run as the plain reverse proxy anchor
    /// (Debian `nginx-light`; scripts/bench.sh installs it).
    #[arg(long, global = true, default_value = nginx::DEFAULT_NGINX)]
    nginx: PathBuf,
    /// small and large: leave nginx out.
    #[arg(long, global = true)]
    no_nginx: bool,
    /// small and large: a second fencegate binary (e.g. an older commit's)
    /// run as one more variant in the same rotated rounds, for
    /// before/after.
    #[arg(long, global = true)]
    baseline: Option<PathBuf>,
    /// small and large: the baseline's name in tables (and the chart).
    #[arg(long, global = true, default_value = "baseline")]
    baseline_label: String,
    /// small: also run the bare hyper forwarder (hyper's server and client
    /// on the proxy's thread-per-core layout, nothing between), the least
    /// any forwarder on hyper costs.
    #[arg(long, global = true)]
    floor: bool,
    /// small: where to draw the SVG chart (default: --out with .svg).
    #[arg(long, global = true)]
    chart: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// 4 KiB PUTs, direct vs nginx vs the proxy (vs --baseline), at each
    /// concurrency; draws the SVG chart.
    Small,
    /// 256 MiB and 1 GiB streamed PUTs, direct vs proxy; proxy RSS.
    Large,
    /// Backend requests per fenced PUT (counted at the backend).
    Roundtrips {
        /// PUTs per phase (default 2000, 200 with --quick).
        #[arg(long)]
        puts: Option<u64>,
    },
    /// Lease service alone: acquire+release pairs/s and renewals/s.
    Locksvc,
    /// Lease service and etcd, interleaved, with the ratio.
    Etcd,
    /// Cost per write / grant as scopes, keys and locks grow.
    Growth,
    /// The lease service on a 3-member etcd cluster against raw etcd on the
    /// same cluster and against the lease service on SQLite, interleaved.
    Ha,
    /// Proxy replicas on a 3-member etcd cluster: steady-state PUTs
    /// through a replica against a single proxy, and raise latency with 2
    /// and 3 replicas.
    Replicas,
    /// One proxy as what it remembers grows, end to end: a million
    /// distinct keys (RSS, PUTs/s), and 10,000 locks of 10 scopes each
    /// (PUT latency, RSS, the status page).
    Scale {
        /// Distinct keys written (default 1,000,000; 50,000 with --quick).
        #[arg(long)]
        keys: Option<usize>,
        /// Locks configured, each with 10 scopes (default 10,000; 1,000
        /// with --quick).
        #[arg(long)]
        locks: Option<usize>,
    },
    /// Everything above (the lease service with etcd side by side).
    All,
    /// Today's tables for BENCHMARKS.md, in Markdown, from results files;
    /// runs nothing.
    Report {
        /// JSON files written by runs, in the order the tables should come.
        files: Vec<PathBuf>,
    },
    /// The bare hyper forwarder `small --floor` measures against (run by
    /// the bench itself); serves until killed.
    #[command(hide = true)]
    Floor {
        /// The store, as `host:port`.
        #[arg(long)]
        upstream: std::net::SocketAddr,
    },
    /// Redraws the small section's chart from a results file (to --chart,
    /// default: FROM with .svg); runs nothing.
    Chart {
        /// A JSON file written by `small` or `all`.
        from: PathBuf,
    },
}

/// Where things run.
#[derive(Debug)]
pub struct Ctx {
    /// The `fencegate` binary under test.
    pub fencegate: PathBuf,
    /// Databases and logs of the services.
    pub tmp: PathBuf,
    /// Objects of the in-process S3 backend.
    pub backend_dir: PathBuf,
    pub backend_threads: usize,
}

/// One target from the brief, judged on the numbers measured.
#[derive(Debug, Serialize)]
struct Target {
    target: String,
    measured: String,
    /// None: could not be measured in this run.
    met: Option<bool>,
}

#[derive(Debug, Default, Serialize)]
struct Results {
    #[serde(skip_serializing_if = "Option::is_none")]
    small: Option<small::SmallReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    large: Option<large::LargeReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    roundtrips: Option<roundtrips::RoundtripReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leases: Option<leases::LeaseReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    growth: Option<growth::GrowthReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ha: Option<ha::HaReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<replicas::ReplicaReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scale: Option<scale::ScaleReport>,
}

#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    command: Vec<String>,
    mode: &'static str,
    /// The commit of the tree the binaries were built from (`git describe
    /// --always --dirty`, as `scripts/bench.sh` passes it in
    /// `FENCEGATE_BENCH_COMMIT`), if known.
    commit: Option<String>,
    started_unix_s: u64,
    elapsed_s: f64,
    /// /proc/loadavg at the end (compare with machine.loadavg_start).
    loadavg_end: String,
    machine: util::Machine,
    fencegate_binary: String,
    /// The SVG chart of the small section, if drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    chart: Option<String>,
    results: Results,
    targets: Vec<Target>,
    /// Sections that failed (the others still ran).
    failures: Vec<String>,
}

fn targets(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    if let Some(s) = &r.small {
        use small::Kind;
        for l in &s.levels {
            let (Some(d), Some(p)) = (l.get(Kind::Direct), l.get(Kind::Fencegate)) else {
                continue;
            };
            t.push(Target {
                target: format!("small c={}: proxy ops/s >= 0.97 x direct", l.concurrency),
                measured: format!(
                    "{:.4} ({:.1} vs {:.1} ops/s)",
                    p.ratio_ops, p.series.median_ops_per_sec, d.series.median_ops_per_sec
                ),
                met: Some(p.ratio_ops >= 0.97),
            });
            t.push(Target {
                target: format!("small c={}: p50 overhead <= 0.2 ms", l.concurrency),
                measured: format!(
                    "{:.4} ms ({:.4} vs {:.4} ms)",
                    p.p50_overhead_ms, p.series.latency.p50_ms, d.series.latency.p50_ms
                ),
                met: Some(p.p50_overhead_ms <= 0.2),
            });
            // Issue 11: as lean as a plain reverse proxy, in the same run.
            let Some(n) = l.get(Kind::Nginx) else {
                continue;
            };
            t.push(Target {
                target: format!("small c={}: proxy CPU/PUT <= 1.5 x nginx's", l.concurrency),
                measured: format!(
                    "{:.2} x ({:.1} vs {:.1} us)",
                    util::ratio(p.server_cpu_us_per_put, n.server_cpu_us_per_put),
                    p.server_cpu_us_per_put,
                    n.server_cpu_us_per_put
                ),
                met: Some(p.server_cpu_us_per_put <= 1.5 * n.server_cpu_us_per_put),
            });
            t.push(Target {
                target: format!(
                    "small c={}: proxy ratio within 0.03 of nginx's",
                    l.concurrency
                ),
                measured: format!("{:.4} vs {:.4}", p.ratio_ops, n.ratio_ops),
                met: Some(p.ratio_ops >= n.ratio_ops - 0.03),
            });
            // Not targets: how much of the gap to nginx is the store's
            // work for the fence (a conditional, tagged write), which any
            // fencing proxy asks of it and nginx's plain requests do not.
            if let Some(f) = l.get(Kind::DirectFenced) {
                t.push(Target {
                    target: format!(
                        "small c={}: the fenced request's cost at the store (direct+fence vs direct)",
                        l.concurrency
                    ),
                    measured: format!(
                        "ratio {:.4}, p50 {:+.3} ms, store CPU {:+.1} us/PUT",
                        f.ratio_ops,
                        f.p50_overhead_ms,
                        f.store_cpu_us_per_put - d.store_cpu_us_per_put
                    ),
                    met: None,
                });
                t.push(Target {
                    target: format!(
                        "small c={}: the proxy over direct+fence, nginx over direct",
                        l.concurrency
                    ),
                    measured: format!(
                        "ratio {:.4} vs {:.4}, p50 {:+.3} vs {:+.3} ms",
                        util::ratio(p.series.median_ops_per_sec, f.series.median_ops_per_sec),
                        n.ratio_ops,
                        p.p50_overhead_ms - f.p50_overhead_ms,
                        n.p50_overhead_ms
                    ),
                    met: None,
                });
            }
            if l.concurrency == 1 {
                t.push(Target {
                    target: "small c=1: p50 overhead <= nginx's + 0.1 ms".into(),
                    measured: format!(
                        "{:+.3} ms vs nginx {:+.3} ms",
                        p.p50_overhead_ms, n.p50_overhead_ms
                    ),
                    met: Some(p.p50_overhead_ms <= n.p50_overhead_ms + 0.1),
                });
            }
        }
    }
    if let Some(l) = &r.large {
        for s in &l.sizes {
            t.push(Target {
                target: format!(
                    "large {} MiB: proxy MB/s >= 0.97 x direct",
                    s.bytes / large::MIB
                ),
                measured: format!(
                    "{:.4} ({:.1} vs {:.1} MB/s)",
                    s.ratio, s.proxy_median_mb_per_sec, s.direct_median_mb_per_sec
                ),
                met: Some(s.ratio >= 0.97),
            });
            if let Some(n) = s.nginx_ratio {
                t.push(Target {
                    target: format!(
                        "large {} MiB: proxy ratio within 0.03 of nginx's",
                        s.bytes / large::MIB
                    ),
                    measured: format!("{:.4} vs {n:.4}", s.ratio),
                    met: Some(s.ratio >= n - 0.03),
                });
            }
        }
        if let Some(s) = l.sizes.iter().max_by_key(|s| s.bytes) {
            let peak = s.proxy_hwm_after_kib.max(s.proxy_rss_sampled_peak_kib);
            t.push(Target {
                target: format!(
                    "proxy RSS <= 64 MiB while streaming {} MiB{}",
                    s.bytes / large::MIB,
                    if s.bytes < 1024 * large::MIB {
                        " (1 GiB skipped in this run)"
                    } else {
                        ""
                    }
                ),
                measured: format!("VmHWM {} KiB ({:.1} MiB)", peak, peak as f64 / 1024.0),
                met: Some(peak <= 64 * 1024),
            });
        }
    }
    if let Some(rt) = &r.roundtrips {
        for p in rt
            .phases
            .iter()
            .filter(|p| p.name.starts_with("steady state"))
        {
            t.push(Target {
                target: format!("1 backend round trip per PUT: {}", p.name),
                measured: format!(
                    "{:.4} requests / PUT {:?}",
                    p.backend_http_per_put, p.backend.ops
                ),
                met: Some(p.backend_http_per_put <= 1.0),
            });
        }
    }
    if let Some(le) = &r.leases {
        if let Some(why) = le
            .etcd_unavailable
            .as_ref()
            .filter(|w| !w.starts_with("not requested"))
        {
            t.push(Target {
                target: "locksvc >= 1.5 x etcd".into(),
                measured: format!("NOT MEASURED: {why}"),
                met: None,
            });
        }
        for l in &le.levels {
            if let Some(ratio) = l.ratio_locksvc_over_etcd {
                t.push(Target {
                    target: format!(
                        "locksvc >= 1.5 x etcd: {:?} c={}",
                        l.workload, l.concurrency
                    ),
                    measured: format!(
                        "{:.3} ({:.1} vs {:.1} ops/s)",
                        ratio,
                        l.locksvc.median_ops_per_sec,
                        l.etcd.as_ref().map_or(f64::NAN, |e| e.median_ops_per_sec)
                    ),
                    met: Some(ratio >= 1.5),
                });
            }
        }
    }
    if let Some(h) = &r.ha {
        for l in &h.levels {
            t.push(Target {
                target: format!(
                    "locksvc on etcd >= 0.8 x raw etcd: {:?} c={}",
                    l.workload, l.concurrency
                ),
                measured: format!(
                    "{:.3} ({:.1} vs {:.1} ops/s)",
                    l.ratio_over_raw_etcd,
                    l.locksvc_etcd.median_ops_per_sec,
                    l.raw_etcd.median_ops_per_sec
                ),
                met: Some(l.ratio_over_raw_etcd >= 0.8),
            });
        }
    }
    if let Some(s) = &r.scale {
        scale::targets(s, &mut t);
    }
    if let Some(r) = &r.replicas {
        for l in &r.steady {
            t.push(Target {
                target: format!(
                    "replicas c={}: a replica of 2 >= 0.97 x a single proxy (steady state)",
                    l.concurrency
                ),
                measured: format!(
                    "{:.4} ({:.1} vs {:.1} ops/s)",
                    l.ratio, l.replica.median_ops_per_sec, l.single.median_ops_per_sec
                ),
                met: Some(l.ratio >= 0.97),
            });
        }
    }
    t
}

#[allow(
    clippy::disallowed_methods,
    reason = "a timestamp for the report, not a decision"
)]
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn write_json(path: &Path, report: &Report) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// `fencegate-bench chart FROM`: the small section's chart from a JSON file.
fn redraw_chart(from: &Path, to: Option<&Path>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(from).with_context(|| format!("cannot read {}", from.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let small: small::SmallReport = serde_json::from_value(
        json.pointer("/results/small")
            .cloned()
            .with_context(|| format!("{} has no results.small", from.display()))?,
    )?;
    let machine = &json["machine"];
    let note = chart::note(
        &machine["nproc"],
        machine["cpu_model"].as_str().unwrap_or("?"),
        machine["loadavg_start"].as_str().unwrap_or("?"),
        json["fencegate_binary"].as_str().unwrap_or("?"),
    );
    let to = to.map_or_else(|| from.with_extension("svg"), Path::to_owned);
    chart::draw(&small, &to, &note)?;
    println!("chart: {}", to.display());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let g = &cli.global;
    if let Command::Chart { from } = &cli.command {
        return redraw_chart(from, g.chart.as_deref());
    }
    if let Command::Floor { upstream } = &cli.command {
        // Its own threads and runtimes, as the proxy's; this one only waits.
        let upstream = *upstream;
        return tokio::task::spawn_blocking(move || floor::serve(upstream)).await?;
    }
    if let Command::Report { files } = &cli.command {
        let mut runs = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            runs.push((serde_json::from_str(&text)?, f.display().to_string()));
        }
        print!("{}", report::render(&runs));
        return Ok(());
    }
    let quick = g.quick;
    let fencegate = g.fencegate.clone().unwrap_or_else(util::default_fencegate);
    anyhow::ensure!(
        fencegate.exists(),
        "{} does not exist: run `cargo build --release -p fencegate --bin fencegate` (scripts/bench.sh does)",
        fencegate.display()
    );
    let fencegate = fencegate.canonicalize()?;
    let tmp_root = g.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&tmp_root)?;
    let tmp_holder = tempfile::Builder::new()
        .prefix("fencegate-bench-")
        .tempdir_in(&tmp_root)?;
    let tmp = tmp_holder.path();
    let backend_holder = match &g.backend_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            Some(
                tempfile::Builder::new()
                    .prefix("fencegate-bench-backend-")
                    .tempdir_in(d)?,
            )
        }
        None => None,
    };
    let ctx = Ctx {
        fencegate: fencegate.clone(),
        tmp: tmp.to_owned(),
        backend_dir: backend_holder
            .as_ref()
            .map_or_else(|| tmp.to_owned(), |d| d.path().to_owned()),
        backend_threads: g.backend_threads,
    };
    let round = Duration::from_secs_f64(g.round_secs.unwrap_or(if quick { 0.5 } else { 2.0 }));

    let baseline = match &g.baseline {
        Some(p) => {
            anyhow::ensure!(p.exists(), "--baseline {} does not exist", p.display());
            Some((p.canonicalize()?, g.baseline_label.clone()))
        }
        None => None,
    };
    let small_opts = small::SmallOpts {
        concurrency: g.concurrency.clone(),
        rounds: g.rounds,
        quick,
        round,
        warmup: round / 2,
        object_bytes: 4096,
        keys_per_worker: 8,
        nginx: (!g.no_nginx).then(|| g.nginx.clone()),
        baseline,
        floor: g.floor,
    };
    let chart_path = g
        .chart
        .clone()
        .unwrap_or_else(|| g.out.with_extension("svg"));
    let large_opts = large::LargeOpts {
        sizes: if quick {
            vec![(256 * large::MIB, 1)]
        } else {
            vec![(256 * large::MIB, 5), (1024 * large::MIB, 3)]
        },
        nginx: (!g.no_nginx).then(|| g.nginx.clone()),
        baseline: small_opts.baseline.clone(),
    };
    let lease_opts = |with_etcd: bool| leases::LeaseOpts {
        concurrency: g.concurrency.clone(),
        rounds: g.rounds.unwrap_or(if quick { 2 } else { 4 }),
        round,
        with_etcd,
        etcd_bin: g.etcd.clone(),
    };
    let growth_opts = if quick {
        growth::GrowthOpts {
            scope_levels: vec![1, 100, 10_000],
            admits_per_level: 50_000,
            raises: 10,
            key_levels: vec![1, 10_000, 200_000],
            cache_entries: 100_000,
            lock_levels: vec![1, 10_000, 100_000],
            grants_per_level: 50_000,
            http_lock_levels: vec![0, 1_000],
            http_concurrency: 8,
            http_rounds: 1,
            http_round: round,
        }
    } else {
        growth::GrowthOpts {
            scope_levels: vec![1, 10, 100, 1_000, 10_000, 100_000],
            admits_per_level: 200_000,
            raises: 50,
            key_levels: vec![1, 1_000, 10_000, 100_000, 1_000_000],
            cache_entries: 100_000,
            lock_levels: vec![1, 1_000, 10_000, 100_000, 1_000_000],
            grants_per_level: 200_000,
            http_lock_levels: vec![0, 1_000, 10_000, 100_000],
            http_concurrency: 8,
            http_rounds: 2,
            http_round: round,
        }
    };

    let started = Instant::now();
    let machine = util::Machine::describe(tmp);
    println!(
        "machine: {} x {}, {} MiB RAM, kernel {}, {}; tmp {} ({}), 4 KiB write+fdatasync p50 {:.3} ms appending, {:.3} ms in place; load {}",
        machine.nproc,
        machine.cpu_model,
        machine.mem_total_kib / 1024,
        machine.kernel,
        machine.rustc,
        machine.tmp_dir,
        machine.tmp_fs,
        machine
            .fsync_4k
            .as_ref()
            .map_or(f64::NAN, |l| l.append.p50_ms),
        machine
            .fsync_4k
            .as_ref()
            .map_or(f64::NAN, |l| l.overwrite.p50_ms),
        machine.loadavg_start
    );
    let mut report = Report {
        tool: "fencegate-bench",
        command: std::env::args().collect(),
        mode: if quick { "quick" } else { "full" },
        commit: std::env::var("FENCEGATE_BENCH_COMMIT").ok(),
        started_unix_s: unix_now(),
        elapsed_s: 0.0,
        loadavg_end: String::new(),
        machine,
        fencegate_binary: fencegate.display().to_string(),
        chart: None,
        results: Results::default(),
        targets: Vec::new(),
        failures: Vec::new(),
    };
    let (do_small, do_large, do_rt, do_leases, do_growth, with_etcd) = match &cli.command {
        Command::Small => (true, false, false, false, false, false),
        Command::Large => (false, true, false, false, false, false),
        Command::Roundtrips { .. } => (false, false, true, false, false, false),
        Command::Locksvc => (false, false, false, true, false, false),
        Command::Etcd => (false, false, false, true, false, true),
        Command::Growth => (false, false, false, false, true, false),
        Command::Ha | Command::Replicas => (false, false, false, false, false, false),
        Command::Scale { .. } => (false, false, false, false, false, false),
        Command::All => (true, true, true, true, true, true),
        Command::Chart { .. } | Command::Report { .. } | Command::Floor { .. } => {
            unreachable!("handled above")
        }
    };
    let do_ha = matches!(cli.command, Command::Ha | Command::All);
    let do_replicas = matches!(cli.command, Command::Replicas | Command::All);
    let scale_opts = {
        let (keys, locks) = match &cli.command {
            Command::Scale { keys, locks } => (*keys, *locks),
            _ => (None, None),
        };
        let keys = keys.unwrap_or(if quick { 50_000 } else { 1_000_000 });
        scale::ScaleOpts {
            keys,
            key_windows: 20,
            direct_share: 0.2,
            concurrency: 16,
            rewrites: 2_000.min(keys / 4),
            locks: locks.unwrap_or(if quick { 1_000 } else { 10_000 }),
            scopes_per_lock: 10,
            lock_windows: 10,
            page_loads: 5,
        }
    };
    let replica_opts = replicas::ReplicaOpts {
        concurrency: g.concurrency.clone(),
        rounds: g.rounds.unwrap_or(if quick { 2 } else { 6 }),
        round,
        raises: if quick { 20 } else { 200 },
        etcd_bin: g.etcd.clone(),
    };
    let ha_opts = ha::HaOpts {
        concurrency: g.concurrency.clone(),
        rounds: g.rounds.unwrap_or(if quick { 2 } else { 4 }),
        round,
        etcd_bin: g.etcd.clone(),
    };
    let rt_puts = match &cli.command {
        Command::Roundtrips { puts: Some(n) } => *n,
        _ if quick => 200,
        _ => 2000,
    };
    let out = g.out.clone();
    let checkpoint = |report: &mut Report| -> anyhow::Result<()> {
        report.elapsed_s = started.elapsed().as_secs_f64();
        report.loadavg_end = util::loadavg();
        report.targets = targets(&report.results);
        write_json(&out, report)
    };

    if do_small {
        report.results.small =
            report.kept("small", small::run(&ctx, &small_opts).await, small::print);
        if let Some(r) = &report.results.small {
            let note = chart::note(
                &report.machine.nproc,
                &report.machine.cpu_model,
                &report.machine.loadavg_start,
                &fencegate.display().to_string(),
            );
            match chart::draw(r, &chart_path, &note) {
                Ok(()) => {
                    println!("chart: {}", chart_path.display());
                    report.chart = Some(chart_path.display().to_string());
                }
                Err(e) => report.failures.push(format!("small chart: {e:#}")),
            }
        }
        checkpoint(&mut report)?;
    }
    if do_large {
        report.results.large =
            report.kept("large", large::run(&ctx, &large_opts).await, large::print);
        checkpoint(&mut report)?;
    }
    if do_rt {
        report.results.roundtrips = report.kept(
            "roundtrips",
            roundtrips::run(&ctx, rt_puts).await,
            roundtrips::print,
        );
        checkpoint(&mut report)?;
    }
    if do_leases {
        report.results.leases = report.kept(
            "locksvc/etcd",
            leases::run(&fencegate, tmp, &lease_opts(with_etcd)).await,
            leases::print,
        );
        checkpoint(&mut report)?;
    }
    if do_growth {
        report.results.growth = report.kept(
            "growth",
            growth::run(&growth_opts, &fencegate, tmp).await,
            growth::print,
        );
        checkpoint(&mut report)?;
    }

    if do_ha {
        report.results.ha = report.kept("ha", ha::run(&fencegate, tmp, &ha_opts).await, ha::print);
        checkpoint(&mut report)?;
    }

    if do_replicas {
        report.results.replicas = report.kept(
            "replicas",
            replicas::run(&ctx, &replica_opts).await,
            replicas::print,
        );
        checkpoint(&mut report)?;
    }

    if matches!(cli.command, Command::Scale { .. } | Command::All) {
        report.results.scale =
            report.kept("scale", scale::run(&ctx, &scale_opts).await, scale::print);
        checkpoint(&mut report)?;
    }

    checkpoint(&mut report)?;
    println!("\n== targets ==");
    for t in &report.targets {
        println!(
            "[{}] {}: {}",
            match t.met {
                Some(true) => "met   ",
                Some(false) => "MISSED",
                None => "n/a   ",
            },
            t.target,
            t.measured
        );
    }
    for f in &report.failures {
        println!("[FAILED] {f}");
    }
    println!("load average at the end: {}", report.loadavg_end);
    println!(
        "\nwrote {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        report.failures.is_empty(),
        "{} section(s) failed",
        report.failures.len()
    );
    Ok(())
}

impl Report {
    /// One benchmark's report, printed, or `None` with why it failed
    /// among the failures (the others still run).
    fn kept<R>(&mut self, name: &str, outcome: anyhow::Result<R>, print: fn(&R)) -> Option<R> {
        match outcome {
            Ok(r) => {
                print(&r);
                Some(r)
            }
            Err(e) => {
                self.failures.push(format!("{name}: {e:#}"));
                None
            }
        }
    }
}
