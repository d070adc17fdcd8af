//! Raising a lock's fence at a proxy when its lease is taken
//! (`POST /_fencegate/fence`), before the new holder writes anything: the
//! old holder's writes are refused from that moment, not from the new
//! holder's first write.

use fencegate_net::tls::ClientTls;
use std::time::Duration;
use tokio::time::Instant;

/// How often a raise that keeps failing says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What the proxy said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// The fence is at (at least) the token: the max there now.
    To(u64),
    /// No scope of that proxy is fenced by the lock: nothing to fence.
    NotFencedThere,
}

/// Raises the fence of the lock `fencing_token` names (a signed token), or
/// of `lock` (a lock that follows an election, whose holder's plain token
/// `fencing_token` is), at the proxy at `proxy` (its S3 endpoint URL),
/// trying until `until`. A raise may wait
/// at the proxy for older writes to drain (after an unclean restart, or for
/// a replica that stopped answering), so one attempt may take long.
pub async fn raise(
    proxy: &str,
    tls: &ClientTls,
    fencing_token: &str,
    lock: Option<&str>,
    until: Instant,
) -> anyhow::Result<Raised> {
    let mut url = format!("{}/_fencegate/fence", proxy.trim_end_matches('/'));
    if let Some(lock) = lock {
        url.push_str(&format!("?lock={lock}"));
    }
    let http = tls
        .http_client()?
        .connect_timeout(Duration::from_secs(5))
        .build()?;
    let mut last = String::from("no attempt was made");
    let started = Instant::now();
    // Said at once, then every few seconds: a raise may wait the whole
    // patience, and the operator should see why as it happens.
    let mut next_word = started;
    let mut word = |why: &str| {
        let now = Instant::now();
        if now >= next_word {
            tracing::warn!(
                proxy = %url,
                waited_s = now.duration_since(started).as_secs(),
                gives_up_in_s = until.saturating_duration_since(now).as_secs(),
                "the fence is not raised yet; retrying: {why}"
            );
            next_word = now + PROGRESS_EVERY;
        }
    };
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
                word(&last);
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
        word(&last);
        tokio::time::sleep(Duration::from_millis(500).min(left)).await;
    }
    anyhow::bail!("{last}")
}
