//! PutObject: the common fenced write.

use crate::gate::{Gate, RequestToken, WriteOp};
use s3s::dto::{PutObjectInput, PutObjectOutput};
use s3s::{S3Request, S3Response, S3Result};

pub async fn put_object(
    gate: &Gate,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let op = WriteOp::Put;
    let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
    let scope = gate.scope(op.name(), &bucket, &key)?;
    let token = gate
        .required_token(op.name(), RequestToken::of(&req), &scope)
        .await?;
    let w = gate.begin(op, &bucket, &key, scope, token).await?;
    w.put(gate, req).await
}
