//! Raising a lock's fence at a proxy when its lease is taken
//! (`POST /_fencegate/fence`), before the new holder writes anything: the
//! old holder's writes are refused from that moment, not from the new
//! holder's first write.

use fencegate_net::tls::ClientTls;
use std::time::Duration;
use tokio::time::Instant;

/// What the proxy said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// The fence is at (at least) the token: the max there now.
    To(u64),
    /// No scope of that proxy is fenced by the lock: nothing to fence.
    NotFencedThere,
}

/// Raises the fence of the lock `fencing_token` names at the proxy at
/// `proxy` (its S3 endpoint URL), trying until `until`. A raise may wait
/// at the proxy for older writes to drain (after an unclean restart, or for
/// a replica that stopped answering), so one attempt may take long.
pub async fn raise(
    proxy: &str,
    tls: &ClientTls,
    fencing_token: &str,
    until: Instant,
) -> anyhow::Result<Raised> {
    let url = format!("{}/_fencegate/fence", proxy.trim_end_matches('/'));
    let http = tls
        .http_client()?
        .connect_timeout(Duration::from_secs(5))
        .build()?;
    let mut last = String::from("no attempt was made");
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let sent = http
            .post(&url)
            .header("Fencing-Token", fencing_token)
            .timeout(left)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                last = format!("{url} is unreachable: {e}");
                tokio::time::sleep(Duration::from_millis(500).min(left)).await;
                continue;
            }
        };
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        if status.is_success() {
            return body["max_token"].as_u64().map(Raised::To).ok_or_else(|| {
                anyhow::anyhow!("{url} answered {status} without max_token: {body}")
            });
        }
        if body["code"] == "FencingLockUnknown" {
            return Ok(Raised::NotFencedThere);
        }
        last = format!(
            "{url} answered {status} {}: {}",
            body["code"].as_str().unwrap_or(""),
            body["error"].as_str().unwrap_or("")
        );
        // The client's mistakes and a stale token do not get better.
        if status.is_client_error() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500).min(left)).await;
    }
    anyhow::bail!("{last}")
}
