//! `fencegate probe`: what a store enforces, and what the proxy would do
//! about it, before the proxy is deployed on it. The same probe the proxy
//! runs at start-up, on the same configuration.

use anyhow::Context as _;
use clap::Args;
use fencegate_proxy::probe::ProbeReport;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The proxy's TOML configuration: its `[backend]` section (credentials
    /// also from FENCEGATE_BACKEND_ACCESS_KEY / _SECRET_KEY), `probe_bucket`,
    /// `scopes` and `accept_weak_backend` are read.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Backend endpoint URL; overrides `backend.endpoint` in the file.
    #[arg(long, env = "FENCEGATE_BACKEND_ENDPOINT")]
    pub backend: Option<String>,
    /// A bucket to probe (repeat for more). Default: `probe_bucket`, else
    /// the buckets of the configured scopes.
    #[arg(long = "bucket")]
    pub buckets: Vec<String>,
    /// Print the reports as JSON (one array), not as text.
    #[arg(long)]
    pub json: bool,
}

/// Probes each bucket; true if the proxy would serve fenced writes to
/// every one of them.
pub async fn probe(args: ProbeArgs) -> anyhow::Result<bool> {
    let mut config =
        crate::services::load_config(&args.config, fencegate_proxy::ProxyConfig::from_toml)?;
    if let Some(b) = args.backend {
        config.backend.endpoint = b;
    }
    let mut buckets = args.buckets;
    if buckets.is_empty() {
        buckets.extend(config.probe_bucket.clone());
    }
    if buckets.is_empty() {
        for s in &config.scopes {
            if !buckets.contains(&s.bucket) {
                buckets.push(s.bucket.clone());
            }
        }
    }
    anyhow::ensure!(
        !buckets.is_empty(),
        "name a bucket to probe: --bucket NAME (or probe_bucket / scopes in --config)"
    );
    let mut reports = Vec::new();
    for bucket in &buckets {
        let report = fencegate_proxy::probe::probe_store(&config.backend, bucket)
            .await
            .with_context(|| {
                format!("cannot probe s3://{bucket} on {}", config.backend.endpoint)
            })?;
        reports.push(report);
    }
    let weak = config.accept_weak_backend;
    if args.json {
        let out: Vec<_> = reports
            .iter()
            .map(|r| {
                serde_json::json!({
                    "endpoint": config.backend.endpoint,
                    "report": r,
                    "safe": r.safe(),
                    "proxy_runs": r.safe() || weak,
                    "checks": r.checks().iter().map(|l| l.to_json()).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for r in &reports {
            print!("{}", text(r, &config.backend.endpoint, weak));
        }
    }
    let refused: Vec<&str> = reports
        .iter()
        .filter(|r| !r.safe() && !weak)
        .map(|r| r.bucket.as_str())
        .collect();
    if !refused.is_empty() {
        eprintln!(
            "fencegate: the proxy would refuse fenced writes to {} (a required condition is not enforced; see above)",
            refused.join(", ")
        );
    }
    Ok(refused.is_empty())
}

/// The report for people.
fn text(r: &ProbeReport, endpoint: &str, weak: bool) -> String {
    let verdict = match (r.safe(), weak) {
        (true, _) => "SAFE: the proxy serves fenced writes to this bucket",
        (false, true) => {
            "UNSAFE, but accept_weak_backend = true: the proxy serves fenced writes with itself as the only fence (one replica, no other writers)"
        }
        (false, false) => "UNSAFE: the proxy refuses fenced writes to this bucket",
    };
    let mut out = format!("s3://{} on {endpoint}: {verdict}\n", r.bucket);
    let lines = r.checks();
    for l in &lines {
        let _ = writeln!(out, "  {:<34} {}", l.label, l.check.describe());
        let _ = writeln!(out, "  {:<34} -> {}", "", l.proxy);
    }
    out.push_str("  requests and answers:\n");
    for l in &lines {
        for a in &l.check.answers {
            let _ = writeln!(out, "    {a}");
        }
    }
    out
}
