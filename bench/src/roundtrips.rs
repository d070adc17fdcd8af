//! `roundtrips`: how many backend requests one fenced PUT costs, counted
//! by the backend itself (HTTP requests and S3 operations).

use crate::backend::{BUCKET, Backend, Counts, ProxyProc, token};
use crate::fenced;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub puts: u64,
    pub backend: Counts,
    pub backend_http_per_put: f64,
}

#[derive(Debug, Serialize)]
pub struct RoundtripReport {
    /// Backend requests the proxy made at start-up (the conditional-write
    /// probe), not counted below.
    pub startup: Counts,
    pub phases: Vec<Phase>,
}

async fn puts(
    client: &aws_sdk_s3::Client,
    keys: impl Iterator<Item = String>,
    tok: &http::HeaderValue,
    body: &Bytes,
) -> anyhow::Result<u64> {
    let mut n = 0;
    for key in keys {
        fenced!(
            client
                .put_object()
                .bucket(BUCKET)
                .key(&key)
                .body(ByteStream::from(body.clone())),
            tok
        )
        .send()
        .await
        .map_err(|e| {
            anyhow::anyhow!("PUT {key}: {:?}", aws_sdk_s3::error::DisplayErrorContext(e))
        })?;
        n += 1;
    }
    Ok(n)
}

pub async fn run(ctx: &crate::Ctx, n: u64) -> anyhow::Result<RoundtripReport> {
    let backend = Backend::start(&ctx.backend_dir, ctx.backend_threads).await?;
    let before_proxy = backend.counters.snapshot();
    let proxy = ProxyProc::start(&ctx.fencegate, &backend, &ctx.tmp).await?;
    let client = proxy.client();
    let body = Bytes::from(vec![b'x'; 4096]);
    let t1 = token(1)?;
    let t2 = token(2)?;
    let startup = backend.counters.snapshot().since(&before_proxy);

    let mut phases = Vec::new();
    let mut phase = async |name: &'static str,
                           keys: Vec<String>,
                           tok: &http::HeaderValue|
           -> anyhow::Result<()> {
        let before = backend.counters.snapshot();
        let done = puts(&client, keys.into_iter(), tok, &body).await?;
        let d = backend.counters.snapshot().since(&before);
        phases.push(Phase {
            name,
            puts: done,
            backend_http_per_put: d.http as f64 / done.max(1) as f64,
            backend: d,
        });
        Ok(())
    };
    phase(
        "first PUT of a new token to an unknown key (fence raise + HEAD)",
        vec!["rt/same".into()],
        &t1,
    )
    .await?;
    phase(
        "steady state: same key, same token",
        (1..n).map(|_| "rt/same".to_owned()).collect(),
        &t1,
    )
    .await?;
    phase(
        "distinct keys, first write of each (unknown to the proxy)",
        (0..n).map(|i| format!("rt/distinct/{i}")).collect(),
        &t1,
    )
    .await?;
    phase(
        "steady state: distinct keys, rewritten (known to the proxy)",
        (0..n).map(|i| format!("rt/distinct/{i}")).collect(),
        &t1,
    )
    .await?;
    phase(
        "a higher token (fence raise) to a known key",
        vec!["rt/same".into()],
        &t2,
    )
    .await?;
    drop(proxy);
    Ok(RoundtripReport { startup, phases })
}

pub fn print(r: &RoundtripReport) {
    println!("\n== roundtrips: backend requests per fenced PUT (counted at the backend) ==");
    println!(
        "proxy start-up probe: {} HTTP requests {:?}",
        r.startup.http, r.startup.ops
    );
    println!(
        "{:<64} | {:>6} | {:>8} | {:>9} | ops",
        "phase", "PUTs", "HTTP req", "req / PUT"
    );
    for p in &r.phases {
        println!(
            "{:<64} | {:>6} | {:>8} | {:>9.3} | {:?}",
            p.name, p.puts, p.backend.http, p.backend_http_per_put, p.backend.ops
        );
    }
}
