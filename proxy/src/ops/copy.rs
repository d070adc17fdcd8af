//! CopyObject: the destination is a fenced write; the source is a read.
//!
//! The copy is sent with `MetadataDirective: REPLACE` so the destination
//! carries the copier's token. With the default directive (COPY) the
//! source's metadata and content headers are read first and carried over,
//! so the copy looks as the client expects. The destination condition
//! (`If-None-Match` / `If-Match`) is sent where the store enforces it
//! (none of the tested stores does); the proxy's per-key serialization
//! and a fresh read of the key are the wall there.
//!
//! A client's own source conditions (`x-amz-copy-source-if-*`) are never
//! dropped: the proxy checks them against the source it reads just before
//! the copy, and sends them on under the names the store reads (the
//! store's dialect, `probe`), so that a store that reads them also checks
//! them at the copy itself. UploadPartCopy does the same.

use crate::gate::write::CopySpec;
use crate::gate::{Gate, RequestToken, WriteOp};
use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use s3s::dto::{CopyObjectInput, CopyObjectOutput, CopySource, ETagCondition, Timestamp};
use s3s::{S3Request, S3Response, S3Result};

/// A copy's source conditions, as the client sent them.
#[derive(Debug, Default, Clone)]
pub struct SourceConditions {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    pub if_modified_since: Option<Timestamp>,
    pub if_unmodified_since: Option<Timestamp>,
}

impl SourceConditions {
    fn is_empty(&self) -> bool {
        self.if_match.is_none()
            && self.if_none_match.is_none()
            && self.if_modified_since.is_none()
            && self.if_unmodified_since.is_none()
    }

    /// Checks them against the source as read, by AWS's rules: a
    /// condition on the ETag, where given, overrides the one on the date
    /// beside it; any that does not hold is 412 PreconditionFailed.
    fn check(&self, source: &HeadObjectOutput) -> S3Result<()> {
        let etag = source
            .e_tag()
            .map(crate::dialect::strip_quotes)
            .unwrap_or_default();
        let matches = |c: &ETagCondition| match c {
            ETagCondition::Any => true,
            ETagCondition::ETag(e) => e.value() == etag,
        };
        let modified = source.last_modified().map(|t| t.secs());
        let secs = |t: &Timestamp| {
            s3s_aws::conv::try_into_aws(t.clone())
                .ok()
                .map(|d| d.secs())
        };
        let holds = match (&self.if_match, &self.if_unmodified_since) {
            (Some(c), _) => matches(c),
            (None, Some(t)) => match (modified, secs(t)) {
                (Some(m), Some(t)) => m <= t,
                _ => true,
            },
            (None, None) => true,
        } && match (&self.if_none_match, &self.if_modified_since) {
            (Some(c), _) => !matches(c),
            (None, Some(t)) => match (modified, secs(t)) {
                (Some(m), Some(t)) => m > t,
                _ => true,
            },
            (None, None) => true,
        };
        if holds {
            Ok(())
        } else {
            Err(s3s::s3_error!(
                PreconditionFailed,
                "the copy source's condition (x-amz-copy-source-if-*) does not hold"
            ))
        }
    }

    /// Into the copy's request, in AWS's spelling (the store's dialect
    /// rewrites it).
    fn fill(self, spec: &mut CopySpec) {
        let time = |t: Timestamp| s3s_aws::conv::try_into_aws(t).ok();
        spec.source_if_match = self.if_match.as_ref().map(etag_header);
        spec.source_if_none_match = self.if_none_match.as_ref().map(etag_header);
        spec.source_if_modified_since = self.if_modified_since.and_then(time);
        spec.source_if_unmodified_since = self.if_unmodified_since.and_then(time);
    }
}

/// Reads the copy source and checks `conditions` against it (a missing
/// source is the client's 404, named); nothing is read when there are none.
pub(crate) async fn checked_source(
    gate: &Gate,
    source: &CopySource,
    conditions: &SourceConditions,
) -> S3Result<Option<HeadObjectOutput>> {
    if conditions.is_empty() {
        return Ok(None);
    }
    let CopySource::Bucket {
        bucket,
        key,
        version_id,
    } = source
    else {
        return Err(crate::errors::not_forwarded(
            "a copy from an access point or outpost",
        ));
    };
    let head = read_source(gate, bucket, key, version_id.as_deref()).await?;
    conditions.check(&head)?;
    Ok(Some(head))
}

