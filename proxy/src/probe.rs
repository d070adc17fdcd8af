//! The start-up probe: does the backend enforce conditional writes?
//!
//! A store that accepts `If-Match` / `If-None-Match` and ignores them would
//! silently void the per-object half of the fence, so the proxy finds out
//! before serving fenced traffic, in a scratch key of the bucket:
//!
//! | check                    | request                                   | enforced if |
//! |--------------------------|-------------------------------------------|-------------|
//! | `put_if_none_match`      | PUT an existing key, `If-None-Match: *`   | 412         |
//! | `put_if_match`           | PUT with a wrong `If-Match`               | 412         |
//! | `complete_if_none_match` | Complete onto an existing key, `If-None-Match: *` | 412 |
//! | `complete_if_match`      | Complete with a wrong `If-Match`          | 412         |
//! | `copy_if_none_match`     | CopyObject onto an existing key, `If-None-Match: *` | 412 |
//! | `copy_if_match`          | CopyObject with a wrong destination `If-Match` | 412    |
//! | `delete_if_match`        | DELETE with a wrong `If-Match`            | 412         |
//!
//! The two PUT checks are required (unless the operator accepts the weaker
//! mode). The others are reported (status, metrics, the start-up log line):
//! where one is missing, that operation is fenced by the proxy alone (its
//! epoch and per-key lock), which holds for writers going through one
//! proxy, not across replicas; README "What the store must enforce" has the
//! table per operation.

use crate::backend::{status_of, strip_quotes};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use serde::Serialize;

/// What the probe found for one bucket.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProbeReport {
    pub bucket: String,
    pub put_if_none_match: bool,
    pub put_if_match: bool,
    pub complete_if_none_match: bool,
    pub complete_if_match: bool,
    pub copy_if_none_match: bool,
    pub copy_if_match: bool,
    pub delete_if_match: bool,
}

impl ProbeReport {
    /// The backend enforces what fenced mode needs.
    pub fn safe(&self) -> bool {
        self.put_if_none_match && self.put_if_match
    }

    /// One line for logs and errors.
    pub fn summary(&self) -> String {
        let flag = |b: bool| if b { "enforced" } else { "IGNORED" };
        format!(
            "bucket {}: PUT If-None-Match {}, PUT If-Match {}, Complete If-None-Match {}, Complete If-Match {}, Copy If-None-Match {}, Copy If-Match {}, DELETE If-Match {}",
            self.bucket,
            flag(self.put_if_none_match),
            flag(self.put_if_match),
            flag(self.complete_if_none_match),
            flag(self.complete_if_match),
            flag(self.copy_if_none_match),
            flag(self.copy_if_match),
            flag(self.delete_if_match)
        )
    }

    pub fn checks(&self) -> [(&'static str, bool); 7] {
        [
            ("put_if_none_match", self.put_if_none_match),
            ("put_if_match", self.put_if_match),
            ("complete_if_none_match", self.complete_if_none_match),
            ("complete_if_match", self.complete_if_match),
            ("copy_if_none_match", self.copy_if_none_match),
            ("copy_if_match", self.copy_if_match),
            ("delete_if_match", self.delete_if_match),
        ]
    }
}

const WRONG_ETAG: &str = "\"00000000000000000000000000000000\"";

/// The probed bucket does not exist on the backend (a client's mistake,
/// not a backend failure: the client gets 404 NoSuchBucket).
#[derive(Debug, thiserror::Error)]
#[error("bucket {0} does not exist on the backend")]
pub struct NoSuchBucket(pub String);

/// Runs the probe in a scratch key of `bucket`, cleaning up after itself.
pub async fn probe(client: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<ProbeReport> {
    // Some stores create a missing bucket on the first PUT into it (s3s-fs
    // makes the directory); asking first keeps the probe from doing that.
    if let Err(e) = client.head_bucket().bucket(bucket).send().await
        && status_of(&e) == Some(404)
    {
        return Err(NoSuchBucket(bucket.to_owned()).into());
    }
    let key = format!(".fencegate-probe/{}", scratch_suffix());
    let result = run_checks(client, bucket, &key).await;
    // Best effort: the scratch key and any upload left behind.
    let _ = client.delete_object().bucket(bucket).key(&key).send().await;
    result
}

fn scratch_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    #[allow(
        clippy::disallowed_methods,
        reason = "a unique scratch name, not a decision"
    )]
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos}-{}", std::process::id())
}

