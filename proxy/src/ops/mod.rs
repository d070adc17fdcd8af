//! The S3 operations the proxy serves, one module per fenced family.
//!
//! [`classify`] is the single list of what the proxy forwards. The access
//! check refuses every operation it does not name before any handler runs,
//! and [`FencedS3`] implements exactly the named ones: a forwarded write
//! cannot exist without a decision here about how it is fenced.
//!
//! - `put`: PutObject
//! - `copy`: CopyObject (the destination is fenced)
//! - `delete`: DeleteObject, DeleteObjects
//! - `multipart`: Create/UploadPart/UploadPartCopy/Complete/Abort
//! - reads and CreateBucket are forwarded untouched (below).

mod copy;
mod delete;
mod multipart;
mod put;

use crate::gate::Gate;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};
use std::sync::Arc;

/// How the proxy treats an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Forwarded untouched.
    Read,
    /// Creates a bucket; touches no object. Forwarded (rclone creates its
    /// destination bucket before uploading).
    CreateBucket,
    /// Mutates objects: goes through the fence.
    Fenced,
}

/// The operations the proxy forwards; `None` for everything else, which is
/// refused with 501 before reaching a handler.
pub fn classify(op: &str) -> Option<Class> {
    match op {
        "PutObject"
        | "CopyObject"
        | "DeleteObject"
        | "DeleteObjects"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "UploadPartCopy"
        | "CompleteMultipartUpload"
        | "AbortMultipartUpload" => Some(Class::Fenced),
        "GetObject"
        | "HeadObject"
        | "ListObjects"
        | "ListObjectsV2"
        | "ListObjectVersions"
        | "ListBuckets"
        | "HeadBucket"
        | "GetBucketLocation"
        | "ListMultipartUploads"
        | "ListParts"
        | "GetObjectTagging"
        | "GetObjectAttributes"
        | "GetBucketVersioning" => Some(Class::Read),
        "CreateBucket" => Some(Class::CreateBucket),
        // Everything else mutates a bucket's configuration or an object's
        // tags, ACL or retention without a fence, or is not needed by the
        // clients fencegate serves: refused.
        _ => None,
    }
}

/// The S3 service: fenced writes, forwarded reads.
#[derive(Debug, Clone)]
pub struct FencedS3 {
    gate: Arc<Gate>,
}

impl FencedS3 {
    pub fn new(gate: Arc<Gate>) -> FencedS3 {
        FencedS3 { gate }
    }

    /// Where reads are forwarded.
    fn backend(&self) -> &s3s_aws::Proxy {
        &self.gate.backend.forward
    }
}

