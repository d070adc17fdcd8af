//! Raising a lock's fence at a proxy when its lease is taken
//! (`POST /_fencegate/fence`), before the new holder writes anything: the
//! old holder's writes are refused from that moment, not from the new
//! holder's first write.

use fencegate_net::tls::ClientTls;
use std::time::Duration;

/// How long one attempt may take, and how many are made.
const ATTEMPT: Duration = Duration::from_secs(5);
const ATTEMPTS: u32 = 3;

/// Raises the fence of the lock `fencing_token` names at the proxy at
/// `proxy` (its S3 endpoint URL); returns the max token there now.
pub async fn raise(proxy: &str, tls: &ClientTls, fencing_token: &str) -> anyhow::Result<u64> {
    let url = format!("{}/_fencegate/fence", proxy.trim_end_matches('/'));
    let http = tls.http_client()?.timeout(ATTEMPT).build()?;
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let resp = match http
            .post(&url)
            .header("Fencing-Token", fencing_token)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                last = format!("{url} is unreachable: {e}");
                continue;
            }
        };
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        if status.is_success() {
            return body["max_token"].as_u64().ok_or_else(|| {
                anyhow::anyhow!("{url} answered {status} without max_token: {body}")
            });
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
    }
    anyhow::bail!("{last}")
}