/// Whether a conditional request was refused (412, or 409 for a conflict).
fn refused(status: Option<u16>) -> bool {
    matches!(status, Some(412) | Some(409))
}

async fn run_checks(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
) -> anyhow::Result<ProbeReport> {
    let put = |cond: Option<(&'static str, String)>| {
        let mut req = client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from_static(b"fencegate probe"));
        match cond {
            Some(("if-none-match", v)) => req = req.if_none_match(v),
            Some((_, v)) => req = req.if_match(v),
            None => {}
        }
        req.send()
    };
    put(None).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot write the probe key s3://{bucket}/{key}: {}",
            crate::backend::sdk_error(e)
        )
    })?;

    let put_if_none_match = match put(Some(("if-none-match", "*".into()))).await {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    let put_if_match = match put(Some(("if-match", WRONG_ETAG.into()))).await {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    // Sanity: a correct If-Match must pass, or the check above means nothing.
    let head = client.head_object().bucket(bucket).key(key).send().await?;
    let etag = head.e_tag().map(strip_quotes).unwrap_or_default();
    let correct = put(Some(("if-match", format!("\"{etag}\"")))).await;
    let put_if_match = put_if_match && correct.is_ok();

    // Optional checks: a store whose multipart calls fail here (or that has
    // none) is reported as not enforcing them, not refused outright.
    let optional = |check: &'static str, r: anyhow::Result<bool>| {
        r.unwrap_or_else(|e| {
            tracing::warn!(bucket, check, error = %e, "backend probe: multipart check failed; reported as not enforced");
            false
        })
    };
    let complete_if_none_match = optional(
        "complete_if_none_match",
        complete_refused(client, bucket, key, Some("*"), None).await,
    );
    let complete_if_match = optional(
        "complete_if_match",
        complete_refused(client, bucket, key, None, Some(WRONG_ETAG)).await,
    );

    // The key must exist for the copy and DELETE checks.
    put(None).await.map_err(crate::backend::sdk_error)?;
    let copy = |if_none_match: Option<&'static str>, if_match: Option<&'static str>| {
        client
            .copy_object()
            .bucket(bucket)
            .key(key)
            .copy_source(format!("{bucket}/{key}"))
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .set_if_none_match(if_none_match.map(str::to_owned))
            .set_if_match(if_match.map(str::to_owned))
            .send()
    };
    let copy_if_none_match = match copy(Some("*"), None).await {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    let copy_if_match = match copy(None, Some(WRONG_ETAG)).await {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    let delete_if_match = match client
        .delete_object()
        .bucket(bucket)
        .key(key)
        .if_match(WRONG_ETAG)
        .send()
        .await
    {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    Ok(ProbeReport {
        bucket: bucket.to_owned(),
        put_if_none_match,
        put_if_match,
        complete_if_none_match,
        complete_if_match,
        copy_if_none_match,
        copy_if_match,
        delete_if_match,
    })
}

/// Creates a one-part upload onto the (existing) key and completes it with
/// the given condition; true if the store refused.
async fn complete_refused(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    if_none_match: Option<&str>,
    if_match: Option<&str>,
) -> anyhow::Result<bool> {
    let created = client
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(crate::backend::sdk_error)?;
    let upload_id = created.upload_id().unwrap_or_default().to_owned();
    let part = client
        .upload_part()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .part_number(1)
        .body(ByteStream::from_static(b"fencegate probe part"))
        .send()
        .await
        .map_err(crate::backend::sdk_error)?;
    let parts = CompletedMultipartUpload::builder()
        .parts(
            CompletedPart::builder()
                .part_number(1)
                .set_e_tag(part.e_tag().map(str::to_owned))
                .build(),
        )
        .build();
    let mut req = client
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .multipart_upload(parts);
    if let Some(v) = if_none_match {
        req = req.if_none_match(v);
    }
    if let Some(v) = if_match {
        req = req.if_match(v);
    }
    let refused = match req.send().await {
        Ok(_) => false,
        Err(e) => refused(status_of(&e)),
    };
    let _ = client
        .abort_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .send()
        .await;
    Ok(refused)
}