#[async_trait::async_trait]
impl S3 for FencedS3 {
    // Reads (and CreateBucket) go to the backend untouched.
    forward_s3! { backend => crate::errors::forwarded;
        get_object: GetObjectInput => GetObjectOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        list_object_versions: ListObjectVersionsInput => ListObjectVersionsOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
        list_parts: ListPartsInput => ListPartsOutput;
        get_object_tagging: GetObjectTaggingInput => GetObjectTaggingOutput;
        get_object_attributes: GetObjectAttributesInput => GetObjectAttributesOutput;
        get_bucket_versioning: GetBucketVersioningInput => GetBucketVersioningOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        put::put_object(&self.gate, req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        copy::copy_object(&self.gate, req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        delete::delete_object(&self.gate, req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        delete::delete_objects(&self.gate, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        multipart::create(&self.gate, req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        multipart::upload_part(&self.gate, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        multipart::upload_part_copy(&self.gate, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete(&self.gate, req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        multipart::abort(&self.gate, req).await
    }
}

/// Replaces any client-supplied fencing-token metadata with `token`.
pub(crate) fn tag(metadata: &mut Option<Metadata>, token: u64) {
    let m = metadata.get_or_insert_with(Default::default);
    m.retain(|k, _| !k.eq_ignore_ascii_case(crate::backend::TOKEN_METADATA_KEY));
    m.insert(
        crate::backend::TOKEN_METADATA_KEY.to_owned(),
        token.to_string(),
    );
}

/// Drops the `aws-chunked` content coding s3s already decoded; the SDK
/// would otherwise send it twice and the backend reject the request.
pub(crate) fn strip_aws_chunked(encoding: Option<String>) -> Option<String> {
    let rest: Vec<&str> = encoding
        .as_deref()?
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!rest.is_empty()).then(|| rest.join(","))
}

/// The conditions to send to the store for a write over `known`, after
/// checking the client's own conditions against it.
pub(crate) fn conditions(
    known: &crate::keys::Known,
    client_if_match: Option<IfMatch>,
    client_if_none_match: Option<IfNoneMatch>,
) -> S3Result<(Option<IfMatch>, Option<IfNoneMatch>)> {
    use crate::keys::Known;
    let current = match known {
        Known::Absent => None,
        Known::Present { etag, .. } => Some(etag.as_str()),
    };
    let matches = |c: &ETagCondition| match (c, current) {
        (ETagCondition::Any, cur) => cur.is_some(),
        (ETagCondition::ETag(e), Some(cur)) => e.value() == cur,
        (ETagCondition::ETag(_), None) => false,
    };
    if client_if_match.as_ref().is_some_and(|c| !matches(c))
        || client_if_none_match.as_ref().is_some_and(matches)
    {
        return Err(s3s::s3_error!(
            PreconditionFailed,
            "the client's If-Match / If-None-Match condition does not hold"
        ));
    }
    Ok(match current {
        None => (None, Some(ETagCondition::Any)),
        Some(etag) => (
            Some(ETagCondition::ETag(ETag::Strong(etag.to_owned()))),
            None,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Known;

    #[test]
    fn every_write_is_fenced_and_unknown_ops_are_refused() {
        for op in [
            "PutObject",
            "CopyObject",
            "DeleteObject",
            "DeleteObjects",
            "CreateMultipartUpload",
            "UploadPart",
            "UploadPartCopy",
            "CompleteMultipartUpload",
            "AbortMultipartUpload",
        ] {
            assert_eq!(classify(op), Some(Class::Fenced), "{op}");
        }
        for op in [
            "PutObjectTagging",
            "DeleteObjectTagging",
            "PutObjectAcl",
            "PutObjectRetention",
            "PutObjectLegalHold",
            "RestoreObject",
            "PutBucketLifecycleConfiguration",
            "PutBucketPolicy",
            "DeleteBucket",
            "PostObject",
            "WriteGetObjectResponse",
        ] {
            assert_eq!(classify(op), None, "{op} must not be forwarded");
        }
    }

    #[test]
    fn conditions_follow_what_the_store_holds() {
        let present = Known::Present {
            etag: "abc".into(),
            token: 1,
        };
        let (m, n) = conditions(&Known::Absent, None, None).expect("ok");
        assert_eq!((m, n), (None, Some(ETagCondition::Any)));
        let (m, n) = conditions(&present, None, None).expect("ok");
        assert_eq!(
            (m, n),
            (Some(ETagCondition::ETag(ETag::Strong("abc".into()))), None)
        );
        assert!(conditions(&present, None, Some(ETagCondition::Any)).is_err());
        assert!(conditions(&Known::Absent, Some(ETagCondition::Any), None).is_err());
        assert!(
            conditions(
                &present,
                Some(ETagCondition::ETag(ETag::Strong("x".into()))),
                None
            )
            .is_err()
        );
    }

    #[test]
    fn client_token_metadata_is_replaced() {
        let mut m = Some(Metadata::from([(
            "Fencing-Token".to_owned(),
            "999".to_owned(),
        )]));
        tag(&mut m, 7);
        let m = m.expect("metadata");
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("fencing-token").map(String::as_str), Some("7"));
    }

    #[test]
    fn aws_chunked_is_stripped() {
        assert_eq!(strip_aws_chunked(Some("aws-chunked".into())), None);
        assert_eq!(
            strip_aws_chunked(Some("aws-chunked,gzip".into())),
            Some("gzip".into())
        );
        assert_eq!(strip_aws_chunked(None), None);
    }
}
