//! CreateBucket: rclone creates its destination bucket before uploading,
//! so a plain create is forwarded. It touches no object, but the same
//! request can change an *existing* bucket on some stores (moto adds an
//! AllUsers grant for `x-amz-acl: public-read`, and turns on object lock
//! and versioning for `x-amz-bucket-object-lock-enabled`), so everything
//! beyond the bucket's name and location is refused (except `x-amz-acl:
//! private`, the default), and only those two are sent.

use crate::gate::Gate;
use s3s::dto::{CreateBucketInput, CreateBucketOutput};
use s3s::{S3Request, S3Response, S3Result};

pub async fn create_bucket(
    gate: &Gate,
    req: S3Request<CreateBucketInput>,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let i = &req.input;
    let refused: Vec<&str> = [
        // `private` is every bucket's default (rclone sends it when
        // configured so); any other canned ACL would open the bucket.
        (
            "x-amz-acl",
            i.acl.as_ref().is_some_and(|a| a.as_str() != "private"),
        ),
        ("x-amz-grant-full-control", i.grant_full_control.is_some()),
        ("x-amz-grant-read", i.grant_read.is_some()),
        ("x-amz-grant-read-acp", i.grant_read_acp.is_some()),
        ("x-amz-grant-write", i.grant_write.is_some()),
        ("x-amz-grant-write-acp", i.grant_write_acp.is_some()),
        (
            "x-amz-bucket-object-lock-enabled",
            i.object_lock_enabled_for_bucket.is_some(),
        ),
        ("x-amz-object-ownership", i.object_ownership.is_some()),
    ]
    .into_iter()
    .filter_map(|(h, set)| set.then_some(h))
    .collect();
    if !refused.is_empty() {
        return Err(s3s::s3_error!(
            AccessDenied,
            "CreateBucket through the fencing proxy creates plain buckets only; {} would change \
             an existing bucket's access or retention: set them on the backend directly",
            refused.join(", ")
        ));
    }
    gate.store.create_bucket(req).await
}
