//! CopyObject: the destination is a fenced write; the source is a read.
//!
//! The copy is sent with `MetadataDirective: REPLACE` so the destination
//! carries the copier's token. With the default directive (COPY) the
//! source's metadata and content headers are read first and carried over,
//! so the copy looks as the client expects. The destination condition
//! (`If-None-Match` / `If-Match`) is sent, but neither tested backend
//! enforces it on copies; the proxy's per-key serialization is the wall
//! there.

use crate::gate::Gate;
use crate::keys::Known;
use aws_sdk_s3::types::MetadataDirective;
use s3s::dto::{CopyObjectInput, CopyObjectOutput, CopyObjectResult, CopySource, ETag, Timestamp};
use s3s::{S3Request, S3Response, S3Result};

const OP: &str = "CopyObject";

pub async fn copy_object(
    gate: &Gate,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
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
    let scope = gate.scope(OP, &bucket, &key)?;
    let token = gate
        .required_token(OP, crate::gate::RequestToken::of(&req), &scope)
        .await?;
    let w = gate.begin(OP, &bucket, &key, scope, token).await?;
    let (if_match, if_none_match) = super::conditions(&w.known, None, None)?;

    let mut source = format!("{}/{}", src_bucket, encode_key(src_key));
    if let Some(v) = src_version {
        source.push_str(&format!("?versionId={}", encode_key(v)));
    }
    let mut b = gate
        .backend
        .client
        .copy_object()
        .bucket(&bucket)
        .key(&key)
        .copy_source(source)
        .metadata_directive(MetadataDirective::Replace)
        .set_storage_class(input.storage_class.as_ref().map(|s| s.as_str().into()))
        .set_copy_source_if_match(input.copy_source_if_match.as_ref().map(etag_header))
        .set_copy_source_if_none_match(input.copy_source_if_none_match.as_ref().map(etag_header));
    let replace = input
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str().eq_ignore_ascii_case("REPLACE"));
    let mut metadata = if replace {
        b = b
            .set_content_type(input.content_type.clone())
            .set_cache_control(input.cache_control.clone())
            .set_content_disposition(input.content_disposition.clone())
            .set_content_encoding(input.content_encoding.clone())
            .set_content_language(input.content_language.clone());
        input.metadata.clone()
    } else {
        let mut head = gate
            .backend
            .client
            .head_object()
            .bucket(src_bucket.as_ref())
            .key(src_key.as_ref());
        if let Some(v) = src_version {
            head = head.version_id(v.as_ref());
        }
        let src = gate
            .call(
                async { head.send().await.map_err(crate::backend::sdk_error) },
                None,
            )
            .await;
        let src = match src {
            Ok(src) => src,
            Err(e) if e.status_code() == Some(http::StatusCode::NOT_FOUND) => {
                return Err(
                    missing_source(gate, src_bucket, src_key, src_version.as_deref()).await,
                );
            }
            Err(e) => return Err(e),
        };
        b = b
            .set_content_type(src.content_type().map(str::to_owned))
            .set_cache_control(src.cache_control().map(str::to_owned))
            .set_content_disposition(src.content_disposition().map(str::to_owned))
            .set_content_encoding(src.content_encoding().map(str::to_owned))
            .set_content_language(src.content_language().map(str::to_owned));
        src.metadata().cloned()
    };
    super::tag(&mut metadata, token);
    b = b.set_metadata(metadata);
    if let Some(s3s::dto::ETagCondition::ETag(e)) = if_match {
        b = b.if_match(format!("\"{}\"", e.value()));
    }
    if if_none_match.is_some() {
        b = b.if_none_match("*");
    }

    let result = b
        .send()
        .await
        .map_err(crate::backend::sdk_error)
        .map(|out| {
            let r = out.copy_object_result();
            CopyObjectOutput {
                copy_object_result: Some(CopyObjectResult {
                    e_tag: r
                        .and_then(|r| r.e_tag())
                        .map(|e| ETag::Strong(crate::backend::strip_quotes(e))),
                    last_modified: r
                        .and_then(|r| r.last_modified())
                        .and_then(|t| s3s_aws::conv::try_from_aws::<Timestamp>(*t).ok()),
                    ..Default::default()
                }),
                version_id: out.version_id().map(str::to_owned),
                copy_source_version_id: out.copy_source_version_id().map(str::to_owned),
                ..Default::default()
            }
        });
    gate.finish(w, result, |out| {
        Some(Known::Present {
            etag: out
                .copy_object_result
                .as_ref()?
                .e_tag
                .as_ref()?
                .value()
                .to_owned(),
            token,
        })
    })
    .await
    .map(S3Response::new)
}

/// The error for a copy source the backend does not have. A HEAD answer
/// has no body to say what is missing, so ask about the bucket.
async fn missing_source(
    gate: &Gate,
    bucket: &str,
    key: &str,
    version: Option<&str>,
) -> s3s::S3Error {
    let bucket_exists = gate
        .backend
        .client
        .head_bucket()
        .bucket(bucket)
        .send()
        .await
        .map_err(|e| crate::backend::status_of(&e))
        != Err(Some(404));
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
