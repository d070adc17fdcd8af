//! The S3 operations the proxy serves, one module per fenced family.
//!
//! [`crate::op::Op`] is the single list of what the proxy forwards. The
//! access check refuses every operation it does not name before any handler
//! runs, and [`FencedS3`] implements exactly the named ones: a forwarded write
//! cannot exist without a decision here about how it is fenced.
//!
//! - `put`: PutObject
//! - `copy`: CopyObject (the destination is fenced)
//! - `delete`: DeleteObject, DeleteObjects
//! - `multipart`: Create/UploadPart/UploadPartCopy/Complete/Abort
//! - `bucket`: CreateBucket, plain creates only;
//! - reads are forwarded untouched (below), through a handle that has no
//!   write method: every write goes through `gate::Writer`.

mod bucket;
mod copy;
pub(crate) mod delete;
pub(crate) mod multipart;
pub(crate) mod put;

use crate::gate::Gate;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};
use std::sync::Arc;

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
    fn backend(&self) -> &crate::backend::Reads {
        self.gate.store.reads()
    }
}

#[async_trait::async_trait]
impl S3 for FencedS3 {
    // Reads go to the backend untouched.
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
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        bucket::create_bucket(&self.gate, req).await
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
