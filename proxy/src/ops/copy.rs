//! CopyObject: the destination is a fenced write; the source is a read.
//!
//! The copy is sent with `MetadataDirective: REPLACE` so the destination
//! carries the copier's token. With the default directive (COPY) the
//! source's metadata and content headers are read first and carried over,
//! so the copy looks as the client expects. The destination condition
//! (`If-None-Match` / `If-Match`) is sent, but neither tested backend
//! enforces it on copies; the proxy's per-key serialization is the wall
//! there.

use crate::gate::{CopySpec, Gate, RequestToken, WriteOp};
use s3s::dto::{CopyObjectInput, CopyObjectOutput, CopySource};
use s3s::{S3Request, S3Response, S3Result};

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
    let scope = gate.scope(op.name(), &bucket, &key)?;
    let token = gate
        .required_token(op.name(), RequestToken::of(&req), &scope)
        .await?;
    let w = gate.begin(op, &bucket, &key, scope, token).await?;

    let mut source = format!("{}/{}", src_bucket, encode_key(src_key));
    if let Some(v) = src_version {
        source.push_str(&format!("?versionId={}", encode_key(v)));
    }
    let mut spec = CopySpec {
        source,
        storage_class: input.storage_class.as_ref().map(|s| s.as_str().to_owned()),
        source_if_match: input.copy_source_if_match.as_ref().map(etag_header),
        source_if_none_match: input.copy_source_if_none_match.as_ref().map(etag_header),
        ..CopySpec::default()
    };
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
        let src = match gate
            .head_source(src_bucket, src_key, src_version.as_deref())
            .await
        {
            Ok(src) => src,
            Err(e) if e.status_code() == Some(http::StatusCode::NOT_FOUND) => {
                return Err(
                    missing_source(gate, src_bucket, src_key, src_version.as_deref()).await,
                );
            }
            Err(e) => return Err(e),
        };
        spec.content_type = src.content_type().map(str::to_owned);
        spec.cache_control = src.cache_control().map(str::to_owned);
        spec.content_disposition = src.content_disposition().map(str::to_owned);
        spec.content_encoding = src.content_encoding().map(str::to_owned);
        spec.content_language = src.content_language().map(str::to_owned);
        spec.metadata = src.metadata().cloned();
    }
    w.copy(gate, spec).await.map(S3Response::new)
}

/// The error for a copy source the backend does not have. A HEAD answer
/// has no body to say what is missing, so ask about the bucket.
async fn missing_source(
    gate: &Gate,
    bucket: &str,
    key: &str,
    version: Option<&str>,
) -> s3s::S3Error {
    let bucket_exists = gate.bucket_exists(bucket).await;
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

/// Percent-encodes a key for `x-amz-copy-source`, keeping `/`.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_source_keys_are_encoded() {
        assert_eq!(super::encode_key("a b/ü+c"), "a%20b/%C3%BC%2Bc");
    }
}