/// HEAD of the copy source; a missing one is named in the error.
async fn read_source(
    gate: &Gate,
    bucket: &str,
    key: &str,
    version: Option<&str>,
) -> S3Result<HeadObjectOutput> {
    match gate.store.head_source(bucket, key, version).await {
        Err(e) if e.status_code() == Some(http::StatusCode::NOT_FOUND) => {
            Err(missing_source(gate, bucket, key, version).await)
        }
        other => other,
    }
}

pub async fn copy_object(
    gate: &Gate,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let op = WriteOp::Copy;
    let input = &req.input;
    let (bucket, key) = (input.bucket.clone(), input.key.clone());
    let CopySource::Bucket {
        bucket: src_bucket,
        key: src_key,
        version_id: src_version,
    } = &input.copy_source
    else {
        return Err(crate::errors::not_forwarded(
            "CopyObject from an access point or outpost",
        ));
    };
    crate::object_key::require(src_key)?;
    let scoped = gate.scoping.scope(op.op(), &bucket, &key)?;
    let tokened = gate.tokens.required(scoped, RequestToken::of(&req)).await?;
    let w = gate.admitter.begin(op, tokened).await?;

    let mut source = format!("{}/{}", src_bucket, crate::sigv4::encode_key(src_key));
    if let Some(v) = src_version {
        source.push_str(&format!("?versionId={}", crate::sigv4::encode_key(v)));
    }
    let conditions = SourceConditions {
        if_match: input.copy_source_if_match.clone(),
        if_none_match: input.copy_source_if_none_match.clone(),
        if_modified_since: input.copy_source_if_modified_since.clone(),
        if_unmodified_since: input.copy_source_if_unmodified_since.clone(),
    };
    let checked = checked_source(gate, &input.copy_source, &conditions).await?;
    let mut spec = CopySpec {
        source,
        storage_class: input.storage_class.as_ref().map(|s| s.as_str().to_owned()),
        ..CopySpec::default()
    };
    conditions.fill(&mut spec);
    let replace = input
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str().eq_ignore_ascii_case("REPLACE"));
    if replace {
        spec.content_type = input.content_type.clone();
        spec.cache_control = input.cache_control.clone();
        spec.content_disposition = input.content_disposition.clone();
        spec.content_encoding = input.content_encoding.clone();
        spec.content_language = input.content_language.clone();
        spec.metadata = input.metadata.clone();
    } else {
        let src = match checked {
            Some(src) => src,
            None => read_source(gate, src_bucket, src_key, src_version.as_deref()).await?,
        };
        spec.content_type = src.content_type().map(str::to_owned);
        spec.cache_control = src.cache_control().map(str::to_owned);
        spec.content_disposition = src.content_disposition().map(str::to_owned);
        spec.content_encoding = src.content_encoding().map(str::to_owned);
        spec.content_language = src.content_language().map(str::to_owned);
        spec.metadata = src.metadata().cloned();
    }
    gate.writer.copy(w, spec).await.map(S3Response::new)
}

/// The error for a copy source the backend does not have. A HEAD answer
/// has no body to say what is missing, so ask about the bucket.
async fn missing_source(
    gate: &Gate,
    bucket: &str,
    key: &str,
    version: Option<&str>,
) -> s3s::S3Error {
    let bucket_exists = gate.store.bucket_exists(bucket).await;
    match version {
        _ if !bucket_exists => s3s::s3_error!(
            NoSuchBucket,
            "the copy source bucket {bucket} does not exist"
        ),
        Some(v) => s3s::s3_error!(
            NoSuchVersion,
            "the copy source s3://{bucket}/{key} has no version {v}"
        ),
        None => s3s::s3_error!(
            NoSuchKey,
            "the copy source s3://{bucket}/{key} does not exist"
        ),
    }
}

fn etag_header(c: &s3s::dto::ETagCondition) -> String {
    match c {
        s3s::dto::ETagCondition::Any => "*".to_owned(),
        s3s::dto::ETagCondition::ETag(e) => format!("\"{}\"", e.value()),
    }
}
