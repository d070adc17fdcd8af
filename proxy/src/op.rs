//! The S3 operations the proxy knows, as one type: each one's name, how
//! the proxy treats it ([`Class`]) and the query parameters it accepts.
//!
//! Anything s3s routes to an operation not listed here is refused with 501
//! before a handler runs (`access`); [`crate::ops::FencedS3`] implements
//! exactly these.

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

/// An operation the proxy forwards. Everything else mutates a bucket's
/// configuration or an object's tags, ACL or retention without a fence, or
/// is not needed by the clients fencegate serves: refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    PutObject,
    CopyObject,
    DeleteObject,
    DeleteObjects,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    CreateBucket,
    GetObject,
    HeadObject,
    ListObjects,
    ListObjectsV2,
    ListObjectVersions,
    ListBuckets,
    HeadBucket,
    GetBucketLocation,
    ListMultipartUploads,
    ListParts,
    GetObjectTagging,
    GetObjectAttributes,
    GetBucketVersioning,
    /// Not S3's: the proxy's own `POST /_fencegate/fence`, a raise that
    /// writes nothing. Not in [`Op::ALL`]: s3s never routes to it.
    Fence,
}

impl Op {
    pub const ALL: [Op; 23] = [
        Op::PutObject,
        Op::CopyObject,
        Op::DeleteObject,
        Op::DeleteObjects,
        Op::CreateMultipartUpload,
        Op::UploadPart,
        Op::UploadPartCopy,
        Op::CompleteMultipartUpload,
        Op::AbortMultipartUpload,
        Op::CreateBucket,
        Op::GetObject,
        Op::HeadObject,
        Op::ListObjects,
        Op::ListObjectsV2,
        Op::ListObjectVersions,
        Op::ListBuckets,
        Op::HeadBucket,
        Op::GetBucketLocation,
        Op::ListMultipartUploads,
        Op::ListParts,
        Op::GetObjectTagging,
        Op::GetObjectAttributes,
        Op::GetBucketVersioning,
    ];

    /// The operation s3s names `name`, if the proxy forwards it.
    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Its S3 name (as s3s and the SDKs' `x-id` spell it).
    pub const fn name(self) -> &'static str {
        match self {
            Op::PutObject => "PutObject",
            Op::CopyObject => "CopyObject",
            Op::DeleteObject => "DeleteObject",
            Op::DeleteObjects => "DeleteObjects",
            Op::CreateMultipartUpload => "CreateMultipartUpload",
            Op::UploadPart => "UploadPart",
            Op::UploadPartCopy => "UploadPartCopy",
            Op::CompleteMultipartUpload => "CompleteMultipartUpload",
            Op::AbortMultipartUpload => "AbortMultipartUpload",
            Op::CreateBucket => "CreateBucket",
            Op::GetObject => "GetObject",
            Op::HeadObject => "HeadObject",
            Op::ListObjects => "ListObjects",
            Op::ListObjectsV2 => "ListObjectsV2",
            Op::ListObjectVersions => "ListObjectVersions",
            Op::ListBuckets => "ListBuckets",
            Op::HeadBucket => "HeadBucket",
            Op::GetBucketLocation => "GetBucketLocation",
            Op::ListMultipartUploads => "ListMultipartUploads",
            Op::ListParts => "ListParts",
            Op::GetObjectTagging => "GetObjectTagging",
            Op::GetObjectAttributes => "GetObjectAttributes",
            Op::GetBucketVersioning => "GetBucketVersioning",
            Op::Fence => "Fence",
        }
    }

    /// How the proxy treats it.
    pub fn class(self) -> Class {
        match self {
            Op::PutObject
            | Op::CopyObject
            | Op::DeleteObject
            | Op::DeleteObjects
            | Op::CreateMultipartUpload
            | Op::UploadPart
            | Op::UploadPartCopy
            | Op::CompleteMultipartUpload
            | Op::AbortMultipartUpload
            | Op::Fence => Class::Fenced,
            Op::CreateBucket => Class::CreateBucket,
            Op::GetObject
            | Op::HeadObject
            | Op::ListObjects
            | Op::ListObjectsV2
            | Op::ListObjectVersions
            | Op::ListBuckets
            | Op::HeadBucket
            | Op::GetBucketLocation
            | Op::ListMultipartUploads
            | Op::ListParts
            | Op::GetObjectTagging
            | Op::GetObjectAttributes
            | Op::GetBucketVersioning => Class::Read,
        }
    }

    /// The query parameters it accepts besides the pre-signed URL's and
    /// `x-id` (exactly those s3s parses into its input).
    pub fn accepted_query(self) -> &'static [&'static str] {
        match self {
            Op::PutObject | Op::CopyObject | Op::CreateBucket | Op::HeadBucket | Op::Fence => &[],
            Op::DeleteObject => &["versionId"],
            Op::DeleteObjects => &["delete"],
            Op::CreateMultipartUpload => &["uploads"],
            Op::UploadPart | Op::UploadPartCopy => &["partNumber", "uploadId"],
            Op::CompleteMultipartUpload | Op::AbortMultipartUpload => &["uploadId"],
            Op::GetObject | Op::HeadObject => &["partNumber", "versionId"],
            Op::ListObjects => &["delimiter", "encoding-type", "marker", "max-keys", "prefix"],
            Op::ListObjectsV2 => &[
                "list-type",
                "continuation-token",
                "delimiter",
                "encoding-type",
                "fetch-owner",
                "max-keys",
                "prefix",
                "start-after",
            ],
            Op::ListObjectVersions => &[
                "versions",
                "delimiter",
                "encoding-type",
                "key-marker",
                "max-keys",
                "prefix",
                "version-id-marker",
            ],
            Op::ListBuckets => &[
                "max-buckets",
                "continuation-token",
                "prefix",
                "bucket-region",
            ],
            Op::GetBucketLocation => &["location"],
            Op::ListMultipartUploads => &[
                "uploads",
                "delimiter",
                "encoding-type",
                "key-marker",
                "max-uploads",
                "prefix",
                "upload-id-marker",
            ],
            Op::ListParts => &["uploadId", "max-parts", "part-number-marker"],
            Op::GetObjectTagging => &["tagging", "versionId"],
            Op::GetObjectAttributes => &["attributes", "versionId"],
            Op::GetBucketVersioning => &["versioning"],
        }
    }

    /// Whether it accepts S3's `response-*` overrides of a GET's headers.
    pub fn takes_response_overrides(self) -> bool {
        matches!(self, Op::GetObject | Op::HeadObject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(Op::parse(op).map(Op::class), Some(Class::Fenced), "{op}");
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
            assert_eq!(Op::parse(op), None, "{op} must not be forwarded");
        }
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
    }
}
